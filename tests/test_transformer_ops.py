"""The transformer's reference operations (wse.firmware.training.transformer)
against PyTorch fp32, forward and backward, and the accuracy of the
transcendentals they use (wse.firmware.training.transcendental).

Tolerance: every result within ``TOL`` of PyTorch's, normwise
(``max |ours - torch| <= TOL * max |torch|``): the orders of the sums differ
from PyTorch's and the transcendentals are within 2 ulp, so the two agree to
a few binary32 roundings, not bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wse import numerics as fp
from wse.firmware.training import transcendental as tr
from wse.firmware.training import transformer as ops

TOL = 2e-6


def close(ours_bits, theirs: torch.Tensor, tol: float = TOL) -> float:
    ours = ops.floats(ours_bits).astype(np.float64)
    ref = theirs.detach().numpy().astype(np.float64)
    assert ours.shape == ref.shape
    err = float(np.max(np.abs(ours - ref))) / max(float(np.max(np.abs(ref))), 1e-30)
    assert err <= tol, f"normwise error {err:.3g} > {tol}"
    return err


def randn(gen, *shape, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).float()


@pytest.mark.parametrize("name", list(tr.ACCURACY))
def test_transcendental_accuracy(name):
    result = tr.measure(name, 100_001)
    assert result["max_ulp"] <= result["bound"], result
    assert result["correctly_rounded"] > 0.6, result


def test_mask_and_select_are_exact():
    d = ops.bits([-3.0, -1e-30, 0.0, -0.0, 1e-37, 2.0, 3e38, -3e38])
    assert ops.floats(tr.mask_positive(d)).tolist() == [0, 0, 0, 0, 1, 1, 1, 0]
    a, b = ops.bits([1.5, -2.0, 7.0]), ops.bits([9.0, 4.0, -1.0])
    m = ops.bits([1.0, 0.0, 1.0])
    assert ops.floats(tr.select(m, a, b)).tolist() == [1.5, 4.0, 7.0]
    assert ops.floats(tr.minimum(ops.bits([3.0, -5.0]), ops.bits([1.0, 1.0]))).tolist() == [1.0, -5.0]


def test_tanh_and_erf_saturate_and_are_odd():
    x = np.array([1e-30, 0.3, 0.7, 2.0, 9.5, 50.0, 3e38], dtype=np.float32)
    for fn, ref in ((tr.tanh, np.tanh), (tr.erf, lambda v: np.array([__import__("math").erf(t) for t in v]))):
        pos, negv = ops.floats(fn(ops.bits(x))), ops.floats(fn(ops.bits(-x)))
        assert np.array_equal(pos, -negv)
        assert np.max(np.abs(pos - ref(x.astype(np.float64)))) < 2e-7


@pytest.mark.parametrize("rows", [1, 3, 4])
def test_linear_forward_and_backward(rows):
    gen = torch.Generator().manual_seed(rows)
    x, w, b = randn(gen, 10, 13), randn(gen, 7, 13, scale=0.3), randn(gen, 7)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    y = F.linear(x, w, b)
    dy = randn(gen, 10, 7)
    y.backward(dy)
    ours = ops.linear(ops.bits(x.detach()), ops.bits(w.detach()), ops.bits(b.detach()), rows)
    close(ours, y)
    close(ops.linear_input_grad(ops.bits(dy), ops.bits(w.detach()), rows), x.grad)
    dw, db = ops.linear_weight_grad(ops.bits(x.detach()), ops.bits(dy), blocks=[4, 3, 3])
    close(dw, w.grad)
    close(db, b.grad)


def test_linear_without_bias_is_the_plain_sum():
    gen = torch.Generator().manual_seed(5)
    x, w = randn(gen, 3, 8), randn(gen, 2, 8)
    ours = ops.floats(ops.linear(ops.bits(x), ops.bits(w)))
    expected = np.zeros((3, 2), dtype=np.float32)
    for k in range(8):
        expected = expected + x.numpy()[:, k:k + 1] * w.numpy()[None, :, k]
    assert np.array_equal(ours, expected)


def test_token_sum_checks_blocks():
    with pytest.raises(ValueError, match="do not add up"):
        ops.token_sum(ops.bits(np.ones((4, 2))), blocks=[2, 1])


@pytest.mark.parametrize("rows", [1, 4])
def test_layernorm_forward_and_backward(rows):
    gen = torch.Generator().manual_seed(11)
    x = (randn(gen, 12, 64) * 3 + 1).requires_grad_()
    gamma, beta = (1 + randn(gen, 64, scale=0.1)).requires_grad_(), randn(gen, 64, scale=0.1).requires_grad_()
    y = F.layer_norm(x, (64,), gamma, beta, 1e-5)
    dy = randn(gen, 12, 64)
    y.backward(dy)
    ours, saved = ops.layernorm(ops.bits(x.detach()), ops.bits(gamma.detach()), ops.bits(beta.detach()),
                                1e-5, rows)
    close(ours, y)
    dx, dgamma, dbeta = ops.layernorm_backward(ops.bits(dy), ops.bits(gamma.detach()), saved, rows, [5, 7])
    close(dx, x.grad, 5e-6)
    close(dgamma, gamma.grad)
    close(dbeta, beta.grad)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_forward_and_backward(approximate):
    gen = torch.Generator().manual_seed(3)
    x = torch.cat([randn(gen, 2000, scale=3.0), torch.tensor([0.0, -0.0, 1e-30, 12.0, -12.0])]).requires_grad_()
    y = F.gelu(x, approximate=approximate)
    dy = randn(gen, x.numel())
    y.backward(dy)
    close(ops.gelu(ops.bits(x.detach()), approximate), y)
    close(ops.gelu_backward(ops.bits(dy), ops.bits(x.detach()), approximate), x.grad)
    with pytest.raises(ValueError, match="approximate"):
        ops.gelu(ops.bits(x.detach()), "sigmoid")


def test_causal_attention_forward_and_backward():
    gen = torch.Generator().manual_seed(7)
    q, k, v = (randn(gen, 6, 9, 16).requires_grad_() for _ in range(3))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    dout = randn(gen, 6, 9, 16)
    out.backward(dout)
    scale = 16 ** -0.5
    ours, saved = ops.attention(ops.bits(q.detach()), ops.bits(k.detach()), ops.bits(v.detach()), scale)
    close(ours, out)
    p = saved["p"]
    assert np.all(ops.floats(p)[:, np.triu_indices(9, 1)[0], np.triu_indices(9, 1)[1]] == 0)
    dq, dk, dv = ops.attention_backward(ops.bits(dout), ops.bits(q.detach()), ops.bits(k.detach()),
                                        ops.bits(v.detach()), saved, scale)
    close(dq, q.grad)
    close(dk, k.grad)
    close(dv, v.grad)


def test_embedding_forward_and_backward():
    gen = torch.Generator().manual_seed(9)
    tok, pos = randn(gen, 11, 8).requires_grad_(), randn(gen, 5, 8).requires_grad_()
    tokens = torch.randint(0, 11, (3, 5), generator=gen)
    positions = torch.arange(5).expand(3, 5)
    x = F.embedding(tokens, tok) + F.embedding(positions, pos)
    dx = randn(gen, 3, 5, 8)
    x.backward(dx)
    ours = ops.embedding(tokens.reshape(-1).numpy(), positions.reshape(-1).numpy(), ops.bits(tok.detach()),
                         ops.bits(pos.detach()))
    assert np.array_equal(ops.floats(ours), x.detach().reshape(15, 8).numpy())
    d_tok, d_pos = ops.embedding_backward(ops.bits(dx.reshape(15, 8)), tokens.reshape(-1).numpy(),
                                          positions.reshape(-1).numpy(), 11, 5)
    close(d_tok, tok.grad)
    close(d_pos, pos.grad)


def test_sequence_cross_entropy_delta():
    gen = torch.Generator().manual_seed(13)
    logits = randn(gen, 40, 30, scale=2.0).requires_grad_()
    targets = torch.randint(0, 30, (40,), generator=gen)
    F.cross_entropy(logits, targets).backward()
    close(ops.sequence_cross_entropy_delta(ops.bits(logits.detach()), targets.numpy()), logits.grad)


def test_residual_is_one_add():
    a, b = ops.bits([1.0, 2.0**-126, -3.0]), ops.bits([2.0, -2.0**-127 * 1.5, 3.0])
    assert ops.residual(a, b).tolist() == fp.vadd(a, b).tolist()


def _loop_outer_sum(a, b):
    total = np.zeros(np.broadcast_shapes(a.shape[1:-1], b.shape[1:-1]) + (a.shape[-1], b.shape[-1]), dtype=np.uint32)
    for k in range(a.shape[0]):
        total = fp.vadd(total, fp.vmul(a[k][..., :, None], b[k][..., None, :]))
    return total


@pytest.mark.parametrize("scale", [1.0, 1e-19, 3e19])
def test_fast_sums_equal_the_step_by_step_loop(scale):
    """accumulate (a float32 cumulative sum) and outer_sum (plain float32 when no
    subnormal can arise) give the bits of one fabric add after another, also
    where partial sums would be subnormal (flushed) or overflow."""
    rng = np.random.default_rng(int(scale > 1) + 2 * int(scale < 1))
    a = ops.bits((rng.standard_normal((9, 3, 5)) * scale).astype(np.float32))
    b = ops.bits((rng.standard_normal((9, 3, 4)) * scale).astype(np.float32))
    outer = ops.outer_sum(a, b)
    assert outer.shape == (3, 5, 4) and np.array_equal(outer, _loop_outer_sum(a, b))
    terms = fp.vmul(a[..., :, None], b[..., None, :])
    loop = np.zeros(terms.shape[1:], dtype=np.uint32)
    for term in terms:
        loop = fp.vadd(loop, term)
    assert np.array_equal(ops.accumulate(terms, 0), loop)
    zeros = ops.bits(np.array([[-0.0, -0.0], [-0.0, 0.0], [-0.0, -0.0]], dtype=np.float32))
    assert ops.accumulate(zeros, 0).tolist() == [0, 0]            # +0 + -0 + -0 = +0
