"""The layout shared by ``axpy`` and ``dot``: a vector y spread over every PE,
a vector x streamed through the mesh rows past it.

y is dealt over all PEs in row-major PE order (:func:`~.common.mesh_slices`):
PE ``(j, i)`` holds the slice ``y[s(j, i)]``. The slices of mesh row ``i``
are contiguous, so ``x`` over them enters the row at its west edge as one
stream, PE 0's part first. Each PE consumes the first ``own`` elements that
reach it and forwards the ``rest`` (the parts of the PEs east of it) on a
chain of two colors alternating by column parity (:func:`~.common.chain_routes`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, Port
from wse.firmware.image import Program

from .common import (Kernel, chain_color_grids, chain_in_color, chain_routes, mesh_coordinates, mesh_slices,
                     read_per_pe, row_cells)

__all__ = ["SlicePlan", "plan_slices"]


@dataclasses.dataclass
class SlicePlan:
    """Slices of an ``n``-vector over the mesh.

    Members
    -------
    config, n:
        The mesh and the vector length.
    slices:
        ``slices[y][x]``: the indices held by PE ``(x, y)``.
    own, rest:
        ``[height, width]``: elements a PE keeps / forwards east.
    program:
        The kernel's assembled program.
    heap:
        Address of the y slice in every PE (first word after the program's data).
    """
    config: FabricConfig
    n: int
    slices: list[list[range]]
    own: np.ndarray
    rest: np.ndarray
    program: Program
    heap: int

    def row_range(self, y: int) -> range:
        """The indices of x that enter mesh row ``y``."""
        row = self.slices[y]
        return range(row[0].start, row[-1].stop)

    def stream_params(self, colors: tuple[int, int]) -> dict[str, np.ndarray]:
        """Parameter words of the x stream: own, rest, y address, in and out colors."""
        column, _ = mesh_coordinates(self.config)
        x_in, x_out = chain_color_grids(column, colors)
        return {"p_own": self.own, "p_rest": self.rest, "p_y": np.full(self.own.shape, self.heap),
                "p_xin": x_in, "p_xout": x_out}

    def stream_routes(self, colors: tuple[int, int]) -> list:
        """The x chains: one per mesh row, fed at the west edge."""
        return [route for y in range(self.config.height)
                for route in chain_routes(row_cells(y, self.config.width), Port.E, colors,
                                          from_edge=True, to_edge=False)]

    def stream_x(self, device, x: np.ndarray, colors: tuple[int, int]) -> None:
        """Queue each mesh row's part of ``x`` (uint32 bits) at its west edge."""
        for y in range(self.config.height):
            part = self.row_range(y)
            if len(part):
                device.stream_in("W", y, chain_in_color(0, colors), x[part.start:part.stop])

    def y_words(self, y: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Each PE's slice of ``y`` (uint32 bits), by ``(x, y)``."""
        return {(px, py): y[s.start:s.stop] for py, row in enumerate(self.slices) for px, s in enumerate(row)}

    def read_y(self, device) -> np.ndarray:
        """The y slices read back from every PE, concatenated in order."""
        got = read_per_pe(device, np.full(self.own.shape, self.heap), self.own)
        return np.concatenate([got[(px, py)] for py in range(self.config.height)
                               for px in range(self.config.width)])


def plan_slices(kernel: Kernel, config: FabricConfig, n: int, program: Program) -> SlicePlan:
    """The :class:`SlicePlan` of an ``n``-vector; raises :class:`~wse.config.UsageError`
    when the largest slice does not fit after the program's data."""
    slices = mesh_slices(n, config)
    own = np.array([[len(s) for s in row] for row in slices], dtype=np.int64)
    rest = np.cumsum(own[:, ::-1], axis=1)[:, ::-1] - own
    heap = kernel.check_memory(f"{kernel.name} of n={n}", config, program, int(own.max()))
    return SlicePlan(config, n, slices, own, rest, program, heap)
