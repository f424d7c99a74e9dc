"""SwarmX: data-parallel training across several systems.

Every layer's weights are broadcast from MemoryX to every system, each system
computes on its share of the global batch, and the gradients are summed on
the way back, in a fixed order that makes N systems give one system's bits
(``docs/swarmx.md``). The user changes one number, the number of systems.

- :class:`Group`: collectives shaped like ``torch.distributed``
  (``broadcast``, ``reduce``, ``reduce_partials``, ``all_reduce``,
  ``gather``, ``barrier``; ``async_op=True`` gives a :class:`Work` handle)
  over two transports: N in-process systems (:func:`run_inprocess`) or one
  process per system with gloo under ``torchrun`` (:func:`init_gloo`).
- :class:`DataParallel`: one system's part of a data-parallel step, driving
  the runtime hook :class:`System` (``train_shard``) and a
  :class:`~wse.host.memoryx.ShardedMemoryX`.
- :class:`LinkModel`: cycles of SwarmX broadcasts and reductions, and of a
  whole step with streams overlapping the fabric's work
  (:meth:`LinkModel.streamed_step` over :func:`phase_traffic`).
- :class:`ReferenceSystem`: a pure-numpy system in the fabric's order, for
  tests and ``python -m wse.host.swarmx``.
"""

from .data_parallel import (DataParallel, DataParallelResult, ShardResult, System, column_shards,
                            mean_cross_entropy, phase_traffic, token_blocks)
from .group import REDUCE_ORDERS, Group, Work, fold_partials, init_gloo, run_inprocess
from .links import DEFAULT_HOP_LATENCY, DEFAULT_WAVELETS_PER_CYCLE, LinkModel, PhaseTraffic, StepCycles
from .reference import ReferenceStep, ReferenceSystem
from .transport import DEFAULT_JOIN_TIMEOUT, DEFAULT_TIMEOUT, PeerError

__all__ = [
    "Group", "Work", "REDUCE_ORDERS", "fold_partials", "run_inprocess", "init_gloo",
    "PeerError", "DEFAULT_TIMEOUT", "DEFAULT_JOIN_TIMEOUT",
    "DataParallel", "DataParallelResult", "ShardResult", "System", "column_shards", "token_blocks",
    "phase_traffic", "mean_cross_entropy",
    "LinkModel", "PhaseTraffic", "StepCycles", "DEFAULT_WAVELETS_PER_CYCLE", "DEFAULT_HOP_LATENCY",
    "ReferenceSystem", "ReferenceStep",
]
