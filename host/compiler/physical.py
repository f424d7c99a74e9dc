"""An executable on the physical mesh of a defect map: its deadlock check and its static cycle model.

The compilers map a model onto the usable logical mesh that a defect map
leaves (``docs/faults.md`` section 4); a :class:`~wse.sim.defects.DefectDevice`
then runs it on the physical mesh, each logical route at its physical router
and the spare routers between logical neighbours passing colors through.
This module runs the compiler's two static models on that physical network,
from the executable alone (its routes, op images and weight streams; a
layer-pipelined executable's plan is rebuilt from it):

* :func:`check_on_defects`: every phase's route set, with its pass-throughs,
  the PEs' traffic and the weight-streaming column rings at their physical
  places, through :func:`wse.sim.defects.check_physical` (the deadlock check
  of ``docs/faults.md`` section 1). Weight streaming and the layer-pipelined
  mode (its replicas' reduce as its two conveyor stages).
* :func:`cycles_on_defects`: the static cycle model's replay on the physical
  network (:func:`replay_on_defects`: each logical PE's timing ops at its
  physical PE, the spare PEs idle, the edge streams entering at their
  physical ports): the golden model's cycles of each phase on the defective
  mesh, which exceed the logical model's by the latency of the spare
  routers (one hop each). Weight streaming and the layer-pipelined mode
  (not when it harvests activation sparsity).
"""

from __future__ import annotations

import types

import numpy as np

from wse.firmware.training import pipe
from wse.firmware.training import records as rec

from . import route_check
from .cycles import phase_injections
from .network import Network
from .replay import replay

__all__ = ["phase_records", "check_on_defects", "replay_on_defects", "cycles_on_defects", "BatchDependentCycles"]


class BatchDependentCycles(ValueError):
    """An executable whose phase cycles depend on the batch (a layer-pipelined one that harvests activation
    sparsity): :func:`cycles_on_defects` has no one count to give."""


def phase_records(image: np.ndarray) -> list[list[list[np.ndarray]]]:
    """A weight-streaming op image ``[height, width, words]`` as ``[H][W]`` lists
    of record word arrays (each record's second word is its length; the end
    record closes the list)."""
    end = rec.KINDS["end"]
    grid = []
    for row in image:
        out = []
        for words in row:
            records, at = [], 0
            while at < len(words) and int(words[at]) != end:
                length = int(words[at + 1])
                records.append(words[at:at + length])
                at += length
            out.append(records)
        grid.append(out)
    return grid


def _pipelined_phases(exe) -> dict:
    """The layer-pipelined phases as the deadlock check reads them: ``{name: [H][W] records}``,
    the replicas' ``reduce`` as its two conveyors' stages."""
    from .pipelined_codegen import plan_of
    from .pipelined_reduce import conveyor_stages

    phases = {}
    for name, (_, grid) in plan_of(exe).phases.items():
        if name == "reduce":
            east, west = conveyor_stages(grid)
            phases.update({"reduce (east conveyor)": east, "reduce (west conveyor)": west})
        else:
            phases[name] = grid
    return phases


def check_on_defects(exe, remap) -> list:
    """The static deadlock check of every phase of ``exe`` (compiled for the
    usable mesh of ``remap``) on the physical mesh: one
    :class:`~wse.firmware.deadlock.Proof` per phase.

    Raises
    ------
    DeadlockError
        If a phase's physical route set can deadlock (phase and cycle named).
    DefectError
        If a spare router would have to pass a color both ways.
    UsageError
        If the executable is not for ``remap``'s usable mesh.
    """
    from wse.config import UsageError
    from wse.sim.defects import check_physical

    if (exe.config.width, exe.config.height) != (remap.width, remap.height):
        raise UsageError(f"the executable is for a {exe.config.mesh} mesh, the defects leave "
                         f"{remap.width}x{remap.height}")
    proofs, seen = [], {}
    if exe.mode == "weight_streaming":
        images = dict(exe.static)
        shape = types.SimpleNamespace(config=exe.config, columns=exe.layout.columns)
        phases = {name: (phase_records(images[phase.ops_addr]), rec.decode) for name, phase in exe.phases.items()}
        what = "weight-streaming phase"
    else:
        phases = {name: (grid, pipe.decode) for name, grid in _pipelined_phases(exe).items()}
        what = "layer-pipelined phase"
    for name, (grid, decode) in phases.items():
        traffic, decoded = route_check.phase_traffic(grid, decode)
        rings = route_check.weight_streaming_rings(shape, decoded) if exe.mode == "weight_streaming" else []
        key = (tuple((pe, frozenset(a), frozenset(b)) for pe, (a, b) in traffic.items()), tuple(rings))
        if key not in seen:     # phases with the same traffic and rings have the same graph
            seen[key] = check_physical(remap, exe.config, exe.routes, what=f"{what} {name!r}", traffic=traffic,
                                       rings=rings)
        proofs.append(seen[key])
    return proofs


def replay_on_defects(remap, config, routes, ops: np.ndarray, starts, ends, inject: dict) -> int:
    """The static cycle model's replay of a logical run on the physical mesh of ``remap``.

    ``routes``, ``ops``, ``starts``, ``ends`` and ``inject`` are the logical
    replay's inputs (:func:`~.replay.replay` on ``config``'s mesh: logical PE
    ``p``, row-major, runs ``ops[starts[p]:ends[p]]``): the routes become the
    physical ones with their pass-throughs, each logical PE's ops run at its
    physical PE, the spare PEs run nothing (they are never launched), and the
    edge streams enter at their physical ports. Returns the cycles, the
    golden model's count on the defective mesh.
    """
    from wse.firmware.timing_ops import END
    from wse.sim.defects import physical_routes

    physical = remap.physical_config(config)
    network = Network(physical, physical_routes(remap, routes))
    idle = np.zeros((1, ops.shape[1]), dtype=ops.dtype)
    idle[0, 0] = END
    table = np.concatenate([ops, idle])
    p_starts = np.full(physical.width * physical.height, len(ops), dtype=np.int64)
    p_ends = p_starts + 1
    for ly, py in enumerate(remap.rows):
        for lx, px in enumerate(remap.cols):
            p_starts[py * physical.width + px] = starts[ly * config.width + lx]
            p_ends[py * physical.width + px] = ends[ly * config.width + lx]
    p_inject = {(edge, (remap.cols if edge in ("N", "S") else remap.rows)[index]): colors
                for (edge, index), colors in inject.items()}
    return int(replay(network, table, p_starts, p_ends, p_inject))


def cycles_on_defects(exe, remap, phases=None) -> dict[str, int]:
    """Cycles of the phases of ``exe`` (all, or the names ``phases``) on the
    physical mesh of ``remap`` (:func:`replay_on_defects`), equal to the
    golden model's count on the defective mesh (``tests/test_defects_training.py``).
    Weight streaming, and the layer-pipelined mode unless it harvests
    activation sparsity (its forward cycles depend on the batch).

    Raises
    ------
    ValueError
        For a layer-pipelined executable that harvests activation sparsity.
    DefectError
        If a spare router would have to pass a color both ways.
    """
    if exe.mode == "weight_streaming":
        from .cycles import executable_phase_ops

        images = dict(exe.static)

        def inputs(name):
            phase = exe.phases[name]
            return (*executable_phase_ops(exe, images[phase.ops_addr]), phase_injections(phase))
    else:
        from .pipelined_codegen import plan_of
        from .pipelined_cycles import _injections, _phase_ops

        plan = plan_of(exe)
        if any(plan.harvest):
            raise BatchDependentCycles("the cycles of a layer-pipelined executable that harvests activation sparsity "
                             "depend on the batch; cycles_on_defects does not model them")

        def inputs(name):
            return (*_phase_ops(plan, plan.phases[name][1]), _injections(plan, name))
    return {name: replay_on_defects(remap, exe.config, exe.routes, *inputs(name))
            for name in (phases if phases is not None else exe.phases)}
