"""The region replay at work: one JSON line per phase and a PNG of the PEs it steps.

Replays one phase of a weight-streaming MLP twice in the same process, with the
region replay (``wse.host.compiler.replay_region``) and without it, and prints the
CPU seconds of each (``speedup``: without over with), whether the counts and every
PE's last cycle agree, and what the region replays did: the cycles they stepped,
the PEs stepped a cycle on average and at most, the deviant PEs (those whose state
or next cycle may differ from the record's) on average, against the mesh's PEs.
With ``--png`` it draws, cycle by cycle, the stepped and the deviant PEs of every
region replay over the phase (the full replay steps every PE every cycle it
replays): the fill of a streamed GEMM is a band of a few hundred PEs that follows
the disturbance across the last row.

    .venv/bin/python bench/region_replay.py --png region_replay.png            # 128x128, the shared GEMM
    .venv/bin/python bench/region_replay.py --mesh 64 64 --sizes 2048 2048 2048 10 --batch 512 --any-mesh

``--any-mesh`` lets the region replay try meshes under its size rule
(``replay_region.MIN_CELLS``); ``--margin 2`` steps two hops around the deviant PEs
instead of one (``replay_region.MARGIN``; ``spilled`` counts the PEs that joined the
stepped ones by a spill).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _replay(network, inputs, region: bool, trace_rows: int):
    """``((cycles, last cycles), CPU seconds, the RegionSearch made or None)``."""
    from wse.host.compiler import replay, replay_region
    made = []

    class Traced(replay_region.RegionSearch):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.trace = np.zeros((trace_rows, 3), np.int64)
            made.append(self)

    saved = replay_region.REGION, replay_region.RegionSearch
    replay_region.REGION, replay_region.RegionSearch = region, Traced
    try:
        began = time.process_time()
        result = replay.run_replay(network, *inputs)
        return result, time.process_time() - began, (made[0] if made else None)
    finally:
        replay_region.REGION, replay_region.RegionSearch = saved


def _picture(path: str, trace: np.ndarray, cells: int, title: str) -> None:
    from compile_speed import figure
    with figure(path, (9, 4)) as (_, ax):
        ax.plot(trace[:, 0], trace[:, 1], lw=0.6, label="PEs stepped (one hop around the deviant ones)")
        ax.plot(trace[:, 0], trace[:, 2], lw=0.6, label="deviant PEs")
        ax.axhline(cells, color="grey", ls="--", lw=0.8, label=f"the mesh: {cells:,} PEs (the full replay)")
        ax.set_yscale("log")
        ax.set_xlabel("cycle")
        ax.set_ylabel("PEs a cycle")
        ax.set_title(title)
        ax.legend(loc="center right", fontsize=8)


def main(argv=None) -> int:
    from compile_speed import phase_arguments, planned_phase
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phase_arguments(parser, (128, 128), 1024, "draw the stepped PEs a cycle into this PNG file")
    parser.add_argument("--any-mesh", action="store_true", help="try meshes under the region replay's size rule")
    parser.add_argument("--margin", type=int, choices=(1, 2), default=None,
                        help="hops around the deviant PEs stepped (default: replay_region.MARGIN)")
    args = parser.parse_args(argv)
    from wse.host.compiler import cycles, replay_region
    config, the_plan, phase = planned_phase(args)
    if args.any_mesh:
        replay_region.MIN_CELLS = 1
    if args.margin is not None:
        replay_region.MARGIN = args.margin
    ops, starts, ends = cycles.phase_ops(the_plan, phase)
    inputs = (cycles.closing_cycles(ops, starts, ends)[0], starts, ends, cycles.phase_injections(phase))
    network = cycles.Network(config, the_plan.routes)
    cells = config.width * config.height
    _replay(network, inputs, True, 1)                  # load the compiled loops before anything is timed
    (count, exits), cpu, search = _replay(network, inputs, True, 1 << 20)
    (count_off, exits_off), cpu_off, _ = _replay(network, inputs, False, 0)
    stats = search.stats if search is not None else np.zeros(5, np.int64)
    rows = search.trace[:int(stats[3])] if search is not None else np.zeros((0, 3), np.int64)
    record = {"mesh": f"{config.width}x{config.height}", "sizes": args.sizes, "batch": args.batch,
              "phase": args.phase, "cycles": int(count), "pes": cells, "cpu_s": round(cpu, 3),
              "without_regions_cpu_s": round(cpu_off, 3), "speedup": round(cpu_off / max(cpu, 1e-9), 2),
              "same_cycles_and_exits": bool(count == count_off and np.array_equal(exits, exits_off)),
              "region_runs": [list(r) for r in (search.runs if search is not None else [])],
              "region_cycles": int(stats[0]),
              "stepped_mean": round(float(stats[1]) / max(int(stats[0]), 1), 1),
              "stepped_max": int(rows[:, 1].max()) if rows.shape[0] else 0,
              "deviant_mean": round(float(stats[2]) / max(int(stats[0]), 1), 1),
              "margin": replay_region.MARGIN, "spilled": int(stats[4])}
    if args.png and rows.shape[0]:
        _picture(args.png, rows, cells, f"region replay, {record['mesh']}, {args.phase} "
                                        f"({record['region_cycles']:,} cycles stepped as a region)")
        record["png"] = args.png
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "region_replay.py"))
