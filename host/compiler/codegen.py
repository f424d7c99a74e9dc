"""Code generation: a mapper's plan in, an :class:`~.executable.Executable` out.

The PE program is the assembled training firmware; the per-PE op lists of
every phase become static memory images; stream orders, host transfers and
phase descriptions are copied over (as :class:`~.schedule.Phase`, with the
plan's :class:`~.layouts.WeightStreamingLayout`); the cycles of every phase
come from the static cycle model (:mod:`.cycles`), unless it is skipped
(``cycles=False``: every phase's cycles read 0, and
:func:`~.cycles.executable_cycles` computes them later from the executable).
"""

from __future__ import annotations

import numpy as np

from wse.firmware.training import training_program

from . import cycles as cycle_model
from . import route_check
from .executable import Executable
from .weight_streaming import Plan

__all__ = ["generate"]


def _op_image(plan: Plan, phase) -> np.ndarray:
    """The phase's op lists as one ``uint32 [H, W, n]`` image (zero padding reads as ``end``)."""
    cfg = plan.config
    words = plan.regions[f"ops:{phase.name}"][1]
    image = np.zeros((cfg.height, cfg.width, words), dtype=np.uint32)
    for i, row in enumerate(phase.records):
        for j, ops in enumerate(row):
            if ops:
                flat = np.concatenate(ops)
                image[i, j, :flat.size] = flat
    return image


def generate(plan: Plan, *, cycles: bool = True, progress: bool = True, reason: str = "") -> Executable:
    """Build the executable of a weight-streaming plan.

    Parameters
    ----------
    cycles:
        Run the static cycle model for every phase's cycles; ``False`` leaves
        them 0 (a compile that needs only programs, routes and streams).
    progress:
        Report a cycle model that takes more than a few seconds on stderr.
    reason:
        Why the weight-streaming mode was chosen (the plan a person reads).
    """
    cfg = plan.config
    route_check.check_weight_streaming(plan)    # no route set that can deadlock leaves the compiler
    program = training_program(cfg)
    static = [(phase.ops_addr, _op_image(plan, phase)) for phase in plan.phases.values()]
    counts = cycle_model.phase_cycles(plan, program, progress=progress) if cycles else \
        dict.fromkeys(plan.phases, 0)
    phases = {name: phase.to_phase(counts[name]) for name, phase in plan.phases.items()}
    return Executable(graph=plan.graph, config=cfg, batch=plan.batch, mode="weight_streaming", program=program,
                      routes=list(plan.routes), static=static, transfers=plan.transfers, phases=phases,
                      sequences=plan.sequences, regions=plan.regions, layout=plan.layout(reason))
