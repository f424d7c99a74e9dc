"""The instruction stream of ``gelu.s`` as timing ops, for the static cycle model.

``gelu.s`` touches no fabric: a PE's run is ``BUSY`` cycles that depend only
on its element count ``n`` and the variant (scalar instructions 1 cycle,
``ld``/``ldsd`` 2, a vector instruction ``n + 1``, the task's select cycle 1,
``docs/architecture.md`` section 7). The functions below follow the listing
block by block; the mirror must change with ``gelu.s``.
:func:`wse.host.compiler.replay.replay` runs the rows (``tests/test_transformer_kernels.py``
checks the count against the golden model's).
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import BUSY, END

from .gelu import TokenPlan

__all__ = ["pe_cycles", "timing_ops", "elementwise_ops", "exp_cycles", "erf_cycles", "tanh_cycles"]


def _v(n: int, count: int = 1) -> int:
    """``count`` vector instructions of ``n`` elements."""
    return count * (n + 1)


def _horner(n: int, terms: int) -> int:
    """``ld; fmuls`` of the top coefficient, ``li; li``, then ``terms`` turns of
    ``ld; fadds; beq`` with ``fmul; addi; jmp`` in all but the last."""
    return 2 + _v(n) + 2 + terms * (2 + _v(n) + 1) + (terms - 1) * (_v(n) + 2)


def exp_cycles(n: int, returns: int) -> int:
    """``exp`` of ``n`` elements; ``returns`` is the dispatch's length (2, 4 or 5)."""
    c = 2 + _v(n) + 7                         # ld, fmuls; ld, ld, ld, add
    c += n * 11                               # exp_round: ld, 8 single, bne
    c += 2 * (2 + _v(n))                      # ld, fmacs twice
    c += 2 + _v(n) + 5 * (2 + _v(n, 2)) + 2 + _v(n)     # c6, c5 .. c1 (fadds, fmul), c0
    c += 7                                    # ld, ld, ld, add
    c += n * 16                               # exp_scale: ld, ld, 12 single
    return c + returns


def _select(n: int, returns: int) -> int:
    """``select``: the mask, the blend and the return dispatch."""
    return 2 + _v(n, 5) + _v(n) + 2 + _v(n, 3) + returns


def erf_cycles(n: int, returns: int) -> int:
    """``erf`` of ``n`` elements, ``exp`` and ``select`` included."""
    c = 4 + _v(n, 4) + _v(n) + _horner(n, 6) + _v(n) + _v(n, 2) + _v(n, 2) + 2
    c += exp_cycles(n, 2)
    c += _horner(n, 12) + _v(n) + 2 + _v(n)
    c += 2 + _v(n) + 2 + _v(n, 4) + 2 + _v(n, 3) + 2 + _v(n) + 1
    return c + _select(n, returns)


def tanh_cycles(n: int, returns: int) -> int:
    """``tanh`` of ``n`` elements, ``exp``, the reciprocal and ``select`` included."""
    c = 4 + _v(n, 4) + _v(n) + _horner(n, 6) + _v(n, 3) + _v(n, 2) + 2 + _v(n) + 2
    c += exp_cycles(n, 4)
    c += 2 + _v(n) + 2 + _v(n)                # tanh_exp: s and sub(1, e)
    c += 7 + n * 8 + 2 + 2 + _v(n, 6) + 2 + _v(n, 4) + 2      # the reciprocal
    c += _v(n) + 2 + _v(n) + _v(n, 4) + 2 + _v(n, 3) + 2 + _v(n) + 1
    return c + _select(n, returns)


_DISPATCH = {"none": 1, "tanh": 3, "backward-none": 5, "backward-tanh": 6}


def pe_cycles(n: int, variant: str) -> int:
    """Cycles of one PE holding ``n`` elements, from the task's select cycle to its ``exit``."""
    if n == 0:
        return 1 + 2 + 1 + 1                  # select, ld, beq, exit
    c = 1 + 2 + 1 + 2 + 1 + 32 + 16 + 2 + _DISPATCH[variant]
    finish_forward = 2 + _v(n) + 2 + _v(n, 2) + 1
    finish_backward = 2 + _v(n) + 1
    inner = _v(n, 2) + 2 + _v(n, 2) + 2 + _v(n) + 2 + 1 + 1
    if variant == "none":
        return c + 2 + _v(n) + 2 + erf_cycles(n, 2) + 1 + finish_forward
    if variant == "tanh":
        return c + 1 + inner + 2 + tanh_cycles(n, 6) + finish_forward
    if variant == "backward-none":
        c += 2 + _v(n) + 2 + erf_cycles(n, 4)
        c += 2 + _v(n) + 2 + _v(n, 3) + 2 + _v(n) + 2 + exp_cycles(n, 5)
        return c + 2 + _v(n, 3) + 1 + finish_backward
    c += 1 + inner + 1 + 2 + tanh_cycles(n, 7)
    c += _v(n) + 2 + _v(n, 2) + 2 + _v(n) + 2 + _v(n) + 2 + _v(n) + 2 + _v(n, 3) + 2 + _v(n, 3)
    return c + finish_backward


def elementwise_ops(counts: np.ndarray, cycles_of):
    """``(routes, ops, starts, ends, inject)`` of a kernel that touches no fabric: every PE is one
    ``BUSY`` row of ``cycles_of(n)`` for its ``counts`` elements and ``END`` (PEs with equal counts
    share their rows)."""
    rows, starts, ends, shared = [], [], [], {}
    for n in counts.reshape(-1).tolist():
        if n not in shared:
            shared[n] = len(rows)
            rows += [(BUSY, cycles_of(n), 0, 0, 0, 0), (END, 0, 0, 0, 0, 0)]
        starts.append(shared[n])
        ends.append(shared[n] + 2)
    return [], np.array(rows, dtype=np.int64), np.array(starts, dtype=np.int64), np.array(ends, dtype=np.int64), {}


def timing_ops(plan: TokenPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`:
    :func:`elementwise_ops` of :func:`pe_cycles`."""
    return elementwise_ops(plan.counts, lambda n: pe_cycles(n, plan.variant))
