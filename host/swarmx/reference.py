"""A pure-numpy reference system for SwarmX: a small MLP in the fabric's order of operations.

:class:`ReferenceSystem` plays one system of a data-parallel job without a
fabric. Like the weight-streaming fabric it keeps a batch's tokens in column
blocks (:func:`~wse.firmware.kernels.common.block_partition` of the batch
over ``min(columns, batch)`` columns), computes every token independently
of the others (sums over features one by one with the fabric's binary32
add and multiply), takes the loss delta from the firmware's softmax
(:func:`wse.firmware.training.numerics.softmax_delta`) and sums weight
gradients in the fabric's order: per column ``G_j = +0 + g(t) + ...`` over
its tokens in order, then the row chain ``+0 + G_0 + G_1 + ...``.

It implements both the single-system step (:meth:`ReferenceSystem.train_step`)
and the SwarmX hook (:meth:`ReferenceSystem.train_shard`), so tests can
check that N systems give the single system's bits, and ``python -m
wse.host.swarmx`` can train it on any transport. Its cycle count is a toy, not
a fabric model: three passes of every weight over the system's tokens spread
evenly over its ``columns``.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from wse.config import UsageError
from wse.firmware.kernels.common import block_partition
from wse.firmware.training import numerics as fw_numerics
from wse import numerics as fp
from wse.host.runtime.loss import mean_cross_entropy
from wse.host.runtime.shard import ShardResult

__all__ = ["ReferenceSystem", "ReferenceStep"]

_ZERO = np.uint32(0)


@dataclasses.dataclass
class ReferenceStep:
    """The single-system step: like ``wse.host.runtime.StepResult`` (loss, correct, logits, grads, cycles)."""
    loss: float
    correct: int
    logits: np.ndarray
    grads: dict
    cycles: int


class ReferenceSystem:
    """An MLP ``sizes[0] -> ... -> sizes[-1]`` (ReLU between layers) on ``columns`` token columns.

    Parameters
    ----------
    sizes : sequence of int
        Features of the input, the hidden layers and the classes (at least two entries).
    batch : int
        Tokens of a (global) batch.
    columns : int
        Mesh columns; the batch is split into ``min(columns, batch)`` token blocks.

    Members
    -------
    blocks : list of range
        The token block of each column of the single system's layout.
    """

    def __init__(self, sizes: Sequence[int] = (8, 6, 4), batch: int = 12, columns: int = 4):
        sizes = list(sizes)
        if len(sizes) < 2 or any(not isinstance(s, int) or s < 1 for s in sizes):
            raise UsageError(f"sizes must be at least two positive integers, not {sizes!r}")
        for name, value in (("batch", batch), ("columns", columns)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UsageError(f"{name} must be a positive integer, not {value!r}")
        self.sizes, self.batch, self.columns = sizes, batch, columns
        self.blocks = block_partition(batch, min(columns, batch))

    def parameters(self) -> dict[str, tuple[int, ...]]:
        """Parameter names and shapes in streaming order (``fc0.weight [o, k]``, ``fc0.bias [o]``, ...)."""
        shapes = {}
        for i, (k, o) in enumerate(zip(self.sizes, self.sizes[1:])):
            shapes[f"fc{i}.weight"] = (o, k)
            shapes[f"fc{i}.bias"] = (o,)
        return shapes

    def init_weights(self, seed: int = 0) -> dict[str, np.ndarray]:
        """Seeded float32 weights (uniform in ``+-1/sqrt(k)``, as ``torch.nn.Linear``'s range)."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.parameters().items():
            fan_in = self.sizes[int(name[2:name.index(".")])]
            out[name] = rng.uniform(-1, 1, shape).astype(np.float32) / np.float32(np.sqrt(fan_in))
        return out

    # ------------------------------------------------------------------ passes
    def _run(self, x: np.ndarray, y: np.ndarray, weights: Mapping[str, np.ndarray], tokens: int, n: int,
             blocks: Sequence[range]):
        """Logits of the real tokens and, per parameter, the stack of column partial sums (bits)."""
        m, layers = len(x), len(self.sizes) - 1
        act = np.zeros((self.sizes[0], tokens), np.uint32)
        act[:, :m] = fp.as_bits(np.asarray(x, np.float32).reshape(m, self.sizes[0]).T)
        acts, outs = [act], []
        for i in range(layers):
            w, b = fp.as_bits(weights[f"fc{i}.weight"]), fp.as_bits(weights[f"fc{i}.bias"])
            acc = np.zeros((w.shape[0], tokens), np.uint32)
            for k in range(w.shape[1]):                         # features one by one, every token alike
                acc = fp.vmac(acc, w[:, k, None], acts[-1][None, k, :])
            z = fp.vadd(acc, b[:, None])
            outs.append(z)
            if i < layers - 1:
                acts.append(fp.vmax(z, np.zeros_like(z)))
        classes = self.sizes[-1]
        onehot = np.zeros((classes, tokens), np.float32)
        onehot[y, np.arange(m)] = 1.0
        scale = np.zeros(tokens, np.float32)
        scale[:m] = np.float32(1.0) / np.float32(n)
        delta = fw_numerics.softmax_delta(outs[-1], fp.as_bits(onehot), fp.as_bits(scale))
        partials = {}
        for i in reversed(range(layers)):
            a = acts[i]
            gw = np.zeros((len(blocks), *fp.as_bits(weights[f"fc{i}.weight"]).shape), np.uint32)
            gb = np.zeros((len(blocks), delta.shape[0]), np.uint32)
            for j, block in enumerate(blocks):
                for t in block:                                  # the column's tokens in order, from +0
                    gw[j] = fp.vmac(gw[j], delta[:, t, None], a[None, :, t])
                    gb[j] = fp.vadd(gb[j], delta[:, t])
            partials[f"fc{i}.weight"], partials[f"fc{i}.bias"] = gw, gb
            if i:
                w = fp.as_bits(weights[f"fc{i}.weight"])
                back = np.zeros((w.shape[1], tokens), np.uint32)
                for o in range(w.shape[0]):
                    back = fp.vmac(back, w[o, :, None], delta[None, o, :])
                delta = np.where(fp.as_float(outs[i - 1]) > 0, back, _ZERO).astype(np.uint32)
        logits = fp.as_float(outs[-1][:, :m].T.copy())
        return logits, partials

    def _cycles(self, blocks: Sequence[range]) -> int:
        per_column = -(-sum(len(b) for b in blocks) // self.columns)    # the tokens spread over every column
        return 3 * sum(int(np.prod(s)) for s in self.parameters().values()) * per_column

    def _check(self, x, y, counts: range) -> tuple[np.ndarray, np.ndarray]:
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != self.sizes[0] or len(x) not in counts:
            raise UsageError(f"x must be float32 [m, {self.sizes[0]}] with m in {counts.start}..{counts.stop - 1}, "
                             f"not {x.dtype} {list(x.shape)}")
        if y.dtype != np.int64 or y.shape != (len(x),) or (len(y) and not 0 <= y.min() <= y.max() < self.sizes[-1]):
            raise UsageError(f"y must be int64 [{len(x)}] labels in 0..{self.sizes[-1] - 1}")
        return x, y

    def train_step(self, x: np.ndarray, y: np.ndarray, weights: Mapping[str, np.ndarray]) -> ReferenceStep:
        """One system's step on the batch (``1 <= len(x) <= batch``; the rest is padding)."""
        x, y = self._check(x, y, range(1, self.batch + 1))
        logits, partials = self._run(x, y, weights, self.batch, len(x), self.blocks)
        grads = {}
        for name, stack in partials.items():
            total = fp.vadd(np.zeros_like(stack[0]), stack[0])   # the row chain: +0 + G_0 + G_1 + ...
            for part in stack[1:]:
                total = fp.vadd(total, part)
            grads[name] = fp.as_float(total).copy()
        correct = int(np.count_nonzero(np.argmax(logits, axis=1) == y))
        return ReferenceStep(mean_cross_entropy(logits, y), correct, logits, grads, self._cycles(self.blocks))

    def train_shard(self, x: np.ndarray, y: np.ndarray, weights: Mapping[str, np.ndarray], *, n: int,
                    columns: range) -> ShardResult:
        """The SwarmX hook (:class:`~wse.host.swarmx.System`): column partial sums of ``columns``."""
        if not isinstance(columns, range) or columns.step != 1 or not 0 <= columns.start <= columns.stop \
                or columns.stop > len(self.blocks):
            raise UsageError(f"columns must be a range within 0..{len(self.blocks)}, not {columns!r}")
        blocks = self.blocks[columns.start:columns.stop]
        first = blocks[0].start if blocks else 0
        tokens = sum(len(b) for b in blocks)
        if not isinstance(n, int) or not 1 <= n <= self.batch:
            raise UsageError(f"n must be the global batch's sample count in 1..{self.batch}, not {n!r}")
        real = max(0, min(tokens, n - first))       # exactly the real samples among the columns' tokens
        x, y = self._check(x, y, range(real, real + 1))
        local = [range(b.start - first, b.stop - first) for b in blocks]
        logits, partials = self._run(x, y, weights, tokens, n, local)
        return ShardResult(logits, {name: fp.as_float(s).copy() for name, s in partials.items()},
                           self._cycles(blocks))
