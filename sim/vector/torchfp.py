"""Binary32 operations of :mod:`wse.numerics` on torch tensors, on the CPU or a CUDA device.

The building block of the vectorized model's torch form: the same bits as
``wse.numerics`` (the one home of the fabric's numerics) for tensors of bit
patterns held as ``torch.int32`` (the ``uint32`` patterns reinterpreted;
:func:`from_numpy` and :func:`to_numpy` convert). Each operation flushes
subnormal operands to zero of their sign, runs one eager elementwise torch
operation on the ``float32`` view (IEEE binary32, round to nearest even, with
gradual underflow on the CPU and on CUDA, where PyTorch does not enable
flush-to-zero), then flushes a subnormal result and makes any NaN the
canonical NaN. Eager operations are separate kernels, so a multiply and an
add are never fused. ``tests/test_vector_numerics.py`` checks every
operation against ``wse.numerics`` on the CPU and, marked ``gpu``, on CUDA.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = ["from_numpy", "to_numpy", "ftz", "add", "sub", "mul", "fmax", "lt", "ftoi", "itof", "default_device"]

_SIGN = -0x80000000          # 0x80000000 as an int32
_EXP = 0x7F800000
_NAN = 0x7FC00000


def default_device() -> str:
    """``"cuda"`` where a CUDA device is present, else ``"cpu"``."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def from_numpy(bits, device: str = "cpu") -> torch.Tensor:
    """A ``uint32`` pattern array as an ``int32`` tensor on ``device``."""
    arr = np.ascontiguousarray(np.asarray(bits, dtype=np.uint32)).view(np.int32)
    return torch.from_numpy(arr.copy()).to(device)


def to_numpy(bits: torch.Tensor) -> np.ndarray:
    """An ``int32`` pattern tensor as a ``uint32`` numpy array."""
    return bits.detach().to("cpu").numpy().view(np.uint32).copy()


def ftz(bits: torch.Tensor) -> torch.Tensor:
    """Subnormal patterns flushed to zero of their sign (a new tensor)."""
    return torch.where((bits & _EXP) == 0, bits & _SIGN, bits)


def _finish(values: torch.Tensor) -> torch.Tensor:
    out = ftz(values.view(torch.int32))
    return torch.where(torch.isnan(values), torch.full_like(out, _NAN), out)


def _floats(bits: torch.Tensor) -> torch.Tensor:
    return ftz(bits).view(torch.float32)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.add``."""
    return _finish(_floats(a) + _floats(b))


def sub(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.sub``."""
    return _finish(_floats(a) - _floats(b))


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.mul``."""
    return _finish(_floats(a) * _floats(b))


def fmax(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.fmax``: NaN if either is NaN, ``+0`` beats ``-0``."""
    a, b = ftz(a), ftz(b)
    fa, fb = a.view(torch.float32), b.view(torch.float32)
    out = torch.where(fa > fb, a, b)
    out = torch.where(fa == fb, a & b, out)
    nan = torch.isnan(fa) | torch.isnan(fb)
    return torch.where(nan, torch.full_like(out, _NAN), out)


def lt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.lt`` (``int32`` 0 or 1)."""
    return (_floats(a) < _floats(b)).to(torch.int32)


def ftoi(a: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.ftoi``: truncate toward zero, saturate to int32, NaN gives 0."""
    f = _floats(a).to(torch.float64)
    f = torch.nan_to_num(f, nan=0.0, posinf=2147483647.0, neginf=-2147483648.0)
    return torch.trunc(torch.clamp(f, -2147483648.0, 2147483647.0)).to(torch.int64).to(torch.int32)


def itof(a: torch.Tensor) -> torch.Tensor:
    """Elementwise ``wse.numerics.itof``: signed int32 to binary32, round to nearest even."""
    return a.to(torch.float32).view(torch.int32)
