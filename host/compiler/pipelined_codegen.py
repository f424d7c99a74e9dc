"""Code generation of the layer-pipelined mode: a
:class:`~.pipelined.PipelinedPlan` in, an :class:`~.executable.Executable` out
(``docs/layer_pipelined.md`` section 7).

The executable holds what weight streaming's does: the PE program
(``pipe.s``), the routes of every region (loaded once), each phase's op lists
as static memory images, the phases with their FMACs and their cycles from the
static cycle model (:mod:`.pipelined_cycles`), the phase sequences, the memory
map and the :class:`~.layouts.PipelinedLayout` (regions, samples in flight,
the optimizer the PEs run). A step of ``batch`` samples runs in passes of
``in_flight`` samples, so the ``"train"`` sequence names the forward and
backward phases once per pass, then the update; ``"eval"`` the forward phase
once per pass.

:func:`samples_in_flight` chooses the largest pass that fits PE memory;
:func:`plan_of` rebuilds the plan of a loaded executable (placement and
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
from .schedule import Phase
from .weight_streaming import FitError

__all__ = ["OnChipOptimizer", "samples_in_flight", "generate", "plan_of", "passes_of"]


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


def samples_in_flight(graph: Graph, config: FabricConfig, batch: int, optimizer=None) -> int:
    """Samples per pass for steps of ``batch``: the fewest passes whose plan fits PE
    memory, with the samples dealt evenly over them (``ceil(batch / passes)``), so
    the last pass carries as little padding as it can (64 samples with at most
    30 in flight: passes of 22, 22 and 20, not 30, 30 and 4).

    Raises
    ------
    FitError
        If not even one sample in flight fits (the message of that plan: every
        consumer of PE memory), or the layers cannot be placed.
    UsageError
        For a bad batch or an optimizer the PEs do not run.
    """
    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    pipelined.plan(graph, config, 1, optimizer)          # raises what keeps even one sample out
    low, high = 1, int(batch)
    while low < high:                                    # memory grows with the samples in flight
        mid = (low + high + 1) // 2
        try:
            pipelined.plan(graph, config, mid, optimizer)
            low = mid
        except FitError:
            high = mid - 1
    return -(-int(batch) // passes_of(int(batch), low))


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


def generate(plan, batch: int, reason: str = "") -> Executable:
    """The executable of a layer-pipelined ``plan`` for steps of ``batch`` samples
    (``plan.batch`` of them in flight per pass), cycles included; ``reason``
    says why the mode was chosen."""
    route_check.check_pipelined(plan)    # no route set that can deadlock leaves the compiler
    cycles = phase_cycles(plan)
    phases = {name: Phase(name, _group(name), int(addr), (), (), (), int(pe_fmacs(plan, name).sum()), cycles[name])
              for name, (addr, _) in plan.phases.items()}
    n = passes_of(batch, plan.batch)
    seq = {name: list(names) for name, names in plan.sequences.items()}
    seq["eval"] = ["forward"] * n
    if plan.optimizer is not None:
        seq["train"] = seq["first_pass"] + seq["pass"] * (n - 1) + seq["update"]
    else:
        seq["train"] = list(seq["eval"])
    optimizer = OnChipOptimizer.of(plan.optimizer)
    layout = PipelinedLayout(tuple(plan.layers), tuple(dataclasses.astuple(r) for r in plan.regions), plan.batch,
                             None if optimizer is None else optimizer.to_dict(), reason)
    return Executable(graph=plan.graph, config=plan.config, batch=batch, mode=PipelinedLayout.mode,
                      program=pipelined_program(plan.config), routes=list(plan.routes),
                      static=[(addr, _image(plan, name)) for name, (addr, _) in plan.phases.items()],
                      transfers={}, phases=phases, sequences=seq, regions=dict(plan.memory), layout=layout)


def _routes(routes) -> list:
    return [(int(x), int(y), int(c), None if i is None else int(i), tuple(int(p) for p in outs))
            for x, y, c, i, outs in routes]


def plan_of(executable: Executable):
    """The :class:`~.pipelined.PipelinedPlan` of a layer-pipelined executable,
    rebuilt from its graph, fabric, samples in flight and optimizer.

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
    plan = pipelined.plan(executable.graph, executable.config, layout.in_flight, OnChipOptimizer.of(layout.optimizer))
    same = (dict(plan.memory) == {k: tuple(v) for k, v in executable.regions.items()}
            and _routes(plan.routes) == _routes(executable.routes)
            and all(np.array_equal(_image(plan, name), image)
                    for (name, _), (_, image) in zip(plan.phases.items(), executable.static)))
    if not same:
        raise UsageError(f"executable {executable.graph.name} of the pipelined mode does not match what this "
                         "version of the compiler places; compile the model again")
    return plan
