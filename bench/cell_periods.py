"""Each cell's own period at a cycle of a phase: how the fabric repeats, row band by row band.

Replays one phase of a weight-streaming MLP on the reference engine, a cycle at a time over the
``2 * --longest`` cycles before each ``--at`` cycle, hashes every cell's relative state each cycle
(the region replay's per-cell hash: queues, output queue, private cycles, element index, pending
write), and reports for each cell the smallest lag ``d <= --longest`` at which its hash at the
cycle equals the hash ``d`` and ``2d`` cycles earlier with the same op-row shift over both lags
(evidence of a period, not a proof: hashes). One JSON line per cycle and band of rows: how many
cells have each period, and how many none. It shows what a region replay could take: the fills of
the wafer's rows (``docs/weight_streaming.md`` section 9, "What is not solved"):

    .venv/bin/python bench/cell_periods.py --mesh 16 994 --batch 128 --at 3000       # the GEMM's fill
    .venv/bin/python bench/cell_periods.py --mesh 16 994 --batch 128 --phase "bwd-data 4" --at 5000 --longest 300
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cell_periods(hashes: np.ndarray, pcs: np.ndarray, longest: int) -> np.ndarray:
    """Each cell's smallest period at the last of ``hashes``' rows (``[cycle, cell]``, at least
    ``2 * longest + 1`` rows; ``pcs`` the op rows alike): the smallest ``d <= longest`` whose
    hashes at the last row, ``d`` and ``2d`` rows before are equal with equal op-row shifts; -1 none."""
    n = hashes.shape[0] - 1
    best = np.full(hashes.shape[1], -1, np.int64)
    for d in range(1, longest + 1):
        found = (best < 0) & (hashes[n] == hashes[n - d]) & (hashes[n - d] == hashes[n - 2 * d]) & \
            (pcs[n] - pcs[n - d] == pcs[n - d] - pcs[n - 2 * d])
        best[found] = d
    return best


def main(argv=None) -> int:
    from compile_speed import phase_arguments, planned_phase

    from wse.config import UsageError
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phase_arguments(parser, (16, 994), 128, None)
    parser.add_argument("--at", nargs="+", type=int, default=[3000], help="the cycles to look at")
    parser.add_argument("--longest", type=int, default=700, help="the longest period looked for")
    parser.add_argument("--bands", type=int, default=20, help="bands of rows reported")
    args = parser.parse_args(argv)
    if args.longest < 1 or args.bands < 1 or min(args.at) < 2 * args.longest:
        raise UsageError(f"--at {' '.join(map(str, args.at))}, --longest {args.longest}, --bands {args.bands}: "
                         "expected positive numbers and cycles of at least twice --longest")
    from wse.host.compiler import cycles
    from wse.host.compiler.replay import _OUT_OF_TIME, _edge_ports, _new_scalars, _new_state, _run
    from wse.host.compiler.replay_periods import _snapshot
    from wse.host.compiler.replay_region import RegionSearch
    config, plan, phase = planned_phase(args)
    ops, starts, ends = cycles.phase_ops(plan, phase)
    ops = np.ascontiguousarray(ops, dtype=np.int32)
    network = cycles.Network(config, plan.routes)
    routes, ports = network.routes(), _edge_ports(network, cycles.phase_injections(phase))
    queues, cores, events = _new_state(routes, ports, starts.astype(np.int64))
    scalars = _new_scalars(starts.astype(np.int64), ports, -1)
    colors = routes.input_port.shape[1]
    width, height = config.width, config.height
    for at in sorted(set(args.at)):
        hashes, pcs = [], []
        for t in range(at - 2 * args.longest, at + 1):
            if _run(routes, ports, ops, queues, cores, events, scalars, t, -1) != _OUT_OF_TIME:
                raise UsageError(f"--at {at}: the phase {args.phase!r} ends before it")
            hashes.append(RegionSearch._signature(_snapshot(queues, cores, events, ports, t, colors, scalars)))
            pcs.append(cores.pc.copy())
        best = cell_periods(np.array(hashes), np.array(pcs), args.longest).reshape(height, width)
        edges = np.linspace(0, height, min(args.bands, height) + 1).astype(int)
        for lo, hi in zip(edges[:-1], edges[1:]):
            found = Counter(int(d) for d in best[lo:hi].ravel())
            print(json.dumps({"mesh": f"{width}x{height}", "phase": args.phase, "cycle": at, "rows": [int(lo), int(hi)],
                              "periods": {str(d): n for d, n in sorted(found.items()) if d > 0},
                              "none": found.get(-1, 0)}), flush=True)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "cell_periods.py"))
