"""Mappers: from the layer IR to a placement and schedule on the fabric.

A :class:`Mapper` turns a :class:`~wse.host.compiler.ir.Graph` into an
:class:`~wse.host.compiler.executable.Executable` for one execution mode. The
modes sit side by side in :data:`MAPPERS`; :func:`compile_model` picks one by
name, and :func:`choose_mode` is where an automatic choice between them
belongs (weight streaming is the only mode so far, so it always wins).

* ``weight_streaming`` (:mod:`.weight_streaming`): activations stay on the
  wafer, weights stream in layer by layer, gradients stream out to MemoryX.
* ``pipelined`` (to come): all weights resident, samples streaming through.
  It will register a mapper here with its own plan and its own layout
  (:func:`~.layouts.register_layout`); the executable format, the runtime and
  the backends are mode-agnostic (they read a layout only through
  :class:`~.layouts.Layout`).
"""

from __future__ import annotations

import abc

from wse.config import FabricConfig, UsageError

from .executable import Executable
from .ir import Graph

__all__ = ["Mapper", "WeightStreamingMapper", "MAPPERS", "register_mapper", "choose_mode", "compile_graph",
           "compile_model"]


class Mapper(abc.ABC):
    """One execution mode's mapper.

    Members
    -------
    mode:
        The mode's name, as :func:`compile_model` takes it.
    """

    mode: str = ""

    @abc.abstractmethod
    def fits(self, graph: Graph, config: FabricConfig, batch: int) -> str | None:
        """``None`` if the model and batch fit the fabric in this mode, else the
        reason (one sentence stating what is needed and what is available)."""

    @abc.abstractmethod
    def compile(self, graph: Graph, config: FabricConfig, batch: int) -> Executable:
        """Map ``graph`` and generate its executable.

        Raises
        ------
        UsageError
            (a :class:`~wse.host.compiler.weight_streaming.FitError` when it does
            not fit) with a message naming what is needed and what is available.
        """


class WeightStreamingMapper(Mapper):
    """The weight-streaming mode (``docs/weight_streaming.md``)."""

    mode = "weight_streaming"

    def fits(self, graph: Graph, config: FabricConfig, batch: int) -> str | None:
        from .weight_streaming import FitError, plan
        try:
            plan(graph, config, batch)
        except FitError as exc:
            return str(exc)
        return None

    def compile(self, graph: Graph, config: FabricConfig, batch: int) -> Executable:
        from .codegen import generate
        from .weight_streaming import plan
        return generate(plan(graph, config, batch))


#: Mode name -> mapper.
MAPPERS: dict[str, Mapper] = {"weight_streaming": WeightStreamingMapper()}


def register_mapper(mapper: Mapper) -> None:
    """Make ``mapper`` available under ``mapper.mode``."""
    if not isinstance(mapper, Mapper) or not mapper.mode:
        raise UsageError(f"mapper must be a Mapper with a mode name, not {mapper!r}")
    MAPPERS[mapper.mode] = mapper


def choose_mode(graph: Graph, config: FabricConfig, batch: int) -> str:
    """The execution mode for ``graph``: the first registered mode it fits.

    Raises
    ------
    UsageError
        If it fits no mode; the message gives each mode's reason.
    """
    reasons = []
    for mode, mapper in MAPPERS.items():
        reason = mapper.fits(graph, config, batch)
        if reason is None:
            return mode
        reasons.append(f"{mode}: {reason}")
    raise UsageError(f"model {graph.name} fits no execution mode: " + "; ".join(reasons))


def compile_graph(graph: Graph, *, config: FabricConfig, batch: int, mode: str = "weight_streaming") -> Executable:
    """Compile a layer graph (with its loss) into an executable.

    Parameters
    ----------
    graph:
        From :func:`~wse.host.compiler.trace`, ending with ``SoftmaxCrossEntropy``.
    config:
        The fabric.
    batch:
        Samples per training step.
    mode:
        A key of :data:`MAPPERS`, or ``"auto"`` for :func:`choose_mode`.

    Raises
    ------
    UsageError
        For an unknown mode, a graph without a supported loss, or a model that
        does not fit (what is needed and what is available).
    """
    if not isinstance(config, FabricConfig):
        raise UsageError(f"config must be a FabricConfig, not {type(config).__name__}")
    if mode == "auto":
        mode = choose_mode(graph, config, batch)
    mapper = MAPPERS.get(mode) if isinstance(mode, str) else None
    if mapper is None:
        known = ", ".join(sorted(MAPPERS))
        raise UsageError(f"mode must be one of {known} or 'auto', not {mode!r}"
                         + ("; the layer-pipelined mode is not implemented yet" if mode == "pipelined" else ""))
    return mapper.compile(graph, config, batch)


def compile_model(model, example_input, *, config: FabricConfig, batch: int, mode: str = "weight_streaming",
                  loss="cross_entropy") -> Executable:
    """Compile a PyTorch model for training on the fabric.

    Parameters
    ----------
    model:
        A ``torch.nn.Module`` the front end supports (Linear, ReLU, Flatten).
    example_input:
        A float32 batch fixing the per-sample input shape.
    config:
        The fabric.
    batch:
        Samples per training step (the executable's batch; smaller batches are padded).
    mode:
        ``"weight_streaming"`` (``"pipelined"`` later) or ``"auto"``.
    loss:
        ``"cross_entropy"`` (or ``nn.CrossEntropyLoss()`` / ``F.cross_entropy``).

    Raises
    ------
    UsageError
        :class:`~wse.host.compiler.UnsupportedModelError` from the front end,
        :class:`~wse.host.compiler.weight_streaming.FitError` when the model or
        batch does not fit, or another usage error naming the bad argument.
    """
    from .frontend import trace
    graph = trace(model, example_input, loss=loss)
    return compile_graph(graph, config=config, batch=batch, mode=mode)
