"""The plan of a run and the picture of its placement, in the run folder.

:func:`write_plan` writes ``plan.txt`` (the mode asked for and chosen, why,
every layer's region, memory per PE and the schedule) and, for a
layer-pipelined executable, ``placement.png``: the mesh with every PE
coloured by the layer whose region holds it, each data-parallel replica of the
pipeline outlined and named (left) and its FMAC utilization
over a training step (right: FMAC elements of the forward and backward
phases over the step's cycles, from the static cycle model, which equals the
golden model's). It also prints the plan.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

from wse.atomic import atomic_open

__all__ = ["PLAN_NAME", "PLACEMENT_NAME", "write_plan", "placement_figure"]

#: The plan, as text.
PLAN_NAME = "plan.txt"
#: The placement picture of a layer-pipelined run.
PLACEMENT_NAME = "placement.png"


def placement_maps(executable: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(layer [H, W], utilization [H, W])`` of a layer-pipelined executable:
    each PE's layer index (-1: no region) and its FMAC utilization over one
    training step (over the forward pass for an executable without an optimizer)."""
    from wse.host.compiler.pipelined_codegen import plan_of
    from wse.host.compiler.pipelined_cycles import pe_fmacs

    plan = plan_of(executable)
    cfg = executable.config
    layer = np.full((cfg.height, cfg.width), -1, dtype=np.int64)
    for regions, _ in plan.copies():
        for l, region in enumerate(regions):
            for _, _, x, y in region.cells():
                layer[y, x] = l
    names = executable.sequences["train"]
    fmacs = sum(pe_fmacs(plan, name) for name in names if name in ("forward", "backward", "backward_first"))
    cycles = sum(int(executable.phases[name].cycles) for name in names)
    return layer, fmacs / cycles if cycles else np.zeros(layer.shape)


def placement_figure(executable: Any, path: Path) -> None:
    """Draw the placement picture of a layer-pipelined executable into ``path`` (PNG, atomically)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.colors import ListedColormap

    from matplotlib.patches import Rectangle

    from wse.host.compiler.pipelined_codegen import plan_of

    layer, util = placement_maps(executable)
    plan = plan_of(executable)
    layers = executable.layout.layers
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5), constrained_layout=True)
    colors = ["#dddddd"] + [plt.get_cmap("tab10")(i % 10) for i in range(len(layers))]
    left.imshow(layer + 1, cmap=ListedColormap(colors), vmin=0, vmax=len(layers), origin="upper")
    for r, (regions, samples) in enumerate(plan.copies()):
        for spec, region in zip(layers, regions):
            left.text(region.x0 + (region.cols - 1) / 2, region.y0 + (region.rows - 1) / 2,
                      f"{spec.name}\n{spec.k}->{spec.o}\n{region.pes} PEs", ha="center", va="center", fontsize=8)
        if plan.replicas > 1:
            x0, width = min(reg.x0 for reg in regions), executable.config.width // plan.replicas
            left.add_patch(Rectangle((x0 - 0.5, -0.5), width, executable.config.height, fill=False, lw=2,
                                     ec=plt.get_cmap("Dark2")(r % 8)))
            left.text(x0 + width / 2 - 0.5, -0.7, f"replica {r} ({len(samples)} samples)", ha="center",
                      va="bottom", fontsize=8)
    left.set_title(f"regions by layer and replica ({executable.config.mesh} mesh, {plan.replicas} "
                   f"replica{'s' if plan.replicas > 1 else ''})")
    image = right.imshow(util, cmap="viridis", vmin=0, vmax=1, origin="upper")
    fig.colorbar(image, ax=right, label="FMAC utilization")
    right.set_title(f"FMAC utilization per PE over a step (mean {util.mean():.3f})")
    for ax in (left, right):
        ax.set_xlabel("x (column)")
        ax.set_ylabel("y (row)")
    fig.suptitle(f"{executable.graph.name}: layer-pipelined placement, batch {executable.batch} "
                 f"({executable.layout.in_flight} samples in flight)")
    with atomic_open(path) as out:
        fig.savefig(out, format="png", dpi=100)
    plt.close(fig)


def write_plan(out: Path, executable: Any, text: str, stream=None) -> None:
    """Write ``plan.txt`` (and ``placement.png`` for a layer-pipelined executable)
    into the run folder ``out`` and print the plan on ``stream`` (default stdout)."""
    with atomic_open(out / PLAN_NAME, "w", encoding="utf-8") as handle:
        handle.write(text)
    if getattr(executable, "mode", None) == "pipelined":
        placement_figure(executable, out / PLACEMENT_NAME)
    print(text, end="", file=stream or sys.stdout)
