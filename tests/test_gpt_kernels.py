"""The GPT functional model's compiled kernels equal the reference operations bit for bit, and a
step split into shards and joined equals the whole step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wse.firmware.training import transformer as ops
from wse.host.compiler.transformer_capture import capture
from wse.host.runtime import transformer_elementwise as te
from wse.host.runtime import transformer_kernels as tk
from wse.host.runtime.transformer_reference import TransformerReference

RNG = np.random.default_rng(7)


def _bits(*shape, awkward: bool = False) -> np.ndarray:
    """Random binary32 patterns; ``awkward`` adds subnormals, tiny values, huge values, zeros,
    infinities and NaN (unflushed: the kernels must flush as the fabric reads them)."""
    a = (RNG.standard_normal(shape) * RNG.choice([1e-3, 1.0, 4.0], shape)).astype(np.float32)
    if awkward:
        flat = a.reshape(-1)
        pick = RNG.random(flat.size)
        flat[pick < 0.05] *= np.float32(1e-38)
        flat[(pick > 0.05) & (pick < 0.07)] = 0.0
        flat[:5] = [np.float32(1e-39), -np.float32(1e-40), np.float32(3e38), -0.0, np.float32(1e-30)]
        if flat.size > 8:
            flat[5:8] = [np.inf, -np.inf, np.nan]
        return a.view(np.uint32)
    return ops.bits(a)


@pytest.mark.parametrize("awkward", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 16])
def test_linear_kernels_equal_reference(awkward, rows):
    x, w, b, dy = _bits(20, 12, awkward=awkward), _bits(7, 12, awkward=awkward), _bits(7), _bits(20, 7, awkward=awkward)
    assert np.array_equal(tk.linear(x, w, b, rows), ops.linear(x, w, b, rows))
    assert np.array_equal(tk.linear(x, w, None, rows), ops.linear(x, w, None, rows))
    assert np.array_equal(tk.linear_input_grad(dy, w, rows), ops.linear_input_grad(dy, w, rows))
    for blocks in (None, [5, 15], [4] * 5):
        for got, want in zip(tk.linear_weight_grad(x, dy, blocks), ops.linear_weight_grad(x, dy, blocks)):
            assert np.array_equal(got, want)
        g, gb = tk.linear_weight_partials(x, dy, blocks)
        want_w, want_b = ops.linear_weight_grad(x, dy, blocks)
        assert np.array_equal(tk.fold(g), want_w) and np.array_equal(tk.fold(gb), want_b)


@pytest.mark.parametrize("awkward", [False, True])
def test_attention_and_embedding_kernels_equal_reference(awkward):
    q, k, v, d = (_bits(6, 9, 4, awkward=awkward) for _ in range(4))
    out, saved = tk.attention(q, k, v, 0.5)
    want, want_saved = ops.attention(q, k, v, 0.5)
    assert np.array_equal(out, want) and np.array_equal(saved["p"], want_saved["p"])
    for got, want in zip(tk.attention_backward(d, q, k, v, saved, 0.5), ops.attention_backward(d, q, k, v, saved, 0.5)):
        assert np.array_equal(got, want)
    dx, index = _bits(40, 6, awkward=awkward), RNG.integers(0, 9, 40)
    assert np.array_equal(tk.embedding_rows_grad(dx, index, 9), ops.embedding_rows_grad(dx, index, 9))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("awkward", [False, True])
def test_gelu_kernels_equal_reference(approximate, awkward):
    x = (RNG.standard_normal(4000) * RNG.choice([1e-30, 1e-3, 1.0, 5.0, 1e5], 4000)).astype(np.float32)
    if awkward:           # beyond the vectorized loops' range: the exact scalar loops run
        x[:4] = [np.float32(1e-39), np.float32(3e7), -np.float32(3e30), np.float32(-1e-40)]
    xb, dy = x.view(np.uint32), _bits(4000)
    assert np.array_equal(te.gelu(xb, approximate), ops.gelu(xb, approximate))
    assert np.array_equal(te.gelu_backward(dy, xb, approximate), ops.gelu_backward(dy, xb, approximate))


@pytest.mark.parametrize("rows", [1, 4, 16])
def test_softmax_layernorm_and_loss_delta_equal_reference(rows):
    scores = ops.bits((RNG.standard_normal((5, 12, 12)) * 6).astype(np.float32))
    p, dp = te.causal_softmax(scores), _bits(5, 12, 12)
    assert np.array_equal(p, ops.causal_softmax(scores))
    assert np.array_equal(te.causal_softmax_backward(p, dp, 0.25), ops.causal_softmax_backward(p, dp, 0.25))
    x, gamma, beta, dy = _bits(30, 32), _bits(32), _bits(32), _bits(30, 32)
    x[0] = 0                                          # a constant token: variance 0, rsqrt(eps)
    y, saved = te.layernorm(x, gamma, beta, 1e-5, rows)
    want_y, want_saved = ops.layernorm(x, gamma, beta, 1e-5, rows)
    assert np.array_equal(y, want_y) and all(np.array_equal(saved[k], want_saved[k]) for k in ("xhat", "r"))
    dx = te.layernorm_input_grad(dy, gamma, saved, rows)
    assert np.array_equal(dx, ops.layernorm_backward(dy, gamma, want_saved, rows)[0])
    logits, targets = _bits(24, 11), RNG.integers(0, 11, 24)
    assert np.array_equal(te.sequence_cross_entropy_delta(logits, targets, 48),
                          ops.sequence_cross_entropy_delta(logits, targets, 48))


def _tiny_gpt():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("_char_gpt_k", Path(__file__).resolve().parents[1] / "examples"
                                                  / "char_gpt.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    torch.manual_seed(3)
    return example.CharGPT(13, layers=1, d_model=16, heads=2, context=8)


def test_shards_joined_equal_the_whole_step():
    model = _tiny_gpt()
    x = RNG.integers(0, 13, (6, 8))
    y = RNG.integers(0, 13, (6, 8))
    graph = capture(model, torch.from_numpy(x))
    params = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    reference = TransformerReference(graph, rows=4, blocks=[16, 16, 8, 8])
    whole = reference.step(params, x, y)
    first = reference.shard(params, x[:4], y[:4], count=48, blocks=[16, 16])
    second = reference.shard(params, x[4:], y[4:], count=48, blocks=[8, 8])
    joined = reference.combine([first, second])
    assert joined.keys() == whole.grads.keys()
    for name, grad in whole.grads.items():
        assert np.array_equal(joined[name].view(np.uint32), grad.view(np.uint32)), name
    assert float(np.mean(np.concatenate([first.losses, second.losses]))) == whole.loss
