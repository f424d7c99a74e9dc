"""The layer IR: a model as a straight sequence of layers with shapes.

A :class:`Graph` is what the front end produces and what every mapper reads.
It holds layers in execution order, starting with :class:`Input` and optionally
ending with a loss. Shapes are *per sample*: the batch dimension is leading and
symbolic (written ``B`` in summaries), so the same graph serves any batch size.

The IR is deliberately mode-agnostic. It records what the model computes
(shapes, parameters, FLOPs) and nothing about where it runs; weight streaming,
layer pipelining or a blend are chosen by the mappers, which keep their
placements elsewhere or, where a plan travels with the graph, as namespaced
annotations (:meth:`Graph.annotate`) that serialize with it.

Everything converts to and from plain JSON-able dicts (:meth:`Graph.to_dict`,
:meth:`Graph.from_dict`). The layers themselves live in :mod:`.layers`.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any, Iterator, Mapping, Sequence

from wse.config import UsageError

from .layers import Flatten, Input, Layer, Linear, ReLU, Shape, SoftmaxCrossEntropy, format_shape

__all__ = [
    "Shape", "Layer", "Input", "Flatten", "Linear", "ReLU", "SoftmaxCrossEntropy",
    "Graph", "IR_FORMAT", "IR_VERSION", "format_shape",
]

#: Identifies a serialized graph.
IR_FORMAT = "wse-layer-ir"
#: Bumped whenever the meaning of a serialized field changes.
IR_VERSION = 1


class Graph:
    """A model as layers in execution order, with per-sample shapes.

    Parameters
    ----------
    layers:
        The layers; the first is the one :class:`Input`, each layer's input
        shape is the previous layer's output shape, and a loss, if any, is last.
        Layers without a name get a unique one from their kind (``relu``,
        ``relu_1``, ...).
    name:
        The model's name (the front end uses the ``nn.Module`` class name).
    annotations:
        ``{mode: {layer name: {key: JSON value}}}`` as produced by
        :meth:`to_dict`; see :meth:`annotate`.

    Layers are immutable; only annotations change after construction.

    Raises
    ------
    UsageError
        If the layers do not form a valid chain (the message names the layer).
    """

    def __init__(self, layers: Sequence[Layer], name: str = "model",
                 annotations: Mapping[str, Mapping[str, Mapping[str, Any]]] | None = None) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"graph name must be a non-empty string, not {name!r}")
        self.name = name
        self._layers = self._name_layers(list(layers))
        self._by_name = {layer.name: i for i, layer in enumerate(self._layers)}
        self._check_chain()
        self._annotations: dict[str, dict[str, dict[str, Any]]] = {}
        for mode, per_layer in (annotations or {}).items():
            if not isinstance(per_layer, Mapping):
                raise UsageError(f"annotations of mode {mode!r} must map layer names to dicts, "
                                 f"not {per_layer!r}")
            for layer_name, values in per_layer.items():
                if not isinstance(values, Mapping):
                    raise UsageError(f"annotation of layer {layer_name!r} in mode {mode!r} must be a dict, "
                                     f"not {values!r}")
                self.annotate(mode, layer_name, **values)

    # -- construction checks ---------------------------------------------
    @staticmethod
    def _name_layers(layers: list[Layer]) -> tuple[Layer, ...]:
        for layer in layers:
            if not isinstance(layer, Layer):
                raise UsageError(f"graph layers must be Layer objects, not {layer!r}")
        taken = {layer.name for layer in layers if layer.name is not None}
        named = []
        for layer in layers:
            if layer.name is None:
                candidate, n = layer.kind, 0
                while candidate in taken:
                    n += 1
                    candidate = f"{layer.kind}_{n}"
                taken.add(candidate)
                layer = dataclasses.replace(layer, name=candidate)
            named.append(layer)
        return tuple(named)

    def _check_chain(self) -> None:
        layers = self._layers
        if not layers or not isinstance(layers[0], Input):
            raise UsageError("a graph must start with an Input layer")
        seen: set[str] = set()
        params: set[str] = set()
        for i, layer in enumerate(layers):
            if layer.name in seen:
                raise UsageError(f"layer names must be unique; {layer.name!r} appears twice")
            seen.add(layer.name)
            for key in layer.parameters():
                if key in params:
                    raise UsageError(f"parameter names must be unique; {key!r} belongs to two layers")
                params.add(key)
            if i == 0:
                continue
            if isinstance(layer, Input):
                raise UsageError(f"a graph has one Input layer; {layer.name!r} is a second one")
            previous = layers[i - 1]
            if not previous.batched_output:
                raise UsageError(f"the loss {previous.name!r} must be the last layer, "
                                 f"but {layer.name!r} follows it")
            if layer.input_shape != previous.output_shape:
                raise UsageError(
                    f"layer {layer.name!r} takes {format_shape(layer.input_shape)} but {previous.name!r} "
                    f"produces {format_shape(previous.output_shape)}")

    # -- access ----------------------------------------------------------
    @property
    def layers(self) -> tuple[Layer, ...]:
        """All layers in execution order."""
        return self._layers

    def __iter__(self) -> Iterator[Layer]:
        return iter(self._layers)

    def __len__(self) -> int:
        return len(self._layers)

    def layer(self, name: str) -> Layer:
        """The layer called ``name``; raises :class:`UsageError` if there is none."""
        try:
            return self._layers[self._by_name[name]]
        except (KeyError, TypeError):
            raise UsageError(f"graph {self.name!r} has no layer {name!r}") from None

    def index(self, name: str) -> int:
        """Position of layer ``name`` in execution order."""
        self.layer(name)
        return self._by_name[name]

    @property
    def input(self) -> Input:
        """The input layer."""
        return self._layers[0]

    @property
    def loss(self) -> SoftmaxCrossEntropy | None:
        """The loss layer, or ``None`` for a graph without one (inference)."""
        last = self._layers[-1]
        return last if isinstance(last, SoftmaxCrossEntropy) else None

    @property
    def output_shape(self) -> Shape:
        """Per-sample shape of the model's output (before any loss)."""
        body = self._layers[:-1] if self.loss is not None else self._layers
        return body[-1].output_shape

    @property
    def linears(self) -> list[Linear]:
        """The Linear layers in execution order."""
        return [layer for layer in self._layers if isinstance(layer, Linear)]

    def parameters(self) -> dict[str, Shape]:
        """``{state_dict key: shape}`` in streaming order: the forward pass
        order of layers, weight before bias (the backward pass streams them in
        reverse layer order)."""
        out: dict[str, Shape] = {}
        for layer in self._layers:
            out.update(layer.parameters())
        return out

    @property
    def parameter_count(self) -> int:
        """Trainable scalars of the whole model."""
        return sum(layer.parameter_count for layer in self._layers)

    def needs_input_grad(self, name: str) -> bool:
        """Whether the backward pass of layer ``name`` must produce its input
        gradient: true when a layer with parameters precedes it."""
        idx = self.index(name)
        return any(layer.parameters() for layer in self._layers[:idx])

    def forward_flops(self) -> int:
        """Forward FLOPs of the whole model, per sample."""
        return sum(layer.forward_flops() for layer in self._layers)

    def backward_flops(self) -> int:
        """Backward FLOPs of the whole model, per sample (input gradients are
        counted only where a layer with parameters precedes)."""
        total, trainable_before = 0, False
        for layer in self._layers:
            total += layer.backward_flops(input_grad=trainable_before)
            trainable_before = trainable_before or bool(layer.parameters())
        return total

    # -- annotations -----------------------------------------------------
    def annotate(self, mode: str, layer: str, **values: Any) -> None:
        """Attach mode-specific facts to a layer, e.g.
        ``graph.annotate("pipelined", "fc1", rows=4, cols=8)``.

        ``mode`` is a free namespace owned by one mapper, so modes never
        collide; values must be JSON-able and merge into earlier ones.

        Raises
        ------
        UsageError
            If the layer does not exist or ``mode`` is not a non-empty string.
        TypeError
            If a value cannot be serialized to JSON.
        """
        if not isinstance(mode, str) or not mode:
            raise UsageError(f"annotation mode must be a non-empty string, not {mode!r}")
        self.layer(layer)
        try:
            json.dumps(values, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"annotations of layer {layer!r} must be JSON-able: {exc}") from None
        self._annotations.setdefault(mode, {}).setdefault(layer, {}).update(copy.deepcopy(values))

    def annotation(self, mode: str, layer: str) -> dict[str, Any]:
        """A copy of the values annotated on ``layer`` under ``mode`` (``{}`` if none)."""
        self.layer(layer)
        return copy.deepcopy(self._annotations.get(mode, {}).get(layer, {}))

    @property
    def modes(self) -> tuple[str, ...]:
        """The annotation namespaces present."""
        return tuple(self._annotations)

    def clear_annotations(self, mode: str | None = None) -> None:
        """Drop the annotations of ``mode``, or of every mode when ``None``."""
        if mode is None:
            self._annotations.clear()
        else:
            self._annotations.pop(mode, None)

    # -- serialization ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The graph as a JSON-able dict (``json.dumps`` works on it)."""
        return {
            "format": IR_FORMAT,
            "version": IR_VERSION,
            "name": self.name,
            "layers": [layer.to_dict() for layer in self._layers],
            "annotations": copy.deepcopy(self._annotations),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Graph":
        """Rebuild a graph from :meth:`to_dict` output.

        Raises
        ------
        UsageError
            If ``data`` is not a serialized graph of this format and version.
        """
        if not isinstance(data, Mapping) or data.get("format") != IR_FORMAT:
            got = data.get("format") if isinstance(data, Mapping) else type(data).__name__
            raise UsageError(f"a serialized graph must have format {IR_FORMAT!r}, not {got!r}")
        if data.get("version") != IR_VERSION:
            raise UsageError(f"serialized graph version must be {IR_VERSION}, not {data.get('version')!r}")
        layers = data.get("layers")
        if not isinstance(layers, list):
            raise UsageError(f"serialized graph layers must be a list, not {layers!r}")
        annotations = data.get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise UsageError(f"serialized graph annotations must be a dict, not {annotations!r}")
        return cls([Layer.from_dict(item) for item in layers], name=data.get("name", "model"),
                   annotations=annotations)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Graph):
            return NotImplemented
        return self.to_dict() == other.to_dict()

    __hash__ = None  # annotations are mutable

    def __repr__(self) -> str:
        kinds = ", ".join(layer.describe() for layer in self._layers)
        return f"Graph({self.name!r}: {kinds})"

    def summary(self) -> str:
        """A readable table: one row per layer with shapes, parameters and
        per-sample FLOPs, then totals."""
        header = ("#", "layer", "op", "input", "output", "params", "fwd FLOPs", "bwd FLOPs")
        rows = []
        trainable_before = False
        for i, layer in enumerate(self._layers):
            rows.append((
                str(i), layer.name, layer.describe(), format_shape(layer.input_shape),
                format_shape(layer.output_shape, layer.batched_output), f"{layer.parameter_count:,}",
                f"{layer.forward_flops():,}", f"{layer.backward_flops(trainable_before):,}"))
            trainable_before = trainable_before or bool(layer.parameters())
        total = ("", "total", "", "", "", f"{self.parameter_count:,}",
                 f"{self.forward_flops():,}", f"{self.backward_flops():,}")
        widths = [max(len(row[c]) for row in (header, *rows, total)) for c in range(len(header))]
        right = {0, 5, 6, 7}

        def line(row: Sequence[str]) -> str:
            cells = [cell.rjust(width) if c in right else cell.ljust(width)
                     for c, (cell, width) in enumerate(zip(row, widths))]
            return "  ".join(cells).rstrip()

        rule = "-" * len(line(header))
        title = (f"{self.name}: {len(self._layers)} layers, {self.parameter_count:,} parameters "
                 f"(shapes per sample, B = batch; FLOPs per sample)")
        return "\n".join([title, line(header), rule, *map(line, rows), rule, line(total)])
