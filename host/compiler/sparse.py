"""Static unstructured weight masks for sparse weight streaming
(``docs/weight_streaming.md`` section 13), chosen at compile time.

A mask is a boolean array of a Linear layer's weight shape ``[O, K]``: true
where the weight is kept (a non-zero that streams), false where it is pruned
(never streamed, never multiplied). :func:`choose_mask` picks one layer's
mask (``magnitude``: the largest ``|W|``, ``random``: uniform, both seeded),
:func:`layer_masks` one per weight with a global sparsity and per-layer
overrides, :func:`check_mask` refuses a mask of the wrong shape.

:func:`nonzeros` is the compact form a phase's
:class:`~.schedule.SparseSgemm` carries (flat indices ``o*K + k``, ascending),
and :func:`reference_forward` is the order of binary32 operations of the
sparse forward GEMM on the weight-streaming layout, spelled out with
:mod:`wse.numerics` (the functional backend's compiled loop must equal it).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from wse import numerics as fp
from wse.config import UsageError
from wse.firmware.kernels.spgemm import sparse_mask

__all__ = ["MASK_KINDS", "check_sparsity", "choose_mask", "layer_masks", "check_mask", "nonzeros", "mask_of",
           "reference_forward"]

#: How a mask is chosen.
MASK_KINDS = ("magnitude", "random")


def check_sparsity(sparsity, what: str = "sparsity") -> float:
    """``sparsity`` as a float in ``[0, 1)``, or a :class:`~wse.config.UsageError` naming ``what``."""
    if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(sparsity) < 1.0:
        raise UsageError(f"{what} must be a number in [0, 1), not {sparsity!r}")
    return float(sparsity)


def choose_mask(weight: np.ndarray, sparsity: float, kind: str = "magnitude", seed: int = 0) -> np.ndarray:
    """The boolean mask of ``weight`` keeping ``round((1 - sparsity) * size)`` entries.

    ``magnitude`` keeps the largest ``|weight|`` (ties: the lower flat index
    first; ``seed`` unused); ``random`` keeps a uniform choice drawn from
    ``numpy.random.default_rng(seed)``.
    """
    sparsity = check_sparsity(sparsity)
    weight = np.asarray(weight, dtype=np.float32)
    if weight.ndim != 2:
        raise UsageError(f"a mask is chosen for a 2-D weight, not one of shape {weight.shape}")
    if kind == "random":
        return sparse_mask(weight.shape[0], weight.shape[1], sparsity, np.random.default_rng(seed), "random")
    if kind != "magnitude":
        raise UsageError(f"mask kind must be one of {', '.join(MASK_KINDS)}, not {kind!r}")
    keep = int(round((1.0 - sparsity) * weight.size))
    order = np.argsort(-np.abs(weight.ravel()), kind="stable")
    flat = np.zeros(weight.size, dtype=bool)
    flat[order[:keep]] = True
    return flat.reshape(weight.shape)


def layer_masks(weights: Mapping[str, np.ndarray], sparsity, kind: str = "magnitude", seed: int = 0,
                overrides: Mapping[str, float] | None = None) -> dict[str, np.ndarray]:
    """One mask per weight of ``weights`` (name to ``[O, K]`` array): ``sparsity``
    for every layer unless ``overrides`` names it; a layer whose sparsity is 0
    gets no mask (it stays dense). Layer ``n`` (0-based, in ``weights``' order)
    draws a random mask with seed ``seed + n``."""
    sparsity = check_sparsity(sparsity)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(weights))
    if unknown:
        raise UsageError(f"sparsity override for {unknown[0]!r}: no such weight (weights: {', '.join(weights)})")
    masks = {}
    for n, (name, weight) in enumerate(weights.items()):
        s = check_sparsity(overrides[name], f"sparsity of {name}") if name in overrides else sparsity
        if s > 0:
            masks[name] = choose_mask(weight, s, kind, seed + n)
    return masks


def check_mask(name: str, mask, shape: tuple[int, ...]) -> np.ndarray:
    """``mask`` as a boolean array, or a usage error if it is not of ``shape`` or not 0/1."""
    array = np.asarray(mask)
    if array.shape != tuple(shape):
        raise UsageError(f"mask of {name} has shape {array.shape}, expected the weight's shape {tuple(shape)}")
    if array.dtype != bool and not np.isin(array, (0, 1)).all():
        raise UsageError(f"mask of {name} must hold only 0 and 1 (or booleans)")
    return array.astype(bool)


def nonzeros(mask: np.ndarray) -> tuple[int, ...]:
    """The kept weights' flat indices ``o*K + k``, ascending."""
    return tuple(int(v) for v in np.flatnonzero(np.asarray(mask, dtype=bool).ravel()))


def mask_of(indices, shape: tuple[int, int]) -> np.ndarray:
    """The boolean mask of ``shape`` from :func:`nonzeros`' indices."""
    flat = np.zeros(int(np.prod(shape)), dtype=bool)
    flat[np.asarray(indices, dtype=np.int64)] = True
    return flat.reshape(shape)


def reference_forward(w: np.ndarray, mask: np.ndarray, x: np.ndarray, bias: np.ndarray | None,
                      height: int) -> np.ndarray:
    """``y [O, B]`` of the sparse forward GEMM in its binary32 order (a slow reference).

    Features live on rows ``k mod H`` (the weight-streaming layout). Per
    output ``o``, with ``e = o mod H`` and ``s = e + 1 mod H``::

        P_i = +0; P_i = add(P_i, mul(x[k], W[o, k]))  for k kept, k mod H = i, k ascending
        (bias: P_s = add(+0, b[o]) first, the pair (ones block, b[o]) streamed before row s's non-zeros)
        y = P_s;  y = add(y, P_q)  for q = s+1, ..., e (mod H)

    Inputs are flushed and every result flushed, as on the fabric.
    """
    w, x = fp.as_bits(w), fp.as_bits(x)
    n_out, n_in = w.shape
    y = np.zeros((n_out, x.shape[1]), dtype=np.uint32)
    for o in range(n_out):
        s = (o % height + 1) % height
        part = np.zeros((height, x.shape[1]), dtype=np.uint32)
        if bias is not None:
            part[s] = fp.vadd(part[s], np.full(x.shape[1], fp.as_bits(bias)[o], dtype=np.uint32))
        for k in np.flatnonzero(mask[o]):
            i = k % height
            part[i] = fp.vadd(part[i], fp.vmul(x[k], np.full(x.shape[1], w[o, k], dtype=np.uint32)))
        acc = part[s]
        for q in range(1, height):
            acc = fp.vadd(acc, part[(s + q) % height])
        y[o] = acc
    return y.view(np.float32)
