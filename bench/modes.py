"""Execution modes compared: the layer-pipelined forward pass against weight
streaming's, from each mode's static cycle model (equal to the golden model's
cycles, checked by tests/test_pipelined.py and tests/test_weight_streaming.py).

For each model on its mesh, one JSON line per mode:

* ``pipelined``: the forward phase's cycles at two batches ``b1 < b2`` (the
  largest that fits PE memory); the steady-state cycles per sample
  ``(c(b2) - c(b1)) / (b2 - b1)`` (every region busy at once); the steady-state
  utilization: multiply-adds per sample over PEs times those cycles; the fill
  and drain share of the ``b2`` run ``1 - b2 * steady / c(b2)`` (the bubble);
  the regions and the slowest region's tile;
* ``weight_streaming``: the forward phases' cycles per sample at its batch
  (weights streaming in at the full rate the cycle model assumes) and the
  same utilization;

then a line with the ratio of the two modes' cycles per sample (the
baseline is weight streaming, measured in the same run).

Usage: python bench/modes.py
"""

from __future__ import annotations

import json

import torch
from torch import nn

from wse.config import FabricConfig
from wse.host.compiler import compile_model
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import pe_fmacs, phase_cycles
from wse.host.compiler.weight_streaming import FitError


def _mlp(dims):
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def _largest_batch(graph, config, limit=64):
    best = None
    for batch in range(1, limit + 1):
        try:
            plan(graph, config, batch)
        except FitError:
            break
        best = batch
    return best


def measure(name: str, dims, config: FabricConfig, ws_batch: int) -> None:
    """Print the JSON lines of one model (see the module docstring)."""
    model = _mlp(dims)
    example = torch.zeros(1, dims[0])
    graph = trace(model, example)
    macs = sum(a * b for a, b in zip(dims, dims[1:]))
    b2 = _largest_batch(graph, config)
    b1 = max(1, b2 // 2)
    p1, p2 = plan(graph, config, b1), plan(graph, config, b2)
    c1, c2 = phase_cycles(p1)["forward"], phase_cycles(p2)["forward"]
    steady = (c2 - c1) / (b2 - b1)
    pes = config.num_pes
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "pipelined", "batches": [b1, b2],
                      "cycles": [c1, c2], "cycles_per_sample": round(steady, 1),
                      "fmac_utilization_steady": round(macs / (pes * steady), 3),
                      "fmac_utilization_run": round(int(pe_fmacs(p2, "forward").sum()) / (pes * c2), 3),
                      "bubble_fraction": round(1 - b2 * steady / c2, 3),
                      "regions": [[r.cols, r.rows] for r in p2.regions],
                      "slowest_tile": max(r.tile for r in p2.regions)}))
    exe = compile_model(model, example, config=config, batch=ws_batch, mode="weight_streaming")
    fwd = [phase for phase in exe.phases.values() if phase.group == "forward"]
    ws_cycles = sum(phase.cycles for phase in fwd)
    print(json.dumps({"model": name, "mesh": config.mesh, "mode": "weight_streaming", "batch": ws_batch,
                      "cycles": ws_cycles, "cycles_per_sample": round(ws_cycles / ws_batch, 1),
                      "fmac_utilization": round(sum(phase.fmacs for phase in fwd) / (pes * ws_cycles), 3)}))
    print(json.dumps({"model": name, "pipelined_over_weight_streaming_cycles_per_sample":
                      round(steady / (ws_cycles / ws_batch), 3)}))


def main() -> None:
    """Run the comparison for FC-MNIST and a small model on 16x16."""
    torch.manual_seed(0)
    config = FabricConfig(width=16, height=16)
    measure("fc_mnist 784-256-256-10", (784, 256, 256, 10), config, 64)
    measure("digits 64-32-10", (64, 32, 10), config, 64)


if __name__ == "__main__":
    main()
