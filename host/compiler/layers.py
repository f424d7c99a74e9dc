"""The layers of the layer IR: what one step of a model computes, with
per-sample shapes, parameters and FLOP counts.

Every layer is a frozen dataclass tagged with a ``kind`` that its dict form
(:meth:`Layer.to_dict`, :meth:`Layer.from_dict`) carries; :class:`~.ir.Graph`
chains them. Shapes are *per sample*: the batch dimension is leading and
symbolic (written ``B`` in summaries).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping, Sequence

from wse.config import UsageError

__all__ = ["Shape", "Layer", "Input", "Flatten", "Linear", "ReLU", "SoftmaxCrossEntropy", "format_shape"]

#: A per-sample shape: the dimensions after the (symbolic) batch dimension.
Shape = tuple[int, ...]

_REDUCTIONS = ("mean", "sum")


def format_shape(shape: Shape | None, batched: bool = True) -> str:
    """Render a per-sample shape with its symbolic batch dimension, ``[B, 784]``.

    ``None`` renders as ``-``; an unbatched (reduced) scalar as ``scalar``.
    """
    if shape is None:
        return "-"
    if not batched:
        return "scalar" if not shape else "[" + ", ".join(map(str, shape)) + "]"
    return "[" + ", ".join(["B", *map(str, shape)]) + "]"


def _check_positive_int(owner: str, field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{owner} {field} must be a positive integer, not {value!r}")


def _as_shape(owner: str, value: Any) -> Shape:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise UsageError(f"{owner} shape must be a sequence of positive integers, not {value!r}")
    for dim in value:
        _check_positive_int(owner, "shape dimension", dim)
    return tuple(value)


@dataclasses.dataclass(frozen=True)
class Layer:
    """One step of the model, in execution order.

    Members
    -------
    name:
        Unique within its graph; ``None`` lets :class:`Graph` choose one.
    source:
        Where the layer comes from in the user's code (``file:line in func`` or
        a module path), for messages; ``None`` when unknown.

    Subclasses define ``kind`` (the serialized tag) and the per-sample
    ``input_shape``/``output_shape``, :meth:`parameters` and FLOP counts.
    """

    kind: ClassVar[str] = ""
    _registry: ClassVar[dict[str, type["Layer"]]] = {}

    name: str | None = dataclasses.field(default=None, kw_only=True)
    source: str | None = dataclasses.field(default=None, kw_only=True, compare=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.kind:
            Layer._registry[cls.kind] = cls

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise UsageError(f"{type(self).__name__} name must be a non-empty string, not {self.name!r}")
        if self.source is not None and not isinstance(self.source, str):
            raise UsageError(f"{type(self).__name__} source must be a string, not {self.source!r}")

    # -- shapes ---------------------------------------------------------
    @property
    def input_shape(self) -> Shape | None:
        """Per-sample input shape; ``None`` for :class:`Input`."""
        raise NotImplementedError

    @property
    def output_shape(self) -> Shape:
        """Per-sample output shape (for a loss: the shape of the batch's scalar, ``()``)."""
        raise NotImplementedError

    @property
    def batched_output(self) -> bool:
        """Whether the output keeps the batch dimension (a loss reduces it)."""
        return True

    @property
    def output_size(self) -> int:
        """Elements of the output per sample (per batch for a loss)."""
        return math.prod(self.output_shape)

    # -- parameters and work -------------------------------------------
    def parameters(self) -> dict[str, Shape]:
        """Trainable tensors as ``{state_dict key: shape}``, in streaming order."""
        return {}

    @property
    def parameter_count(self) -> int:
        """Number of trainable scalars."""
        return sum(math.prod(shape) for shape in self.parameters().values())

    def forward_flops(self) -> int:
        """Floating-point operations of the forward pass, per sample."""
        return 0

    def backward_flops(self, input_grad: bool = True) -> int:
        """Floating-point operations of the backward pass, per sample.

        Parameters
        ----------
        input_grad:
            Whether the gradient with respect to the layer's input is needed
            (it is not for layers that no trainable layer precedes).
        """
        return 0

    # -- serialization ---------------------------------------------------
    def _fields(self) -> dict[str, Any]:
        """The layer-specific fields, JSON-able."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        """This layer as a JSON-able dict tagged with its ``kind``."""
        return {"kind": self.kind, "name": self.name, "source": self.source, **self._fields()}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> "Layer":
        """Rebuild a layer from :meth:`to_dict` output.

        Raises
        ------
        UsageError
            If ``data`` is not a layer dict of a known kind with valid fields.
        """
        if not isinstance(data, Mapping):
            raise UsageError(f"a serialized layer must be a dict, not {data!r}")
        kind = data.get("kind")
        cls = Layer._registry.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise UsageError(
                f"layer kind must be one of {', '.join(sorted(Layer._registry))}, not {kind!r}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names - {"kind"}
        if unknown:
            raise UsageError(f"{kind} layer has unknown fields {sorted(unknown)}")
        try:
            return cls(**{k: v for k, v in data.items() if k != "kind"})
        except TypeError as exc:
            raise UsageError(f"{kind} layer dict {dict(data)!r} is incomplete: {exc}") from None

    def describe(self) -> str:
        """A short human-readable form of the layer's own fields."""
        return type(self).__name__


@dataclasses.dataclass(frozen=True)
class Input(Layer):
    """The model's input: one tensor of per-sample ``shape`` (batch first, symbolic)."""

    kind: ClassVar[str] = "input"
    shape: Shape

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "shape", _as_shape("Input", self.shape))

    @property
    def input_shape(self) -> None:
        return None

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def _fields(self) -> dict[str, Any]:
        return {"shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class Flatten(Layer):
    """Collapse each sample of per-sample ``shape`` into one feature vector.

    Costs no arithmetic: on the fabric it only renames where features live.
    """

    kind: ClassVar[str] = "flatten"
    shape: Shape

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "shape", _as_shape("Flatten", self.shape))

    @property
    def input_shape(self) -> Shape:
        return self.shape

    @property
    def output_shape(self) -> Shape:
        return (math.prod(self.shape),)

    def _fields(self) -> dict[str, Any]:
        return {"shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class Linear(Layer):
    """A fully connected layer ``y = x W^T + b`` on ``[B, in_features]`` inputs.

    Parameters
    ----------
    in_features, out_features:
        Sizes of the input and output feature vectors.
    bias:
        Whether the layer adds a bias vector.
    weight_name, bias_name:
        The parameters' keys in the PyTorch ``state_dict`` (``bias_name`` is
        ``None`` exactly when ``bias`` is false). The weight has PyTorch's
        shape ``(out_features, in_features)``.

    FLOPs per sample count a multiply and an add per weight: forward
    ``2*in*out`` (+ ``out`` bias adds); backward ``2*in*out`` for the weight
    gradient, ``out`` for the bias gradient and, when needed, ``2*in*out``
    for the input gradient.
    """

    kind: ClassVar[str] = "linear"
    in_features: int
    out_features: int
    bias: bool
    weight_name: str
    bias_name: str | None = None

    def __post_init__(self) -> None:
        _check_positive_int("Linear", "in_features", self.in_features)
        _check_positive_int("Linear", "out_features", self.out_features)
        if not isinstance(self.bias, bool):
            raise UsageError(f"Linear bias must be True or False, not {self.bias!r}")
        if not isinstance(self.weight_name, str) or not self.weight_name:
            raise UsageError(f"Linear weight_name must be a non-empty string, not {self.weight_name!r}")
        if self.bias and (not isinstance(self.bias_name, str) or not self.bias_name):
            raise UsageError(f"Linear with a bias needs a bias_name string, not {self.bias_name!r}")
        if not self.bias and self.bias_name is not None:
            raise UsageError(f"Linear without a bias must have bias_name None, not {self.bias_name!r}")
        if self.name is None and self.weight_name.endswith(".weight"):
            # The module path is the natural name: "encoder.0.weight" -> "encoder.0".
            object.__setattr__(self, "name", self.weight_name[: -len(".weight")])
        super().__post_init__()

    @property
    def input_shape(self) -> Shape:
        return (self.in_features,)

    @property
    def output_shape(self) -> Shape:
        return (self.out_features,)

    def parameters(self) -> dict[str, Shape]:
        params = {self.weight_name: (self.out_features, self.in_features)}
        if self.bias:
            params[self.bias_name] = (self.out_features,)
        return params

    def forward_flops(self) -> int:
        macs = self.in_features * self.out_features
        return 2 * macs + (self.out_features if self.bias else 0)

    def backward_flops(self, input_grad: bool = True) -> int:
        macs = self.in_features * self.out_features
        flops = 2 * macs + (self.out_features if self.bias else 0)
        return flops + (2 * macs if input_grad else 0)

    def _fields(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "out_features": self.out_features,
                "bias": self.bias, "weight_name": self.weight_name, "bias_name": self.bias_name}

    def describe(self) -> str:
        return f"Linear({self.in_features}, {self.out_features}{'' if self.bias else ', bias=False'})"


@dataclasses.dataclass(frozen=True)
class ReLU(Layer):
    """Elementwise ``max(x, 0)`` on per-sample ``shape``: one operation per
    element forward, one per element backward (when the input gradient is needed)."""

    kind: ClassVar[str] = "relu"
    shape: Shape

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "shape", _as_shape("ReLU", self.shape))

    @property
    def input_shape(self) -> Shape:
        return self.shape

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def forward_flops(self) -> int:
        return math.prod(self.shape)

    def backward_flops(self, input_grad: bool = True) -> int:
        return math.prod(self.shape) if input_grad else 0

    def _fields(self) -> dict[str, Any]:
        return {"shape": list(self.shape)}


@dataclasses.dataclass(frozen=True)
class SoftmaxCrossEntropy(Layer):
    """The loss: softmax over ``classes`` logits, then the negative log-likelihood
    of each sample's integer label, reduced over the batch (``mean`` or ``sum``).

    Its input is ``[B, classes]``; its output is one scalar for the batch.
    FLOPs per sample count one per elementwise operation: forward ``4*classes + 2``
    (max, shift, exp, sum; log and the label's pick); backward ``classes + 1``
    (normalise, subtract the one-hot) plus ``classes`` for the ``mean`` scaling.
    """

    kind: ClassVar[str] = "softmax_cross_entropy"
    classes: int
    reduction: str = "mean"

    def __post_init__(self) -> None:
        _check_positive_int("SoftmaxCrossEntropy", "classes", self.classes)
        if self.reduction not in _REDUCTIONS:
            raise UsageError(f"SoftmaxCrossEntropy reduction must be 'mean' or 'sum', not {self.reduction!r}")
        if self.name is None:
            object.__setattr__(self, "name", "loss")
        super().__post_init__()

    @property
    def input_shape(self) -> Shape:
        return (self.classes,)

    @property
    def output_shape(self) -> Shape:
        return ()

    @property
    def batched_output(self) -> bool:
        return False

    def forward_flops(self) -> int:
        return 4 * self.classes + 2

    def backward_flops(self, input_grad: bool = True) -> int:
        if not input_grad:
            return 0
        return self.classes + 1 + (self.classes if self.reduction == "mean" else 0)

    def _fields(self) -> dict[str, Any]:
        return {"classes": self.classes, "reduction": self.reduction}

    def describe(self) -> str:
        return f"SoftmaxCrossEntropy({self.classes}, {self.reduction})"
