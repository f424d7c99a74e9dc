"""MemoryX: weights and optimizer state held off the wafer.

:class:`MemoryX` keeps named float32 tensors, streams them out in a fixed
order, applies optimizer steps from streamed gradients with PyTorch's exact
semantics (SGD, Adam, AdamW via ``torch.optim``) and checkpoints atomically.
Tensors live behind the small :class:`TensorStore` interface so a sharded or
memory-mapped store can replace the in-memory one: :class:`TieredStore` keeps
tensors beyond a RAM budget in memory-mapped files, and :class:`ShardedMemoryX`
spreads every tensor over the systems of a SwarmX group.
"""

from .checkpoint import read_checkpoint, write_checkpoint
from .memoryx import NONFINITE_POLICIES, MemoryX, NonFiniteGradientError
from .optim import OPTIMIZERS, OptimizerConfig, state_slots
from .sharded import ShardedMemoryX, ShardMap
from .store import InMemoryStore, TensorStore
from .tiered import TIERS, TieredStore, parse_size, planned_disk_bytes

__all__ = [
    "MemoryX", "NonFiniteGradientError", "NONFINITE_POLICIES",
    "OptimizerConfig", "OPTIMIZERS", "state_slots",
    "TensorStore", "InMemoryStore", "TieredStore", "TIERS", "parse_size", "planned_disk_bytes",
    "ShardedMemoryX", "ShardMap",
    "read_checkpoint", "write_checkpoint",
]
