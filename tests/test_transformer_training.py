"""The functional model of a transformer training step
(wse.host.runtime.transformer_reference) against PyTorch fp32: the captured
examples/char_gpt.py run with the reference operations in the fabric's
arithmetic, step after step with the same initial weights and data."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wse.config import UsageError
from wse.host.compiler.transformer_capture import capture
from wse.host.data import load_text_corpus
from wse.host.memoryx import MemoryX, OptimizerConfig
from wse.host.runtime.transformer_reference import TransformerReference

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"
#: Per-step losses agree with PyTorch within this relative error.
LOSS_RTOL = 1e-5


def example():
    spec = importlib.util.spec_from_file_location("char_gpt_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiny(attention="manual", seed=0, vocab=None):
    torch.manual_seed(seed)
    corpus = load_text_corpus()
    return example().CharGPT(vocab or corpus.vocab_size, layers=2, d_model=16, heads=2, context=8,
                             attention=attention)


def batches(steps, batch=4, context=8):
    corpus = load_text_corpus()
    x, y = corpus.sequences("train", context)
    order = np.random.default_rng(0).permutation(len(x))[:steps * batch].reshape(steps, batch)
    return [(x[i], y[i]) for i in order]


def torch_step(model, x, y):
    model.zero_grad()
    logits = model(torch.from_numpy(x))
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1))
    loss.backward()
    return loss.item(), {k: p.grad.numpy().copy() for k, p in model.named_parameters()}


def params_of(model):
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def test_gradients_match_pytorch():
    model = tiny()
    (x, y), = batches(1)
    reference = TransformerReference(capture(model, torch.from_numpy(x)))
    step = reference.step(params_of(model), x, y)
    assert np.array_equal(reference.logits(params_of(model), x), step.logits)
    loss, grads = torch_step(model, x, y)
    assert abs(step.loss - loss) <= LOSS_RTOL * loss
    scale = max(float(np.abs(g).max()) for g in grads.values())
    assert set(step.grads) == set(grads)
    for key, g in grads.items():
        assert step.grads[key].shape == g.shape and step.grads[key].dtype == np.float32
        assert float(np.abs(step.grads[key] - g).max()) <= 1e-5 * scale, key


@pytest.mark.parametrize("optimizer, steps", [
    ("sgd", 6), ("adam", 6),
    pytest.param("sgd", 50, marks=pytest.mark.slow), pytest.param("adam", 50, marks=pytest.mark.slow)])
def test_training_steps_match_pytorch(optimizer, steps):
    """``steps`` steps of the same model on the same batches, the weights and
    optimizer in MemoryX (PyTorch's update rules): every step's loss within
    LOSS_RTOL of PyTorch's."""
    model = tiny(seed=1)
    data = batches(steps)
    reference = TransformerReference(capture(model, torch.from_numpy(data[0][0])))
    lr = 0.5 if optimizer == "sgd" else 0.01
    memoryx = MemoryX.from_state_dict(model.state_dict(), OptimizerConfig(optimizer, lr=lr))
    opt = OptimizerConfig(optimizer, lr=lr).build(list(model.parameters()))
    losses = []
    for x, y in data:
        ours = reference.step({name: memoryx.weight(name) for name in memoryx.names()}, x, y)
        theirs, _ = torch_step(model, x, y)
        opt.step()
        memoryx.apply_gradients(ours.grads)
        losses.append((ours.loss, theirs))
    for ours, theirs in losses:
        assert abs(ours - theirs) <= LOSS_RTOL * theirs, losses
    assert losses[-1][1] < losses[0][1]          # it trains


def test_written_out_attention_and_sdpa_give_the_same_bits():
    (x, y), = batches(1)
    steps = []
    for attention in ("manual", "sdpa"):
        model = tiny(attention)
        steps.append(TransformerReference(capture(model, torch.from_numpy(x))).step(params_of(model), x, y))
    assert steps[0].loss == steps[1].loss
    assert np.array_equal(steps[0].logits, steps[1].logits)
    for key in steps[0].grads:
        assert np.array_equal(steps[0].grads[key], steps[1].grads[key]), key


def test_layout_changes_the_order_not_the_result():
    model = tiny()
    (x, y), = batches(1)
    graph = capture(model, torch.from_numpy(x))
    plain = TransformerReference(graph).step(params_of(model), x, y)
    mesh = TransformerReference(graph, rows=4, blocks=[9, 8, 8, 7]).step(params_of(model), x, y)
    assert abs(plain.loss - mesh.loss) <= 1e-6 * plain.loss
    assert not all(np.array_equal(plain.grads[k], mesh.grads[k]) for k in plain.grads)
    with pytest.raises(ValueError, match="do not add up"):
        TransformerReference(graph, blocks=[5]).step(params_of(model), x, y)


def test_bad_arguments():
    model = tiny()
    (x, y), = batches(1)
    with pytest.raises(UsageError, match="has no loss"):
        TransformerReference(capture(model, torch.from_numpy(x), loss=None))
    with pytest.raises(UsageError, match="rows must be a positive integer"):
        TransformerReference(capture(model, torch.from_numpy(x)), rows=0)
    with pytest.raises(UsageError, match="parameters missing: head.bias"):
        params = params_of(model)
        del params["head.bias"]
        TransformerReference(capture(model, torch.from_numpy(x))).step(params, x, y)
