"""Each execution mode's layout: the mode-specific facts an executable keeps
about where the model lives on the fabric.

The runtime and its backends read a layout only through :class:`Layout`'s
small interface (token columns, feature rows, the tensor holding the logits,
the host copies of a step, the streamed-GEMM phase groups, a summary); what
else a mode records stays in its own class. :data:`LAYOUTS` maps a mode name
to its class, which :meth:`Layout.for_mode` finds when an executable loads.

* :class:`WeightStreamingLayout` (``weight_streaming``): tokens dealt to the
  mesh columns in contiguous blocks, features dealt to rows cyclically.
* :class:`PipelinedLayout` (``pipelined``): every Linear layer on its own
  region of PEs, weights resident (``docs/layer_pipelined.md``); a
  *resident* layout (:attr:`Layout.resident`): the parameters and optimizer
  state live in PE memory between steps and the optimizer runs on the PEs.
"""

from __future__ import annotations

import abc
import dataclasses
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

from wse.config import UsageError

__all__ = ["Layout", "WSLayer", "WeightStreamingLayout", "PipelinedLayout", "LAYOUTS", "register_layout"]


class Layout(abc.ABC):
    """What the runtime may ask of an execution mode's layout.

    Subclasses are frozen dataclasses named by :attr:`mode`; their dict form
    (:meth:`to_dict`) is what the executable file stores.
    """

    #: The execution mode (a key of :data:`LAYOUTS`).
    mode: ClassVar[str] = ""
    #: Phase groups whose FMAC elements and cycles give the FMAC utilization a step reports.
    gemm_groups: ClassVar[tuple[str, ...]] = ()
    #: Host copies in per step: transfer name (a key of the executable's ``transfers``) -> the
    #: :class:`~wse.host.runtime.backend.HostData` field it is copied from.
    host_inputs: ClassVar[Mapping[str, str]] = MappingProxyType({})
    #: The transfer the host copies the logits out through.
    host_output: ClassVar[str] = "logits"
    #: Whether the parameters (and optimizer state) stay in PE memory between steps and the
    #: optimizer runs on the PEs: then a step returns no gradients (the runtime's
    #: ``write_state``/``read_state`` move the state), else the weights come in every step.
    resident: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def logits(self) -> str:
        """The tensor of the phases' math holding the logits ``[classes, batch]``."""

    @property
    @abc.abstractmethod
    def feature_rows(self) -> int:
        """Rows a tensor's features are dealt to; the order of a GEMM's partial sums depends on it."""

    @abc.abstractmethod
    def token_blocks(self) -> list[range]:
        """The batch's tokens by mesh column, in column order (contiguous blocks)."""

    def describe(self) -> list[str]:
        """Lines for :meth:`~.executable.Executable.summary`."""
        return []

    @abc.abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The layout as a JSON-able dict."""

    @classmethod
    @abc.abstractmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Layout":
        """Rebuild a layout from :meth:`to_dict` output."""

    @staticmethod
    def for_mode(mode: str) -> type["Layout"]:
        """The layout class of execution mode ``mode``.

        Raises
        ------
        UsageError
            For a mode without a registered layout.
        """
        cls = LAYOUTS.get(mode) if isinstance(mode, str) else None
        if cls is None:
            raise UsageError(f"execution mode must be one of {', '.join(sorted(LAYOUTS))}, not {mode!r}")
        return cls


@dataclasses.dataclass(frozen=True)
class WSLayer:
    """One Linear layer as the weight-streaming mapping sees it.

    Members
    -------
    index:
        Position among the Linear layers (0 is the first).
    name, weight, bias:
        Layer name and its parameters' state_dict keys (``bias`` None without one).
    k, o:
        Input and output features.
    relu:
        Whether a ReLU follows the layer.
    """
    index: int
    name: str
    weight: str
    bias: str | None
    k: int
    o: int
    relu: bool


@dataclasses.dataclass(frozen=True)
class WeightStreamingLayout(Layout):
    """The weight-streaming layout (``docs/weight_streaming.md``).

    Members
    -------
    layers:
        The Linear layers in order, with their ReLU flags.
    relu_input:
        Whether a ReLU is applied to the model input.
    height:
        Mesh rows: the features of every activation are dealt to rows
        cyclically, feature ``k`` to row ``k mod height``.
    columns:
        Columns holding tokens (``min(width, batch)``).
    tokens, token_start:
        Token count and first token of each of those columns.
    reason:
        Why this mode was chosen (for the plan a person reads; an executable written before the field
        existed loads with none).
    """

    mode: ClassVar[str] = "weight_streaming"
    gemm_groups: ClassVar[tuple[str, ...]] = ("forward", "backward-data")
    host_inputs: ClassVar[Mapping[str, str]] = MappingProxyType(
        {"x": "x", "xtm": "x", "onehot": "onehot", "scale": "scale"})

    layers: tuple[WSLayer, ...]
    relu_input: bool
    height: int
    columns: int
    tokens: tuple[int, ...]
    token_start: tuple[int, ...]
    reason: str = ""

    @property
    def logits(self) -> str:
        return f"act{len(self.layers)}"

    @property
    def feature_rows(self) -> int:
        return self.height

    def token_blocks(self) -> list[range]:
        return [range(start, start + count) for start, count in zip(self.token_start, self.tokens)]

    def describe(self) -> list[str]:
        lines = [f"tokens per column: {', '.join(str(t) for t in self.tokens)}; features dealt to rows cyclically"
                 ] if self.tokens else []
        return lines + ([f"  why: {self.reason}"] if self.reason else [])

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [dataclasses.asdict(layer) for layer in self.layers], "relu_input": self.relu_input,
                "height": self.height, "columns": self.columns, "tokens": list(self.tokens),
                "token_start": list(self.token_start), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WeightStreamingLayout":
        return cls(tuple(WSLayer(**layer) for layer in data["layers"]), data["relu_input"], data["height"],
                   data["columns"], tuple(data["tokens"]), tuple(data["token_start"]), data.get("reason", ""))


@dataclasses.dataclass(frozen=True)
class PipelinedLayout(Layout):
    """The layer-pipelined layout (``docs/layer_pipelined.md``).

    Members
    -------
    layers:
        The Linear layers in order, with their ReLU flags.
    regions:
        Per layer, the fields of its :class:`~.pipelined_place.Region`
        (``layer, x0, y0, cols, rows, inputs_on_columns, k, o``).
    in_flight:
        Samples per pass: a step of ``n`` samples runs ``ceil(n / in_flight)``
        forward and backward passes, then the update once.
    optimizer:
        ``{"name": ..., "hyper": {...}}``: the optimizer the PEs run (None: the
        executable only evaluates).
    reason:
        Why this mode was chosen (for the plan a person reads).
    replicas:
        Data-parallel copies of the pipeline on strips of columns side by side
        (``docs/layer_pipelined.md`` section 6b; ``regions`` are copy 0's, copy
        ``r``'s are moved east by ``r * (width // replicas)`` columns); each pass's
        ``in_flight`` samples are dealt over them. An executable written before
        the field existed loads with 1.
    replicas_reason:
        Why that many copies (the cycles of a step with each number tried).
    """

    mode: ClassVar[str] = "pipelined"
    gemm_groups: ClassVar[tuple[str, ...]] = ("forward", "backward")
    host_inputs: ClassVar[Mapping[str, str]] = MappingProxyType({})
    host_output: ClassVar[str] = "ys"
    resident: ClassVar[bool] = True

    layers: tuple[WSLayer, ...]
    regions: tuple[tuple, ...]
    in_flight: int
    optimizer: Mapping[str, Any] | None
    reason: str = ""
    replicas: int = 1
    replicas_reason: str = ""

    @property
    def logits(self) -> str:
        return "ys"

    @property
    def feature_rows(self) -> int:
        return 1

    def token_blocks(self) -> list[range]:
        # Samples enter one after the other at the first region: one block of a pass.
        return [range(0, self.in_flight)]

    def describe(self) -> list[str]:
        lines = [f"layer-pipelined: {self.in_flight} samples in flight per pass; weights"
                 f"{' and optimizer state' if self.optimizer else ''} resident in PE memory"]
        if self.replicas > 1:
            summed = "; their gradients summed on the fabric in copy order before the update" if self.optimizer else ""
            lines.append(f"  replicas: {self.replicas} copies of the pipeline on {self.replicas} equal strips of "
                         f"columns side by side (copy r moved east by r strips); a pass's {self.in_flight} samples "
                         f"dealt over them in contiguous shards{summed}")
            lines.append("  copy 0's regions (the others the same, moved east):")
        else:
            lines.append("  replicas: 1 copy of the pipeline")
        for layer, (_, x0, y0, cols, rows, on_columns, k, o) in zip(self.layers, self.regions):
            n_in, n_out = (cols, rows) if on_columns else (rows, cols)
            tile = -(-k // n_in) * -(-o // n_out)
            lines.append(f"  {layer.name} {k}->{o}: columns {x0}-{x0 + cols - 1}, rows {y0}-{y0 + rows - 1} "
                         f"({rows * cols} PEs), largest tile {tile} multiply-adds per sample")
        if self.reason:
            lines.append(f"  why: {self.reason}")
        if self.replicas_reason:
            lines.append(f"  why {self.replicas} {'copies' if self.replicas > 1 else 'copy'}: {self.replicas_reason}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [dataclasses.asdict(layer) for layer in self.layers],
                "regions": [list(region) for region in self.regions], "in_flight": self.in_flight,
                "optimizer": None if self.optimizer is None else dict(self.optimizer), "reason": self.reason,
                "replicas": self.replicas, "replicas_reason": self.replicas_reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PipelinedLayout":
        return cls(tuple(WSLayer(**layer) for layer in data["layers"]),
                   tuple(tuple(region) for region in data["regions"]), int(data["in_flight"]),
                   data["optimizer"], str(data.get("reason", "")), int(data.get("replicas", 1)),
                   str(data.get("replicas_reason", "")))


#: Execution mode -> its layout class.
LAYOUTS: dict[str, type[Layout]] = {WeightStreamingLayout.mode: WeightStreamingLayout,
                                    PipelinedLayout.mode: PipelinedLayout}


def register_layout(cls: type[Layout]) -> None:
    """Make a mode's layout class known under ``cls.mode`` (for loading executables)."""
    if not (isinstance(cls, type) and issubclass(cls, Layout)) or not cls.mode:
        raise UsageError(f"a layout must be a Layout subclass with a mode name, not {cls!r}")
    LAYOUTS[cls.mode] = cls
