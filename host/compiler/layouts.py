"""Each execution mode's layout: the mode-specific facts an executable keeps
about where the model lives on the fabric.

The runtime and its backends read a layout only through :class:`Layout`'s
small interface (token columns, feature rows, the tensor holding the logits,
the host copies of a step, the streamed-GEMM phase groups, a summary); what
else a mode records stays in its own class. :data:`LAYOUTS` maps a mode name
to its class, which :meth:`Layout.for_mode` finds when an executable loads.

* :class:`WeightStreamingLayout` (``weight_streaming``): tokens dealt to the
  mesh columns in contiguous blocks, features dealt to rows cyclically, a
  partial last round spread over the ring (:func:`feature_slots`).
* :class:`PipelinedLayout` (``pipelined``): every Linear layer on its own
  region of PEs, weights resident (``docs/layer_pipelined.md``); a
  *resident* layout (:attr:`Layout.resident`): the parameters and optimizer
  state live in PE memory between steps and the optimizer runs on the PEs.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import re
from types import MappingProxyType
from typing import Any, ClassVar, Mapping

import numpy as np

from wse.config import UsageError

__all__ = ["Layout", "WSLayer", "WeightStreamingLayout", "PipelinedLayout", "LAYOUTS", "register_layout",
           "spreads", "spread_activation", "feature_slots", "last_round_counter"]


def spread_activation(spread: bool, l: int, layers: int) -> bool:
    """Whether activation ``l`` (``act{l}``, ``grad{l}``, ``act{l}tm``; 0 the model input) of a
    weight-streaming plan of ``layers`` Linear layers may spread its last round: with ``spread``,
    every one but the logits (``l = layers``)."""
    return bool(spread) and l < layers


def spreads(n: int, height: int, spread: bool) -> bool:
    """Whether ``n`` features on ``height`` rows have their partial last round spread over the ring:
    with ``spread``, more features than rows and a round left partial (``n mod height != 0``)."""
    return bool(spread) and n > height and n % height != 0


@functools.lru_cache(maxsize=256)
def _slots(n: int, height: int, spread: bool) -> np.ndarray:
    slots = np.arange(n, dtype=np.int64)
    if spreads(n, height, spread):
        full, last = divmod(n, height)
        slots[full * height:] = full * height + (np.arange(last, dtype=np.int64) * height) // last
    slots.setflags(write=False)
    return slots


def feature_slots(n: int, height: int, spread: bool) -> np.ndarray:
    """The slot of each of ``n`` features dealt to ``height`` rows (read-only ``int64 [n]``):
    feature ``k`` lives on row ``slot mod height`` at local index ``slot div height``.

    Cyclic (``docs/weight_streaming.md`` section 3): slot ``k``, so rows ``0 .. E-1`` hold the
    ``E = n mod H`` features of the partial last round. Spread (:func:`spreads`): the ``R*H``
    features of the full rounds keep slot ``k``; the last round's ``j``-th feature takes slot
    ``R*H + floor(j*H/E)``, so the rows holding one feature more are spaced evenly around the
    ring. Slots increase with ``k`` either way, so a row's features keep ascending order."""
    return _slots(int(n), int(height), bool(spread))


def last_round_counter(row: int, height: int, n: int, spread: bool) -> tuple[int, int]:
    """``(e0, e_step)`` of the streamed GEMM's last round on ``row`` for ``n`` outputs (the
    ``sgemm`` record's fields): its step ``p`` serves the output homed on row
    ``h = (row - 1 - p) mod H`` and is live when its counter ``e`` (``e0`` at ``p = 0``, then
    less ``e_step`` mod ``H`` per step) is below ``E = n mod H``. Cyclic: ``e = h``, ``e_step = 1``.
    Spread: ``e = -h*E mod H``, ``e_step = H - E``; ``e < E`` holds exactly when some ``j`` has
    ``h = floor(j*H/E)`` (there is an integer ``j`` in ``[h*E/H, (h+1)*E/H)``, namely
    ``ceil(h*E/H) = (h*E + e)/H``), the rows of :func:`feature_slots`."""
    home = (row - 1) % height
    if not spreads(n, height, spread):
        return home, 1
    last = n % height
    return (-home * last) % height, height - last


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

    def slots(self, tensor: str, n: int) -> np.ndarray:
        """:func:`feature_slots` of tensor ``tensor``'s ``n`` features on :attr:`feature_rows` rows:
        cyclic, unless the mode spreads a partial last round (its override)."""
        return feature_slots(n, self.feature_rows, False)

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
        cyclically, feature ``k`` to row ``k mod height``, but see ``spread``.
    columns:
        Columns holding tokens (``min(width, batch)``).
    tokens, token_start:
        Token count and first token of each of those columns.
    reason:
        Why this mode was chosen (for the plan a person reads; an executable written before the field
        existed loads with none).
    spread:
        Whether the activations but the logits spread a partial last round over the ring
        (:func:`feature_slots`, :meth:`slots`; an executable written before the field existed loads
        with ``False``: every tensor cyclic).
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
    spread: bool = False

    @property
    def logits(self) -> str:
        return f"act{len(self.layers)}"

    def spread_tensor(self, tensor: str) -> bool:
        """Whether activation tensor ``tensor`` (``act{l}``, ``grad{l}`` or ``act{l}tm``) may spread its
        last round: with :attr:`spread`, every one but the logits' and their gradient's."""
        match = re.fullmatch(r"(?:act|grad)(\d+)(?:tm)?", tensor)
        if match is None:
            raise UsageError(f"tensor must be named act<l>, grad<l> or act<l>tm, not {tensor!r}")
        return spread_activation(self.spread, int(match.group(1)), len(self.layers))

    def slots(self, tensor: str, n: int) -> np.ndarray:
        """:func:`feature_slots` of tensor ``tensor``'s ``n`` features on this layout's rows."""
        return feature_slots(n, self.height, self.spread_tensor(tensor))

    @property
    def feature_rows(self) -> int:
        return self.height

    def token_blocks(self) -> list[range]:
        return [range(start, start + count) for start, count in zip(self.token_start, self.tokens)]

    def describe(self) -> list[str]:
        rounds = "; a partial last round spread over the ring" if self.spread else ""
        lines = [f"tokens per column: {', '.join(str(t) for t in self.tokens)}; features dealt to rows cyclically"
                 f"{rounds}"] if self.tokens else []
        return lines + ([f"  why: {self.reason}"] if self.reason else [])

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [dataclasses.asdict(layer) for layer in self.layers], "relu_input": self.relu_input,
                "height": self.height, "columns": self.columns, "tokens": list(self.tokens),
                "token_start": list(self.token_start), "reason": self.reason, "spread": self.spread}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "WeightStreamingLayout":
        return cls(tuple(WSLayer(**layer) for layer in data["layers"]), data["relu_input"], data["height"],
                   data["columns"], tuple(data["tokens"]), tuple(data["token_start"]), data.get("reason", ""),
                   bool(data.get("spread", False)))


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
