"""What a Perfetto timeline costs: the same golden-model GEMV run untraced and traced.

For each size, the fastest of ``--repeat`` runs of each kind, timing only
``Fabric.run`` (and, for the traced run, writing the trace file). Prints one
JSON line per size with ``trace_cost``: (traced run + writing the trace) /
untraced run; the target is at most 2.0. A last line gives the worst ratio.

``--baseline DIR`` also times the untraced run on another copy of the golden
model (a folder holding a copy of ``sim/golden`` from an older tree) in this
same process, and prints ``untraced_vs_baseline`` (above 1.0: the current
model is slower): recording must not slow down the untraced model.

Usage: python bench/trace_cost.py [--mesh 16x16] [--sizes 128,256] [--repeat 3] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

from wse.config import FabricConfig, parse_mesh
from wse.sim.golden import Fabric
from wse.sim.golden.perfetto import write_trace
from wse.sim.runner import run_kernel

TARGET = 2.0


def load_baseline(folder: str):
    """The ``Fabric`` class of a copy of the golden model package in ``folder``."""
    init = Path(folder) / "__init__.py"
    if not init.is_file():
        raise SystemExit(f"--baseline {folder}: expected a copy of sim/golden (with __init__.py) there")
    spec = importlib.util.spec_from_file_location("golden_baseline", init, submodule_search_locations=[folder])
    module = importlib.util.module_from_spec(spec)
    sys.modules["golden_baseline"] = module
    spec.loader.exec_module(module)
    return module.Fabric


def timed(base):
    """A subclass of the fabric class ``base`` that adds up the seconds of its runs."""

    class Timed(base):
        seconds = 0.0
        last = None

        def __init__(self, config, record=False):
            super().__init__(config)
            Timed.last = self
            if record:
                self.record()

        def run(self, max_cycles=None):
            start = time.perf_counter()
            try:
                return super().run(max_cycles)
            finally:
                Timed.seconds += time.perf_counter() - start

    return Timed


def best_of(repeat: int, config, n: int, base, record: bool, trace_to: Path | None) -> tuple[float, dict]:
    """The fastest of ``repeat`` runs: (seconds, report)."""
    cls = timed(base)
    best = None
    for _ in range(repeat):
        cls.seconds = 0.0
        report = run_kernel("gemv", config, seed=0, device=lambda c: cls(c, record), rows=n, cols=n)
        if not report["bit_exact"]:
            raise SystemExit(f"gemv {n}x{n} was not bit exact")
        seconds = cls.seconds
        if trace_to is not None:
            start = time.perf_counter()
            write_trace(cls.last.recorder, trace_to)
            seconds += time.perf_counter() - start
        if best is None or seconds < best[0]:
            best = (seconds, report)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="16x16")
    parser.add_argument("--sizes", default="128,256", help="GEMV sizes N (an N x N matrix), comma separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size and kind; the fastest counts")
    parser.add_argument("--baseline", help="a folder holding a copy of an older sim/golden to compare with")
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    config = FabricConfig(width=width, height=height)
    baseline = load_baseline(args.baseline) if args.baseline else None
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        for n in (int(s) for s in args.sizes.split(",")):
            plain, report = best_of(args.repeat, config, n, Fabric, False, None)
            traced, traced_report = best_of(args.repeat, config, n, Fabric, True, trace)
            if traced_report["cycles"] != report["cycles"]:
                raise SystemExit("tracing changed the cycle count")
            line = {"bench": "trace_cost", "kernel": "gemv", "mesh": config.mesh, "rows": n, "cols": n,
                    "cycles": report["cycles"], "untraced_s": round(plain, 4), "traced_s": round(traced, 4),
                    "trace_bytes": trace.stat().st_size, "trace_cost": round(traced / plain, 3)}
            if baseline is not None:
                base_s, base_report = best_of(args.repeat, config, n, baseline, False, None)
                if base_report["cycles"] != report["cycles"]:
                    raise SystemExit("the baseline model counts other cycles")
                line.update(baseline_s=round(base_s, 4), untraced_vs_baseline=round(plain / base_s, 3))
            worst = max(worst, traced / plain)
            print(json.dumps(line), flush=True)
    print(json.dumps({"bench": "trace_cost", "summary": True, "mesh": config.mesh,
                      "worst_trace_cost": round(worst, 3), "target": TARGET, "met": worst <= TARGET}))


if __name__ == "__main__":
    main()
