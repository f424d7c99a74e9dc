"""The plan of a run and the picture of its placement, in the run folder.

:func:`write_plan` writes ``plan.txt`` (the mode asked for and chosen, why,
every layer's region, memory per PE and the schedule) and, for a
layer-pipelined executable, ``placement.png``: the mesh with every PE
coloured by the layer whose region holds it (one copy of the pipeline) or by
the data-parallel copy it belongs to, a lighter shade for each later layer
(several copies), with a legend of the copies and their samples (left), and its FMAC utilization
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


def _region_colors(copies: int, layers: int) -> np.ndarray:
    """RGBA colour of every (copy, layer) region, ``[copies, layers, 4]``: with one copy a
    colour per layer; with several a hue per copy, lighter for each later layer."""
    from matplotlib import pyplot as plt

    if copies == 1:
        return np.array([[plt.get_cmap("tab10")(l % 10) for l in range(layers)]])
    out = np.zeros((copies, layers, 4))
    for r in range(copies):
        base = np.array(plt.get_cmap("tab10" if copies <= 10 else "tab20")(r % 20))
        for l in range(layers):
            mix = 0.55 * l / max(1, layers - 1)
            out[r, l] = np.append(base[:3] * (1 - mix) + mix, 1.0)
    return out


def placement_figure(executable: Any, path: Path) -> None:
    """Draw the placement picture of a layer-pipelined executable into ``path`` (PNG,
    atomically): regions coloured by layer (one copy of the pipeline) or by copy, a
    lighter shade for each later layer (several copies), and the per-PE FMAC utilization."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.patches import Patch

    from wse.host.compiler.pipelined_codegen import plan_of

    layer, util = placement_maps(executable)
    plan = plan_of(executable)
    cfg, layers, k = executable.config, executable.layout.layers, plan.replicas
    palette = _region_colors(k, len(layers))
    image = np.full((cfg.height, cfg.width, 4), (0.87, 0.87, 0.87, 1.0))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.6), constrained_layout=True)
    for r, (regions, samples) in enumerate(plan.copies()):
        for l, (spec, region) in enumerate(zip(layers, regions)):
            image[region.y0:region.y0 + region.rows, region.x0:region.x0 + region.cols] = palette[r, l]
            left.add_patch(plt.Rectangle((region.x0 - 0.5, region.y0 - 0.5), region.cols, region.rows, fill=False,
                                         lw=1, ec="white"))
            label = f"{spec.name}\n{spec.k}->{spec.o}\n{region.pes} PEs" if region.cols >= 3 or k == 1 else spec.name
            left.text(region.x0 + (region.cols - 1) / 2, region.y0 + (region.rows - 1) / 2, label, ha="center",
                      va="center", fontsize=8 if k <= 4 else 6)
    left.imshow(image, origin="upper")
    if k > 1:
        handles = [Patch(color=palette[r, 0], label=f"copy {r}: {len(samples)} samples")
                   for r, (_, samples) in enumerate(plan.copies())]
        left.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=min(k, 4), fontsize=7,
                    frameon=False)
    left.set_title(f"regions by {'copy and ' if k > 1 else ''}layer: {k} {'copies' if k > 1 else 'copy'} "
                   f"of the pipeline on {cfg.mesh}", fontsize=10)
    shown = right.imshow(util, cmap="viridis", vmin=0, vmax=1, origin="upper")
    fig.colorbar(shown, ax=right, label="FMAC utilization")
    right.set_title(f"FMAC utilization per PE over a step (mean {util.mean():.3f})", fontsize=10)
    for ax in (left, right):
        ax.set_xlabel("x (column)")
        ax.set_ylabel("y (row)")
    fig.suptitle(f"{executable.graph.name}: layer-pipelined placement, batch {executable.batch} "
                 f"({executable.layout.in_flight} samples in flight per pass)")
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
