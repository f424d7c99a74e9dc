"""Code generation of the layer-pipelined mode: a
:class:`~.pipelined.PipelinedPlan` in, an :class:`~.executable.Executable` out
(``docs/layer_pipelined.md`` section 7).

The executable holds what weight streaming's does: the PE program
(``pipe.s``), the routes of every region (loaded once), each phase's op lists
as static memory images, the phases with their FMACs and their cycles from the
static cycle model (:mod:`.pipelined_cycles`), the phase sequences, the memory
map and the :class:`~.layouts.PipelinedLayout` (regions, samples in flight,
the optimizer the PEs run, the copies of the pipeline). A step of ``batch``
samples runs in passes of ``in_flight`` samples, so the ``"train"`` sequence
names the forward and backward phases once per pass, then (with copies, the
``reduce`` phase and) the update; ``"eval"`` the forward phase once per pass.

:func:`samples_in_flight` chooses the largest pass that fits PE memory;
:func:`choose_step_replicas` the number of copies that trains the most samples
per cycle; :func:`plan_of` rebuilds the plan of a loaded executable (placement and
records are deterministic) and checks it against what the file holds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from wse.config import FabricConfig, UsageError
from wse.firmware.training.pipe import pipelined_program

from . import pipelined, route_check
from .executable import Executable
from .ir import Graph
from .layouts import PipelinedLayout
from .pipelined_cycles import pe_fmacs, phase_cycles
from .pipelined_reduce import conveyor_stages
from .schedule import Phase
from .weight_streaming import FitError

__all__ = ["OnChipOptimizer", "samples_in_flight", "step_phases", "choose_step_replicas", "generate", "plan_of",
           "passes_of"]


@dataclasses.dataclass(frozen=True)
class OnChipOptimizer:
    """The optimizer the PEs run, as a plan reads it (``name``, ``hyper``); the
    compiler's own copy of :class:`~wse.host.memoryx.OptimizerConfig`'s fields.

    Members
    -------
    name:
        ``"sgd"`` (the PEs run nothing else).
    hyper:
        ``lr``, ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``.
    """
    name: str
    hyper: Mapping[str, Any]

    @classmethod
    def of(cls, optimizer) -> "OnChipOptimizer | None":
        """From an object with ``name`` and ``hyper`` (an ``OptimizerConfig``), a
        ``{"name", "hyper"}`` dict, or None."""
        if optimizer is None:
            return None
        if isinstance(optimizer, Mapping):
            return cls(str(optimizer["name"]), dict(optimizer["hyper"]))
        if not hasattr(optimizer, "name") or not hasattr(optimizer, "hyper"):
            raise UsageError(f"optimizer must be an OptimizerConfig, not {type(optimizer).__name__}")
        return cls(str(optimizer.name), dict(optimizer.hyper))

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., "hyper": {...}}`` (JSON-ready)."""
        return {"name": self.name, "hyper": {k: list(v) if isinstance(v, tuple) else v
                                             for k, v in self.hyper.items()}}


def samples_in_flight(graph: Graph, config: FabricConfig, batch: int, optimizer=None, replicas: int = 1) -> int:
    """Samples per pass for steps of ``batch``: the fewest passes whose plan fits PE
    memory, with the samples dealt evenly over them (``ceil(batch / passes)``), so
    the last pass carries as little padding as it can (64 samples with at most
    30 in flight: passes of 22, 22 and 20, not 30, 30 and 4). With ``replicas``
    copies of the pipeline a pass's samples are dealt over the copies, so PE
    memory holds a shard of the pass (about ``1/replicas`` of it) and a pass
    has at least one sample per copy.

    Raises
    ------
    FitError
        If not even one sample per copy fits (the message of that plan: every
        consumer of PE memory), or the layers cannot be placed.
    UsageError
        For a bad batch or number of replicas, a batch smaller than the replicas,
        or an optimizer the PEs do not run.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    if isinstance(replicas, bool) or not isinstance(replicas, (int, np.integer)) or replicas < 1:
        raise UsageError(f"replicas must be a positive integer, not {replicas!r}")
    k = int(replicas)
    if batch < k:
        raise UsageError(f"batch {batch} is smaller than the {k} replicas; each takes at least one sample")
    pipelined.plan(graph, config, k, optimizer, replicas=k)     # raises what keeps even one sample per copy out
    low, high = k, int(batch)
    while low < high:                                    # memory grows with the samples in flight
        mid = (low + high + 1) // 2
        try:
            pipelined.plan(graph, config, mid, optimizer, replicas=k)
            low = mid
        except FitError:
            high = mid - 1
    return max(k, -(-int(batch) // passes_of(int(batch), low)))


def step_phases(plan, batch: int) -> list[str]:
    """The phases of a training step of ``batch`` samples that is not a run's first
    (``plan.batch`` samples per pass; with replicas the ``reduce`` phase before the
    update), or of an evaluation of ``batch`` samples for a plan without an optimizer."""
    n = passes_of(batch, plan.batch)
    seq = plan.sequences
    if plan.optimizer is None:
        return list(seq["eval"]) * n
    return seq["first_pass"] + seq["pass"] * (n - 1) + seq["update"]


def choose_step_replicas(graph: Graph, config: FabricConfig, batch: int,
                         optimizer=None) -> tuple[int, dict[int, int], str]:
    """``(replicas, {replicas: cycles of a step}, why)``: the number of copies of the
    pipeline (1, 2, 4, ... up to the mesh's width and ``batch``) that trains the most
    samples per cycle on ``config``'s mesh, each with the samples in flight that
    :func:`samples_in_flight` gives it: the fewest cycles of a step of ``batch``
    samples (a step that is not a run's first, :func:`step_phases`, from the static
    cycle model, so the golden model's), the fewer copies on a tie. Counts whose plan
    does not fit (PE memory, colors, the strips' width) are left out and named in
    ``why``. Without an optimizer the step is an evaluation of ``batch`` samples.

    Raises
    ------
    FitError
        If not even one copy fits (:func:`samples_in_flight`'s error).
    """
    cycles: dict[int, int] = {}
    refused: dict[int, str] = {}
    k = 1
    while k <= min(config.width, batch):
        try:
            in_flight = samples_in_flight(graph, config, batch, optimizer, replicas=k)
            plan = pipelined.plan(graph, config, in_flight, optimizer, replicas=k)
        except FitError as exc:
            if k == 1:
                raise
            refused[k] = str(exc)
        else:
            counts = phase_cycles(plan)
            cycles[k] = sum(counts[name] for name in step_phases(plan, batch))
        k *= 2
    best = min(cycles, key=lambda n: (cycles[n], n))
    what = "step" if optimizer is not None else "forward pass"

    def rate(n: int) -> str:
        return f"{n} {'copies' if n > 1 else 'copy'} {cycles[n]:,} ({batch * 1e6 / cycles[n]:,.0f} samples per 1M cycles)"

    why = (f"the most samples per cycle: cycles of a {what} of {batch} samples with " +
           ", ".join(rate(n) for n in sorted(cycles)))
    if refused:
        first = min(refused)
        why += f"; {', '.join(str(n) for n in sorted(refused))} copies do not fit (with {first}: {refused[first]})"
    return best, cycles, why


def passes_of(batch: int, in_flight: int) -> int:
    """Passes of a step of ``batch`` samples with ``in_flight`` samples per pass."""
    return -(-int(batch) // int(in_flight))


def _image(plan, name: str) -> np.ndarray:
    cfg = plan.config
    image = np.zeros((cfg.height, cfg.width, plan.memory[f"ops:{name}"][1]), dtype=np.uint32)
    for y, row in enumerate(plan.phases[name][1]):
        for x, ops in enumerate(row):
            if ops:
                flat = np.concatenate(ops)
                image[y, x, :flat.size] = flat
    return image


def _group(name: str) -> str:
    return name.split("_")[0]


def _stages(plan):
    """``plan`` as the deadlock check reads it: the ``reduce`` phase (replicas) as its two
    conveyors' stages, which every PE runs one after the other (:func:`~.pipelined_reduce.conveyor_stages`)."""
    if "reduce" not in plan.phases:
        return plan
    addr, grid = plan.phases["reduce"]
    east, west = conveyor_stages(grid)
    phases = {name: value for name, value in plan.phases.items() if name != "reduce"}
    phases.update({"reduce (east conveyor)": (addr, east), "reduce (west conveyor)": (addr, west)})
    return dataclasses.replace(plan, phases=phases)


def generate(plan, batch: int, reason: str = "", replicas_reason: str = "") -> Executable:
    """The executable of a layer-pipelined ``plan`` for steps of ``batch`` samples
    (``plan.batch`` of them in flight per pass, over ``plan.replicas`` copies of the
    pipeline), cycles included; ``reason`` says why the mode was chosen,
    ``replicas_reason`` why that many copies."""
    route_check.check_pipelined(_stages(plan))    # no route set that can deadlock leaves the compiler
    cycles = phase_cycles(plan)
    phases = {name: Phase(name, _group(name), int(addr), (), (), (), int(pe_fmacs(plan, name).sum()), cycles[name])
              for name, (addr, _) in plan.phases.items()}
    n = passes_of(batch, plan.batch)
    seq = {name: list(names) for name, names in plan.sequences.items()}
    seq["eval"] = ["forward"] * n
    seq["train"] = step_phases(plan, batch)
    optimizer = OnChipOptimizer.of(plan.optimizer)
    layout = PipelinedLayout(tuple(plan.layers), tuple(dataclasses.astuple(r) for r in plan.regions), plan.batch,
                             None if optimizer is None else optimizer.to_dict(), reason, plan.replicas,
                             replicas_reason)
    return Executable(graph=plan.graph, config=plan.config, batch=batch, mode=PipelinedLayout.mode,
                      program=pipelined_program(plan.config), routes=list(plan.routes),
                      static=[(addr, _image(plan, name)) for name, (addr, _) in plan.phases.items()],
                      transfers={}, phases=phases, sequences=seq, regions=dict(plan.memory), layout=layout)


def _routes(routes) -> list:
    return [(int(x), int(y), int(c), None if i is None else int(i), tuple(int(p) for p in outs))
            for x, y, c, i, outs in routes]


def plan_of(executable: Executable):
    """The :class:`~.pipelined.PipelinedPlan` of a layer-pipelined executable,
    rebuilt from its graph, fabric, samples in flight, optimizer and replicas.

    Raises
    ------
    UsageError
        If the executable is not of the layer-pipelined mode, or the rebuilt
        plan's memory map, routes or op lists differ from the file's (an
        executable written by another version of the compiler).
    """
    layout = executable.layout
    if not isinstance(layout, PipelinedLayout):
        raise UsageError(f"executable must be of the pipelined mode, not {executable.mode!r}")
    plan = pipelined.plan(executable.graph, executable.config, layout.in_flight, OnChipOptimizer.of(layout.optimizer),
                          replicas=layout.replicas)
    same = (dict(plan.memory) == {k: tuple(v) for k, v in executable.regions.items()}
            and _routes(plan.routes) == _routes(executable.routes)
            and all(np.array_equal(_image(plan, name), image)
                    for (name, _), (_, image) in zip(plan.phases.items(), executable.static)))
    if not same:
        raise UsageError(f"executable {executable.graph.name} of the pipelined mode does not match what this "
                         "version of the compiler places; compile the model again")
    return plan
