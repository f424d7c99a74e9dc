"""Transcendental functions in the PE's arithmetic, for the transformer's
operations: ``rsqrt`` (LayerNorm), ``tanh`` and ``erf`` (the two GELUs), and
the branch-free helpers they share, on top of :mod:`.numerics`' ``exp``
(``x <= 0``) and ``reciprocal`` (``s >= 1``) that the softmax already uses.

Every function takes and returns binary32 bit patterns (``uint32`` arrays)
and is built only from operations the PE has (``wse.numerics``: add, sub,
mul, max, ftoi, itof, flush-to-zero, and integer arithmetic on the bits), in
the order written in its docstring, so a PE program doing the same
instructions gets the same bits. There is no vector compare: a choice between
two branches computes both and blends them with a 0/1 mask made of
``mul`` and ``max`` (:func:`mask_positive`, :func:`select`), which keeps the
timing independent of the data.

Accuracy against float64 (``bench/transcendental.py`` prints it, the tests
check it; ``docs/transformer.md`` section 2 lists it): ``rsqrt`` at most 1
ulp on ``[2^-125, 2^125]``, ``tanh`` at most 2 ulp, ``erf`` at most 2 ulp on
the whole line; ulps are counted from the correctly rounded binary32 value.

The polynomial coefficients are Chebyshev fits in binary64 (on the
reduced variable named in each function), rounded to binary32.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp

from .numerics import exp, reciprocal

__all__ = ["RSQRT_MAGIC", "TANH_SPLIT", "TANH_COEFFS", "ERF_SPLIT", "ERF_SMALL_COEFFS", "ERF_LARGE_COEFFS",
           "ERF_CLAMP", "TANH_CLAMP", "exp", "reciprocal", "rsqrt", "tanh", "erf", "neg", "absolute",
           "minimum", "mask_positive", "select", "horner", "const", "ulp_error", "ACCURACY", "measure"]

#: First guess of ``1/sqrt(x)`` as ``RSQRT_MAGIC - (bits(x) >> 1)`` (integer arithmetic).
RSQRT_MAGIC = 0x5F375A86

#: ``tanh`` uses its odd polynomial below this ``|x|`` and the exponential form above.
TANH_SPLIT = 0x3F200000          # 0.625
#: ``x`` is clamped to ``[-TANH_CLAMP, TANH_CLAMP]`` first (``tanh(10)`` is 1.0 in binary32).
TANH_CLAMP = 0x41200000          # 10.0
#: ``tanh(x) ~ x + x z P(z)``, ``z = x^2``, ``P(z) = c0 + c1 z + ... + c6 z^6`` on ``z <= 0.625^2``.
TANH_COEFFS = (0xBEAAAAAB, 0x3E088888, 0xBD5D0D2F, 0x3CB313C9, 0xBC100AB6, 0x3B58C4DC, 0xBA62554C)

#: ``erf`` uses its odd polynomial below this ``|x|`` and ``1 - exp(-x^2) R(x)`` above.
ERF_SPLIT = 0x3F600000           # 0.875
#: ``x`` is clamped to ``[-ERF_CLAMP, ERF_CLAMP]`` first (``erf(4)`` is 1.0 in binary32).
ERF_CLAMP = 0x40800000           # 4.0
#: ``erf(x) ~ x Q(z)``, ``z = x^2``, ``Q`` of degree 6 on ``z <= 0.875^2``.
ERF_SMALL_COEFFS = (0x3F906EBB, 0xBEC093A2, 0x3DE71746, 0xBCDC0D27, 0x3BAAA09D, 0xBA575DB5, 0x38B65727)
#: ``erfc(a) exp(a^2) ~ R(a)``, degree 12 in ``a`` on ``0.875 <= a <= 4``.
ERF_LARGE_COEFFS = (0x3F7F9EDA, 0xBF8F0306, 0x3F763FBB, 0xBF2C225D, 0x3EC5028D, 0xBE36A347, 0x3D86A57A,
                    0xBC9A5920, 0x3B85BA67, 0xBA286D13, 0x3890F832, 0xB6982691, 0x34129C61)

_ONE, _HALF, _THREE_HALVES, _MONE, _TWO = 0x3F800000, 0x3F000000, 0x3FC00000, 0xBF800000, 0x40000000
_ZERO, _MTWO, _BIG = 0x00000000, 0xC0000000, 0x7F000000   # 2^127


def const(bits: int) -> np.ndarray:
    """A binary32 constant (its bit pattern) as a one-element array that broadcasts."""
    return np.array([bits], dtype=np.uint32)


def _u32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.uint32)


def neg(x) -> np.ndarray:
    """``mul(x, -1)``: the negation, exact."""
    return fp.vmul(_u32(x), const(_MONE))


def absolute(x) -> np.ndarray:
    """``max(x, mul(x, -1))``: the magnitude, exact (``+0`` for both zeros)."""
    x = _u32(x)
    return fp.vmax(x, neg(x))


def minimum(x, c) -> np.ndarray:
    """``mul(max(mul(x, -1), mul(c, -1)), -1)``: the smaller of ``x`` and ``c``, exact."""
    return neg(fp.vmax(neg(x), neg(c)))


def mask_positive(d) -> np.ndarray:
    """``1.0`` where ``d > 0`` and ``+0`` elsewhere, from FPU operations only::

        u = mul(d, 2^127); v = max(mul(u, -1), -1); m = max(mul(v, -1), +0)

    Any positive normal ``d`` gives ``u >= 2`` (``v = -1``, ``m = 1``); ``d <= 0``
    gives ``v >= 0`` and ``m = +0``. A positive subnormal ``d`` is flushed: ``+0``.
    """
    u = fp.vmul(_u32(d), const(_BIG))
    v = fp.vmax(neg(u), const(_MONE))
    return fp.vmax(neg(v), const(_ZERO))


def select(mask, a, b) -> np.ndarray:
    """``add(mul(a, m), mul(b, sub(1, m)))``: ``a`` where the mask is 1, ``b`` where
    it is 0 (exact when both are finite; the sign of a zero result may differ)."""
    mask = _u32(mask)
    return fp.vadd(fp.vmul(_u32(a), mask), fp.vmul(_u32(b), fp.vsub(const(_ONE), mask)))


def horner(coeffs, z) -> np.ndarray:
    """``p = c_n; p = add(mul(p, z), c_k)`` for ``k = n-1 .. 0``: the polynomial with
    binary32 coefficients ``coeffs`` (lowest degree first) at ``z``."""
    z = _u32(z)
    p = np.broadcast_to(const(coeffs[-1]), z.shape).astype(np.uint32)
    for c in reversed(coeffs[:-1]):
        p = fp.vadd(fp.vmul(p, z), const(c))
    return p


def rsqrt(x) -> np.ndarray:
    """``1/sqrt(x)`` of binary32 bit patterns ``x`` in ``[2^-125, 2^125]``::

        y  = RSQRT_MAGIC - (bits(x) >> 1)            (integer)
        h  = mul(x, 0.5)
        twice: q = mul(y, y); q = mul(h, q); q = sub(1.5, q); y = mul(y, q)
        once:  q = mul(y, y); q = mul(h, q); q = sub(0.5, q); q = mul(y, q); y = add(y, q)

    At most 1 ulp from the correctly rounded value (outside the range ``h`` or
    ``y*y`` would be flushed).
    """
    x = _u32(x)
    y = ((RSQRT_MAGIC - (x.astype(np.int64) >> 1)) & 0xFFFFFFFF).astype(np.uint32)
    h = fp.vmul(x, const(_HALF))
    for _ in range(2):
        y = fp.vmul(y, fp.vsub(const(_THREE_HALVES), fp.vmul(h, fp.vmul(y, y))))
    q = fp.vmul(y, fp.vsub(const(_HALF), fp.vmul(h, fp.vmul(y, y))))
    return fp.vadd(y, q)


def _sign(x) -> np.ndarray:
    """``sub(mul(mask_positive(x), 2), 1)``: ``+1`` where ``x > 0``, ``-1`` elsewhere."""
    return fp.vsub(fp.vmul(mask_positive(x), const(_TWO)), const(_ONE))


def tanh(x) -> np.ndarray:
    """``tanh`` of binary32 bit patterns ``x`` (any finite value), branch-free::

        x = max(min(x, 10), -10)     (both branches stay finite; tanh(10) is 1.0)
        z = mul(x, x);  small = add(x, mul(x, mul(z, P(z))))        (horner, TANH_COEFFS)
        a = |x|;  e = exp(mul(a, -2))
        large = mul(sub(1, e), reciprocal(add(1, e)));  large = mul(large, sign(x))
        tanh = select(mask_positive(sub(0.625, |x|)), small, large)

    At most 2 ulp from the correctly rounded value. ``e <= exp(-1.25)`` in the
    large branch, so ``1 - e`` loses no accuracy and ``1 + e`` is in ``[1, 2)``,
    the reciprocal's range.
    """
    x = fp.vmax(minimum(x, const(TANH_CLAMP)), neg(const(TANH_CLAMP)))
    z = fp.vmul(x, x)
    small = fp.vadd(x, fp.vmul(x, fp.vmul(z, horner(TANH_COEFFS, z))))
    a = absolute(x)
    e = exp(fp.vmul(a, const(_MTWO)))
    large = fp.vmul(fp.vsub(const(_ONE), e), reciprocal(fp.vadd(const(_ONE), e)))
    large = fp.vmul(large, _sign(x))
    return select(mask_positive(fp.vsub(const(TANH_SPLIT), a)), small, large)


def erf(x) -> np.ndarray:
    """``erf`` of binary32 bit patterns ``x`` (any finite value), branch-free::

        x = max(min(x, 4), -4)       (both branches stay finite; erf(4) is 1.0)
        z = mul(x, x);  small = mul(x, Q(z))                         (horner, ERF_SMALL_COEFFS)
        a = |x|;  e = exp(mul(mul(a, a), -1))
        large = sub(1, mul(e, R(a)));  large = mul(large, sign(x))   (horner, ERF_LARGE_COEFFS)
        erf = select(mask_positive(sub(0.875, |x|)), small, large)

    At most 2 ulp from the correctly rounded value.
    """
    x = fp.vmax(minimum(x, const(ERF_CLAMP)), neg(const(ERF_CLAMP)))
    small = fp.vmul(x, horner(ERF_SMALL_COEFFS, fp.vmul(x, x)))
    a = absolute(x)
    e = exp(neg(fp.vmul(a, a)))
    large = fp.vsub(const(_ONE), fp.vmul(e, horner(ERF_LARGE_COEFFS, a)))
    large = fp.vmul(large, _sign(x))
    return select(mask_positive(fp.vsub(const(ERF_SPLIT), a)), small, large)


def ulp_error(bits, truth) -> np.ndarray:
    """How many binary32 values lie between ``bits`` and the correctly rounded
    ``truth`` (float64 values): 0 where the result is correctly rounded.

    Both are mapped to a signed ordinal (``-0`` and ``+0`` are the same), so the
    count is right across zero.
    """
    def ordinal(pattern: np.ndarray) -> np.ndarray:
        signed = pattern.view(np.int32).astype(np.int64)
        return np.where(signed < 0, -(signed & 0x7FFFFFFF), signed)

    exact = np.asarray(truth, dtype=np.float64).astype(np.float32).view(np.uint32)
    return np.abs(ordinal(_u32(bits)) - ordinal(exact))


def _erf64(values: np.ndarray) -> np.ndarray:
    import math
    return np.frompyfunc(math.erf, 1, 1)(values).astype(np.float64)


def _odd_points(limit: float, n: int) -> np.ndarray:
    """A uniform grid on ``[-limit, limit]`` plus geometric grids toward zero on both sides."""
    tiny = np.geomspace(2.0**-120, limit, n // 4)
    return np.concatenate([np.linspace(-limit, limit, n - 2 * (n // 4)), tiny, -tiny])


#: ``name: (function, float64 reference, points(n), range in words, documented max ulp)``.
ACCURACY = {
    "exp": (exp, np.exp, lambda n: np.linspace(-87.0, 0.0, n), "[-87, 0]", 1),
    "reciprocal": (reciprocal, lambda s: 1.0 / s, lambda n: np.linspace(1.0, 5000.0, n), "[1, 5000]", 1),
    "rsqrt": (rsqrt, lambda x: 1.0 / np.sqrt(x), lambda n: np.geomspace(2.0**-125, 2.0**125, n),
              "[2^-125, 2^125]", 1),
    "tanh": (tanh, np.tanh, lambda n: _odd_points(12.0, n), "[-12, 12] (1 beyond)", 2),
    "erf": (erf, _erf64, lambda n: _odd_points(6.0, n), "[-6, 6] (+-1 beyond)", 2),
}


def measure(name: str, n: int = 400_001) -> dict:
    """Accuracy of one function of :data:`ACCURACY` over ``n`` binary32 points of
    its range: ``{"function", "range", "points", "max_ulp", "correctly_rounded"
    (fraction), "worst_x", "bound"}``."""
    function, reference, points, where, bound = ACCURACY[name]
    x = np.unique(np.asarray(points(n), dtype=np.float32))
    err = ulp_error(function(fp.as_bits(x)), reference(x.astype(np.float64)))
    return {"function": name, "range": where, "points": int(x.size), "max_ulp": int(err.max()),
            "correctly_rounded": round(float(np.mean(err == 0)), 4), "worst_x": float(x[int(err.argmax())]),
            "bound": bound}
