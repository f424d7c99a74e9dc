"""Binary32 operations of :mod:`wse.numerics` as compiled (numba) scalar functions.

The same rules as ``wse.numerics`` (the one home of the fabric's numerics):
subnormal operands read as zero of their sign, the IEEE binary32 result
rounded to nearest even, a subnormal result flushed to zero of its sign, any
NaN result the canonical NaN, no fused multiply-add (``fastmath=False``
leaves LLVM no licence to contract ``a * b + c``). Values are ``uint32`` bit
patterns; :func:`as_f32` and :func:`as_u32` reinterpret them (an LLVM
bitcast). ``tests/test_vector_numerics.py`` checks these against
``wse.numerics`` on random and special patterns.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["as_f32", "as_u32", "ftz", "fadd", "fsub", "fmul", "fmax", "elementwise", "VOPS"]

_SIGN = np.uint32(0x80000000)
_EXP = np.uint32(0x7F800000)
_NAN = np.uint32(0x7FC00000)

#: Vector operation codes of the compiled kernels, by instruction name.
VOPS = {"fmov": 0, "fadd": 1, "fsub": 2, "fmul": 3, "fmax": 4, "fmacs": 5, "fmuls": 6, "fadds": 7,
        "fmaxs": 8, "dot": 9, "fsum": 10, "fmacw": 11}


@intrinsic
def as_f32(typingctx, bits):
    """The binary32 value whose pattern is the ``uint32`` ``bits``."""
    if bits != types.uint32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.uint32), codegen


@intrinsic
def as_u32(typingctx, value):
    """The ``uint32`` pattern of the binary32 ``value``."""
    if value != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.uint32(types.float32), codegen


@njit(inline="always")
def ftz(bits):
    """A subnormal pattern flushed to zero of its sign."""
    b = np.uint32(bits)
    return np.uint32(b & _SIGN) if b & _EXP == 0 else b


@njit(inline="always")
def _finish(x):
    if x != x:
        return _NAN
    return ftz(as_u32(x))


@njit(inline="always")
def fadd(a, b):
    """``wse.numerics.add``."""
    return _finish(as_f32(ftz(a)) + as_f32(ftz(b)))


@njit(inline="always")
def fsub(a, b):
    """``wse.numerics.sub``."""
    return _finish(as_f32(ftz(a)) - as_f32(ftz(b)))


@njit(inline="always")
def fmul(a, b):
    """``wse.numerics.mul``."""
    return _finish(as_f32(ftz(a)) * as_f32(ftz(b)))


@njit(inline="always")
def fmax(a, b):
    """``wse.numerics.fmax``: NaN if either is NaN, ``+0`` beats ``-0``."""
    a, b = ftz(a), ftz(b)
    fa, fb = as_f32(a), as_f32(b)
    if fa != fa or fb != fb:
        return _NAN
    if fa == fb:
        return np.uint32(a & b)
    return a if fa > fb else b


@njit(inline="always")
def elementwise(op, a, b, s):
    """Element ``op`` (a :data:`VOPS` code below ``dot``) of operands ``a``, ``b`` and scalar ``s``."""
    if op == 0:
        return np.uint32(a)
    if op == 1:
        return fadd(a, b)
    if op == 2:
        return fsub(a, b)
    if op == 3:
        return fmul(a, b)
    if op == 4:
        return fmax(a, b)
    if op == 5:
        return fadd(a, fmul(b, s))
    if op == 6:
        return fmul(a, s)
    if op == 7:
        return fadd(a, s)
    return fmax(a, s)
