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
           "reference_forward", "compile_sparse"]

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

    Features live on rows ``k mod H`` (the cyclic weight-streaming layout; with a spread tensor
    the order is this one on the operands embedded in their slots, ``host/runtime/slots.py``). Per
    output ``o``, with ``e = o mod H`` and ``s = e + 1 mod H``::

        P_i = +0; P_i = add(P_i, mul(x[k], W[o, k]))  for k kept, k mod H = i, k ascending
        y = add(P_s, b[o])  (no bias: y = P_s, the stream's -0.0 being an exact identity)
        y = add(y, P_q)     for q = s+1, ..., e (mod H)

    This is the dense streamed GEMM's order (section 5) over the kept weights only.

    Inputs are flushed and every result flushed, as on the fabric.
    """
    w, x = fp.as_bits(w), fp.as_bits(x)
    n_out, n_in = w.shape
    y = np.zeros((n_out, x.shape[1]), dtype=np.uint32)
    for o in range(n_out):
        s = (o % height + 1) % height
        part = np.zeros((height, x.shape[1]), dtype=np.uint32)
        for k in np.flatnonzero(mask[o]):
            i = k % height
            part[i] = fp.vadd(part[i], fp.vmul(x[k], np.full(x.shape[1], w[o, k], dtype=np.uint32)))
        acc = part[s]
        if bias is not None:
            acc = fp.vadd(acc, np.full(x.shape[1], fp.as_bits(bias)[o], dtype=np.uint32))
        for q in range(1, height):
            acc = fp.vadd(acc, part[(s + q) % height])
        y[o] = acc
    return y.view(np.float32)


def compile_sparse(model, example_input, *, config, batch: int, masks: Mapping[str, np.ndarray],
                   loss="cross_entropy", cycles: bool = True, progress: bool = True, choose: bool = True):
    """Compile ``model`` for weight-streaming training with the static ``masks``
    (weight name to boolean ``[O, K]``, e.g. from :func:`layer_masks`): each
    masked layer's forward GEMM streams only its kept weights
    (``docs/weight_streaming.md`` section 13); an empty ``masks`` gives the
    dense executable. ``cycles`` as for :func:`~.mapper.compile_model`; ``progress``
    reports a long cycle model on stderr. ``choose`` keeps a masked layer's phase
    dense where the static cycle model counts fewer cycles for the dense phase
    (low sparsity: a non-zero costs more than a dense weight); the phase's
    math is then the dense one on the masked weights, and MemoryX's gradient
    masking keeps the semantics. ``choose=False`` runs every masked phase sparse.

    Raises
    ------
    UsageError
        A mask naming no weight, of the wrong shape or not 0/1, a batch whose
        token blocks differ between columns (a :class:`~.weight_streaming.FitError`),
        or anything :func:`~.mapper.compile_model` refuses.
    """
    from wse.config import FabricConfig

    from .codegen import generate
    from .frontend import trace
    from .weight_streaming import plan

    if not isinstance(config, FabricConfig):
        raise UsageError(f"config must be a FabricConfig, not {type(config).__name__}")
    graph = trace(model, example_input, loss=loss)
    if not (choose and cycles and masks):
        return generate(plan(graph, config, batch, masks), cycles=cycles, progress=progress)
    from .cycles import phase_cycles

    sparse_plan = plan(graph, config, batch, masks)
    sparse = phase_cycles(sparse_plan, progress=progress)
    dense = phase_cycles(plan(graph, config, batch), progress=progress)
    slower = sorted(name for name, count in sparse.items() if count > dense[name])
    return generate(plan(graph, config, batch, masks, slower) if slower else sparse_plan, progress=progress)
