"""The static cycle model: the golden model's cycle count of every phase,
computed without computing any data.

The fabric's timing does not depend on data (``train.s`` branches only on
record fields and counters), so a phase's cycles are a function of the
compiled schedule alone. :func:`phase_cycles` gets each PE's instruction
stream from :func:`wse.firmware.training.timing.pe_ops` and replays it
(:func:`~wse.host.compiler.replay.replay`), cycle by cycle, against a model of
the routers, edge ports and PE queues that follows ``docs/architecture.md``
sections 3, 4 and 6 (and the golden model) to the cycle: rotating color
priority, atomic multicast, ready bits from start-of-cycle counts, vector
elements written to ``tx`` one cycle after they issue, ``fmacw`` popping a
weight per chunk. The replay is a compiled loop (numba);
``tests/test_weight_streaming.py`` checks it against the golden model phase
by phase.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.image import Program
from wse.firmware.training import timing

from .replay import Network, replay

__all__ = ["phase_cycles", "replay", "Network"]


def _phase_ops(plan, phase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All PEs' timing ops of ``phase``, identical op lists shared."""
    cfg = plan.config
    table, starts, ends, seen = [], [], [], {}
    at = 0
    for i in range(cfg.height):
        for j in range(cfg.width):
            records = phase.records[i][j]
            words = np.concatenate(records + [np.zeros(2, dtype=np.uint32)]) if records else \
                np.zeros(2, dtype=np.uint32)
            key = words.tobytes()
            if key not in seen:
                ops = timing.pe_ops(words)
                seen[key] = (at, at + len(ops))
                table.append(ops)
                at += len(ops)
            start, end = seen[key]
            starts.append(start)
            ends.append(end)
    return np.concatenate(table), np.array(starts), np.array(ends)


def phase_cycles(plan, program: Program) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming plan, as the golden model counts them."""
    network = Network(plan.config, plan.routes)
    out = {}
    for name, phase in plan.phases.items():
        ops, starts, ends = _phase_ops(plan, phase)
        inject: dict = {}
        for stream in phase.streams_in:
            per_color = inject.setdefault((stream.edge, stream.index), {})
            per_color[stream.color] = per_color.get(stream.color, 0) + len(stream.gather)
        out[name] = replay(network, ops, starts, ends, inject)
    return out
