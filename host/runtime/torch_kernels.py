"""The functional backend's operations on torch tensors, on the CPU or a CUDA device.

The same orders of binary32 operations as :mod:`.kernels` (the numba loops,
``docs/weight_streaming.md`` sections 5 to 8 and 11), vectorized over the
dimensions whose operations are independent of each other, so the results
equal the numba backend's bit for bit on any device:

* :func:`sgemm`, :func:`spgemm`, :func:`sgemm_transposed`: the partial sum of
  every output, row and token at once (``part[o, i, t]``), advanced one
  feature per row at a time (``k = i + j H`` for ``j = 0, 1, ...``); then the
  ring adds the rows in each output's own rotation (a ``gather``), one row at
  a time. Outputs are taken in chunks so that ``part`` stays within a memory
  budget.
* :func:`wgrad`, :func:`wgrad_partials`: every column's partial sum at once
  (``G[j, o, k]``), advanced one token of each column at a time; then the row
  chain adds the columns in order.
* :func:`softmax_delta`, :func:`relu`, :func:`relu_mask`: every token at once
  with :mod:`wse.sim.vector.torchfp`'s operations (operands and results
  flushed, NaN canonical), classes in order where the firmware loops over them.

Every multiply and every add is its own eager elementwise torch operation (no
``addcmul``, no matmul, no reduction kernel), so nothing is fused or
reassociated, on the CPU or on CUDA. Tensors hold ``float32`` values; inputs
must already be flushed (:func:`flushed`). As in :mod:`.kernels`, each GEMM
runs without per-operation flushing when :func:`fast_is_exact` proves that no
subnormal can arise, and otherwise flushes every result; both give the
fabric's bits, the check only saves time. NaN results are made canonical.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from wse.firmware.training import numerics as fw_numerics
from wse.sim.vector import torchfp

__all__ = ["flushed", "canonical_nan", "fast_is_exact", "sgemm", "spgemm", "sgemm_transposed", "wgrad",
           "wgrad_partials", "softmax_delta", "relu", "relu_mask", "chunk_elements"]

_FLT_MIN = 1.1754943508222875e-38
_NAN = 0x7FC00000
#: Products at least this large (and constants) keep every result a multiple of 2^-125 (see :mod:`.kernels`).
SAFE = 2.0 ** -102


def chunk_elements(device: torch.device | str) -> int:
    """Elements of a GEMM's partial-sum block per chunk: cache-sized on the CPU, large on a GPU."""
    return 1 << 19 if torch.device(device).type == "cpu" else 1 << 25


def flushed(values: torch.Tensor) -> torch.Tensor:
    """``float32`` values with every subnormal replaced by a zero of its sign (a new tensor)."""
    return torch.where(values.abs() < _FLT_MIN, values * 0.0, values)


def _fl(values: torch.Tensor, ftz: bool) -> torch.Tensor:
    """``values`` flushed when ``ftz`` (else the same tensor)."""
    return flushed(values) if ftz else values


def _flush_(values: torch.Tensor, ftz: bool) -> torch.Tensor:
    """``values`` flushed in place when ``ftz``; returns it."""
    return values.copy_(flushed(values)) if ftz else values


def canonical_nan(values: torch.Tensor) -> torch.Tensor:
    """``values`` with every NaN replaced by the fabric's canonical NaN ``0x7fc00000`` (a new tensor)."""
    bits = values.view(torch.int32)
    return torch.where(torch.isnan(values), torch.full_like(bits, _NAN), bits).view(torch.float32)


def _min_abs_nonzero(values: torch.Tensor) -> float:
    """Smallest nonzero magnitude (NaNs ignored; ``inf`` if there is none), as a Python float."""
    if values.numel() == 0:
        return math.inf
    mag = values.abs()
    mag = torch.where((mag == 0) | torch.isnan(mag), torch.full_like(mag, math.inf), mag)
    return float(mag.min().item())


def fast_is_exact(a: torch.Tensor, b: torch.Tensor, *constants: torch.Tensor) -> bool:
    """:func:`.kernels.fast_is_exact` on tensors: whether no subnormal can arise in sums
    of products of ``a`` and ``b`` plus ``constants``."""
    if _min_abs_nonzero(a) * _min_abs_nonzero(b) < SAFE:
        return False
    return all(_min_abs_nonzero(c) >= SAFE for c in constants)


def _ring_gemm(w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor, height: int, ftz: bool,
               keep: torch.Tensor | None = None) -> torch.Tensor:
    """``y[O, T]``: rows' partial sums ``P_i = +0 + w x + ...`` over features ``k = i, i+H, ...``
    (with ``keep`` ``[O, K]`` bool: only the kept ones), then the ring ``y = add(P_s, bias)``,
    ``y = add(y, P_q)`` for ``q = s+1, ..., e`` (mod H)."""
    n_out, n_in = w.shape
    tokens = x.shape[1]
    out = torch.empty((n_out, tokens), dtype=torch.float32, device=w.device)
    if n_out == 0 or tokens == 0:
        return out
    per_output = max(1, height * tokens)
    oc = max(1, min(n_out, chunk_elements(w.device) // per_output))
    rows = torch.arange(height, device=w.device)
    starts = (torch.arange(n_out, device=w.device) % height + 1) % height
    buffer = torch.empty((oc, height, tokens), dtype=torch.float32, device=w.device)
    for o0 in range(0, n_out, oc):
        o1 = min(n_out, o0 + oc)
        n = o1 - o0
        part = torch.zeros((n, height, tokens), dtype=torch.float32, device=w.device)
        for k0 in range(0, n_in, height):
            r = min(height, n_in - k0)
            prod = torch.mul(w[o0:o1, k0:k0 + r, None], x[None, k0:k0 + r, :], out=buffer[:n, :r])
            _flush_(prod, ftz)
            view = part[:, :r, :]
            if keep is None:
                _flush_(view.add_(prod), ftz)
            else:
                view.copy_(torch.where(keep[o0:o1, k0:k0 + r, None], _fl(view + prod, ftz), view))
        index = (starts[o0:o1, None] + rows[None, :]) % height
        ring = part.gather(1, index[:, :, None].expand(n, height, tokens))
        y = _flush_(torch.add(ring[:, 0, :], bias[o0:o1, None], out=out[o0:o1]), ftz)
        for q in range(1, height):
            _flush_(y.add_(ring[:, q, :]), ftz)
    return canonical_nan(out)


def sgemm(w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, height: int) -> torch.Tensor:
    """:func:`.kernels.sgemm`: ``y[O, B]`` of ``W [O, K]`` times ``x [K, B]`` plus ``bias [O]``
    (``None``: the identity -0.0), in the fabric's order on ``height`` rows."""
    if bias is None:
        bias = torch.full((w.shape[0],), -0.0, dtype=torch.float32, device=w.device)
    return _ring_gemm(w, x, bias, height, not fast_is_exact(w, x, bias))


def sgemm_transposed(w: torch.Tensor, dy: torch.Tensor, height: int) -> torch.Tensor:
    """:func:`.kernels.sgemm_transposed`: ``dx[K, B]`` of ``W^T [K, O]`` times ``dy [O, B]``."""
    wt = w.t().contiguous()
    bias = torch.full((wt.shape[0],), -0.0, dtype=torch.float32, device=w.device)
    return _ring_gemm(wt, dy, bias, height, not fast_is_exact(w, dy))


def spgemm(w: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None, nonzeros: np.ndarray,
           height: int) -> torch.Tensor:
    """:func:`.kernels.spgemm`: only the weights at the flat indices ``nonzeros`` (``o*K + k``) count;
    without a bias ``y = P_s`` is the dense order's ``add(P_s, -0.0)`` (an exact identity)."""
    flat = torch.as_tensor(np.asarray(nonzeros, dtype=np.int64), device=w.device)
    keep = torch.zeros(w.numel(), dtype=torch.bool, device=w.device)
    keep[flat] = True
    keep = keep.view(w.shape)
    kept = w.reshape(-1)[flat]
    has_bias = bias is not None
    exact = fast_is_exact(kept, x, bias) if has_bias else fast_is_exact(kept, x)
    if bias is None:
        bias = torch.full((w.shape[0],), -0.0, dtype=torch.float32, device=w.device)
    return _ring_gemm(w, x, bias, height, not exact, keep=keep)


class _Tokens:
    """Each column's ``s``-th token, for ``s = 0 .. max(counts) - 1``: the rows ``x[:, t]``
    (``[C, K]``) and ``dy[:, t]`` (``[C, O]``) of the columns that have one, and which those are."""

    def __init__(self, dy: torch.Tensor, x: torch.Tensor, starts: np.ndarray, counts: np.ndarray):
        counts = np.asarray(counts, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.int64)
        xt, dyt = x.t(), dy.t()
        self.steps = []
        for s in range(int(counts.max()) if len(counts) else 0):
            active = counts > s
            tok = torch.as_tensor(np.where(active, starts + s, starts), device=dy.device)
            mask = None if active.all() else torch.as_tensor(active, device=dy.device)
            self.steps.append((xt[tok].contiguous(), dyt[tok].contiguous(), mask))


def _column_sums(tokens: _Tokens, o0: int, o1: int, columns: int, n_in: int, ftz: bool,
                 out_w: torch.Tensor | None = None, out_b: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Every column's ``G_j = +0 + x dy + ...`` (``[C, o1-o0, K]``) and ``g_j = +0 + dy + ...``
    (``[C, o1-o0]``) for outputs ``o0 .. o1-1``, over its tokens in order, the columns side by side."""
    dev = tokens.steps[0][0].device if tokens.steps else None
    n = o1 - o0
    g_w = torch.zeros((columns, n, n_in), dtype=torch.float32, device=dev) if out_w is None else out_w.zero_()
    g_b = torch.zeros((columns, n), dtype=torch.float32, device=dev) if out_b is None else out_b.zero_()
    prod = torch.empty_like(g_w)
    for xs, ds, mask in tokens.steps:
        d = ds[:, o0:o1]
        torch.mul(d[:, :, None], xs[:, None, :], out=prod)
        _flush_(prod, ftz)
        if mask is None:
            _flush_(g_w.add_(prod), ftz)
            _flush_(g_b.add_(d), ftz)
        else:
            g_w.copy_(torch.where(mask[:, None, None], _fl(g_w + prod, ftz), g_w))
            g_b.copy_(torch.where(mask[:, None], _fl(g_b + d, ftz), g_b))
    return g_w, g_b


def _wgrad_exact(dy: torch.Tensor, x: torch.Tensor) -> bool:
    return fast_is_exact(x, dy) and _min_abs_nonzero(dy) >= SAFE


def wgrad(dy: torch.Tensor, x: torch.Tensor, starts: np.ndarray,
          counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.kernels.wgrad`: ``(dW [O, K], db [O])``; the column partials, then the row
    chain ``+0 + G_0 + G_1 + ...`` (columns in order)."""
    ftz = not _wgrad_exact(dy, x)
    n_out, n_in = dy.shape[0], x.shape[0]
    columns = len(starts)
    tokens = _Tokens(dy, x, starts, counts)
    oc = max(1, min(n_out, chunk_elements(dy.device) // max(1, columns * n_in)))
    dw = torch.empty((n_out, n_in), dtype=torch.float32, device=dy.device)
    db = torch.empty(n_out, dtype=torch.float32, device=dy.device)
    g_w = torch.empty((columns, oc, n_in), dtype=torch.float32, device=dy.device)
    g_b = torch.empty((columns, oc), dtype=torch.float32, device=dy.device)
    for o0 in range(0, n_out, oc):
        o1 = min(n_out, o0 + oc)
        part_w, part_b = _column_sums(tokens, o0, o1, columns, n_in, ftz, g_w[:, :o1 - o0], g_b[:, :o1 - o0])
        total_w = _flush_(torch.add(part_w[0], 0.0, out=dw[o0:o1]), ftz)
        total_b = _flush_(torch.add(part_b[0], 0.0, out=db[o0:o1]), ftz)
        for j in range(1, columns):
            _flush_(total_w.add_(part_w[j]), ftz)
            _flush_(total_b.add_(part_b[j]), ftz)
    return canonical_nan(dw), canonical_nan(db)


def wgrad_partials(dy: torch.Tensor, x: torch.Tensor, starts: np.ndarray,
                   counts: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`.kernels.wgrad_partials`: each column's partial sums ``(G [C, O, K], g [C, O])``."""
    columns, n_out, n_in = len(starts), dy.shape[0], x.shape[0]
    if columns == 0:
        return (torch.zeros((0, n_out, n_in), dtype=torch.float32, device=dy.device),
                torch.zeros((0, n_out), dtype=torch.float32, device=dy.device))
    g_w, g_b = _column_sums(_Tokens(dy, x, starts, counts), 0, n_out, columns, n_in, not _wgrad_exact(dy, x))
    return canonical_nan(g_w), canonical_nan(g_b)


# Softmax cross-entropy delta, ReLU and its mask: torchfp's operations on bit patterns ---------------------

def _const(bits: int, like: torch.Tensor) -> torch.Tensor:
    """A pattern (``uint32`` value) as an ``int32`` tensor of ``like``'s shape and device."""
    value = bits - (1 << 32) if bits >= 1 << 31 else bits
    return torch.full_like(like, value, dtype=torch.int32)


def _wrap32(values: torch.Tensor) -> torch.Tensor:
    """``int64`` values reduced modulo 2^32 to ``int32`` (two's complement)."""
    return (((values + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).to(torch.int32)


def _bits(values: torch.Tensor) -> torch.Tensor:
    return values.contiguous().view(torch.int32)


def softmax_delta(z: torch.Tensor, onehot: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """:func:`.kernels.softmax_delta`: the loss delta ``[C, B]`` of logits ``z [C, B]``."""
    fp = torchfp
    zb = _bits(z)
    classes = zb.shape[0]
    m = zb[0]
    for c in range(1, classes):
        m = fp.fmax(m, zb[c])
    consts = fw_numerics.EXP_CONSTANTS
    x = fp.sub(zb, m[None, :].expand_as(zb))
    k = fp.ftoi(fp.add(fp.mul(x, _const(consts["LOG2E"], x)), _const(consts["MHALF"], x)))
    nf = fp.itof(k)
    r = fp.add(x, fp.mul(nf, _const(consts["MLN2HI"], x)))
    r = fp.add(r, fp.mul(nf, _const(consts["MLN2LO"], x)))
    coeffs = fw_numerics.EXP_COEFFS
    q = fp.mul(r, _const(coeffs[6], x))
    for c in (5, 4, 3, 2, 1):
        q = fp.mul(fp.add(q, _const(coeffs[c], x)), r)
    p = fp.add(q, _const(coeffs[0], x))
    b = p.to(torch.int64) & 0xFFFFFFFF                   # the pattern as an unsigned value
    n = k.to(torch.int64)
    field = _wrap32((b >> 23) + n)                       # the PE's 32-bit sum
    p = torch.where(field > 0, _wrap32(b + n * (1 << 23)), torch.zeros_like(p))
    total = p[0]
    for c in range(1, classes):
        total = fp.add(total, p[c])
    y = _wrap32(fw_numerics.RCP_MAGIC - (total.to(torch.int64) & 0xFFFFFFFF))
    one, two = _const(0x3F800000, y), _const(0x40000000, y)
    for _ in range(2):
        y = fp.mul(y, fp.sub(two, fp.mul(total, y)))
    y = fp.add(y, fp.mul(y, fp.sub(one, fp.mul(total, y))))
    out = fp.mul(fp.sub(fp.mul(p, y[None, :].expand_as(p)), _bits(onehot)), _bits(scale)[None, :].expand_as(p))
    return out.view(torch.float32)


def relu(a: torch.Tensor) -> torch.Tensor:
    """:func:`.kernels.relu`: ``max(a, +0)`` with the fabric's ``fmaxs`` rules."""
    bits = _bits(a)
    return torchfp.fmax(bits, torch.zeros_like(bits)).view(torch.float32)


def relu_mask(act: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """:func:`.kernels.relu_mask`: ``mul(mul(grad, max(mul(act, -2^127), -1)), -1)`` elementwise."""
    a, g = _bits(act), _bits(grad)
    minus_one = _const(0xBF800000, a)
    tmp = torchfp.fmax(torchfp.mul(a, _const(0xFF000000, a)), minus_one)
    return torchfp.mul(torchfp.mul(g, tmp), minus_one).view(torch.float32)
