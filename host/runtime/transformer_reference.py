"""The functional model of a transformer training step: the captured
:class:`~wse.host.compiler.transformer_ir.TransformerGraph` executed with the
reference operations of :mod:`wse.firmware.training.transformer`, in their
fixed binary32 orders (``docs/transformer.md`` section 3).

This is what the fabric mapping of a transformer has to reproduce bit for
bit; until that mapping exists it is also the way to train a captured model
on the host in the fabric's arithmetic. :class:`TransformerReference` runs
the forward pass, the next-token cross-entropy (loss in float64 on the host,
as :mod:`.loss` computes every loss) and the backward pass, returning the
gradients of every parameter.

Attention written out (``q @ k^T``, one scaling, the causal ``masked_fill``,
``softmax``, ``@ v``) runs as one causal attention operation, the same as
``scaled_dot_product_attention(is_causal=True)``: both forms give the same
bits. A node read by several others receives its gradient as the sum of
their contributions in reverse execution order (the last reader's first,
each later one added to the running sum): for a residual stream
``add(dy, d_branch)``, skip first.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from wse import numerics as fp
from wse.config import UsageError
from wse.firmware.training import transformer as ops
from wse.host.compiler.transformer_ir import (GELU, Add, CausalAttention, CausalMask, Embedding, LayerNorm,
                                              MatMul, Positions, Rearrange, Scale, SequenceCrossEntropy, Softmax,
                                              TNode, TokenLinear, Tokens, TransformerGraph)

from . import transformer_elementwise as te
from . import transformer_kernels as tk
from . import transformer_loss as tl
from .loss import cross_entropy

__all__ = ["TransformerReference", "ReferenceStep", "ShardStep"]


@dataclasses.dataclass(frozen=True)
class ReferenceStep:
    """One training step of the functional model.

    Members
    -------
    loss:
        Mean next-token cross-entropy over every token (float64, host rule).
    logits:
        float32 ``[B, T, vocab]``.
    grads:
        float32 gradient of every parameter, by ``state_dict`` key.
    """

    loss: float
    logits: np.ndarray
    grads: dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class ShardStep:
    """One system's share of a training step (:meth:`TransformerReference.shard`).

    Members
    -------
    losses:
        float64 ``[n]``: each token's next-token cross-entropy (host rule).
    logits:
        float32 ``[b, T, vocab]``.
    partials:
        For every parameter but the embedding tables: float32 ``[k, *shape]``,
        the gradient's partial sum over each of the shard's ``k`` token blocks
        in order, before the chain that joins the blocks.
    rows:
        For every embedding table: ``(dx [n, dim] float32, indices [n], rows)``,
        each token's gradient and the row it looked up, in token order.
    """

    losses: np.ndarray
    logits: np.ndarray
    partials: dict[str, np.ndarray]
    rows: dict[str, tuple[np.ndarray, np.ndarray, int]]


def _patterns(params: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every parameter as binary32 patterns flushed as the fabric reads them (:func:`ops.bits`'s
    values; the flushing copy only where a parameter holds a subnormal)."""
    return {k: tk.flushed(np.asarray(v, dtype=np.float32)) for k, v in params.items()}


class _Partials:
    """Where the backward pass leaves a shard's parameter gradients (see :class:`ShardStep`)."""

    def __init__(self, blocks: Sequence[int]):
        self.blocks = list(blocks)
        self.sums: dict[str, np.ndarray] = {}
        self.rows: dict[str, tuple[np.ndarray, np.ndarray, int]] = {}

    def token_sums(self, name: str, terms: np.ndarray, factor: np.ndarray | None = None) -> None:
        """Each block's ``+0 + terms[t0] + terms[t0+1] + ...`` of ``terms [n, d]`` (each term
        ``mul(terms[t], factor[t])`` if a ``factor`` is given)."""
        self.sums[name] = ops.floats(tk.block_sums(terms, self.blocks, factor))


@dataclasses.dataclass(frozen=True)
class _Attention:
    """Written-out causal attention: scores ``matmul`` (q, k^T), scaling, mask,
    softmax, values ``matmul`` (p, v); runs at the values product."""

    scores: MatMul
    values: MatMul
    scale: float


class TransformerReference:
    """Runs a captured transformer in the fabric's binary32 arithmetic.

    Parameters
    ----------
    graph:
        From :func:`~wse.host.compiler.transformer_capture.capture`, with its loss.
    rows:
        Mesh rows ``H`` that fix the order of the feature sums (streamed GEMM,
        LayerNorm); 1 gives plain sequential sums.
    blocks:
        Tokens per column, in column order, for the token sums of weight
        gradients (``None``: one block of all the batch's tokens).

    Raises
    ------
    UsageError
        If the graph has no loss, or its attention is not in the one supported shape.
    """

    def __init__(self, graph: TransformerGraph, rows: int = 1, blocks: Sequence[int] | None = None) -> None:
        if graph.loss is None:
            raise UsageError(f"graph {graph.name!r} has no loss; capture it with loss='cross_entropy'")
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise UsageError(f"rows must be a positive integer, not {rows!r}")
        self.graph, self.rows = graph, rows
        self.blocks = list(blocks) if blocks is not None else None
        self._readers: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
        for node in graph.nodes:
            for source in node.inputs:
                self._readers[source].append(node.name)
        self._attention = self._fuse_attention()

    # -- planning ----------------------------------------------------------
    def _only_reader(self, name: str, kind: str) -> TNode:
        readers = self._readers[name]
        if len(readers) != 1:
            raise UsageError(f"the {kind} {name!r} is read by {len(readers)} operations; the functional model "
                             f"runs causal attention as one operation, so it must be read once")
        return self.graph.node(readers[0])

    def _fuse_attention(self) -> dict[str, _Attention]:
        groups: dict[str, _Attention] = {}
        for softmax in self.graph.of_kind(Softmax):
            node, scale = self.graph.node(softmax.inputs[0]), 1.0
            if not isinstance(node, CausalMask):
                raise UsageError(f"softmax {softmax.name!r} does not follow a causal mask")
            between = [node.name]
            node = self.graph.node(node.inputs[0])
            while isinstance(node, Scale):
                scale = scale / node.factor if node.divide else scale * node.factor
                between.append(node.name)
                node = self.graph.node(node.inputs[0])
            if not isinstance(node, MatMul) or node.role != "scores" or len(between) > 2:
                raise UsageError(f"softmax {softmax.name!r} must read q @ k^T scaled once and causally masked")
            for name in (node.name, *between):
                self._only_reader(name, "attention intermediate")
            values = self._only_reader(softmax.name, "attention probabilities")
            if not isinstance(values, MatMul) or values.inputs[0] != softmax.name:
                raise UsageError(f"the attention probabilities {softmax.name!r} must be multiplied by v")
            groups[values.name] = _Attention(node, values, scale)
        return groups

    # -- forward -----------------------------------------------------------
    def _forward(self, params: Mapping[str, np.ndarray], tokens: np.ndarray,
                 w: Mapping[str, np.ndarray] | None = None) -> tuple[dict, dict]:
        values: dict[str, np.ndarray] = {}
        saved: dict[str, dict] = {}
        w = _patterns(params) if w is None else w
        batch = tokens.shape[0]
        for node in self.graph.nodes:
            x = values.get(node.inputs[0]) if node.inputs else None
            if isinstance(node, Tokens):
                values[node.name] = np.asarray(tokens)
            elif isinstance(node, Positions):
                values[node.name] = np.arange(node.shape[0])
            elif isinstance(node, Embedding):
                values[node.name] = w[node.weight_name][x]
            elif isinstance(node, Add):
                values[node.name] = ops.residual(x, values[node.inputs[1]])
            elif isinstance(node, LayerNorm):
                y, saved[node.name] = te.layernorm(x.reshape(-1, node.features), w[node.weight_name],
                                                    w[node.bias_name], node.eps, self.rows)
                values[node.name] = y.reshape(x.shape)
            elif isinstance(node, TokenLinear):
                y = tk.linear(x.reshape(-1, node.in_features), w[node.weight_name],
                               w[node.bias_name] if node.bias else None, self.rows)
                values[node.name] = y.reshape(x.shape[:-1] + (node.out_features,))
            elif isinstance(node, GELU):
                values[node.name] = te.gelu(x, node.approximate)
            elif isinstance(node, Rearrange):
                values[node.name] = self._rearrange(node, x, batch)
            elif isinstance(node, (CausalAttention, MatMul)) and (isinstance(node, CausalAttention)
                                                                   or node.name in self._attention):
                values[node.name], saved[node.name] = self._attend(node, values)
            elif not isinstance(node, (MatMul, Scale, CausalMask, Softmax, SequenceCrossEntropy)):
                raise UsageError(f"the functional model cannot run {node.kind} node {node.name!r}")
        return values, saved

    @staticmethod
    def _rearrange(node: Rearrange, x: np.ndarray, batch: int) -> np.ndarray:
        if node.op == "view":
            return x.reshape((batch,) + node.shape)
        if node.op == "transpose":
            return np.ascontiguousarray(np.swapaxes(x, *node.dims))
        return x

    def _qkv(self, node: TNode, values: Mapping[str, np.ndarray]) -> tuple[np.ndarray, ...]:
        if isinstance(node, CausalAttention):
            q, k, v = (values[name] for name in node.inputs)
            scale = node.scale
        else:
            group = self._attention[node.name]
            q, k_t = (values[name] for name in group.scores.inputs)
            k, v, scale = np.swapaxes(k_t, -1, -2), values[node.inputs[1]], group.scale
        return q, k, v, scale

    def _attend(self, node: TNode, values: Mapping[str, np.ndarray]) -> tuple[np.ndarray, dict]:
        q, k, v, scale = self._qkv(node, values)
        lead, (t, dh) = q.shape[:-2], q.shape[-2:]
        flat = [np.ascontiguousarray(a).reshape(-1, t, dh) for a in (q, k, v)]
        out, saved = tk.attention(*flat, scale)
        return out.reshape(lead + (t, dh)), saved

    def logits(self, params: Mapping[str, np.ndarray], tokens) -> np.ndarray:
        """The forward pass alone: float32 logits ``[B, T, vocab]`` of token ids ``[B, T]``."""
        values, _ = self._forward(params, np.asarray(tokens))
        return ops.floats(values[self.graph.output])

    # -- backward ----------------------------------------------------------
    def step(self, params: Mapping[str, np.ndarray], tokens, targets) -> ReferenceStep:
        """Forward, loss and backward of one batch of token ids ``[B, T]`` with
        next-token ``targets`` ``[B, T]``; ``params`` maps every ``state_dict``
        key of the graph to its float32 value.

        It is :meth:`shard` of the whole batch (with the model's ``blocks``)
        joined by :meth:`combine`."""
        shard = self.shard(params, tokens, targets, blocks=self.blocks)
        return ReferenceStep(float(np.mean(shard.losses)), shard.logits, self.combine([shard]))

    def shard(self, params: Mapping[str, np.ndarray], tokens, targets, *, count: int | None = None,
              blocks: Sequence[int] | None = None) -> ShardStep:
        """One system's share of a step: the sequences ``tokens`` ``[b, T]`` of a
        batch of ``count`` tokens in all (default: these ``b*T``), its token
        ``blocks`` (default one block). The loss delta is scaled by ``1/count``, so
        :meth:`combine` of the shards of a batch, in order, gives the whole
        batch's gradients bit for bit."""
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        missing = sorted(set(self.graph.parameters()) - set(params))
        if missing:
            raise UsageError(f"parameters missing: {', '.join(missing)}")
        w = _patterns(params)
        values, saved = self._forward(params, tokens, w)
        logits = values[self.graph.output]
        vocab = logits.shape[-1]
        flat = logits.reshape(-1, vocab)
        losses = cross_entropy(ops.floats(flat), targets.reshape(-1))
        blocks = list(blocks) if blocks is not None else [flat.shape[0]]
        tk.block_bounds(flat.shape[0], blocks)          # checks them
        grads = _Partials(blocks)
        pending = {self.graph.output: tl.sequence_cross_entropy_delta(flat, targets.reshape(-1),
                                                                       count).reshape(logits.shape)}
        for node in reversed(self.graph.nodes):
            g = pending.pop(node.name, None)
            if g is not None:
                for name, contribution in self._backward(node, g, values, saved, w, grads):
                    pending[name] = contribution if name not in pending else fp.vadd(pending[name], contribution)
        return ShardStep(losses, ops.floats(logits), grads.sums, grads.rows)

    @staticmethod
    def combine(shards: Sequence[ShardStep]) -> dict[str, np.ndarray]:
        """The gradients of a batch from its shards in order: each parameter's block
        partial sums chained (``+0 + G_0 + G_1 + ...``), each embedding table's rows
        summed over every token's ``dx`` in token order."""
        grads: dict[str, np.ndarray] = {}
        for name in shards[0].partials:
            grads[name] = ops.floats(tk.fold(fp.as_bits(np.concatenate([s.partials[name] for s in shards]))))
        for name, (_, _, rows) in shards[0].rows.items():
            dx = np.concatenate([s.rows[name][0] for s in shards])
            index = np.concatenate([s.rows[name][1] for s in shards])
            grads[name] = ops.floats(tk.embedding_rows_grad(ops.bits(dx), index, rows))
        return grads

    def _backward(self, node: TNode, g: np.ndarray, values: Mapping[str, np.ndarray], saved: Mapping[str, dict],
                  w: Mapping[str, np.ndarray], grads: "_Partials") -> list[tuple[str, np.ndarray]]:
        """Gradients of ``node``'s inputs (``(name, gradient)`` in input order); parameter gradients into ``grads``."""
        x = values.get(node.inputs[0]) if node.inputs else None
        if isinstance(node, Add):
            return [(node.inputs[0], g), (node.inputs[1], g)]
        if isinstance(node, Embedding):
            index = np.broadcast_to(x, g.shape[:-1])
            grads.rows[node.weight_name] = (ops.floats(g.reshape(-1, node.dim)), np.ascontiguousarray(index).reshape(-1),
                                            node.num_embeddings)
            return []
        if isinstance(node, LayerNorm):
            dy = g.reshape(-1, node.features)
            dx = te.layernorm_input_grad(dy, w[node.weight_name], saved[node.name], self.rows)
            grads.token_sums(node.weight_name, dy, saved[node.name]["xhat"])
            grads.token_sums(node.bias_name, dy)
            return [(node.inputs[0], dx.reshape(g.shape))]
        if isinstance(node, TokenLinear):
            dy = g.reshape(-1, node.out_features)
            dw, db, dx = tk.linear_backward(x.reshape(-1, node.in_features), dy, w[node.weight_name], self.rows,
                                            grads.blocks)
            grads.sums[node.weight_name] = ops.floats(dw)
            if node.bias:
                grads.sums[node.bias_name] = ops.floats(db)
            return [(node.inputs[0], dx.reshape(x.shape))]
        if isinstance(node, GELU):
            return [(node.inputs[0], te.gelu_backward(g, x, node.approximate))]
        if isinstance(node, Rearrange):
            if node.op == "transpose":
                return [(node.inputs[0], np.ascontiguousarray(np.swapaxes(g, *node.dims)))]
            return [(node.inputs[0], g.reshape(x.shape))]
        if isinstance(node, (CausalAttention, MatMul)):
            return self._attention_backward(node, g, values, saved)
        return []

    def _attention_backward(self, node: TNode, g: np.ndarray, values: Mapping[str, np.ndarray],
                            saved: Mapping[str, dict]) -> list[tuple[str, np.ndarray]]:
        q, k, v, scale = self._qkv(node, values)
        lead, (t, dh) = q.shape[:-2], q.shape[-2:]
        flat = [np.ascontiguousarray(a).reshape(-1, t, dh) for a in (g, q, k, v)]
        dq, dk, dv = (d.reshape(lead + (t, dh)) for d in tk.attention_backward(*flat, saved[node.name], scale))
        if isinstance(node, CausalAttention):
            return list(zip(node.inputs, (dq, dk, dv)))
        group = self._attention[node.name]
        return [(group.scores.inputs[0], dq), (group.scores.inputs[1], np.ascontiguousarray(np.swapaxes(dk, -1, -2))),
                (node.inputs[1], dv)]
