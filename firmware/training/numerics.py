"""The float algorithms of the training firmware that are more than one
instruction: ``exp``, the reciprocal and the softmax cross-entropy delta.

Each function here computes, bit for bit, what ``train.s`` computes, with the
fabric's binary32 rules (:mod:`wse.numerics`): it is both the
reference the firmware is tested against and the implementation the
functional backend runs. The constants are defined once, here, and handed to
the assembler by :func:`assembler_defines`.

Accuracy (measured by ``tests/test_weight_streaming.py``, see
``docs/weight_streaming.md``): :func:`exp` is within 1 ulp of the correctly
rounded ``exp(x)`` for ``-87 <= x <= 0``; :func:`reciprocal` within 1 ulp of
the correctly rounded ``1/s`` for ``1 <= s <= 5000``.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp

__all__ = ["EXP_CONSTANTS", "EXP_COEFFS", "RCP_MAGIC", "exp", "reciprocal", "softmax_delta",
           "assembler_defines"]

#: Range reduction constants of ``exp`` (binary32 bit patterns): log2(e),
#: -0.5 (rounding), -ln2 split into a high part with 15 significant bits (so
#: ``n * hi`` is exact for ``|n| < 512``) and the low remainder (Cody and Waite).
EXP_CONSTANTS = {"LOG2E": 0x3FB8AA3B, "MHALF": 0xBF000000, "MLN2HI": 0xBF317200, "MLN2LO": 0xB5BFBE8E}

#: ``exp(r) ~ c0 + c1 r + ... + c6 r^6`` on ``|r| <= ln2/2``: a Chebyshev fit
#: in binary64 rounded to binary32 (``c0 .. c2`` are exactly 1, 1, 1/2).
EXP_COEFFS = (0x3F800000, 0x3F800000, 0x3F000000, 0x3E2AAA02, 0x3D2AAA32, 0x3C0937DF, 0x3AB6D3B6)

#: First guess of ``1/s`` as ``RCP_MAGIC - bits(s)`` (integer arithmetic).
RCP_MAGIC = 0x7EF311C3

_ONE, _TWO = 0x3F800000, 0x40000000


def _u32(value) -> np.ndarray:
    return np.asarray(value, dtype=np.uint32)


def _k(bits: int) -> np.ndarray:
    """A constant as a one-element array (broadcasts; avoids numpy scalar overflow warnings)."""
    return np.array([bits], dtype=np.uint32)


def exp(x) -> np.ndarray:
    """``exp`` of binary32 bit patterns ``x`` (all ``<= 0``), as the firmware computes it.

    Order of operations, elementwise::

        t  = mul(x, LOG2E);  n = ftoi(add(t, -0.5));  nf = itof(n)
        r  = add(x, mul(nf, -LN2HI));  r = add(r, mul(nf, -LN2LO))
        p  = mul(r, c6); p = add(p, c5); p = mul(p, r); ... ; p = add(p, c1); p = mul(p, r); p = add(p, c0)
        e  = bits(p) + n * 2^23   if (bits(p) >> 23) + n > 0   else +0   (integer arithmetic)
    """
    x = _u32(x)
    c = EXP_CONSTANTS
    t = fp.vmul(x, _k(c["LOG2E"]))
    n = fp.vftoi(fp.vadd(t, _k(c["MHALF"])))
    nf = fp.vitof(n)
    r = fp.vadd(x, fp.vmul(nf, _k(c["MLN2HI"])))
    r = fp.vadd(r, fp.vmul(nf, _k(c["MLN2LO"])))
    p = fp.vmul(r, _k(EXP_COEFFS[6]))
    for k in range(5, -1, -1):
        p = fp.vadd(p, _k(EXP_COEFFS[k]))
        if k:
            p = fp.vmul(p, r)
    n_int = n.view(np.int32).astype(np.int64)
    field = (p.astype(np.int64) >> 23) + n_int
    field = ((field + (1 << 31)) % (1 << 32)) - (1 << 31)   # the 32-bit signed sum the PE compares
    scaled = (p.astype(np.int64) + (n_int << 23)) & 0xFFFFFFFF
    return np.where(field > 0, scaled, 0).astype(np.uint32)


def reciprocal(s) -> np.ndarray:
    """``1/s`` of binary32 bit patterns ``s`` (``s >= 1``), as the firmware computes it::

        y = RCP_MAGIC - bits(s)                            (integer)
        twice: q = mul(s, y); q = sub(2, q); y = mul(y, q)
        once:  q = mul(s, y); q = sub(1, q); q = mul(y, q); y = add(y, q)
    """
    s = _u32(s)
    y = ((RCP_MAGIC - s.astype(np.int64)) & 0xFFFFFFFF).astype(np.uint32)
    for _ in range(2):
        y = fp.vmul(y, fp.vsub(_k(_TWO), fp.vmul(s, y)))
    q = fp.vmul(y, fp.vsub(_k(_ONE), fp.vmul(s, y)))
    return fp.vadd(y, q)


def softmax_delta(z, onehot, scale) -> np.ndarray:
    """The softmax cross-entropy delta of logits ``z`` (bits ``[C, T]``, class-major).

    ``onehot`` is ``[C, T]`` (1.0 at each token's label, else 0) and ``scale``
    ``[T]`` (``1/n`` for the ``n`` real samples of the batch, 0 for padding).
    Per token, in class order::

        m = z[0]; m = max(m, z[c]) for c = 1 .. C-1
        x[c] = sub(z[c], m);  e[c] = exp(x[c])
        S = e[0]; S = add(S, e[c]) for c = 1 .. C-1;  inv = reciprocal(S)
        delta[c] = mul(sub(mul(e[c], inv), onehot[c]), scale)
    """
    z = _u32(z)
    m = z[0]
    for c in range(1, z.shape[0]):
        m = fp.vmax(m, z[c])
    e = exp(fp.vsub(z, m[None, :]))
    total = e[0]
    for c in range(1, z.shape[0]):
        total = fp.vadd(total, e[c])
    inv = reciprocal(total)
    return fp.vmul(fp.vsub(fp.vmul(e, inv[None, :]), _u32(onehot)), _u32(scale)[None, :])


def assembler_defines() -> dict[str, int]:
    """The constants above as ``train.s`` names them (``EXP_C0 .. EXP_C6``, ``EXP_LOG2E``, ...)."""
    defines = {f"EXP_{name}": bits for name, bits in EXP_CONSTANTS.items()}
    defines.update({f"EXP_C{k}": bits for k, bits in enumerate(EXP_COEFFS)})
    defines["RCP_MAGIC"] = RCP_MAGIC
    return defines
