"""Activation sparsity harvesting in the layer-pipelined mode: the layers whose
inputs are ReLU outputs take only the nonzero ones, as (index, value) pairs.
Golden = functional bit for bit, static cycles (given the activation pattern)
= golden cycles, forward and whole training steps; fewer cycles with more zeros."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.firmware.training import pipe_timing
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import activation_pattern, phase_cycles
from wse.host.memoryx.optim import OptimizerConfig
from wse.host.runtime.pipelined import PipelinedDevice, PipelinedFunctional, functional_forward


def _mlp(dims, seed=0, shift=0.0):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*mods[:-1])
    with torch.no_grad():                       # a negative shift: more ReLU zeros
        for m in model:
            if isinstance(m, nn.Linear):
                m.bias -= shift
    return model


def _weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("dims, mesh, batch, shift, depths", [
    ((12, 9, 8, 3), (4, 4), 4, 0.0, {}),
    ((20, 12, 9, 7), (5, 4), 5, 0.3, {}),
    ((30, 16, 10), (6, 6), 3, 1.0, {}),
    ((9, 5, 3), (2, 2), 3, 5.0, {}),                     # every hidden activation zero
    ((17, 11, 13, 5, 4), (4, 4), 3, 0.2, {"rx_depth": 1, "tx_depth": 1, "router_depth": 1}),
])
def test_harvested_forward_golden_equals_functional_and_static_cycles(dims, mesh, batch, shift, depths):
    model = _mlp(dims, seed=3, shift=shift)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **depths)
    p = plan(trace(model, torch.zeros(1, dims[0])), cfg, batch, sparse=True)
    assert p.harvest == (False,) + (True,) * (len(dims) - 2)
    weights = _weights(model)
    x = np.random.default_rng(2).standard_normal((batch, dims[0])).astype(np.float32)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(weights)
    logits, cycles = dev.forward(x)
    outs = functional_forward(p, weights, x)
    assert np.array_equal(_bits(logits), _bits(outs[-1]))
    assert phase_cycles(p, activation_pattern(p, x, outs))["forward"] == cycles
    np.testing.assert_allclose(logits, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_harvested_training_steps_golden_equal_functional():
    model = _mlp((20, 12, 9, 7), seed=1, shift=0.2)
    optimizer = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    p = plan(trace(model, torch.zeros(1, 20)), FabricConfig(width=5, height=4), 3, optimizer, sparse=True)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(_weights(model))
    fn = PipelinedFunctional(p, _weights(model))
    expected = phase_cycles(p)
    assert "forward" not in expected                    # data-dependent: needs the pattern
    rng = np.random.default_rng(4)
    for step in range(2):
        x = rng.standard_normal((5, 20)).astype(np.float32)
        y = rng.integers(0, 7, 5)
        params_before = {k: v.copy() for k, v in fn.params.items()}
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        assert loss == f_loss and np.array_equal(_bits(logits), _bits(f_logits))
        forward = 0
        for start in (0, 3):                            # the passes, padded with zeros as the device pads them
            xb = np.zeros((3, 20), dtype=np.float32)
            xb[:min(3, 5 - start)] = x[start:start + 3]
            forward += phase_cycles(p, activation_pattern(p, xb, functional_forward(p, params_before, xb)))["forward"]
        assert cycles["forward"] == forward and cycles["backward"] == expected["backward"]
        params, buffers = dev.read_state()
        for name in params:
            assert np.array_equal(_bits(params[name]), _bits(fn.params[name])), (step, name)
            assert np.array_equal(_bits(buffers[name]), _bits(fn.state[name])), (step, name)


def test_more_zeros_fewer_cycles_and_the_pattern_is_required():
    model = _mlp((30, 16, 10), seed=2)
    p = plan(trace(model, torch.zeros(1, 30)), FabricConfig(width=6, height=6), 4, sparse=True)
    x = np.random.default_rng(0).standard_normal((4, 30)).astype(np.float32)
    pattern = activation_pattern(p, x, functional_forward(p, _weights(model), x))
    dense = [np.ones_like(a) for a in pattern]
    empty = [a.copy() for a in dense]
    empty[1][:] = False
    c_dense, c_real, c_empty = (phase_cycles(p, q)["forward"] for q in (dense, pattern, empty))
    assert c_dense > c_real > c_empty
    words = np.concatenate(p.phases["forward"][1][0][p.regions[1].x0] + [np.zeros(2, dtype=np.uint32)])
    with pytest.raises(ValueError, match="give their pattern"):
        pipe_timing.pe_ops(words)


def test_a_plan_without_harvesting_keeps_the_dense_records():
    model = _mlp((12, 9, 8, 3))
    g = trace(model, torch.zeros(1, 12))
    dense, sparse = plan(g, FabricConfig(width=4, height=4), 4), plan(g, FabricConfig(width=4, height=4), 4, sparse=True)
    assert dense.harvest == (False, False, False) and "pair" not in dense.memory and "pair" in sparse.memory
    kinds = {pipe_timing.pipe.decode(r)[0] for row in dense.phases["forward"][1] for ops in row for r in ops}
    assert kinds == {"pfwd"}


@pytest.mark.parametrize("dims, mesh, batch, shift, depths", [
    ((12, 9, 8, 3), (4, 4), 4, 0.0, {}),
    ((20, 12, 9, 7), (5, 4), 5, 0.3, {}),
    ((9, 5, 3), (2, 2), 3, 5.0, {}),                     # every hidden activation zero
    ((17, 11, 13, 5, 4), (4, 4), 3, 0.2, {"rx_depth": 1, "tx_depth": 1, "router_depth": 1}),
    ((5, 7, 6, 3), (7, 7), 3, 0.1, {}),                  # input blocks of one and two words, both colors
])
def test_receiver_side_skipping_equals_the_pairs_bit_for_bit(dims, mesh, batch, shift, depths):
    """``sparse="skip"``: dense sends, the receivers skip the zeros; the same bits as the
    pairs (and so as the functional model), static cycles = golden cycles."""
    model = _mlp(dims, seed=5, shift=shift)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **depths)
    graph = trace(model, torch.zeros(1, dims[0]))
    p, pairs = plan(graph, cfg, batch, sparse="skip"), plan(graph, cfg, batch, sparse=True)
    assert p.harvest == pairs.harvest == (False,) + (True,) * (len(dims) - 2)
    weights = _weights(model)
    x = np.random.default_rng(7).standard_normal((batch, dims[0])).astype(np.float32)
    logits, cycles = _forward_on(p, weights, x)
    pair_logits, _ = _forward_on(pairs, weights, x)
    outs = functional_forward(p, weights, x)
    assert np.array_equal(_bits(logits), _bits(outs[-1])) and np.array_equal(_bits(logits), _bits(pair_logits))
    assert phase_cycles(p, activation_pattern(p, x, outs))["forward"] == cycles


def _forward_on(p, weights, x):
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(weights)
    return dev.forward(x)


def test_receiver_side_skipping_trains_as_the_dense_plan():
    """Two training steps with momentum in two passes: golden = functional, static cycles =
    golden cycles, and (on these activations) the same bits as the dense plan."""
    model = _mlp((20, 12, 9, 7), seed=1, shift=0.2)
    optimizer = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    graph = trace(model, torch.zeros(1, 20))
    p = plan(graph, FabricConfig(width=5, height=4), 3, optimizer, sparse="skip")
    dense = PipelinedFunctional(plan(graph, FabricConfig(width=5, height=4), 3, optimizer), _weights(model))
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(_weights(model))
    fn = PipelinedFunctional(p, _weights(model))
    rng = np.random.default_rng(4)
    for _ in range(2):
        x = rng.standard_normal((5, 20)).astype(np.float32)
        y = rng.integers(0, 7, 5)
        params_before = {k: v.copy() for k, v in fn.params.items()}
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        d_loss, d_logits = dense.train_step(x, y)
        assert loss == f_loss == d_loss and np.array_equal(_bits(logits), _bits(f_logits))
        assert np.array_equal(_bits(logits), _bits(d_logits))
        forward = 0
        for start in (0, 3):
            xb = np.zeros((3, 20), dtype=np.float32)
            xb[:min(3, 5 - start)] = x[start:start + 3]
            forward += phase_cycles(p, activation_pattern(p, xb, functional_forward(p, params_before, xb)))["forward"]
        assert cycles["forward"] == forward
    params, buffers = dev.read_state()
    for name in params:
        assert np.array_equal(_bits(params[name]), _bits(fn.params[name]))
        assert np.array_equal(_bits(params[name]), _bits(dense.params[name]))
        assert np.array_equal(_bits(buffers[name]), _bits(fn.state[name]))


def test_sparse_must_be_a_known_mode():
    with pytest.raises(UsageError, match="sparse must be False, True, 'pairs' or 'skip'"):
        plan(trace(_mlp((12, 9, 3)), torch.zeros(1, 12)), FabricConfig(width=4, height=4), 2, sparse="dense")
