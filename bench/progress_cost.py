"""What the golden model's progress hook costs: the same GEMV with ``Fabric.progress`` off and on.

``Fabric.run`` calls ``Fabric.progress`` every ``progress_every`` cycles
when it is set; the test shares the cycle-limit check, so the hook should
cost nothing measurable when off and next to nothing when on. The kinds run
interleaved in one process (``--repeat`` rounds), each timed by the CPU time
of its ``Fabric.run`` calls (less disturbed than wall time on a shared
machine). Prints one JSON line: the best and the median CPU seconds of each
kind and the ratios ``on_vs_off`` and, with ``--baseline DIR`` (a folder
holding a copy of an older ``sim/golden``, e.g. from ``git show``),
``off_vs_baseline`` (above 1.0: the current model is slower).

Usage: python bench/progress_cost.py [--mesh 16x16] [--size 512] [--repeat 7] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from wse.config import FabricConfig, parse_mesh
from wse.sim.golden import Fabric
from wse.sim.runner import run_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trace_cost import load_baseline  # noqa: E402  (the benches' one loader of an older model)


def cpu_timed(base, progress: bool):
    """A subclass of the fabric class ``base`` that adds up the CPU seconds of its runs;
    ``progress``: with a (silent) progress callback set."""

    class Timed(base):
        seconds = 0.0

        def run(self, max_cycles=None):
            if progress:
                self.progress = lambda t: None
            start = time.thread_time()
            try:
                return super().run(max_cycles)
            finally:
                Timed.seconds += time.thread_time() - start

    return Timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="16x16")
    parser.add_argument("--size", type=int, default=512, help="GEMV size N (an N x N matrix)")
    parser.add_argument("--repeat", type=int, default=7, help="interleaved rounds; best and median count")
    parser.add_argument("--baseline", help="a folder holding a copy of an older sim/golden to compare with")
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    config = FabricConfig(width=width, height=height)
    kinds = {"off": (Fabric, False), "on": (Fabric, True)}
    if args.baseline:
        kinds["baseline"] = (load_baseline(args.baseline), False)
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    cycles = {}
    for _ in range(args.repeat):
        for kind, (base, progress) in kinds.items():
            cls = cpu_timed(base, progress)
            report = run_kernel("gemv", config, seed=0, device=lambda c: cls(c), rows=args.size, cols=args.size)
            samples[kind].append(cls.seconds)
            cycles[kind] = report["cycles"]
    if len(set(cycles.values())) != 1:
        raise SystemExit(f"the kinds counted different cycles: {cycles}")
    best = {k: min(v) for k, v in samples.items()}
    median = {k: sorted(v)[len(v) // 2] for k, v in samples.items()}
    line = {"bench": "progress_cost", "kernel": "gemv", "mesh": config.mesh, "rows": args.size,
            "cycles": cycles["off"], "cpu_s_best": {k: round(v, 4) for k, v in best.items()},
            "cpu_s_median": {k: round(v, 4) for k, v in median.items()},
            "on_vs_off": round(best["on"] / best["off"], 3)}
    if "baseline" in best:
        line["off_vs_baseline"] = round(best["off"] / best["baseline"], 3)
        line["off_vs_baseline_median"] = round(median["off"] / median["baseline"], 3)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
