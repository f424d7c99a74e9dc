"""The instruction stream of ``attention.s`` as timing ops, for the static cycle model.

A PE's control flow depends only on its block (queries ``q0 .. q0+R-1``,
keys ``k0 .. k0+K-1``), the head width, its place on the chain and the
variant, all fixed by the plan, so its run is known before any value:
``BUSY`` cycles between the vector instructions that read or write the
fabric (``VEC`` rows: the row and column multicasts, the partial sum from
the previous PE of the chain and on to the next).
:func:`wse.host.compiler.replay.replay` replays them against the routes and
the edge streams; ``tests/test_attention_kernels.py`` checks the count
against the golden model's. The mirror follows the listing block by block
and must change with ``attention.s``.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import VEC, OpRows

from .attention import CHAIN_COLORS, COL_COLOR, ROW_COLOR, AttentionPlan
from .common import chain_color_grids
from .mirrors import mesh_ops

__all__ = ["timing_ops", "pe_ops"]


def _local(ops: OpRows, q0: int, r: int, k0: int, k: int, dh: int, scaled: bool) -> None:
    """Mode 0: clear OUT, one ``dot`` per visible (key, query), up to ``exit``."""
    ops.busy(11 + r * k + 1 + 20)
    for j in range(k0, k0 + k):
        off = j - q0
        cnt = r - max(off, 0)
        if cnt <= 0:
            ops.busy(5)
            return
        ops.busy(12 + (off < 0) + cnt * (dh + 8 + scaled) + 5)
    ops.busy(1)


def _receive(ops: OpRows, dh: int, first: bool, c_in: int) -> None:
    """A row of the partial: ``+0`` at the chain's first PE, else from the previous PE."""
    ops.busy(2)                                      # setb, bne
    if first:
        ops.busy(dh + 1)
    else:
        ops.op(VEC, dh, c_in, -1, -1)
        ops.busy(1)


def _send(ops: OpRows, dh: int, last: bool, c_out: int) -> None:
    ops.busy(1)
    if not last:
        ops.op(VEC, dh, -1, -1, c_out)
    ops.busy(5)


def _east(ops: OpRows, q0: int, r: int, k0: int, k: int, dh: int, ends) -> None:
    """Mode 1: per query, its row from the west, one ``fmacs`` per visible key, on east."""
    ops.busy(7)
    for i in range(r):
        _receive(ops, dh, ends[0], ends[2])
        raw = q0 + i - k0 + 1
        nvis = min(raw, k)
        ops.busy(3 + (raw >= k))
        if nvis > 0:
            ops.busy(4 + nvis * (dh + 7))
        _send(ops, dh, ends[1], ends[3])
    ops.busy(1)


def _south(ops: OpRows, q0: int, r: int, k0: int, k: int, dh: int, ends) -> None:
    """Mode 2: per key, its row from the north, one ``fmacs`` per visible query, on south."""
    ops.busy(6)
    for j in range(k0, k0 + k):
        _receive(ops, dh, ends[0], ends[2])
        off = j - q0
        cnt = r - max(off, 0)
        ops.busy(4 + (off < 0))
        if cnt > 0:
            ops.busy(6 + cnt * (dh + 7))
        _send(ops, dh, ends[1], ends[3])
    ops.busy(1)


def pe_ops(plan: AttentionPlan, x: int, y: int) -> np.ndarray:
    """The timing ops of PE ``(x, y)``, ending with ``END``."""
    spec, dh = plan.spec, plan.width
    q, kb = plan.query_blocks[y], plan.key_blocks[x]
    q0, r, k0, k = q.start, len(q), kb.start, len(kb)
    ops = OpRows()
    ops.busy(1 + 2 + 1)                              # select, ld, beq
    if r == 0:
        return ops.end()
    ops.busy(2 + 1)
    if k == 0:
        return ops.end()
    ops.busy(2 + 1 + 2 + 1)
    if spec.row and not plan.resident:
        ops.busy(12)
        ops.op(VEC, r * dh, ROW_COLOR, -1, -1)
    ops.busy(2 + 1)
    if spec.col and not plan.resident:
        ops.busy(12)
        ops.op(VEC, k * dh, COL_COLOR, -1, -1)
    ops.busy(2 + 1)
    if spec.mode == 0:
        _local(ops, q0, r, k0, k, dh, spec.scaled)
        return ops.end()
    position, length = plan.chain_position()
    pos = int(position[y, x])
    c_in, c_out = (int(g[y, x]) for g in chain_color_grids(position, CHAIN_COLORS))
    ends = (pos == 0, pos == length - 1, c_in, c_out)
    ops.busy(1 + 32 + (spec.mode == 2))              # jmp chain_setup, the setup, the mode's branch
    if spec.mode == 1:
        _east(ops, q0, r, k0, k, dh, ends)
    else:
        _south(ops, q0, r, k0, k, dh, ends)
    return ops.end()


def timing_ops(plan: AttentionPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    ops, starts, ends = mesh_ops(plan.config, lambda x, y: pe_ops(plan, x, y))
    inject: dict = {}
    spec, dh = plan.spec, plan.width
    if spec.row and not plan.resident:
        for y, q in enumerate(plan.query_blocks[:plan.rows_used]):
            inject[("W", y)] = {ROW_COLOR: len(q) * dh}
    if spec.col and not plan.resident:
        for x, kb in enumerate(plan.key_blocks[:plan.cols_used]):
            inject[("N", x)] = {COL_COLOR: len(kb) * dh}
    return plan.routes(), ops, starts, ends, inject
