"""Fabric model speed: PE-cycles per second of the golden model and the vectorized model.

One JSON line per mesh: a weight-streaming training phase (``fwd 0`` of a
256-128-10 MLP, batch 16, compiled for the mesh) run from the same state on
both models in this process. The golden model is slow on large meshes, so
both run the phase's first ``--cycles`` cycles (the run stops at that
limit; a run that ends sooner counts its own cycles), and ``ratio`` is the
vectorized model's PE-cycles/s over the golden model's on the same cycles;
``vector_full`` is the vectorized model over the whole phase, with its
cycle count, which equals the static cycle model's (``same_cycles``).
``--vector-meshes`` adds meshes too large for the golden model: the whole
phase on the vectorized model only, its rate over the golden model's on
the last mesh measured above (``golden_mesh``).

    .venv/bin/python bench/fabric_speed.py                 # 16x16, 32x32, 64x64
    .venv/bin/python bench/fabric_speed.py --meshes 32 --cycles 800
    .venv/bin/python bench/fabric_speed.py --meshes 64 --vector-meshes 128
    .venv/bin/python bench/fabric_speed.py --meshes 16 --step     # and one FC-MNIST step

``--step`` runs every phase of one weight-streaming training step of the
FC-MNIST network (784-256-256-10, batch 64) on a 16x16 mesh on the
vectorized model: its cycles (equal to the static cycle model's), seconds,
PE-cycles/s, the ratio to the golden model's rate on 16x16 (else on the
last mesh measured above), and the time a 310-step run would take at that rate (a projection from the
one step, not a measured run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from wse.config import FabricConfig  # noqa: E402
from wse.host.compiler import compile_model  # noqa: E402
from wse.host.runtime import Runtime  # noqa: E402
from wse.host.runtime.rtl import device_backend  # noqa: E402
from wse.sim.golden import FabricHang  # noqa: E402


def _backend(name, exe, batch):
    backend = device_backend(name)(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, runtime._classes, batch)))
    weights = {n: rng.standard_normal(s).astype(np.float32) for n, s in exe.parameters().items()}
    return backend, weights


def _timed(backend, weights, phase, max_cycles=None):
    """(cycles run, seconds) of ``phase``, stopped after ``max_cycles``."""
    device = backend.device
    run = device.run
    if max_cycles is not None:
        device.run = lambda limit=None: run(max_cycles)
    start = time.perf_counter()
    try:
        cycles = backend.run_phase(phase, weights, {})
    except FabricHang as stop:
        cycles = stop.cycle
    seconds = time.perf_counter() - start
    device.run = run
    return cycles, seconds


def _compiled(width: int, batch: int):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    exe = compile_model(model, torch.randn(batch, 256), batch=batch,
                        config=FabricConfig(width=width, height=width))
    return exe, exe.sequences["train"][0]


def vector_only(width: int, golden: dict, batch: int = 16) -> dict:
    """The whole phase on the vectorized model alone (see the module text)."""
    exe, phase = _compiled(width, batch)
    backend, weights = _backend("vector", exe, batch)
    ran, seconds = _timed(backend, weights, phase)
    rate = ran * width * width / seconds
    return {"mesh": f"{width}x{width}", "phase": phase, "vector_full_cycles": ran,
            "vector_full_pe_cycles_per_s": round(rate), "seconds": round(seconds, 1),
            "same_cycles": ran == exe.phases[phase].cycles, "golden_mesh": golden["mesh"],
            "ratio_vs_golden": round(rate / golden["golden_pe_cycles_per_s"], 2)}


def training_step(golden: dict, width: int = 16, batch: int = 64, steps: int = 310) -> dict:
    """One FC-MNIST weight-streaming step on the vectorized model (see the module text)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    exe = compile_model(model, torch.randn(batch, 784), batch=batch, config=FabricConfig(width=width, height=width))
    backend, weights = _backend("vector", exe, batch)
    start = time.perf_counter()
    cycles = sum(backend.run_phase(name, weights, {}) for name in exe.sequences["train"])
    seconds = time.perf_counter() - start
    rate = cycles * width * width / seconds
    return {"step": f"fc-mnist 784-256-256-10 batch {batch}", "mesh": f"{width}x{width}", "cycles": cycles,
            "same_cycles": cycles == sum(exe.phases[n].cycles for n in exe.sequences["train"]),
            "seconds": round(seconds, 1), "vector_pe_cycles_per_s": round(rate), "golden_mesh": golden["mesh"],
            "ratio_vs_golden": round(rate / golden["golden_pe_cycles_per_s"], 2),
            f"projected_{steps}_steps_minutes": round(seconds * steps / 60, 1)}


def measure(width: int, cycles: int, batch: int = 16) -> dict:
    """One mesh's figures (see the module text)."""
    exe, phase = _compiled(width, batch)
    pes = width * width
    out = {"mesh": f"{width}x{width}", "phase": phase, "cycles_measured": cycles}
    rates = {}
    for name in ("golden", "vector"):
        backend, weights = _backend(name, exe, batch)
        ran, seconds = _timed(backend, weights, phase, cycles)
        rates[name] = ran * pes / seconds
        out[f"{name}_pe_cycles_per_s"] = round(rates[name])
    out["ratio"] = round(rates["vector"] / rates["golden"], 2)
    backend, weights = _backend("vector", exe, batch)
    ran, seconds = _timed(backend, weights, phase)
    out["vector_full_cycles"] = ran
    out["vector_full_pe_cycles_per_s"] = round(ran * pes / seconds)
    out["same_cycles"] = ran == exe.phases[phase].cycles
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", type=int, nargs="+", default=[16, 32, 64], help="mesh sides")
    parser.add_argument("--cycles", type=int, default=600, help="cycles of the phase both models run")
    parser.add_argument("--vector-meshes", type=int, nargs="*", default=[],
                        help="larger mesh sides run on the vectorized model only")
    parser.add_argument("--step", action="store_true", help="one FC-MNIST training step on 16x16 (vector)")
    args = parser.parse_args(argv)
    out, measured = None, {}
    for width in args.meshes:
        out = measured[width] = measure(width, args.cycles)
        print(json.dumps(out), flush=True)
    for width in args.vector_meshes:
        if out is None:
            raise SystemExit("fabric_speed: --vector-meshes needs a golden mesh in --meshes to compare with")
        print(json.dumps(vector_only(width, out)), flush=True)
    if args.step:
        if out is None:
            raise SystemExit("fabric_speed: --step needs a golden mesh in --meshes to compare with")
        print(json.dumps(training_step(measured.get(16, out))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
