"""Timing ops: what a PE's instruction stream does, as the static cycle model replays it.

The timing mirrors of the record interpreters (``wse.firmware.training.timing``
for ``train.s``, ``pipe_timing`` for ``pipe.s``) and of the sparse GEMM kernel
(``wse.firmware.kernels.spgemm_timing``) describe a PE's run as rows of
:data:`OP_FIELDS`, built with :class:`OpRows`:

* ``BUSY n``: ``n`` cycles of instructions that touch only the PE's own state;
* ``RECV color``: one ``recv``;
* ``VEC n, in1, in2, out, period``: a vector instruction with fabric operands
  (colors, -1 for none); ``period > 0`` marks an ``fmacw`` popping one weight
  from ``in1`` every ``period`` elements;
* ``END``: the end of the PE's run.

:func:`wse.host.compiler.replay.replay` replays them against the routers and
queues.
"""

from __future__ import annotations

import numpy as np

__all__ = ["BUSY", "RECV", "VEC", "END", "OP_FIELDS", "OpRows"]

BUSY, RECV, VEC, END = 0, 1, 2, 3
#: Columns of an op row.
OP_FIELDS = ("op", "a", "b", "c", "d", "e")


class OpRows:
    """A PE's op rows under construction: adjacent ``BUSY`` cycles merged into one
    row, whole blocks of ready-made rows appended at once."""

    def __init__(self):
        self.parts: list[np.ndarray] = []
        self.rows: list[tuple] = []
        self.pending = 0

    def busy(self, n: int) -> None:
        """``n`` more private cycles (merged with the ``BUSY`` cycles before them)."""
        self.pending += int(n)

    def _flush(self) -> None:
        if self.pending:
            self.rows.append((BUSY, self.pending, 0, 0, 0, 0))
            self.pending = 0

    def op(self, *row) -> None:
        """One row (missing trailing fields are 0)."""
        self._flush()
        self.rows.append(tuple(row) + (0,) * (len(OP_FIELDS) - len(row)))

    def recv(self, color: int) -> None:
        """One ``recv`` on ``color``."""
        self.op(RECV, color)

    def vec(self, n: int, in1=-1, in2=-1, out=-1, period=0) -> None:
        """A vector instruction; without fabric operands it is ``n + 1`` private cycles."""
        if in1 < 0 and in2 < 0 and out < 0:
            self.busy(n + 1)
            return
        self.op(VEC, n, in1, in2, out, period)

    def block(self, rows: np.ndarray) -> None:
        """Rows that start and end with a non-``BUSY`` row."""
        self._flush()
        if len(rows):
            self.parts.append(np.array(self.rows, dtype=np.int64).reshape(-1, len(OP_FIELDS)))
            self.parts.append(rows)
            self.rows = []

    def array(self) -> np.ndarray:
        """Every row so far, as ``int64 [rows, len(OP_FIELDS)]``."""
        self._flush()
        self.parts.append(np.array(self.rows, dtype=np.int64).reshape(-1, len(OP_FIELDS)))
        rows = np.concatenate(self.parts)
        self.parts, self.rows = [], []
        return rows

    def end(self) -> np.ndarray:
        """The task's ``exit`` (one cycle) and ``END``; returns every row."""
        self.busy(1)
        self.op(END)
        return self.array()
