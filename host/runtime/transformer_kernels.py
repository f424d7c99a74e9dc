"""Compiled loops of the transformer's functional model: the same binary32
operations, in the same order, as the reference operations of
:mod:`wse.firmware.training.transformer` (``docs/transformer.md`` section 3).

The linear layers are the streamed GEMM and its gradients, so they run on the
MLP's compiled GEMM loops (:mod:`.kernels`: :func:`~.kernels.sgemm`,
:func:`~.kernels.sgemm_transposed`, :func:`~.kernels.wgrad`,
:func:`~.kernels.wgrad_partials`), which keep the streamed GEMM's order on
``H`` rows and flush subnormals exactly where the fabric would. This module
adds the activations-times-activations products of attention
(:func:`batched_product`: ``+0 + mul(a, b) + ...`` over the middle index, in
index order) and the embedding rows' gradient (:func:`embedding_rows_grad`:
each row ``+0 + dx[t] + ...`` over the tokens that used it, in token order).
Both are numba loops with ``fastmath=False`` that flush every operand and
every result (the fabric's rules, bit for bit) and make every NaN canonical.
The GEMM loops and the attention products take the loops of
:mod:`.transformer_gemm` instead (no flushing, the same order) where no
result can be subnormal (every nonzero product at least ``2^-102``), and
LayerNorm's parameter gradients sum their token blocks in
:func:`block_sums`.

Every function takes and returns binary32 bit patterns (``uint32`` arrays),
as the reference operations do; ``tests/test_gpt_kernels.py`` checks each
against its reference operation bit for bit, subnormal and non-finite
operands included.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from wse import numerics as fp
from wse.firmware.training.transcendental import const

from .kernels import SAFE, canonical_nan, wgrad
from . import transformer_gemm
from .transformer_gemm import sgemm, sgemm_transposed, wgrad_partials
from .transformer_elementwise import causal_softmax, causal_softmax_backward

__all__ = ["linear", "linear_input_grad", "linear_backward", "linear_weight_grad", "linear_weight_partials",
           "batched_product",
           "attention", "attention_backward", "embedding_rows_grad", "block_bounds", "block_sums", "fold", "flushed"]

_FLT_MIN = np.float32(1.1754943508222875e-38)
_ZERO = np.float32(0.0)


@njit(cache=True)
def _scan(bits, values):
    """Whether a pattern is subnormal, and the smallest nonzero magnitude once flushed
    (:func:`.kernels.min_abs_nonzero`'s value: ``inf`` if none; NaN ignored), in one pass."""
    subnormal = False
    best = np.inf
    for i in range(bits.shape[0]):
        if (bits[i] & 0x7F800000) == 0:
            subnormal |= (bits[i] & 0x007FFFFF) != 0
        else:
            m = abs(values[i])
            if m < best:
                best = m
    return subnormal, best


def _fm(bits: np.ndarray) -> tuple[np.ndarray, float]:
    """uint32 patterns, flushed as the fabric reads them, as a contiguous float32 array (a copy
    only where one is subnormal), and its smallest nonzero magnitude (for the GEMMs' fast path)."""
    bits = np.ascontiguousarray(bits, dtype=np.uint32)
    flat = bits.reshape(-1)
    subnormal, smallest = _scan(flat, flat.view(np.float32))
    if subnormal:
        bits = fp.vftz(bits)
    return bits.view(np.float32), float(smallest)


def flushed(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` as binary32 patterns with every subnormal flushed to a zero of its
    sign (the bits of :func:`wse.firmware.training.transformer.bits`), a new array."""
    return _fm(fp.as_bits(values))[0].view(np.uint32).copy()


def _f(bits: np.ndarray) -> np.ndarray:
    """:func:`_fm`'s flushed float32 array alone."""
    return _fm(bits)[0]


def _safe(*smallest: float) -> bool:
    """:func:`.kernels.fast_is_exact` from the operands' smallest magnitudes (the two factors first)."""
    return smallest[0] * smallest[1] >= SAFE and all(m >= SAFE for m in smallest[2:])


def _b(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values).view(np.uint32)


@njit(inline="always")
def _fl(v):
    """``v`` with a subnormal flushed to a zero of its sign."""
    if v != 0 and abs(v) < _FLT_MIN:
        return v * _ZERO
    return v


def block_bounds(tokens: int, blocks: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
    """``(starts, counts)`` of token blocks (``None``: one block of all ``tokens``).

    Raises :class:`ValueError` if the blocks do not add up to ``tokens`` or one is empty."""
    counts = np.asarray(list(blocks) if blocks is not None else [tokens], dtype=np.int64)
    if counts.sum() != tokens or np.any(counts < 1):
        raise ValueError(f"token blocks {counts.tolist()} do not add up to {tokens} tokens (each block non-empty)")
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(np.int64), counts


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None, rows: int = 1) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.linear`: ``x [N, K]`` times ``W [O, K]``
    plus ``b [O]`` in the streamed GEMM's order on ``rows`` rows; ``[N, O]``."""
    (fx, mx), (fw, mw) = _fm(x), _fm(w)
    fb, mb = _fm(b) if b is not None else (np.full(fw.shape[0], -0.0, dtype=np.float32), np.inf)
    y = sgemm(fw, np.ascontiguousarray(fx.T), fb, rows, _safe(mw, mx, mb))
    return _b(y.T)


def linear_input_grad(dy: np.ndarray, w: np.ndarray, rows: int = 1) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.linear_input_grad`: ``dy [N, O]`` times ``W``; ``[N, K]``."""
    (fdy, mdy), (fw, mw) = _fm(dy), _fm(w)
    return _b(sgemm_transposed(fw, np.ascontiguousarray(fdy.T), rows, _safe(mw, mdy)).T)


def linear_backward(x: np.ndarray, dy: np.ndarray, w: np.ndarray, rows: int = 1,
                    blocks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`linear_weight_partials` and :func:`linear_input_grad` of one linear layer together
    (``dy`` flushed, scanned and transposed once): ``(G [C, O, K], g [C, O], dx [N, K])``."""
    starts, counts = block_bounds(x.shape[0], blocks)
    (fx, mx), (fdy, mdy), (fw, mw) = _fm(x), _fm(dy), _fm(w)
    dyt = np.ascontiguousarray(fdy.T)
    dw, db = wgrad_partials(dyt, fx, starts, counts, _safe(mx, mdy, mdy))
    dx = sgemm_transposed(fw, dyt, rows, _safe(mw, mdy))
    return _b(dw), _b(db), _b(dx.T)


def linear_weight_grad(x: np.ndarray, dy: np.ndarray,
                       blocks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`wse.firmware.training.transformer.linear_weight_grad`: ``(dW [O, K], db [O])``,
    per block ``+0 + mul(x, dy) + ...`` over its tokens, then the chain over the blocks."""
    starts, counts = block_bounds(x.shape[0], blocks)
    dw, db = wgrad(np.ascontiguousarray(_f(dy).T), np.ascontiguousarray(_f(x).T), starts, counts)
    return _b(dw), _b(db)


def linear_weight_partials(x: np.ndarray, dy: np.ndarray,
                           blocks: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each block's ``(G [C, O, K], g [C, O])`` of :func:`linear_weight_grad` before the chain:
    ``linear_weight_grad`` is ``+0 + G[0] + G[1] + ...`` (one ``add`` after another)."""
    starts, counts = block_bounds(x.shape[0], blocks)
    (fx, mx), (fdy, mdy) = _fm(x), _fm(dy)
    dw, db = wgrad_partials(np.ascontiguousarray(fdy.T), fx, starts, counts, _safe(mx, mdy, mdy))
    return _b(dw), _b(db)


@njit(fastmath=False, cache=True)
def _batched_k(a, b, out):
    seqs, rows, inner = a.shape
    cols = b.shape[2]
    acc = np.empty(cols, dtype=np.float32)
    for s in range(seqs):
        for i in range(rows):
            acc[:] = _ZERO
            for j in range(inner):
                aij = _fl(a[s, i, j])
                for d in range(cols):
                    acc[d] = _fl(acc[d] + _fl(aij * _fl(b[s, j, d])))
            for d in range(cols):
                out[s, i, d] = acc[d]


def batched_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[s, i, d] = +0 + mul(a[s, i, 0], b[s, 0, d]) + mul(a[s, i, 1], b[s, 1, d]) + ...``
    for ``a [S, I, J]`` and ``b [S, J, D]`` (the reference's attention products), one
    ``add`` after another in ``j`` order."""
    (fa, ma), (fb, mb) = _fm(a), _fm(b)
    fast = transformer_gemm.batched_product(fa, fb, _safe(ma, mb))
    if fast is not None:
        return _b(fast)
    out = np.empty((fa.shape[0], fa.shape[1], fb.shape[2]), dtype=np.float32)
    with np.errstate(all="ignore"):
        _batched_k(fa, fb, out)
    return _b(canonical_nan(out))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple[np.ndarray, dict]:
    """:func:`wse.firmware.training.transformer.attention` (``[S, T, Dh]`` each) with the
    products and the causal softmax compiled: ``(out, saved)``."""
    scores = fp.vmul(batched_product(q, np.swapaxes(np.asarray(k), 1, 2)), const(fp.f2b(scale)))
    p = causal_softmax(scores)
    return batched_product(p, v), {"p": p}


def attention_backward(dout: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray, saved: dict,
                       scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`wse.firmware.training.transformer.attention_backward` with the products compiled:
    ``(dq, dk, dv)``."""
    p = saved["p"]
    dp = batched_product(dout, np.swapaxes(np.asarray(v), 1, 2))
    ds = causal_softmax_backward(p, dp, scale)
    return (batched_product(ds, k), batched_product(np.swapaxes(ds, 1, 2), q),
            batched_product(np.swapaxes(p, 1, 2), dout))


@njit(fastmath=False, cache=True)
def _rows_k(dx, indices, out):
    dim = dx.shape[1]
    for t in range(dx.shape[0]):
        r = indices[t]
        for d in range(dim):
            out[r, d] = _fl(out[r, d] + _fl(dx[t, d]))


def embedding_rows_grad(dx: np.ndarray, indices: np.ndarray, rows: int) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.embedding_rows_grad`: the gradient of a
    ``rows``-row table looked up at ``indices`` ``[N]``, each row ``+0 + dx[t] + ...`` over
    the tokens that used it in token order; unused rows ``+0``."""
    fdx = _f(dx)
    index = np.ascontiguousarray(np.asarray(indices, dtype=np.int64).reshape(-1))
    out = np.zeros((rows, fdx.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        _rows_k(fdx, index, out)
    return _b(canonical_nan(out))


@njit(fastmath=False, cache=True)
def _fold_k(parts, out):
    for j in range(parts.shape[0]):
        for e in range(out.shape[0]):
            out[e] = _fl(out[e] + _fl(parts[j, e]))


@njit(fastmath=False, cache=True)
def _block_sums_k(a, b, product, starts, counts, out):
    for j in range(starts.shape[0]):
        row = out[j]
        for e in range(row.shape[0]):
            row[e] = _ZERO
        for t in range(starts[j], starts[j] + counts[j]):
            for e in range(row.shape[0]):
                term = _fl(a[t, e])
                if product:
                    term = _fl(term * _fl(b[t, e]))
                row[e] = _fl(row[e] + term)


def block_sums(terms: np.ndarray, blocks: Sequence[int] | None, factor: np.ndarray | None = None) -> np.ndarray:
    """Each token block's ``+0 + terms[t0] + terms[t0+1] + ...`` (``terms [N, D]`` patterns;
    with ``factor [N, D]``, each term ``mul(terms[t], factor[t])``), one ``add`` after another:
    ``[C, D]``, the blocks' partial sums of a parameter gradient (LayerNorm's ``dgamma``, ``dbeta``)."""
    a = _f(terms)
    starts, counts = block_bounds(a.shape[0], blocks)
    b = a if factor is None else _f(factor)
    out = np.empty((len(starts), a.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        _block_sums_k(a, b, factor is not None, starts, counts, out)
    return _b(canonical_nan(out))


def fold(partials: np.ndarray) -> np.ndarray:
    """``+0 + partials[0] + partials[1] + ...`` (``[k, *shape]`` patterns, ``k >= 0``), one
    ``add`` after another: the chain that joins the blocks' partial sums."""
    parts = _f(partials)
    out = np.zeros(int(np.prod(parts.shape[1:], dtype=np.int64)), dtype=np.float32)
    with np.errstate(all="ignore"):
        _fold_k(parts.reshape(parts.shape[0], -1), out)
    return _b(canonical_nan(out)).reshape(parts.shape[1:])
