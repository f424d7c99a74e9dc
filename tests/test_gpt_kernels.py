"""The GPT functional model's compiled kernels equal the reference operations bit for bit, and a
step split into shards and joined equals the whole step."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from wse import numerics as fp
from wse.firmware.training import numerics as fw_numerics
from wse.firmware.training import transformer as ops
from wse.host.compiler.transformer_capture import capture
from wse.host.runtime import kernels
from wse.host.runtime import transformer_elementwise as te
from wse.host.runtime import transformer_kernels as tk
from wse.host.runtime import transformer_loss as tl
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
        g2, gb2, dx = tk.linear_backward(x, dy, w, rows, blocks)
        assert np.array_equal(g2, g) and np.array_equal(gb2, gb)
        assert np.array_equal(dx, ops.linear_input_grad(dy, w, rows))


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_linear_fast_loops_equal_reference(rows):
    """The GEMM loops without flushing (:mod:`transformer_gemm`), taken when every nonzero product
    is at least 2^-102: bit for bit with the reference, a NaN from inf * 0 made canonical."""
    x, w, b, dy = _bits(37, 48), _bits(21, 48), _bits(21), _bits(37, 21)
    x[3, 5], w[2, 5], dy[4, 6] = 0x7F800000, 0, 0xFF800000          # +inf, +0, -inf
    fx, fw, fdy = (ops.floats(a) for a in (x, w, dy))
    assert kernels.fast_is_exact(fw, fx.T, ops.floats(b)) and kernels.fast_is_exact(fw, fdy.T)
    assert kernels.fast_is_exact(fx, fdy.T) and kernels.min_abs_nonzero(fdy) >= kernels.SAFE
    y = tk.linear(x, w, b, rows)
    assert np.array_equal(y, ops.linear(x, w, b, rows)) and np.any(y == 0x7FC00000)
    assert np.array_equal(tk.linear(x, w, None, rows), ops.linear(x, w, None, rows))
    assert np.array_equal(tk.linear_input_grad(dy, w, rows), ops.linear_input_grad(dy, w, rows))
    for blocks in (None, [10, 27], [1] * 37):
        g, gb = tk.linear_weight_partials(x, dy, blocks)
        want_w, want_b = ops.linear_weight_grad(x, dy, blocks)
        assert np.array_equal(tk.fold(g), want_w) and np.array_equal(tk.fold(gb), want_b)
        g2, gb2, dx = tk.linear_backward(x, dy, w, rows, blocks)
        assert np.array_equal(g2, g) and np.array_equal(gb2, gb)
        assert np.array_equal(dx, ops.linear_input_grad(dy, w, rows))
    params = _bits(9, 4, awkward=True)
    assert np.array_equal(tk.flushed(ops.floats(params)), ops.bits(ops.floats(params)))


@pytest.mark.parametrize("infinite", [False, True])
def test_batched_product_fast_loop_equals_reference(infinite):
    """The attention products' loop without flushing: causal zeros in ``a`` skipped while every ``b``
    is finite, not skipped (``0 * inf`` is NaN, made canonical) otherwise."""
    a, b = _bits(3, 10, 10), _bits(3, 10, 6)
    a[:, np.triu_indices(10, 1)[0], np.triu_indices(10, 1)[1]] = 0
    a[0, 0, 0] = 0x80000000                                           # -0
    if infinite:
        b[1, 9, 2] = 0x7F800000
    assert kernels.fast_is_exact(ops.floats(a), ops.floats(b))
    got = tk.batched_product(a, b)
    assert np.array_equal(got, ops._masked_product(a, b))
    assert np.any(got == 0x7FC00000) == infinite


@pytest.mark.parametrize("awkward", [False, True])
def test_block_sums_equal_reference(awkward):
    a, b = _bits(30, 7, awkward=awkward), _bits(30, 7, awkward=awkward)
    for blocks in (None, [3, 20, 7], [1] * 30):
        starts, counts = tk.block_bounds(30, blocks)
        for factor, terms in ((None, a), (b, fp.vmul(a, b))):
            want = np.stack([ops.accumulate(terms[s:s + c], 0) for s, c in zip(starts, counts)])
            assert np.array_equal(tk.block_sums(a, blocks, factor), want)


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


@pytest.mark.parametrize("case", ["fast", "huge", "nonfinite"])
def test_causal_softmax_both_paths_equal_reference(case):
    """The vectorized exps (finite scores of at most 2^20, subnormals flushed as read) and the scalar
    loop (anything else) give the reference's bits."""
    scores = (RNG.standard_normal((4, 9, 9)) * RNG.choice([1e-3, 1.0, 50.0, 1e5], (4, 9, 9))).astype(np.float32)
    scores[0, 3, :4] = [1e-39, -1e-40, -0.0, 2.0 ** 20]
    scores[1, 5, :6] = [-(2.0 ** 20), 2.0 ** 20, 3.0, -1e-45, 0.0, -0.0]
    if case == "huge":
        scores[2, 4, 1] = 3e7
    if case == "nonfinite":
        scores[2, 4, 1], scores[3, 8, 2], scores[3, 2, 0] = np.inf, -np.inf, np.nan
    bits = scores.view(np.uint32)
    assert te._fast(scores.reshape(-1)) == (case == "fast")
    assert np.array_equal(te.causal_softmax(bits), ops.causal_softmax(bits))


@pytest.mark.parametrize("case", ["fast", "huge", "nonfinite"])
def test_loss_delta_both_paths_equal_reference(case):
    logits = (RNG.standard_normal((40, 17)) * RNG.choice([1e-3, 1.0, 30.0, 1e5], (40, 17))).astype(np.float32)
    logits[0, :6] = [1e-39, -1e-40, -0.0, 2.0 ** 20, -(2.0 ** 20), 0.0]
    logits[1] = 0.0                                                     # every class equal
    if case == "huge":
        logits[2, 4] = -3e7
    if case == "nonfinite":
        logits[2, 4], logits[3, 8], logits[5, 2] = np.inf, -np.inf, np.nan
    bits, targets = logits.view(np.uint32), RNG.integers(0, 17, 40)
    assert te._fast(logits.reshape(-1)) == (case == "fast")
    for count in (None, 40, 3000):
        assert np.array_equal(tl.sequence_cross_entropy_delta(bits, targets, count),
                              ops.sequence_cross_entropy_delta(bits, targets, count))


def test_vectorized_exp_equals_reference_on_its_range():
    """:func:`te._exp_fast` is the firmware's ``exp`` on every argument in ``[-2^21, 0]``, near the
    flush to zero and at the ends included."""
    x = np.concatenate([-np.geomspace(1e-30, 2.0 ** 21, 20000), -RNG.uniform(80, 110, 5000),
                        [0.0, -0.0, -(2.0 ** 21), -87.33654, -88.72284, -103.27893, -1e-45]]).astype(np.float32)
    x = ops.floats(ops.bits(x))
    assert np.array_equal(te._exp_fast(x.copy()).view(np.uint32), fw_numerics.exp(x.view(np.uint32)))


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
