"""``broadcast`` and ``reduce``: collectives along every mesh row or column
at once (``broadcast.s``, ``reduce.s``).

A *line* is a mesh row walked west to east (variant ``row``) or a mesh column
walked north to south (variant ``column``). Every PE keeps its vector of
``n`` words at the same address (the first word after the program's data).

* ``broadcast``: the first PE of each line holds a vector; it is multicast
  along the line and every other PE stores it (raw 32-bit copies).
* ``reduce``: every PE holds a vector; the line's sum is a fold in line
  order, ``out(0) = v(0); out(m) = add(out(m-1), v(m))``, computed by each PE
  as ``add(in, v)`` on the partial sums arriving from the previous PE; the
  last PE's output leaves the mesh at the east (row) or south (column) edge.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig
from wse.firmware.image import Program
from wse import numerics as fp
from wse.firmware.deadlock import load_checked

from .common import (Kernel, chain_color_grids, chain_out_color, chain_routes, kernel_program, line_cells,
                     mesh_coordinates, multicast_routes, read_per_pe, write_params, write_per_pe)

__all__ = ["Broadcast", "Reduce", "LinePlan"]


@dataclasses.dataclass
class LinePlan:
    """One collective over every line.

    Members
    -------
    config, n, variant:
        The mesh, the vector length and ``"row"`` or ``"column"``.
    program:
        The kernel's assembled program.
    heap:
        Address of the vector in every PE.
    """
    config: FabricConfig
    n: int
    variant: str
    program: Program
    heap: int

    @property
    def lines(self) -> int:
        """How many lines the mesh has (rows or columns)."""
        return self.config.height if self.variant == "row" else self.config.width

    @property
    def length(self) -> int:
        """PEs on each line."""
        return self.config.width if self.variant == "row" else self.config.height

    def position(self) -> np.ndarray:
        """``[height, width]``: each PE's position along its line."""
        x, y = mesh_coordinates(self.config)
        return x if self.variant == "row" else y

    def cells(self, line: int):
        """The PEs of ``line`` in order, and the port leading along it."""
        return line_cells(self.variant, line, self.config)

    def grid(self, per_line: np.ndarray) -> np.ndarray:
        """``[lines, length, ...]`` values (line-major) as ``[height, width, ...]``."""
        return per_line if self.variant == "row" else np.swapaxes(per_line, 0, 1)


class _LineKernel(Kernel):
    defaults = {"n": 64, "variant": "row"}
    variants = ("row", "column")

    def describe(self, sizes: dict) -> str:
        return f"n={sizes['n']} along every {sizes['variant']}"

    def plan(self, config: FabricConfig, sizes: dict) -> LinePlan:
        program = kernel_program(self.name, config, T_START=self.T_START)
        heap = self.check_memory(f"{self.name} of n={sizes['n']}", config, program, sizes["n"])
        return LinePlan(config, sizes["n"], sizes["variant"], program, heap)

    @staticmethod
    def _words(plan: LinePlan, values: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """``values[height, width, n]`` (float32) as the words of each PE."""
        bits = fp.as_bits(values)
        return {(x, y): bits[y, x] for y in range(plan.config.height) for x in range(plan.config.width)}


class Broadcast(_LineKernel):
    name = "broadcast"
    summary = "copy the vector of the first PE of every row (or column) to the whole row (column)"
    colors = 1
    tasks = 2
    COLOR = 0
    T_START = 1

    def inputs(self, plan: LinePlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {"v": rng.standard_normal((plan.lines, plan.n), dtype=np.float32)}

    def reference(self, plan: LinePlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        per_line = np.repeat(inputs["v"][:, None, :], plan.length, axis=1)
        copies = plan.grid(per_line)
        return fp.as_bits(copies), copies.astype(np.float64)

    def execute(self, device, plan: LinePlan, inputs) -> tuple[np.ndarray, int]:
        cfg, program = plan.config, plan.program
        device.load(program)
        routes = []
        for line in range(plan.lines):
            cells, forward = plan.cells(line)
            routes += multicast_routes(cells, forward, self.COLOR, from_edge=False)
        load_checked(device, cfg, routes, f"kernel {self.name}")
        source = plan.position() == 0
        write_params(device, program, {
            "p_n": np.full(source.shape, plan.n), "p_buf": np.full(source.shape, plan.heap),
            "p_color": np.full(source.shape, self.COLOR), "p_source": source,
            "p_send": np.where(source, plan.n if plan.length > 1 else 0, 0),
        })
        v = fp.as_bits(inputs["v"])
        write_per_pe(device, np.full(source.shape, plan.heap),
                     {plan.cells(line)[0][0]: v[line] for line in range(plan.lines)})
        device.launch(self.T_START)
        cycles = device.run()
        got = read_per_pe(device, np.full(source.shape, plan.heap), np.full(source.shape, plan.n))
        out = np.array([[got[(x, y)] for x in range(cfg.width)] for y in range(cfg.height)], dtype=np.uint32)
        return out, cycles


class Reduce(_LineKernel):
    name = "reduce"
    summary = "sum the vectors of every row (column) west to east (north to south), out at the east (south) edge"
    colors = 2
    tasks = 3
    COLORS = (0, 1)
    T_START = 2

    def inputs(self, plan: LinePlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        cfg = plan.config
        return {"v": rng.standard_normal((cfg.height, cfg.width, plan.n), dtype=np.float32)}

    def reference(self, plan: LinePlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        v = inputs["v"] if plan.variant == "row" else np.swapaxes(inputs["v"], 0, 1)
        bits = fp.as_bits(v)  # [lines, length, n]
        total = bits[:, 0]
        for m in range(1, plan.length):
            total = fp.vadd(total, bits[:, m])
        return total, v.astype(np.float64).sum(axis=1)

    def execute(self, device, plan: LinePlan, inputs) -> tuple[np.ndarray, int]:
        program = plan.program
        device.load(program)
        routes = []
        for line in range(plan.lines):
            cells, forward = plan.cells(line)
            routes += chain_routes(cells, forward, self.COLORS, from_edge=False, to_edge=True)
        load_checked(device, plan.config, routes, f"kernel {self.name}")
        position = plan.position()
        sum_in, sum_out = chain_color_grids(position, self.COLORS)
        write_params(device, program, {
            "p_n": np.full(position.shape, plan.n), "p_buf": np.full(position.shape, plan.heap),
            "p_first": position == 0, "p_cin": sum_in, "p_cout": sum_out,
        })
        write_per_pe(device, np.full(position.shape, plan.heap), self._words(plan, inputs["v"]))
        device.launch(self.T_START)
        cycles = device.run()
        edge = "E" if plan.variant == "row" else "S"
        color = chain_out_color(plan.length - 1, self.COLORS)
        out = np.array([device.stream_out(edge, line, color) for line in range(plan.lines)], dtype=np.uint32)
        return out, cycles
