"""The kernel runner: a library kernel on a device, checked bit for bit; ``wse kernel``.

The kernels (:mod:`wse.firmware.kernels`) say what to compute and how to
drive a device; this module picks the device (by name from
:mod:`wse.sim.devices`, or any factory), runs the kernel on random data and
compares the result with the kernel's reference. It sits above the devices,
which is why it is not in ``firmware/``.

Command line::

    wse kernel --list
    wse kernel NAME [--mesh WxH] [--seed S] [--rows R --cols C] [--n N]
                    [--variant row|column|random|power] [--sparsity S] [--sram-words K] [--backend B] [--json]
                    [--trace FILE.json] [--trace-region X,Y,W,H] [--trace-queue X,Y ...]
                    [--pictures DIR] [--inject SPEC ...] [--defects SPEC]

``--trace`` writes a Perfetto timeline of the run (golden model) and
``--pictures`` its heatmaps (``docs/pictures.md``). ``--inject`` flips
stored bits of PE memory words once the kernel's data is loaded, before its
first run (``docs/faults.md``): ``sram:X,Y,ADDR,BIT[,BIT...]`` flips code-word
bits (0..31 data, 32..38 check bits) of one word (``sram@CYCLE:...`` arms
the flip for the first cycle of the run at or after ``CYCLE`` in which the PE
runs no task and starts none), ``random:N,SEED`` one random
bit in each of ``N`` random non-zero words (the program and its data),
``dead:X,Y`` kills a PE and ``dead:X,Y,PORT`` the link leaving router
``(X, Y)`` through ``PORT`` (golden model and RTL backends), and
``link:X,Y,PORT,CYCLE,BIT[,BIT]`` arms a flip of one or two link code-word
bits (0..37 the wavelet, 38..44 its check bits) in the first wavelet that
crosses the link leaving router ``(X, Y)`` through ``PORT`` in run cycle
``CYCLE`` or later; the report then has the memory ECC counters (``ecc``)
and the link ECC counters (``link_ecc``, per link). ``--defects SPEC`` runs the kernel on the
usable logical mesh that the dead parts of the ``--mesh`` leave
(:mod:`wse.sim.defects`, ``docs/faults.md`` section 4): ``random:FRACTION,SEED``,
``X,Y[,PORT][;...]`` or a file of such lines; the summary names the defects
and the usable mesh, and the kernel's sizes default for that mesh.

Prints a short summary, or with ``--json`` the report of :func:`run_kernel`
as one JSON object. On a device other than ``golden`` (``verilator``,
``icarus``) the report also has ``golden_cycles``, the golden model's cycles
for the same run, on meshes of at most :data:`GOLDEN_CHECK_PES` PEs (the golden
model would take hours on a wafer-sized one). Exit code 0 when the result is bit exact, 1 when it is not,
2 for a mistake in the arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Callable

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, UsageError, parse_mesh
from wse.firmware.kernels import KERNELS, Kernel, get_kernel

from .api import Device
from .defects import DefectDevice, defect_factory, parse_defects, plan_remap
from .devices import device_names, make_device

__all__ = ["run_kernel", "run", "main", "GOLDEN_CHECK_PES"]

#: The largest mesh (in PEs) on which ``wse kernel`` reruns a kernel on the golden model for ``golden_cycles``.
GOLDEN_CHECK_PES = 64 * 64


def run(kernel: Kernel, config: FabricConfig, seed: int = 0, backend: str = "golden",
        device: Callable[[FabricConfig], Device] | None = None, look: dict | None = None,
        inject: list | None = None, **sizes) -> dict:
    """Run ``kernel`` on random data and check it; see :func:`run_kernel` for
    the arguments and the report's fields."""
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise UsageError(f"seed must be a non-negative integer, not {seed!r}")
    sizes = kernel.resolve(config, sizes)
    plan = kernel.plan(config, sizes)
    inputs = kernel.inputs(plan, np.random.default_rng(int(seed)))
    expected, exact = kernel.reference(plan, inputs)
    fabric = device(config) if device is not None else make_device(backend, config)
    if inject:
        fabric = _Injecting(fabric, inject)
    recorder = _start_recording(fabric, look) if look else None
    start = time.perf_counter()
    got, cycles = kernel.execute(fabric, plan, inputs)
    seconds = time.perf_counter() - start
    pictures = _write_pictures(recorder, look, f"{kernel.name} {kernel.describe(sizes)}") if recorder else {}
    got = np.asarray(got, dtype=np.uint32)
    if got.shape != expected.shape:
        raise RuntimeError(f"{kernel.name} returned shape {got.shape}, expected {expected.shape}")
    values = fp.as_float(got).astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = float(np.max(np.abs(values - exact))) if values.size else 0.0
    fmac = np.asarray(fabric.counters()["pe"]["fmac"], dtype=np.float64)
    flops = np.asarray(fabric.counters()["pe"]["flops"], dtype=np.float64)
    per_pe = fmac / cycles if cycles else np.zeros_like(fmac)
    return {
        "kernel": kernel.name,
        "mesh": config.mesh,
        "backend": getattr(fabric, "backend", backend),
        "sizes": sizes,
        "seed": int(seed),
        "bit_exact": bool(np.array_equal(got, expected)),
        "mismatches": int(np.count_nonzero(got != expected)),
        "words": int(expected.size),
        "max_abs_err_vs_float64": err,
        "cycles": int(cycles),
        "fmac_elements": int(fmac.sum()),
        "fmac_utilization": float(per_pe.mean()) if per_pe.size else 0.0,
        "fpu_elements": int(flops.sum()),
        "fpu_utilization": float(flops.sum() / (flops.size * cycles)) if cycles and flops.size else 0.0,
        "utilization": [[round(float(u), 6) for u in row] for row in per_pe],
        "seconds": round(seconds, 3),
        **pictures,
        **({"ecc": {k: v.tolist() for k, v in fabric.ecc_counters().items()}} if inject else {}),
        **({"link_ecc": _link_counts(fabric)} if inject and any(s[0] == "link" for s in inject) else {}),
    }


def _link_counts(fabric) -> dict:
    """The link ECC counters of a run: ``{"corrected" | "detected": {"X,Y,PORT": n}}`` for the links that count."""
    out = {}
    for name, grid in fabric.link_ecc_counters().items():
        out[name] = {f"{x},{y},{'NESW'[p]}": int(grid[y, x, p]) for y, x, p in np.argwhere(np.asarray(grid) > 0)}
    return out


def parse_inject(spec: str) -> tuple:
    """One ``--inject`` spec: ``("sram", x, y, addr, bits)``, ``("random", n,
    seed)``, ``("dead", x, y[, port])`` or ``("link", x, y, port, cycle, bits)``."""
    kind, _, rest = spec.partition(":")
    try:
        values = [int(v) for v in rest.split(",")]
    except ValueError:
        values = []
    if kind == "sram" and len(values) >= 4 and min(values) >= 0:
        return ("sram", *values[:3], values[3:])
    at = kind[5:] if kind.startswith("sram@") else ""
    if at.isdigit() and len(values) >= 4 and min(values) >= 0:
        return ("sram", *values[:3], values[3:], int(at))
    if kind == "random" and len(values) == 2 and values[0] > 0 and values[1] >= 0:
        return ("random", *values)
    parts = rest.split(",")
    if kind == "dead" and len(parts) in (2, 3) and all(p.isdigit() for p in parts[:2]):
        return ("dead", int(parts[0]), int(parts[1]), *parts[2:])
    if kind == "link" and len(parts) in (5, 6) and parts[2].upper() in ("N", "E", "S", "W") \
            and all(p.isdigit() for p in parts[:2] + parts[3:]):
        return ("link", int(parts[0]), int(parts[1]), parts[2].upper(), int(parts[3]), [int(b) for b in parts[4:]])
    raise UsageError(f"--inject must be sram[@CYCLE]:X,Y,ADDR,BIT[,BIT...], random:N,SEED (non-negative integers, "
                     f"N > 0), dead:X,Y[,N|E|S|W] or link:X,Y,N|E|S|W,CYCLE,BIT[,BIT], not {spec!r}")


class _Injecting:
    """A device that applies memory fault injections (:func:`parse_inject`
    specs) just before its first run: after the kernel's program and data
    are loaded. Every other call goes to the device."""

    def __init__(self, device, specs: list):
        if not hasattr(device, "inject") or not hasattr(device, "ecc_counters"):
            raise UsageError(f"--inject needs a device with fault injection (golden, verilator, icarus), not "
                             f"{getattr(device, 'backend', '?')}")
        self._device, self._specs, self.injected = device, list(specs), []

    def __getattr__(self, name):
        return getattr(self._device, name)

    def run(self, max_cycles=None):
        """Inject (the first time), then run the device."""
        specs, self._specs = self._specs, []
        dev = self._device
        for spec in specs:
            if spec[0] == "sram":
                dev.inject(*spec[1:])
                self.injected.append(spec[1:])
                continue
            if spec[0] == "link":
                if not hasattr(dev, "inject_link"):
                    behind = " behind --defects" if isinstance(dev, DefectDevice) else ""
                    raise UsageError(f"--inject link:... needs a device with link ECC (golden, verilator, icarus) "
                                     f"on its own mesh, not {getattr(dev, 'backend', '?')}{behind}")
                x, y, port, cycle, bits = spec[1:]
                dev.inject_link(x, y, port, bits, cycle)
                continue
            if spec[0] == "dead":
                if not hasattr(dev, "kill"):
                    raise UsageError(f"--inject dead:... needs a device with dead parts (golden, verilator, icarus), "
                                     f"not {getattr(dev, 'backend', '?')}")
                dev.kill(*spec[1:])
                continue
            n, rng = spec[1], np.random.default_rng(spec[2])
            words = dev.memcpy_d2h(0, dev.config.sram_words)
            used = np.argwhere(words != 0)
            for y, x, addr in used[rng.choice(len(used), size=min(n, len(used)), replace=False)].tolist():
                bit = int(rng.integers(39))
                dev.inject(x, y, addr, [bit])
                self.injected.append((x, y, addr, [bit]))
        return dev.run(max_cycles)


def _start_recording(fabric, look: dict):
    """Attach an event recorder to a golden fabric (``look``: ``region``, ``queues``)."""
    if not hasattr(fabric, "record"):
        raise UsageError(f"--trace and --pictures need the golden backend, not {getattr(fabric, 'backend', '?')}")
    try:
        return fabric.record(rect=look.get("region"), queues=look.get("queues") or ())
    except UsageError as exc:
        raise UsageError(f"--trace-region / --trace-queue: {exc}") from None


def _write_pictures(recorder, look: dict, title: str) -> dict:
    """Write the trace and heatmaps ``look`` asks for; their paths for the report."""
    from .golden.heatmap import mesh_pictures
    from .golden.perfetto import write_trace

    out = {}
    if look.get("trace"):
        write_trace(recorder, look["trace"], title)
        out["trace"] = str(look["trace"])
        if recorder.dropped:
            out["trace_dropped_slices"] = recorder.dropped
    if look.get("pictures"):
        paths = mesh_pictures(recorder, look["pictures"], title=title)
        out["pictures"] = {name: str(path) for name, path in paths.items()}
    return out


def run_kernel(name: str, config: FabricConfig, seed: int = 0, backend: str = "golden",
               device: Callable[[FabricConfig], Device] | None = None, look: dict | None = None,
               inject: list | None = None, **sizes) -> dict:
    """Run a library kernel on random data from ``seed`` and check it.

    Parameters
    ----------
    name:
        A key of :data:`wse.firmware.kernels.KERNELS`.
    config:
        The fabric, mesh shape included.
    seed:
        Seed of the random inputs (standard normal float32).
    backend:
        Name of the device in :data:`wse.sim.devices.DEVICES` (``"golden"``),
        used unless ``device`` is given.
    device:
        A factory ``config -> device`` implementing the host API
        (:class:`wse.sim.api.Device`): how other devices plug in.
    look:
        Pictures of the run (golden model only): ``trace`` (a path for the
        Perfetto timeline), ``pictures`` (a folder for the heatmaps),
        ``region`` (``(x0, y0, w, h)``: the PEs on the timeline) and
        ``queues`` (``(x, y)`` routers whose FIFO occupancy is a counter).
        The report then names the files (``trace``, ``pictures``).
    inject:
        Memory faults (:func:`parse_inject` tuples) injected before the
        first run; the report then has ``ecc``: the ``corrected`` and
        ``detected`` counts per PE (``[height][width]``).
    **sizes:
        ``rows`` and ``cols`` (gemv), ``n`` (the others), ``variant``
        (``"row"`` or ``"column"`` for broadcast and reduce); defaults as in
        ``KERNELS[name].defaults``.

    Returns
    -------
    dict
        JSON-able: ``kernel``, ``mesh`` (``"WxH"``), ``backend``, ``sizes``,
        ``seed``, ``bit_exact`` (the device's bits equal the reference's),
        ``mismatches`` (result words that differ), ``words`` (result words), ``max_abs_err_vs_float64``,
        ``cycles``, ``fmac_elements``, ``fmac_utilization`` (fmac elements
        / (PEs x cycles)), ``fpu_elements`` and ``fpu_utilization`` (elements of
        every binary32 vector instruction, the same way), ``utilization`` (fmac, per PE, ``[height][width]``) and
        ``seconds`` (host time of the device run).

    Raises
    ------
    UsageError
        For an unknown kernel or backend, sizes that are not positive
        integers, or data that does not fit in the PE memory.
    """
    return run(get_kernel(name), config, seed, backend, device, look, inject, **sizes)


# The wse kernel command ---------------------------------------------------------------

class _Parser(argparse.ArgumentParser):
    """An argument parser whose mistakes are :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str):
        raise UsageError(message)


def _parser() -> _Parser:
    parser = _Parser(prog="wse kernel", description="Run a library kernel on random data and check it.")
    parser.add_argument("name", nargs="?", help="kernel name (see --list)")
    parser.add_argument("--list", action="store_true", help="list the kernels and exit")
    parser.add_argument("--mesh", default="4x4", help="mesh shape WIDTHxHEIGHT (default 4x4)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
    parser.add_argument("--rows", type=int, help="gemv, spgemm, spmv: rows of W; gelu, layernorm, "
                        "layernorm_bwd: tokens")
    parser.add_argument("--cols", type=int, help="gemv, spgemm, spmv: columns of W; gelu, layernorm, "
                        "layernorm_bwd: features; attention: the head width Dh")
    parser.add_argument("--n", type=int, help="vector length (axpy, dot, broadcast, reduce); tokens (spgemm); "
                        "the context T (softmax, attention)")
    parser.add_argument("--variant", help="broadcast, reduce: row or column (default row); spgemm, spmv: random or "
                        "power (the mask's distribution); gelu: none, tanh, backward-none, backward-tanh; "
                        "softmax: forward or backward; attention: scores, values, backward-dp, backward-dv, "
                        "backward-dq, backward-dk")
    parser.add_argument("--sparsity", type=float, help="spgemm, spmv: fraction of zero weights, in [0, 1)")
    parser.add_argument("--sram-words", type=int, help="PE data memory in words (default from the configuration)")
    parser.add_argument("--backend", default="golden",
                        help=f"device: {', '.join(device_names())} (default golden)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.add_argument("--trace", help="write a Perfetto timeline of the run to this JSON file (golden)")
    parser.add_argument("--trace-region", help="X,Y,W,H: only these PEs on the timeline (big meshes)")
    parser.add_argument("--trace-queue", action="append", default=[],
                        help="X,Y: a router whose FIFO occupancy the timeline shows (repeatable)")
    parser.add_argument("--pictures", help="write heatmaps (FMAC utilization, stalls, links) into this folder")
    parser.add_argument("--defects", help="dead PEs and links of the --mesh (random:FRACTION,SEED, X,Y[,PORT][;...] "
                        "or a file): run on the usable mesh around them, spare rows and columns given up")
    parser.add_argument("--inject", action="append", default=[],
                        help="before the run, flip stored memory bits (sram:X,Y,ADDR,BIT[,BIT...], at a cycle "
                        "sram@CYCLE:X,Y,ADDR,BIT[,BIT...], or random:N,SEED), "
                        "kill a PE or link (dead:X,Y[,PORT], golden or RTL) or arm a link flip at a cycle "
                        "(link:X,Y,PORT,CYCLE,BIT[,BIT]); repeatable; prints the ECC counters")
    return parser


def _ints(text: str, count: int, option: str, form: str) -> tuple[int, ...]:
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != count or min(values) < 0:
        raise UsageError(f"{option} must be {form} (non-negative integers), not {text!r}")
    return values


def _look(args) -> dict | None:
    """The pictures asked for on the command line, checked."""
    if not (args.trace or args.pictures):
        if args.trace_region or args.trace_queue:
            raise UsageError("--trace-region and --trace-queue need --trace FILE")
        return None
    if args.backend != "golden":
        raise UsageError(f"--trace and --pictures need --backend golden, not {args.backend}")
    look = {"trace": args.trace, "pictures": args.pictures}
    if args.trace:
        parent = os.path.dirname(os.path.abspath(args.trace))
        if not os.path.isdir(parent):
            raise UsageError(f"--trace {args.trace}: the folder {parent} does not exist")
    if args.trace_region:
        look["region"] = _ints(args.trace_region, 4, "--trace-region", "X,Y,W,H")
    look["queues"] = [_ints(q, 2, "--trace-queue", "X,Y") for q in args.trace_queue]
    return look


def _summary(report: dict) -> str:
    kernel = KERNELS[report["kernel"]]
    verdict = "bit exact" if report["bit_exact"] else f"NOT bit exact ({report['mismatches']} of {report['words']} words differ)"
    golden = f" (golden model {report['golden_cycles']})" if "golden_cycles" in report else ""
    return (f"{report['kernel']} {kernel.describe(report['sizes'])} on a {report['mesh']} mesh "
            f"({report['backend']}, seed {report['seed']}): {verdict}\n"
            f"  max |error| vs float64 {report['max_abs_err_vs_float64']:.3g}, "
            f"{report['cycles']} cycles{golden}, fmac utilization {report['fmac_utilization']:.3f}, "
            f"fpu utilization {report['fpu_utilization']:.3f} "
            f"({report['seconds']:.2f} s)" + _ecc_summary(report) + _link_summary(report)
            + (f"\n  {report['defects'].replace(chr(10), chr(10) + '  ')}" if "defects" in report else ""))


def _ecc_summary(report: dict) -> str:
    """The memory ECC counters of a run with injected faults (nothing otherwise)."""
    if "ecc" not in report:
        return ""
    grids = {k: np.asarray(v) for k, v in report["ecc"].items()}
    rows = "; ".join(" ".join(f"{c}/{d}" for c, d in zip(cr, dr))
                     for cr, dr in zip(grids["corrected"].tolist(), grids["detected"].tolist()))
    return (f"\n  memory ECC: {int(grids['corrected'].sum())} corrected, {int(grids['detected'].sum())} detected "
            f"(per PE corrected/detected, row by row: {rows})")


def _link_summary(report: dict) -> str:
    """The link ECC counters of a run with link flips armed (nothing otherwise)."""
    if "link_ecc" not in report:
        return ""
    counts = report["link_ecc"]
    links = "; ".join(f"{link} {counts['corrected'].get(link, 0)}/{counts['detected'].get(link, 0)}"
                      for link in sorted(set(counts["corrected"]) | set(counts["detected"])))
    return (f"\n  link ECC: {sum(counts['corrected'].values())} corrected, {sum(counts['detected'].values())} "
            f"detected (per link X,Y,PORT corrected/detected: {links or 'none crossed at or after its cycle'})")


def main(argv: list[str]) -> int:
    """Run ``wse kernel`` with ``argv`` (the arguments after ``kernel``).

    Returns 0 when the run is bit exact (or for ``--list``), 1 when it is
    not. Raises :class:`UsageError` for bad arguments (``wse`` prints it as
    one line and exits with 2).
    """
    args = _parser().parse_args(argv)
    if args.list:
        width = max(len(name) for name in KERNELS)
        for name, kernel in KERNELS.items():
            print(f"{name:<{width}}  {kernel.summary}")
        return 0
    if args.name is None:
        raise UsageError(f"name a kernel ({', '.join(KERNELS)}) or pass --list")
    kernel = get_kernel(args.name)
    width, height = parse_mesh(args.mesh)
    config = FabricConfig(width=width, height=height)
    if args.sram_words is not None:
        config = config.replace(sram_words=args.sram_words)
    given = {"rows": args.rows, "cols": args.cols, "n": args.n, "variant": args.variant, "sparsity": args.sparsity}
    wrong = [f"--{key}" for key, value in given.items() if value is not None and key not in kernel.defaults]
    if wrong:
        takes = ", ".join(f"--{key}" for key in kernel.defaults)
        raise UsageError(f"{kernel.name} takes {takes}, not {wrong[0]}")
    sizes = {key: value for key, value in given.items() if value is not None}
    if args.backend not in device_names():
        raise UsageError(f"--backend must be one of {', '.join(device_names())}, not {args.backend!r}")
    look = _look(args)
    inject = [parse_inject(spec) for spec in args.inject]
    device, golden, remap = None, None, None
    if args.defects is not None:
        remap = plan_remap(parse_defects(args.defects, width, height))
        config = config.replace(width=remap.width, height=remap.height)
        device = defect_factory(lambda cfg: make_device(args.backend, cfg), remap)
        golden = defect_factory(lambda cfg: make_device("golden", cfg), remap)
    report = run_kernel(kernel.name, config, args.seed, backend=args.backend, device=device, look=look,
                        inject=inject, **sizes)
    if args.backend != "golden" and width * height <= GOLDEN_CHECK_PES:
        report["golden_cycles"] = run_kernel(kernel.name, config, args.seed, device=golden, **sizes)["cycles"]
    if remap is not None:
        report["physical_mesh"] = f"{width}x{height}"
        report["defects"] = remap.describe()
    print(json.dumps(report) if args.json else _summary(report))
    if not args.json:
        for name, path in ({"timeline": report.get("trace")} | report.get("pictures", {})).items():
            if path:
                print(f"  {name:<9}: {path}")
    return 0 if report["bit_exact"] else 1
