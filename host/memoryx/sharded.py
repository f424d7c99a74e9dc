"""MemoryX sharded across the systems of a SwarmX group.

Shard map (``docs/swarmx.md``): every tensor is flattened in C order and its
``numel`` elements are cut into ``S`` contiguous ranges, one per shard
(:func:`~wse.firmware.kernels.common.block_partition`: the first
``numel mod S`` shards get one element more; shards past ``numel`` get an
empty range). Shard ``s`` (kept by system ``s``) owns that range of every
weight and of every optimizer-state tensor of the same shape; Adam's per-tensor
``step`` count is kept whole by every shard. Each shard is a plain
:class:`~wse.host.memoryx.MemoryX` holding 1-D slices, so the shards' steps
together are exactly the unsharded step (the optimizers are elementwise).

The shards agree before they step: a gradient with NaN or infinity in any
shard's slice raises (or skips the step) on every shard. Weights leave the
shards by broadcast (every system gets the whole tensor) or gather (one
system does); a checkpoint is the gathered, unsharded MemoryX checkpoint
written by system 0, so it loads into any number of shards, or into a plain
MemoryX, and a job can restart from it on a different number of systems.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch

from wse.config import UsageError
from wse.firmware.kernels.common import block_partition

from .memoryx import MemoryX, NonFiniteGradientError, _as_float32
from .optim import OptimizerConfig
from .store import TensorStore

__all__ = ["ShardMap", "ShardedMemoryX"]

_REPLICATED_SLOTS = ("step",)     # per-tensor scalars: every shard keeps the whole value


class ShardMap:
    """Which flat element range of each tensor each shard owns (module docstring).

    Parameters
    ----------
    shapes : mapping of str to tuple of int
        Tensor shapes in streaming order.
    shards : int
        Number of shards (>= 1).
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], shards: int):
        if not isinstance(shards, int) or isinstance(shards, bool) or shards < 1:
            raise UsageError(f"shards must be a positive integer, not {shards!r}")
        self.shards = shards
        self.shapes = {name: tuple(int(n) for n in shape) for name, shape in shapes.items()}
        self._ranges = {name: block_partition(int(np.prod(shape, dtype=np.int64)), shards)
                        for name, shape in self.shapes.items()}

    def names(self) -> list[str]:
        """Tensor names in streaming order."""
        return list(self.shapes)

    def ranges(self, name: str) -> list[range]:
        """The flat element range of ``name`` owned by each shard."""
        return self._ranges[name]

    def range(self, name: str, shard: int) -> range:
        """The flat element range of ``name`` owned by ``shard``."""
        return self._ranges[name][shard]

    def to_dict(self) -> dict:
        """JSON-ready form: ``{"shards": S, "tensors": {name: {"shape": [...], "ranges": [[start, stop], ...]}}}``."""
        return {"shards": self.shards,
                "tensors": {name: {"shape": list(shape), "ranges": [[r.start, r.stop] for r in self._ranges[name]]}
                            for name, shape in self.shapes.items()}}


def _owned(value: np.ndarray, slot: str, span: range) -> np.ndarray:
    return value.copy() if slot in _REPLICATED_SLOTS else value.reshape(-1)[span.start:span.stop].copy()


class ShardedMemoryX:
    """One system's shard of a MemoryX spread over a SwarmX group.

    Build it with :meth:`from_state_dict` or :meth:`load` on every system of
    the group; every method that moves data is a collective (all systems call
    it, in the same order).

    Members
    -------
    group : wse.host.swarmx.Group
        The systems; shard ``group.rank`` lives here.
    shard_map : ShardMap
        Who owns what.
    local : MemoryX
        This shard: 1-D float32 slices under the tensor names.
    """

    def __init__(self, group, local: MemoryX, shard_map: ShardMap):
        self.group, self.local, self.shard_map = group, local, shard_map

    # ---------------------------------------------------------------- building
    @classmethod
    def from_state_dict(cls, group, state_dict: Mapping[str, Any], optimizer: str | OptimizerConfig = "sgd", *,
                        order: Iterable[str] | None = None, store: TensorStore | None = None,
                        nonfinite: str = "raise", **hyper: Any) -> "ShardedMemoryX":
        """Shard ``state_dict`` (the same full weights on every system) with fresh optimizer state.

        ``store`` holds this shard's slices (e.g. a
        :class:`~wse.host.memoryx.TieredStore`); the other parameters are
        those of :meth:`MemoryX.from_state_dict`, with the same errors.
        """
        if not isinstance(state_dict, Mapping) or not state_dict:
            raise UsageError("state_dict must be a non-empty mapping of names to float32 tensors")
        arrays = {name: _as_float32(value, f"state_dict entry {name!r}") for name, value in state_dict.items()}
        names = list(order) if order is not None and not isinstance(order, str) else list(arrays)
        if sorted(names) != sorted(arrays) or len(set(names)) != len(names):
            raise UsageError(f"order must be a permutation of the tensor names {list(arrays)}, not {names}")
        shard_map = ShardMap({name: arrays[name].shape for name in names}, group.size)
        slices = {name: _owned(arrays[name], "", shard_map.range(name, group.rank)) for name in names}
        local = MemoryX.from_state_dict(slices, optimizer, order=names, store=store, nonfinite=nonfinite, **hyper)
        return cls(group, local, shard_map)

    @classmethod
    def load(cls, group, folder: str | os.PathLike, *, store: TensorStore | None = None) -> "ShardedMemoryX":
        """This system's shard of the checkpoint in ``folder`` (written by :meth:`save` or ``MemoryX.save``).

        Every system reads the checkpoint (a shared folder when systems are
        on several machines) and keeps its part; any number of shards can
        load any checkpoint. Raises :class:`UsageError` like ``MemoryX.load``.
        """
        return cls.from_memoryx(group, MemoryX.load(folder), store=store)

    @classmethod
    def from_memoryx(cls, group, whole: MemoryX, *, store: TensorStore | None = None) -> "ShardedMemoryX":
        """This system's shard of ``whole`` (the same whole MemoryX, or an equal one, on every system).

        The shard copies its slices of the weights and optimizer state and the
        step counts; ``whole`` is not changed and may be dropped afterwards.
        """
        if not isinstance(whole, MemoryX) or not whole.names():
            raise UsageError("whole must be a MemoryX holding tensors")
        if whole.masks:
            raise UsageError(f"a MemoryX with sparsity masks ({', '.join(whole.masks)}) trains on one system; "
                             "it cannot be sharded")
        shard_map = ShardMap({name: whole.shape(name) for name in whole.names()}, group.size)
        mine = {name: shard_map.range(name, group.rank) for name in whole.names()}
        slices = {name: _owned(whole.weight(name), "", mine[name]) for name in whole.names()}
        local = MemoryX.from_state_dict(slices, whole.config, order=whole.names(), store=store,
                                       nonfinite=whole.nonfinite)
        for name in whole.names():
            for slot, value in whole.optimizer_state(name).items():
                local._set_slot(name, slot, _owned(value, slot, mine[name]))
        local.step_count, local.skipped_steps = whole.step_count, whole.skipped_steps
        return cls(group, local, shard_map)

    # ----------------------------------------------------------------- queries
    def names(self) -> list[str]:
        """Tensor names in streaming order."""
        return self.local.names()

    def __len__(self) -> int:
        return len(self.local)

    def shape(self, name: str) -> tuple[int, ...]:
        """The full shape of tensor ``name``."""
        self.local.shape(name)      # UsageError for an unknown name
        return self.shard_map.shapes[name]

    def local_range(self, name: str) -> range:
        """The flat element range of ``name`` that this shard owns."""
        self.local.shape(name)
        return self.shard_map.range(name, self.group.rank)

    @property
    def config(self) -> OptimizerConfig:
        """The optimizer configuration."""
        return self.local.config

    @property
    def nonfinite(self) -> str:
        """The non-finite gradient policy (the same on every shard)."""
        return self.local.nonfinite

    @property
    def step_count(self) -> int:
        """Optimizer steps applied (the same on every shard)."""
        return self.local.step_count

    @property
    def skipped_steps(self) -> int:
        """Steps skipped for non-finite gradients (the same on every shard)."""
        return self.local.skipped_steps

    def __repr__(self) -> str:
        return (f"ShardedMemoryX({self.config!r}, shard={self.group.rank} of {self.group.size}, "
                f"tensors={len(self)}, step_count={self.step_count})")

    # ------------------------------------------------------------ streaming out
    def _hint(self, action: str, names: Iterable[str]) -> None:
        self.local.hint(action, names)      # a TieredStore streams its disk tier

    def weight(self, name: str, *, dst: int | None = None) -> np.ndarray | None:
        """The whole weights of ``name`` (float32, full shape), a collective.

        With ``dst=None`` every shard broadcasts its slice and every system
        gets the tensor; otherwise only system ``dst`` does (a gather) and the
        others get None.
        """
        shape = self.shape(name)
        flat = np.empty(int(np.prod(shape, dtype=np.int64)), np.float32)
        spans = self.shard_map.ranges(name)
        mine = np.ascontiguousarray(self.local.weight(name))
        if dst is not None:
            views = [flat[s.start:s.stop] for s in spans] if self.group.rank == dst else None
            self.group.gather(mine, views, dst)
            return flat.reshape(shape) if self.group.rank == dst else None
        flat[spans[self.group.rank].start:spans[self.group.rank].stop] = mine
        works = [self.group.broadcast(flat[s.start:s.stop], src, async_op=True) for src, s in enumerate(spans)]
        for work in works:
            work.wait()
        return flat.reshape(shape)

    def stream_weights(self, names: Iterable[str] | None = None) -> Iterator[tuple[str, np.ndarray]]:
        """``(name, whole weights)`` for every tensor in streaming order, on every system.

        A disk tier is fetched layer by layer: the next tensor is prefetched
        while this one is broadcast, and released after.
        """
        names = self.names() if names is None else list(names)
        for i, name in enumerate(names):
            self._hint("prefetch", names[i + 1:i + 2])
            full = self.weight(name)
            self._hint("release", [name])
            yield name, full

    def all_weights(self) -> dict[str, np.ndarray]:
        """Every tensor's whole weights on every system, by name in streaming order; a collective.

        The same values as :meth:`stream_weights` in fewer messages: each shard
        packs its slices of every tensor (read in streaming order, a disk tier
        prefetched one tensor ahead and released after) and sends them in one
        broadcast.
        """
        names, rank = self.names(), self.group.rank
        spans = {name: self.shard_map.ranges(name) for name in names}
        packs = [np.empty(sum(len(spans[name][s]) for name in names), np.float32) for s in range(self.group.size)]
        offset = 0
        for i, name in enumerate(names):
            self._hint("prefetch", names[i + 1:i + 2])
            size = len(spans[name][rank])
            packs[rank][offset:offset + size] = self.local.weight(name)
            offset += size
            self._hint("release", [name])
        works = [self.group.broadcast(pack, src, async_op=True) for src, pack in enumerate(packs)]
        for work in works:
            work.wait()
        out, offsets = {}, [0] * len(packs)
        for name in names:
            flat = np.empty(int(np.prod(self.shape(name), dtype=np.int64)), np.float32)
            for src, span in enumerate(spans[name]):
                flat[span.start:span.stop] = packs[src][offsets[src]:offsets[src] + len(span)]
                offsets[src] += len(span)
            out[name] = flat.reshape(self.shape(name))
        return out

    def state_dict(self, *, dst: int | None = None) -> "collections.OrderedDict[str, torch.Tensor] | None":
        """Whole weights as torch tensors by name, in streaming order (see :meth:`weight` for ``dst``)."""
        out = collections.OrderedDict()
        for name in self.names():
            full = self.weight(name, dst=dst)
            if full is not None:
                out[name] = torch.from_numpy(full)
        return out if dst is None or self.group.rank == dst else None

    # ----------------------------------------------------------------- updating
    def apply_gradients(self, grads: Mapping[str, Any]) -> bool:
        """Step every shard on its slices of the gradients (a collective).

        Parameters
        ----------
        grads : mapping of str to float32 1-D array
            For each stepped tensor, the gradient of this shard's range
            (:meth:`local_range`). Every system names the same tensors.

        Returns
        -------
        bool
            True if applied, False if skipped (policy ``"skip"``) because some
            shard's gradient holds NaN or infinity.

        Raises
        ------
        UsageError
            For an unknown name or a slice of the wrong shape (before any
            communication).
        NonFiniteGradientError
            On every system, when some shard's gradient is not finite and the
            policy is ``"raise"``; nothing was updated.
        """
        if not isinstance(grads, Mapping) or not grads:
            raise UsageError("grads must be a non-empty mapping of tensor names to float32 gradients")
        arrays = {}
        for name, value in grads.items():
            span = self.local_range(name)
            array = _as_float32(value, f"gradient for {name!r}")
            if array.shape != (len(span),):
                raise UsageError(f"gradient slice for {name!r} has shape {array.shape}, expected ({len(span)},) "
                                 f"(elements {span.start}..{span.stop} of the flattened tensor)")
            arrays[name] = array
        if self.nonfinite != "apply":
            names = self.names()
            flags = np.array([name in arrays and not np.isfinite(arrays[name]).all() for name in names], np.float32)
            self.group.all_reduce(flags)
            bad = [name for name, flag in zip(names, flags) if flag != 0]
            if bad and self.nonfinite == "raise":
                raise NonFiniteGradientError(f"gradients for {bad} hold NaN or infinity; no tensor was updated")
            if bad:
                self.local.skipped_steps += 1
                return False
        names = [name for name in self.names() if name in arrays]
        self._hint("prefetch", names)
        applied = self.local.apply_gradients(arrays)
        self._hint("release", names)
        return applied

    # -------------------------------------------------------------- checkpoints
    def gather(self, dst: int = 0, *, store: TensorStore | None = None) -> MemoryX | None:
        """The whole, unsharded MemoryX on system ``dst`` (None on the others); a collective.

        Weights, optimizer state and step counts are those of the shards put
        together; continuing from it gives the sharded results bit for bit.
        ``store`` (on ``dst``) holds its tensors, e.g. a
        :class:`~wse.host.memoryx.TieredStore` to bound the RAM it takes.
        """
        root = self.group.rank == dst
        weights = {name: self.weight(name, dst=dst) for name in self.names()}
        states: dict[str, dict[str, np.ndarray]] = {}
        for name in self.names():
            states[name] = {}
            spans = self.shard_map.ranges(name)
            for slot, value in self.local.optimizer_state(name).items():
                if slot in _REPLICATED_SLOTS:
                    states[name][slot] = np.array(value)
                    continue
                full = np.empty(int(np.prod(self.shape(name), dtype=np.int64)), value.dtype)
                views = [full[s.start:s.stop] for s in spans] if root else None
                self.group.gather(np.ascontiguousarray(value), views, dst)
                states[name][slot] = full.reshape(self.shape(name))
        if not root:
            return None
        whole = MemoryX.from_state_dict(weights, self.config, order=self.names(), store=store,
                                        nonfinite=self.nonfinite)
        for name, slots in states.items():
            for slot, value in slots.items():
                whole._set_slot(name, slot, value)
        whole.step_count, whole.skipped_steps = self.step_count, self.skipped_steps
        return whole

    def save(self, folder: str | os.PathLike) -> None:
        """Gather every shard to system 0, which writes an ordinary MemoryX checkpoint atomically.

        A collective: every system returns once the checkpoint is committed.
        The checkpoint does not depend on the number of shards.
        """
        whole = self.gather(0)
        error: BaseException | None = None
        if whole is not None:
            try:
                whole.save(folder)
            except BaseException as exc:    # noqa: BLE001 - release the others first, then raise
                error = exc
        status = np.array([0.0 if error is None else 1.0], np.float32)
        self.group.broadcast(status, 0)
        if error is not None:
            raise error
        if status[0] != 0:
            raise UsageError(f"system 0 could not write the MemoryX checkpoint to {str(folder)!r}")
