"""Compiled elementwise and row-wise operations of the transformer's functional
model: GELU (both forms, forward and backward) and the causal softmax (forward
and backward), with the transcendentals they call (``exp``, ``reciprocal``,
``tanh``, ``erf``), each the same sequence of binary32 operations as the
reference (:mod:`wse.firmware.training.transformer`,
:mod:`wse.firmware.training.transcendental`, :mod:`wse.firmware.training.numerics`).

LayerNorm (forward, and the input gradient of its backward pass) and the
loss delta (the MLP's compiled softmax delta, :func:`.kernels.softmax_delta`)
are here too.

The loops are numba code with ``fastmath=False``; every operation is the
fabric's (:mod:`.kernels`' ``_add``, ``_sub``, ``_mul``, ``_max``, ``_ftoi``:
operands and results flushed, NaN results canonical), and the integer steps
on bit patterns (``exp``'s ``2^n``, the seeds of ``reciprocal``) go through a
one-element scratch array viewed as ``uint32``. Functions take and return
binary32 bit patterns (``uint32`` arrays), as the reference does;
``tests/test_gpt_kernels.py`` checks each against the reference bit for bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse import numerics as fp
from wse.firmware.training import transcendental as tr
from wse.firmware.training import transformer as ops

from .kernels import (_C0, _C1, _C2, _C3, _C4, _C5, _C6, _LOG2E, _MAGIC, _MHALF, _MLN2HI, _MLN2LO, _ONE, _TWO,
                      _ZERO, _add, _f32, _ftoi, _max, _mul, _sub, softmax_delta)

__all__ = ["gelu", "gelu_backward", "causal_softmax", "causal_softmax_backward", "layernorm", "layernorm_input_grad",
           "sequence_cross_entropy_delta"]

_HALF, _THREE_HALVES, _MONE = np.float32(0.5), np.float32(1.5), np.float32(-1.0)
_FLT_MIN_E = np.float32(1.1754943508222875e-38)
_BIG = _f32(0x7F000000)                       # 2^127
_MTWO = np.float32(-2.0)
_SQRT1_2 = _f32(ops.GELU_CONSTANTS["GELU_SQRT1_2"])
_INV_SQRT_2PI = _f32(ops.GELU_CONSTANTS["GELU_INV_SQRT_2PI"])
_SQRT_2_PI = _f32(ops.GELU_CONSTANTS["GELU_SQRT_2_PI"])
_GELU_C = _f32(ops.GELU_CONSTANTS["GELU_C"])
_GELU_3C = _f32(ops.GELU_CONSTANTS["GELU_3C"])
_TANH_SPLIT, _TANH_CLAMP = _f32(tr.TANH_SPLIT), _f32(tr.TANH_CLAMP)
_ERF_SPLIT, _ERF_CLAMP = _f32(tr.ERF_SPLIT), _f32(tr.ERF_CLAMP)
_TANH = np.array([_f32(c) for c in tr.TANH_COEFFS], dtype=np.float32)
_ERF_SMALL = np.array([_f32(c) for c in tr.ERF_SMALL_COEFFS], dtype=np.float32)
_ERF_LARGE = np.array([_f32(c) for c in tr.ERF_LARGE_COEFFS], dtype=np.float32)


@njit(cache=True)
def _exp(x, f, u):
    """:func:`wse.firmware.training.numerics.exp` of one value (``f``/``u``: scratch float32[1] and its uint32 view)."""
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
    f[0] = _add(q, _C0)
    b = np.int64(u[0])
    if np.int32((b >> 23) + k) > 0:
        u[0] = np.uint32((b + (np.int64(k) << 23)) & 0xFFFFFFFF)
    else:
        u[0] = np.uint32(0)
    return f[0]


@njit(cache=True)
def _reciprocal(s, f, u):
    """:func:`wse.firmware.training.numerics.reciprocal` of one value."""
    f[0] = s
    u[0] = np.uint32((np.int64(_MAGIC) - np.int64(u[0])) & 0xFFFFFFFF)
    y = f[0]
    for _ in range(2):
        y = _mul(y, _sub(_TWO, _mul(s, y)))
    return _add(y, _mul(y, _sub(_ONE, _mul(s, y))))


@njit(cache=True)
def _neg(x):
    return _mul(x, _MONE)


@njit(cache=True)
def _mask_positive(d):
    return _max(_neg(_max(_neg(_mul(d, _BIG)), _MONE)), _ZERO)


@njit(cache=True)
def _select(m, a, b):
    return _add(_mul(a, m), _mul(b, _sub(_ONE, m)))


@njit(cache=True)
def _sign(x):
    return _sub(_mul(_mask_positive(x), _TWO), _ONE)


@njit(cache=True)
def _horner(coeffs, z):
    p = coeffs[coeffs.shape[0] - 1]
    for i in range(coeffs.shape[0] - 2, -1, -1):
        p = _add(_mul(p, z), coeffs[i])
    return p


@njit(cache=True)
def _clamp(x, c):
    """``max(min(x, c), -c)`` with ``min(x, c) = mul(max(mul(x, -1), mul(c, -1)), -1)``."""
    return _max(_neg(_max(_neg(x), _neg(c))), _neg(c))


@njit(cache=True)
def _tanh(x, f, u, coeffs):
    """:func:`wse.firmware.training.transcendental.tanh` of one value."""
    x = _clamp(x, _TANH_CLAMP)
    z = _mul(x, x)
    small = _add(x, _mul(x, _mul(z, _horner(coeffs, z))))
    a = _max(x, _neg(x))
    e = _exp(_mul(a, _MTWO), f, u)
    large = _mul(_sub(_ONE, e), _reciprocal(_add(_ONE, e), f, u))
    large = _mul(large, _sign(x))
    return _select(_mask_positive(_sub(_TANH_SPLIT, a)), small, large)


@njit(cache=True)
def _erf(x, f, u, small_c, large_c):
    """:func:`wse.firmware.training.transcendental.erf` of one value."""
    x = _clamp(x, _ERF_CLAMP)
    small = _mul(x, _horner(small_c, _mul(x, x)))
    a = _max(x, _neg(x))
    e = _exp(_neg(_mul(a, a)), f, u)
    large = _sub(_ONE, _mul(e, _horner(large_c, a)))
    large = _mul(large, _sign(x))
    return _select(_mask_positive(_sub(_ERF_SPLIT, a)), small, large)


@njit(cache=True)
def _tanh_inner(x):
    return _mul(_add(x, _mul(_mul(_mul(x, x), x), _GELU_C)), _SQRT_2_PI)


@njit(fastmath=False, cache=True)
def _gelu_k(x, tanh_form, out, tanh_c, small_c, large_c):
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    for i in range(x.size):
        v = x[i]
        if tanh_form:
            g = _tanh(_tanh_inner(v), f, u, tanh_c)
        else:
            g = _erf(_mul(v, _SQRT1_2), f, u, small_c, large_c)
        out[i] = _mul(_mul(v, _HALF), _add(_ONE, g))


@njit(fastmath=False, cache=True)
def _gelu_backward_k(dy, x, tanh_form, out, tanh_c, small_c, large_c):
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    for i in range(x.size):
        v = x[i]
        if tanh_form:
            t = _tanh(_tanh_inner(v), f, u, tanh_c)
            s = _sub(_ONE, _mul(t, t))
            du = _mul(_add(_ONE, _mul(_mul(v, v), _GELU_3C)), _SQRT_2_PI)
            d = _add(_mul(_add(_ONE, t), _HALF), _mul(_mul(_mul(v, _HALF), s), du))
        else:
            phi = _mul(_exp(_neg(_mul(_mul(v, v), _HALF)), f, u), _INV_SQRT_2PI)
            cdf = _mul(_add(_ONE, _erf(_mul(v, _SQRT1_2), f, u, small_c, large_c)), _HALF)
            d = _add(cdf, _mul(v, phi))
        out[i] = _mul(dy[i], d)


def _floats(bits) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint32)).view(np.float32)


def _tanh_form(approximate: str) -> bool:
    if approximate not in ops.GELU_MODES:
        raise ValueError(f"GELU approximate must be one of {ops.GELU_MODES}, not {approximate!r}")
    return approximate == "tanh"


def gelu(x, approximate: str = "none") -> np.ndarray:
    """:func:`wse.firmware.training.transformer.gelu`, compiled."""
    if not _tanh_form(approximate):
        fast = _gelu_none_fast(x)
        if fast is not None:
            return fast
    fx = _floats(x)
    out = np.empty_like(fx)
    _gelu_k(fx.reshape(-1), _tanh_form(approximate), out.reshape(-1), _TANH, _ERF_SMALL, _ERF_LARGE)
    return out.view(np.uint32)


def gelu_backward(dy, x, approximate: str = "none") -> np.ndarray:
    """:func:`wse.firmware.training.transformer.gelu_backward`, compiled."""
    if not _tanh_form(approximate):
        fast = _gelu_none_backward_fast(dy, x)
        if fast is not None:
            return fast
    fx, fdy = _floats(x), _floats(dy)
    out = np.empty_like(fx)
    _gelu_backward_k(fdy.reshape(-1), fx.reshape(-1), _tanh_form(approximate), out.reshape(-1), _TANH,
                     _ERF_SMALL, _ERF_LARGE)
    return out.view(np.uint32)


@njit(fastmath=False, cache=True)
def _softmax_k(s, out):
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    seqs, t_len = s.shape[0], s.shape[1]
    for q in range(seqs):
        for i in range(t_len):
            m = s[q, i, 0]
            for j in range(1, i + 1):
                m = _max(m, s[q, i, j])
            z = _ZERO
            for j in range(i + 1):
                e = _exp(_sub(s[q, i, j], m), f, u)
                out[q, i, j] = e
                z = _add(z, e)
            z = _add(z, _ZERO)
            inv = _reciprocal(z, f, u)
            for j in range(i + 1):
                out[q, i, j] = _mul(out[q, i, j], inv)
            for j in range(i + 1, t_len):
                out[q, i, j] = _ZERO


@njit(fastmath=False, cache=True)
def _softmax_backward_k(p, dp, scale, out):
    seqs, t_len = p.shape[0], p.shape[1]
    for q in range(seqs):
        for i in range(t_len):
            r = _ZERO
            for j in range(i + 1):
                r = _add(r, _mul(p[q, i, j], dp[q, i, j]))
            r = _add(r, _ZERO)
            for j in range(i + 1):
                out[q, i, j] = _mul(_mul(p[q, i, j], _sub(dp[q, i, j], r)), scale)
            for j in range(i + 1, t_len):
                out[q, i, j] = _ZERO


def causal_softmax(scores) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.causal_softmax` of ``[S, T, T]``, compiled (the
    exps vectorized where every score is finite and at most ``2^20`` in magnitude)."""
    fs = _floats(scores)
    out = np.empty_like(fs)
    if _fast(fs.reshape(-1)):
        x = np.empty_like(fs)
        _softmax_args_k(fs, x)
        _softmax_finish_k(_exp_fast(x.reshape(-1)).reshape(fs.shape), out)
    else:
        _softmax_k(fs, out)
    return out.view(np.uint32)


def causal_softmax_backward(p, dp, scale: float) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.causal_softmax_backward`, compiled."""
    fp_, fdp = _floats(p), _floats(dp)
    out = np.empty_like(fp_)
    _softmax_backward_k(fp_, fdp, np.float32(scale), out)
    return out.view(np.uint32)


_RSQRT_MAGIC = np.int64(tr.RSQRT_MAGIC)


@njit(cache=True)
def _rsqrt(x, f, u):
    """:func:`wse.firmware.training.transcendental.rsqrt` of one value."""
    f[0] = x
    u[0] = np.uint32((_RSQRT_MAGIC - (np.int64(u[0]) >> 1)) & 0xFFFFFFFF)
    y = f[0]
    h = _mul(x, _HALF)
    for _ in range(2):
        y = _mul(y, _sub(_THREE_HALVES, _mul(h, _mul(y, y))))
    return _add(y, _mul(y, _sub(_HALF, _mul(h, _mul(y, y)))))


@njit(cache=True)
def _feature_sum(v, rows):
    """``+0 + P_0 + P_1 + ...`` with ``P_i = +0 + v[i] + v[i+H] + ... (+0)``."""
    total = _ZERO
    for i in range(rows):
        part = _ZERO
        for k in range(i, v.shape[0], rows):
            part = _add(part, v[k])
        total = _add(total, _add(part, _ZERO))
    return total


@njit(fastmath=False, cache=True)
def _layernorm_k(x, gamma, beta, eps, inv_d, rows, y, xhat, r):
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    d = x.shape[1]
    xc = np.empty(d, dtype=np.float32)
    sq = np.empty(d, dtype=np.float32)
    for t in range(x.shape[0]):
        mean = _mul(_feature_sum(x[t], rows), inv_d)
        for k in range(d):
            xc[k] = _sub(x[t, k], mean)
            sq[k] = _mul(xc[k], xc[k])
        rt = _rsqrt(_add(_mul(_feature_sum(sq, rows), inv_d), eps), f, u)
        r[t] = rt
        for k in range(d):
            xhat[t, k] = _mul(xc[k], rt)
            y[t, k] = _add(_mul(xhat[t, k], gamma[k]), beta[k])


@njit(fastmath=False, cache=True)
def _layernorm_dx_k(dy, gamma, xhat, r, inv_d, rows, dx):
    d = dy.shape[1]
    g = np.empty(d, dtype=np.float32)
    gx = np.empty(d, dtype=np.float32)
    for t in range(dy.shape[0]):
        for k in range(d):
            g[k] = _mul(dy[t, k], gamma[k])
            gx[k] = _mul(g[k], xhat[t, k])
        a = _mul(_feature_sum(g, rows), inv_d)
        c = _mul(_feature_sum(gx, rows), inv_d)
        for k in range(d):
            dx[t, k] = _mul(_sub(_sub(g[k], a), _mul(xhat[t, k], c)), r[t])


def layernorm(x, gamma, beta, eps: float = 1e-5, rows: int = 1) -> tuple[np.ndarray, dict]:
    """:func:`wse.firmware.training.transformer.layernorm` of ``x [N, D]``, compiled: ``(y, saved)``."""
    fx = _floats(x)
    n, d = fx.shape
    y, xhat, r = np.empty_like(fx), np.empty_like(fx), np.empty(n, dtype=np.float32)
    _layernorm_k(fx, _floats(gamma), _floats(beta), np.float32(eps), np.float32(1.0 / d), rows, y, xhat, r)
    return y.view(np.uint32), {"xhat": xhat.view(np.uint32), "r": r.view(np.uint32)}


def layernorm_input_grad(dy, gamma, saved: dict, rows: int = 1) -> np.ndarray:
    """``dx`` of :func:`wse.firmware.training.transformer.layernorm_backward`, compiled."""
    fdy = _floats(dy)
    dx = np.empty_like(fdy)
    _layernorm_dx_k(fdy, _floats(gamma), _floats(saved["xhat"]), _floats(saved["r"]), np.float32(1.0 / fdy.shape[1]),
                    rows, dx)
    return dx.view(np.uint32)


def sequence_cross_entropy_delta(logits, targets, count: int | None = None) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.sequence_cross_entropy_delta` of ``[N, V]``, compiled."""
    z = _floats(logits)
    n, vocab = z.shape
    onehot = np.zeros((vocab, n), dtype=np.float32)
    onehot[np.asarray(targets), np.arange(n)] = 1.0
    scale = np.full(n, 1.0 / (count or n), dtype=np.float32)
    return np.ascontiguousarray(softmax_delta(np.ascontiguousarray(z.T), onehot, scale).T).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# The exact GELU (``approximate='none'``) as branch-free loops that the compiler vectorizes.
# Valid (and used) when every input is finite with |x| <= 2^20: then no operation meets a NaN
# or an infinity, every exp argument is <= 0 (so exp's 2^n is a power of two in [2^-126, 1]
# or the result is flushed), and flushing each result is all the fabric's rules add. The
# stages split where exp adds n to the exponent field (integer arithmetic on a uint32 view).
# The causal softmax (and the loss delta, :mod:`.transformer_loss`) run their exps on the same
# stages under the same condition on their inputs: every argument is then in [-2^21, 0].

_FAST_LIMIT = np.float32(2.0 ** 20)


@njit(inline="always")
def _v(x):
    """Flush a subnormal result to a zero of its sign (branch-free)."""
    return x * _ZERO if abs(x) < _FLT_MIN_E else x


@njit(inline="always")
def _vmax(a, b):
    return a if a > b else (b if b > a else (a + b if a == 0 else a))


@njit(inline="always")
def _vmask(d):
    return _vmax(_v(_vmax(_v(_v(d * _BIG) * _MONE), _MONE) * _MONE), _ZERO)


@njit(fastmath=False, cache=True)
def _exp_stage1(x, p, k):
    """exp's polynomial ``p`` and its ``n`` (as float32) of arguments ``x <= 0``."""
    for i in range(x.size):
        n = np.float32(np.int32(_v(_v(x[i] * _LOG2E) + _MHALF)))
        r = _v(x[i] + _v(n * _MLN2HI))
        r = _v(r + _v(n * _MLN2LO))
        q = _v(r * _C6)
        q = _v(_v(q + _C5) * r)
        q = _v(_v(q + _C4) * r)
        q = _v(_v(q + _C3) * r)
        q = _v(_v(q + _C2) * r)
        q = _v(_v(q + _C1) * r)
        p[i] = _v(q + _C0)
        k[i] = n


@njit(fastmath=False, cache=True)
def _exp_stage2(pbits, k):
    """``bits(p) + n * 2^23`` where the exponent field stays positive, else ``+0`` (in place)."""
    for i in range(pbits.size):
        n = np.int32(k[i])
        b = np.int32(pbits[i])
        pbits[i] = np.uint32(b + (n << 23)) if (b >> 23) + n > 0 else np.uint32(0)


def _exp_fast(x: np.ndarray) -> np.ndarray:
    p, k = np.empty_like(x), np.empty_like(x)
    _exp_stage1(x, p, k)
    _exp_stage2(p.view(np.uint32), k)
    return p


@njit(fastmath=False, cache=True)
def _erf_stage1(u, xc, arg):
    """Clamp ``u`` to ``[-4, 4]`` and the exp argument ``-(|x|^2)``."""
    for i in range(u.size):
        c = _ERF_CLAMP
        x = _vmax(_v(_vmax(_v(u[i] * _MONE), _v(c * _MONE)) * _MONE), _v(c * _MONE))
        a = _vmax(x, _v(x * _MONE))
        xc[i] = x
        arg[i] = _v(_v(a * a) * _MONE)


# erf's coefficients as float32 globals (numba folds them into the code; a loop that
# indexes a tuple with its counter is not vectorized, and was 12x slower).
_S0, _S1, _S2, _S3, _S4, _S5, _S6 = (np.float32(c) for c in _ERF_SMALL)
(_L0, _L1, _L2, _L3, _L4, _L5, _L6, _L7, _L8, _L9, _L10, _L11, _L12) = (np.float32(c) for c in _ERF_LARGE)


@njit(inline="always")
def _h(p, z, c):
    """One Horner step ``add(mul(p, z), c)``."""
    return _v(_v(p * z) + c)


@njit(inline="always")
def _erf_finish(x, e):
    z = _v(x * x)
    q = _h(_h(_h(_h(_h(_h(_S6, z, _S5), z, _S4), z, _S3), z, _S2), z, _S1), z, _S0)
    small = _v(x * q)
    a = _vmax(x, _v(x * _MONE))
    rr = _h(_h(_h(_h(_h(_h(_L12, a, _L11), a, _L10), a, _L9), a, _L8), a, _L7), a, _L6)
    rr = _h(_h(_h(_h(_h(_h(rr, a, _L5), a, _L4), a, _L3), a, _L2), a, _L1), a, _L0)
    large = _v(_ONE - _v(e * rr))
    large = _v(large * _v(_v(_vmask(x) * _TWO) - _ONE))
    m = _vmask(_v(_ERF_SPLIT - a))
    return _v(_v(small * m) + _v(large * _v(_ONE - m)))


@njit(fastmath=False, cache=True)
def _gelu_fast_k(v, xc, e, out):
    for i in range(v.size):
        g = _erf_finish(xc[i], e[i])
        out[i] = _v(_v(v[i] * _HALF) * _v(_ONE + g))


@njit(fastmath=False, cache=True)
def _gelu_fast_backward_k(dy, v, xc, e, e2, out):
    for i in range(v.size):
        phi = _v(e2[i] * _INV_SQRT_2PI)
        cdf = _v(_v(_ONE + _erf_finish(xc[i], e[i])) * _HALF)
        out[i] = _v(dy[i] * _v(cdf + _v(v[i] * phi)))


@njit(fastmath=False, cache=True)
def _scale_k(v, c, out):
    for i in range(v.size):
        out[i] = _v(v[i] * c)


@njit(fastmath=False, cache=True)
def _half_square_k(v, out):
    """``neg(mul(mul(x, x), 0.5))``."""
    for i in range(v.size):
        out[i] = _v(_v(_v(v[i] * v[i]) * _HALF) * _MONE)


@njit(fastmath=False, cache=True)
def _softmax_args_k(s, x):
    """exp's arguments of the causal softmax: ``sub(s[i, j], m_i)`` for ``j <= i`` (``m_i`` the
    running ``max`` of the row's visible scores, each flushed as read), ``+0`` above the diagonal.
    With finite scores of at most ``2^20`` each is in ``[-2^21, 0]``, the range of :func:`_exp_fast`."""
    for q in range(s.shape[0]):
        for i in range(s.shape[1]):
            row, xr = s[q, i], x[q, i]
            m = _v(row[0])
            for j in range(1, i + 1):
                m = _vmax(m, _v(row[j]))
            for j in range(i + 1):
                xr[j] = _v(_v(row[j]) - m)
            for j in range(i + 1, xr.shape[0]):
                xr[j] = _ZERO


@njit(fastmath=False, cache=True)
def _softmax_finish_k(e, out):
    """``p = mul(e, reciprocal(Z))`` with ``Z = +0 + e[i, 0] + ... + e[i, i] (+0)`` (every term
    in ``[0, 1]``, ``Z >= 1``: nothing to flush, no NaN), ``+0`` above the diagonal."""
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    for q in range(e.shape[0]):
        for i in range(e.shape[1]):
            er, o = e[q, i], out[q, i]
            z = _ZERO
            for j in range(i + 1):
                z = _v(z + er[j])
            inv = _reciprocal(_v(z + _ZERO), f, u)
            for j in range(i + 1):
                o[j] = _v(er[j] * inv)
            for j in range(i + 1, o.shape[0]):
                o[j] = _ZERO


def _fast(fx: np.ndarray) -> bool:
    return bool(fx.size) and bool(np.all(np.abs(fx) <= _FAST_LIMIT))


def _erf_inputs(fx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    u = np.empty_like(fx)
    _scale_k(fx, _SQRT1_2, u)
    xc, arg = np.empty_like(fx), np.empty_like(fx)
    _erf_stage1(u, xc, arg)
    return xc, _exp_fast(arg)


def _gelu_none_fast(x) -> np.ndarray | None:
    fx = np.ascontiguousarray(fp.vftz(x)).view(np.float32).reshape(-1)
    if not _fast(fx):
        return None
    xc, e = _erf_inputs(fx)
    out = np.empty_like(fx)
    _gelu_fast_k(fx, xc, e, out)
    return out.view(np.uint32).reshape(np.shape(x))


def _gelu_none_backward_fast(dy, x) -> np.ndarray | None:
    fx = np.ascontiguousarray(fp.vftz(x)).view(np.float32).reshape(-1)
    fdy = np.ascontiguousarray(fp.vftz(dy)).view(np.float32).reshape(-1)
    if not (_fast(fx) and bool(np.all(np.isfinite(fdy)))):
        return None
    xc, e = _erf_inputs(fx)
    half_square = np.empty_like(fx)
    _half_square_k(fx, half_square)
    out = np.empty_like(fx)
    _gelu_fast_backward_k(fdy, fx, xc, e, _exp_fast(half_square), out)
    return out.view(np.uint32).reshape(np.shape(x))
