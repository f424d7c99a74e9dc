"""The instruction stream of ``softmax.s`` as timing ops, for the static cycle model.

A PE's control flow depends only on its block (queries ``q0 .. q0+R-1``,
keys ``k0 .. k0+K-1``), its column (first, last) and the variant, all fixed
by the plan, so its run is known before any value: ``BUSY`` cycles between
the vector instructions that read or write the fabric (``VEC`` rows: the row
vector from the west, on to the east, back from the east, on to the west).
:func:`wse.host.compiler.replay.replay` replays them against the routes;
``tests/test_transformer_kernels.py`` checks the count against the golden
model's. The mirror follows the listing block by block and must change with
``softmax.s``.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import VEC, OpRows

from .common import chain_color_grids, mesh_coordinates
from .softmax import BACK_COLORS, CHAIN_COLORS, SoftmaxPlan

__all__ = ["timing_ops", "pe_ops"]


def _v(n: int, count: int = 1) -> int:
    return count * (n + 1)


def _visible(q0: int, r: int, k0: int, k: int) -> tuple[list[tuple[int, int]], bool]:
    """Per key up to the first one no query sees: ``(cnt, 1 if off was clamped)``,
    and whether the loop ends by that break (rather than by running out of keys)."""
    keys = []
    for j in range(k0, k0 + k):
        off = j - q0
        cnt = r - max(off, 0)
        if cnt <= 0:
            return keys, True
        keys.append((cnt, int(off < 0)))
    return keys, False


def _loop_exit(broke: bool) -> int:
    return 5 if broke else 1


def _exp(n: int) -> int:
    c = 2 + _v(n) + 7 + n * 11 + 2 * (2 + _v(n)) + 2 + _v(n) + 2
    c += 6 * (2 + _v(n) + 1) + 5 * (_v(n) + 2)
    return c + 7 + n * 16


def _chain(ops: OpRows, block, code: int, first: bool, last: bool, colors: tuple[int, int, int, int]) -> None:
    """The chain subroutine: fold, pass east, the reciprocal (code 2, east PE), pass back west, return."""
    q0, r, k0, k = block
    c_in, c_out, b_in, b_out = colors
    ops.busy(2 + 2 + 2 + 1)                          # ldsd, setb, setl, ld p_first, beq
    if first:
        ops.busy(2 + _v(r) + 1)                      # setb, setl, fmov, jmp
    else:
        ops.busy(2 + 2 + 1)
        ops.op(VEC, r, c_in, -1, -1)
    ops.busy(11)
    keys, broke = _visible(q0, r, k0, k)
    for cnt, clamped in keys:
        ops.busy(18 + clamped + _v(cnt) + (code != 1))
    ops.busy(_loop_exit(broke) + 2 + 1)              # ld p_last, bne
    if not last:
        ops.busy(2 + 2 + 2)
        ops.op(VEC, r, -1, -1, c_out)
        ops.busy(2 + 2 + 1)
        ops.op(VEC, r, b_in, -1, -1)
        ops.busy(1)                                  # jmp chain_west
    else:
        ops.busy(2)                                  # li, bne
        if code == 2:
            ops.busy(6 + r * 8 + 4 + 4 + 3 + _v(r, 6) + 2 + _v(r, 5))
    ops.busy(2 + 1)                                  # ld p_first, bne
    if not first:
        ops.busy(2 + 2 + 2)
        ops.op(VEC, r, -1, -1, b_out)
    ops.busy({1: 2, 2: 4, 3: 5}[code])


def _final(ops: OpRows, block, backward: bool) -> None:
    """``clear_out`` and the loop over the visible keys (``p`` or ``ds``), up to ``exit``."""
    q0, r, k0, k = block
    n = r * k
    ops.busy(1 + 2 + 2 + 2 + 3 + _v(n) + 4 + 2 + 1 + int(backward))     # jmp clear_out .. beq (, jmp)
    keys, broke = _visible(q0, r, k0, k)
    if backward:
        ops.busy(9)
        per_key = [6 + clamped + 15 + _v(cnt, 3) + 8 + 4 for cnt, clamped in keys]
    else:
        ops.busy(7)
        per_key = [6 + clamped + 15 + _v(cnt) + 4 for cnt, clamped in keys]
    ops.busy(sum(per_key) + _loop_exit(broke))          # then exit (OpRows.end)


def pe_ops(plan: SoftmaxPlan, x: int, y: int) -> np.ndarray:
    """The timing ops of PE ``(x, y)``, ending with ``END``."""
    q, kb = plan.query_blocks[y], plan.key_blocks[x]
    block = (q.start, len(q), kb.start, len(kb))
    r, n = len(q), len(q) * len(kb)
    width = plan.config.width
    column, _ = mesh_coordinates(plan.config)
    c_in, c_out = (int(g[y, x]) for g in chain_color_grids(column, CHAIN_COLORS))
    b_in, b_out = (int(g[y, x]) for g in chain_color_grids(width - 1 - column, BACK_COLORS))
    colors, first, last = (c_in, c_out, b_in, b_out), x == 0, x == width - 1
    ops = OpRows()
    if r == 0:
        ops.busy(1 + 2 + 1)                          # select, ld, beq; exit
        return ops.end()
    ops.busy(45)
    if plan.variant == "forward":
        ops.busy(7)
        _chain(ops, block, 1, first, last, colors)
        ops.busy(18 + 2)
        if n:
            ops.busy(len(kb) * (_v(r) + 4) + _exp(n))
        ops.busy(7)
        _chain(ops, block, 2, first, last, colors)
    else:
        ops.busy(12 + _v(n) + 7)
        _chain(ops, block, 3, first, last, colors)
    _final(ops, block, plan.variant == "backward")
    return ops.end()


def timing_ops(plan: SoftmaxPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    parts, starts, ends, at = [], [], [], 0
    for y in range(plan.config.height):
        for x in range(plan.config.width):
            rows = pe_ops(plan, x, y)
            parts.append(rows)
            starts.append(at)
            at += len(rows)
            ends.append(at)
    return plan.routes(), np.concatenate(parts), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), {}
