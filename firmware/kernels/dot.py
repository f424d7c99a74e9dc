"""``dot``: s = x . y with y spread over the mesh and x streamed through it
(``dot.s``, layout in :mod:`.slices`).

Order of the float operations (what the reference computes)::

    part(j, i) = +0; part = add(part, mul(y[k], x[k])) for k in the slice of PE (j, i), in order
    row(i)     = part(0, i); row = add(row, part(j, i)) for j = 1 .. width-1
    s          = row(0);     s = add(s, row(i))        for i = 1 .. height-1

The row sums flow west to east along each row, then down the east column;
s leaves the mesh at the south edge of the east column.
"""

from __future__ import annotations

import numpy as np

from wse.config import FabricConfig, Port
from wse import numerics as fp
from wse.firmware.deadlock import load_checked

from .common import (Kernel, chain_color_grids, chain_out_color, chain_routes, column_cells, kernel_program,
                     mesh_coordinates, row_cells, write_params, write_per_pe)
from .slices import SlicePlan, plan_slices

__all__ = ["Dot"]

X_COLORS = (0, 1)
ROW_COLORS = (2, 3)
COLUMN_COLORS = (4, 5)
T_START = 6


class Dot(Kernel):
    name = "dot"
    summary = "x . y: x streamed in at the west edge of each row, sums reduced along rows, then down the east column"
    defaults = {"n": 1024}
    colors = 6
    tasks = 7

    def describe(self, sizes: dict) -> str:
        return f"n={sizes['n']}"

    def plan(self, config: FabricConfig, sizes: dict) -> SlicePlan:
        program = kernel_program("dot", config, T_START=T_START)
        return plan_slices(self, config, sizes["n"], program)

    def inputs(self, plan: SlicePlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"x": rng.standard_normal(plan.n, dtype=np.float32),
                "y": rng.standard_normal(plan.n, dtype=np.float32)}

    def reference(self, plan: SlicePlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        x, y = fp.as_bits(inputs["x"]), fp.as_bits(inputs["y"])
        total = None
        for row in plan.slices:
            row_sum = None
            for s in row:
                part = fp.seq_dot(0, y[s.start:s.stop], x[s.start:s.stop])
                row_sum = part if row_sum is None else fp.add(row_sum, part)
            total = row_sum if total is None else fp.add(total, row_sum)
        exact = np.dot(inputs["x"].astype(np.float64), inputs["y"].astype(np.float64))
        return np.array([total], dtype=np.uint32), np.array([exact])

    def execute(self, device, plan: SlicePlan, inputs) -> tuple[np.ndarray, int]:
        cfg, program = plan.config, plan.program
        width, height = cfg.width, cfg.height
        device.load(program)
        routes = plan.stream_routes(X_COLORS)
        for i in range(height):
            routes += chain_routes(row_cells(i, width), Port.E, ROW_COLORS, from_edge=False, to_edge=False)
        routes += chain_routes(column_cells(width - 1, height), Port.S, COLUMN_COLORS, from_edge=False, to_edge=True)
        load_checked(device, cfg, routes, f"kernel {self.name}")
        column, row = mesh_coordinates(cfg)
        row_in, row_out = chain_color_grids(column, ROW_COLORS)
        column_in, column_out = chain_color_grids(row, COLUMN_COLORS)
        params = plan.stream_params(X_COLORS)
        params.update({
            "p_first": column == 0, "p_last": column == width - 1, "p_top": row == 0,
            "p_rin": row_in, "p_rout": row_out, "p_cin": column_in, "p_cout": column_out,
        })
        write_params(device, program, params)
        write_per_pe(device, np.full(plan.own.shape, plan.heap), plan.y_words(fp.as_bits(inputs["y"])))
        plan.stream_x(device, fp.as_bits(inputs["x"]), X_COLORS)
        device.launch(T_START)
        cycles = device.run()
        result = device.stream_out("S", width - 1, chain_out_color(height - 1, COLUMN_COLORS))
        return result, cycles
