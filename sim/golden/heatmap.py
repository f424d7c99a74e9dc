"""Heatmaps of the mesh as PNG pictures (matplotlib): one cell per PE, north row at the top.

:func:`save_heatmaps` draws any per-PE grids side by side;
:func:`mesh_pictures` draws the three pictures of a recorded run
(:class:`~wse.sim.golden.events.Recorder`): FMAC utilization, stall cycles by
cause and link occupancy per direction. ``docs/pictures.md`` says how to
read them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from wse.atomic import atomic_open

from .events import STALL_CAUSES, Recorder

__all__ = ["Panel", "save_heatmaps", "mesh_pictures", "DPI", "PANEL_INCHES"]

#: Resolution of the pictures, and the width of one panel's mesh in inches.
DPI = 100
PANEL_INCHES = 3.2
_TITLE_INCHES, _LABEL_INCHES, _BAR_INCHES = 0.6, 0.55, 0.8

#: One panel: (title, ``[height, width]`` values, top of the color scale, color bar label).
Panel = tuple[str, np.ndarray, float, str]


def _layout(panels: Sequence[Panel]) -> tuple[float, float, float]:
    """(figure width, figure height, mesh panel height) in inches."""
    h, w = np.asarray(panels[0][1]).shape
    mesh_h = min(max(PANEL_INCHES * h / w, 1.0), 2.5 * PANEL_INCHES)
    fig_w = len(panels) * (PANEL_INCHES + _BAR_INCHES + _LABEL_INCHES)
    fig_h = mesh_h + _TITLE_INCHES + _LABEL_INCHES
    return fig_w, fig_h, mesh_h


def save_heatmaps(path: str | os.PathLike, panels: Sequence[Panel], title: str,
                  annotate: bool | None = None) -> dict:
    """Draw ``panels`` (grids of the same shape) side by side into the PNG file ``path``.

    ``annotate`` writes each cell's value in it (default: meshes of at most
    16 x 16). Returns ``{"path", "size": (width, height) in pixels, "cells"
    (per panel), "boxes"}``, ``boxes`` holding each panel's mesh area in
    pixels ``(left, top, right, bottom)`` from the top-left corner."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not panels:
        raise ValueError("no panels to draw")
    shape = np.asarray(panels[0][1]).shape
    h, w = shape
    if annotate is None:
        annotate = w <= 16 and h <= 16
    fig_w, fig_h, mesh_h = _layout(panels)
    fig = Figure(figsize=(fig_w, fig_h), dpi=DPI)
    fig.suptitle(title, fontsize=min(10.0, fig_w * 72 / (0.55 * max(len(title), 1))))   # fits the width
    cell_pt = PANEL_INCHES * 72 / w          # a cell's width in points: its label fits inside
    boxes = []
    slot = fig_w / len(panels)
    for k, (name, values, vmax, unit) in enumerate(panels):
        grid = np.asarray(values, dtype=np.float64)
        if grid.shape != shape:
            raise ValueError(f"panel {name!r} is {grid.shape}, expected {shape}")
        left, bottom = k * slot + _LABEL_INCHES, _LABEL_INCHES
        ax = fig.add_axes((left / fig_w, bottom / fig_h, PANEL_INCHES / fig_w, mesh_h / fig_h))
        image = ax.imshow(grid, cmap="viridis", vmin=0.0, vmax=max(float(vmax), 1e-12),
                          interpolation="nearest", aspect="auto")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("x", fontsize=8)
        ax.set_ylabel("y", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        bar = fig.add_axes(((left + PANEL_INCHES + 0.1) / fig_w, bottom / fig_h, 0.12 / fig_w, mesh_h / fig_h))
        fig.colorbar(image, cax=bar).set_label(unit, fontsize=8)
        bar.tick_params(labelsize=7)
        if annotate:
            for (y, x), v in np.ndenumerate(grid):
                text = f"{v:.2f}".removeprefix("0") if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.0f}"
                ax.text(x, y, text, ha="center", va="center", fontsize=min(7.0, cell_pt / (0.62 * len(text))),
                        color="white" if v < 0.6 * vmax else "black")
        px = DPI
        top = fig_h - bottom - mesh_h
        boxes.append((round(left * px), round(top * px), round((left + PANEL_INCHES) * px),
                      round((top + mesh_h) * px)))
    with atomic_open(path, "wb") as fh:
        fig.savefig(fh, format="png", dpi=DPI, metadata={"Title": title, "Description": f"{len(panels)} panels "
                                                         f"of {w}x{h} cells"})
    return {"path": Path(path), "size": (round(fig_w * DPI), round(fig_h * DPI)), "cells": w * h,
            "boxes": boxes}


def _fraction(values: np.ndarray, cycles: int) -> np.ndarray:
    return values / cycles if cycles else np.zeros_like(values, dtype=np.float64)


def mesh_pictures(recorder: Recorder, out_dir: str | os.PathLike, label: str | None = None,
                  prefix: str = "", title: str = "") -> dict[str, Path]:
    """Write the three heatmaps of the runs labelled ``label`` (default all) into ``out_dir``.

    * ``{prefix}fmac.png``: FMAC elements per PE over the cycles (1.0: an
      FMAC every cycle);
    * ``{prefix}stalls.png``: fraction of cycles each PE's fabric
      instructions stalled, one panel per cause (input queue empty, output
      queue full);
    * ``{prefix}links.png``: fraction of cycles each router output port
      (N, E, S, W, RAMP into the PE) sent a wavelet.

    Returns ``{"fmac": path, "stalls": path, "links": path}``."""
    totals = recorder.totals(label)
    cycles = totals["cycles"]
    grid = recorder.grid
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    what = title or (label if label is not None else "all runs")
    mesh = f"{recorder.width}x{recorder.height}"
    paths = {name: out / f"{prefix}{name}.png" for name in ("fmac", "stalls", "links")}
    fmac = grid(_fraction(totals["fmac"], cycles))
    save_heatmaps(paths["fmac"], [("FMAC utilization", fmac, 1.0, "FMACs per cycle")],
                  f"{what}: {mesh} mesh, {cycles:,} cycles, mean {fmac.mean():.3f}")
    causes = {"rx": "stalled: input queue empty", "tx": "stalled: output queue full"}
    stalls = [grid(_fraction(totals["stall"][i], cycles)) for i in range(len(STALL_CAUSES))]
    top = max(max(float(s.max()) for s in stalls), 1e-3)
    save_heatmaps(paths["stalls"], [(causes[c], s, top, "fraction of cycles") for c, s in zip(STALL_CAUSES, stalls)],
                  f"{what}: stall cycles by cause")
    links = [grid(_fraction(totals["links"][p], cycles)) for p in range(totals["links"].shape[0])]
    top = max(max(float(v.max()) for v in links), 1e-3)
    names = ("north", "east", "south", "west", "RAMP (to the PE)")
    save_heatmaps(paths["links"], [(f"out {n}", v, top, "fraction of cycles") for n, v in zip(names, links)],
                  f"{what}: link occupancy per router output")
    return paths
