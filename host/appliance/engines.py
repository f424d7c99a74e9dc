"""Engines: what takes a run's steps, one per system, with the same calls whatever the number of systems.

The training loop (:func:`wse.host.appliance.loop.train_loop`) is written
once, over the :class:`Engine` calls; an engine hides how many systems share
each step and how they talk:

- :class:`OneSystem`: whole steps on one system (``Runtime.train_step`` with
  the weights of a MemoryX, then the MemoryX optimizer step); in the
  layer-pipelined mode (a resident layout) the weights and the momentum
  buffers live in PE memory and the optimizer runs on the PEs: MemoryX's
  state is written to the fabric once, and read back from it
  (``Runtime.read_state``) into MemoryX whenever the loop needs the weights
  (evaluation) or saves a checkpoint, so checkpoints and ``--resume`` work
  as in weight streaming;
- :class:`SwarmSystem`: one system's share of a data-parallel step
  (:class:`~wse.host.swarmx.DataParallel`: weights broadcast from the MemoryX
  shards, ``Runtime.train_shard`` on the system's token columns, gradients
  reduced in the fixed order), with this system's
  :class:`~wse.host.memoryx.ShardedMemoryX` shard, over a SwarmX group of N
  systems in this process or of N ``torchrun`` processes (gloo). N systems
  give one system's bits (``docs/swarmx.md``).

System 0 (``engine.root``) evaluates and writes the run folder; every system
takes every step.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from wse.host.memoryx import MemoryX, NonFiniteGradientError, ShardedMemoryX, TieredStore
from wse.host.swarmx import DataParallel, LinkModel, phase_traffic, token_blocks

__all__ = ["Engine", "StepReport", "OneSystem", "SwarmSystem", "describe_launch"]


@dataclasses.dataclass
class StepReport:
    """One training step as the loop records it (the same on every system).

    Members
    -------
    loss : float
    correct : int
    cycles : int
        Fabric cycles of the step on one system (the slowest).
    utilization : float
        FMAC utilization of the streamed GEMMs.
    phases : dict of str to int
        Fabric cycles per phase.
    """

    loss: float
    correct: int
    cycles: int
    utilization: float
    phases: dict


class Engine(Protocol):
    """The calls the training loop makes on one system of a run (:class:`OneSystem`, :class:`SwarmSystem`).

    Members
    -------
    systems, rank : int
        The number of systems of the run and this one's index.
    root : bool
        Whether this is system 0, which evaluates and writes the run folder.
    transport : str or None
        ``"inprocess"`` or ``"gloo"`` for several systems; None for one.
    memoryx : MemoryX or ShardedMemoryX
        This system's weights and optimizer state.
    links : LinkModel or None
        The SwarmX link model of the run's fabric (None for an executable without phases).
    swarmx : StepCycles or None
        The SwarmX cycles of one step over ``links`` (None likewise).
    """

    systems: int
    rank: int
    root: bool
    transport: str | None
    memoryx: Any
    links: LinkModel | None
    swarmx: Any

    def step(self, x: np.ndarray, y: np.ndarray) -> StepReport:
        """Train on the global batch ``(x, y)`` and apply the optimizer step; a collective."""

    def weights(self) -> dict[str, np.ndarray] | None:
        """The whole weights on system 0, for evaluation (None elsewhere); a collective."""

    def save(self, write: Callable[[MemoryX], Path]) -> Path | None:
        """``write(memoryx)`` of the whole MemoryX on system 0: a checkpoint (None elsewhere); a collective."""

    def memoryx_report(self) -> dict | None:
        """RAM and disk bytes of this system's MemoryX under a budget (None without one)."""


def _swarmx_cycles(executable, systems: int):
    """:class:`~wse.host.swarmx.StepCycles` of the executable's step on ``systems`` systems, or None for an
    executable without phases."""
    if not hasattr(executable, "phases") or not hasattr(executable, "sequences"):
        return None
    links = LinkModel.for_fabric(executable.config)
    return links, links.streamed_step(phase_traffic(executable), systems, "chain")


def _tier_report(store, budget: int | None) -> dict | None:
    if budget is None:
        return None
    return {"budget_bytes": budget, "resident_bytes": int(store.resident_bytes), "disk_bytes": int(store.disk_bytes)}


class OneSystem:
    """Whole steps on one system (the single-system run).

    Parameters
    ----------
    runtime : Runtime
    memoryx : MemoryX
        Weights and optimizer state (possibly over a :class:`~wse.host.memoryx.TieredStore`).
    executable : Executable
        For the SwarmX link figures of one system fed by MemoryX.
    budget : int, optional
        The MemoryX budget in bytes (with a tiered store).
    """

    systems, rank, root, transport = 1, 0, True, None

    def __init__(self, runtime, memoryx: MemoryX, executable, *, budget: int | None = None):
        self.runtime, self.memoryx, self.budget = runtime, memoryx, budget
        self.resident = bool(getattr(runtime, "resident", False))
        self.links, self.swarmx = (None, None) if self.resident else (_swarmx_cycles(executable, 1) or (None, None))
        self._unsynced = 0          # resident: steps taken on the fabric since MemoryX was last refreshed
        if self.resident:
            mx = memoryx
            buffers = {name: mx.optimizer_state(name)["momentum_buffer"] for name in mx.names()
                       if "momentum_buffer" in mx.optimizer_state(name)}
            runtime.write_state({name: mx.weight(name) for name in mx.names()}, buffers, steps=mx.step_count)

    def _sync(self) -> None:
        """Resident: copy the parameters and momentum buffers back from the fabric into MemoryX."""
        if not self.resident or not self._unsynced:
            return
        params, buffers = self.runtime.read_state()
        mx = self.memoryx
        mx.load_state_dict(params)
        for name, value in buffers.items():
            mx.set_optimizer_state(name, "momentum_buffer", value)
        mx.step_count += self._unsynced
        self._unsynced = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> StepReport:
        """Train on the batch and apply the optimizer step."""
        mx = self.memoryx
        if self.resident:           # the update runs on the PEs
            result = self.runtime.train_step(x, y)
            self._unsynced += 1
            return StepReport(float(result.loss), int(result.correct), int(result.cycles),
                              float(result.fmac_utilization), {k: int(v) for k, v in dict(result.phases).items()})
        weights = dict(mx.stream_weights()) if self.budget is not None else \
            {name: mx.weight(name) for name in mx.names()}
        result = self.runtime.train_step(x, y, weights)
        mx.hint("prefetch", mx.names())
        try:
            mx.apply_gradients(result.grads)
        finally:
            mx.hint("release", mx.names())
        return StepReport(float(result.loss), int(result.correct), int(result.cycles),
                          float(result.fmac_utilization), {k: int(v) for k, v in dict(result.phases).items()})

    def weights(self) -> dict[str, np.ndarray]:
        """The whole weights, for evaluation."""
        self._sync()
        return {name: self.memoryx.weight(name) for name in self.memoryx.names()}

    def save(self, write: Callable[[MemoryX], Path]) -> Path:
        """``write(memoryx)``: a checkpoint of the whole MemoryX."""
        self._sync()
        return write(self.memoryx)

    def memoryx_report(self) -> dict | None:
        """RAM and disk bytes of MemoryX under a budget (None without one)."""
        return _tier_report(self.memoryx.store, self.budget)


class SwarmSystem:
    """One system of a data-parallel run: its runtime, its MemoryX shard, the group.

    Parameters
    ----------
    group : Group
        The systems (this one is ``group.rank``).
    runtime : Runtime
        This system's fabric (a backend with ``train_shard``).
    memoryx : ShardedMemoryX
        This system's MemoryX shard.
    executable : Executable
        The single system's program: its token columns are dealt to the systems.
    transport : str
        ``"inprocess"`` or ``"gloo"``, for reports.
    budget : int, optional
        The MemoryX budget per shard in bytes; checkpoints are then gathered
        into a tiered store under ``scratch`` too.
    scratch : Path, optional
        This system's disk-tier folder.
    """

    def __init__(self, group, runtime, memoryx: ShardedMemoryX, executable, *, transport: str,
                 budget: int | None = None, scratch: Path | None = None):
        self.group, self.runtime, self.memoryx = group, runtime, memoryx
        self.systems, self.rank, self.root, self.transport = group.size, group.rank, group.rank == 0, transport
        self.budget, self.scratch = budget, scratch
        self.links, self.swarmx = _swarmx_cycles(executable, group.size)
        self.trainer = DataParallel(group, runtime, memoryx, token_blocks(executable), links=self.links)
        self.utilization = runtime.fmac_utilization()
        self.phases = {name: int(executable.phases[name].cycles) for name in executable.sequences["train"]}

    def step(self, x: np.ndarray, y: np.ndarray) -> StepReport:
        """This system's part of a data-parallel step on the global batch ``(x, y)``; a collective."""
        try:
            result = self.trainer.step(x, y)
        except NonFiniteGradientError as exc:       # raised on every system alike: system 0 reports it
            exc.echo = not self.root
            raise
        return StepReport(result.loss, result.correct, result.compute_cycles, self.utilization, dict(self.phases))

    def weights(self) -> dict[str, np.ndarray] | None:
        """The whole weights on system 0 (None elsewhere); a collective."""
        weights = {name: self.memoryx.weight(name, dst=0) for name in self.memoryx.names()}
        return weights if self.root else None

    def save(self, write: Callable[[MemoryX], Path]) -> Path | None:
        """Gather the whole MemoryX to system 0, which calls ``write(memoryx)``; a collective."""
        store, folder = None, None
        if self.root and self.budget is not None:
            folder = self.scratch.with_name(self.scratch.name + "-checkpoint")
            shutil.rmtree(folder, ignore_errors=True)
            store = TieredStore(self.budget, folder)
        try:
            whole = self.memoryx.gather(0, store=store)
            return write(whole) if self.root else None
        finally:
            if store is not None:
                store.close()
                shutil.rmtree(folder, ignore_errors=True)

    def memoryx_report(self) -> dict | None:
        """RAM and disk bytes of this system's MemoryX shard under a budget (None without one)."""
        return _tier_report(self.memoryx.local.store, self.budget)


def describe_launch(engine: Engine) -> str:
    """``"2 systems (gloo)"``, ``"4 systems (in-process)"`` or ``"1 system"``, for messages."""
    if engine.systems == 1:
        return "1 system"
    return f"{engine.systems} systems ({'in-process' if engine.transport == 'inprocess' else engine.transport})"
