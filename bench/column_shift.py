"""Are a phase's columns time-shifted copies of each other? One JSON line per phase.

The measurement behind the column-shift lead of ``docs/weight_streaming.md``
section 9 ("What is not solved"): the reference replay
(:func:`wse.host.compiler.replay._run`) is stepped one cycle at a time, and
at the start of every cycle each column's *relative* state is hashed (per PE
of the column: its op row within its op list, cycles until it is free, its
element index, whether an element enters its output queue this cycle,
whether it is done; its router's FIFO counts,
its input queues, its output queue's colors from the head, its pending
writes). A line gives the phase's cycles; the grants that depended on the
color rotation (``conflicts``); the FIFO-cycles at which a FIFO fed from a
neighbouring column was full (``full_column_fifos``: a sender there could be
held back, so a column would depend on the one east of it); the FIFO-cycles
with wavelets that came from the east (``westward_fifos``: with none, every
wavelet between columns goes east); the column period
``P`` of the op lists (columns ``j`` and ``j + P`` run equal op lists for
every ``j >= 1``; ``null`` if none); and, per column ``j >= 1`` with a column
``j + P``, the shift ``delta`` for which column ``j + P``'s state at ``t``
equals column ``j``'s at ``t - delta`` at the most cycles, with the first cycle
``from_cycle`` from which that holds to the end of the stepped cycles
(``shift_from_cycle`` is the latest over the columns, ``null`` where it never
holds). Two independent 64-bit hashes of each column's state are compared, so
a match is a match but for a chance of about 2**-128 per comparison.

    .venv/bin/python bench/column_shift.py                              # 8x8, every phase
    .venv/bin/python bench/column_shift.py --mesh 16 16 --sizes 256 256 256 10 --batch 64 \\
        --phases "bwd-weight 2" "fwd 0"
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _features(queues, cores, events, starts, t: int) -> np.ndarray:
    """Every PE's relative state at the start of cycle ``t`` as ``int [PEs, F]``: the state the
    reduced replay's rule compares (:func:`wse.host.compiler.replay_columns._features`)."""
    from wse.host.compiler.replay import _WRITE
    from wse.host.compiler.replay_columns import _features as features
    n = int(events.count[_WRITE])
    return features(queues, cores, (events.who[_WRITE, :n], events.color[_WRITE, :n]), starts, t)


def _column_hashes(features: np.ndarray, width: int, height: int, weights) -> np.ndarray:
    """Two hashes per column ``[2, width]`` of the per-PE features (PE ``i * width + j``)."""
    per_column = features.reshape(height, width, -1).transpose(1, 0, 2).reshape(width, -1).astype(np.uint64)
    return np.stack([(per_column * w[None, :]).sum(axis=1) for w in weights])


def _column_period(ops, starts, ends, width: int, height: int):
    """The smallest ``P`` with equal op lists on columns ``j`` and ``j + P`` for every ``j >= 1``, or None."""
    def same(a, b):
        return np.array_equal(ops[starts[a]:ends[a]], ops[starts[b]:ends[b]])
    for period in range(1, width - 1):
        if all(same(i * width + j, i * width + j + period) for i in range(height) for j in range(1, width - period)):
            return period
    return None


def step_phase(network, ops, starts, ends, inject, max_shift: int = 64) -> dict:
    """Step the reference replay of one phase a cycle at a time; the record described above."""
    from wse.config import Port
    from wse.host.compiler.replay import _CONFLICTS, _FINISHED, _OUT_OF_TIME, _T, _LAST, _run
    from wse.host.compiler.replay_state import fresh_run
    cfg = network.config
    width, height = cfg.width, cfg.height
    routes, ports, ops32, queues, cores, events, scalars = fresh_run(network, ops, starts, inject)
    starts = np.asarray(starts, dtype=np.int64)
    rng = np.random.default_rng(0)
    size = _features(queues, cores, events, starts, 0).shape[1] * height
    weights = [rng.integers(1, 2**63, size, dtype=np.uint64) | np.uint64(1) for _ in range(2)]
    from_column = np.isin(routes.input_port, (int(Port.E), int(Port.W)))
    from_east = routes.input_port == int(Port.E)
    times, hashes, full, westward = [], [], 0, 0
    while True:
        t = int(scalars[_T])
        times.append(t)
        hashes.append(_column_hashes(_features(queues, cores, events, starts, t), width, height, weights))
        full += int(((queues.router_fifo >= routes.router_depth) & from_column).sum())
        westward += int(((queues.router_fifo > 0) & from_east).sum())
        status = _run(routes, ports, ops32, queues, cores, events, scalars, t + 1, -1)
        if status == _FINISHED:
            break
        if status != _OUT_OF_TIME:
            raise RuntimeError("the replay hung")
    count = int(scalars[_LAST]) + 1
    period = _column_period(np.asarray(ops), starts, np.asarray(ends), width, height)
    record = {"cycles": count, "stepped_cycles": len(times), "conflicts": int(scalars[_CONFLICTS]),
              "full_column_fifos": full, "westward_fifos": westward, "column_period": period, "columns": []}
    if period is None:
        record["shift_from_cycle"] = None
        return record
    at = {t: i for i, t in enumerate(times)}
    stacked = np.stack(hashes)                          # [cycles, 2, width]
    latest = 0
    for j in range(1, width - period):
        best = None
        for delta in range(max_shift + 1):
            pairs = [(at[t], at[t - delta]) for t in times if t - delta in at]
            if not pairs:
                continue
            a, b = np.array(pairs).T
            equal = (stacked[a, :, j + period] == stacked[b, :, j]).all(axis=1)
            bad = np.flatnonzero(~equal)
            start = times[a[bad[-1]]] + 1 if bad.size else times[a[0]]
            if best is None or int(equal.sum()) > best[2]:
                best = (delta, start if start <= times[-1] else None, int(equal.sum()))
        record["columns"].append({"column": j, "delta": best[0], "from_cycle": best[1]})
        latest = None if latest is None or best[1] is None else max(latest, best[1])
    record["shift_from_cycle"] = latest
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", nargs=2, type=int, default=[8, 8], metavar=("W", "H"))
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 128, 128, 10])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--phases", nargs="*", default=None, help="phase names (default: all)")
    args = parser.parse_args(argv)
    import torch

    from compile_speed import _model
    from wse.config import FabricConfig
    from wse.host.compiler import cycles, trace
    from wse.host.compiler.weight_streaming import plan
    torch.manual_seed(0)
    config = FabricConfig(width=args.mesh[0], height=args.mesh[1])
    the_plan = plan(trace(_model(args.sizes), torch.randn(2, args.sizes[0])), config, args.batch)
    network = cycles.Network(config, the_plan.routes)
    for name, phase in the_plan.phases.items():
        if args.phases and name not in args.phases:
            continue
        ops, starts, ends = cycles.phase_ops(the_plan, phase)
        record = step_phase(network, ops, starts, ends, cycles.phase_injections(phase))
        print(json.dumps({"mesh": f"{args.mesh[0]}x{args.mesh[1]}", "sizes": args.sizes, "batch": args.batch,
                          "phase": name, **record}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
