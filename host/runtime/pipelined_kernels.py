"""Compiled loops of the layer-pipelined functional model, in ``pipe.s``'s order.

numba code with ``fastmath=False``: every ``a * b`` and ``a + b`` is one IEEE
binary32 operation (no fused multiply-add, no reassociation), and every
result is flushed to a zero of its sign when it is subnormal, as the fabric
flushes it. Operands must already be flushed; NaN payloads are left as the
CPU makes them (the callers make every NaN of a result canonical). The
orders (``docs/layer_pipelined.md`` section 4):

* :func:`forward`: per output ``o`` and sample, per input line ``q`` with input
  block ``k_0, k_1, ...``: ``P_q = mul(W[o, k_0], x[k_0])`` (on the last line
  ``q = n-1``, with a bias, ``P_q = add(b[o], mul(W[o, k_0], x[k_0]))``), then
  ``P_q = add(P_q, mul(W[o, k], x[k]))``; ``y = P_0``, ``y = add(y, P_q)`` for
  ``q = 1 ..``; the ReLU ``max(y, +0)`` (``+0`` beats ``-0``).
* :func:`weight_gradients`: ``dW[o, k] = add(dW[o, k], mul(dz[s][o], x[s][k]))``
  and ``db[o] = add(db[o], dz[s][o])`` over the samples ``s`` in order.
* :func:`input_gradient`: per output line ``p``, ``D_p[k] = +0``, then
  ``D_p[k] = add(D_p[k], mul(W[o, k], dz[o]))`` over the line's outputs in order;
  ``dx = D_{n-1}``, ``dx = add(dx, D_p)`` for ``p = n-2 .. 0``.
* :func:`sgd_update`: ``pupd``'s SGD (weight decay, momentum, dampening, Nesterov).

The inner loops run over contiguous elements whose operations are
independent of each other, so the compiler may vectorise them without
changing a bit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["forward", "weight_gradients", "input_gradient", "sgd_update", "has_subnormal"]

_FLT_MIN = np.float32(1.1754943508222875e-38)
_ZERO = np.float32(0.0)


@njit(inline="always")
def _fl(v):
    """``v``, or a zero of its sign if ``v`` is subnormal."""
    return v * _ZERO if abs(v) < _FLT_MIN else v


@njit(fastmath=False, cache=True)
def _forward_k(wt, x, bias, has_bias, relu, in_lo, in_hi, out, sparse):
    samples = x.shape[0]
    n_out = wt.shape[1]
    part = np.empty((samples, n_out), dtype=np.float32)
    xbits = x.view(np.uint32)
    lines = in_lo.shape[0]
    for q in range(lines):
        k0 = in_lo[q]
        start = has_bias and q == lines - 1          # the chain end's partial sums start at the bias
        for s in range(samples):
            xv = x[s, k0]
            row, acc = wt[k0], part[s]
            for o in range(n_out):
                first = np.float32(0.0) if not start else bias[o]
                if not sparse:
                    acc[o] = _fl(first + _fl(row[o] * xv)) if start else _fl(row[o] * xv)
                elif xbits[s, k0] != 0:
                    acc[o] = _fl(first + _fl(row[o] * xv))
                else:
                    acc[o] = first
        for k in range(k0 + 1, in_hi[q]):
            row = wt[k]
            for s in range(samples):
                if sparse and xbits[s, k] == 0:
                    continue
                xv = x[s, k]
                acc = part[s]
                for o in range(n_out):
                    acc[o] = _fl(acc[o] + _fl(row[o] * xv))
        for s in range(samples):
            acc, y = part[s], out[s]
            if q == 0:
                for o in range(n_out):
                    y[o] = acc[o]
            else:
                for o in range(n_out):
                    y[o] = _fl(y[o] + acc[o])
    if relu:
        for s in range(samples):
            y = out[s]
            for o in range(n_out):
                v = y[o]
                y[o] = v if (v > _ZERO or v != v) else _ZERO


@njit(fastmath=False, cache=True)
def _wgrad_k(dz, x, g, db):
    samples, n_out = dz.shape
    n_in = x.shape[1]
    for o in range(n_out):
        row = g[o]
        acc = db[o]
        for s in range(samples):
            d = dz[s, o]
            xs = x[s]
            for k in range(n_in):
                row[k] = _fl(row[k] + _fl(d * xs[k]))
            acc = _fl(acc + d)
        db[o] = acc


@njit(fastmath=False, cache=True)
def _dx_k(w, dz, out_lo, out_hi, dx):
    samples = dz.shape[0]
    n_in = w.shape[1]
    lines = out_lo.shape[0]
    part = np.empty(n_in, dtype=np.float32)
    for s in range(samples):
        for p in range(lines - 1, -1, -1):
            for k in range(n_in):
                part[k] = _ZERO
            for o in range(out_lo[p], out_hi[p]):
                d = dz[s, o]
                wo = w[o]
                for k in range(n_in):
                    part[k] = _fl(part[k] + _fl(wo[k] * d))
            if p == lines - 1:
                for k in range(n_in):
                    dx[s, k] = part[k]
            else:
                for k in range(n_in):
                    dx[s, k] = _fl(dx[s, k] + part[k])


@njit(fastmath=False, cache=True)
def _sgd_k(w, g, buf, wd, mu, damp, mlr, decay, momentum, nesterov, first):
    for i in range(w.shape[0]):
        gi = g[i]
        if decay:
            gi = _fl(gi + _fl(w[i] * wd))
        if momentum:
            b = gi if first else _fl(_fl(buf[i] * mu) + _fl(gi * damp))
            buf[i] = b
            gi = _fl(gi + _fl(b * mu)) if nesterov else b
        w[i] = _fl(w[i] + _fl(gi * mlr))


@njit(cache=True)
def _has_subnormal_k(bits):
    for i in range(bits.shape[0]):
        b = bits[i]
        if (b & 0x7F800000) == 0 and (b & 0x7FFFFFFF) != 0:
            return True
    return False


def has_subnormal(a: np.ndarray) -> bool:
    """Whether the float32 array ``a`` holds a subnormal value."""
    return bool(_has_subnormal_k(np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)))


def _canonical(a: np.ndarray) -> np.ndarray:
    """``a`` with every NaN made the fabric's canonical ``0x7fc00000`` (in place)."""
    nan = np.isnan(a)
    if nan.any():
        a.view(np.uint32)[nan] = 0x7FC00000
    return a


def _bounds(blocks) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([b.start for b in blocks], dtype=np.int64), np.array([b.stop for b in blocks], dtype=np.int64))


def forward(region, w: np.ndarray, b: np.ndarray | None, relu: bool, act: np.ndarray,
            sparse: bool = False) -> np.ndarray:
    """One layer's outputs ``[batch, o]`` of ``act [batch, k]`` on ``region`` (its input
    blocks), weights ``w [o, k]``, bias ``b`` (or None), then the ReLU if ``relu``.
    ``sparse`` (harvested inputs): each input line's partial sums start at +0 and
    add ``mul(w, x)`` only for the inputs whose word is not +0, in order."""
    lo, hi = _bounds(region.in_blocks())
    if np.any(hi <= lo) or w.shape[1] != act.shape[1]:
        raise ValueError(f"forward: every input line needs a feature and w {w.shape} must match act {act.shape}")
    out = np.empty((act.shape[0], w.shape[0]), dtype=np.float32)
    bias = np.zeros(1, dtype=np.float32) if b is None else np.ascontiguousarray(b, dtype=np.float32)
    _forward_k(np.ascontiguousarray(w.T, dtype=np.float32), np.ascontiguousarray(act, dtype=np.float32),
               bias, b is not None, bool(relu), lo, hi, out, bool(sparse))
    return _canonical(out)


def weight_gradients(dz: np.ndarray, x: np.ndarray, g: np.ndarray, db: np.ndarray) -> None:
    """Accumulate the samples of ``dz [s, o]`` and ``x [s, k]`` into ``g [o, k]`` and ``db [o]`` (in place)."""
    _wgrad_k(np.ascontiguousarray(dz, dtype=np.float32), np.ascontiguousarray(x, dtype=np.float32), g, db)
    _canonical(g)
    _canonical(db)


def input_gradient(region, w: np.ndarray, dz: np.ndarray) -> np.ndarray:
    """The input gradient ``[s, k]`` of ``dz [s, o]`` through ``w [o, k]``, reduced
    over ``region``'s output lines as the fabric reduces it."""
    lo, hi = _bounds(region.out_blocks())
    dx = np.empty((dz.shape[0], w.shape[1]), dtype=np.float32)
    _dx_k(np.ascontiguousarray(w, dtype=np.float32), np.ascontiguousarray(dz, dtype=np.float32), lo, hi, dx)
    return _canonical(dx)


def sgd_update(w: np.ndarray, g: np.ndarray, buf: np.ndarray | None, hyper, first: bool) -> np.ndarray | None:
    """``pupd``'s SGD on the float32 array ``w`` (in place) with gradient ``g``;
    returns the new momentum buffer (``buf`` the old one, ignored on the ``first``
    step; None without momentum). ``hyper``: the optimizer's hyperparameters."""
    if not w.flags.c_contiguous:
        raise ValueError("sgd_update: the parameter array must be C-contiguous (it is updated in place)")
    momentum = hyper["momentum"] != 0
    flat = w.reshape(-1)
    new = np.array(g, dtype=np.float32).reshape(-1) if momentum and first else None
    if momentum and not first:
        new = np.array(buf, dtype=np.float32).reshape(-1)
    _sgd_k(flat, np.ascontiguousarray(g, dtype=np.float32).reshape(-1),
           new if new is not None else np.zeros(1, dtype=np.float32),
           np.float32(hyper["weight_decay"]), np.float32(hyper["momentum"]), np.float32(1 - hyper["dampening"]),
           np.float32(-hyper["lr"]), hyper["weight_decay"] != 0, momentum, bool(hyper["nesterov"]), bool(first))
    _canonical(flat)
    if new is None:
        return None
    return _canonical(new).reshape(w.shape)
