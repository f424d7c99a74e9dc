"""The instruction stream of ``relayout.s`` as timing ops, for the static cycle model.

A PE's run is its table: per move two ``ldsd`` (2 cycles each), the ``fmov``
(a ``VEC`` row when it reads or writes the fabric, else ``n + 1`` private
cycles) and ``addi; addi; bne``; before them the task's select cycle,
``ld; beq`` and ``ld`` of the table's address, after them ``exit``.
:func:`wse.host.compiler.replay.replay` replays the rows against the
stage's routes; ``tests/test_relayout.py`` checks the count against the
golden model's. The mirror follows the listing and must change with
``relayout.s``.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.timing_ops import OpRows

from .mirrors import mesh_ops
from .relayout import RelayoutStage

__all__ = ["pe_ops", "timing_ops"]


def pe_ops(stage: RelayoutStage, x: int, y: int) -> np.ndarray:
    """The timing ops of PE ``(x, y)`` in ``stage``, ending with ``END``."""
    ops = OpRows()
    entries = stage.entries(x, y)
    ops.busy(1 + 2 + 1)                                  # select, ld, beq
    if not entries:
        return ops.end()
    ops.busy(2)                                          # ld p_tab
    for _, _, count, c_in, c_out in entries:
        ops.busy(2 + 2)
        ops.vec(count, c_in, -1, c_out)
        ops.busy(1 + 1 + 1)
    return ops.end()


def timing_ops(stage: RelayoutStage):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    ops, starts, ends = mesh_ops(stage.config, lambda x, y: pe_ops(stage, x, y))
    return stage.routes(), ops, starts, ends, {}
