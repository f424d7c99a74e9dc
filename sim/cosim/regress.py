"""The co-simulation regression (``make sim``).

Command line::

    python -m wse.sim.cosim.regress [--sim verilator|icarus] [--mesh WxH] [--waves]
                                    [--only router,pe,mesh,faults,backend] [--wavelets N]
                                    [--programs N] [--size N] [--seed S]
                                    [--memory-check auto|on|off] [--out DIR]

Suites:

============  ==============================================================
``router``    :mod:`wse.sim.cocotb_tb.router_tb` on one router: random
              multicast traffic and backpressure (``--wavelets``, default
              100,000), and the checker's failure test
``pe``        :mod:`wse.sim.cocotb_tb.pe_tb` on a 1x1 mesh: directed programs
              and ``--programs`` random ones in lockstep with the golden model
``mesh``      :mod:`wse.sim.cocotb_tb.mesh_tb` on ``--mesh``: every library
              kernel in lockstep, and the checker's failure test
``faults``    :mod:`wse.sim.cocotb_tb.fault_tb` on ``--mesh``: random single
              flips in PE memory and on links during kernels, ECC counters
              compared in lockstep, and a double flip (memory, link)
              stopping both runs alike
``backend``   the ``verilator`` backend (C++ harness) on ``--mesh``: every
              library kernel in lockstep with the golden model
============  ==============================================================

The cocotb suites run on ``--sim``; with ``--waves`` each writes an FST
waveform (its path is printed). The run ends with a table: test, status,
simulated clock cycles (run and host-bus cycles together), wall time. Exit
status 0 when every test passes, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from wse.config import FabricConfig, UsageError, parse_mesh

from .build import SIMULATORS, Heartbeat, build_root, cocotb_build
from .cocotb_device import CLOCK_NS
from .programs import COSIM_CONFIG

__all__ = ["SUITES", "Row", "run_suite", "parse_results", "format_table", "main"]

SUITES = ("router", "pe", "mesh", "faults", "backend")
_MODULES = {"router": "wse.sim.cocotb_tb.router_tb", "pe": "wse.sim.cocotb_tb.pe_tb",
            "mesh": "wse.sim.cocotb_tb.mesh_tb", "faults": "wse.sim.cocotb_tb.fault_tb"}

Row = tuple[str, str, int, float]  # test, status, simulated cycles, wall seconds


def parse_results(path) -> list[Row]:
    """The rows of a cocotb results file (xUnit XML): one per test."""
    rows = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        status = "FAIL" if case.find("failure") is not None or case.find("error") is not None else \
            "SKIP" if case.find("skipped") is not None else "PASS"
        cycles = int(round(float(props.get("sim_time_duration", 0)) / CLOCK_NS))
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
        rows.append((name, status, cycles, float(case.get("time", 0))))
    return rows


def format_table(rows: list[Row]) -> str:
    """The summary table of ``rows`` with a total line."""
    head = ("test", "status", "simulated cycles", "wall time (s)")
    body = [(name, status, f"{cycles:,}", f"{seconds:.2f}") for name, status, cycles, seconds in rows]
    passed = sum(1 for row in rows if row[1] == "PASS")
    total = (f"TOTAL ({passed}/{len(rows)} passed)", "PASS" if passed == len(rows) and rows else "FAIL",
             f"{sum(r[2] for r in rows):,}", f"{sum(r[3] for r in rows):.2f}")
    widths = [max(len(str(line[k])) for line in [head, *body, total]) for k in range(4)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "| " + " | ".join(str(c).ljust(w) if k < 2 else str(c).rjust(w)
                                 for k, (c, w) in enumerate(zip(cells, widths))) + " |"

    return "\n".join([rule, line(head), rule, *map(line, body), rule, line(total), rule])


def _suite_config(suite: str, mesh: FabricConfig) -> FabricConfig:
    return mesh if suite in ("mesh", "faults", "backend") else COSIM_CONFIG.with_mesh(1, 1)


def run_suite(suite: str, sim: str, config: FabricConfig, out: Path, *, waves: bool = False,
              params: dict | None = None, testcase=None) -> list[Row]:
    """Run one suite; returns its rows. ``params`` are the testbench's
    ``WSE_COSIM_*`` parameters (``{"WAVELETS": 1000}``); ``testcase`` names
    the tests to run (default all)."""
    if suite == "backend":
        return _backend_rows(config, params or {})
    design = "router" if suite == "router" else "mesh"
    build = cocotb_build(sim, config, design, waves=waves)
    env = {"WSE_COSIM_CONFIG": json.dumps(config.to_dict())}
    env.update({f"WSE_COSIM_{key}": str(value) for key, value in (params or {}).items()})
    folder = out / suite
    try:
        with Heartbeat(f"   running the {suite} testbench on {sim} (log: {folder / 'sim.log'})"):
            results = build.test(_MODULES[suite], folder, extra_env=env, testcase=testcase)
    except SystemExit:
        results = folder / "results.xml"
    if not Path(results).exists():
        return [(f"{suite} (simulator failed, see {folder / 'sim.log'})", "FAIL", 0, 0.0)]
    return parse_results(results)


def _backend_rows(config: FabricConfig, params: dict) -> list[Row]:
    from wse.firmware.kernels import KERNELS
    from wse.sim.devices import make_device
    from wse.sim.golden import Fabric
    from wse.sim.runner import run_kernel

    from .lockstep import Lockstep

    rows = []
    size = int(params.get("SIZE", 24))
    for name, kernel in KERNELS.items():
        for variant in kernel.variants or (None,):
            sizes = {"rows": size, "cols": size} if "rows" in kernel.defaults else {"n": size}
            if variant:
                sizes["variant"] = variant
            label = f"backend.{name}" + (f"_{variant}" if variant else "")
            devices = []

            def device(cfg):
                devices.append(make_device("verilator", cfg))
                return Lockstep(Fabric(cfg, trace=True), devices[-1], check_emits=True)

            start = time.perf_counter()
            try:
                report = run_kernel(name, config, int(params.get("SEED", 0)), device=device, **sizes)
                status = "PASS" if report["bit_exact"] else "FAIL"
            except AssertionError as exc:
                print(f"{label}: {exc}", file=sys.stderr)
                status = "FAIL"
            stats = devices[0].stats() if devices else {}
            rows.append((label, status, stats.get("run_cycles", 0) + stats.get("host_cycles", 0),
                         time.perf_counter() - start))
    return rows


def main(argv=None) -> int:
    """Entry point of ``python -m wse.sim.cosim.regress``; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m wse.sim.cosim.regress", description=__doc__.split("\n")[0])
    parser.add_argument("--sim", default="verilator", help=f"cocotb simulator: {', '.join(SIMULATORS)}")
    parser.add_argument("--mesh", default="2x2", help="mesh of the mesh and backend suites (default 2x2)")
    parser.add_argument("--waves", action="store_true", help="write FST waveforms")
    parser.add_argument("--only", default=",".join(SUITES), help=f"suites to run (default all: {','.join(SUITES)})")
    parser.add_argument("--wavelets", type=int, default=100_000, help="router suite: wavelets to inject")
    parser.add_argument("--programs", type=int, default=8, help="pe suite: random programs")
    parser.add_argument("--size", type=int, default=24, help="mesh and backend suites: problem size")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random traffic and programs")
    parser.add_argument("--memory-check", choices=("auto", "on", "off"), default="auto",
                        help="mesh suite: compare every memory word after each kernel (auto: on for "
                             "verilator, off for icarus on meshes over 4 tiles)")
    parser.add_argument("--out", default=None, help="run folder (default build/cosim/regress/SIM-MESH)")
    args = parser.parse_args(argv)
    try:
        if args.sim not in SIMULATORS:
            raise UsageError(f"--sim must be one of {', '.join(SIMULATORS)}, not {args.sim!r}")
        width, height = parse_mesh(args.mesh)
        suites = [s for s in args.only.split(",") if s]
        unknown = [s for s in suites if s not in SUITES]
        if unknown or not suites:
            raise UsageError(f"--only takes suites from {', '.join(SUITES)}, not {args.only!r}")
        mesh = COSIM_CONFIG.with_mesh(width, height)
        out = Path(args.out) if args.out else build_root() / "regress" / f"{args.sim}-{mesh.mesh}"
        params = {"router": {"WAVELETS": args.wavelets, "SEED": args.seed},
                  "pe": {"PROGRAMS": args.programs, "SEED": args.seed},
                  "mesh": {"SIZE": args.size, "SEED": args.seed,
                           "MEMORY": int(args.memory_check == "on" or (args.memory_check == "auto" and (
                               args.sim == "verilator" or mesh.num_pes <= 4)))},
                  "faults": {"SIZE": args.size, "SEED": args.seed},
                  "backend": {"SIZE": args.size, "SEED": args.seed}}
    except UsageError as exc:
        print(f"{parser.prog}: {exc}", file=sys.stderr)
        return 2
    rows: list[Row] = []
    started = time.perf_counter()
    for suite in suites:
        print(f"== {suite} ({args.sim if suite != 'backend' else 'verilator backend'}, "
              f"{_suite_config(suite, mesh).mesh})", flush=True)
        suite_start = time.perf_counter()
        got = run_suite(suite, args.sim, _suite_config(suite, mesh), out, waves=args.waves, params=params[suite])
        rows += got
        print(f"   {sum(r[1] == 'PASS' for r in got)}/{len(got)} passed in {time.perf_counter() - suite_start:.1f} s"
              f" (builds included)", flush=True)
    if args.waves:
        for wave in sorted(out.rglob("*.fst")) + sorted(build_root().glob(f"cocotb-{args.sim}/*/*.fst")):
            print(f"waveform: {wave}")
    print(format_table(rows))
    print(f"regression: {args.sim}, mesh {mesh.mesh}, {time.perf_counter() - started:.1f} s in all; logs in {out}")
    return 0 if rows and all(row[1] == "PASS" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
