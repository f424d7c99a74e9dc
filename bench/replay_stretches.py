"""Where a phase's replay spends its time: CPU seconds and cycles replayed in full by cycle range.

Replays one phase of a weight-streaming MLP once, timing every stretch the
replay's engine runs (the cycles between two stops of the period search that it
replays in full; skips, jumps and region replays are not stretches), and prints
one JSON line per cycle range (``--bins``: a stretch counts in the range it
starts in) with the stretches' CPU seconds, cycles and ns a PE and cycle (what
the engine costs there), then one line for the whole replay: its CPU seconds,
cycles, the region replays' runs and what their tries cost. Comparing the lines of a few widths shows which part of a phase
grows with the mesh (``docs/weight_streaming.md`` section 9, "The shared GEMM
across the wafer's columns"):

    .venv/bin/python bench/replay_stretches.py --mesh 128 994 --batch 1024       # about 3 minutes
    .venv/bin/python bench/replay_stretches.py --mesh 750 994 --batch 6000       # the wafer: about 20 minutes
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    from compile_speed import phase_arguments, planned_phase
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    phase_arguments(parser, (128, 994), 1024, None)
    parser.add_argument("--bins", nargs="+", type=int, default=[10_000, 50_000, 210_000],
                        help="the cycles where the ranges after the first begin")
    args = parser.parse_args(argv)
    from wse.host.compiler import cycles, replay, replay_adaptive, replay_region
    from wse.host.compiler.replay import _T
    config, the_plan, phase = planned_phase(args)
    ops, starts, ends = cycles.phase_ops(the_plan, phase)
    network = cycles.Network(config, the_plan.routes)
    edges = [0, *sorted(args.bins)]
    spent, replayed = [0.0] * len(edges), [0] * len(edges)
    searches = []

    class Kept(replay_region.RegionSearch):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            searches.append(self)

    stretch = replay_adaptive.AdaptiveRun.__call__

    def timed(self, routes, ports, ops_, queues, cores, events, scalars, limit, watch):
        first, began = int(scalars[_T]), time.thread_time()
        status = stretch(self, routes, ports, ops_, queues, cores, events, scalars, limit, watch)
        at = bisect.bisect_right(edges, first) - 1
        spent[at] += time.thread_time() - began
        replayed[at] += int(scalars[_T]) - first
        return status

    saved = replay_adaptive.AdaptiveRun.__call__, replay_region.RegionSearch
    replay_adaptive.AdaptiveRun.__call__, replay_region.RegionSearch = timed, Kept
    try:
        began = time.process_time()
        count, _ = replay.run_replay(network, ops, starts, ends, cycles.phase_injections(phase), engine="adaptive")
        cpu = time.process_time() - began
    finally:
        replay_adaptive.AdaptiveRun.__call__, replay_region.RegionSearch = saved
    mesh, cells = f"{config.width}x{config.height}", config.width * config.height
    for i, edge in enumerate(edges):
        print(json.dumps({"mesh": mesh, "phase": args.phase, "from": edge,
                          "to": edges[i + 1] if i + 1 < len(edges) else None,
                          "stretch_cpu_s": round(spent[i], 1), "cycles_replayed_in_full": replayed[i],
                          "ns_per_pe_cycle": round(1e9 * spent[i] / (replayed[i] * cells), 1) if replayed[i] else None}),
              flush=True)
    tries = searches[0].rates if searches else [0.0, 0.0, 0.0, 0.0]
    print(json.dumps({"mesh": mesh, "phase": args.phase, "cycles": int(count), "cpu_s": round(cpu, 1),
                      "region_runs": [list(r) for r in (searches[0].runs if searches else [])],
                      "region_tries_cpu_s": round(float(tries[0]), 1), "region_tries_cycles": int(tries[1])}),
          flush=True)
    return 0


if __name__ == "__main__":
    from wse.cli import run
    raise SystemExit(run(main, "replay_stretches.py"))
