"""Simulation speed of the backends: fabric cycles per wall second of GEMV.

For each mesh (4x4 and 8x8 by default) the GEMV kernel runs on

* ``verilator``: the Verilator backend (C++ harness, ``--threads`` 1 and 2),
* ``cocotb-verilator``: the full RTL mesh under cocotb on Verilator,
* ``cocotb-icarus``: the same on Icarus (the ``icarus`` backend),
* ``golden``: the golden model,

and one JSON line per (mesh, backend) gives the fabric cycles simulated per
wall-clock second inside ``run`` (loading and copies over the host bus are not
counted; they are reported as ``host_cycles``), the ratio to cocotb on Icarus
on the same mesh, and whether the result was bit exact. Fast backends repeat
the kernel until ``--min-seconds`` of run time has passed.

Configuration: the default one with ``colors=4`` and ``tasks=8`` (GEMV uses
3 colors and 5 tasks). Every cycle the RTL evaluates every router FIFO and
arbitration step and every PE input queue and task slot, so these two fields
set most of the simulation cost; the kernel's cycles do not depend on them.
``--colors`` and ``--tasks`` change them.

Usage: python bench/sim_speed.py [--meshes 4x4,8x8] [--backends ...] [--rows 64 --cols 64]
                                 [--min-seconds 1] [--colors 4 --tasks 8]
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads must not compete with the harness

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from wse.config import FabricConfig, UsageError, parse_mesh  # noqa: E402
from wse.sim.runner import run_kernel  # noqa: E402

BACKENDS = ("verilator", "cocotb-verilator", "cocotb-icarus", "golden")
#: The Verilator backend's target on the 8x8 mesh.
TARGET_CYCLES_PER_S = 50_000


class _Timed:
    """Wraps a device: times its ``run`` calls."""

    def __init__(self, device):
        self.device = device
        self.run_seconds = 0.0
        self.run_cycles = 0
        self.runs = 0

    def run(self, max_cycles=None):
        start = time.perf_counter()
        cycles = self.device.run(max_cycles)
        self.run_seconds += time.perf_counter() - start
        self.run_cycles += cycles
        self.runs += 1
        return cycles

    def __getattr__(self, name):
        return getattr(self.device, name)


def _device(backend: str, config: FabricConfig, threads: int):
    if backend == "verilator":
        from wse.sim.cosim.verilator import VerilatorFabric
        return VerilatorFabric(config, threads=threads)
    if backend.startswith("cocotb-"):
        from wse.sim.cosim.icarus import CocotbProxyFabric
        return CocotbProxyFabric(config, sim=backend.split("-", 1)[1])
    from wse.sim.golden import Fabric
    return Fabric(config)


def measure(backend: str, config: FabricConfig, sizes: dict, min_seconds: float, threads: int = 1) -> dict:
    """Run GEMV on ``backend`` until ``min_seconds`` of run time (at least once)."""
    timed = _Timed(_device(backend, config, threads))
    exact = True
    try:
        while True:
            report = run_kernel("gemv", config, timed.runs, device=lambda cfg: timed, **sizes)
            exact &= report["bit_exact"]
            if timed.run_seconds >= min_seconds or backend.startswith("cocotb-"):
                break
        stats = timed.device.stats() if hasattr(timed.device, "stats") else {}
    finally:
        if hasattr(timed.device, "close"):
            timed.device.close()
    line = {"mesh": config.mesh, "backend": backend, "kernel": "gemv", "sizes": sizes,
            "colors": config.colors, "tasks": config.tasks, "runs": timed.runs,
            "cycles_per_run": timed.run_cycles // timed.runs, "run_seconds": round(timed.run_seconds, 4),
            "cycles_per_s": round(timed.run_cycles / timed.run_seconds) if timed.run_seconds else None,
            "bit_exact": exact}
    if backend == "verilator":
        line["threads"] = threads
    if "host_cycles" in stats:
        line["host_cycles"] = stats["host_cycles"]
    return line


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--meshes", default="4x4,8x8")
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--cols", type=int, default=64)
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--colors", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--threads", default="1,2", help="verilator backend: thread counts to measure")
    args = parser.parse_args(argv)
    try:
        backends = [b for b in args.backends.split(",") if b]
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise UsageError(f"--backends takes {', '.join(BACKENDS)}, not {unknown[0]!r}")
        meshes = [parse_mesh(m) for m in args.meshes.split(",") if m]
        base = FabricConfig(colors=args.colors, tasks=args.tasks)
    except UsageError as exc:
        parser.error(str(exc))
    sizes = {"rows": args.rows, "cols": args.cols}
    for width, height in meshes:
        config = base.with_mesh(width, height)
        lines = []
        for backend in backends:
            for threads in ([int(t) for t in args.threads.split(",")] if backend == "verilator" else [1]):
                lines.append(measure(backend, config, sizes, args.min_seconds, threads))
        icarus = next((line["cycles_per_s"] for line in lines if line["backend"] == "cocotb-icarus"), None)
        for line in lines:
            if icarus:
                line["ratio_to_icarus"] = round(line["cycles_per_s"] / icarus, 1)
            if line["backend"] == "verilator" and config.mesh == "8x8":
                line["target_cycles_per_s"] = TARGET_CYCLES_PER_S
            print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
