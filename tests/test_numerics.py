"""The fabric's binary32 numerics against numpy, and scalar against vectorized."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from wse import numerics as fp

bits32 = st.integers(min_value=0, max_value=0xFFFFFFFF)

MIN_NORMAL = 0x00800000
MAX_SUB = 0x007FFFFF
MAX_NORMAL = 0x7F7FFFFF
INF, NINF = 0x7F800000, 0xFF800000
SNAN, QNAN_PAYLOAD = 0x7F800001, 0xFFC12345


def f(x):
    return fp.f2b(x)


def numpy_ref(op, a, b):
    """IEEE binary32 in numpy, with the fabric's flush and NaN rules applied around it."""
    fa = np.array([fp.ftz(a)], dtype=np.uint32).view(np.float32)
    fb = np.array([fp.ftz(b)], dtype=np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        r = op(fa, fb)
    if np.isnan(r[0]):
        return fp.CANONICAL_NAN
    return fp.ftz(int(r.view(np.uint32)[0]))


@pytest.mark.parametrize("a,b,expected", [
    (f(1.0), f(2.0 ** -24), f(1.0)),                  # tie, round to even (down)
    (f(1.0 + 2.0 ** -23), f(2.0 ** -24), f(1.0 + 2.0 ** -22)),  # tie, round to even (up)
    (MAX_NORMAL, f(2.0 ** 103), INF),                  # overflow to +inf
    (f(-1.5), f(1.5), 0),                              # x + (-x) = +0
    (0x80000000, 0x80000000, 0x80000000),              # -0 + -0 = -0
    (0x80000000, 0, 0),                                # -0 + +0 = +0
    (MAX_SUB, 0, 0),                                   # subnormal input flushed
    (0x807FFFFF, 0x80000000, 0x80000000),              # negative subnormal -> -0
    (INF, NINF, fp.CANONICAL_NAN),                     # inf - inf
    (SNAN, f(1.0), fp.CANONICAL_NAN),                  # NaN payloads are not kept
    (QNAN_PAYLOAD, f(1.0), fp.CANONICAL_NAN),
    (MIN_NORMAL, 0x80800001, 0x80000000),              # exact result subnormal -> signed zero
])
def test_add_cases(a, b, expected):
    assert fp.add(a, b) == expected
    assert fp.vadd(np.array([a], np.uint32), np.array([b], np.uint32))[0] == expected


@pytest.mark.parametrize("a,b,expected", [
    (f(2.0 ** -64), f(2.0 ** -63), 0),                 # underflow to subnormal -> +0
    (f(-(2.0 ** -64)), f(2.0 ** -63), 0x80000000),     # ... keeps the sign
    (f(2.0 ** 64), f(2.0 ** 64), INF),
    (0, INF, fp.CANONICAL_NAN),                        # 0 * inf
    (MAX_SUB, INF, fp.CANONICAL_NAN),                  # flushed subnormal is 0: 0 * inf
    (0x80000000, f(3.0), 0x80000000),
])
def test_mul_cases(a, b, expected):
    assert fp.mul(a, b) == expected
    assert fp.vmul(np.array([a], np.uint32), np.array([b], np.uint32))[0] == expected


def test_underflow_boundary():
    # Exact products just below 2**-126: IEEE rounds the first up to the smallest
    # normal (kept), the second stays subnormal (flushed).
    below_half_ulp = f(1.0 - 2.0 ** -24)   # 2**-126 * (1 - 2**-24): ties to 2**-126
    assert fp.mul(MIN_NORMAL, below_half_ulp) == MIN_NORMAL
    assert fp.mul(MIN_NORMAL, f(1.0 - 2.0 ** -22)) == 0


def test_max_lt_conversions():
    assert fp.fmax(0x80000000, 0) == 0 and fp.fmax(0, 0x80000000) == 0
    assert fp.fmax(f(1.0), SNAN) == fp.CANONICAL_NAN
    assert fp.fmax(f(-3.0), f(-2.0)) == f(-2.0)
    assert fp.lt(0x80000000, 0) == 0 and fp.lt(f(1.0), f(2.0)) == 1 and fp.lt(SNAN, f(1.0)) == 0
    assert fp.ftoi(f(-2.75)) == (-2) & 0xFFFFFFFF
    assert fp.ftoi(f(3e9)) == 0x7FFFFFFF and fp.ftoi(NINF) == 0x80000000 and fp.ftoi(SNAN) == 0
    assert fp.itof(0x7FFFFFFF) == f(2147483648.0)
    assert fp.itof((-5) & 0xFFFFFFFF) == f(-5.0)
    assert fp.itof(16777217) == f(16777216.0)  # tie to even


@settings(max_examples=3000, deadline=None)
@given(bits32, bits32)
def test_scalar_equals_numpy_reference(a, b):
    assert fp.add(a, b) == numpy_ref(np.add, a, b)
    assert fp.sub(a, b) == numpy_ref(np.subtract, a, b)
    assert fp.mul(a, b) == numpy_ref(np.multiply, a, b)


def _special_mix(rng, n):
    specials = np.array([0, 0x80000000, 1, MAX_SUB, 0x80000001, MIN_NORMAL, MAX_NORMAL, 0xFF7FFFFF,
                         INF, NINF, SNAN, QNAN_PAYLOAD, f(1.0), f(-1.0)], dtype=np.uint32)
    out = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    pick = rng.random(n) < 0.2
    out[pick] = rng.choice(specials, pick.sum())
    return out


def test_vectorized_equals_scalar():
    rng = np.random.default_rng(7)
    a, b = _special_mix(rng, 20000), _special_mix(rng, 20000)
    for vop, sop in [(fp.vadd, fp.add), (fp.vsub, fp.sub), (fp.vmul, fp.mul), (fp.vmax, fp.fmax)]:
        got = vop(a, b)
        want = np.array([sop(x, y) for x, y in zip(a.tolist(), b.tolist())], dtype=np.uint32)
        assert np.array_equal(got, want), vop.__name__
    assert np.array_equal(fp.vftoi(a), [fp.ftoi(x) for x in a.tolist()])
    assert np.array_equal(fp.vlt(a, b), [fp.lt(x, y) for x, y in zip(a.tolist(), b.tolist())])
    assert np.array_equal(fp.vitof(a), [fp.itof(x) for x in a.tolist()])


def test_sequential_dot_and_sum_follow_element_order():
    rng = np.random.default_rng(3)
    a = fp.as_bits(rng.standard_normal(500) * 1e3)
    b = fp.as_bits(rng.standard_normal(500))
    acc = f(0.5)
    for x, y in zip(a.tolist(), b.tolist()):
        acc = fp.add(acc, fp.mul(x, y))
    assert fp.seq_dot(f(0.5), a, b) == acc
    # A sum whose partials pass through the subnormal range takes the flushing path.
    tiny = np.array([f(2.0 ** -120), f(-(2.0 ** -120) + 2.0 ** -140), f(1.0)], dtype=np.uint32)
    acc = 0
    for x in tiny.tolist():
        acc = fp.add(acc, x)
    assert fp.seq_sum(0, tiny) == acc
