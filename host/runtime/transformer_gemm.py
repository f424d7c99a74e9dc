"""The streamed GEMM's loops for the transformer's token-sized operands, when
no result can be subnormal.

The MLP's GEMM loops (:mod:`.kernels`) keep the fabric's order: row ``i`` of
``H`` accumulates ``P_i = +0 + w x + ...`` over its features ``i, i+H, ...``
and the ring sums ``add(P_s, b) + P_{s+1} + ... + P_e``. Those loops walk the
ring one token at a time (``H`` scalar adds per output and token), which is
most of their time when ``K`` is only a few times ``H``, as in a transformer
with ``d_model`` 64 on 16 rows. The loops here do the same binary32
operations in the same order for every output element, but walk the ring a
whole row of tokens at a time (so the compiler vectorizes it), skip the
flush (valid only where :func:`.kernels.fast_is_exact` holds: every nonzero
product at least ``2^-102``, so no sum is subnormal), and report whether a
NaN appeared, so that the canonical-NaN pass runs only then.

:func:`sgemm`, :func:`sgemm_transposed` and :func:`wgrad_partials` have the
signatures of :mod:`.kernels`' functions of the same names and fall back to
them (the flushing loops) when the operands are not safe;
``tests/test_gpt_kernels.py`` checks both paths against the reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import kernels

__all__ = ["sgemm", "sgemm_transposed", "wgrad_partials", "batched_product"]

_ZERO = np.float32(0.0)
_MZERO = np.float32(-0.0)


@njit(inline="always")
def _rows(w_row, x, height, part):
    """``part[i] = +0 + w_row[i] x[i] + w_row[i+H] x[i+H] + ...`` (each a row of tokens)."""
    tokens, n_in = x.shape[1], w_row.shape[0]
    for i in range(height):
        p = part[i]
        for t in range(tokens):
            p[t] = _ZERO
        k = i
        while k + 3 * height < n_in:        # four features per pass, added in the same order
            w0, w1, w2, w3 = w_row[k], w_row[k + height], w_row[k + 2 * height], w_row[k + 3 * height]
            x0, x1, x2, x3 = x[k], x[k + height], x[k + 2 * height], x[k + 3 * height]
            for t in range(tokens):
                p[t] = p[t] + w0 * x0[t] + w1 * x1[t] + w2 * x2[t] + w3 * x3[t]
            k += 4 * height
        while k < n_in:
            wk = w_row[k]
            xk = x[k]
            for t in range(tokens):
                p[t] = p[t] + wk * xk[t]
            k += height


@njit(inline="always")
def _ring(part, start, first, y):
    """``y = add(P_s, first) + P_{s+1} + ... + P_{s-1}`` (indices mod ``H``); whether a NaN came out."""
    height, tokens = part.shape
    ps = part[start]
    for t in range(tokens):
        y[t] = ps[t] + first
    for q in range(1, height):
        pq = part[(start + q) % height]
        for t in range(tokens):
            y[t] = y[t] + pq[t]
    nan = False
    for t in range(tokens):
        nan |= y[t] != y[t]
    return nan


@njit(fastmath=False, cache=True)
def _sgemm_fast_k(w, x, bias, height, out):
    part = np.empty((height, x.shape[1]), dtype=np.float32)
    nan = False
    for o in range(w.shape[0]):
        _rows(w[o], x, height, part)
        nan |= _ring(part, (o % height + 1) % height, bias[o], out[o])
    return nan


@njit(fastmath=False, cache=True)
def _sgemm_t_fast_k(wt, dy, height, out):
    part = np.empty((height, dy.shape[1]), dtype=np.float32)
    nan = False
    for k in range(wt.shape[0]):
        _rows(wt[k], dy, height, part)
        nan |= _ring(part, (k % height + 1) % height, _MZERO, out[k])
    return nan


@njit(fastmath=False, cache=True)
def _wgrad_partials_fast_k(dy, xt, starts, counts, dw, db):
    """Column ``j``'s ``+0 + x dy + ...`` over its tokens in order, each token's
    products added to a whole weight row at once."""
    n_out, n_in = dy.shape[0], xt.shape[1]
    nan = False
    for j in range(starts.shape[0]):
        t0 = starts[j]
        for o in range(n_out):
            g = dw[j, o]
            d = dy[o, t0]
            xr = xt[t0]
            for k in range(n_in):
                g[k] = _ZERO + xr[k] * d
            b = _ZERO + d
            t, end = t0 + 1, t0 + counts[j]
            while t + 3 < end:                  # four tokens per pass, added in the same order
                d0, d1, d2, d3 = dy[o, t], dy[o, t + 1], dy[o, t + 2], dy[o, t + 3]
                x0, x1, x2, x3 = xt[t], xt[t + 1], xt[t + 2], xt[t + 3]
                for k in range(n_in):
                    g[k] = g[k] + x0[k] * d0 + x1[k] * d1 + x2[k] * d2 + x3[k] * d3
                b = b + d0 + d1 + d2 + d3
                t += 4
            while t < end:
                d = dy[o, t]
                xr = xt[t]
                for k in range(n_in):
                    g[k] = g[k] + xr[k] * d
                b = b + d
                t += 1
            db[j, o] = b
            for k in range(n_in):
                nan |= g[k] != g[k]
            nan |= b != b
    return nan


@njit(fastmath=False, cache=True)
def _batched_fast_k(a, b, skip_zeros, out):
    """``out[s, i] = +0 + a[s, i, 0] b[s, 0] + a[s, i, 1] b[s, 1] + ...`` (rows of ``b``), unflushed;
    with ``skip_zeros`` (every ``b`` finite) a zero ``a[s, i, j]`` is skipped, since adding its
    product (a zero) to a sum that started at ``+0`` leaves the sum's bits as they are."""
    seqs, rows, inner = a.shape
    cols = b.shape[2]
    nan = False
    for s in range(seqs):
        for i in range(rows):
            acc = out[s, i]
            for d in range(cols):
                acc[d] = _ZERO
            for j in range(inner):
                aij = a[s, i, j]
                if skip_zeros and aij == 0:
                    continue
                bj = b[s, j]
                for d in range(cols):
                    acc[d] = acc[d] + aij * bj[d]
            for d in range(cols):
                nan |= acc[d] != acc[d]
    return nan


def batched_product(a: np.ndarray, b: np.ndarray, exact: bool | None = None) -> np.ndarray | None:
    """``+0 + mul(a[s, i, 0], b[s, 0, d]) + ...`` of flushed contiguous float32 ``a [S, I, J]`` and
    ``b [S, J, D]`` without flushing, or ``None`` where a result could be subnormal (the caller then
    runs the flushing loop). ``exact``: :func:`.kernels.fast_is_exact` of the operands, if known."""
    if not (kernels.fast_is_exact(a, b) if exact is None else exact):
        return None
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), dtype=np.float32)
    with np.errstate(all="ignore"):
        nan = _batched_fast_k(a, b, bool(np.isfinite(b).all()), out)
    return kernels.canonical_nan(out) if nan else out


def sgemm(w: np.ndarray, x: np.ndarray, bias: np.ndarray | None, height: int,
          exact: bool | None = None) -> np.ndarray:
    """:func:`.kernels.sgemm` (flushed float32 operands ``W [O, K]``, ``x [K, B]``, ``bias [O]``
    or ``None``), with the ring walked a row of tokens at a time where no result can be subnormal.
    ``exact``: :func:`.kernels.fast_is_exact` of ``(w, x, bias)``, if the caller knows it."""
    bias = np.full(w.shape[0], -0.0, dtype=np.float32) if bias is None else bias
    if not (kernels.fast_is_exact(w, x, bias) if exact is None else exact):
        return kernels.sgemm(w, x, bias, height)
    out = np.empty((w.shape[0], x.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        nan = _sgemm_fast_k(w, x, bias, height, out)
    return kernels.canonical_nan(out) if nan else out


def sgemm_transposed(w: np.ndarray, dy: np.ndarray, height: int, exact: bool | None = None) -> np.ndarray:
    """:func:`.kernels.sgemm_transposed` (``dx [K, B]`` of ``W^T`` times ``dy [O, B]``), as :func:`sgemm`
    (``exact`` of ``(w, dy)``)."""
    if not (kernels.fast_is_exact(w, dy) if exact is None else exact):
        return kernels.sgemm_transposed(w, dy, height)
    out = np.empty((w.shape[1], dy.shape[1]), dtype=np.float32)
    with np.errstate(all="ignore"):
        nan = _sgemm_t_fast_k(np.ascontiguousarray(w.T), dy, height, out)
    return kernels.canonical_nan(out) if nan else out


def wgrad_partials(dy: np.ndarray, xt: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                   exact: bool | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`.kernels.wgrad_partials` (per-column ``(G [C, O, K], g [C, O])``) of ``dy [O, B]`` and the
    activations token-major, ``xt [B, K]``, unflushed where safe (``exact``: :func:`.kernels.fast_is_exact`
    of ``(xt, dy)`` and every nonzero ``|dy|`` at least ``2^-102``, if the caller knows it)."""
    if exact is None:
        exact = kernels.fast_is_exact(xt, dy) and kernels.min_abs_nonzero(dy) >= kernels.SAFE
    if not exact:
        return kernels.wgrad_partials(dy, np.ascontiguousarray(xt.T), starts, counts)
    columns = len(starts)
    dw = np.empty((columns, dy.shape[0], xt.shape[1]), dtype=np.float32)
    db = np.empty((columns, dy.shape[0]), dtype=np.float32)
    with np.errstate(all="ignore"):
        nan = _wgrad_partials_fast_k(dy, xt, np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64),
                                     dw, db)
    if nan:
        kernels.canonical_nan(dw), kernels.canonical_nan(db)
    return dw, db
