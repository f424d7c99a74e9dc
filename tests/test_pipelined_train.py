"""Layer-pipelined training: the backward pass and the optimizer on the PEs.
Golden model = functional model bit for bit over whole steps (parameters and
momentum read back from PE memory), static cycles = golden cycles for every
phase, per-step losses = plain PyTorch fp32 within 1e-6 relative."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import phase_cycles
from wse.host.compiler.weight_streaming import FitError
from wse.host.memoryx.optim import OptimizerConfig
from wse.host.runtime.pipelined import PipelinedDevice, PipelinedFunctional

SGD = OptimizerConfig("sgd", lr=0.1)
MOMENTUM = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
NESTEROV = OptimizerConfig("sgd", lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.01)
DAMPENED = OptimizerConfig("sgd", lr=0.05, momentum=0.5, dampening=0.25, weight_decay=0.001)


def _mlp(dims, seed=0, relu_last=False):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*(mods if relu_last else mods[:-1]))


def _weights(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.mark.parametrize("dims, mesh, batch, n, optimizer, depths", [
    ((6, 5, 4, 3), (3, 3), 3, 7, NESTEROV, {}),
    ((20, 12, 9, 7), (5, 4), 4, 4, MOMENTUM, {}),
    ((30, 16, 10), (6, 6), 3, 5, SGD, {}),
    ((9, 3), (1, 1), 2, 3, DAMPENED, {}),
    ((17, 11, 13, 5, 4), (4, 4), 2, 4, NESTEROV, {"rx_depth": 1, "tx_depth": 1, "router_depth": 1}),
])
def test_training_golden_equals_functional_and_static_cycles(dims, mesh, batch, n, optimizer, depths):
    model = _mlp(dims, seed=1)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **depths)
    p = plan(trace(model, torch.zeros(1, dims[0])), cfg, batch, optimizer)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(_weights(model))
    fn = PipelinedFunctional(p, _weights(model))
    expected = phase_cycles(p)
    rng = np.random.default_rng(4)
    for step in range(3):
        x = rng.standard_normal((n, dims[0])).astype(np.float32)
        y = rng.integers(0, dims[-1], n)
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        assert loss == f_loss and np.array_equal(_bits(logits), _bits(f_logits))
        passes = -(-n // batch)
        for name, c in cycles.items():
            count = {"forward": passes, "backward": passes - 1}.get(name, 1)
            assert c == count * expected[name], name
        params, buffers = dev.read_state()
        for name, value in params.items():
            assert np.array_equal(_bits(value), _bits(fn.params[name])), (step, name)
        assert set(buffers) == (set(fn.state) if optimizer.hyper["momentum"] else set())
        for name, value in buffers.items():
            assert np.array_equal(_bits(value), _bits(fn.state[name])), (step, name)


def _torch_losses(model, optimizer, batches):
    opt = optimizer.build(list(model.parameters()))
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("dims, optimizer, batch, n", [((30, 16, 10), NESTEROV, 4, 8),
                                                       ((64, 32, 10), MOMENTUM, 8, 16),
                                                       ((12, 9, 7, 5), DAMPENED, 5, 5)])
def test_losses_agree_with_pytorch(dims, optimizer, batch, n):
    model = _mlp(dims, seed=2)
    p = plan(trace(model, torch.zeros(1, dims[0])), FabricConfig(width=6, height=6), batch, optimizer)
    fn = PipelinedFunctional(p, _weights(model))
    rng = np.random.default_rng(5)
    batches = [(rng.standard_normal((n, dims[0])).astype(np.float32), rng.integers(0, dims[-1], n))
               for _ in range(8)]
    ours = [fn.train_step(x, y)[0] for x, y in batches]
    np.testing.assert_allclose(ours, _torch_losses(model, optimizer, batches), rtol=1e-6)
    final = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    for name, value in fn.params.items():
        np.testing.assert_allclose(value, final[name], rtol=1e-4, atol=1e-6)


def test_model_ending_in_relu_trains_bit_exact():
    model = _mlp((8, 6, 4), seed=3, relu_last=True)
    p = plan(trace(model, torch.zeros(1, 8)), FabricConfig(width=3, height=3), 3, MOMENTUM)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(_weights(model))
    fn = PipelinedFunctional(p, _weights(model))
    rng = np.random.default_rng(6)
    for _ in range(2):
        x, y = rng.standard_normal((3, 8)).astype(np.float32), rng.integers(0, 4, 3)
        assert dev.train_step(x, y)[0] == fn.train_step(x, y)[0]
    params, _ = dev.read_state()
    assert all(np.array_equal(_bits(v), _bits(fn.params[k])) for k, v in params.items())


def test_resume_from_read_back_state_is_bit_exact():
    model = _mlp((10, 7, 5), seed=4)
    g = trace(model, torch.zeros(1, 10))
    p = plan(g, FabricConfig(width=3, height=3), 4, NESTEROV)
    rng = np.random.default_rng(7)
    batches = [(rng.standard_normal((4, 10)).astype(np.float32), rng.integers(0, 5, 4)) for _ in range(3)]
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(_weights(model))
    for x, y in batches[:2]:
        dev.train_step(x, y)
    params, buffers = dev.read_state()
    resumed = PipelinedDevice(p, "golden")
    resumed.write_weights(params)
    resumed.write_state(buffers)
    assert resumed.train_step(*batches[2])[0] == dev.train_step(*batches[2])[0]
    assert all(np.array_equal(_bits(v), _bits(dev.read_state()[0][k])) for k, v in resumed.read_state()[0].items())


def test_training_plan_refusals():
    g = trace(_mlp((8, 6, 4)), torch.zeros(1, 8))
    with pytest.raises(UsageError, match="runs sgd .* not adam; use --mode weight-streaming"):
        plan(g, FabricConfig(width=3, height=3), 2, OptimizerConfig("adam"))
    with pytest.raises(FitError, match="needs 9 colors but the configuration has colors=8"):
        plan(g, FabricConfig(width=3, height=3, colors=8, tasks=8), 2, SGD)
    plan(g, FabricConfig(width=3, height=3, colors=8, tasks=8), 2)       # evaluation needs 4


def test_fc_mnist_training_memory():
    g = trace(_mlp((784, 256, 256, 10)), torch.zeros(1, 784))
    cfg = FabricConfig(width=16, height=16)
    p = plan(g, cfg, 16, MOMENTUM)
    assert max(addr + words for addr, words in p.memory.values()) <= cfg.sram_words
    assert {"the weight-gradient tile", "the momentum tile"} <= set(p.owners)
    with pytest.raises(FitError, match="sram_words is 8192"):
        plan(g, cfg, 40, MOMENTUM)


@pytest.mark.slow
def test_fc_mnist_50_steps_agree_with_pytorch():
    from wse.host.data.datasets import load_mnist
    x, y = load_mnist("train")
    model = _mlp((784, 256, 256, 10), seed=0)
    p = plan(trace(model, torch.zeros(1, 784)), FabricConfig(width=16, height=16), 22, MOMENTUM)
    fn = PipelinedFunctional(p, _weights(model))
    batches = [(np.ascontiguousarray(x[i * 64:(i + 1) * 64], dtype=np.float32).reshape(64, -1),
                np.asarray(y[i * 64:(i + 1) * 64], dtype=np.int64)) for i in range(50)]
    ours = [fn.train_step(bx, by)[0] for bx, by in batches]          # 3 passes of 22, 22, 20 samples
    np.testing.assert_allclose(ours, _torch_losses(model, MOMENTUM, batches), rtol=1e-6)
    assert ours[-1] < ours[0]


def test_the_relu_mask_goes_to_the_less_loaded_side_of_each_boundary():
    from wse.firmware.training import pipe
    from wse.host.compiler.pipelined_train import mask_at_sender
    p = plan(trace(_mlp((784, 256, 256, 10)), torch.zeros(1, 784)), FabricConfig(width=16, height=16), 4, MOMENTUM)
    assert [mask_at_sender(p.layers, p.regions, l) for l in range(3)] == [False, False, True]
    flags = {}
    for row in p.phases["backward"][1]:
        for records in row:
            for words in records:
                _, f = pipe.decode(words)
                flags.setdefault((f["k"], f["o"]), set()).add((f["mask"], f["xmask"]))
    # fc1's chain ends (65 inputs, 18 outputs) mask what fc2 sends them; fc3's near ends mask for fc2
    assert (1, 0) in flags[(65, 18)] and all(xm == 0 for _, xm in flags[(65, 18)] | flags[(66, 18)])
    assert all(m == 0 for m, _ in flags[(17, 64)] | flags[(18, 64)])
    assert flags[(64, 10)] == {(0, 1)}
