"""``gemv``: y = W x with the weights stationary on the mesh (``gemv.s``).

Layout on a ``width x height`` mesh: the rows of W are dealt over the mesh
rows and its columns over the mesh columns (:func:`~.common.block_partition`),
so PE ``(j, i)`` holds ``W[rows_i, cols_j]`` column-major, followed by its
accumulator. ``x[cols_j]`` enters column ``j`` at the north edge and is
multicast down it; ``y[rows_i]`` leaves row ``i`` at the east edge.

Order of the float operations (what the reference computes)::

    acc(j)[r] = +0; acc(j)[r] = add(acc(j)[r], mul(W[r, k], x[k])) for k in cols_j, in order
    y[r]      = acc(0)[r]; y[r] = add(y[r], acc(j)[r]) for j = 1 .. width-1

A column with no x (``cols < width``) contributes ``acc = +0`` to the fold;
a mesh row with no rows of W (``rows < height``) carries no partial sums.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, Port
from wse.firmware.image import Program
from wse import numerics as fp
from wse.firmware.deadlock import load_checked

from .common import (Kernel, block_partition, chain_color_grids, chain_out_color, chain_routes, column_cells,
                     kernel_program, mesh_coordinates, multicast_routes, row_cells, write_params, write_per_pe)

__all__ = ["Gemv", "GemvPlan"]

X_COLOR = 0
SUM_COLORS = (1, 2)
T_START, T_REDUCE = 3, 4


@dataclasses.dataclass
class GemvPlan:
    """Where everything of one gemv lives.

    Members
    -------
    config, rows, cols:
        The mesh and the matrix shape.
    row_blocks, col_blocks:
        ``rows_i`` per mesh row and ``cols_j`` per mesh column.
    program:
        The assembled ``gemv.s``.
    heap:
        First word after the program's data: the accumulator lives there, the
        weight block right after it.
    """
    config: FabricConfig
    rows: int
    cols: int
    row_blocks: list[range]
    col_blocks: list[range]
    program: Program
    heap: int


class Gemv(Kernel):
    name = "gemv"
    summary = "y = W x: weights stationary, x multicast down the columns, sums reduced west to east"
    defaults = {"rows": 64, "cols": 64}
    colors = 3
    tasks = 5

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']}x{sizes['cols']} matrix"

    def plan(self, config: FabricConfig, sizes: dict) -> GemvPlan:
        rows, cols = sizes["rows"], sizes["cols"]
        program = kernel_program("gemv", config, C_X=X_COLOR, T_START=T_START, T_REDUCE=T_REDUCE)
        row_blocks = block_partition(rows, config.height)
        col_blocks = block_partition(cols, config.width)
        most_rows, most_cols = len(row_blocks[0]), len(col_blocks[0])
        heap = self.check_memory(f"gemv {rows}x{cols}", config, program, most_rows * (most_cols + 1))
        return GemvPlan(config, rows, cols, row_blocks, col_blocks, program, heap)

    def inputs(self, plan: GemvPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"w": rng.standard_normal((plan.rows, plan.cols), dtype=np.float32),
                "x": rng.standard_normal(plan.cols, dtype=np.float32)}

    def reference(self, plan: GemvPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        w, x = fp.as_bits(inputs["w"]), fp.as_bits(inputs["x"])
        y = None
        for cols in plan.col_blocks:
            acc = np.zeros(plan.rows, dtype=np.uint32)
            for k in cols:
                acc = fp.vadd(acc, fp.vmul(w[:, k], x[k]))
            y = acc if y is None else fp.vadd(y, acc)
        exact = inputs["w"].astype(np.float64) @ inputs["x"].astype(np.float64)
        return y, exact

    def execute(self, device, plan: GemvPlan, inputs) -> tuple[np.ndarray, int]:
        cfg, program = plan.config, plan.program
        width, height = cfg.width, cfg.height
        device.load(program)
        routes = []
        for j in range(width):
            routes += multicast_routes(column_cells(j, height), Port.S, X_COLOR, from_edge=True)
        for i in range(height):
            routes += chain_routes(row_cells(i, width), Port.E, SUM_COLORS, from_edge=False, to_edge=True)
        load_checked(device, cfg, routes, f"kernel {self.name}")

        column, row = mesh_coordinates(cfg)
        nrows = np.array([len(b) for b in plan.row_blocks])[row]
        ncols = np.array([len(b) for b in plan.col_blocks])[column]
        acc_addr = np.full((height, width), plan.heap)
        w_addr = acc_addr + nrows
        sum_in, sum_out = chain_color_grids(column, SUM_COLORS)
        write_params(device, program, {
            "p_nrows": nrows, "p_ncols": ncols, "p_acc": acc_addr, "p_w": w_addr,
            "p_first": column == 0, "p_cin": sum_in, "p_cout": sum_out,
        })
        w = fp.as_bits(inputs["w"])
        write_per_pe(device, w_addr, {
            (j, i): w[plan.row_blocks[i].start:plan.row_blocks[i].stop,
                      plan.col_blocks[j].start:plan.col_blocks[j].stop].ravel(order="F")
            for i in range(height) for j in range(width)})
        x = fp.as_bits(inputs["x"])
        for j, cols in enumerate(plan.col_blocks):
            if len(cols):
                device.stream_in("N", j, X_COLOR, x[cols.start:cols.stop])

        device.launch(T_START)
        cycles = device.run()
        out_color = chain_out_color(width - 1, SUM_COLORS)
        y = np.concatenate([device.stream_out("E", i, out_color) for i in range(height)])
        return y, cycles
