"""Layer-pipelined training on the RTL: whole training steps (forward, backward
and the on-PE optimizer, a batch in two passes) on the Verilator backend equal
the functional model bit for bit (losses, logits, every parameter and momentum
buffer read back from PE memory) and the static cycle model phase for phase;
Icarus in the slow suite."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import phase_cycles
from wse.host.memoryx.optim import OptimizerConfig
from wse.host.runtime.pipelined import PipelinedDevice, PipelinedFunctional

icarus = pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("backend", ["verilator", pytest.param("icarus", marks=[icarus, pytest.mark.slow])])
def test_training_steps_on_the_rtl_equal_functional_and_static_cycles(backend):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = OptimizerConfig("sgd", lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)
    p = plan(trace(model, torch.zeros(1, 6)), FabricConfig(width=3, height=3), 3, optimizer)
    dev = PipelinedDevice(p, backend)
    dev.write_weights(weights)
    fn = PipelinedFunctional(p, weights)
    expected = phase_cycles(p)
    rng = np.random.default_rng(4)
    for step in range(2):
        x = rng.standard_normal((5, 6)).astype(np.float32)   # 5 samples: passes of 3 and 2 (padded)
        y = rng.integers(0, 3, 5)
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        assert loss == f_loss and np.array_equal(_bits(logits), _bits(f_logits))
        update = "update_first" if step == 0 else "update"
        assert cycles == {"forward": 2 * expected["forward"], "backward_first": expected["backward_first"],
                          "backward": expected["backward"], update: expected[update]}
        params, buffers = dev.read_state()
        assert set(params) == set(fn.params) and set(buffers) == set(fn.state)
        for name in params:
            assert np.array_equal(_bits(params[name]), _bits(fn.params[name])), (step, name)
            assert np.array_equal(_bits(buffers[name]), _bits(fn.state[name])), (step, name)


@pytest.mark.parametrize("backend", ["verilator", pytest.param("icarus", marks=[icarus, pytest.mark.slow])])
@pytest.mark.parametrize("how", [True, "skip"])
def test_harvested_forward_on_the_rtl_equals_functional_and_static_cycles(backend, how):
    """Activation sparsity harvesting on the RTL: (index, value) pairs, only the nonzero
    ones (``True``), or dense sends whose zeros the receivers skip (``"skip"``)."""
    from wse.host.compiler.pipelined_cycles import activation_pattern
    from wse.host.runtime.pipelined import functional_forward
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    p = plan(trace(model, torch.zeros(1, 6)), FabricConfig(width=3, height=3), 4, sparse=how)
    dev = PipelinedDevice(p, backend)
    dev.write_weights(weights)
    x = np.random.default_rng(5).standard_normal((4, 6)).astype(np.float32)
    logits, cycles = dev.forward(x)
    outs = functional_forward(p, weights, x)
    pattern = activation_pattern(p, x, outs)
    assert 0 < sum(int(a.sum()) for a in pattern[1:]) < sum(a.size for a in pattern[1:])   # some zeros skipped
    assert np.array_equal(_bits(logits), _bits(outs[-1]))
    assert cycles == phase_cycles(p, pattern)["forward"]


@pytest.mark.parametrize("backend", ["verilator", pytest.param("icarus", marks=[icarus, pytest.mark.slow])])
def test_replicas_training_on_the_rtl_equals_functional_and_static_cycles(backend):
    """Three copies of a one-layer model, one column each, on the 3x3 mesh: the ``reduce``
    phase (pvop records of several entries, fabric to fabric) on the RTL gives every copy
    the functional model's parameters and momentum, and the static cycle model's cycles."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(5, 4))
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = OptimizerConfig("sgd", lr=0.1, momentum=0.9)
    p = plan(trace(model, torch.zeros(1, 5)), FabricConfig(width=3, height=3), 4, optimizer, replicas=3)
    assert "reduce" in p.phases
    dev = PipelinedDevice(p, backend)
    dev.write_weights(weights)
    fn = PipelinedFunctional(p, weights)
    expected = phase_cycles(p)
    rng = np.random.default_rng(6)
    for step in range(2):
        x = rng.standard_normal((4, 5)).astype(np.float32)
        y = rng.integers(0, 4, 4)
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        assert loss == f_loss and np.array_equal(_bits(logits), _bits(f_logits))
        assert all(c == expected[name] for name, c in cycles.items()) and "reduce" in cycles
        for r in range(3):
            params, buffers = dev.read_state(r)
            for name in params:
                assert np.array_equal(_bits(params[name]), _bits(fn.params[name])), (step, r, name)
                assert np.array_equal(_bits(buffers[name]), _bits(fn.state[name])), (step, r, name)
