"""The compiler's static models on the physical mesh of a defect map (``host/compiler/physical.py``,
``docs/faults.md`` sections 1 and 4): the deadlock check of every training phase's physical route set
(weight streaming and the layer-pipelined mode), a planted cycle on a defective mesh caught, and the
static cycle model on the physical network equal to the golden model's cycles on the defective mesh,
for training phases and for the kernels with a timing mirror."""

from __future__ import annotations

import collections
import types

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, Port, UsageError
from wse.firmware.deadlock import DeadlockError
from wse.firmware.kernels import get_kernel, gelu_timing, layernorm_timing, softmax_timing
from wse.firmware.kernels.spgemm_timing import timing_ops as spgemm_timing_ops
from wse.host.appliance.defects import runtime_backend
from wse.host.compiler import compile_model
from wse.host.compiler.physical import check_on_defects, cycles_on_defects, replay_on_defects
from wse.host.memoryx import OptimizerConfig
from wse.host.runtime import Runtime
from wse.sim.defects import defect_factory, parse_defects, plan_remap
from wse.sim.devices import make_device
from wse.sim.runner import run_kernel

#: Two dead PEs (spare row 1, spare column 4), and a map with dead links of both kinds.
SPECS = ["2,1;4,4", "0,0;5,5;3,2,E;2,4,N"]
OPT = OptimizerConfig("sgd", lr=0.1, momentum=0.9)


def _remap(spec, width=6, height=6):
    return plan_remap(parse_defects(spec, width, height))


def _exe(remap, mode, seed=1):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 5))
    exe = compile_model(model, torch.zeros(8, 12), config=FabricConfig(width=remap.width, height=remap.height),
                        batch=8, mode=mode, optimizer=OPT)
    return exe, model


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("mode", ["weight_streaming", "pipelined"])
def test_every_training_phase_is_deadlock_free_on_the_physical_mesh(spec, mode):
    remap = _remap(spec)
    exe, _ = _exe(remap, mode)
    proofs = check_on_defects(exe, remap)
    names = [n for n in exe.phases if n != "reduce"]
    assert len(proofs) >= len(names) and all(p.what.endswith("(around the defects)") for p in proofs)
    assert all(p.dependencies > 0 for p in proofs)
    if mode == "weight_streaming":      # the column rings, proved at their physical places
        rings = {name for proof in proofs for name, _, _ in proof.rings}
        assert {f"column {j} partial sums" for j in range(exe.layout.columns)} <= rings


def test_a_planted_cycle_on_the_defective_mesh_is_found():
    remap = _remap(SPECS[0])            # physical rows 0, 2, ...; columns 0, 1, 2, 3, 5
    exe, _ = _exe(remap, "weight_streaming")
    free = next(c for c in range(exe.config.colors) if all(r[2] != c for r in exe.routes))
    loop = [(0, 0, free, Port.S, (Port.E,)), (1, 0, free, Port.W, (Port.S,)), (1, 1, free, Port.N, (Port.W,)),
            (0, 1, free, Port.E, (Port.N,))]
    planted = types.SimpleNamespace(**{**vars(exe), "routes": list(exe.routes) + loop})
    # The cycle runs through the spare routers of row 1 that pass the color between logical rows 0 and 1.
    with pytest.raises(DeadlockError, match=rf"\(around the defects\) can deadlock: .*router \(1, 1\) color {free}"):
        check_on_defects(planted, remap)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("mode", ["weight_streaming", "pipelined"])
def test_a_training_step_takes_the_physical_models_cycles_on_the_defective_mesh(mode, spec):
    remap = _remap(spec)
    exe, model = _exe(remap, mode)
    physical = cycles_on_defects(exe, remap)
    settings = types.SimpleNamespace(defects=spec, mesh_shape=(6, 6), mesh="6x6", backend="golden")
    runtime = Runtime(exe, runtime_backend(settings))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    if runtime.resident:
        runtime.write_state(weights)
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((8, 12)).astype(np.float32), rng.integers(0, 5, 8)
    golden = runtime.train_step(x, y, None if runtime.resident else weights).phases
    runs = collections.Counter(exe.sequences["train"])     # a phase run n times reports n runs' cycles
    assert golden == {name: physical[name] * max(runs[name], 1) for name in golden}
    # the spare routers' latency is what the logical model misses
    assert any(physical[name] > exe.phases[name].cycles for name in physical)
    assert all(physical[name] >= exe.phases[name].cycles for name in physical)


def _kernel_case(name, cfg, sizes, seed):
    kernel = get_kernel(name)
    plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
    if name == "spgemm":
        return spgemm_timing_ops(plan, kernel.inputs(plan, np.random.default_rng(seed))["mask"])
    return {"gelu": gelu_timing, "softmax": softmax_timing, "layernorm": layernorm_timing}[name].timing_ops(plan)


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("name, sizes", [
    ("gelu", dict(rows=7, cols=9, variant="tanh")), ("softmax", dict(n=12, variant="backward")),
    ("layernorm", dict(rows=6, cols=10)), ("spgemm", dict(rows=10, cols=8, n=6, sparsity=0.5))])
def test_kernel_cycles_on_the_defective_mesh_equal_the_physical_model(spec, name, sizes):
    remap = _remap(spec)
    cfg = FabricConfig(width=remap.width, height=remap.height)
    golden = defect_factory(lambda c: make_device("golden", c), remap)
    report = run_kernel(name, cfg, 3, device=golden, **sizes)
    assert report["bit_exact"]
    routes, ops, starts, ends, inject = _kernel_case(name, cfg, sizes, 3)
    assert report["cycles"] == replay_on_defects(remap, cfg, routes, ops, starts, ends, inject)


def test_bad_arguments():
    remap = _remap(SPECS[0])
    exe, _ = _exe(remap, "pipelined")
    with pytest.raises(UsageError, match="for a 5x5 mesh, the defects leave 3x4"):
        check_on_defects(exe, _remap("1,1", 4, 4))


def test_a_run_on_a_defective_mesh_is_checked_and_timed_on_the_physical_mesh():
    from wse.host.appliance.defects import defects_text, on_defects

    spec = SPECS[1]
    remap = _remap(spec)
    settings = types.SimpleNamespace(defects=spec, mesh_shape=(6, 6), mesh="6x6", backend="functional")
    for mode in ("weight_streaming", "pipelined"):
        exe, _ = _exe(remap, mode)
        timed = on_defects(exe, settings)
        assert timed is not exe and timed.routes is exe.routes
        assert {n: p.cycles for n, p in timed.phases.items()} == cycles_on_defects(exe, remap)
        assert timed.cycles("train") > exe.cycles("train")
    assert on_defects(exe, types.SimpleNamespace(defects=None)) is exe
    assert "checked for deadlock" in defects_text(settings)
