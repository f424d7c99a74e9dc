"""MemoryX: the weights and optimizer state of a model, held off the wafer.

In weight-streaming training the fabric never keeps the model. MemoryX holds
every weight, streams them out layer by layer in a fixed order, receives the
weight gradients that stream back from the fabric's outlet, and runs the
optimizer on them. Updates are exactly PyTorch's: MemoryX drives ``torch.optim``
(single-tensor loops) on ``torch.from_numpy`` views of its own storage.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch

from wse.config import UsageError

from .checkpoint import read_checkpoint, write_checkpoint
from .masked import check_masks, compact, kept_indices, read_masks, state_bytes, state_shape
from .optim import OptimizerConfig, state_slots
from .store import InMemoryStore, TensorStore

__all__ = ["MemoryX", "NonFiniteGradientError", "NONFINITE_POLICIES"]

#: What :meth:`MemoryX.apply_gradients` does with a gradient holding NaN or infinity.
NONFINITE_POLICIES = ("raise", "skip", "apply")

_SLOT_SEP = "::"
_FORMAT = "wse.memoryx"
_VERSION = 2                            # 2: a masked weight's optimizer state is compact (1: dense), see .masked


class NonFiniteGradientError(UsageError):
    """A streamed gradient holds NaN or infinity (policy ``"raise"``); nothing was updated."""


def _as_float32(value: Any, what: str) -> np.ndarray:
    """A float32 numpy view (or the array itself) of a numpy array or torch tensor."""
    if isinstance(value, torch.Tensor):
        if value.dtype != torch.float32:
            raise UsageError(f"{what} must be float32, not torch.{str(value.dtype).removeprefix('torch.')}")
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        if value.dtype != np.float32:
            raise UsageError(f"{what} must be float32, not numpy {value.dtype}")
        return value
    raise UsageError(f"{what} must be a float32 numpy array or torch tensor, not {type(value).__name__}")


class MemoryX:
    """Named float32 weights and their optimizer state, updated from streamed gradients.

    Parameters
    ----------
    optimizer : str or OptimizerConfig
        ``"sgd"``, ``"adam"`` or ``"adamw"``, or a ready configuration.
    store : TensorStore, optional
        Where tensors live; an empty :class:`InMemoryStore` by default.
    nonfinite : {"raise", "skip", "apply"}
        What :meth:`apply_gradients` does when a gradient holds NaN or
        infinity: raise :class:`NonFiniteGradientError`, skip the whole step
        (counted in :attr:`skipped_steps`), or apply it as PyTorch would.
        Nothing is updated in the first two cases.
    **hyper
        Optimizer hyper-parameters with PyTorch's names (see
        :class:`OptimizerConfig`); with a configuration, they override it.

    Members
    -------
    step_count : int
        Optimizer steps applied since construction or :meth:`zero_state`.
    skipped_steps : int
        Steps skipped for non-finite gradients (policy ``"skip"``).

    Raises
    ------
    UsageError
        For a bad optimizer name (the message lists the valid ones), a bad
        hyper-parameter (named), an unknown policy or a non-empty store.

    Notes
    -----
    Equality with PyTorch holds bit for bit for the same settings, gradients
    and thread count. Per-tensor state follows ``torch.optim``: a tensor that
    is absent from a step keeps its state unchanged (Adam's per-tensor step
    count included). Tensors are kept in a :class:`TensorStore`, so a sharded
    MemoryX (each shard a slice of every tensor) or a memory-mapped store can
    replace the in-memory one without changing this class.
    """

    def __init__(self, optimizer: str | OptimizerConfig = "sgd", *, store: TensorStore | None = None,
                 nonfinite: str = "raise", **hyper: Any):
        if isinstance(optimizer, OptimizerConfig):
            config = optimizer.replace(**hyper) if hyper else optimizer
        else:
            config = OptimizerConfig(optimizer, **hyper)
        if nonfinite not in NONFINITE_POLICIES:
            raise UsageError(f"nonfinite must be one of {', '.join(NONFINITE_POLICIES)}, not {nonfinite!r}")
        store = InMemoryStore() if store is None else store
        if not isinstance(store, TensorStore):
            raise UsageError(f"store must be a TensorStore, not {type(store).__name__}")
        if any(True for _ in store.keys()):
            raise UsageError("store must be empty when MemoryX is created")
        self._config = config
        self._nonfinite = nonfinite
        self._store = store
        self._order: list[str] = []
        self._params: dict[str, torch.Tensor] = {}
        self._slots: dict[str, dict[str, torch.Tensor]] = {}
        self._optimizer: torch.optim.Optimizer | None = None
        self.step_count = 0
        self.skipped_steps = 0
        self._masks: dict[str, np.ndarray] = {}
        self._kept: dict[str, np.ndarray] = {}              # a masked weight's kept flat indices
        self._steppers: dict[str, torch.Tensor] = {}        # what torch.optim steps for a masked weight

    # ----------------------------------------------------------------- loading
    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, Any], optimizer: str | OptimizerConfig = "sgd", *,
                        order: Iterable[str] | None = None, store: TensorStore | None = None,
                        nonfinite: str = "raise", **hyper: Any) -> "MemoryX":
        """A new MemoryX holding the tensors of ``state_dict`` and fresh optimizer state.

        ``state_dict`` maps names to float32 numpy arrays or torch tensors, as
        ``dict(model.named_parameters())`` or ``model.state_dict()`` of a
        float32 model without integer buffers. See :meth:`load_state_dict` for
        ``order`` and :class:`MemoryX` for the other parameters.
        """
        memoryx = cls(optimizer, store=store, nonfinite=nonfinite, **hyper)
        memoryx.load_state_dict(state_dict, order=order)
        return memoryx

    def load_state_dict(self, state_dict: Mapping[str, Any], order: Iterable[str] | None = None) -> None:
        """Load weights (copied in) by name.

        An empty MemoryX takes the tensors as its own. One that already holds
        tensors needs exactly the same names and shapes; it overwrites the
        weights and keeps its optimizer state, as ``torch.nn.Module.load_state_dict``
        does.

        Parameters
        ----------
        state_dict : mapping of str to float32 array or tensor
        order : iterable of str, optional
            Streaming order: a permutation of the names. Default: the order of
            ``state_dict`` for a new MemoryX, the current order otherwise.

        Raises
        ------
        UsageError
            For an empty mapping, a name that is not a non-empty string without
            ``"::"``, a tensor that is not float32, missing or unexpected names,
            a shape mismatch, or an ``order`` that is not a permutation of the names.
        """
        if not isinstance(state_dict, Mapping) or not state_dict:
            raise UsageError("state_dict must be a non-empty mapping of names to float32 tensors")
        arrays = {}
        for name, value in state_dict.items():
            if not isinstance(name, str) or not name or _SLOT_SEP in name:
                raise UsageError(f"tensor names must be non-empty strings without {_SLOT_SEP!r}, not {name!r}")
            arrays[name] = _as_float32(value, f"state_dict entry {name!r}")
        if not self._order:
            new_order = self._check_order(order, arrays) if order is not None else None
            for name in new_order or list(arrays):
                array = self._store.create(name, arrays[name].shape)
                array[...] = arrays[name]
                self._params[name] = torch.from_numpy(array)
                self._slots[name] = {}
            self._order = list(new_order or arrays)
            self._optimizer = self._config.build([self._stepper(name) for name in self._params])
            return
        missing = [name for name in self._order if name not in arrays]
        unexpected = [name for name in arrays if name not in self._params]
        if missing or unexpected:
            raise UsageError(f"state_dict does not match the tensors held: missing {missing}, unexpected {unexpected}")
        for name, array in arrays.items():
            if array.shape != self.shape(name):
                raise UsageError(f"state_dict entry {name!r} has shape {array.shape}, expected {self.shape(name)}")
        new_order = self._check_order(order, arrays) if order is not None else None
        for name, array in arrays.items():
            self._store.get(name)[...] = array
        if new_order is not None:
            self._order = new_order

    def _check_order(self, order: Iterable[str], names: Iterable[str]) -> list[str]:
        order = list(order) if not isinstance(order, str) else [order]
        names = list(names)
        if len(order) != len(set(order)) or set(order) != set(names):
            raise UsageError(f"order must be a permutation of the tensor names {names}, not {order}")
        return order

    # ----------------------------------------------------------------- queries
    @property
    def config(self) -> OptimizerConfig:
        """The optimizer configuration."""
        return self._config

    @property
    def optimizer(self) -> str:
        """The optimizer name: ``"sgd"``, ``"adam"`` or ``"adamw"``."""
        return self._config.name

    @property
    def hyper(self) -> dict[str, Any]:
        """A copy of every optimizer hyper-parameter."""
        return dict(self._config.hyper)

    @property
    def nonfinite(self) -> str:
        """The non-finite gradient policy."""
        return self._nonfinite

    @property
    def store(self) -> TensorStore:
        """The tensor store (weights under their names, state under ``"name::slot"``)."""
        return self._store

    def names(self) -> list[str]:
        """Tensor names in streaming order."""
        return list(self._order)

    def __len__(self) -> int:
        return len(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._params

    def _need(self, name: str) -> torch.Tensor:
        try:
            return self._params[name]
        except (KeyError, TypeError):
            raise UsageError(f"MemoryX holds no tensor named {name!r}; it holds {self._order}") from None

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of tensor ``name``."""
        return tuple(self._need(name).shape)

    @property
    def num_elements(self) -> int:
        """Total number of weight elements held."""
        return sum(p.numel() for p in self._params.values())

    def weight(self, name: str) -> np.ndarray:
        """The weights of ``name`` as a read-only float32 view.

        The view shares memory with MemoryX, so it shows later updates; copy
        it (``.copy()``) to keep a snapshot. Raises :class:`UsageError` for an
        unknown name.
        """
        self._need(name)
        view = self._store.get(name).view()
        view.flags.writeable = False
        return view

    def optimizer_state(self, name: str) -> dict[str, np.ndarray]:
        """The optimizer-state tensors of ``name`` as read-only views, by ``torch.optim`` slot name.

        Empty until the tensor has been stepped (and for SGD without momentum).
        A masked weight's state is compact: 1-D over its kept flat indices,
        ascending (:mod:`.masked`); Adam's ``step`` is 0-d.
        """
        self._need(name)
        views = {}
        for slot in self._slots[name]:
            view = self._store.get(name + _SLOT_SEP + slot).view()
            view.flags.writeable = False
            views[slot] = view
        return views

    def stream_weights(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, copy of the weights)`` for every tensor (or ``names``) in streaming order.

        With a store that has a disk tier (:class:`~wse.host.memoryx.TieredStore`)
        the tensors are fetched layer by layer: the next one is prefetched while
        this one is copied out, and released after.
        """
        names = self.names() if names is None else list(names)
        for i, name in enumerate(names):
            self.hint("prefetch", names[i + 1:i + 2])
            value = np.array(self.weight(name))
            self.hint("release", [name])
            yield name, value

    def hint(self, action: str, names: Iterable[str]) -> None:
        """Ask a store with a disk tier to ``"prefetch"`` or ``"release"`` the weights and
        optimizer state of ``names``; a no-op for stores without one (a hint: results never change)."""
        if action not in ("prefetch", "release"):
            raise UsageError(f"action must be 'prefetch' or 'release', not {action!r}")
        method = getattr(self._store, action, None)
        if method is not None:
            method([key for name in names
                    for key in [name] + [name + _SLOT_SEP + slot for slot in self._slots[name]]])

    def copy(self, *, store: TensorStore | None = None) -> "MemoryX":
        """An independent copy (weights, optimizer state, step counts) whose tensors live in ``store``.

        Tensors are created in streaming order, weights first, then each
        tensor's optimizer state, as a new MemoryX creates them (a
        :class:`~wse.host.memoryx.TieredStore` places them in that order).
        Continuing from the copy gives the original's results bit for bit.
        """
        if self._optimizer is None:
            raise UsageError("MemoryX holds no tensors yet; there is nothing to copy")
        twin = type(self).from_state_dict({name: self.weight(name) for name in self._order}, self._config,
                                         order=self._order, store=store, nonfinite=self._nonfinite)
        twin.set_masks(self._masks)
        for name in self._order:
            for slot, value in self.optimizer_state(name).items():
                twin._set_slot(name, slot, value)
        twin.step_count, twin.skipped_steps = self.step_count, self.skipped_steps
        return twin

    def set_optimizer_state(self, name: str, slot: str, value: np.ndarray) -> None:
        """Set optimizer-state tensor ``slot`` of ``name`` (created if absent) to ``value``:
        state the optimizer ran elsewhere (the layer-pipelined mode's PEs) adopted by MemoryX.

        A masked weight takes its compact state, or dense state, whose kept entries are kept.

        Raises
        ------
        UsageError
            For an unknown name, a slot the optimizer does not keep, or a value of another shape.
        """
        self._need(name)
        if slot not in state_slots(self._config):
            raise UsageError(f"optimizer {self._config.name} keeps no state {slot!r}")
        value = _as_float32(value, f"optimizer state {name}{_SLOT_SEP}{slot}")
        kept = self._kept.get(name)
        expected = state_shape(slot, kept, self.shape(name))
        if kept is not None and slot != "step" and value.shape == self.shape(name):
            value = compact(value, slot, kept)
        if value.shape != expected:
            raise UsageError(f"optimizer state {name}{_SLOT_SEP}{slot} has shape {value.shape}, "
                             f"expected {expected}")
        if slot in self._slots[name]:
            self._store.get(name + _SLOT_SEP + slot)[...] = value
        else:
            self._set_slot(name, slot, value)

    def _set_slot(self, name: str, slot: str, value: np.ndarray) -> None:
        """Create optimizer-state tensor ``slot`` of ``name`` in the store, holding ``value``."""
        state = self._optimizer.state[self._stepper(name)]
        array = self._store.create(name + _SLOT_SEP + slot, value.shape, dtype=value.dtype)
        array[...] = value
        self._slots[name][slot] = state[slot] = torch.from_numpy(array)

    def state_dict(self) -> "collections.OrderedDict[str, torch.Tensor]":
        """Copies of the weights as torch tensors with PyTorch names and shapes, in streaming order.

        ``model.load_state_dict(memoryx.state_dict())`` loads them into the model.
        """
        return collections.OrderedDict((name, self._params[name].detach().clone()) for name in self._order)

    def state_bytes(self) -> dict[str, int]:
        """Bytes of the optimizer state the optimizer keeps once every tensor has been stepped:
        ``{"state_bytes": held (a masked weight's over its kept weights only), "dense_state_bytes":
        the same state kept dense}``."""
        slots = state_slots(self._config)
        return {"state_bytes": state_bytes(slots, {name: self.shape(name) for name in self._order}, self._kept),
                "dense_state_bytes": state_bytes(slots, {name: self.shape(name) for name in self._order}, {})}

    def __repr__(self) -> str:
        sizes = self.state_bytes()
        return (f"MemoryX({self._config!r}, tensors={len(self)}, elements={self.num_elements}, "
                f"step_count={self.step_count}, state_bytes={sizes['state_bytes']}"
                + (f" of {sizes['dense_state_bytes']} dense" if self._masks else "") + ")")

    # ---------------------------------------------------------------- sparsity
    @property
    def masks(self) -> dict[str, np.ndarray]:
        """The static sparsity masks by tensor name (boolean, the tensor's shape; copies)."""
        return {name: mask.copy() for name, mask in self._masks.items()}

    def set_masks(self, masks: Mapping[str, Any]) -> None:
        """Fix static sparsity masks (``docs/weight_streaming.md`` section 13).

        Each named weight's pruned entries become ``+0`` and stay so: its
        optimizer state is kept for the kept weights only (compact, see
        :mod:`.masked`; state it had is gathered there) and each step updates
        only the kept weights, with the bits of PyTorch with gradient masking
        (``weight.grad *= mask`` before the step) on dense state. Tensors not
        named stay as they are.

        Raises
        ------
        UsageError
            For an unknown tensor, or a mask of another shape or not 0/1.
        """
        checked = check_masks(masks, self.shape)
        fresh = {name: torch.empty(0) for name in checked if name not in self._steppers}
        if fresh:                           # torch.optim steps a compact tensor for each newly masked weight
            before = {name: self._stepper(name) for name in self._params}
            self._steppers.update(fresh)
            old, self._optimizer = self._optimizer, self._config.build([self._stepper(n) for n in self._params])
            for name, tensor in before.items():
                if old is not None and old.state.get(tensor):
                    self._optimizer.state[self._stepper(name)] = old.state[tensor]
        for name, mask in checked.items():
            np.copyto(self._store.get(name), np.float32(0), where=~mask)
            kept, old_kept = kept_indices(mask), self._kept.get(name)
            self._masks[name], self._kept[name] = mask, kept
            for slot in sorted(self._slots[name]):
                key = name + _SLOT_SEP + slot
                value = compact(self._store.get(key), slot, kept, old_kept)
                self._store.delete(key)
                del self._slots[name][slot]
                self._set_slot(name, slot, value)

    def _stepper(self, name: str) -> torch.Tensor:
        """The tensor torch.optim steps for ``name``: the weights, or a masked weight's compact tensor
        (empty between steps; it holds the kept weights during one)."""
        return self._steppers.get(name, self._params[name])

    # ---------------------------------------------------------------- updating
    def apply_gradients(self, grads: Mapping[str, Any]) -> bool:
        """Run one optimizer step over the tensors named in ``grads``.

        Tensors not named keep their weights and state (like parameters whose
        ``.grad`` is ``None`` in PyTorch). All gradients are checked before
        anything changes.

        Parameters
        ----------
        grads : mapping of str to float32 array or tensor
            Gradient of each named tensor, with the tensor's exact shape.

        Returns
        -------
        bool
            True if the step was applied, False if it was skipped for a
            non-finite gradient (policy ``"skip"``).

        Raises
        ------
        UsageError
            If MemoryX holds no tensors, ``grads`` is empty, or a name is
            unknown, a gradient is not float32 or its shape differs.
        NonFiniteGradientError
            If a gradient holds NaN or infinity and the policy is ``"raise"``.
        """
        if self._optimizer is None:
            raise UsageError("MemoryX holds no tensors yet; call load_state_dict first")
        if not isinstance(grads, Mapping) or not grads:
            raise UsageError("grads must be a non-empty mapping of tensor names to float32 gradients")
        unknown = [name for name in grads if name not in self._params]
        if unknown:
            raise UsageError(f"gradients for unknown tensors {unknown}; MemoryX holds {self._order}")
        arrays = {}
        for name in self._order:
            if name in grads:
                array = _as_float32(grads[name], f"gradient for {name!r}")
                if array.shape != self.shape(name):
                    raise UsageError(f"gradient for {name!r} has shape {array.shape}, expected {self.shape(name)}")
                if name in self._kept:          # only the kept weights' gradients stream out
                    array = np.take(array.reshape(-1), self._kept[name])
                arrays[name] = array
        bad = [name for name, array in arrays.items() if not np.isfinite(array).all()]
        if bad and self._nonfinite == "raise":
            raise NonFiniteGradientError(f"gradients for {bad} hold NaN or infinity; no tensor was updated")
        if bad and self._nonfinite == "skip":
            self.skipped_steps += 1
            return False
        masked = [name for name in arrays if name in self._kept]
        for name in self._params:
            if name in self._kept and name in arrays:   # the kept weights, gathered
                self._stepper(name).set_(torch.from_numpy(np.take(self._store.get(name).reshape(-1),
                                                                  self._kept[name])))
            # A private copy: torch.optim must never alias the caller's buffers.
            self._stepper(name).grad = torch.from_numpy(np.array(arrays[name], order="C")) \
                if name in arrays else None
        try:
            self._optimizer.step()
            for name in masked:                         # scattered back; pruned weights stay +0
                self._store.get(name).reshape(-1)[self._kept[name]] = self._stepper(name).numpy()
        finally:
            for name in self._params:
                self._stepper(name).grad = None
            for name in masked:
                self._stepper(name).set_()
        self._adopt_state(arrays)
        self.step_count += 1
        return True

    def _adopt_state(self, stepped: Iterable[str]) -> None:
        """Move optimizer-state tensors that torch.optim just created into the store."""
        for name in stepped:
            state = self._optimizer.state[self._stepper(name)]
            held = self._slots[name]
            for slot, value in state.items():
                if value is None or held.get(slot) is value:
                    continue
                array = self._store.create(name + _SLOT_SEP + slot, tuple(value.shape),
                                           dtype=value.numpy().dtype)
                array[...] = value.numpy()
                held[slot] = state[slot] = torch.from_numpy(array)

    def zero_state(self) -> None:
        """Forget all optimizer state and reset the step counts; weights are kept."""
        for name, slots in self._slots.items():
            for slot in slots:
                self._store.delete(name + _SLOT_SEP + slot)
            slots.clear()
        if self._params:
            self._optimizer = self._config.build([self._stepper(name) for name in self._params])
        self.step_count = 0
        self.skipped_steps = 0

    # ------------------------------------------------------------ checkpoints
    def save(self, folder: str | os.PathLike) -> None:
        """Write a checkpoint to ``folder`` atomically (see :mod:`.checkpoint`).

        Weights and every optimizer-state tensor go to a safetensors file; the
        optimizer, hyper-parameters, policy, step counts, streaming order,
        shapes, state slots and the masks' kept flat indices to
        ``memoryx.json``. A masked weight's state is its compact state (format
        version 2; version 1 without masks). An interrupted save leaves the
        previous checkpoint in ``folder`` intact.
        """
        if self._optimizer is None:
            raise UsageError("MemoryX holds no tensors yet; there is nothing to save")
        tensors = {}
        for name in self._order:
            tensors[name] = self._store.get(name)
            for slot in self._slots[name]:
                tensors[name + _SLOT_SEP + slot] = self._store.get(name + _SLOT_SEP + slot)
        manifest = {
            "format": _FORMAT, "version": _VERSION if self._masks else 1,
            "optimizer": self._config.to_dict(), "nonfinite": self._nonfinite,
            "step_count": self.step_count, "skipped_steps": self.skipped_steps,
            "order": list(self._order),
            "shapes": {name: list(self.shape(name)) for name in self._order},
            "slots": {name: sorted(self._slots[name]) for name in self._order},
        }
        if self._masks:                 # compact: the kept weights' flat indices
            manifest["masks"] = {name: kept.tolist() for name, kept in self._kept.items()}
        write_checkpoint(folder, manifest, tensors)

    @classmethod
    def load(cls, folder: str | os.PathLike, *, store: TensorStore | None = None) -> "MemoryX":
        """A MemoryX restored from a checkpoint written by :meth:`save`.

        Continuing from the restored MemoryX gives, bit for bit, what the saved
        one would have given had it never stopped. A version-1 checkpoint
        (dense optimizer state for a masked weight) loads too: the kept
        weights' entries of its state are kept, compact.

        Raises
        ------
        UsageError
            If the folder does not hold a valid, intact MemoryX checkpoint (the
            message names the file and what is wrong).
        """
        manifest, tensors = read_checkpoint(folder)
        where = f"checkpoint {str(folder)!r}"
        version = manifest.get("version")
        if manifest.get("format") != _FORMAT or version not in (1, _VERSION):
            raise UsageError(f"{where} is not a {_FORMAT} checkpoint of version 1 to {_VERSION}")
        try:
            order, shapes, slots = manifest["order"], manifest["shapes"], manifest["slots"]
            memoryx = cls(OptimizerConfig.from_dict(manifest["optimizer"]), store=store,
                          nonfinite=manifest["nonfinite"])
            step_count, skipped = int(manifest["step_count"]), int(manifest["skipped_steps"])
            if set(shapes) != set(order) or set(slots) != set(order):
                raise ValueError("order, shapes and slots name different tensors")
            expected_keys = set(order) | {name + _SLOT_SEP + s for name in order for s in slots[name]}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UsageError(f"{where} has a malformed manifest ({exc})") from None
        if set(tensors) != expected_keys:
            raise UsageError(f"{where} tensors file does not hold the tensors its manifest lists")
        masks = read_masks(manifest.get("masks"), shapes, where)
        full = state_slots(memoryx.config)
        for name in order:
            if list(tensors[name].shape) != shapes[name] or tensors[name].dtype != np.float32:
                raise UsageError(f"{where} tensor {name!r} does not have its recorded float32 shape {shapes[name]}")
            if set(slots[name]) not in (set(), full):
                raise UsageError(f"{where} tensor {name!r} has optimizer state {slots[name]}, "
                                 f"expected none or {sorted(full)}")
            compact_state = name in masks and version != 1
            for slot in slots[name]:
                value = tensors[name + _SLOT_SEP + slot]
                shape = state_shape(slot, kept_indices(masks[name]) if compact_state else None, tensors[name].shape)
                if value.shape != shape or value.dtype != np.float32:
                    raise UsageError(f"{where} optimizer state {slot!r} of {name!r} is not float32 of shape {shape}"
                                     + (f" (the checkpoint's mask of {name} keeps {shape[0]} weights, the state "
                                        f"holds {value.size})" if compact_state and shape else ""))
        memoryx.load_state_dict({name: tensors[name] for name in order}, order=order)
        memoryx.set_masks(masks)
        for name in order:
            for slot in slots[name]:
                value = tensors[name + _SLOT_SEP + slot]
                if name in masks and version == 1:      # dense state of a masked weight: its kept entries
                    value = compact(value, slot, memoryx._kept[name])
                memoryx._set_slot(name, slot, value)
        memoryx.step_count, memoryx.skipped_steps = step_count, skipped
        return memoryx
