"""Co-simulation of the RTL against the golden model (``wse.sim.cosim``).

* cocotb regressions (``wse.sim.cocotb_tb``), run through
  ``cocotb_tools.runner``: the router under random multicast traffic and
  backpressure, directed and random PE programs, every library kernel on
  meshes, on Verilator and on Icarus; one build folder per parameter set;
* the ``verilator`` backend (C++ harness): every kernel and random programs
  in lockstep with the golden model, divergence reports, hangs, usage
  errors, the CLI;
* the ``icarus`` backend (cocotb in a simulator process);
* the pieces: Verilog checks, the regression table.

Builds are cached under ``build/cosim`` (the first run compiles them: a few
minutes on two cores). 4x4 and larger meshes, and the longer Icarus runs,
are marked slow.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from wse.config import FabricConfig, Port, UsageError
from wse.firmware.asm import assemble
from wse.firmware.kernels import KERNELS
from wse.sim.cosim.lockstep import Divergence, Lockstep
from wse.sim.cosim.programs import COSIM_CONFIG, PE_CONFIG, directed_scenarios, random_scenario, run_scenario
from wse.sim.cosim.regress import format_table, parse_results, run_suite
from wse.sim.cosim.rtl import icarus_fixup, shared_comb_variables
from wse.sim.api import DEVICE_CALLS, RTL_CALLS, Device, RtlDevice, calls_of
from wse.sim.devices import DEVICES, device_names, make_device
from wse.sim.golden import Fabric, FabricHang
from wse.sim.runner import run_kernel

icarus = pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")


def _assert_passed(rows, folder):
    failed = [row for row in rows if row[1] != "PASS"]
    if failed or not rows:
        log = (folder / "sim.log").read_text()[-6000:] if (folder / "sim.log").exists() else "(no log)"
        pytest.fail(f"failed: {failed or 'no tests ran'}\n{format_table(rows)}\n--- sim.log (end) ---\n{log}")


def _mesh(spec: str) -> FabricConfig:
    width, height = map(int, spec.split("x"))
    return COSIM_CONFIG.with_mesh(width, height)


# --------------------------------------------------------------------------- cocotb regressions
@pytest.mark.parametrize("sim, wavelets", [
    ("verilator", 100_000),
    pytest.param("icarus", 10_000, marks=icarus),
    pytest.param("icarus", 100_000, marks=[icarus, pytest.mark.slow]),
])
def test_router_random_multicast_traffic(tmp_path, sim, wavelets):
    rows = run_suite("router", sim, PE_CONFIG, tmp_path, params={"WAVELETS": wavelets, "SEED": 1})
    _assert_passed(rows, tmp_path / "router")
    assert [name for name, *_ in rows] == ["router_tb.random_traffic", "router_tb.checker_catches_a_flipped_bit"]
    assert rows[0][2] > wavelets // 5  # simulated cycles: the traffic really ran


@pytest.mark.parametrize("sim, programs", [
    ("verilator", 12),
    pytest.param("icarus", 4, marks=icarus),
    pytest.param("icarus", 24, marks=[icarus, pytest.mark.slow]),
])
def test_pe_directed_and_random_programs(tmp_path, sim, programs):
    rows = run_suite("pe", sim, PE_CONFIG, tmp_path, params={"PROGRAMS": programs, "SEED": 100})
    _assert_passed(rows, tmp_path / "pe")
    assert len(rows) == len(directed_scenarios()) + 1


@pytest.mark.parametrize("sim, mesh, testcase, memory", [
    ("verilator", "2x2", None, 1),
    ("verilator", "3x2", None, 1),
    pytest.param("icarus", "2x2", ["kernel_in_lockstep/kernel=gemv", "checker_reports_injected_faults"], 1,
                 marks=icarus),
    pytest.param("verilator", "4x4", None, 1, marks=pytest.mark.slow),
    pytest.param("verilator", "2x3", None, 1, marks=pytest.mark.slow),
    pytest.param("icarus", "3x2", None, 0, marks=[icarus, pytest.mark.slow]),
    pytest.param("icarus", "4x4", None, 0, marks=[icarus, pytest.mark.slow]),
])
def test_mesh_every_kernel_in_lockstep(tmp_path, sim, mesh, testcase, memory):
    rows = run_suite("mesh", sim, _mesh(mesh), tmp_path, params={"SIZE": 24, "MEMORY": memory}, testcase=testcase)
    _assert_passed(rows, tmp_path / "mesh")
    kernels = sum(len(k.variants) or 1 for k in KERNELS.values())
    assert len(rows) == (kernels + 1 if testcase is None else len(testcase))


# --------------------------------------------------------------------------- verilator backend
@pytest.fixture(scope="module")
def verilator_fabric():
    from wse.sim.cosim.verilator import VerilatorFabric
    return VerilatorFabric


def _lockstep(factory, **checks):
    return lambda cfg: Lockstep(Fabric(cfg, trace=True), factory(cfg), check_emits=True, **checks)


@pytest.mark.parametrize("mesh", ["2x2", "3x2", pytest.param("4x4", marks=pytest.mark.slow),
                                  pytest.param("8x8", marks=pytest.mark.slow)])
def test_backend_every_kernel_in_lockstep(verilator_fabric, mesh):
    config = _mesh(mesh)
    for name, kernel in KERNELS.items():
        for variant in kernel.variants or (None,):
            sizes = {"variant": variant} if variant else {}
            report = run_kernel(name, config, 3, device=_lockstep(verilator_fabric), **sizes)
            assert report["bit_exact"], (name, variant)


def test_backend_random_programs_in_lockstep(verilator_fabric):
    for scenario in directed_scenarios() + [random_scenario(seed, 80) for seed in range(200, 230)]:
        pair = _lockstep(verilator_fabric)(PE_CONFIG)
        cycles = run_scenario(pair, scenario)
        assert cycles > 0 and pair.compared["memory words"] == PE_CONFIG.sram_words, scenario.name


def test_backend_kernel_cli_reports_golden_cycles(tmp_path):
    done = subprocess.run([sys.executable, "-m", "wse.cli", "kernel", "gemv", "--backend", "verilator",
                           "--mesh", "2x2", "--rows", "12", "--cols", "9", "--sram-words", "2048", "--json"],
                          capture_output=True, text=True, check=True)
    report = json.loads(done.stdout)
    golden = run_kernel("gemv", _mesh("2x2"), rows=12, cols=9)
    assert report["backend"] == "verilator" and report["bit_exact"]
    assert report["golden_cycles"] == report["cycles"] == golden["cycles"]
    assert {k: v for k, v in report.items() if k not in ("backend", "golden_cycles", "seconds")} == \
        {k: v for k, v in golden.items() if k not in ("backend", "seconds")}


def _gemv_in_lockstep(factory, config, corrupt):
    """Run gemv in lockstep; ``corrupt(pair, plan)`` spoils one side after the run."""
    kernel = KERNELS["gemv"]
    plan = kernel.plan(config, kernel.resolve(config, {"rows": 8, "cols": 6}))
    inputs = kernel.inputs(plan, np.random.default_rng(0))
    pair = _lockstep(factory)(config)
    run = pair.reference.run

    def corrupted(max_cycles=None):
        cycles = run(max_cycles)
        corrupt(pair, plan)
        return cycles

    pair.reference.run = corrupted
    with pytest.raises(Divergence) as caught:
        kernel.execute(pair, plan, inputs)
    return caught.value


def test_divergence_report_names_the_memory_word(verilator_fabric):
    def flip_word(pair, plan):
        pair.reference.pe(1, 1).mem[plan.heap + 3] ^= 1 << 17

    exc = _gemv_in_lockstep(verilator_fabric, _mesh("2x2"), flip_word)
    assert exc.first["kind"] == "word" and exc.first["pe"] == (1, 1)
    assert exc.first["device"] ^ exc.first["reference"] == 1 << 17
    assert f"PE (1, 1) word {exc.first['addr']}" in str(exc)


def test_divergence_report_names_the_wavelet(verilator_fabric):
    def flip_wavelet(pair, plan):
        key = sorted(pair.reference.edge_out)[0]
        data, ctrl = pair.reference.edge_out[key][2]
        pair.reference.edge_out[key][2] = (data ^ 1, ctrl)

    exc = _gemv_in_lockstep(verilator_fabric, _mesh("2x2"), flip_wavelet)
    first = exc.first
    assert first["kind"] == "wavelet" and first["index"] == 2 and first["edge"] == "E0" and first["pe"] == (1, 0)
    assert first["cycle"] > 0 and first["color"] in (1, 2)
    assert "wavelet #2" in str(exc) and f"device cycle {first['cycle']}" in str(exc)


def test_divergence_in_an_emitted_wavelet_and_a_register(verilator_fabric):
    scenario = directed_scenarios()[3]  # fabric: data task, recv, sendc, vectors to the fabric
    pair = _lockstep(verilator_fabric)(PE_CONFIG)
    pair.check_memory = False
    original = pair.reference.run

    def corrupted(max_cycles=None):
        cycles = original(max_cycles)
        pair.reference.pe(0, 0).regs[4] ^= 1
        return cycles

    pair.reference.run = corrupted
    with pytest.raises(Divergence, match=r"PE \(0, 0\) register r4"):
        run_scenario(pair, scenario)
    pair = _lockstep(verilator_fabric)(PE_CONFIG)
    pair.check_memory = pair.check_registers = False
    device_emitted = pair.device.emitted

    def shifted(x, y):
        got = device_emitted(x, y)
        got[1] = (got[1][0] ^ 4,) + got[1][1:]
        return got

    pair.device.emitted = shifted
    with pytest.raises(Divergence) as caught:
        run_scenario(pair, scenario)
    assert caught.value.first["kind"] == "emitted" and caught.value.first["index"] == 1
    assert caught.value.first["cycle"] > caught.value.first["reference_cycle"] >= 0


def test_backend_reports_a_hang_like_the_golden_model(verilator_fabric):
    program = assemble(".task 20, main\nmain: recv r3, 4\n exit\n", filename="wait.s", config=PE_CONFIG)
    fabric = verilator_fabric(PE_CONFIG)
    fabric.load(program)
    fabric.set_route(0, 0, 6, Port.W, [Port.RAMP])
    fabric.stream_in("W", 0, 6, [1, 2, 3, 4])
    fabric.launch(20)
    with pytest.raises(FabricHang) as caught:
        fabric.run()
    assert caught.value.cycle < 1000  # stopped by the no-progress watch, not the cycle limit
    assert "PE (0, 0) has a task running that waits for the fabric" in caught.value.report
    with pytest.raises(UsageError, match="hung in its last run"):
        fabric.memcpy_d2h(0, 1)
    fabric.reset()
    assert fabric.memcpy_d2h(0, 1).shape == (1, 1, 1)
    with pytest.raises(FabricHang, match="did not become idle within 50 cycles"):
        busy = assemble(".task 20, main\nmain: jmp main\n", filename="spin.s", config=PE_CONFIG)
        fabric.load(busy)
        fabric.launch(20)
        fabric.run(max_cycles=50)


def test_backend_usage_errors_match_the_golden_model(verilator_fabric):
    config = _mesh("2x2")
    golden, rtl = Fabric(config), verilator_fabric(config)
    calls = [
        ("memcpy_h2d", (0, np.zeros((1, 2, 3), np.uint32))),
        ("memcpy_h2d", (config.sram_words - 1, np.zeros(2, np.uint32))),
        ("memcpy_d2h", (0, 4, (1, 1, 2, 2))),
        ("stream_in", ("Q", 0, 1, [1])),
        ("stream_in", ("N", 2, 1, [1])),
        ("stream_in", ("N", 0, config.colors, [1])),
        ("set_route", (2, 0, 1, Port.W, [Port.E])),
        ("set_route", (0, 0, 99, Port.W, [Port.E])),
    ]
    for name, args in calls:
        with pytest.raises(UsageError) as expected:
            getattr(golden, name)(*args)
        with pytest.raises(UsageError) as got:
            getattr(rtl, name)(*args)
        assert str(got.value) == str(expected.value), name


def test_backend_route_readback_and_counters_reset(verilator_fabric):
    fabric = verilator_fabric(_mesh("2x2"))
    fabric.set_route(1, 0, 5, Port.N, [Port.E, Port.RAMP])
    assert fabric.route(1, 0, 5) == (int(Port.N), (Port.E, Port.RAMP))
    assert fabric.route(0, 1, 5) == (7, ())
    report = run_kernel("axpy", _mesh("2x2"), device=lambda cfg: fabric, n=40)
    assert report["bit_exact"] and fabric.counters()["pe"]["busy"].min() > 0
    fabric.reset_counters()
    counters = fabric.counters()
    assert counters["wavelet_hops"] == 0 and all(grid.max() == 0 for grid in counters["pe"].values())


# --------------------------------------------------------------------------- icarus backend
@icarus
def test_icarus_backend_runs_a_kernel_bit_exact():
    from wse.sim.cosim.icarus import IcarusFabric

    config = _mesh("2x2")
    with IcarusFabric(config) as fabric:
        report = run_kernel("dot", config, 2, device=lambda cfg: fabric, n=20)
        assert report["backend"] == "icarus" and report["bit_exact"]
        assert report["cycles"] == run_kernel("dot", config, 2, n=20)["cycles"]
        with pytest.raises(UsageError, match="edge must be one of"):
            fabric.stream_in("X", 0, 0, [1])


# --------------------------------------------------------------------------- training on the RTL
@pytest.mark.parametrize("backend,hidden", [("verilator", 16), ("verilator", 14),
                                            pytest.param("icarus", 16, marks=[icarus, pytest.mark.slow])])
def test_training_step_on_the_rtl_equals_the_functional_model(backend, hidden):
    """The weight-streaming training firmware on the RTL mesh: the same logits,
    gradient bits and per-phase cycles as the functional model (its cycle model
    is the golden model's count). 22 inputs on 4 rows spread their last round
    (rows 0 and 2); a hidden width of 14 does too, on the GEMMs' output side."""
    import torch
    from torch import nn

    from wse.host.compiler import compile_model
    from wse.host.runtime import Runtime

    torch.manual_seed(5)
    model = nn.Sequential(nn.Linear(22, hidden), nn.ReLU(), nn.Linear(hidden, 7))
    exe = compile_model(model, torch.randn(8, 22), config=_mesh("4x4"), batch=8)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((8, 22)).astype(np.float32), rng.integers(0, 7, 8)
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    want = Runtime(exe, "functional").train_step(x, y, weights)
    got = Runtime(exe, backend).train_step(x, y, weights)
    assert got.phases == want.phases and got.cycles == want.cycles > 0
    assert np.array_equal(got.logits.view(np.uint32), want.logits.view(np.uint32))
    for name in weights:
        assert np.array_equal(got.grads[name].view(np.uint32), want.grads[name].view(np.uint32)), name


# --------------------------------------------------------------------------- the host-API contract
def _device_classes():
    from wse.sim.cosim.cocotb_device import CocotbFabric
    from wse.sim.cosim.device import RtlFabric
    from wse.sim.cosim.icarus import CocotbProxyFabric
    from wse.sim.cosim.verilator import VerilatorFabric

    return [(Fabric, Device), (Lockstep, Device), (RtlFabric, RtlDevice), (VerilatorFabric, RtlDevice),
            (CocotbFabric, RtlDevice), (CocotbProxyFabric, RtlDevice)]


def _parameters(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


@pytest.mark.parametrize("device_class, protocol", _device_classes(), ids=lambda v: v.__name__)
def test_every_device_class_implements_the_whole_contract(device_class, protocol):
    assert calls_of(protocol) == (DEVICE_CALLS if protocol is Device else RTL_CALLS)
    for name in calls_of(protocol):
        method = getattr(device_class, name, None)
        assert callable(method), f"{device_class.__name__} has no {name}"
        assert _parameters(method) == _parameters(getattr(protocol, name)), f"{device_class.__name__}.{name}"
        assert getattr(protocol, name).__doc__, f"the contract of {name} is not written down"


def test_devices_satisfy_the_protocol_at_run_time():
    config = _mesh("2x2")
    golden = Fabric(config)
    assert isinstance(golden, Device) and not isinstance(golden, RtlDevice)
    assert isinstance(Lockstep(Fabric(config), Fabric(config), check_memory=False), Device)
    assert golden.registers(1, 1) == [0] * 16
    assert not isinstance(object(), Device)


def test_one_registry_of_device_names():
    from wse.host.runtime import BACKENDS

    assert device_names() == ("golden", "vector", "vector-torch", "vector-torch-cpu", "vector-torch-cuda",
                              "verilator", "icarus")
    assert all(entry.summary for entry in DEVICES.values())
    assert set(BACKENDS) == {"functional", "functional-torch", "functional-torch-cpu", "functional-torch-cuda",
                             *device_names()}
    assert isinstance(make_device("golden", _mesh("2x2")), Fabric)
    with pytest.raises(UsageError, match="backend must be one of golden, icarus, vector, vector-torch, "
                                         "vector-torch-cpu, vector-torch-cuda, verilator, not 'fpga'"):
        make_device("fpga", _mesh("2x2"))


def test_a_registered_device_reaches_the_runner_and_the_runtime(monkeypatch):
    from wse.host.runtime import _backend_class
    from wse.host.runtime.rtl import device_backend

    made = []

    def counted(config):
        made.append(config)
        return Fabric(config)

    monkeypatch.setitem(DEVICES, "golden", dataclasses.replace(DEVICES["golden"], factory=counted))
    assert run_kernel("axpy", _mesh("2x2"), n=8)["bit_exact"] and made == [_mesh("2x2")]
    assert _backend_class("golden") is device_backend("golden")
    backend = object.__new__(device_backend("golden"))  # its device, without an executable
    assert isinstance(backend.make_device(_mesh("2x2")), Fabric) and len(made) == 2


# --------------------------------------------------------------------------- pieces
def test_verilog_checks_find_the_decoder_and_fix_icarus_start():
    text = textwrap.dedent("""\
        module \\top.dec (d, w);
          reg \\$auto$verilog_backend.cc:2355:dump_module$2  = 0;
          output [9:0] d;
          reg [9:0] d;
          input [3:0] w;
          always @* begin
            if (\\$auto$verilog_backend.cc:2355:dump_module$2 ) begin end
            d[9:4] = 6'h00;
            casez (d[3:0])
              4'h1:
                  d[9:4] = 6'h3;
            endcase
          end
          always @*
            d[3:0] = w;
        endmodule
        """)
    assert shared_comb_variables(text) == [("top.dec", "d")]
    fixed = icarus_fixup(text)
    assert "initial #0 \\$auto$verilog_backend.cc:2355:dump_module$2  = 1'b1;" in fixed


def test_regression_table_from_cocotb_results(tmp_path):
    (tmp_path / "results.xml").write_text(
        '<testsuites><testsuite name="m">'
        '<testcase classname="wse.sim.cocotb_tb.mesh_tb" name="a" time="1.5"><properties>'
        '<property name="sim_time_duration" value="1230.0"/></properties></testcase>'
        '<testcase classname="wse.sim.cocotb_tb.mesh_tb" name="b" time="0.25"><properties>'
        '<property name="sim_time_duration" value="50"/></properties><failure message="x"/></testcase>'
        '</testsuite></testsuites>')
    rows = parse_results(tmp_path / "results.xml")
    assert rows == [("mesh_tb.a", "PASS", 123, 1.5), ("mesh_tb.b", "FAIL", 5, 0.25)]
    table = format_table(rows)
    assert "TOTAL (1/2 passed)" in table and "| FAIL" in table and "128" in table
