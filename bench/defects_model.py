"""Cost of checking and timing a training executable on the physical mesh of a defect map: one JSON line per case.

For FC-MNIST (weight streaming) on a 16x16 mesh with random dead PEs, each
line gives the seconds of the compile for the usable logical mesh (its own
deadlock check and static cycle model included: the baseline), of the
deadlock check of every phase on the physical mesh
(:func:`wse.host.compiler.physical.check_on_defects`) and of the static
cycle model on the physical network (:func:`~wse.host.compiler.physical.cycles_on_defects`),
each as a ratio to the compile, and a step's cycles on the logical and on
the physical mesh.

    .venv/bin/python bench/defects_model.py
    .venv/bin/python bench/defects_model.py --defects random:0.05,3
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--defects", default="random:0.02,1", help="the defect map (default random:0.02,1)")
    parser.add_argument("--mesh", default="16x16", help="the physical mesh (default 16x16)")
    args = parser.parse_args(argv)
    import torch
    from torch import nn

    from wse.config import FabricConfig, parse_mesh
    from wse.host.compiler import compile_model
    from wse.host.compiler.physical import check_on_defects, cycles_on_defects
    from wse.sim.defects import parse_defects, plan_remap

    width, height = parse_mesh(args.mesh)
    remap = plan_remap(parse_defects(args.defects, width, height))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    start = time.perf_counter()
    exe = compile_model(model, torch.zeros(64, 784), config=FabricConfig(width=remap.width, height=remap.height),
                        batch=64)
    compiled = time.perf_counter() - start
    start = time.perf_counter()
    proofs = check_on_defects(exe, remap)
    checked = time.perf_counter() - start
    start = time.perf_counter()
    cycles = cycles_on_defects(exe, remap)
    timed = time.perf_counter() - start
    print(json.dumps({"case": "fc_mnist", "mesh": args.mesh, "defects": args.defects,
                      "usable": f"{remap.width}x{remap.height}", "phases": len(proofs),
                      "compile_s": round(compiled, 2), "check_s": round(checked, 2), "cycles_s": round(timed, 2),
                      "check_over_compile": round(checked / compiled, 3),
                      "cycles_over_compile": round(timed / compiled, 3),
                      "logical_step_cycles": exe.cycles("train"),
                      "physical_step_cycles": sum(cycles[name] for name in exe.sequences["train"])}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
