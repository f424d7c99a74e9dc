"""The instruction stream of ``layernorm.s`` as timing ops, for the static cycle model.

A PE's control flow depends only on its feature and token counts and its row
(first, last), which the plan fixes: ``BUSY`` cycles between the vector
instructions on the fabric (the sum from the north, on to the south, the
result back from the south, on to the north). The mirror follows the listing
block by block and must change with ``layernorm.s``;
``tests/test_transformer_kernels.py`` checks the replay against the golden
model's cycles.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import VEC, OpRows

from .common import chain_color_grids, mesh_coordinates
from .gelu import TokenPlan
from .layernorm import BACK_COLORS, CHAIN_COLORS, column_routes

__all__ = ["timing_ops", "pe_ops"]


def _v(n: int, count: int = 1) -> int:
    return count * (n + 1)


def _psum(ops: OpRows, f: int, t: int) -> None:
    ops.busy(2 + _v(t) + 3 + f * (_v(t) + 3) + 1)     # clear P, the features, jmp chain


def _chain(ops: OpRows, code: int, t: int, first: bool, last: bool, colors: tuple[int, int, int, int]) -> None:
    c_in, c_out, b_in, b_out = colors
    ops.busy(6 + 4 + 1)                               # S's descriptor, ld p_first, p_last, bne
    if not first:
        ops.busy(5 + 1)
        if not last:
            ops.busy(6)
            ops.op(VEC, t, c_in, -1, c_out)
            ops.busy(1)
        else:
            ops.op(VEC, t, c_in, -1, -1)
            ops.busy(1)
    else:
        ops.busy(1)
        ops.busy(6 if not last else _v(t))
        if not last:
            ops.op(VEC, t, -1, -1, c_out)
            ops.busy(1)
    if last:
        ops.busy(2 + _v(t) + 2)                       # 1/D, li, beq
        if code == 2:
            ops.busy(2 + _v(t) + 7 + t * 9 + 18 + 2 + _v(t) + 3 + 2 * (_v(t, 4) + 2) + 2 + _v(t, 5))
        ops.busy(3)                                   # ld p_first, bne
        if not first:
            ops.busy(6)
            ops.op(VEC, t, -1, -1, b_out)
            ops.busy(1)
    else:
        ops.busy(5)
        ops.op(VEC, t, b_in, -1, -1)
        ops.busy(1)
        if not first:
            ops.busy(6)
            ops.op(VEC, t, -1, -1, b_out)
    ops.busy(2 if code == 1 else 3)


def pe_ops(plan: TokenPlan, x: int, y: int) -> np.ndarray:
    """The timing ops of PE ``(x, y)``, ending with ``END``."""
    cfg = plan.config
    f, t = len(plan.row_features(y)), len(plan.token_blocks[x])
    ops = OpRows()
    if t == 0:
        ops.busy(4)
        return ops.end()
    _, row = mesh_coordinates(cfg)
    c_in, c_out = (int(g[y, x]) for g in chain_color_grids(row, CHAIN_COLORS))
    b_in, b_out = (int(g[y, x]) for g in chain_color_grids(cfg.height - 1 - row, BACK_COLORS))
    colors, first, last = (c_in, c_out, b_in, b_out), y == 0, y == cfg.height - 1
    ops.busy(46)
    _psum(ops, f, t)
    _chain(ops, 1, t, first, last, colors)
    ops.busy(17)
    if f:
        ops.busy(f * (_v(t) + 4) + 9 + _v(f * t))
    ops.busy(4)
    _psum(ops, f, t)
    _chain(ops, 2, t, first, last, colors)
    ops.busy(15 + f * (_v(t, 3) + 10))
    return ops.end()


def timing_ops(plan: TokenPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    parts, starts, ends, at = [], [], [], 0
    for y in range(plan.config.height):
        for x in range(plan.config.width):
            rows = pe_ops(plan, x, y)
            parts.append(rows)
            starts.append(at)
            at += len(rows)
            ends.append(at)
    return (column_routes(plan.config), np.concatenate(parts), np.array(starts, dtype=np.int64),
            np.array(ends, dtype=np.int64), {})
