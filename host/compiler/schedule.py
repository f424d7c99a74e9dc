"""The typed contents of an executable's schedule: phases, their streams and
what each computes.

A :class:`Phase` is one run of the fabric: the host queues its weight streams
(:class:`StreamIn`) at the edge, launches the PE program on the phase's op
lists, runs the fabric until it is idle and collects its gradient streams
(:class:`StreamOut`). Its ``math`` is the same work as whole-tensor
operations (:class:`MathOp` subclasses), which the functional backend
executes with the firmware's order of binary32 operations. Tensors are named
as the mapper names them (``act0`` is the model input, see
:mod:`.ws_phases`); weights by their PyTorch ``state_dict`` names.

Every class converts to and from the executable's manifest
(:meth:`Phase.to_manifest`, :meth:`Phase.from_manifest`), with the stream
arrays stored beside it under the keys the manifest names.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, ClassVar, Mapping

import numpy as np

__all__ = ["StreamIn", "StreamOut", "MathOp", "Sgemm", "SgemmTransposed", "SparseSgemm", "SparseSgemmTransposed",
           "SparseWeightGradient", "Relu", "ReluMask",
           "SoftmaxDelta", "WeightGradient", "Phase"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype and \
            np.array_equal(a, b)
    return a == b


class _Stream:
    """Equality of a stream: the same fields, arrays of the same dtype and values."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f.name), getattr(other, f.name)) for f in dataclasses.fields(self))

    __hash__ = None


@dataclasses.dataclass(frozen=True, eq=False)
class StreamIn(_Stream):
    """A weight stream the host injects at an edge port.

    Members
    -------
    edge, index:
        The edge port (``"W"`` and the row for weight streaming).
    color:
        The color the wavelets travel on.
    tensors:
        Parameter names whose flattened values, then the constants +0.0 and
        -0.0, form the stream's pool (:func:`wse.host.runtime.backend.pool_of`).
    gather:
        int64 pool index of every wavelet, in order.
    ctrl:
        uint8 per wavelet: 1 for a control wavelet.
    words:
        uint32 constant words appended to the pool after -0.0 (None: none): the
        index words and carriage returns of a sparse stream.
    """
    edge: str
    index: int
    color: int
    tensors: tuple[str, ...]
    gather: np.ndarray
    ctrl: np.ndarray
    words: np.ndarray | None = None

    def to_manifest(self, keep: Callable[[np.ndarray], str]) -> dict[str, Any]:
        """The manifest entry; ``keep`` stores an array and returns its key."""
        entry = {"edge": self.edge, "index": self.index, "color": self.color, "tensors": list(self.tensors),
                 "gather": keep(self.gather), "ctrl": keep(self.ctrl)}
        if self.words is not None:
            entry["words"] = keep(self.words)
        return entry

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "StreamIn":
        """Rebuild a stream from :meth:`to_manifest`'s entry and the stored arrays."""
        words = arrays[data["words"]] if "words" in data else None
        return cls(data["edge"], data["index"], data["color"], tuple(data["tensors"]), arrays[data["gather"]],
                   arrays[data["ctrl"]], words)


@dataclasses.dataclass(frozen=True, eq=False)
class StreamOut(_Stream):
    """A gradient stream the host collects at an edge port.

    Members
    -------
    edge, index, color:
        The edge port (``"E"`` and the row for weight streaming) and color.
    tensors:
        Parameter names whose gradients, flattened in order, form the pool.
    scatter:
        int64 pool index of every wavelet, in order.
    """
    edge: str
    index: int
    color: int
    tensors: tuple[str, ...]
    scatter: np.ndarray

    def to_manifest(self, keep: Callable[[np.ndarray], str]) -> dict[str, Any]:
        """The manifest entry; ``keep`` stores an array and returns its key."""
        return {"edge": self.edge, "index": self.index, "color": self.color, "tensors": list(self.tensors),
                "scatter": keep(self.scatter)}

    @classmethod
    def from_manifest(cls, data: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "StreamOut":
        """Rebuild a stream from :meth:`to_manifest`'s entry and the stored arrays."""
        return cls(data["edge"], data["index"], data["color"], tuple(data["tensors"]), arrays[data["scatter"]])


# What a phase computes ----------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MathOp:
    """One whole-tensor operation of a phase.

    Subclasses name their tag in the manifest (``op``); :meth:`to_manifest`
    writes the tag and the fields in declaration order, :meth:`from_manifest`
    picks the class by tag.
    """

    op: ClassVar[str] = ""

    def to_manifest(self) -> dict[str, Any]:
        """The manifest entry: ``{"op": tag, field: value, ...}``."""
        return {"op": self.op, **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}}

    @staticmethod
    def from_manifest(data: Mapping[str, Any]) -> "MathOp":
        """Rebuild an operation from :meth:`to_manifest`'s entry.

        Raises
        ------
        ValueError
            For an unknown tag.
        """
        data = dict(data)
        tag = data.pop("op", None)
        if tag == Sgemm.op and data.get("transposed"):
            del data["transposed"], data["bias"]
            return SgemmTransposed(**data)
        if tag == Sgemm.op:
            data.pop("transposed", None)
            return Sgemm(**data)
        cls = {c.op: c for c in (SparseSgemm, SparseSgemmTransposed, Relu, ReluMask, SoftmaxDelta,
                                 WeightGradient, SparseWeightGradient)}.get(tag)
        if cls is None:
            raise ValueError(f"unknown math operation {tag!r}")
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Sgemm(MathOp):
    """The streamed GEMM ``y = W x + b``: ``W [O, K]`` (``weight``), ``x [K, B]``,
    ``bias [O]`` (None: none), ``y [O, B]``."""

    op: ClassVar[str] = "sgemm"
    weight: str
    bias: str | None
    x: str
    y: str

    def to_manifest(self) -> dict[str, Any]:
        return {**super().to_manifest(), "transposed": False}


@dataclasses.dataclass(frozen=True)
class SgemmTransposed(MathOp):
    """The streamed GEMM with the weights transposed (input gradients):
    ``y = W^T x``, ``W [O, K]`` (``weight``), ``x [O, B]``, ``y [K, B]``."""

    op: ClassVar[str] = "sgemm"
    weight: str
    x: str
    y: str

    def to_manifest(self) -> dict[str, Any]:
        return {"op": self.op, "weight": self.weight, "bias": None, "x": self.x, "y": self.y, "transposed": True}


class _MaskedOp(MathOp):
    """A math op of a masked layer: its ``nonzeros`` (the kept weights' flat
    indices) held as a tuple of ints and written to the manifest as a list."""

    nonzeros: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "nonzeros", tuple(int(v) for v in self.nonzeros))

    def to_manifest(self) -> dict[str, Any]:
        return {**super().to_manifest(), "nonzeros": list(self.nonzeros)}


@dataclasses.dataclass(frozen=True)
class SparseSgemm(_MaskedOp):
    """The sparse streamed GEMM ``y = (W * mask) x + b`` of a layer with a static
    mask: ``W [O, K]`` (``weight``), ``x [K, B]``, ``bias [O]`` (None: none),
    ``y [O, B]``; ``nonzeros`` are the kept weights' flat indices ``o*K + k``
    (ascending, :func:`~.sparse.nonzeros`). Only those are multiplied, in the
    order of ``docs/weight_streaming.md`` section 13 (:func:`~.sparse.reference_forward`; features
    on the rows of their slots, section 3)."""

    op: ClassVar[str] = "spgemm"
    weight: str
    bias: str | None
    x: str
    y: str
    nonzeros: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class SparseSgemmTransposed(_MaskedOp):
    """The sparse streamed GEMM with the masked weights transposed (input
    gradients of a masked layer): ``y = (W * mask)^T x``, ``W [O, K]``
    (``weight``), ``x [O, B]``, ``y [K, B]``; ``nonzeros`` are the kept
    entries' flat indices ``k*O + o`` in ``W^T`` (ascending). Only those are
    multiplied, in :class:`SparseSgemm`'s order with ``W^T`` and no bias."""

    op: ClassVar[str] = "spgemm_t"
    weight: str
    x: str
    y: str
    nonzeros: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Relu(MathOp):
    """``data = max(data, +0)`` in place, with the fabric's ``fmaxs`` rules."""

    op: ClassVar[str] = "relu"
    data: str


@dataclasses.dataclass(frozen=True)
class ReluMask(MathOp):
    """``grad`` masked in place where the ReLU output ``act`` is not positive (``train.s``'s mask)."""

    op: ClassVar[str] = "mask"
    act: str
    grad: str


@dataclasses.dataclass(frozen=True)
class SoftmaxDelta(MathOp):
    """``dz``: the softmax cross-entropy delta of the logits ``z [C, B]`` (with the
    host's one-hot labels and per-sample scale)."""

    op: ClassVar[str] = "softmax"
    z: str
    dz: str


@dataclasses.dataclass(frozen=True)
class WeightGradient(MathOp):
    """The gradients of ``weight`` (and ``bias``, None: none) from the layer input
    ``x [K, B]`` and the output gradient ``dy [O, B]``."""

    op: ClassVar[str] = "wgrad"
    weight: str
    bias: str | None
    x: str
    dy: str


@dataclasses.dataclass(frozen=True)
class SparseWeightGradient(_MaskedOp):
    """The gradients of a masked layer's kept weights (and of ``bias``, None:
    none): :class:`WeightGradient`'s values at the flat indices ``nonzeros``
    (``o*K + k``, ascending), +0 at every pruned weight (never computed)."""

    op: ClassVar[str] = "spwgrad"
    weight: str
    bias: str | None
    x: str
    dy: str
    nonzeros: tuple[int, ...]


# Phases ------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Phase:
    """One run of the fabric.

    Members
    -------
    name:
        Human-readable, such as ``"fwd fc1"``; the key of the executable's phases.
    group:
        ``"forward"``, ``"loss"``, ``"backward-data"`` or ``"backward-weight"``
        (the layout's :attr:`~.layouts.Layout.gemm_groups` are the streamed GEMMs).
    ops_addr:
        Address of the phase's op list (the same on every PE).
    streams_in:
        The weight streams to inject.
    streams_out:
        The gradient streams to collect.
    math:
        What the phase computes, in order, for the functional backend.
    fmacs:
        FMAC elements of the phase, all PEs together.
    cycles:
        Fabric cycles of the phase (the static cycle model: the golden model's count).
    """
    name: str
    group: str
    ops_addr: int
    streams_in: tuple[StreamIn, ...]
    streams_out: tuple[StreamOut, ...]
    math: tuple[MathOp, ...]
    fmacs: int
    cycles: int

    def to_manifest(self, keep: Callable[[np.ndarray], str]) -> dict[str, Any]:
        """The manifest entry (without the name, its key); ``keep`` stores an array and returns its key."""
        return {"group": self.group, "ops_addr": self.ops_addr,
                "streams_in": [s.to_manifest(keep) for s in self.streams_in],
                "streams_out": [s.to_manifest(keep) for s in self.streams_out],
                "math": [op.to_manifest() for op in self.math], "fmacs": self.fmacs, "cycles": self.cycles}

    @classmethod
    def from_manifest(cls, name: str, data: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> "Phase":
        """Rebuild phase ``name`` from :meth:`to_manifest`'s entry and the stored arrays."""
        return cls(name, data["group"], data["ops_addr"],
                   tuple(StreamIn.from_manifest(s, arrays) for s in data["streams_in"]),
                   tuple(StreamOut.from_manifest(s, arrays) for s in data["streams_out"]),
                   tuple(MathOp.from_manifest(op) for op in data["math"]), data["fmacs"], data["cycles"])
