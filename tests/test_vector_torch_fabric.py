"""The vectorized model with its whole cycle on torch (``TorchFabric``, device ``vector-torch``)
equals the golden model bit for bit and cycle for cycle: every library kernel on 1x1, 3x2 and
4x4 meshes (results, memories, registers, counters, hops, cycles), random programs through the
lockstep divergence report, edge streams, hangs and the golden model's fault messages. Marked
``gpu``: the same on CUDA (skipped without a device)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wse.config import FabricConfig, Port
from wse.firmware.asm import assemble
from wse.firmware.kernels import KERNELS
from wse.sim.api import Device
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.cosim.programs import directed_scenarios, random_scenario, run_scenario
from wse.sim.devices import make_device
from wse.sim.golden import Fabric, FabricHang, ProgramFault
from wse.sim.runner import run_kernel
from wse.sim.vector.torch_fabric import TorchFabric

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]
MESHES = [(1, 1), (3, 2), (4, 4)]


def _state(device, cfg):
    regs = [device.registers(x, y) for y in range(cfg.height) for x in range(cfg.width)]
    return device.counters(), device.memcpy_d2h(0, cfg.sram_words), regs


def assert_same(golden, ours, cfg):
    (cg, mg, rg), (co, mo, ro) = _state(golden, cfg), _state(ours, cfg)
    for key in ("cycles", "total_cycles", "wavelet_hops"):
        assert cg[key] == co[key], key
    for key in cg["pe"]:
        np.testing.assert_array_equal(cg["pe"][key], co["pe"][key], err_msg=key)
    np.testing.assert_array_equal(mg, mo)
    assert rg == ro


#: Kernels whose long runs of scalar instructions take over 20 s on the torch CPU path (one round of
#: tensor operations per instruction): in the slow suite.
HEAVY = {("softmax", m) for m in MESHES} | {("spgemm", m) for m in MESHES} | {("gelu", (1, 1))} \
    | {("attention", m) for m in MESHES}
CASES = [pytest.param(name, mesh, marks=[pytest.mark.slow] if (name, mesh) in HEAVY else [],
                      id=f"{name}-{mesh[0]}x{mesh[1]}") for name in sorted(KERNELS) for mesh in MESHES]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,mesh", CASES)
def test_kernels_equal_golden(name, mesh, device):
    cfg = FabricConfig(width=mesh[0], height=mesh[1])
    made = {}

    def golden(config):
        made["golden"] = Fabric(config)
        return made["golden"]

    def ours(config):
        made["torch"] = TorchFabric(config, device)
        return made["torch"]
    sizes = {"n": 8 * mesh[0]} if name == "spgemm" and 8 * mesh[0] < 16 else {}
    want = run_kernel(name, cfg, seed=5, device=golden, **sizes)
    got = run_kernel(name, cfg, seed=5, device=ours, **sizes)
    assert got["bit_exact"] and got["backend"] == "vector-torch"
    assert got["cycles"] == want["cycles"] > 0
    assert_same(made["golden"], made["torch"], cfg)


def test_the_registry_makes_the_torch_device():
    cfg = FabricConfig(width=3, height=2, sram_words=1024)
    device = make_device("vector-torch", cfg)
    assert isinstance(device, TorchFabric) and isinstance(device, Device)
    report = run_kernel("gemv", cfg, seed=1, backend="vector-torch", rows=7, cols=5)
    assert report["bit_exact"] and report["backend"] == "vector-torch"


SCENARIOS = directed_scenarios() + [random_scenario(seed) for seed in (0, 1, 2, 3, 5, 8, 13, 21)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_programs_in_lockstep_with_golden(scenario, device):
    lockstep = Lockstep(Fabric(scenario.config), TorchFabric(scenario.config, device))
    cycles = run_scenario(lockstep, scenario)
    assert cycles > 0 and lockstep.compared.get("words", 1) > 0


@pytest.mark.parametrize("device", DEVICES)
def test_edge_streams_and_routes_equal_golden(device):
    cfg = FabricConfig(width=3, height=1, sram_words=256)
    outs = []
    for fabric in (Fabric(cfg), TorchFabric(cfg, device)):
        for x in range(3):
            fabric.set_route(x, 0, 2, Port.W, [Port.E])
        fabric.stream_in("W", 0, 2, np.arange(10, dtype=np.uint32), ctrl=[i % 2 for i in range(10)])
        fabric.stream_in("W", 0, 2, np.arange(5, dtype=np.uint32))      # a second run from the left-overs
        cycles = fabric.run()
        outs.append((cycles, fabric.wavelet_hops, fabric.pending_out(),
                     [a.tolist() for a in fabric.stream_out("E", 0, 2, with_ctrl=True)]))
    assert outs[0] == outs[1]


@pytest.mark.parametrize("device", DEVICES)
def test_a_hang_is_reported_like_golden(device):
    cfg = FabricConfig(width=2, height=1, sram_words=256)
    program = assemble("""
        .task 0, main
    main:
        recv r3, 1
        exit
    """, config=cfg)
    reports = []
    for fabric in (Fabric(cfg), TorchFabric(cfg, device)):
        fabric.load(program)
        fabric.launch(0)
        with pytest.raises(FabricHang, match="stopped making progress") as info:
            fabric.run()
        reports.append((info.value.cycle, str(info.value).split(" before becoming idle")[0]))
    assert reports[0] == reports[1]


def _fault_messages(program, cfg, device):
    messages = []
    for fabric in (Fabric(cfg), TorchFabric(cfg, device)):
        fabric.load(program)
        fabric.launch(0, rect=(1, 0, 1, 1))
        with pytest.raises(ProgramFault) as info:
            fabric.run(max_cycles=200)
        messages.append(str(info.value))
    return messages


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source", [
    "li r3, 1000\n        ld r4, 0(r3)",          # a data address outside memory
    "li r3, 255\n        ldsd d0, 0(r3)",         # the descriptor's second word is outside memory
    "activate 5",                                 # a task without an entry point
    "send r3, 6",                                 # a color past the mesh's colors
], ids=["ld", "ldsd-edge", "activate", "color"])
def test_scalar_faults_equal_golden(source, device):
    cfg = FabricConfig(width=2, height=1, sram_words=256, colors=4)
    program = assemble(f"""
        .task 0, main
    main:
        {source}
        exit
    """, config=FabricConfig(width=2, height=1, sram_words=256, colors=8))
    messages = _fault_messages(program, cfg, device)
    assert messages[0] == messages[1] and "PE (1, 0)" in messages[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("descriptors,instruction", [
    ("da: .dsd mem, base=a, len=8, stride=1\ndb: .dsd mem, base=a+250, len=8, stride=1", "fadd d1, d0, d0"),
    ("da: .dsd fabin, color=1, len=4\ndb: .dsd fabin, color=1, len=4", "fadd d0, d0, d1"),
    ("da: .dsd mem, base=a, len=4, stride=1\ndb: .dsd fabout, color=6, len=4", "fmov d1, d0"),
    ("da: .dsd mem, base=a, len=4, stride=1\ndb: .dsd mem, base=a+300, len=4, stride=1", "fmacw d0, d0, d1"),
], ids=["mem-span", "same-fabin", "color", "fmacw-mem-span"])
def test_vector_faults_equal_golden(descriptors, instruction, device):
    cfg = FabricConfig(width=2, height=1, sram_words=256, colors=4)
    program = assemble(f"""
    .data
    a:  .float 1.0, 2.0, 3.0, 4.0
    {descriptors}
    .text
    .task 0, main
    main:
        ldsd d0, da(r0)
        ldsd d1, db(r0)
        {instruction}
        exit
    """, config=FabricConfig(width=2, height=1, sram_words=256, colors=8))
    messages = _fault_messages(program, cfg, device)
    assert messages[0] == messages[1] and "PE (1, 0)" in messages[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mesh", [(4, 4), (5, 1)], ids=["4x4", "5x1"])
def test_training_phases_equal_the_numba_model(mesh, device):
    """Every phase of a weight-streaming training step: the same cycles (the static cycle model's),
    counters, hops and memory words as the numba model (itself proven equal to golden)."""
    from torch import nn

    from wse.host.compiler import compile_model
    from wse.host.runtime.rtl import device_backend

    torch.manual_seed(0)
    batch = 4
    model = nn.Sequential(nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 5))
    exe = compile_model(model, torch.randn(batch, 12), batch=batch,
                        config=FabricConfig(width=mesh[0], height=mesh[1]))
    want = _phases(device_backend("vector"), exe, batch)
    got = _phases(device_backend(f"vector-torch-{device}"), exe, batch)
    assert [w[0] for w in want] == [g[0] for g in got]
    for (name, cycles, counters, mem), (_, tcycles, tcounters, tmem) in zip(want, got):
        assert tcycles == cycles == exe.phases[name].cycles, name
        assert tcounters["wavelet_hops"] == counters["wavelet_hops"], name
        for key in counters["pe"]:
            np.testing.assert_array_equal(tcounters["pe"][key], counters["pe"][key], err_msg=f"{name} {key}")
        np.testing.assert_array_equal(tmem, mem, err_msg=name)


def _phases(backend_class, exe, batch):
    """Each phase of the training step on a fresh backend: ``(name, cycles, counters, memory)``."""
    from wse.host.runtime import Runtime

    backend = backend_class(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, runtime._classes, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    out = []
    for name in exe.sequences["train"]:
        backend.device.reset_counters()
        cycles = backend.run_phase(name, weights, {})
        out.append((name, cycles, backend.device.counters(), backend.device.memcpy_d2h(0, exe.config.sram_words)))
    return out
