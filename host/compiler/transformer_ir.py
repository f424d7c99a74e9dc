"""The transformer IR: a model as a graph of typed nodes with per-sample shapes.

The layer IR (:mod:`.ir`) is a straight chain; a transformer is not (residual
additions, q/k/v branches), so its front end
(:mod:`.transformer_capture`) produces a :class:`TransformerGraph`: nodes in
execution order, each naming the nodes it reads. Shapes are per sample (the
batch dimension is leading and symbolic): ``(T,)`` for token ids, ``(T, D)``
for activations, ``(heads, T, Dh)`` between the head split and merge.

Like the layer IR it is mode-agnostic (no placement), converts to and from
JSON-able dicts, and names parameters by their ``state_dict`` keys. Its
mapping onto the fabric is :mod:`.gpt_phases` (``docs/transformer.md`` section 11).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping, Sequence

from wse.config import UsageError

from .layers import format_shape

__all__ = ["TNode", "Tokens", "Positions", "Embedding", "Add", "LayerNorm", "TokenLinear", "GELU", "Rearrange",
           "MatMul", "Scale", "CausalMask", "Softmax", "CausalAttention", "SequenceCrossEntropy",
           "TransformerGraph", "TRANSFORMER_IR_FORMAT", "TRANSFORMER_IR_VERSION"]

#: Identifies a serialized transformer graph.
TRANSFORMER_IR_FORMAT = "wse-transformer-ir"
#: Bumped whenever the meaning of a serialized field changes.
TRANSFORMER_IR_VERSION = 1

Shape = tuple[int, ...]


def _shape(owner: str, value: Any) -> Shape:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise UsageError(f"{owner} shape must be a sequence of positive integers, not {value!r}")
    for dim in value:
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise UsageError(f"{owner} shape must be a sequence of positive integers, not {value!r}")
    return tuple(value)


def _positive(owner: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{owner} {field} must be a positive integer, not {value!r}")


@dataclasses.dataclass(frozen=True)
class TNode:
    """One operation of a transformer, in execution order.

    Members
    -------
    name:
        Unique within the graph (the module path or the fx node name).
    inputs:
        The names of the nodes it reads, in argument order.
    shape:
        Per-sample output shape (``()`` for the loss).
    source:
        ``file:line in function`` in the user's code, for messages.
    batched:
        ``False`` for values shared by every sequence of the batch (the
        positions and their embeddings): ``shape`` is then the whole shape.

    Subclasses set ``kind`` (the serialized tag) and ``arity`` (how many
    inputs), and define :meth:`parameters` where they have weights.
    """

    kind: ClassVar[str] = ""
    arity: ClassVar[int] = 1
    _registry: ClassVar[dict[str, type["TNode"]]] = {}

    name: str
    inputs: tuple[str, ...]
    shape: Shape
    source: str | None = dataclasses.field(default=None, kw_only=True, compare=False)
    batched: bool = dataclasses.field(default=True, kw_only=True)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            TNode._registry[cls.kind] = cls

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not isinstance(self.name, str) or not self.name:
            raise UsageError(f"{owner} name must be a non-empty string, not {self.name!r}")
        inputs = tuple(self.inputs) if isinstance(self.inputs, (list, tuple)) else None
        if inputs is None or len(inputs) != self.arity or not all(isinstance(i, str) and i for i in inputs):
            raise UsageError(f"{owner} {self.name!r} takes {self.arity} input name(s), not {self.inputs!r}")
        object.__setattr__(self, "inputs", inputs)
        shape = () if self.kind == "sequence_cross_entropy" and not self.shape else _shape(owner, self.shape)
        object.__setattr__(self, "shape", shape)

    def parameters(self) -> dict[str, Shape]:
        """Trainable tensors as ``{state_dict key: shape}``."""
        return {}

    def _fields(self) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        """This node as a JSON-able dict tagged with its ``kind``."""
        return {"kind": self.kind, "name": self.name, "inputs": list(self.inputs), "shape": list(self.shape),
                "source": self.source, "batched": self.batched, **self._fields()}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "TNode":
        """Rebuild a node from :meth:`to_dict` output (:class:`UsageError` if it is not one)."""
        kind = data.get("kind") if isinstance(data, Mapping) else None
        cls = TNode._registry.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise UsageError(f"transformer node kind must be one of {', '.join(sorted(TNode._registry))}, "
                             f"not {kind!r}")
        try:
            return cls(**{k: v for k, v in data.items() if k != "kind"})
        except TypeError as exc:
            raise UsageError(f"{kind} node {dict(data)!r} is malformed: {exc}") from None

    def describe(self) -> str:
        """A short readable form of the node's own fields."""
        fields = ", ".join(f"{k}={v}" for k, v in self._fields().items() if not k.endswith("_name"))
        return f"{type(self).__name__}({fields})"


@dataclasses.dataclass(frozen=True)
class Tokens(TNode):
    """The model's input: ``T`` token ids per sequence."""

    kind: ClassVar[str] = "tokens"
    arity: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class Positions(TNode):
    """``torch.arange(T)``: the position of each token in its sequence."""

    kind: ClassVar[str] = "positions"
    arity: ClassVar[int] = 0


@dataclasses.dataclass(frozen=True)
class Embedding(TNode):
    """A table lookup (``nn.Embedding``) of token ids or positions; the table
    lives in MemoryX and a lookup streams only the rows a batch uses."""

    kind: ClassVar[str] = "embedding"
    num_embeddings: int = 1
    dim: int = 1
    weight_name: str = ""

    def __post_init__(self) -> None:
        super().__post_init__()
        _positive("Embedding", "num_embeddings", self.num_embeddings)
        _positive("Embedding", "dim", self.dim)

    def parameters(self) -> dict[str, Shape]:
        return {self.weight_name: (self.num_embeddings, self.dim)}

    def _fields(self) -> dict[str, Any]:
        return {"num_embeddings": self.num_embeddings, "dim": self.dim, "weight_name": self.weight_name}


@dataclasses.dataclass(frozen=True)
class Add(TNode):
    """Elementwise sum of two activations of the same shape (residuals, token + position)."""

    kind: ClassVar[str] = "add"
    arity: ClassVar[int] = 2


@dataclasses.dataclass(frozen=True)
class LayerNorm(TNode):
    """``nn.LayerNorm`` over the last dimension, with weight and bias."""

    kind: ClassVar[str] = "layer_norm"
    features: int = 1
    eps: float = 1e-5
    weight_name: str = ""
    bias_name: str = ""

    def parameters(self) -> dict[str, Shape]:
        return {self.weight_name: (self.features,), self.bias_name: (self.features,)}

    def _fields(self) -> dict[str, Any]:
        return {"features": self.features, "eps": self.eps, "weight_name": self.weight_name,
                "bias_name": self.bias_name}


@dataclasses.dataclass(frozen=True)
class TokenLinear(TNode):
    """``nn.Linear`` applied to every token: the streamed GEMM."""

    kind: ClassVar[str] = "token_linear"
    in_features: int = 1
    out_features: int = 1
    bias: bool = True
    weight_name: str = ""
    bias_name: str | None = None

    def parameters(self) -> dict[str, Shape]:
        params = {self.weight_name: (self.out_features, self.in_features)}
        if self.bias:
            params[self.bias_name] = (self.out_features,)
        return params

    def _fields(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.bias,
                "weight_name": self.weight_name, "bias_name": self.bias_name}


@dataclasses.dataclass(frozen=True)
class GELU(TNode):
    """GELU, ``approximate`` ``"none"`` (erf) or ``"tanh"``."""

    kind: ClassVar[str] = "gelu"
    approximate: str = "none"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.approximate not in ("none", "tanh"):
            raise UsageError(f"GELU approximate must be 'none' or 'tanh', not {self.approximate!r}")

    def _fields(self) -> dict[str, Any]:
        return {"approximate": self.approximate}


@dataclasses.dataclass(frozen=True)
class Rearrange(TNode):
    """Data movement only: the head split and merge. ``op`` is ``"view"`` (to
    ``shape``), ``"transpose"`` (swapping the tensor dimensions ``dims``, the
    batch being dimension 0, never moved) or ``"contiguous"`` (nothing)."""

    kind: ClassVar[str] = "rearrange"
    op: str = "view"
    dims: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.op not in ("view", "transpose", "contiguous"):
            raise UsageError(f"Rearrange op must be 'view', 'transpose' or 'contiguous', not {self.op!r}")
        dims = tuple(self.dims)
        if self.op == "transpose" and (len(dims) != 2 or not all(isinstance(d, int) and d >= 1 for d in dims)):
            raise UsageError(f"a transpose swaps two non-batch dimensions, not {self.dims!r}")
        object.__setattr__(self, "dims", dims)

    def _fields(self) -> dict[str, Any]:
        return {"op": self.op, "dims": list(self.dims)}


@dataclasses.dataclass(frozen=True)
class MatMul(TNode):
    """A product of two activations per sequence and head: ``role`` ``"scores"``
    (``q @ k^T``) or ``"values"`` (``p @ v``)."""

    kind: ClassVar[str] = "matmul"
    arity: ClassVar[int] = 2
    role: str = "scores"

    def _fields(self) -> dict[str, Any]:
        return {"role": self.role}


@dataclasses.dataclass(frozen=True)
class Scale(TNode):
    """Multiplication by a constant (``divide``: division by ``factor`` instead)."""

    kind: ClassVar[str] = "scale"
    factor: float = 1.0
    divide: bool = False

    def _fields(self) -> dict[str, Any]:
        return {"factor": self.factor, "divide": self.divide}


@dataclasses.dataclass(frozen=True)
class CausalMask(TNode):
    """``masked_fill`` of the scores above the diagonal with ``-inf``: key ``j``
    is visible to query ``i`` exactly when ``j <= i`` (checked on the example)."""

    kind: ClassVar[str] = "causal_mask"


@dataclasses.dataclass(frozen=True)
class Softmax(TNode):
    """Softmax over the last dimension (the keys)."""

    kind: ClassVar[str] = "softmax"


@dataclasses.dataclass(frozen=True)
class CausalAttention(TNode):
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` with ``scale``."""

    kind: ClassVar[str] = "causal_attention"
    arity: ClassVar[int] = 3
    scale: float = 1.0

    def _fields(self) -> dict[str, Any]:
        return {"scale": self.scale}


@dataclasses.dataclass(frozen=True)
class SequenceCrossEntropy(TNode):
    """The loss: softmax cross-entropy of every position's next-token target
    over ``vocab`` classes, reduced over all tokens of the batch."""

    kind: ClassVar[str] = "sequence_cross_entropy"
    vocab: int = 1
    reduction: str = "mean"

    def _fields(self) -> dict[str, Any]:
        return {"vocab": self.vocab, "reduction": self.reduction}


class TransformerGraph:
    """A transformer as typed nodes in execution order.

    Parameters
    ----------
    nodes:
        The nodes; each reads only nodes before it; exactly one
        :class:`Tokens`; a :class:`SequenceCrossEntropy`, if any, is last.
    output:
        The name of the node whose value the model returns (the logits).
    name:
        The model's name.

    Raises
    ------
    UsageError
        If names repeat, an input is unknown or later, or a parameter belongs to two nodes.
    """

    def __init__(self, nodes: Sequence[TNode], output: str, name: str = "model") -> None:
        self.name = name
        self._nodes = tuple(nodes)
        seen: dict[str, TNode] = {}
        params: set[str] = set()
        for node in self._nodes:
            if not isinstance(node, TNode):
                raise UsageError(f"transformer graph nodes must be TNode objects, not {node!r}")
            if node.name in seen:
                raise UsageError(f"node names must be unique; {node.name!r} appears twice")
            for source in node.inputs:
                if source not in seen:
                    raise UsageError(f"node {node.name!r} reads {source!r}, which is not an earlier node")
            for key in node.parameters():
                if key in params:
                    raise UsageError(f"parameter names must be unique; {key!r} belongs to two nodes")
                params.add(key)
            seen[node.name] = node
        if sum(isinstance(n, Tokens) for n in self._nodes) != 1:
            raise UsageError("a transformer graph has exactly one Tokens node")
        if output not in seen:
            raise UsageError(f"the output {output!r} is not a node of the graph")
        self.output = output
        self._by_name = seen

    @property
    def nodes(self) -> tuple[TNode, ...]:
        """All nodes in execution order."""
        return self._nodes

    def node(self, name: str) -> TNode:
        """The node called ``name`` (:class:`UsageError` if none)."""
        try:
            return self._by_name[name]
        except KeyError:
            raise UsageError(f"graph {self.name!r} has no node {name!r}") from None

    def of_kind(self, cls: type[TNode]) -> list[TNode]:
        """The nodes of one type, in order."""
        return [n for n in self._nodes if isinstance(n, cls)]

    @property
    def loss(self) -> SequenceCrossEntropy | None:
        """The loss node, or ``None``."""
        last = self._nodes[-1]
        return last if isinstance(last, SequenceCrossEntropy) else None

    def parameters(self) -> dict[str, Shape]:
        """``{state_dict key: shape}`` in execution order."""
        out: dict[str, Shape] = {}
        for node in self._nodes:
            out.update(node.parameters())
        return out

    @property
    def parameter_count(self) -> int:
        """Trainable scalars of the whole model."""
        return sum(math.prod(shape) for shape in self.parameters().values())

    def to_dict(self) -> dict[str, Any]:
        """The graph as a JSON-able dict."""
        return {"format": TRANSFORMER_IR_FORMAT, "version": TRANSFORMER_IR_VERSION, "name": self.name,
                "output": self.output, "nodes": [node.to_dict() for node in self._nodes]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TransformerGraph":
        """Rebuild a graph from :meth:`to_dict` output (:class:`UsageError` if it is not one)."""
        if not isinstance(data, Mapping) or data.get("format") != TRANSFORMER_IR_FORMAT:
            raise UsageError(f"a serialized transformer graph must have format {TRANSFORMER_IR_FORMAT!r}")
        if data.get("version") != TRANSFORMER_IR_VERSION:
            raise UsageError(f"serialized transformer graph version must be {TRANSFORMER_IR_VERSION}, "
                             f"not {data.get('version')!r}")
        return cls([TNode.from_dict(item) for item in data.get("nodes", [])], data.get("output", ""),
                   name=data.get("name", "model"))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TransformerGraph):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None

    def __repr__(self) -> str:
        return f"TransformerGraph({self.name!r}: {len(self._nodes)} nodes, {self.parameter_count:,} parameters)"

    def summary(self) -> str:
        """One line per node: name, operation, inputs, per-sample output shape."""
        rows = [(n.name, n.describe(), ", ".join(n.inputs) or "-",
                 format_shape(n.shape, batched=n.batched and not isinstance(n, SequenceCrossEntropy)))
                for n in self._nodes]
        widths = [max(len(r[c]) for r in rows) for c in range(3)]
        lines = [f"{self.name}: {len(self._nodes)} nodes, {self.parameter_count:,} parameters "
                 f"(shapes per sample, B = batch)"]
        lines += [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c.ljust(widths[2])}  {d}" for a, b, c, d in rows]
        return "\n".join(lines)
