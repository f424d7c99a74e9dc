"""Mappers: from the layer IR to a placement and schedule on the fabric.

A :class:`Mapper` turns a :class:`~wse.host.compiler.ir.Graph` into an
:class:`~wse.host.compiler.executable.Executable` for one execution mode. The
modes sit side by side in :data:`MAPPERS`; :func:`compile_model` picks one by
name, and :func:`choose_mode` chooses between them (``"auto"``).

* ``weight_streaming`` (:mod:`.weight_streaming`): activations stay on the
  wafer, weights stream in layer by layer, gradients stream out to MemoryX.
* ``pipelined`` (:mod:`.pipelined`, :mod:`.pipelined_codegen`): all weights
  resident, every layer on its own region, samples streaming through, the
  optimizer on the PEs (``docs/layer_pipelined.md``). It has its own layout
  (:class:`~.layouts.PipelinedLayout`); the executable format, the runtime and
  the backends read a layout only through :class:`~.layouts.Layout`.
"""

from __future__ import annotations

import abc

from wse.config import FabricConfig, UsageError

from .executable import Executable
from .ir import Graph

__all__ = ["Mapper", "WeightStreamingMapper", "PipelinedMapper", "MAPPERS", "register_mapper", "choose_mode", "compile_graph",
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
    def fits(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None) -> str | None:
        """``None`` if the model and batch (with ``optimizer``'s state where the
        mode keeps it on the fabric) fit the fabric in this mode, else the
        reason (one sentence stating what is needed and what is available)."""

    @abc.abstractmethod
    def compile(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None, reason: str = "",
                cycles: bool = True) -> Executable:
        """Map ``graph`` and generate its executable (``reason``: why the mode was chosen;
        ``cycles=False``: a mode whose static cycle model is costly may leave the phases' cycles 0).

        Raises
        ------
        UsageError
            (a :class:`~wse.host.compiler.weight_streaming.FitError` when it does
            not fit) with a message naming what is needed and what is available.
        """


class WeightStreamingMapper(Mapper):
    """The weight-streaming mode (``docs/weight_streaming.md``)."""

    mode = "weight_streaming"

    def fits(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None) -> str | None:
        from .weight_streaming import FitError, plan
        try:
            plan(graph, config, batch)
        except FitError as exc:
            return str(exc)
        return None

    def compile(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None, reason: str = "",
                cycles: bool = True) -> Executable:
        from .codegen import generate
        from .weight_streaming import plan
        return generate(plan(graph, config, batch), cycles=cycles, reason=reason)


class PipelinedMapper(Mapper):
    """The layer-pipelined mode (``docs/layer_pipelined.md``): the optimizer runs
    on the PEs, so it is part of the plan (None: an executable that only evaluates)."""

    mode = "pipelined"

    def fits(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None) -> str | None:
        from .pipelined_codegen import samples_in_flight
        from .weight_streaming import FitError
        try:
            samples_in_flight(graph, config, batch, optimizer)
        except FitError as exc:
            return str(exc)
        except UsageError as exc:       # an optimizer the PEs do not run
            return str(exc)
        return None

    def compile(self, graph: Graph, config: FabricConfig, batch: int, optimizer=None, reason: str = "",
                cycles: bool = True, replicas: int | None = None) -> Executable:
        """As :meth:`Mapper.compile`; ``replicas``: the copies of the pipeline (None:
        :func:`~.pipelined_codegen.choose_step_replicas` picks the number that
        trains the most samples per cycle, the fewer copies on a tie)."""
        # the layer-pipelined cycle model is cheap: its cycles are always computed
        from .pipelined import plan
        from .pipelined_codegen import OnChipOptimizer, choose_step_replicas, generate, samples_in_flight
        optimizer = OnChipOptimizer.of(optimizer)
        if replicas is None:
            replicas, _, why = choose_step_replicas(graph, config, batch, optimizer)
        else:
            why = f"{replicas} {'copies were' if replicas != 1 else 'copy was'} asked for"
        in_flight = samples_in_flight(graph, config, batch, optimizer, replicas)
        return generate(plan(graph, config, in_flight, optimizer, replicas=replicas), batch, reason, why)


#: Mode name -> mapper, in the order :func:`choose_mode` tries them.
MAPPERS: dict[str, Mapper] = {"pipelined": PipelinedMapper(), "weight_streaming": WeightStreamingMapper()}


def register_mapper(mapper: Mapper) -> None:
    """Make ``mapper`` available under ``mapper.mode``."""
    if not isinstance(mapper, Mapper) or not mapper.mode:
        raise UsageError(f"mapper must be a Mapper with a mode name, not {mapper!r}")
    MAPPERS[mapper.mode] = mapper


def choose_mode(graph: Graph, config: FabricConfig, batch: int, optimizer=None) -> tuple[str, str]:
    """``(mode, why)``: the first mode of :data:`MAPPERS` that ``graph`` fits:
    layer-pipelined when the weights, the optimizer state and at least one
    sample in flight fit PE memory, else weight streaming.

    Raises
    ------
    UsageError
        If it fits no mode; the message gives each mode's reason.
    """
    reasons = []
    for mode, mapper in MAPPERS.items():
        reason = mapper.fits(graph, config, batch, optimizer)
        if reason is None:
            why = (f"the weights{', the optimizer state' if optimizer is not None else ''} and the in-flight "
                   f"activations fit PE memory on the {config.mesh} mesh" if mode == "pipelined" else
                   "; ".join(reasons))
            return mode, why
        reasons.append(f"{mode}: {reason}")
    raise UsageError(f"model {graph.name} fits no execution mode: " + "; ".join(reasons))


def compile_graph(graph: Graph, *, config: FabricConfig, batch: int, mode: str = "weight_streaming",
                  optimizer=None, cycles: bool = True) -> Executable:
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
    optimizer:
        An ``OptimizerConfig``: the optimizer the PEs run in the pipelined mode
        (ignored by weight streaming, whose optimizer runs in MemoryX).
    cycles:
        ``False`` skips weight streaming's static cycle model: every phase's
        ``cycles`` reads 0 (programs, routes and streams are the same;
        :func:`~wse.host.compiler.cycles.executable_cycles` computes the
        counts later). The layer-pipelined mode always counts them.

    Raises
    ------
    UsageError
        For an unknown mode, a graph without a supported loss, or a model that
        does not fit (what is needed and what is available).
    """
    if not isinstance(config, FabricConfig):
        raise UsageError(f"config must be a FabricConfig, not {type(config).__name__}")
    reason = f"{mode} was asked for"
    if mode == "auto":
        mode, reason = choose_mode(graph, config, batch, optimizer)
    mapper = MAPPERS.get(mode) if isinstance(mode, str) else None
    if mapper is None:
        known = ", ".join(sorted(MAPPERS))
        raise UsageError(f"mode must be one of {known} or 'auto', not {mode!r}")
    if not isinstance(cycles, bool):
        raise UsageError(f"cycles must be True or False, not {cycles!r}")
    return mapper.compile(graph, config, batch, optimizer, reason, cycles=cycles)


def compile_model(model, example_input, *, config: FabricConfig, batch: int, mode: str = "weight_streaming",
                  loss="cross_entropy", optimizer=None, cycles: bool = True) -> Executable:
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
        ``"weight_streaming"``, ``"pipelined"`` or ``"auto"``.
    loss:
        ``"cross_entropy"`` (or ``nn.CrossEntropyLoss()`` / ``F.cross_entropy``).
    optimizer:
        The ``OptimizerConfig`` the PEs run in the pipelined mode (None: an
        executable that only evaluates); weight streaming ignores it.
    cycles:
        ``False``: skip weight streaming's static cycle model (:func:`compile_graph`).

    Raises
    ------
    UsageError
        :class:`~wse.host.compiler.UnsupportedModelError` from the front end,
        :class:`~wse.host.compiler.weight_streaming.FitError` when the model or
        batch does not fit, or another usage error naming the bad argument.
    """
    from .frontend import trace
    graph = trace(model, example_input, loss=loss)
    return compile_graph(graph, config=config, batch=batch, mode=mode, optimizer=optimizer, cycles=cycles)
