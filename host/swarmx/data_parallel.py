"""Data-parallel weight-streaming training over the systems of a SwarmX group.

One step of a global batch on N systems (``docs/swarmx.md``):

1. the global batch's token blocks (the single system's columns, from the
   executable's layout) are dealt to the systems in contiguous runs of
   columns (:func:`column_shards`); every system reads the same global batch
   and keeps its tokens;
2. every tensor is broadcast from the MemoryX shards to every system
   (:meth:`~wse.host.memoryx.ShardedMemoryX.all_weights`: each shard sends its
   slices of every tensor, read in streaming order, in one message);
3. each system runs its tokens through the hook :meth:`System.train_shard`,
   which returns one partial weight-gradient sum per column, exactly the
   values the single system's gradient row chain would add, with every loss
   delta scaled by ``1/n`` of the *global* batch;
4. the partial sums are reduced straight to the MemoryX shard that owns each
   slice, one reduction per shard holding its slices of every tensor side by
   side (reverse streaming order: gradients leave the wafer last layer
   first), in the fixed ``"chain"`` order: ``+0``, then column 0, column 1,
   ... of system 0, then those of system 1, and so on, which is the single
   system's row chain, so the gradient is the single system's bit for bit
   (packing tensors side by side changes no element's sum);
5. the shards step their slices; system 0 gathers the logits and computes
   the loss and the count of correct predictions, which every system returns.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Protocol, Sequence

import numpy as np

from wse.config import UsageError
from wse.firmware.kernels.common import block_partition
from wse.host.runtime.loss import mean_cross_entropy
from wse.host.runtime.shard import ShardResult

from .links import LinkModel, PhaseTraffic

# ShardResult (the hook's result) and mean_cross_entropy (the host's loss) belong to the runtime layer;
# they are re-exported here for SwarmX's callers.
__all__ = ["ShardResult", "System", "DataParallel", "DataParallelResult", "column_shards", "token_blocks",
           "phase_traffic", "mean_cross_entropy"]


class System(Protocol):
    """The runtime hook SwarmX drives (implemented by ``wse.host.runtime.Runtime``).

    ``train_shard(x, y, weights, *, n, columns) -> ShardResult``:

    - ``x``: float32 ``[m, *input_shape]``, the real samples among the
      tokens of global-batch columns ``columns`` (``m`` may be 0);
    - ``y``: int64 ``[m]`` labels;
    - ``weights``: float32 whole weights by PyTorch name;
    - ``n``: real samples of the whole global batch; every real sample's loss
      delta is scaled by ``float32(1) / float32(n)``, padding's by 0;
    - ``columns``: a ``range`` of the single system's columns (token blocks).

    Contract: for the whole batch (``columns = range(C)``, ``n = len(x)``),
    :func:`~wse.host.swarmx.fold_partials` of ``grad_partials[name]`` equals
    ``train_step(x, y, weights).grads[name]`` bit for bit, and the logits
    equal ``train_step``'s rows.
    """

    def train_shard(self, x: np.ndarray, y: np.ndarray, weights: Mapping[str, np.ndarray], *, n: int,
                    columns: range) -> ShardResult: ...


def column_shards(columns: int, systems: int) -> list[range]:
    """The single system's ``columns`` dealt to ``systems`` in contiguous runs, in order.

    System ``r`` gets run ``r`` of :func:`~wse.firmware.kernels.common.block_partition`:
    the first ``columns mod systems`` systems one column more, and systems
    beyond ``columns`` none (they still take part in every collective).
    """
    return block_partition(columns, systems)


def token_blocks(executable) -> list[range]:
    """The token block of each column of a compiled executable (``executable.layout.token_blocks()``)."""
    return list(executable.layout.token_blocks())


def phase_traffic(executable, sequence: str = "train") -> list[PhaseTraffic]:
    """The phases of a compiled executable's ``sequence`` with the tensors each streams in or out.

    A phase's ``broadcast_bytes`` are the float32 bytes of the tensors its
    weight streams carry (``streams_in``), its ``reduce_bytes`` those of the
    gradients it streams out (``streams_out``); ``cycles`` are the phase's
    fabric cycles from the executable's static cycle model.
    """
    shapes = executable.parameters()

    def nbytes(streams) -> int:
        names = {name for stream in streams for name in stream.tensors}
        return sum(4 * int(np.prod(shapes[name], dtype=np.int64)) for name in names)

    return [PhaseTraffic(name, int(phase.cycles), nbytes(phase.streams_in), nbytes(phase.streams_out))
            for name, phase in ((name, executable.phases[name]) for name in executable.sequences[sequence])]


@dataclasses.dataclass
class DataParallelResult:
    """One data-parallel step, the same on every system (``logits`` on system 0 only).

    Members
    -------
    loss : float
        :func:`~wse.host.runtime.loss.mean_cross_entropy` of the whole global batch (as a single
        system's ``Runtime.train_step`` computes it).
    correct : int
        Real samples whose first maximal logit is the label.
    logits : float32 ``[n, classes]`` or None
        The global batch's logits on system 0; None on the others.
    compute_cycles : int
        The slowest system's cycles.
    swarmx_cycles : int
        :meth:`LinkModel.step_cycles` of the weights over the group.
    cycles : int
        ``compute_cycles + swarmx_cycles`` (no overlap assumed).
    applied : bool
        Whether MemoryX applied the step (False: skipped for a non-finite gradient).
    """

    loss: float
    correct: int
    logits: np.ndarray | None
    compute_cycles: int
    swarmx_cycles: int
    cycles: int
    applied: bool


class DataParallel:
    """One system's part of data-parallel training: ``step(x, y)`` on every system of the group.

    Parameters
    ----------
    group : Group
        The systems.
    system : System
        This system's runtime (the :class:`System` hook).
    memoryx : ShardedMemoryX
        This system's MemoryX shard (over the same group).
    blocks : sequence of range
        The single system's token block per column (:func:`token_blocks`):
        contiguous, in order, from token 0.
    links : LinkModel, optional
        For :attr:`DataParallelResult.swarmx_cycles`; the defaults otherwise.

    Raises
    ------
    UsageError
        For blocks that do not tile ``0 .. batch-1`` in order, or a MemoryX
        over another group.
    """

    def __init__(self, group, system: System, memoryx, blocks: Sequence[range], *, links: LinkModel | None = None):
        blocks = [range(b.start, b.stop) for b in blocks]
        if not blocks or blocks[0].start != 0 or any(a.stop != b.start for a, b in zip(blocks, blocks[1:])) \
                or any(len(b) == 0 for b in blocks):
            raise UsageError(f"blocks must be non-empty token ranges that follow each other from token 0, "
                             f"not {blocks}")
        if memoryx.group is not group:
            raise UsageError("memoryx must be sharded over the same SwarmX group as the data-parallel step")
        self.group, self.system, self.memoryx = group, system, memoryx
        self.blocks = blocks
        self.batch = blocks[-1].stop
        self.links = links or LinkModel()
        self.shards = column_shards(len(blocks), group.size)
        self.columns = self.shards[group.rank]
        self.tokens = range(blocks[self.columns.start].start, blocks[self.columns.stop - 1].stop) \
            if len(self.columns) else range(self.batch, self.batch)

    def _tokens_of(self, rank: int, n: int) -> range:
        cols = self.shards[rank]
        if not len(cols):
            return range(0)
        return range(self.blocks[cols.start].start, min(self.blocks[cols.stop - 1].stop, n))

    def step(self, x: np.ndarray, y: np.ndarray) -> DataParallelResult:
        """Train on the global batch ``(x, y)`` (the same arrays on every system); a collective.

        Raises
        ------
        UsageError
            For a batch of the wrong size or dtype, or a system result that
            breaks the :class:`System` contract.
        """
        x, y = np.asarray(x), np.asarray(y)
        n = len(x)
        if x.dtype != np.float32 or y.dtype != np.int64 or y.shape != (n,) or not 1 <= n <= self.batch:
            raise UsageError(f"the global batch must be float32 x and int64 y of 1 to {self.batch} samples, not "
                             f"{x.dtype} {list(x.shape)} and {y.dtype} {list(y.shape)}")
        group, memoryx = self.group, self.memoryx
        weights = memoryx.all_weights()
        mine = self._tokens_of(group.rank, n)
        names = memoryx.names()
        if len(self.columns):
            result = self.system.train_shard(x[mine.start:mine.stop], y[mine.start:mine.stop], weights, n=n,
                                             columns=self.columns)
            partials, logits, cycles = result.grad_partials, np.asarray(result.logits), int(result.cycles)
            if set(partials) != set(names):
                raise UsageError(f"the system returned gradient partial sums for {sorted(partials)}, "
                                 f"expected {sorted(names)}")
        else:
            partials = {name: np.zeros((0, *memoryx.shape(name)), np.float32) for name in names}
            logits, cycles = None, 0
        flats = {}
        for name in reversed(names):
            stack = np.asarray(partials[name])
            expected = (len(self.columns), *memoryx.shape(name))
            if stack.dtype != np.float32 or stack.shape != expected:
                raise UsageError(f"gradient partial sums of {name!r} must be float32 {list(expected)}, "
                                 f"not {stack.dtype} {list(stack.shape)}")
            flats[name] = stack.reshape(len(self.columns), int(np.prod(expected[1:], dtype=np.int64)))
        # One reduction per MemoryX shard: its slices of every tensor, in reverse streaming order, side by side.
        # Each element's sum is still the chain over the same partial sums, so packing changes no bit.
        packed = None
        works = []
        for owner in range(group.size):
            spans = [(name, memoryx.shard_map.range(name, owner)) for name in flats]
            part = np.concatenate([flats[name][:, span.start:span.stop] for name, span in spans], axis=1)
            out = None
            if owner == group.rank:
                packed = out = np.empty(part.shape[1], np.float32)
            works.append(group.reduce_partials(part, owner, out=out, async_op=True))
        for work in works:
            work.wait()
        grads, offset = {}, 0
        for name in flats:
            size = len(memoryx.local_range(name))
            grads[name] = packed[offset:offset + size]
            offset += size
        applied = memoryx.apply_gradients(grads)
        return self._summary(n, y, logits, cycles, applied)

    def _summary(self, n: int, y: np.ndarray, logits, cycles: int, applied: bool) -> DataParallelResult:
        group, root = self.group, self.group.rank == 0
        counts = [len(self._tokens_of(r, n)) for r in range(group.size)]
        mine = np.zeros((0, 0), np.float32) if logits is None else np.ascontiguousarray(logits, np.float32)
        if mine.ndim != 2 or mine.shape[0] != counts[group.rank]:
            raise UsageError(f"the system returned logits of shape {list(mine.shape)}, expected "
                             f"[{counts[group.rank]}, classes]")
        headers = [np.zeros(2, np.int64) for _ in counts] if root else None
        group.gather(np.array([cycles, mine.shape[1]], np.int64), headers, 0)
        classes = mine.shape[1]                        # system 0 always holds token 0
        if root and any(int(h[1]) != classes for h, c in zip(headers, counts) if c):
            raise UsageError(f"the systems returned logits of {sorted({int(h[1]) for h in headers})} classes; "
                             "they must agree")
        parts = [np.empty((c, classes), np.float32) for c in counts] if root else None
        group.gather(mine, parts, 0)
        summary = np.zeros(3, np.float64)
        everything = None
        if root:
            everything = np.concatenate(parts)
            summary[:] = (mean_cross_entropy(everything, y),
                          np.count_nonzero(np.argmax(everything, axis=1) == y),
                          max(int(h[0]) for h in headers))
        group.broadcast(summary, 0)
        compute = int(summary[2])
        sizes = [4 * int(np.prod(self.memoryx.shape(name), dtype=np.int64)) for name in self.memoryx.names()]
        swarmx = self.links.step_cycles(sizes, group.size, group.reduce_order)
        return DataParallelResult(loss=float(summary[0]), correct=int(summary[1]), logits=everything,
                                  compute_cycles=compute, swarmx_cycles=swarmx, cycles=compute + swarmx,
                                  applied=applied)
