"""Golden-model speed: the GEMV kernel on a 16x16 mesh.

Prints JSON lines, one per GEMV size, then a summary line last with the
simulated PE-cycles per wall-clock second and the mesh size. Only the time
inside ``Fabric.run`` is counted (not assembling, routing or memcpy). To make
figures comparable across noisy machines, each line also gives the ratio to a
pure-Python calibration loop timed in the same process, and the ratio to the
target of 250,000 PE-cycles/s.

Usage: python bench/golden_speed.py [--mesh 16x16] [--sizes 256,512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import time

from wse.config import FabricConfig, parse_mesh
from wse.sim.golden import Fabric
from wse.sim.runner import run_kernel

TARGET_PE_CYCLES_PER_S = 250_000


class TimedFabric(Fabric):
    """The golden fabric, timing its ``run`` calls."""

    run_seconds = 0.0

    def run(self, max_cycles=None):
        start = time.perf_counter()
        try:
            return super().run(max_cycles)
        finally:
            TimedFabric.run_seconds += time.perf_counter() - start


def python_ops_per_second(n: int = 2_000_000) -> float:
    """A calibration loop: simple Python operations per second on this machine now."""
    start = time.perf_counter()
    acc = 0
    for i in range(n):
        acc += i & 7
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mesh", default="16x16")
    parser.add_argument("--sizes", default="256,512", help="GEMV sizes N (an N x N matrix), comma separated")
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the fastest is reported")
    args = parser.parse_args()
    width, height = parse_mesh(args.mesh)
    config = FabricConfig(width=width, height=height)
    calibration = python_ops_per_second()
    best_rate = 0.0
    for n in (int(s) for s in args.sizes.split(",")):
        best = None
        for _ in range(args.repeat):
            TimedFabric.run_seconds = 0.0
            report = run_kernel("gemv", config, seed=0, device=TimedFabric, rows=n, cols=n)
            if not report["bit_exact"]:
                raise SystemExit(f"gemv {n}x{n} was not bit exact")
            if best is None or TimedFabric.run_seconds < best[0]:
                best = (TimedFabric.run_seconds, report)
        seconds, report = best
        pe_cycles = report["cycles"] * config.num_pes
        rate = pe_cycles / seconds
        best_rate = max(best_rate, rate)
        print(json.dumps({
            "bench": "golden_speed", "kernel": "gemv", "mesh": config.mesh, "rows": n, "cols": n,
            "cycles": report["cycles"], "fmac_utilization": round(report["fmac_utilization"], 4),
            "run_seconds": round(seconds, 4), "fabric_cycles_per_s": round(report["cycles"] / seconds, 1),
            "pe_cycles_per_s": round(rate), "per_python_op": round(rate / calibration, 5),
            "vs_target": round(rate / TARGET_PE_CYCLES_PER_S, 3),
        }))
    print(json.dumps({
        "bench": "golden_speed", "summary": True, "mesh": config.mesh, "pes": config.num_pes,
        "pe_cycles_per_s": round(best_rate), "target_pe_cycles_per_s": TARGET_PE_CYCLES_PER_S,
        "vs_target": round(best_rate / TARGET_PE_CYCLES_PER_S, 3),
        "python_ops_per_s": round(calibration),
    }))


if __name__ == "__main__":
    main()
