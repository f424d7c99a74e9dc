"""The compilers' static deadlock check: each phase's route set and task traffic
through :func:`wse.firmware.deadlock.check_routes` before an executable exists.

What the mapper knows of the tasks comes from the op records it wrote: a
record's fabric-in descriptors are the colors its PE receives in the phase,
its fabric-out descriptors the colors it sends (an input queue of a PE that
sends may wait for its output queue). The weight-streaming column ring is a
cycle by design; each phase declares it as a :class:`~wse.firmware.deadlock.Ring`
per column with the rule its records follow (``docs/faults.md`` section 1):
the streamed GEMM forwards messages of one token pass's partial sums (its
fabric-out descriptor's length), the weight
gradients and the softmax rotate blocks with the rows of even index sending
first and the odd rows receiving first.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.firmware.deadlock import Proof, Ring, check_routes
from wse.firmware.isa import DsdKind
from wse.firmware.training import pipe
from wse.firmware.training import records as rec

__all__ = ["phase_traffic", "weight_streaming_rings", "check_weight_streaming", "check_pipelined"]


def phase_traffic(grid, decode) -> tuple[dict, dict]:
    """``(traffic, fields)`` of one phase's ``[H][W]`` record lists: per PE
    ``(colors received, colors sent)`` from the records' fabric descriptors,
    and per PE its decoded ``(kind, fields)`` records.

    A record's words decide its kind, fields and colors, and most PEs of a
    phase hold the same records, so each distinct record (and each distinct
    list of them) is decoded once; the PEs that share it share its read-only
    fields."""
    traffic, decoded, records, pes = {}, {}, {}, {}
    for y, row in enumerate(grid):
        for x, ops in enumerate(row):
            keys = tuple(words.tobytes() if isinstance(words, np.ndarray) else tuple(int(w) for w in words)
                         for words in ops)
            pe = pes.get(keys)
            if pe is None:
                mine, receives, sends = [], frozenset(), frozenset()
                for key, words in zip(keys, ops):
                    seen = records.get(key)
                    if seen is None:
                        seen = records[key] = _colors(*decode(words)[:2])
                    mine.append(seen[:2])
                    receives, sends = receives | seen[2], sends | seen[3]
                pe = pes[keys] = (mine, receives, sends)
            traffic[(x, y)] = (set(pe[1]), set(pe[2]))
            decoded[(x, y)] = list(pe[0])
    return traffic, decoded


def _colors(kind: str, fields: dict) -> tuple[str, dict, frozenset, frozenset]:
    """A decoded record with the colors its fabric-in and fabric-out descriptors name."""
    takes = frozenset(v[1] for v in fields.values() if isinstance(v, tuple) and v[0] == DsdKind.FABIN)
    gives = frozenset(v[1] for v in fields.values() if isinstance(v, tuple) and v[0] == DsdKind.FABOUT)
    return kind, fields, takes, gives


def weight_streaming_rings(plan, decoded: dict) -> list[Ring]:
    """The column rings of one weight-streaming phase, one per column and
    ring-using record kind, with the rule of that kind."""
    from .weight_streaming import ring_colors
    H = plan.config.height
    if H < 2:
        return []
    rings = []
    for j in range(plan.columns):
        members = tuple((j, i) + ring_colors(i, H) for i in range(H))
        column = [fields for i in range(H) for kind, fields in decoded[(j, i)] if kind in ("sgemm", "spgemm")]
        if column:
            rings.append(Ring(f"column {j} partial sums", members, message=max(f["out"][2] for f in column)))
        for kind in ("wgrad", "spwgrad", "softmax"):
            flags = [[not f["send_first"] for k, f in decoded[(j, i)] if k == kind] for i in range(H)]
            if any(flags):
                rings.append(Ring(f"column {j} {kind} rotation", members,
                                  receive_first=tuple(all(f) and bool(f) for f in flags)))
    return rings


def check_weight_streaming(plan) -> list[Proof]:
    """Check every phase of a weight-streaming plan; raises
    :class:`~wse.firmware.deadlock.DeadlockError` naming the phase and the cycle."""
    proofs, seen = [], {}
    for name, phase in plan.phases.items():
        traffic, decoded = phase_traffic(phase.records, rec.decode)
        rings = weight_streaming_rings(plan, decoded)
        key = (tuple((pe, frozenset(a), frozenset(b)) for pe, (a, b) in traffic.items()), tuple(rings))
        if key not in seen:     # phases with the same traffic and rings have the same graph
            seen[key] = check_routes(plan.config, plan.routes, what=f"weight-streaming phase {name!r}",
                                     traffic=traffic, rings=rings)
        proofs.append(dataclasses.replace(seen[key], what=f"weight-streaming phase {name!r}"))
    return proofs


def check_pipelined(plan) -> list[Proof]:
    """Check every phase of a layer-pipelined plan (no rings: its phases are
    acyclic by construction, and this proves it)."""
    proofs = []
    for name, (_, grid) in plan.phases.items():
        traffic, _ = phase_traffic(grid, pipe.decode)
        proofs.append(check_routes(plan.config, plan.routes, what=f"layer-pipelined phase {name!r}",
                                   traffic=traffic))
    return proofs
