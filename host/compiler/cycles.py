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
by phase. Phases of many identical rounds skip the proven repeats of their
state (:mod:`.replay_periods`), with the same counts as the full replay.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.image import Program
from wse.firmware.training import timing

from .replay import Network, replay

__all__ = ["phase_cycles", "executable_cycles", "phase_ops", "phase_injections", "replay", "Network"]


def phase_ops(plan, phase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All PEs' timing ops of ``phase`` as ``(ops, starts, ends)``: PE ``p``
    (row-major) runs ``ops[starts[p]:ends[p]]``; identical op lists are shared."""
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


def phase_injections(phase) -> dict:
    """The wavelets the edge ports inject in ``phase``: ``{(edge, index): {color: count}}``."""
    inject: dict = {}
    for stream in phase.streams_in:
        per_color = inject.setdefault((stream.edge, stream.index), {})
        per_color[stream.color] = per_color.get(stream.color, 0) + len(stream.gather)
    return inject


def phase_cycles(plan, program: Program | None = None, *, periods: bool = True,
                 progress: bool = True) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming plan, as the golden model counts them.

    ``periods`` lets the replay skip proven repeats (:mod:`.replay_periods`;
    the counts are the same either way); ``progress`` reports the phases on
    stderr when the model takes more than a few seconds (:mod:`.progress`).
    ``program`` is not needed (the timing ops follow ``train.s``); it is
    accepted for callers that pass it.
    """
    from .progress import Progress

    network = Network(plan.config, plan.routes)
    out = {}
    with Progress("cycle model", len(plan.phases), enabled=progress) as bar:
        for name, phase in plan.phases.items():
            bar.step(name)
            ops, starts, ends = phase_ops(plan, phase)
            out[name] = replay(network, ops, starts, ends, phase_injections(phase), periods=periods)
    return out


def executable_cycles(exe, *, periods: bool = True, progress: bool = True) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming executable, from what it
    holds (op images, routes, weight streams): the counts
    :func:`phase_cycles` gives at compile time, for an executable compiled
    without them (``generate(plan, cycles=False)``)."""
    from .progress import Progress

    if exe.mode != "weight_streaming":
        raise ValueError(f"executable_cycles models weight-streaming executables, not mode {exe.mode!r}")
    cfg = exe.config
    images = {addr: image for addr, image in exe.static}
    network = Network(cfg, exe.routes)
    out = {}
    with Progress("cycle model", len(exe.phases), enabled=progress) as bar:
        for name, phase in exe.phases.items():
            bar.step(name)
            image = images[phase.ops_addr]
            table, starts, ends, seen, at = [], [], [], {}, 0
            for i in range(cfg.height):
                for j in range(cfg.width):
                    key = image[i, j].tobytes()
                    if key not in seen:
                        ops = timing.pe_ops(image[i, j])
                        seen[key] = (at, at + len(ops))
                        table.append(ops)
                        at += len(ops)
                    starts.append(seen[key][0])
                    ends.append(seen[key][1])
            out[name] = replay(network, np.concatenate(table), np.array(starts), np.array(ends),
                               phase_injections(phase), periods=periods)
    return out
