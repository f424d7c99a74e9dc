"""Fabric model speed: PE-cycles per second of the golden model and the vectorized model.

One JSON line per mesh: a weight-streaming training phase (``fwd 0`` of a
256-128-10 MLP, batch 16, compiled for the mesh) run from the same state on
both models in this process. The golden model is slow on large meshes, so
both run the phase's first ``--cycles`` cycles (the run stops at that
limit; a run that ends sooner counts its own cycles), and ``ratio`` is the
vectorized model's PE-cycles/s over the golden model's on the same cycles;
``vector_full`` is the vectorized model over the whole phase, with its
cycle count, which equals the static cycle model's (``same_cycles``).

    .venv/bin/python bench/fabric_speed.py                 # 16x16, 32x32, 64x64
    .venv/bin/python bench/fabric_speed.py --meshes 32 --cycles 800
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


def measure(width: int, cycles: int, batch: int = 16) -> dict:
    """One mesh's figures (see the module text)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))
    exe = compile_model(model, torch.randn(batch, 256), batch=batch,
                        config=FabricConfig(width=width, height=width))
    phase = exe.sequences["train"][0]
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
    args = parser.parse_args(argv)
    for width in args.meshes:
        print(json.dumps(measure(width, args.cycles)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
