"""The vectorized fabric model equals the golden model bit for bit and cycle for cycle:
library kernels on square, non-square and one-row meshes, the random-program generator's
programs through the lockstep divergence report, and whole weight-streaming training phases."""

import numpy as np
import pytest

from wse.config import FabricConfig, Port
from wse.firmware.asm import assemble
from wse.firmware.kernels import KERNELS
from wse.sim.api import Device
from wse.sim.cosim.lockstep import Divergence, Lockstep
from wse.sim.cosim.programs import directed_scenarios, random_scenario, run_scenario
from wse.sim.devices import make_device
from wse.sim.golden import Fabric, FabricHang, ProgramFault
from wse.sim.runner import run_kernel
from wse.sim.vector import VectorFabric

MESHES = [(1, 1), (4, 4), (3, 2), (2, 3), (5, 1), (1, 4)]


def _state(device, cfg):
    regs = [device.registers(x, y) for y in range(cfg.height) for x in range(cfg.width)]
    return device.counters(), device.memcpy_d2h(0, cfg.sram_words), regs


def assert_same(golden, vector, cfg):
    (cg, mg, rg), (cv, mv, rv) = _state(golden, cfg), _state(vector, cfg)
    for key in ("cycles", "total_cycles", "wavelet_hops"):
        assert cg[key] == cv[key], key
    for key in cg["pe"]:
        np.testing.assert_array_equal(cg["pe"][key], cv["pe"][key], err_msg=key)
    np.testing.assert_array_equal(mg, mv)
    assert rg == rv


@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: f"{m[0]}x{m[1]}")
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernels_equal_golden(name, mesh):
    cfg = FabricConfig(width=mesh[0], height=mesh[1])
    made = {}

    def maker(cls):
        def make(config):
            made[cls] = cls(config)
            return made[cls]
        return make
    # spgemm's partial-sum ring holds at most 8 tokens per column: keep within it on narrow meshes.
    sizes = {"n": 8 * mesh[0]} if name == "spgemm" and 8 * mesh[0] < 16 else {}
    want = run_kernel(name, cfg, seed=5, device=maker(Fabric), **sizes)
    got = run_kernel(name, cfg, seed=5, device=maker(VectorFabric), **sizes)
    assert got["bit_exact"] and got["backend"] == "vector"
    assert got["cycles"] == want["cycles"] > 0
    assert_same(made[Fabric], made[VectorFabric], cfg)


def test_runner_and_registry_make_the_vector_device():
    cfg = FabricConfig(width=3, height=2, sram_words=1024)
    device = make_device("vector", cfg)
    assert isinstance(device, VectorFabric) and isinstance(device, Device)
    report = run_kernel("gemv", cfg, seed=1, backend="vector", rows=7, cols=5)
    assert report["bit_exact"] and report["backend"] == "vector"


SCENARIOS = directed_scenarios() + [random_scenario(seed) for seed in (0, 1, 2, 3, 5, 8, 13, 21, 34, 40)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_programs_in_lockstep_with_golden(scenario):
    lockstep = Lockstep(Fabric(scenario.config), VectorFabric(scenario.config))
    cycles = run_scenario(lockstep, scenario)
    assert cycles > 0 and lockstep.compared.get("words", 1) > 0


def test_lockstep_reports_a_divergence_of_the_vector_model():
    scenario = random_scenario(4)
    vector = VectorFabric(scenario.config)
    lockstep = Lockstep(Fabric(scenario.config), vector)
    run = vector.run
    vector.run = lambda max_cycles=None: run(max_cycles) + 1   # a model off by one cycle
    with pytest.raises(Divergence, match="cycles"):
        run_scenario(lockstep, scenario)


def _hang_program(cfg):
    return assemble("""
        .task 0, main
    main:
        recv r3, 1
        exit
    """, config=cfg)


def test_a_hang_is_reported_like_golden():
    cfg = FabricConfig(width=2, height=1, sram_words=256)
    for cls in (Fabric, VectorFabric):
        device = cls(cfg)
        device.load(_hang_program(cfg))
        device.launch(0)
        with pytest.raises(FabricHang, match="stopped making progress"):
            device.run()


def test_a_fault_names_the_pe_and_instruction_like_golden():
    cfg = FabricConfig(width=2, height=2, sram_words=256)
    program = assemble("""
        .task 0, main
    main:
        li r3, 1000
        ld r4, 0(r3)
        exit
    """, config=cfg)
    messages = []
    for cls in (Fabric, VectorFabric):
        device = cls(cfg)
        device.load(program, rect=(1, 1, 1, 1))
        device.launch(0, rect=(1, 1, 1, 1))
        with pytest.raises(ProgramFault) as info:
            device.run()
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "PE (1, 1)" in messages[0]


def test_edge_streams_and_routes_equal_golden():
    cfg = FabricConfig(width=3, height=1, sram_words=256)
    outs = []
    for cls in (Fabric, VectorFabric):
        device = cls(cfg)
        for x in range(3):
            device.set_route(x, 0, 2, Port.W, [Port.E])
        device.stream_in("W", 0, 2, np.arange(10, dtype=np.uint32), ctrl=[i % 2 for i in range(10)])
        cycles = device.run()
        outs.append((cycles, device.route(1, 0, 2), device.pending_out(),
                     [a.tolist() for a in device.stream_out("E", 0, 2, with_ctrl=True)]))
    assert outs[0] == outs[1]


def test_the_vector_device_implements_the_whole_contract():
    import inspect

    from wse.sim.api import DEVICE_CALLS

    def parameters(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]
    for name in DEVICE_CALLS:
        assert parameters(getattr(VectorFabric, name)) == parameters(getattr(Device, name)), name


@pytest.mark.parametrize("source", [
    "li r3, 255\n        ldsd d0, 0(r3)",          # the descriptor's second word is outside memory
    "activate 5",                                 # a task without an entry point
], ids=["ldsd-edge", "activate"])
def test_scalar_faults_equal_golden(source):
    cfg = FabricConfig(width=2, height=1, sram_words=256)
    program = assemble(f"""
        .task 0, main
    main:
        {source}
        exit
    """, config=cfg)
    messages = _fault_messages(program, cfg)
    assert messages[0] == messages[1] and "PE (1, 0)" in messages[0]


def _fault_messages(program, cfg):
    """The fault of ``program`` run on PE (1, 0), on the golden and on the vectorized model."""
    messages = []
    for cls in (Fabric, VectorFabric):
        device = cls(cfg)
        device.load(program)
        device.launch(0, rect=(1, 0, 1, 1))
        with pytest.raises(ProgramFault) as info:
            device.run(max_cycles=200)
        messages.append(str(info.value))
    return messages


@pytest.mark.parametrize("descriptors,instruction", [
    ("da: .dsd mem, base=a, len=8, stride=1\ndb: .dsd mem, base=a+250, len=8, stride=1", "fadd d1, d0, d0"),
    ("da: .dsd mem, base=a, len=4, stride=1\ndb: .dsd fabin, color=1, len=4", "fmov d1, d0"),
    ("da: .dsd fabin, color=1, len=4\ndb: .dsd fabin, color=1, len=4", "fadd d0, d0, d1"),
    ("da: .dsd mem, base=a, len=4, stride=1\ndb: .dsd fabout, color=6, len=4", "fmov d1, d0"),
    ("da: .dsd mem, base=a+253, len=4, stride=1\ndb: .dsd fabin, color=2, len=4", "fmacw d0, d0, d1"),
    ("da: .dsd mem, base=a, len=4, stride=1\ndb: .dsd mem, base=a+300, len=4, stride=1", "fmacw d0, d0, d1"),
], ids=["mem-span", "fabin-dst", "same-fabin", "color", "fmacw-fabric-span", "fmacw-mem-span"])
def test_vector_faults_equal_golden(descriptors, instruction):
    cfg = FabricConfig(width=2, height=1, sram_words=256, colors=4)    # color 6 is past the mesh's colors
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
    messages = _fault_messages(program, cfg)
    assert messages[0] == messages[1] and "PE (1, 0)" in messages[0]


def test_long_edge_streams_leave_the_compiled_loop_and_resume():
    """More wavelets leave the mesh than the compiled loop's output buffer holds: the loop stops, hands them
    over and resumes at the same cycle; the result equals golden's."""
    cfg = FabricConfig(width=3, height=1, sram_words=256)
    outs = []
    for cls in (Fabric, VectorFabric):
        device = cls(cfg)
        for x in range(3):
            device.set_route(x, 0, 2, Port.W, [Port.E])
        words = np.arange(40_000, dtype=np.uint32) * 2654435761
        device.stream_in("W", 0, 2, words, ctrl=(words >> 7) & 1)
        cycles = device.run()
        outs.append((cycles, device.wavelet_hops, [a.tolist() for a in device.stream_out("E", 0, 2, with_ctrl=True)]))
    assert outs[0] == outs[1] and len(outs[0][2][0]) == 40_000


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_array_stepper_equals_the_compiled_loop(name):
    """``stepper="arrays"`` (the loop in Python over the same kernels) gives the compiled loop's bits and cycles."""
    cfg = FabricConfig(width=3, height=2)
    made = {}

    def maker(stepper):
        def make(config):
            made[stepper] = VectorFabric(config, stepper=stepper)
            return made[stepper]
        return make
    sizes = {"n": 24} if name == "spgemm" else {}
    got = [run_kernel(name, cfg, seed=3, device=maker(stepper), **sizes) for stepper in VectorFabric.STEPPERS]
    assert all(g["bit_exact"] for g in got) and got[0]["cycles"] == got[1]["cycles"] > 0
    assert_same(made["compiled"], made["arrays"], cfg)


def test_an_unknown_stepper_is_refused():
    with pytest.raises(ValueError, match="stepper 'gpu'"):
        VectorFabric(FabricConfig(width=2, height=1), stepper="gpu")
