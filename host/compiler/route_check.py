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

from wse.firmware.deadlock import Proof, Ring, check_routes, route_graph
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
    traffic, decoded, _ = _traffic(grid, decode)
    return {pe: (set(a), set(b)) for pe, (a, b) in traffic.items()}, {pe: list(v) for pe, v in decoded.items()}


def _traffic(grid, decode) -> tuple[dict, dict, tuple]:
    """:func:`phase_traffic` with the PEs' frozensets and lists shared, not
    copied (for readers only), and the traffic's signature: per PE ``((x, y),
    frozenset received, frozenset sent)`` (equal signatures, equal traffic).

    PEs are first matched by the identities of their record objects, which
    is sound only while ``grid`` holds every record alive for the whole call
    (as the plans' lists of records do): an object made on the fly and freed
    could leave its identity to another."""
    traffic, decoded, records, pes, same, signature = {}, {}, {}, {}, {}, []
    for y, row in enumerate(grid):
        for x, ops in enumerate(row):
            ids = tuple(map(id, ops))      # PEs often share the record objects themselves: no bytes to read
            pe = same.get(ids)
            if pe is not None:
                traffic[(x, y)] = pe[1:]
                decoded[(x, y)] = pe[0]
                signature.append(((x, y), pe[1], pe[2]))
                continue
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
            same[ids] = pe
            traffic[(x, y)] = pe[1:]
            decoded[(x, y)] = pe[0]
            signature.append(((x, y), pe[1], pe[2]))
    return traffic, decoded, tuple(signature)


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
    proofs, seen, graph = [], {}, None
    for name, phase in plan.phases.items():
        traffic, decoded, signature = _traffic(phase.records, rec.decode)
        rings = weight_streaming_rings(plan, decoded)
        key = (signature, tuple(rings))
        if key not in seen:     # phases with the same traffic and rings have the same graph
            what = f"weight-streaming phase {name!r}"
            if graph is None:   # one route set for every phase: its table and route edges built once
                graph = route_graph(plan.config, plan.routes, what=what)
            seen[key] = check_routes(plan.config, plan.routes, what=what, traffic=traffic, rings=rings,
                                     graph=graph)
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
