"""Binary32 arithmetic exactly as the PE's FPU does it.

The one home of the fabric's numerics. Values are carried as their raw 32-bit
patterns (Python ``int`` or ``numpy.uint32`` arrays). Rules (see
``docs/architecture.md``, "Numerics"):

* inputs: a subnormal operand is replaced by zero of the same sign;
* add, subtract, multiply: the IEEE-754 binary32 result, round to nearest
  even (gradual underflow); a subnormal result is then replaced by zero of the
  same sign (equivalently: flushed iff ``|exact| < 2**-126 - 2**-150``);
  overflow gives a signed infinity;
* any NaN result is the canonical quiet NaN ``0x7fc00000``;
* multiply-accumulate is ``add(acc, mul(a, b))``: two roundings, never fused;
* ``max``: NaN if either operand is NaN, ``+0`` beats ``-0``;
* ``lt``: IEEE ordered less-than on flushed operands (``-0 < +0`` is false);
* ``ftoi``: truncate toward zero, saturate to int32, NaN gives 0;
* ``itof``: signed int32 to binary32, round to nearest even.

Scalar functions take and return ``int`` bit patterns; the ``v*`` functions
take and return ``uint32`` arrays and give the same bits element by element.
Results are computed in binary64 and rounded once to binary32, which is exact
for +, - and * (binary64 has more than 2*24+2 bits of precision).
"""

from __future__ import annotations

import struct

import numpy as np

__all__ = [
    "CANONICAL_NAN", "f2b", "b2f", "ftz", "add", "sub", "mul", "fmax", "lt",
    "ftoi", "itof", "mac", "vftz", "vadd", "vsub", "vmul", "vmax", "vmac",
    "vftoi", "vitof", "vlt", "seq_dot", "seq_sum", "as_bits", "as_float",
]

CANONICAL_NAN = 0x7FC00000
_SIGN = 0x80000000
_EXP = 0x7F800000
_MAN = 0x007FFFFF
_F = struct.Struct("<f")
_I = struct.Struct("<I")


def f2b(value: float) -> int:
    """Bits of a Python float rounded to binary32 (round to nearest even,
    overflow to infinity); no flushing."""
    try:
        return _I.unpack(_F.pack(value))[0]
    except OverflowError:
        return 0x7F800000 if value > 0 else 0xFF800000


def b2f(bits: int) -> float:
    """The value of a binary32 bit pattern as a Python float."""
    return _F.unpack(_I.pack(bits & 0xFFFFFFFF))[0]


def ftz(bits: int) -> int:
    """Flush a subnormal pattern to zero of the same sign."""
    return bits & _SIGN if not bits & _EXP else bits


def _finish(value: float) -> int:
    if value != value:
        return CANONICAL_NAN
    return ftz(f2b(value))


def add(a: int, b: int) -> int:
    """``a + b``."""
    return _finish(b2f(ftz(a)) + b2f(ftz(b)))


def sub(a: int, b: int) -> int:
    """``a - b``."""
    return _finish(b2f(ftz(a)) - b2f(ftz(b)))


def mul(a: int, b: int) -> int:
    """``a * b``."""
    return _finish(b2f(ftz(a)) * b2f(ftz(b)))


def mac(acc: int, a: int, b: int) -> int:
    """``add(acc, mul(a, b))``: the FMAC, two roundings."""
    return add(acc, mul(a, b))


def _isnan(bits: int) -> bool:
    return (bits & _EXP) == _EXP and bool(bits & _MAN)


def fmax(a: int, b: int) -> int:
    """``max(a, b)``; NaN if either is NaN; ``+0`` beats ``-0``."""
    a, b = ftz(a), ftz(b)
    if _isnan(a) or _isnan(b):
        return CANONICAL_NAN
    fa, fb = b2f(a), b2f(b)
    if fa == fb:
        return a & b  # equal values differ only in the sign of zero: +0 wins
    return a if fa > fb else b


def lt(a: int, b: int) -> int:
    """1 if ``a < b`` (IEEE ordered compare on flushed operands) else 0."""
    a, b = ftz(a), ftz(b)
    if _isnan(a) or _isnan(b):
        return 0
    return int(b2f(a) < b2f(b))


def ftoi(a: int) -> int:
    """binary32 to int32 bits: truncate toward zero, saturate, NaN gives 0."""
    a = ftz(a)
    if _isnan(a):
        return 0
    value = b2f(a)
    if value >= 2147483648.0:
        return 0x7FFFFFFF
    if value < -2147483648.0:
        return 0x80000000
    return int(value) & 0xFFFFFFFF


def itof(a: int) -> int:
    """Signed int32 bits to binary32, round to nearest even."""
    a &= 0xFFFFFFFF
    return f2b(float(a - (1 << 32) if a & _SIGN else a))


# Vectorized forms -----------------------------------------------------------

def as_bits(values) -> np.ndarray:
    """float32 values (anything numpy converts) as a ``uint32`` pattern array."""
    return np.ascontiguousarray(np.asarray(values, dtype=np.float32)).view(np.uint32)


def as_float(bits) -> np.ndarray:
    """``uint32`` patterns as a float32 array (a view where possible)."""
    return np.ascontiguousarray(np.asarray(bits, dtype=np.uint32)).view(np.float32)


def vftz(bits: np.ndarray) -> np.ndarray:
    """Elementwise :func:`ftz` of a ``uint32`` array (a new array)."""
    bits = np.asarray(bits, dtype=np.uint32)
    return np.where((bits & _EXP) == 0, bits & _SIGN, bits).astype(np.uint32)


def _all_normal(bits: np.ndarray) -> bool:
    """True if every pattern is a finite, normal number (exponent field 1..254)."""
    exponent = bits & _EXP
    return bool(np.all((exponent != 0) & (exponent != _EXP)))


def _ftz_in(bits) -> np.ndarray:
    """Operands flushed on input; the common all-normal case costs no copy."""
    bits = np.asarray(bits, dtype=np.uint32)
    return bits if _all_normal(bits) else vftz(bits)


def _vfinish(values: np.ndarray) -> np.ndarray:
    out = values.astype(np.float32, copy=False).view(np.uint32)
    if _all_normal(out):
        return out
    out = vftz(out)
    out[np.isnan(values)] = CANONICAL_NAN
    return out


def _vop(op, a, b) -> np.ndarray:
    fa = _ftz_in(a).view(np.float32)
    fb = _ftz_in(b).view(np.float32)
    with np.errstate(all="ignore"):
        return _vfinish(op(fa, fb))


def vadd(a, b) -> np.ndarray:
    """Elementwise :func:`add`."""
    return _vop(np.add, a, b)


def vsub(a, b) -> np.ndarray:
    """Elementwise :func:`sub`."""
    return _vop(np.subtract, a, b)


def vmul(a, b) -> np.ndarray:
    """Elementwise :func:`mul`."""
    return _vop(np.multiply, a, b)


def vmac(acc, a, b) -> np.ndarray:
    """Elementwise :func:`mac`: ``vadd(acc, vmul(a, b))``."""
    return vadd(acc, vmul(a, b))


def vmax(a, b) -> np.ndarray:
    """Elementwise :func:`fmax`."""
    a, b = vftz(a), vftz(b)
    fa, fb = a.view(np.float32), b.view(np.float32)
    out = np.where(fa > fb, a, b)
    out = np.where(fa == fb, a & b, out).astype(np.uint32)
    out[np.isnan(fa) | np.isnan(fb)] = CANONICAL_NAN
    return out


def vftoi(a) -> np.ndarray:
    """Elementwise :func:`ftoi`."""
    with np.errstate(invalid="ignore"):
        fa = vftz(a).view(np.float32).astype(np.float64)
        out = np.trunc(np.clip(np.nan_to_num(fa, nan=0.0), -2147483648.0, 2147483647.0))
    return out.astype(np.int64).astype(np.uint32)


def vlt(a, b) -> np.ndarray:
    """Elementwise :func:`lt` (``uint32`` 0 or 1)."""
    fa, fb = vftz(a).view(np.float32), vftz(b).view(np.float32)
    return (fa < fb).astype(np.uint32)


def vitof(a) -> np.ndarray:
    """Elementwise :func:`itof`."""
    ints = np.asarray(a, dtype=np.uint32).view(np.int32)
    return ints.astype(np.float32).view(np.uint32)


def seq_dot(acc: int, a, b) -> int:
    """``acc = add(acc, mul(a[i], b[i]))`` for i in order (the ``dot`` order)."""
    products = vmul(a, b)
    return seq_sum(acc, products)


def seq_sum(acc: int, a) -> int:
    """``acc = add(acc, a[i])`` for i in order (the ``fsum`` order).

    Uses a float32 cumulative sum (sequential, one rounding per step) and
    falls back to the scalar loop when a partial sum could be NaN or
    subnormal, where the flushing rules differ from plain IEEE.
    """
    a = vftz(a)
    if a.size == 0:
        return acc
    values = np.concatenate([vftz(np.array([acc], dtype=np.uint32)), a]).view(np.float32)
    with np.errstate(all="ignore"):
        partial = np.cumsum(values, dtype=np.float32)
    bits = partial.view(np.uint32)
    if np.all(np.isfinite(partial)) and not np.any(((bits & _EXP) == 0) & ((bits & _MAN) != 0)):
        # A cumulative sum could also produce -0 + +0 style sign differences only at
        # zero partials; scalar add gives the same IEEE result there.
        return int(bits[-1])
    for value in a.tolist():
        acc = add(acc, value)
    return acc
