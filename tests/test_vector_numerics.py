"""The compiled binary32 operations of the vectorized model (``sim/vector/fpk.py``) and their torch
forms (``sim/vector/torchfp.py``, on the CPU and, marked ``gpu``, on CUDA) give the bits of ``wse.numerics`` on random patterns and on the special ones (zeros, subnormals, infinities, NaNs,
results that round into the subnormal range)."""

import numpy as np
import pytest
import torch
from numba import njit

from wse import numerics as fp
from wse.sim.vector import fpk, torchfp

SPECIAL = np.array([0, 0x80000000, 1, 0x80000001, 0x007FFFFF, 0x807FFFFF, 0x00800000, 0x80800000,
                    0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC00001,
                    0x3F800000, 0xBF800000, 0x20000000, 0x1F800000, 0x00FFFFFF, 0x3F800001], dtype=np.uint32)


@njit
def _apply(op, a, b, s):
    out = np.zeros(a.size, dtype=np.uint32)
    for i in range(a.size):
        out[i] = fpk.elementwise(op, a[i], b[i], s[i])
    return out


def _patterns(seed, n=20000):
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    # exponents near each other and near the bottom of the range, where rounding and flushing happen
    near = rng.integers(0, 2 ** 23, n, dtype=np.uint32) | (rng.integers(0, 40, n, dtype=np.uint32) << 23)
    a[: n // 2] = near[: n // 2] | (a[: n // 2] & 0x80000000)
    b[: n // 4] = (a[: n // 4] ^ rng.integers(0, 16, n // 4, dtype=np.uint32)) ^ 0x80000000
    sa, sb = np.meshgrid(SPECIAL, SPECIAL)
    return np.concatenate([a, sa.ravel()]), np.concatenate([b, sb.ravel()])


def test_compiled_operations_equal_numerics():
    a, b = _patterns(0)
    s = b[::-1].copy()
    want = {"fmov": a, "fadd": fp.vadd(a, b), "fsub": fp.vsub(a, b), "fmul": fp.vmul(a, b),
            "fmax": fp.vmax(a, b), "fmacs": fp.vadd(a, fp.vmul(b, s)), "fmuls": fp.vmul(a, s),
            "fadds": fp.vadd(a, s), "fmaxs": fp.vmax(a, s)}
    for name, bits in want.items():
        np.testing.assert_array_equal(_apply(fpk.VOPS[name], a, b, s), bits, err_msg=name)


DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]


@pytest.mark.parametrize("device", DEVICES)
def test_torch_operations_equal_numerics(device):
    a, b = _patterns(1)
    ta, tb = torchfp.from_numpy(a, device), torchfp.from_numpy(b, device)
    cases = {"add": (torchfp.add, fp.vadd), "sub": (torchfp.sub, fp.vsub), "mul": (torchfp.mul, fp.vmul),
             "fmax": (torchfp.fmax, fp.vmax), "lt": (torchfp.lt, fp.vlt)}
    for name, (mine, want) in cases.items():
        np.testing.assert_array_equal(torchfp.to_numpy(mine(ta, tb)), want(a, b), err_msg=name)
    np.testing.assert_array_equal(torchfp.to_numpy(torchfp.ftoi(ta)), fp.vftoi(a), err_msg="ftoi")
    np.testing.assert_array_equal(torchfp.to_numpy(torchfp.itof(ta)), fp.vitof(a), err_msg="itof")
    # the FMAC: two roundings, never fused
    np.testing.assert_array_equal(torchfp.to_numpy(torchfp.add(tb, torchfp.mul(ta, tb))),
                                  fp.vadd(b, fp.vmul(a, b)), err_msg="mac")


@pytest.mark.parametrize("device", DEVICES)
def test_torch_operations_do_not_fuse_a_multiply_add(device):
    # (1 + 2^-23) squared is 1 + 2^-22 + 2^-46: rounded, then minus (1 + 2^-22) gives +0; fused, 2^-46
    x, y = fp.f2b(1 + 2.0 ** -23), fp.f2b(-(1 + 2.0 ** -22))
    a = torchfp.from_numpy(np.array([x], dtype=np.uint32), device)
    c = torchfp.from_numpy(np.array([y], dtype=np.uint32), device)
    assert torchfp.to_numpy(torchfp.add(torchfp.mul(a, a), c)).tolist() == [fp.add(fp.mul(x, x), y)] == [0]
