"""``wse kernel``: run a library kernel on random data and check it bit for bit.

::

    wse kernel --list
    wse kernel NAME [--mesh WxH] [--seed S] [--rows R --cols C] [--n N]
                    [--variant row|column] [--sram-words K] [--backend B] [--json]

Prints a short summary, or with ``--json`` the report of
:func:`wse.firmware.kernels.run_kernel` as one JSON object. On an RTL
backend (``verilator``, ``icarus``) the report also has ``golden_cycles``,
the golden model's cycles for the same run. Exit code 0 when the result is
bit exact, 1 when it is not, 2 for a mistake in the arguments.
"""

from __future__ import annotations

import argparse
import json

from wse.config import FabricConfig, UsageError, parse_mesh

from . import BACKENDS, KERNELS, get_kernel, run_kernel

__all__ = ["main"]


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
    parser.add_argument("--rows", type=int, help="gemv: rows of W")
    parser.add_argument("--cols", type=int, help="gemv: columns of W")
    parser.add_argument("--n", type=int, help="vector length (axpy, dot, broadcast, reduce)")
    parser.add_argument("--variant", help="broadcast, reduce: row or column (default row)")
    parser.add_argument("--sram-words", type=int, help="PE data memory in words (default from the configuration)")
    parser.add_argument("--backend", default="golden",
                        help=f"device: {', '.join(BACKENDS)} (default golden)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return parser


def _summary(report: dict) -> str:
    kernel = KERNELS[report["kernel"]]
    verdict = "bit exact" if report["bit_exact"] else f"NOT bit exact ({report['mismatches']} of {report['words']} words differ)"
    golden = f" (golden model {report['golden_cycles']})" if "golden_cycles" in report else ""
    return (f"{report['kernel']} {kernel.describe(report['sizes'])} on a {report['mesh']} mesh "
            f"({report['backend']}, seed {report['seed']}): {verdict}\n"
            f"  max |error| vs float64 {report['max_abs_err_vs_float64']:.3g}, "
            f"{report['cycles']} cycles{golden}, fmac utilization {report['fmac_utilization']:.3f} "
            f"({report['seconds']:.2f} s)")


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
    given = {"rows": args.rows, "cols": args.cols, "n": args.n, "variant": args.variant}
    wrong = [f"--{key}" for key, value in given.items() if value is not None and key not in kernel.defaults]
    if wrong:
        takes = ", ".join(f"--{key}" for key in kernel.defaults)
        raise UsageError(f"{kernel.name} takes {takes}, not {wrong[0]}")
    sizes = {key: value for key, value in given.items() if value is not None}
    if args.backend not in BACKENDS:
        raise UsageError(f"--backend must be one of {', '.join(BACKENDS)}, not {args.backend!r}")
    report = run_kernel(kernel.name, config, args.seed, backend=args.backend, **sizes)
    if args.backend != "golden":
        report["golden_cycles"] = run_kernel(kernel.name, config, args.seed, **sizes)["cycles"]
    print(json.dumps(report) if args.json else _summary(report))
    return 0 if report["bit_exact"] else 1
