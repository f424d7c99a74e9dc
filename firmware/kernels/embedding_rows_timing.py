"""The instruction stream of an embedding-rows stream (``relayout.s`` running
the tables of :mod:`.embedding_rows`) as timing ops, for the static cycle
model: each PE's table through :func:`.relayout_timing.pe_ops` (the same
listing), the edge ports injecting the words MemoryX streams in.
``tests/test_embedding_rows.py`` checks the count against the golden model's.
"""

from __future__ import annotations

from .embedding_rows import RowsPlan
from .mirrors import mesh_ops
from .relayout_timing import pe_ops

__all__ = ["timing_ops"]


def timing_ops(plan: RowsPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`."""
    ops, starts, ends = mesh_ops(plan.config, lambda x, y: pe_ops(plan, x, y))
    inject: dict = {}
    if plan.direction == "in":
        for s in plan.segments:
            inject.setdefault((s.edge, s.y), {})[plan.edge_color(s)] = plan.edge_words(s)
    return plan.routes(), ops, starts, ends, inject
