"""Reference operations of a decoder-only transformer in the fabric's binary32
arithmetic, forward and backward, each in one fixed order of float operations.

These are the functional model the transformer's fabric mapping must match
bit for bit, as :mod:`.numerics` is for the MLP's softmax: every value is a
binary32 bit pattern (``uint32`` arrays), every operation is one of
:mod:`wse.numerics` (flush-to-zero, never fused) or a function of
:mod:`.transcendental`, and each docstring writes the order out. The same
orders are written down in ``docs/transformer.md`` section 3.

Shapes: activations are token-major ``[N, D]`` (``N`` tokens of a batch of
sequences laid end to end, sequence after sequence); attention works on
``[S, T, Dh]`` per sequence-and-head ``S``, ``T`` positions, head width ``Dh``.

Two layout parameters fix the orders that depend on where values live on the
fabric: ``rows`` (``H``: feature ``k`` lives on row ``k mod H``, as in the
streamed GEMM) and ``blocks`` (the tokens held by each column, in column
order, as the weight gradients reduce them). ``rows=1`` and one block give
plain sequential orders.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from wse import numerics as fp

from .numerics import exp, reciprocal, softmax_delta
from .transcendental import const, erf, neg, rsqrt, tanh

__all__ = ["GELU_MODES", "GELU_CONSTANTS", "accumulate", "outer_sum", "linear", "linear_input_grad", "linear_weight_grad", "token_sum", "feature_sum",
           "layernorm", "layernorm_backward", "gelu", "gelu_backward", "attention", "attention_backward", "causal_softmax",
           "causal_softmax_backward",
           "embedding", "embedding_rows_grad", "embedding_backward", "residual", "sequence_cross_entropy_delta", "bits", "floats"]

_ZERO, _NZERO, _ONE, _HALF = 0x00000000, 0x80000000, 0x3F800000, 0x3F000000
_SQRT1_2 = 0x3F3504F3            # binary32(1/sqrt(2))
_INV_SQRT_2PI = 0x3ECC422A       # binary32(1/sqrt(2 pi))
_SQRT_2_PI = 0x3F4C422A          # binary32(sqrt(2/pi))
_GELU_C = 0x3D372713             # binary32(0.044715)
_GELU_3C = 0x3E095D4F            # binary32(3 * 0.044715)

#: GELU forms, as ``nn.GELU(approximate=...)`` names them.
GELU_MODES = ("none", "tanh")

#: The GELUs' binary32 constants (bit patterns) by the names the PE programs use
#: (``firmware/kernels/gelu.s``).
GELU_CONSTANTS = {"GELU_SQRT1_2": _SQRT1_2, "GELU_INV_SQRT_2PI": _INV_SQRT_2PI, "GELU_SQRT_2_PI": _SQRT_2_PI,
                  "GELU_C": _GELU_C, "GELU_3C": _GELU_3C}


def bits(values) -> np.ndarray:
    """float32 values as binary32 patterns (``uint32``), flushed as the fabric reads them."""
    return fp.vftz(fp.as_bits(values))


def floats(patterns) -> np.ndarray:
    """binary32 patterns as float32 values (a copy)."""
    return fp.as_float(patterns).copy()


def _zeros(shape) -> np.ndarray:
    return np.zeros(shape, dtype=np.uint32)


def _u32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.uint32)


def accumulate(terms, axis: int = -1) -> np.ndarray:
    """``+0 + terms[0] + terms[1] + ...`` along ``axis``, one ``add`` after another
    (the fabric's rules, bit for bit).

    Runs as a float32 cumulative sum, which rounds after every step in order;
    it equals the sequence started from ``+0`` except that an all-``-0`` sum is
    ``+0`` (one final ``add(s, +0)``). Where a partial sum would be subnormal
    (the fabric flushes it) or not finite, it falls back to the step-by-step loop.
    """
    terms = np.ascontiguousarray(np.moveaxis(_u32(terms), axis, 0))
    if terms.shape[0] == 0:
        return _zeros(terms.shape[1:])
    if np.any(((terms & 0x7F800000) == 0) & ((terms & 0x007FFFFF) != 0)):
        terms = fp.vftz(terms)
    with np.errstate(all="ignore"):
        partial = np.cumsum(terms.view(np.float32), axis=0, dtype=np.float32)
    pattern = partial.view(np.uint32)
    if np.all(np.isfinite(partial)) and not np.any(((pattern & 0x7F800000) == 0) & ((pattern & 0x007FFFFF) != 0)):
        return fp.vadd(pattern[-1], const(_ZERO))
    total = _zeros(terms.shape[1:])
    for term in terms:
        total = fp.vadd(total, term)
    return total


def _smallest_magnitude(values: np.ndarray) -> float:
    """The smallest nonzero ``|value|`` (``inf`` if none), or ``nan`` if a value is not finite."""
    f = values.view(np.float32)
    if not np.all(np.isfinite(f)):
        return math.nan
    nonzero = np.abs(f[f != 0])
    return float(nonzero.min()) if nonzero.size else math.inf


def outer_sum(a, b) -> np.ndarray:
    """``+0 + mul(a[0], b[0]) + mul(a[1], b[1]) + ...`` of outer products:
    ``a [K, ..., I]`` and ``b [K, ..., J]`` give ``[..., I, J]``, one ``add`` after
    another in ``k`` order (the fabric's rules, bit for bit).

    When every nonzero product is at least ``2^-102`` in magnitude (checked on
    the smallest operands), every product and partial sum is a multiple of
    ``2^-125``, hence zero or normal, so plain float32 arithmetic is exact to
    the fabric's; it runs in place, one ``k`` at a time. Otherwise (or if a
    value is not finite) it is :func:`accumulate` of the flushed products.
    """
    a, b = fp.vftz(_u32(a)), fp.vftz(_u32(b))
    lo_a, lo_b = _smallest_magnitude(a), _smallest_magnitude(b)
    if lo_a * lo_b >= 2.0 ** -101:       # nan fails the test
        fa, fb = a.view(np.float32), b.view(np.float32)
        acc = np.zeros(np.broadcast_shapes(fa.shape[1:-1], fb.shape[1:-1]) + (fa.shape[-1], fb.shape[-1]),
                       dtype=np.float32)
        product = np.empty_like(acc)
        with np.errstate(over="ignore", invalid="ignore"):
            for k in range(fa.shape[0]):
                np.multiply(fa[k][..., :, None], fb[k][..., None, :], out=product)
                acc += product
        if np.all(np.isfinite(acc)):
            return acc.view(np.uint32)
    return accumulate(fp.vmul(a[..., :, None], b[..., None, :]), 0)


# ---------------------------------------------------------------------------
# the streamed GEMM and its gradients (docs/weight_streaming.md sections 5, 6)

def linear(x, w, b=None, rows: int = 1) -> np.ndarray:
    """``y[t, o] = sum_k x[t, k] W[o, k] + b[o]`` in the streamed GEMM's order.

    With ``H = rows`` and ``s = (o mod H) + 1 mod H``::

        P_i = +0; P_i = add(P_i, mul(x[t, k], W[o, k]))  for k = i, i+H, ...   (each row i)
        y   = add(P_s, b[o])          (b = -0 without a bias: exact identity)
        y   = add(y, P_q)             for q = s+1, ..., o mod H (cyclic)
    """
    x, w = _u32(x), _u32(w)
    n, k_in = x.shape
    outs = w.shape[0]
    xt, wt = x.T, w.T            # [K, N], [K, O]: the contracted index first
    partial = [outer_sum(xt[i::rows], wt[i::rows]) if i < k_in else _zeros((n, outs)) for i in range(rows)]
    bias = _u32(b) if b is not None else np.full(outs, _NZERO, dtype=np.uint32)
    y = _zeros((n, outs))
    for home in range(rows):
        cols = np.arange(home, outs, rows)
        start = (home + 1) % rows
        acc = fp.vadd(partial[start][:, cols], bias[None, cols])
        for step in range(1, rows):
            acc = fp.vadd(acc, partial[(start + step) % rows][:, cols])
        y[:, cols] = acc
    return y


def linear_input_grad(dy, w, rows: int = 1) -> np.ndarray:
    """``dx = dy W`` as the streamed GEMM with ``W`` transposed and no bias (:func:`linear`'s order)."""
    return linear(dy, _u32(w).T, None, rows)


def token_sum(terms, blocks: Sequence[int] | None = None) -> np.ndarray:
    """Reduce ``terms[t, ...]`` over tokens as the weight gradients do: per column
    ``j`` holding tokens ``t0 .. t1``, ``G_j = +0 + terms[t0] + ... + terms[t1]``
    (in token order); along the row ``((+0 + G_0) + G_1) + ...``."""
    terms = _u32(terms)
    blocks = list(blocks) if blocks is not None else [terms.shape[0]]
    if sum(blocks) != terms.shape[0]:
        raise ValueError(f"token blocks {blocks} do not add up to {terms.shape[0]} tokens")
    total, start = _zeros(terms.shape[1:]), 0
    for size in blocks:
        total = fp.vadd(total, accumulate(terms[start:start + size], 0))
        start += size
    return total


def linear_weight_grad(x, dy, blocks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``dW[o, k] = sum_t dy[t, o] x[t, k]`` and ``db[o] = sum_t dy[t, o]``, each
    product ``mul(x[t, k], dy[t, o])`` reduced by :func:`token_sum`."""
    x, dy = _u32(x), _u32(dy)
    blocks = list(blocks) if blocks is not None else [x.shape[0]]
    if sum(blocks) != x.shape[0]:
        raise ValueError(f"token blocks {blocks} do not add up to {x.shape[0]} tokens")
    total, start = _zeros((dy.shape[1], x.shape[1])), 0
    for size in blocks:
        total = fp.vadd(total, outer_sum(dy[start:start + size], x[start:start + size]))
        start += size
    return total, token_sum(dy, blocks)


# ---------------------------------------------------------------------------
# LayerNorm

def feature_sum(v, rows: int = 1) -> np.ndarray:
    """Reduce ``v[t, k]`` over features: each row ``i`` sums its features in
    order, ``P_i = +0 + v[t, i] + v[t, i+H] + ...``; then a chain down the
    column, ``((+0 + P_0) + P_1) + ... + P_{H-1}``. Returns ``[N]``."""
    v = _u32(v)
    total = _zeros(v.shape[0])
    for i in range(rows):
        total = fp.vadd(total, accumulate(v.T[i::rows], 0))
    return total


def _inverse_count(d: int) -> np.ndarray:
    return const(fp.f2b(1.0 / d))


def layernorm(x, gamma, beta, eps: float = 1e-5, rows: int = 1) -> tuple[np.ndarray, dict]:
    """LayerNorm over the feature dimension; returns ``(y, saved)`` for the backward pass::

        mean = mul(feature_sum(x), 1/D);  xc = sub(x, mean)
        var  = mul(feature_sum(mul(xc, xc)), 1/D)
        r    = rsqrt(add(var, eps));  xhat = mul(xc, r)
        y    = add(mul(xhat, gamma), beta)

    ``1/D`` and ``eps`` are binary32 constants (``1/D`` exact for a power of two).
    """
    x = _u32(x)
    inv_d = _inverse_count(x.shape[1])
    mean = fp.vmul(feature_sum(x, rows), inv_d)
    xc = fp.vsub(x, mean[:, None])
    var = fp.vmul(feature_sum(fp.vmul(xc, xc), rows), inv_d)
    r = rsqrt(fp.vadd(var, const(fp.f2b(eps))))
    xhat = fp.vmul(xc, r[:, None])
    y = fp.vadd(fp.vmul(xhat, _u32(gamma)[None, :]), _u32(beta)[None, :])
    return y, {"xhat": xhat, "r": r}


def layernorm_backward(dy, gamma, saved: dict, rows: int = 1,
                       blocks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dx, dgamma, dbeta)`` of :func:`layernorm`::

        dgamma = token_sum(mul(dy, xhat));  dbeta = token_sum(dy)
        g  = mul(dy, gamma)
        a  = mul(feature_sum(g), 1/D);  c = mul(feature_sum(mul(g, xhat)), 1/D)
        dx = mul(sub(sub(g, a), mul(xhat, c)), r)
    """
    dy = _u32(dy)
    xhat, r = saved["xhat"], saved["r"]
    dgamma = token_sum(fp.vmul(dy, xhat), blocks)
    dbeta = token_sum(dy, blocks)
    inv_d = _inverse_count(dy.shape[1])
    g = fp.vmul(dy, _u32(gamma)[None, :])
    a = fp.vmul(feature_sum(g, rows), inv_d)
    c = fp.vmul(feature_sum(fp.vmul(g, xhat), rows), inv_d)
    dx = fp.vmul(fp.vsub(fp.vsub(g, a[:, None]), fp.vmul(xhat, c[:, None])), r[:, None])
    return dx, dgamma, dbeta


# ---------------------------------------------------------------------------
# GELU

def _check_gelu(approximate: str) -> None:
    if approximate not in GELU_MODES:
        raise ValueError(f"GELU approximate must be one of {GELU_MODES}, not {approximate!r}")


def _gelu_tanh_inner(x: np.ndarray) -> np.ndarray:
    x3 = fp.vmul(fp.vmul(x, x), x)
    return fp.vmul(fp.vadd(x, fp.vmul(x3, const(_GELU_C))), const(_SQRT_2_PI))


def gelu(x, approximate: str = "none") -> np.ndarray:
    """GELU, elementwise::

        none: y = mul(mul(x, 0.5), add(1, erf(mul(x, 1/sqrt2))))
        tanh: u = mul(add(x, mul(mul(mul(x, x), x), 0.044715)), sqrt(2/pi))
              y = mul(mul(x, 0.5), add(1, tanh(u)))
    """
    _check_gelu(approximate)
    x = _u32(x)
    if approximate == "none":
        f = erf(fp.vmul(x, const(_SQRT1_2)))
    else:
        f = tanh(_gelu_tanh_inner(x))
    return fp.vmul(fp.vmul(x, const(_HALF)), fp.vadd(const(_ONE), f))


def gelu_backward(dy, x, approximate: str = "none") -> np.ndarray:
    """``dx`` of :func:`gelu` (``x`` is the forward input), elementwise::

        none: phi = mul(exp(neg(mul(mul(x, x), 0.5))), 1/sqrt(2 pi))
              d   = add(mul(add(1, erf(mul(x, 1/sqrt2))), 0.5), mul(x, phi))
        tanh: t   = tanh(u);  s = sub(1, mul(t, t))
              du  = mul(add(1, mul(mul(x, x), 3*0.044715)), sqrt(2/pi))
              d   = add(mul(add(1, t), 0.5), mul(mul(mul(x, 0.5), s), du))
        dx = mul(dy, d)
    """
    _check_gelu(approximate)
    x = _u32(x)
    if approximate == "none":
        phi = fp.vmul(exp(neg(fp.vmul(fp.vmul(x, x), const(_HALF)))), const(_INV_SQRT_2PI))
        cdf = fp.vmul(fp.vadd(const(_ONE), erf(fp.vmul(x, const(_SQRT1_2)))), const(_HALF))
        d = fp.vadd(cdf, fp.vmul(x, phi))
    else:
        t = tanh(_gelu_tanh_inner(x))
        s = fp.vsub(const(_ONE), fp.vmul(t, t))
        du = fp.vmul(fp.vadd(const(_ONE), fp.vmul(fp.vmul(x, x), const(_GELU_3C))), const(_SQRT_2_PI))
        d = fp.vadd(fp.vmul(fp.vadd(const(_ONE), t), const(_HALF)),
                    fp.vmul(fp.vmul(fp.vmul(x, const(_HALF)), s), du))
    return fp.vmul(_u32(dy), d)


# ---------------------------------------------------------------------------
# causal self-attention, per sequence-and-head

def attention(q, k, v, scale: float) -> tuple[np.ndarray, dict]:
    """Causal attention of ``q, k, v`` (``[S, T, Dh]``); returns ``(out, saved)``.

    For each query position ``i`` only keys ``j <= i`` exist (the mask is the loop
    bound, nothing is computed for ``j > i``; their probabilities are exactly 0)::

        s[i, j] = mul(dot_d(q[i, d], k[j, d]), scale)       dot: +0, then add(mul) for d = 0 .. Dh-1
        m  = s[i, 0]; m = max(m, s[i, j]) for j = 1 .. i
        e  = exp(sub(s[i, j], m));  Z = e[i, 0]; Z = add(Z, e[i, j]) for j = 1 .. i
        p  = mul(e, reciprocal(Z))                           (Z >= 1: the maximum's term is 1)
        out[i, d] = +0; out = add(out, mul(p[i, j], v[j, d])) for j = 0 .. i
    """
    q, k, v = _u32(q), _u32(k), _u32(v)
    seqs, t_len, dh = q.shape
    scores = fp.vmul(_masked_product(q, np.swapaxes(k, 1, 2)), const(fp.f2b(scale)))
    p = causal_softmax(scores)
    return _masked_product(p, v), {"p": p}


def causal_softmax(scores) -> np.ndarray:
    """The causal softmax of ``scores`` ``[S, T, T]`` (query, key) over keys ``j <= i``;
    ``p`` is ``+0`` above the diagonal::

        m = s[i, 0]; m = max(m, s[i, j]) for j = 1 .. i
        e = exp(sub(s[i, j], m));  Z = e[i, 0]; Z = add(Z, e[i, j]) for j = 1 .. i
        p = mul(e, reciprocal(Z))
    """
    scores = _u32(scores)
    t_len = scores.shape[-1]
    causal = np.tril(np.ones((t_len, t_len), dtype=bool))
    m = scores[:, :, 0].copy()
    for j in range(1, t_len):
        m = np.where(causal[:, j][None, :], fp.vmax(m, scores[:, :, j]), m).astype(np.uint32)
    e = exp(np.where(causal[None], fp.vsub(scores, m[:, :, None]), _NZERO).astype(np.uint32))
    e = np.where(causal[None], e, _ZERO).astype(np.uint32)
    # Z starts at e[i, 0] > 0 (not +0) and the masked terms are +0 (exact no-ops), so
    # accumulate's +0 start and the masked tail leave Z's bits as written.
    z = accumulate(e, -1)
    return np.where(causal[None], fp.vmul(e, reciprocal(z)[:, :, None]), _ZERO).astype(np.uint32)


def causal_softmax_backward(p, dp, scale: float) -> np.ndarray:
    """``ds`` of :func:`causal_softmax` followed by the scores' ``scale``, from ``p``
    and ``dp`` ``[S, T, T]`` (``dp`` above the diagonal is ignored; ``ds`` there is ``+0``)::

        r[i]     = +0 + mul(p[i, j], dp[i, j]) ...              j = 0 .. i
        ds[i, j] = mul(mul(p[i, j], sub(dp[i, j], r[i])), scale)
    """
    p, dp = _u32(p), _u32(dp)
    t_len = p.shape[-1]
    causal = np.tril(np.ones((t_len, t_len), dtype=bool))
    dp = np.where(causal[None], dp, _ZERO).astype(np.uint32)
    r = accumulate(fp.vmul(p, dp), -1)
    ds = fp.vmul(fp.vmul(p, fp.vsub(dp, r[:, :, None])), const(fp.f2b(scale)))
    return np.where(causal[None], ds, _ZERO).astype(np.uint32)


def _masked_product(a, b) -> np.ndarray:
    """``out[s, i, d] = +0 + mul(a[s, i, 0], b[s, 0, d]) + ...`` over the middle index
    (a batched matrix product with sequential sums).

    Where ``a`` is zero because the causal mask hides a term, the products are
    +-0 and add nothing to a sum that starts at +0, wherever they fall in the
    order, so the sum over every index has the bits of the sum over the visible ones."""
    return outer_sum(np.transpose(a, (2, 0, 1)), np.transpose(b, (1, 0, 2)))     # the summed index first


def attention_backward(dout, q, k, v, saved: dict, scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients ``(dq, dk, dv)`` of :func:`attention`, over ``j <= i`` only::

        dp[i, j] = +0 + mul(dout[i, d], v[j, d]) ...           d = 0 .. Dh-1
        r[i]     = +0 + mul(p[i, j], dp[i, j]) ...              j = 0 .. i
        ds[i, j] = mul(mul(p[i, j], sub(dp[i, j], r[i])), scale)
        dv[j, d] = +0 + mul(p[i, j], dout[i, d]) ...            i = j .. T-1
        dq[i, d] = +0 + mul(ds[i, j], k[j, d]) ...              j = 0 .. i
        dk[j, d] = +0 + mul(ds[i, j], q[i, d]) ...              i = j .. T-1
    """
    dout, q, k, v = _u32(dout), _u32(q), _u32(k), _u32(v)
    p = saved["p"]
    dp = _masked_product(dout, np.swapaxes(v, 1, 2))
    ds = causal_softmax_backward(p, dp, scale)
    dq = _masked_product(ds, k)
    dk = _masked_product(np.swapaxes(ds, 1, 2), q)
    dv = _masked_product(np.swapaxes(p, 1, 2), dout)
    return dq, dk, dv


# ---------------------------------------------------------------------------
# embeddings, residuals, the loss

def embedding(tokens, positions, tok_table, pos_table) -> np.ndarray:
    """``x[t] = add(E_tok[tokens[t]], E_pos[positions[t]])``: one add per element.

    The tables are weights and live in MemoryX; a step streams in only the
    rows its tokens use (``docs/transformer.md`` section 3.6)."""
    return fp.vadd(_u32(tok_table)[np.asarray(tokens)], _u32(pos_table)[np.asarray(positions)])


def embedding_rows_grad(dx, indices, rows: int) -> np.ndarray:
    """The gradient of a ``rows``-row table looked up at ``indices`` ``[N]``: each
    row ``+0 + dx[t] + ...`` over the tokens that used it, in token order; rows
    no token used stay ``+0``."""
    dx, indices = _u32(dx), np.asarray(indices).reshape(-1)
    grad = _zeros((rows, dx.shape[1]))
    for t in range(dx.shape[0]):
        grad[indices[t]] = fp.vadd(grad[indices[t]], dx[t])
    return grad


def embedding_backward(dx, tokens, positions, vocab: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """``(dE_tok, dE_pos)`` of :func:`embedding`, each by :func:`embedding_rows_grad`."""
    return embedding_rows_grad(dx, tokens, vocab), embedding_rows_grad(dx, positions, context)


def residual(skip, branch) -> np.ndarray:
    """``add(skip, branch)``. Backward: the skip's gradient is ``add(dy, d_branch_input)``
    where the branch's input is the skip (the pre-LayerNorm transformer's case)."""
    return fp.vadd(_u32(skip), _u32(branch))


def sequence_cross_entropy_delta(logits, targets, count: int | None = None) -> np.ndarray:
    """The mean cross-entropy's gradient for ``logits`` ``[N, V]`` and next-token
    ``targets`` ``[N]``: the MLP's softmax delta (:func:`.numerics.softmax_delta`)
    per token, ``scale = 1/count`` (``count`` defaults to ``N``: every token of
    every sequence counts once). Returns ``[N, V]``."""
    logits = _u32(logits)
    n, vocab = logits.shape
    onehot = np.zeros((vocab, n), dtype=np.float32)
    onehot[np.asarray(targets), np.arange(n)] = 1.0
    scale = np.full(n, 1.0 / (count or n), dtype=np.float32)
    return softmax_delta(logits.T, fp.as_bits(onehot), fp.as_bits(scale)).T.copy()
