"""The loss delta of the transformer's next-token cross-entropy with its exps
vectorized: :func:`sequence_cross_entropy_delta` gives the bits of
:func:`wse.firmware.training.transformer.sequence_cross_entropy_delta` (the
firmware's ``softmax_delta``: ``m = max`` over the classes, ``e = exp(z - m)``,
``S = e[0] + e[1] + ...``, ``delta = mul(sub(mul(e, reciprocal(S)), onehot),
1/N)``), token-major, without the transposes of the class-major loop.

Where every logit is finite and at most ``2^20`` in magnitude, each exp
argument is in ``[-2^21, 0]`` and the exps run as the vectorized stages of
:mod:`.transformer_elementwise` (the GELU's; checked against the firmware's
``exp`` on that range); every later operation meets only finite values, so
flushing its result is all the fabric's rules add. Anything else runs the
exact scalar loop (:func:`.transformer_elementwise.sequence_cross_entropy_delta`).
``tests/test_gpt_kernels.py`` checks both paths against the reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .transformer_elementwise import (_ONE, _ZERO, _exp_fast, _fast, _floats, _reciprocal, _v, _vmax,
                                      sequence_cross_entropy_delta as _exact_delta)

__all__ = ["sequence_cross_entropy_delta"]


@njit(fastmath=False, cache=True)
def _args_k(z, x):
    """``sub(z[t, c], max_c z[t, c])`` of each token's logits (flushed as read)."""
    for t in range(z.shape[0]):
        row, xr = z[t], x[t]
        m = _v(row[0])
        for c in range(1, row.shape[0]):
            m = _vmax(m, _v(row[c]))
        for c in range(row.shape[0]):
            xr[c] = _v(_v(row[c]) - m)


@njit(fastmath=False, cache=True)
def _finish_k(e, targets, scale, out):
    """``mul(sub(mul(e, reciprocal(S)), onehot), scale)`` with ``S = e[0] + e[1] + ...``."""
    f = np.zeros(1, dtype=np.float32)
    u = f.view(np.uint32)
    for t in range(e.shape[0]):
        er, o = e[t], out[t]
        total = er[0]
        for c in range(1, er.shape[0]):
            total = _v(total + er[c])
        y = _reciprocal(total, f, u)
        for c in range(er.shape[0]):
            hot = _ONE if c == targets[t] else _ZERO
            o[c] = _v(_v(_v(er[c] * y) - hot) * scale)


def sequence_cross_entropy_delta(logits, targets, count: int | None = None) -> np.ndarray:
    """:func:`wse.firmware.training.transformer.sequence_cross_entropy_delta` of logits ``[N, V]``
    (binary32 patterns) and ``targets [N]``, scaled by ``1/count`` (default ``1/N``): ``[N, V]`` patterns."""
    z = _floats(logits)
    n, vocab = z.shape
    index = np.asarray(targets, dtype=np.int64).reshape(-1)
    if not (_fast(z.reshape(-1)) and index.size == n and np.all((index >= 0) & (index < vocab))):
        return _exact_delta(logits, targets, count)
    x = np.empty_like(z)
    _args_k(z, x)
    out = np.empty_like(z)
    _finish_k(_exp_fast(x.reshape(-1)).reshape(z.shape), index, np.float32(1.0 / (count or n)), out)
    return out.view(np.uint32)
