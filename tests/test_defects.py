"""Defect tolerance (``docs/faults.md`` section 4): a mesh with dead PEs and
links runs the usable logical mesh around them, bit for bit the perfect mesh
of that size; conflicting routes and bad defect specs are refused in one line."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import torch
from torch import nn

from wse.cli import main as wse_main
from wse.config import FabricConfig, Port, UsageError
from wse.firmware.kernels import KERNELS
from wse.host.appliance.defects import runtime_backend
from wse.host.compiler import compile_model
from wse.host.memoryx import OptimizerConfig
from wse.host.runtime import Runtime
from wse.sim.defects import DefectDevice, DefectError, parse_defects, plan_remap
from wse.sim.devices import make_device
from wse.sim.golden import Fabric, FabricHang
from wse.sim.runner import run_kernel
from wse.sim.defects import defect_factory


def _remap(spec, width=6, height=6):
    return plan_remap(parse_defects(spec, width, height))


def _golden(remap):
    return defect_factory(lambda cfg: make_device("golden", cfg), remap)


CASES = [(name, variant) for name, k in KERNELS.items()
         for variant in ({"broadcast": ("row", "column"), "reduce": ("row", "column"),
                          "spgemm": ("random", "power"), "spmv": ("random",)}.get(name, (None,)))]


@pytest.mark.parametrize("spec", ["1,1;4,3", "0,0;5,5;3,2,E;2,4,N"])
@pytest.mark.parametrize("name,variant", CASES)
def test_every_kernel_around_dead_parts_equals_the_perfect_usable_mesh(name, variant, spec):
    remap = _remap(spec)
    config = FabricConfig(width=remap.width, height=remap.height)
    sizes = {"variant": variant} if variant else {}
    perfect = run_kernel(name, config, 3, **sizes)
    defective = run_kernel(name, config, 3, device=_golden(remap), **sizes)
    assert perfect["bit_exact"] and defective["bit_exact"]      # the same reference: the same bits
    assert defective["fmac_elements"] == perfect["fmac_elements"]
    # the spare routers add hops, never cycles of computation; a handful of cycles of latency at most
    assert perfect["cycles"] <= defective["cycles"] <= perfect["cycles"] + 8


def test_the_cover_is_the_largest_usable_mesh():
    rng = np.random.default_rng(5)
    for _ in range(30):
        pes = {tuple(int(v) for v in rng.integers(0, (5, 4))) for _ in range(int(rng.integers(1, 5)))}
        remap = _remap(";".join(f"{x},{y}" for x, y in sorted(pes)), 5, 4)
        assert not any(x in remap.cols and y in remap.rows for x, y in pes)
        best = max((5 - len(c)) * (4 - len(r)) for nr in range(5) for r in itertools.combinations(range(4), nr)
                   for nc in range(6) for c in itertools.combinations(range(5), nc)
                   if all(x in c or y in r for x, y in pes))
        assert remap.width * remap.height == best
    links = _remap("2,1,E;3,3,S", 6, 6)
    assert 1 not in links.rows and 3 not in links.cols and (links.width, links.height) == (5, 5)


def test_the_golden_model_is_told_the_defects_and_reports_them():
    remap = _remap("1,1;2,3,E")
    device = _golden(remap)(FabricConfig(width=5, height=5))
    assert device.models_defects and device.device.routers.dead_pes == {1 * 6 + 1}
    # a route straight into a dead part (bypassing the mapping) ends in the report naming it
    phys = device.device
    phys.set_route(0, 1, 2, None, [])
    phys.stream_in("W", 1, 2, [1.0])
    phys.set_route(0, 1, 2, Port.W, [Port.E])
    phys.set_route(1, 1, 2, Port.W, [Port.RAMP])
    with pytest.raises(FabricHang, match=r"PE \(1, 1\) is dead"):
        phys.run(max_cycles=200)


def test_memory_copies_launches_and_counters_are_logical():
    remap = _remap("0,2;3,0;4,4")
    device = _golden(remap)(FabricConfig(width=remap.width, height=remap.height))
    w, h = remap.width, remap.height
    data = np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3)
    device.memcpy_h2d(10, data)
    assert np.array_equal(device.memcpy_d2h(10, 3), data)
    assert np.array_equal(device.memcpy_d2h(10, 3, (1, 1, 2, 3)), data[1:4, 1:3])
    px, py = remap.physical(w - 1, h - 1)
    assert device.device.memcpy_d2h(10, 3, (px, py, 1, 1))[0, 0].tolist() == data[-1, -1].tolist()
    assert device.counters()["pe"]["fmac"].shape == (h, w)
    with pytest.raises(UsageError, match="outside"):
        device.registers(w, 0)


def test_a_color_that_must_cross_a_spare_router_both_ways_is_refused():
    remap = _remap("1,0", 3, 1)
    assert (remap.width, remap.height) == (2, 1)
    device = _golden(remap)(FabricConfig(width=2, height=1))
    device.load_routes([(0, 0, 5, Port.RAMP, [Port.E]), (1, 0, 6, Port.RAMP, [Port.W])])  # two colors: fine
    with pytest.raises(DefectError, match=r"color 5 would cross the spare router \(1, 0\) both ways"):
        device.load_routes([(1, 0, 5, Port.RAMP, [Port.W])])


@pytest.mark.parametrize("spec,expected", [
    ("random:0.7,1", "random:FRACTION,SEED"), ("random:0.1", "random:FRACTION,SEED"),
    ("random:x,1", "random:FRACTION,SEED"), ("9,0", r"PE \(9, 0\) is outside the 6x6 mesh"),
    ("5,0,E", r"router \(5, 0\) has no neighbour toward E"), ("1,2,Q", "X,Y\\[,PORT\\]"),
    ("no-such-file", "X,Y\\[,PORT\\]"), ("0,0;0,1;0,2;0,3;0,4;0,5;1,0;2,0;3,0;4,0;5,0;1,1", None),
])
def test_bad_defect_specs_exit_2_with_one_line(spec, expected, capsys):
    if expected is None:                       # a map that leaves something is fine
        assert _remap(spec).width * _remap(spec).height == 20      # row 0, column 0 and a line for (1, 1)
        return
    assert wse_main(["kernel", "gemv", "--mesh", "6x6", "--defects", spec]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--defects" in err and __import__("re").search(expected, err)


def test_a_defect_file_and_a_mesh_left_empty(tmp_path, capsys):
    path = tmp_path / "defects.txt"
    path.write_text("# dead parts\n1,1\n2,3,S   # a link\n")
    assert _remap(str(path)).describe().startswith(f"defects {path} on the 6x6 mesh: 1 dead PE(s) (1,1)")
    path.write_text("1,1\noops\n")
    with pytest.raises(DefectError, match=r"each line must be X,Y or X,Y,PORT \(PORT N, E, S or W\), not .oops."):
        _remap(str(path))
    with pytest.raises(DefectError, match="no usable mesh is left"):
        _remap("0,0,S", 1, 2)


def _mlp(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 5))


def _defect_backend(spec, mesh=(6, 6), backend="golden"):
    settings = types.SimpleNamespace(defects=spec, mesh_shape=mesh, mesh="x".join(map(str, mesh)), backend=backend)
    return runtime_backend(settings)


@pytest.mark.parametrize("mode", ["weight_streaming", "pipelined"])
def test_a_training_step_around_dead_pes_equals_the_perfect_usable_mesh(mode):
    spec = "2,1;4,4"
    remap = _remap(spec)
    assert (remap.width, remap.height) == (5, 5)
    model = _mlp(1)
    opt = OptimizerConfig("sgd", lr=0.1, momentum=0.9)
    exe = compile_model(model, torch.zeros(8, 12), config=FabricConfig(width=5, height=5), batch=8,
                        mode=mode, optimizer=opt)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8)
    perfect, defective = Runtime(exe, "golden"), Runtime(exe, _defect_backend(spec))
    for rt in (perfect, defective):
        if rt.resident:
            rt.write_state(weights)
    for _ in range(2):
        a = perfect.train_step(x, y, None if perfect.resident else weights)
        b = defective.train_step(x, y, None if defective.resident else weights)
        assert a.logits.tobytes() == b.logits.tobytes() and a.loss == b.loss
        assert set(a.grads) == set(b.grads) and all(a.grads[k].tobytes() == b.grads[k].tobytes() for k in a.grads)
    if perfect.resident:
        (pa, ma), (pb, mb) = perfect.read_state(), defective.read_state()
        assert all(pa[k].tobytes() == pb[k].tobytes() and ma[k].tobytes() == mb[k].tobytes() for k in pa)


def test_wse_train_with_two_percent_dead_pes_runs_end_to_end(tmp_path, capsys):
    from wse.host.appliance.cli import main

    out = tmp_path / "run"
    assert main(["examples/fc_mnist.py", "--mesh", "16x16", "--defects", "random:0.02,1", "--max-steps", "2",
                 "--out", str(out), "--progress", "none", "--no-tensorboard", "--no-train-eval"]) == 0
    text = capsys.readouterr().out
    assert "5 dead PE(s)" in text and "usable mesh 13x14 of 16x16" in text
    assert "functional backend computes the usable mesh's executable" in text
    assert main(["examples/fc_mnist.py", "--mesh", "16x16", "--defects", "random:2,1", "--out",
                 str(tmp_path / "bad")]) == 2
    assert "--defects must be random:FRACTION,SEED" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def test_a_defect_device_refuses_a_map_of_another_mesh():
    remap = _remap("1,1")
    with pytest.raises(DefectError, match="for a 6x6 mesh"):
        DefectDevice(Fabric(FabricConfig(width=4, height=4)), remap)
    with pytest.raises(DefectError, match="leave a 5x6 mesh, not 4x4"):
        _golden(remap)(FabricConfig(width=4, height=4))


def test_the_static_check_runs_on_the_physical_routes():
    from wse.firmware.deadlock import DeadlockError, load_checked

    remap = _remap("1,1", 3, 2)                     # the logical 2x2: physical columns 0 and 2, column 1 spare
    assert remap.cols == (0, 2) and remap.rows == (0, 1)
    device = _golden(remap)(FabricConfig(width=remap.width, height=remap.height))
    checked = []
    device.check_remapped = lambda routes, **kw: checked.append(DefectDevice.check_remapped(device, routes, **kw))
    loop = [(0, 0, 5, Port.S, [Port.E]), (1, 0, 5, Port.W, [Port.S]), (1, 1, 5, Port.N, [Port.W]),
            (0, 1, 5, Port.E, [Port.N])]
    with pytest.raises(DeadlockError, match=r"planted loop \(around the defects\) can deadlock: .*router \(0, 0\) color 5 -> router \(1, 0\) color 5"):
        DefectDevice.check_remapped(device, loop, what="the planted loop")
    line = [(0, 0, 5, Port.RAMP, [Port.E]), (1, 0, 5, Port.W, [Port.RAMP])]
    load_checked(device, device.config, line, "a line")
    assert checked and checked[0].what == "a line (around the defects)" and checked[0].channels > 4


def test_a_runs_own_defect_backend_is_not_offered_by_name():
    from wse.host.runtime import _backend_class
    from wse.sim.devices import device_names

    name = _defect_backend("1,1", mesh=(3, 3))
    assert name not in device_names()
    with pytest.raises(UsageError) as err:
        make_device("fpga")
    assert name not in str(err.value) and "golden" in str(err.value)
    with pytest.raises(UsageError) as err:
        _backend_class("fpga")
    assert name not in str(err.value) and "functional" in str(err.value)
