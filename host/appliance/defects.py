"""``wse train --defects``: the usable mesh of a defective fabric and the runtime backend around it.

The model is compiled for the usable logical mesh that the dead parts of
``--mesh`` leave (:func:`wse.sim.defects.plan_remap`). On a device backend
(``golden``, ``vector``, ``verilator``, ``icarus``) the run drives the
physical mesh through a :class:`~wse.sim.defects.DefectDevice`, registered
as a device and a runtime backend of its own name (:func:`runtime_backend`);
the functional backends compute the logical executable's bits, which are
the physical mesh's (``docs/faults.md`` section 4), and say so. Whatever
the backend, :func:`on_defects` checks every phase's physical route set for
deadlock and gives the executable the physical mesh's cycles.
"""

from __future__ import annotations

import copy
import dataclasses

from wse.config import FabricConfig

__all__ = ["remap_of", "usable_fabric", "on_defects", "runtime_backend", "defects_text"]


def remap_of(settings):
    """The :class:`~wse.sim.defects.Remap` of a run's ``--defects`` on its mesh, or None for a perfect mesh."""
    if settings.defects is None:
        return None
    from wse.sim.defects import parse_defects, plan_remap

    return plan_remap(parse_defects(settings.defects, *settings.mesh_shape))


def usable_fabric(settings) -> FabricConfig:
    """The fabric the run's model is compiled for: the usable mesh of its defects, or the whole mesh."""
    remap = remap_of(settings)
    width, height = (remap.width, remap.height) if remap is not None else settings.mesh_shape
    return FabricConfig(width=width, height=height)


def on_defects(executable, settings):
    """The executable a run on ``settings``' defective mesh uses (``executable`` itself for a perfect mesh).

    Every phase's route set is checked for deadlock on the physical mesh,
    with the spare routers' pass-throughs (:func:`wse.host.compiler.physical.check_on_defects`);
    the executable comes back as a copy whose phases carry the physical
    mesh's cycles (the static cycle model on the physical network,
    :func:`~wse.host.compiler.physical.cycles_on_defects`: the golden
    model's count on the defective mesh), so the plan, the step cycles and
    every backend's report are the defective mesh's. A layer-pipelined
    executable that harvests activation sparsity (its forward cycles depend
    on the batch) keeps the logical mesh's cycles.

    Raises
    ------
    DeadlockError
        If a phase's physical route set can deadlock (one line, exit code 2).
    DefectError
        If a spare router would have to pass a color both ways.
    """
    remap = remap_of(settings)
    if remap is None:
        return executable
    from wse.host.compiler.physical import BatchDependentCycles, check_on_defects, cycles_on_defects

    check_on_defects(executable, remap)
    try:
        cycles = cycles_on_defects(executable, remap)
    except BatchDependentCycles:      # a harvesting layer-pipelined executable: its cycles depend on the batch
        return executable
    timed = copy.copy(executable)
    timed.phases = {name: dataclasses.replace(phase, cycles=cycles[name]) for name, phase in executable.phases.items()}
    return timed


def runtime_backend(settings) -> str:
    """The runtime backend name of a run: ``settings.backend``, or for a
    device backend with defects a registered name whose device is the
    physical mesh behind a :class:`~wse.sim.defects.DefectDevice`."""
    from wse.sim.devices import DEVICES, make_device, register_device

    remap = remap_of(settings)
    if remap is None or settings.backend not in DEVICES:
        return settings.backend
    from wse.host.runtime import BACKENDS, register_backend
    from wse.host.runtime.rtl import device_backend
    from wse.sim.defects import defect_factory

    name = f"{settings.backend} with defects {settings.defects} on {settings.mesh}"
    if name not in BACKENDS:
        physical = settings.backend
        register_device(name, defect_factory(lambda config: make_device(physical, config), remap),
                        f"{DEVICES[physical].summary}, the usable mesh around {settings.defects}", listed=False)
        register_backend(name, device_backend(name), listed=False)
    return name


def defects_text(settings) -> str:
    """Lines for the plan and the summary: the defects, the usable mesh, and how the backend treats them
    (empty for a perfect mesh)."""
    remap = remap_of(settings)
    if remap is None:
        return ""
    from wse.sim.devices import DEVICES

    how = ("the physical mesh runs the logical routes with pass-through routes in the spare rows and columns"
           if settings.backend in DEVICES else
           f"the {settings.backend} backend computes the usable mesh's executable, whose bits the defective "
           "mesh gives too")
    checked = ("every phase's physical route set is checked for deadlock; a step's cycles are the physical "
               "mesh's (the spare routers add latency)")
    return f"{remap.describe()}\n{how}\n{checked}"
