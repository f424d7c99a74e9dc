"""Cost of the static deadlock check against the compile it guards: one JSON line per model and mesh.

Each line gives the seconds of planning the weight-streaming mapping, of the
route check over every phase (``host/compiler/route_check.py``) and their
ratio, plus the size of the largest channel-dependency graph.

    .venv/bin/python bench/deadlock_check.py
    .venv/bin/python bench/deadlock_check.py --cases fc_mnist
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {
    "fc_mnist": ((784, 256, 256, 10), (16, 16), 64),
    "mlp1024": ((1024, 1024, 1024, 10), (32, 32), 256),
    "mlp2048": ((2048, 2048, 2048, 10), (64, 64), 512),
}


def _model(sizes):
    from torch import nn
    layers = []
    for a, b in zip(sizes, sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: " + ", ".join(CASES))
    args = parser.parse_args(argv)
    import torch

    from wse.config import FabricConfig
    from wse.host.compiler import route_check, trace
    from wse.host.compiler.weight_streaming import plan
    for name in args.cases.split(","):
        sizes, (w, h), batch = CASES[name]
        graph = trace(_model(sizes), torch.randn(batch, sizes[0]))
        start = time.perf_counter()
        p = plan(graph, FabricConfig(width=w, height=h), batch)
        planned = time.perf_counter() - start
        start = time.perf_counter()
        proofs = route_check.check_weight_streaming(p)
        checked = time.perf_counter() - start
        print(json.dumps({"case": name, "mesh": f"{w}x{h}", "phases": len(proofs), "plan_s": round(planned, 3),
                          "check_s": round(checked, 3), "check_over_plan": round(checked / planned, 2),
                          "channels": max(x.channels for x in proofs),
                          "dependencies": max(x.dependencies for x in proofs)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
