"""Static sparsity masks in MemoryX: checking them, their kept indices, the compact optimizer state.

A masked weight (``docs/weight_streaming.md`` section 13) keeps its dense
weights in MemoryX (pruned ones exactly ``+0``), but its optimizer state only
for the kept weights: each state tensor but Adam's 0-d ``step`` is a 1-D
float32 vector over the kept flat indices, in ascending order. The update
gathers the kept weights and gradients into such vectors, runs the same
elementwise ``torch.optim`` step on them and scatters the weights back.
PyTorch's single-tensor updates are elementwise, so every kept weight gets
the bits the dense update with gradient masking gives it.

Checkpoints keep the kept indices once (``memoryx.json``'s ``masks``) and the
compact state (format version 2). A version-1 checkpoint held a masked
weight's state dense: :func:`compact` gathers its kept entries on load.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import numpy as np

from wse.config import UsageError

__all__ = ["check_masks", "kept_indices", "compact", "read_masks", "state_bytes", "state_shape"]


def kept_indices(mask: np.ndarray) -> np.ndarray:
    """The flat indices of the kept weights of boolean ``mask``, ascending (int64)."""
    return np.flatnonzero(np.asarray(mask).ravel()).astype(np.int64)


def check_masks(masks: Mapping[str, Any], shape_of: Callable[[str], tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Boolean masks by name, each checked against ``shape_of(name)`` (which raises for an unknown name).

    Raises
    ------
    UsageError
        For a mask of another shape than its weight, or one holding other values than 0/1 or booleans.
    """
    checked = {}
    for name, mask in masks.items():
        shape = shape_of(name)
        array = np.asarray(mask)
        if array.shape != shape:
            raise UsageError(f"mask of {name!r} has shape {array.shape}, expected the weight's shape {shape}")
        if array.dtype != bool and not np.isin(array, (0, 1)).all():
            raise UsageError(f"mask of {name!r} must hold only 0 and 1 (or booleans)")
        checked[name] = array.astype(bool)
    return checked


def state_shape(slot: str, kept: np.ndarray | None, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of optimizer-state tensor ``slot`` of a weight of ``shape``: ``()`` for Adam's ``step``,
    ``(len(kept),)`` for a masked weight (``kept`` its kept indices), ``shape`` otherwise."""
    if slot == "step":
        return ()
    return shape if kept is None else (len(kept),)


def state_bytes(slots: Iterable[str], shapes: Mapping[str, tuple[int, ...]],
                kept: Mapping[str, np.ndarray]) -> int:
    """Bytes of the float32 state ``slots`` of weights of ``shapes`` once stepped, a weight named in
    ``kept`` (its kept indices) holding compact state."""
    return sum(4 * int(np.prod(state_shape(slot, kept.get(name), shape), dtype=np.int64))
               for name, shape in shapes.items() for slot in slots)


def compact(value: np.ndarray, slot: str, kept: np.ndarray, old_kept: np.ndarray | None = None) -> np.ndarray:
    """State ``value`` of ``slot`` over the kept indices ``kept``: gathered from a dense tensor
    (``old_kept`` None), or moved from a compact one over ``old_kept`` (entries of weights no longer
    kept are dropped, newly kept ones start at ``+0``). Adam's 0-d ``step`` is returned as it is."""
    value = np.asarray(value, dtype=np.float32)
    if slot == "step":
        return value.copy()
    if old_kept is None:
        return np.ascontiguousarray(value.reshape(-1)[kept])
    out = np.zeros(len(kept), np.float32)
    _, at_new, at_old = np.intersect1d(kept, old_kept, assume_unique=True, return_indices=True)
    out[at_new] = value[at_old]
    return out


def read_masks(entry: Any, shapes: Mapping[str, list], where: str) -> dict[str, np.ndarray]:
    """The masks of a checkpoint manifest's ``masks`` entry (kept flat indices by name), as boolean
    arrays of the recorded ``shapes``.

    Raises
    ------
    UsageError
        Naming ``where``, for a mask of a tensor the checkpoint does not hold or indices outside,
        repeated or unordered.
    """
    masks = {}
    for name, kept in dict(entry or {}).items():
        if name not in shapes or not isinstance(kept, list):
            raise UsageError(f"{where} has a mask for {name!r}, which it holds no weight of")
        size = int(np.prod(shapes[name], dtype=np.int64))
        try:
            indices = np.asarray(kept, dtype=np.int64).reshape(-1)
        except (TypeError, ValueError):
            raise UsageError(f"{where} mask of {name!r} must be a list of flat indices") from None
        if indices.size and (indices[0] < 0 or indices[-1] >= size or np.any(np.diff(indices) <= 0)):
            raise UsageError(f"{where} mask of {name!r} must hold ascending indices in [0, {size}), each once")
        mask = np.zeros(size, dtype=bool)
        mask[indices] = True
        masks[name] = mask.reshape(shapes[name])
    return masks
