"""Compiled loops of the functional backend: the streamed GEMMs and the weight
gradients with exactly the firmware's order of binary32 operations.

The loops are numba code with ``fastmath=False`` (no fused multiply-add, no
reassociation), so every operation is one IEEE binary32 operation. Each GEMM
loop takes a flag ``ftz``: with it, every subnormal result is flushed to
zero, as the fabric does; without it the loop runs in plain IEEE, which gives
the fabric's bits whenever no subnormal can arise. :func:`fast_is_exact`
decides that from the operands: if every nonzero product has magnitude at
least ``2^-102`` (and every added constant too), every product is a multiple
of ``2^-125`` and so is every sum of them, so no nonzero result is below
``2^-126``. Inputs must already be flushed.

Orders (``docs/weight_streaming.md``):

* :func:`sgemm`: per output ``o`` and token, row ``i`` accumulates
  ``P_i = +0 + w x + w x ...`` over its features ``i, i+H, ...``; the ring
  then sums ``y = add(P_s, b)`` and adds ``P_{s+1}``, ..., ``P_e`` where ``e = o mod H``
  and ``s = e + 1 mod H``.
* :func:`spgemm`: the sparse forward GEMM (a static mask): row ``i``
  accumulates ``P_i = +0 + w x + ...`` over its kept features ``k mod H = i``
  in ascending ``k`` (the start row ``s`` first adds the bias,
  ``P_s = +0 + b``); then ``y = P_s`` plus ``P_{s+1}``, ..., ``P_e``.
* :func:`wgrad`: per column ``j``, ``G = +0 + x dy + ...`` over its tokens in
  order; the row chain sums ``+0 + G_0 + G_1 + ...``; the bias the same way
  from ``+0 + dy + dy + ...``. :func:`wgrad_partials` returns the ``G_j``
  themselves, before the row chain (a system's share of a data-parallel step).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.firmware.training import numerics as fw_numerics

__all__ = ["sgemm", "sgemm_transposed", "spgemm", "wgrad", "wgrad_partials", "softmax_delta", "relu", "relu_mask", "fast_is_exact",
           "min_abs_nonzero", "canonical_nan"]

_FLT_MIN = np.float32(1.1754943508222875e-38)
_ZERO = np.float32(0.0)
_MZERO = np.float32(-0.0)
#: Products at least this large (and constants) keep every result a multiple of 2^-125.
SAFE = 2.0 ** -102


@njit(inline="always")
def _fl(v, ftz):
    """``v``, or a zero of its sign if ``ftz`` and ``v`` is subnormal."""
    if ftz and v != 0 and abs(v) < _FLT_MIN:
        return v * _ZERO
    return v


@njit(fastmath=False, cache=True)
def _sgemm_k(w, x, bias, height, out, ftz):
    n_out, n_in = w.shape
    tokens = x.shape[1]
    part = np.zeros((height, tokens), dtype=np.float32)
    for o in range(n_out):
        part[:] = _ZERO
        for i in range(height):
            for k in range(i, n_in, height):
                wk = w[o, k]
                for t in range(tokens):
                    part[i, t] = _fl(part[i, t] + _fl(wk * x[k, t], ftz), ftz)
        start = (o % height + 1) % height
        for t in range(tokens):
            y = _fl(part[start, t] + bias[o], ftz)
            for q in range(1, height):
                y = _fl(y + part[(start + q) % height, t], ftz)
            out[o, t] = y


@njit(fastmath=False, cache=True)
def _sgemm_t_k(w, dy, height, out, ftz):
    n_out, n_in = w.shape
    tokens = dy.shape[1]
    part = np.zeros((height, tokens), dtype=np.float32)
    for k in range(n_in):
        part[:] = _ZERO
        for i in range(height):
            for o in range(i, n_out, height):
                wk = w[o, k]
                for t in range(tokens):
                    part[i, t] = _fl(part[i, t] + _fl(wk * dy[o, t], ftz), ftz)
        start = (k % height + 1) % height
        for t in range(tokens):
            y = _fl(part[start, t] + _MZERO, ftz)
            for q in range(1, height):
                y = _fl(y + part[(start + q) % height, t], ftz)
            out[k, t] = y


@njit(fastmath=False, cache=True)
def _spgemm_k(w, x, bias, has_bias, starts, cols, height, out, ftz):
    n_out = w.shape[0]
    tokens = x.shape[1]
    part = np.zeros((height, tokens), dtype=np.float32)
    for o in range(n_out):
        part[:] = _ZERO
        start = (o % height + 1) % height
        for n in range(starts[o], starts[o + 1]):
            k = cols[n]
            i = k % height
            wk = w[o, k]
            for t in range(tokens):
                part[i, t] = _fl(part[i, t] + _fl(wk * x[k, t], ftz), ftz)
        for t in range(tokens):
            y = part[start, t]
            if has_bias:
                y = _fl(y + bias[o], ftz)
            for q in range(1, height):
                y = _fl(y + part[(start + q) % height, t], ftz)
            out[o, t] = y


@njit(inline="always")
def _column_partial(dy, xt, o, t0, count, g, ftz):
    """Column partial of output ``o`` over tokens ``t0 .. t0+count-1``: ``g`` gets
    ``+0 + x dy + ...`` (the weight row); returns the bias's ``+0 + dy + ...``."""
    n_in = xt.shape[1]
    d = dy[o, t0]
    for k in range(n_in):
        g[k] = _fl(_ZERO + _fl(xt[t0, k] * d, ftz), ftz)
    b = _fl(_ZERO + d, ftz)
    for t in range(t0 + 1, t0 + count):
        d = dy[o, t]
        for k in range(n_in):
            g[k] = _fl(g[k] + _fl(xt[t, k] * d, ftz), ftz)
        b = _fl(b + d, ftz)
    return b


@njit(fastmath=False, cache=True)
def _wgrad_k(dy, xt, starts, counts, dw, db, ftz):
    n_out = dy.shape[0]
    n_in = xt.shape[1]
    total = np.empty(n_in, dtype=np.float32)
    g = np.empty(n_in, dtype=np.float32)
    for o in range(n_out):
        tb = _ZERO
        for j in range(starts.shape[0]):
            b = _column_partial(dy, xt, o, starts[j], counts[j], g, ftz)
            if j == 0:
                for k in range(n_in):
                    total[k] = _fl(_ZERO + g[k], ftz)
                tb = _fl(_ZERO + b, ftz)
            else:
                for k in range(n_in):
                    total[k] = _fl(total[k] + g[k], ftz)
                tb = _fl(tb + b, ftz)
        for k in range(n_in):
            dw[o, k] = total[k]
        db[o] = tb


@njit(fastmath=False, cache=True)
def _wgrad_partials_k(dy, xt, starts, counts, dw, db, ftz):
    n_out = dy.shape[0]
    for o in range(n_out):
        for j in range(starts.shape[0]):
            db[j, o] = _column_partial(dy, xt, o, starts[j], counts[j], dw[j, o], ftz)


@njit(fastmath=False, cache=True)
def _min_abs_nonzero(a):
    best = np.inf
    for v in a:
        m = abs(v)
        if m != 0 and m < best:
            best = m
    return best


def min_abs_nonzero(a: np.ndarray) -> float:
    """Smallest nonzero magnitude in ``a`` (``inf`` if all are zero)."""
    return float(_min_abs_nonzero(np.ascontiguousarray(a).ravel()))


def fast_is_exact(a: np.ndarray, b: np.ndarray, *constants: np.ndarray) -> bool:
    """Whether IEEE binary32 without flushing gives the fabric's bits for sums
    of products of ``a`` and ``b`` plus ``constants`` (see the module docstring)."""
    if min_abs_nonzero(a) * min_abs_nonzero(b) < SAFE:
        return False
    return all(min_abs_nonzero(c) >= SAFE for c in constants)


def canonical_nan(a: np.ndarray) -> np.ndarray:
    """``a`` with every NaN replaced by the fabric's canonical NaN ``0x7fc00000`` (in place)."""
    nan = np.isnan(a)
    if nan.any():
        a.view(np.uint32)[nan] = 0x7FC00000
    return a


def sgemm(w: np.ndarray, x: np.ndarray, bias: np.ndarray | None, height: int) -> np.ndarray:
    """``y[O, B]`` of the streamed GEMM ``W [O, K]`` times ``x [K, B]`` plus ``bias [O]``
    (``None``: the identity -0.0), in the fabric's order on ``height`` rows."""
    bias = np.full(w.shape[0], -0.0, dtype=np.float32) if bias is None else bias
    out = np.empty((w.shape[0], x.shape[1]), dtype=np.float32)
    _sgemm_k(w, x, bias, height, out, not fast_is_exact(w, x, bias))
    return canonical_nan(out)


def spgemm(w: np.ndarray, x: np.ndarray, bias: np.ndarray | None, nonzeros: np.ndarray, height: int) -> np.ndarray:
    """``y[O, B]`` of the sparse streamed GEMM: only the weights ``W [O, K]`` at the
    flat indices ``nonzeros`` (``o*K + k``, ascending) times ``x [K, B]``, plus
    ``bias [O]`` (``None``: none), in the fabric's order on ``height`` rows."""
    n_out, n_in = w.shape
    flat = np.asarray(nonzeros, dtype=np.int64)
    starts = np.searchsorted(flat, np.arange(n_out + 1, dtype=np.int64) * n_in)
    cols = flat - np.repeat(np.arange(n_out, dtype=np.int64), np.diff(starts)) * n_in
    has_bias = bias is not None
    bias = np.zeros(n_out, dtype=np.float32) if bias is None else bias
    kept = w.ravel()[flat]
    exact = fast_is_exact(kept, x, bias) if has_bias else fast_is_exact(kept, x)
    out = np.empty((n_out, x.shape[1]), dtype=np.float32)
    _spgemm_k(w, x, bias, has_bias, starts, cols, height, out, not exact)
    return canonical_nan(out)


def sgemm_transposed(w: np.ndarray, dy: np.ndarray, height: int) -> np.ndarray:
    """``dx[K, B]`` of ``W^T [K, O]`` times ``dy [O, B]`` in the fabric's order."""
    out = np.empty((w.shape[1], dy.shape[1]), dtype=np.float32)
    _sgemm_t_k(w, dy, height, out, not fast_is_exact(w, dy))
    return canonical_nan(out)


def wgrad(dy: np.ndarray, x: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(dW [O, K], db [O])`` from ``dy [O, B]`` and ``x [K, B]``, tokens grouped by
    column (``starts``, ``counts``), in the fabric's order."""
    xt = np.ascontiguousarray(x.T)
    exact = fast_is_exact(xt, dy) and min_abs_nonzero(dy) >= SAFE
    dw = np.empty((dy.shape[0], x.shape[0]), dtype=np.float32)
    db = np.empty(dy.shape[0], dtype=np.float32)
    _wgrad_k(dy, xt, starts.astype(np.int64), counts.astype(np.int64), dw, db, not exact)
    return canonical_nan(dw), canonical_nan(db)


def wgrad_partials(dy: np.ndarray, x: np.ndarray, starts: np.ndarray,
                   counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column partial sums ``(G [C, O, K], g [C, O])`` of :func:`wgrad` before its row chain.

    Row ``j`` is column ``j``'s ``+0 + x dy + ...`` over tokens ``starts[j] ..
    starts[j] + counts[j] - 1`` in order (every count at least 1); :func:`wgrad`'s
    result is ``+0 + G[0] + G[1] + ...`` with the fabric's add.
    """
    xt = np.ascontiguousarray(x.T)
    exact = fast_is_exact(xt, dy) and min_abs_nonzero(dy) >= SAFE
    columns = len(starts)
    dw = np.empty((columns, dy.shape[0], x.shape[0]), dtype=np.float32)
    db = np.empty((columns, dy.shape[0]), dtype=np.float32)
    _wgrad_partials_k(dy, xt, np.asarray(starts, dtype=np.int64), np.asarray(counts, dtype=np.int64), dw, db,
                      not exact)
    return canonical_nan(dw), canonical_nan(db)


# Softmax cross-entropy delta --------------------------------------------------------
# The same operations as wse.firmware.training.numerics.softmax_delta (the
# reference it is tested against), with the fabric's rules spelled out per
# operation: operands and results flushed, every NaN result canonical.

def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


_QNAN = _f32(0x7FC00000)
_EXP = tuple(_f32(b) for b in fw_numerics.EXP_COEFFS)
_LOG2E, _MHALF = _f32(fw_numerics.EXP_CONSTANTS["LOG2E"]), _f32(fw_numerics.EXP_CONSTANTS["MHALF"])
_MLN2HI, _MLN2LO = _f32(fw_numerics.EXP_CONSTANTS["MLN2HI"]), _f32(fw_numerics.EXP_CONSTANTS["MLN2LO"])
_C0, _C1, _C2, _C3, _C4, _C5, _C6 = _EXP
_ONE, _TWO = np.float32(1.0), np.float32(2.0)
_NEG_BIG = _f32(0xFF000000)   # -2^127
_MAGIC = np.uint32(fw_numerics.RCP_MAGIC)


@njit(inline="always")
def _fz(v):
    """Flush a subnormal to zero, make a NaN canonical."""
    if v != v:
        return _QNAN
    if v != 0 and abs(v) < _FLT_MIN:
        return v * _ZERO
    return v


@njit(inline="always")
def _add(a, b):
    return _fz(_fz(a) + _fz(b))


@njit(inline="always")
def _sub(a, b):
    return _fz(_fz(a) - _fz(b))


@njit(inline="always")
def _mul(a, b):
    return _fz(_fz(a) * _fz(b))


@njit(inline="always")
def _max(a, b):
    a, b = _fz(a), _fz(b)
    if a != a or b != b:
        return _QNAN
    if a == b:
        return a + b if a == 0 else a     # -0 + +0 = +0: +0 wins
    return a if a > b else b


@njit(inline="always")
def _ftoi(a):
    a = _fz(a)
    if a != a:
        return 0
    if a >= 2147483648.0:
        return 2147483647
    if a < -2147483648.0:
        return -2147483648
    return int(a)


@njit(fastmath=False, cache=True)
def _softmax_k(z, onehot, scale, out):
    classes, tokens = z.shape
    p = np.empty(classes, dtype=np.float32)
    n = np.empty(classes, dtype=np.int64)
    s1 = np.empty(1, dtype=np.float32)
    y1 = np.empty(1, dtype=np.float32)
    for t in range(tokens):
        m = z[0, t]
        for c in range(1, classes):
            m = _max(m, z[c, t])
        for c in range(classes):
            x = _sub(z[c, t], m)
            k = _ftoi(_add(_mul(x, _LOG2E), _MHALF))
            nf = np.float32(k)
            r = _add(x, _mul(nf, _MLN2HI))
            r = _add(r, _mul(nf, _MLN2LO))
            q = _mul(r, _C6)
            q = _mul(_add(q, _C5), r)
            q = _mul(_add(q, _C4), r)
            q = _mul(_add(q, _C3), r)
            q = _mul(_add(q, _C2), r)
            q = _mul(_add(q, _C1), r)
            p[c] = _add(q, _C0)
            n[c] = k
        bits = p.view(np.uint32)
        for c in range(classes):
            b = np.int64(bits[c])
            field = np.int32((b >> 23) + n[c])           # the PE's 32-bit sum
            bits[c] = np.uint32((b + (n[c] << 23)) & 0xFFFFFFFF) if field > 0 else np.uint32(0)
        total = p[0]
        for c in range(1, classes):
            total = _add(total, p[c])
        s1[0] = total
        y1.view(np.uint32)[0] = np.uint32((np.int64(_MAGIC) - np.int64(s1.view(np.uint32)[0])) & 0xFFFFFFFF)
        y = y1[0]
        for _ in range(2):
            y = _mul(y, _sub(_TWO, _mul(total, y)))
        y = _add(y, _mul(y, _sub(_ONE, _mul(total, y))))
        for c in range(classes):
            out[c, t] = _mul(_sub(_mul(p[c], y), onehot[c, t]), scale[t])


def softmax_delta(z: np.ndarray, onehot: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """The loss delta ``[C, B]`` of logits ``z [C, B]`` (class-major), with the
    firmware's operations (:func:`wse.firmware.training.numerics.softmax_delta`)."""
    out = np.empty(z.shape, dtype=np.float32)
    _softmax_k(np.ascontiguousarray(z, dtype=np.float32), np.ascontiguousarray(onehot, dtype=np.float32),
               np.ascontiguousarray(scale, dtype=np.float32), out)
    return out


# ReLU and its mask ---------------------------------------------------------------------

@njit(fastmath=False, cache=True)
def _relu_k(a, out):
    for i in range(a.size):
        out[i] = _max(a[i], _ZERO)


@njit(fastmath=False, cache=True)
def _mask_k(act, grad, out):
    big, minus_one = _NEG_BIG, np.float32(-1.0)
    for i in range(act.size):
        tmp = _max(_mul(act[i], big), minus_one)
        out[i] = _mul(_mul(grad[i], tmp), minus_one)


def relu(a: np.ndarray) -> np.ndarray:
    """``max(a, +0)`` elementwise with the fabric's ``fmaxs`` rules."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    out = np.empty_like(a)
    _relu_k(a.ravel(), out.ravel())
    return out


def relu_mask(act: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """``mul(mul(grad, max(mul(act, -2^127), -1)), -1)`` elementwise: ``train.s``'s ReLU mask."""
    act = np.ascontiguousarray(act, dtype=np.float32)
    grad = np.ascontiguousarray(grad, dtype=np.float32)
    out = np.empty_like(grad)
    _mask_k(act.ravel(), grad.ravel(), out.ravel())
    return out
