"""The SwarmX link model: cycles to broadcast or reduce a tensor over N systems.

SwarmX is a tree of nodes between MemoryX and the systems. A tensor of
``B`` bytes travels as ``W = ceil(B / 4)`` wavelets (32 data bits each, the
fabric's wavelet payload). Links are cut-through and pipelined: every link
adds ``hop_latency`` cycles to a wavelet's trip and carries at most
``wavelets_per_cycle`` wavelets per cycle; reduction nodes add at link rate.
A transfer therefore takes::

    cycles = links * hop_latency + ceil(W / wavelets_per_cycle)

where ``links`` is the longest path, counted in links:

- broadcast (MemoryX to every system), and a reduction in ``"tree"`` order:
  ``1 + ceil(log_fanout N)`` (a tree of ``ceil(log_fanout N)`` levels of
  nodes; one system is fed directly: 1 link);
- reduction in ``"chain"`` order (the left-deep tree that reproduces one
  system's sums bit for bit): ``N``: system 0's stream passes the ``N - 1``
  adders of systems 1..N-1, then one link to MemoryX.

The chain's extra ``(N - 1 - ceil(log N)) * hop_latency`` cycles do not grow
with the tensor, so they vanish against ``W / wavelets_per_cycle`` for layer
gradients of many wavelets. A weight-streaming step broadcasts every weight
tensor twice (forward, then backward in reverse order) and reduces its
gradient once (:meth:`LinkModel.step_cycles`). Sharding MemoryX does not
change these numbers: every system still receives, and sends, whole tensors.

Overlap (:meth:`LinkModel.streamed_step`). Weights stream into the fabric
while it computes with them, and gradients stream out while it computes them
(the training timing of weight streaming: the incoming stream keeps the fabric
busy). A phase of a step therefore lasts ``max(fabric cycles, transfer
cycles at link rate)``, plus the latency its transfer exposes:

- a phase fed by a broadcast waits for the first wavelet: ``links * hop_latency``
  of the broadcast tree (the fabric has no buffer to take weights early);
- a reduction's latency overlaps the phases after it (links are full duplex:
  gradients go up while the next weights come down), except the step's last
  reduction, which MemoryX needs before the next step's first broadcast.

MemoryX's optimizer update is not modelled (its shards update elementwise in
parallel with the streams). Without overlap (:meth:`LinkModel.step_cycles`,
:attr:`StepCycles.serial`) every transfer is added to the fabric's cycles.

The defaults (:data:`DEFAULT_WAVELETS_PER_CYCLE`, :data:`DEFAULT_HOP_LATENCY`)
are this project's choice, documented in ``docs/swarmx.md``;
:meth:`LinkModel.for_fabric` matches a link to a fabric's weight intake (one
wavelet per cycle per mesh row).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Sequence

from wse.config import DATA_BITS, FabricConfig, UsageError

__all__ = ["LinkModel", "PhaseTraffic", "StepCycles", "DEFAULT_WAVELETS_PER_CYCLE", "DEFAULT_HOP_LATENCY",
           "WAVELET_BYTES"]

#: Payload bytes of one wavelet.
WAVELET_BYTES = DATA_BITS // 8
#: Default link bandwidth: the intake of the default 4-row mesh, one wavelet per row per cycle.
DEFAULT_WAVELETS_PER_CYCLE = 4.0
#: Default cycles a link (with the node at its end) adds to a wavelet's trip.
DEFAULT_HOP_LATENCY = 100


def _count(value, name: str, low: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise UsageError(f"{name} must be an integer >= {low}, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class PhaseTraffic:
    """One phase of a training step as SwarmX sees it.

    Members
    -------
    name : str
        The phase (e.g. ``"fwd fc1"``).
    cycles : int
        Fabric cycles of the phase on one system.
    broadcast_bytes : int
        Bytes of the weights the phase streams in from MemoryX.
    reduce_bytes : int
        Bytes of the gradients the phase streams out to MemoryX.
    """

    name: str
    cycles: int
    broadcast_bytes: int = 0
    reduce_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class StepCycles:
    """SwarmX's share of one training step on ``systems`` systems (:meth:`LinkModel.streamed_step`).

    Members
    -------
    systems : int
        Systems in the group.
    compute : int
        Fabric cycles of one system's step (the sum of the phases' cycles).
    broadcast : int
        Cycles of the step's broadcasts, one after another (:meth:`LinkModel.broadcast_cycles` per phase).
    reduce : int
        Cycles of the step's reductions, one after another (:meth:`LinkModel.reduce_cycles` per phase).
    serial : int
        ``compute + broadcast + reduce``: the step without overlap.
    overlapped : int
        The step with streams overlapping the fabric's work (module docstring).
    """

    systems: int
    compute: int
    broadcast: int
    reduce: int
    serial: int
    overlapped: int

    @property
    def exposed(self) -> int:
        """Communication cycles the overlapped step does not hide: ``overlapped - compute``."""
        return self.overlapped - self.compute

    def to_dict(self) -> dict:
        """JSON-ready form, with :attr:`exposed`."""
        return {**dataclasses.asdict(self), "exposed": self.exposed}


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """Bandwidth and latency of SwarmX links (see the module docstring for the formulas).

    Parameters
    ----------
    wavelets_per_cycle : float
        Wavelets a link carries per cycle, each way (> 0).
    hop_latency : int
        Cycles each link (and the node it leads into) adds (>= 0).
    fanout : int
        Children per node of the broadcast tree and of the ``"tree"`` reduction (>= 2).
    """

    wavelets_per_cycle: float = DEFAULT_WAVELETS_PER_CYCLE
    hop_latency: int = DEFAULT_HOP_LATENCY
    fanout: int = 2

    def __post_init__(self):
        bw = self.wavelets_per_cycle
        if isinstance(bw, bool) or not isinstance(bw, (int, float)) or not math.isfinite(bw) or bw <= 0:
            raise UsageError(f"wavelets_per_cycle must be a positive number, not {bw!r}")
        _count(self.hop_latency, "hop_latency", 0)
        _count(self.fanout, "fanout", 2)

    @classmethod
    def for_fabric(cls, config: FabricConfig, hop_latency: int = DEFAULT_HOP_LATENCY) -> "LinkModel":
        """Links as fast as the fabric's weight intake: ``config.height`` wavelets per cycle."""
        return cls(float(config.height), hop_latency)

    def wavelets(self, nbytes: int) -> int:
        """Wavelets that carry ``nbytes`` bytes."""
        return -(-_count(nbytes, "nbytes", 0) // WAVELET_BYTES)

    def links(self, systems: int, order: str = "tree") -> int:
        """Links on the longest path: ``"tree"`` (broadcast, balanced reduction) or ``"chain"``."""
        systems = _count(systems, "systems", 1)
        if order == "chain":
            return systems
        if order != "tree":
            raise UsageError(f"order must be 'chain' or 'tree', not {order!r}")
        levels, reach = 0, 1
        while reach < systems:
            levels, reach = levels + 1, reach * self.fanout
        return 1 + levels

    def _transfer(self, nbytes: int, links: int) -> int:
        return links * self.hop_latency + math.ceil(self.wavelets(nbytes) / self.wavelets_per_cycle)

    def broadcast_cycles(self, nbytes: int, systems: int) -> int:
        """Cycles until every one of ``systems`` holds a tensor of ``nbytes`` bytes from MemoryX."""
        return self._transfer(nbytes, self.links(systems, "tree"))

    def reduce_cycles(self, nbytes: int, systems: int, order: str = "chain") -> int:
        """Cycles until MemoryX holds the sum of ``systems`` tensors of ``nbytes`` bytes each."""
        return self._transfer(nbytes, self.links(systems, order))

    def step_cycles(self, tensor_bytes: Iterable[int], systems: int, order: str = "chain") -> int:
        """SwarmX cycles of one weight-streaming step, without overlap: for each tensor
        two broadcasts (forward and backward pass) and one reduction of its gradient."""
        return sum(2 * self.broadcast_cycles(b, systems) + self.reduce_cycles(b, systems, order)
                   for b in tensor_bytes)

    def latency(self, systems: int, order: str = "tree") -> int:
        """Cycles a wavelet takes along the longest path (``links * hop_latency``)."""
        return self.links(systems, order) * self.hop_latency

    def stream_cycles(self, nbytes: int) -> int:
        """Cycles a link needs to carry ``nbytes`` bytes, latency aside: ``ceil(W / wavelets_per_cycle)``."""
        return math.ceil(self.wavelets(nbytes) / self.wavelets_per_cycle)

    def streamed_step(self, phases: Sequence[PhaseTraffic], systems: int, order: str = "chain") -> StepCycles:
        """SwarmX and fabric cycles of a step made of ``phases`` (in execution order) on ``systems`` systems.

        See the module docstring for the overlap model. Phases without
        traffic (e.g. the loss) add their fabric cycles only.
        """
        systems = _count(systems, "systems", 1)
        compute = broadcast = reduce = overlapped = 0
        pending = 0          # latency of the last reduction not yet hidden by the phases after it
        for phase in phases:
            cycles = _count(int(phase.cycles), "phase cycles", 0)
            into, out = int(phase.broadcast_bytes), int(phase.reduce_bytes)
            compute += cycles
            span = cycles
            if into:
                broadcast += self.broadcast_cycles(into, systems)
                span = max(span, self.stream_cycles(into)) + self.latency(systems, "tree")
            if out:
                reduce += self.reduce_cycles(out, systems, order)
                span = max(span, self.stream_cycles(out))
            overlapped += span
            pending = self.latency(systems, order) if out else max(0, pending - span)
        return StepCycles(systems, compute, broadcast, reduce, compute + broadcast + reduce, overlapped + pending)
