"""The richest end-to-end example that works today: a GEMV on the golden model.

Assembles the gemv kernel, lays a 300 x 200 weight matrix over a 6 x 4 mesh
(sizes the mesh does not divide), streams x in at the north edge, reduces the
partial sums along the rows, checks y bit for bit against the reference in the
documented order of float operations, and prints the cycle count and a map of
each PE's FMAC utilization, drawn beside it as a heatmap (PNG), with the
run's other heatmaps and its Perfetto timeline (``docs/pictures.md``).

Usage: python examples/demo.py [--mesh 6x4] [--rows 300] [--cols 200] [--seed 0] [--out build/demo]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wse.config import FabricConfig, UsageError, parse_mesh
from wse.sim.runner import run_kernel


def utilization_map(rows: list[list[float]]) -> str:
    """One line per mesh row: each PE's utilization in percent."""
    return "\n".join("  " + " ".join(f"{100 * u:5.1f}" for u in row) for row in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="GEMV on the golden fabric model")
    parser.add_argument("--mesh", default="6x4")
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--cols", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="build/demo", help="folder for the pictures and the timeline")
    args = parser.parse_args(argv)
    try:
        width, height = parse_mesh(args.mesh)
        config = FabricConfig(width=width, height=height)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        look = {"trace": out / "gemv_trace.json", "pictures": out}
        report = run_kernel("gemv", config, seed=args.seed, look=look, rows=args.rows, cols=args.cols)
    except UsageError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 2
    check = "bit exact" if report["bit_exact"] else f"MISMATCH in {report['mismatches']} of {report['words']} words"
    print(f"gemv y = W x, W {args.rows} x {args.cols}, on a {config.mesh} mesh (golden model)")
    print(f"  result       : {check} against the reference "
          f"(max |error| vs float64 {report['max_abs_err_vs_float64']:.2e})")
    print(f"  cycles       : {report['cycles']}  ({report['fmac_elements']} FMACs)")
    print(f"  FMAC util.   : {100 * report['fmac_utilization']:.1f}% of peak over the mesh")
    print("  per-PE FMAC utilization (rows of the mesh, north at the top):")
    print(utilization_map(report["utilization"]))
    print(f"  heatmap      : {report['pictures']['fmac']}  (stalls: {report['pictures']['stalls']}, "
          f"links: {report['pictures']['links']})")
    print(f"  timeline     : {report['trace']}  (open in ui.perfetto.dev)")
    return 0 if report["bit_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
