"""Fabric model speed: PE-cycles per second of the golden model and the vectorized model.

One JSON line per mesh: a weight-streaming training phase (``fwd 0`` of a
256-128-10 MLP, batch 16, compiled for the mesh) run from the same state on
both models in this process. The golden model is slow on large meshes, so
both run the phase's first ``--cycles`` cycles (the run stops at that
limit; a run that ends sooner counts its own cycles), and ``ratio`` is the
vectorized model's PE-cycles/s over the golden model's on the same cycles
(``ratio_cpu_time`` the same over each run's CPU time, steadier on a shared machine);
``vector_full`` is the vectorized model over the whole phase, with its
cycle count, which equals the static cycle model's (``same_cycles``).
``--vector-meshes`` adds meshes too large for the golden model: the whole
phase on the vectorized model only, its rate over the golden model's on
the last mesh measured above (``golden_mesh``).

    .venv/bin/python bench/fabric_speed.py                 # 16x16, 32x32, 64x64
    .venv/bin/python bench/fabric_speed.py --meshes 32 --cycles 800
    .venv/bin/python bench/fabric_speed.py --meshes 64 --vector-meshes 128
    .venv/bin/python bench/fabric_speed.py --meshes 16 --step     # and one FC-MNIST step
    .venv/bin/python bench/fabric_speed.py --meshes 16 32 --cycles 200 --torch   # the torch stepper too

``--torch`` adds the torch stepper (``TorchFabric``: ``vector-torch-cpu``, and
``vector-torch-cuda`` where CUDA is present) on the same cycles: its
PE-cycles/s, its rate over the vectorized (numba) model's and the golden
model's, and whether its memories and cycles after those cycles equal the
numba model's (``torch_cpu_same_bits_and_cycles``).

``--kernel-meshes 256x256 750x994`` runs ``wse kernel gemv --mesh WxH --backend vector --sram-words
1024`` in a child process per mesh (the golden model is not run there: too slow on such meshes) and
prints its cycles, the device run's seconds (program, routes and data loaded, then the run) and the
peak memory of the children so far (give the meshes smallest first).

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
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "fc_mnist.py"

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
    """(cycles run, wall seconds, CPU seconds of this process) of ``phase``, stopped after ``max_cycles``."""
    device = backend.device
    run = device.run
    if max_cycles is not None:
        device.run = lambda limit=None: run(max_cycles)
    start, cpu = time.perf_counter(), time.process_time()
    try:
        cycles = backend.run_phase(phase, weights, {})
    except FabricHang as stop:
        cycles = stop.cycle
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    device.run = run
    return cycles, seconds, cpu


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
    ran, seconds, _ = _timed(backend, weights, phase)
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


def whole_run(steps: int = 310, width: int = 16, batch: int = 64, mode: str | None = None) -> dict:
    """A whole FC-MNIST training run (``wse train examples/fc_mnist.py --backend vector``), timed, and the
    same run on the functional backend: the final weights compared bit for bit (see the module text)."""
    from wse.host.appliance import TrainConfig, train
    from wse.host.appliance import checkpoint as ckpt

    with tempfile.TemporaryDirectory() as tmp:
        base = dict(example=EXAMPLE, mesh=f"{width}x{width}", batch=batch, max_steps=steps, progress="none",
                    tensorboard=False, eval_train=False, mode=mode)
        start = time.perf_counter()
        vector = train(TrainConfig(out=Path(tmp) / "vector", backend="vector", **base))
        seconds = time.perf_counter() - start
        functional = train(TrainConfig(out=Path(tmp) / "functional", backend="functional", **base))
        weights = [ckpt.load_checkpoint(ckpt.latest_checkpoint(Path(tmp) / n))[1] for n in ("vector", "functional")]
        same = weights[0].names() == weights[1].names() and all(
            np.array_equal(weights[0].weight(n).view(np.uint32), weights[1].weight(n).view(np.uint32))
            for n in weights[0].names())
    return {"run": f"fc-mnist 784-256-256-10 batch {batch}, wse train --backend vector (measured)",
            "mesh": f"{width}x{width}", "mode": vector.data["settings"].get("mode"), "steps": vector.steps, "wall_seconds": round(seconds, 1),
            "wall_minutes": round(seconds / 60, 1), "seconds_per_step": round(seconds / vector.steps, 2),
            "cycles_per_step": vector.cycles_per_step, "target_minutes": 30,
            "same_final_weights_as_functional": same, "same_cycles_as_functional":
            vector.cycles_per_step == functional.cycles_per_step}


def kernel_mesh(mesh: str, sram_words: int = 1024) -> dict:
    """``wse kernel gemv --mesh MESH --backend vector`` in a child process: its cycles, the device run's
    seconds (loading, routes and the run), PE-cycles/s over them and the child's peak memory."""
    import resource
    import subprocess

    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "wse", "kernel", "gemv", "--mesh", mesh, "--backend", "vector",
                           "--sram-words", str(sram_words), "--json"], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    report = json.loads(done.stdout)
    width, height = (int(v) for v in mesh.split("x"))
    return {"kernel": "gemv", "mesh": mesh, "sizes": report["sizes"], "sram_words": sram_words,
            "bit_exact": report["bit_exact"], "cycles": report["cycles"], "device_seconds": report["seconds"],
            "pe_cycles_per_s": round(report["cycles"] * width * height / report["seconds"]),
            "wall_seconds": round(wall, 1),
            "peak_memory_gb": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20, 2)}


def _torch_devices(wanted: bool) -> list[str]:
    """The torch steppers measured: ``vector-torch-cpu`` and, where CUDA is present, ``vector-torch-cuda``."""
    if not wanted:
        return []
    return ["vector-torch-cpu"] + (["vector-torch-cuda"] if torch.cuda.is_available() else [])


def measure(width: int, cycles: int, batch: int = 16, torch_devices: tuple = ()) -> dict:
    """One mesh's figures (see the module text)."""
    exe, phase = _compiled(width, batch)
    pes = width * width
    out = {"mesh": f"{width}x{width}", "phase": phase, "cycles_measured": cycles}
    rates, cpu_rates = {}, {}
    memory = {}
    for name in ("golden", "vector", *torch_devices):
        backend, weights = _backend(name, exe, batch)
        ran, seconds, cpu = _timed(backend, weights, phase, cycles)
        rates[name], cpu_rates[name] = ran * pes / seconds, ran * pes / cpu
        key = name.replace("vector-torch-", "torch_")
        out[f"{key}_pe_cycles_per_s"] = round(rates[name])
        if name != "golden":
            device = backend.device
            memory[name] = (ran, device.memcpy_d2h(0, device.config.sram_words))
    for name in torch_devices:
        key = name.replace("vector-torch-", "torch_")
        out[f"{key}_over_vector"] = round(rates[name] / rates["vector"], 3)
        out[f"{key}_over_golden"] = round(rates[name] / rates["golden"], 2)
        out[f"{key}_same_bits_and_cycles"] = memory[name][0] == memory["vector"][0] and \
            np.array_equal(memory[name][1], memory["vector"][1])
    out["ratio"] = round(rates["vector"] / rates["golden"], 2)
    out["ratio_cpu_time"] = round(cpu_rates["vector"] / cpu_rates["golden"], 2)
    backend, weights = _backend("vector", exe, batch)
    ran, seconds, _ = _timed(backend, weights, phase)
    out["vector_full_cycles"] = ran
    out["vector_full_pe_cycles_per_s"] = round(ran * pes / seconds)
    out["same_cycles"] = ran == exe.phases[phase].cycles
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", type=int, nargs="*", default=[16, 32, 64],
                        help="mesh sides measured on both models (none: skip)")
    parser.add_argument("--cycles", type=int, default=600, help="cycles of the phase both models run")
    parser.add_argument("--vector-meshes", type=int, nargs="*", default=[],
                        help="larger mesh sides run on the vectorized model only")
    parser.add_argument("--step", action="store_true", help="one FC-MNIST training step on 16x16 (vector)")
    parser.add_argument("--kernel-meshes", nargs="*", default=[], metavar="WxH",
                        help="meshes (smallest first) for wse kernel gemv --backend vector in a child process "
                             "(e.g. 750x994): cycles, seconds, PE-cycles/s, peak memory")
    parser.add_argument("--whole-run", type=int, nargs="?", const=310, default=None, metavar="STEPS",
                        help="a whole FC-MNIST training run on 16x16 on the vector backend, timed (default 310 "
                             "steps), its final weights compared with the functional backend's")
    parser.add_argument("--whole-run-mode", default=None, choices=("pipelined", "weight-streaming"),
                        help="the whole run's execution mode (default: wse train's choice, auto)")
    parser.add_argument("--torch", action="store_true",
                        help="also the torch stepper (vector-torch-cpu, and vector-torch-cuda where CUDA is "
                             "present) on the same cycles: PE-cycles/s, ratios, same bits and cycles")
    args = parser.parse_args(argv)
    out, measured = None, {}
    torch_devices = tuple(_torch_devices(args.torch))
    for width in args.meshes:
        out = measured[width] = measure(width, args.cycles, torch_devices=torch_devices)
        print(json.dumps(out), flush=True)
    for width in args.vector_meshes:
        if out is None:
            raise SystemExit("fabric_speed: --vector-meshes needs a golden mesh in --meshes to compare with")
        print(json.dumps(vector_only(width, out)), flush=True)
    if args.step:
        if out is None:
            raise SystemExit("fabric_speed: --step needs a golden mesh in --meshes to compare with")
        print(json.dumps(training_step(measured.get(16, out))), flush=True)
    for mesh in args.kernel_meshes:
        print(json.dumps(kernel_mesh(mesh)), flush=True)
    if args.whole_run is not None:
        print(json.dumps(whole_run(args.whole_run, mode=args.whole_run_mode)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
