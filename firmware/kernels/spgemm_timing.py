"""The instruction stream of ``spgemm.s`` as timing ops, for the static cycle model.

The mirror of ``spgemm.s`` in the rows of :mod:`wse.firmware.training.timing`
(``BUSY n``, ``RECV color``, ``VEC n, in1, in2, out, period``, ``END``):
a PE's control flow depends only on how many non-zeros of each output its
row holds and on the carriage returns' kinds, which the mask and the plan
fix, so the cycles are known before any value is. The replay
(:func:`wse.host.compiler.replay.replay`) runs the rows against the routers
and queues; ``tests/test_sparse_kernel.py`` checks the count against the
golden model's. The mirror must change with ``spgemm.s``.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import BUSY, RECV, VEC, OpRows
from wse.firmware.timing_ops import END as STOP
from wse.firmware.training.timing import indexed_rows

from .spgemm import W_COLOR, SpgemmPlan, _ring_colors, ring_routes, step_counts

__all__ = ["timing_ops", "row_ops", "SETUP_CYCLES", "BUSY", "RECV", "VEC", "STOP"]

#: Task selection and ``start``: 5 ld, 7 ldsd, 10 setb/setl, li r8, li, li, lui.
SETUP_CYCLES = 1 + 5 * 2 + 7 * 2 + 10 + 4


def _ring(ops: OpRows, kind: str, T: int, c_in: int, c_out: int, *, after_nonzero: bool) -> None:
    """The branches after the carriage return (from the ``recv``'s ``blt r1, r0`` on a row without a
    non-zero, from the ``fmacx``'s end after one), the ring operation and ``jmp feature``."""
    if not after_nonzero:
        ops.busy(1)                                # blt r1, r0 (taken)
    if kind in ("first", "mid"):
        ops.busy(2 if after_nonzero else 3)        # blt, beq (, beq)
        ops.op(VEC, T, c_in if kind == "mid" else -1, -1, c_out)
    elif kind == "last":
        ops.busy(3)                                # blt taken, setb, blt taken
        ops.op(VEC, T, c_in, -1, -1)
    else:                                          # only: fmov into memory
        ops.busy(3 + T + 1)
    ops.busy(1)                                    # jmp feature


def _kind(position: int, height: int) -> str:
    if height == 1:
        return "only"
    return "first" if position == 0 else ("last" if position == height - 1 else "mid")


def row_ops(plan: SpgemmPlan, positions: np.ndarray, counts: np.ndarray, T: int, c_in: int, c_out: int) -> np.ndarray:
    """The timing ops of a PE with ``T`` tokens on a row whose outputs, in
    stream order, have ring ``positions`` and ``counts`` non-zeros there."""
    height = plan.config.height
    ops = OpRows()
    ops.busy(SETUP_CYCLES)
    for position, n in zip(positions.tolist(), counts.tolist()):
        ops.op(RECV, W_COLOR)
        if n:
            ops.busy(2)                            # blt, setb
            ops.op(RECV, W_COLOR)
            ops.busy(T + 1)                        # fmacs
            ops.block(indexed_rows(n - 1, T, W_COLOR, True))  # fmacx: the later pairs, the carriage return
        _ring(ops, _kind(position, height), T, c_in, c_out, after_nonzero=bool(n))
    ops.op(RECV, W_COLOR)                          # END
    ops.busy(3 + 1)                                # blt, blt, beq; exit
    ops.op(STOP)
    return ops.array()


def timing_ops(plan: SpgemmPlan, mask: np.ndarray):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`:
    PE ``p`` (row-major) runs ``ops[starts[p]:ends[p]]``; PEs of one row with
    equal token blocks share their rows; PEs of unused columns stop at once."""
    cfg = plan.config
    c_in, c_out = _ring_colors(cfg.height)
    parts, starts, ends, at = [np.array([(STOP, 0, 0, 0, 0, 0)], dtype=np.int64)], [], [], 1
    inject = {}
    for i, (_, positions, counts) in enumerate(step_counts(plan, mask)):
        shared: dict[int, tuple[int, int]] = {}
        for j in range(cfg.width):
            if j >= len(plan.token_blocks):
                starts.append(0)
                ends.append(1)
                continue
            T = len(plan.token_blocks[j])
            if T not in shared:
                rows = row_ops(plan, positions, counts, T, c_in[i], c_out[i])
                parts.append(rows)
                shared[T] = (at, at + len(rows))
                at += len(rows)
            starts.append(shared[T][0])
            ends.append(shared[T][1])
        inject[("W", i)] = {W_COLOR: int(2 * counts.sum() + len(counts) + 1)}
    routes, _ = ring_routes(plan)
    return routes, np.concatenate(parts), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), inject
