"""Shared pieces of the kernel library: layouts, routes, programs and the
:class:`Kernel` interface.

Layouts deal ``n`` items over ``k`` parts in contiguous blocks whose sizes
differ by at most one, the larger blocks first (:func:`block_partition`).
Routes are built for *lines* of PEs (a mesh row walked east or a mesh column
walked south): a *chain* passes data from each PE to the next on two colors
that alternate with the position (a color has one input per router), a
*multicast* sends one color from the start of the line to every PE on it.

A kernel is a :class:`Kernel`: it plans the layout for a configuration and
sizes, makes random inputs, computes the reference bits in the documented
order of float operations, and drives a device through the host API of
``docs/architecture.md`` section 5 (:class:`wse.sim.api.Device`). Running a
kernel on a device and checking it is :func:`wse.sim.runner.run_kernel`'s
job, above the devices: nothing here imports a device.
"""

from __future__ import annotations

import abc
import functools
from pathlib import Path

import numpy as np

from wse.config import FabricConfig, MemoryNeedError, Port, UsageError
from wse.firmware.asm import assemble_file
from wse.firmware.image import Program

__all__ = [
    "Route", "block_partition", "mesh_slices", "row_cells", "column_cells", "line_cells",
    "chain_in_color", "chain_out_color", "chain_color_grids", "mesh_coordinates", "chain_routes", "multicast_routes",
    "kernel_program", "write_params", "write_per_pe", "read_per_pe", "Kernel",
]

#: ``(x, y, color, input port or None, output ports)``, as ``Fabric.load_routes`` takes them.
Route = tuple[int, int, int, "Port | None", tuple[Port, ...]]

_KERNEL_DIR = Path(__file__).resolve().parent


# Layouts -----------------------------------------------------------------------

def block_partition(n: int, parts: int) -> list[range]:
    """Split ``range(n)`` into ``parts`` contiguous blocks, in order.

    The first ``n % parts`` blocks hold ``n // parts + 1`` items and the rest
    ``n // parts``, so sizes differ by at most one and empty blocks (when
    ``n < parts``) come last.
    """
    if parts < 1 or n < 0:
        raise ValueError(f"cannot split {n} items into {parts} parts")
    base, extra = divmod(n, parts)
    blocks, start = [], 0
    for p in range(parts):
        size = base + (1 if p < extra else 0)
        blocks.append(range(start, start + size))
        start += size
    return blocks


def mesh_slices(n: int, config: FabricConfig) -> list[list[range]]:
    """Deal ``range(n)`` over all PEs in row-major PE order (:func:`block_partition`
    over ``width * height`` parts): ``slices[y][x]`` is the block of PE ``(x, y)``.
    The blocks of one mesh row are contiguous and follow each other west to east."""
    blocks = block_partition(n, config.num_pes)
    return [blocks[y * config.width:(y + 1) * config.width] for y in range(config.height)]


def row_cells(y: int, width: int) -> list[tuple[int, int]]:
    """The PEs of mesh row ``y``, west to east."""
    return [(x, y) for x in range(width)]


def column_cells(x: int, height: int) -> list[tuple[int, int]]:
    """The PEs of mesh column ``x``, north to south."""
    return [(x, y) for y in range(height)]


def line_cells(variant: str, index: int, config: FabricConfig) -> tuple[list[tuple[int, int]], Port]:
    """The PEs of line ``index`` of a ``"row"`` or ``"column"`` variant and
    the port that leads along it (E for rows, S for columns)."""
    if variant == "row":
        return row_cells(index, config.width), Port.E
    return column_cells(index, config.height), Port.S


# Routes -------------------------------------------------------------------------

def chain_in_color(position: int, colors: tuple[int, int]) -> int:
    """Color of the link entering the PE at ``position`` of a chain."""
    return colors[position % 2]


def chain_out_color(position: int, colors: tuple[int, int]) -> int:
    """Color of the link leaving the PE at ``position`` of a chain."""
    return colors[(position + 1) % 2]


def chain_color_grids(position, colors: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Per-PE colors of the links entering and leaving each PE of a chain,
    from an integer array of the PEs' positions along their chains."""
    palette, position = np.asarray(colors), np.asarray(position)
    return palette[position % 2], palette[(position + 1) % 2]


def mesh_coordinates(config: FabricConfig) -> tuple[np.ndarray, np.ndarray]:
    """``(x, y)``: two ``[height, width]`` arrays of every PE's column and row."""
    return np.meshgrid(np.arange(config.width), np.arange(config.height))


def chain_routes(cells, forward: Port, colors: tuple[int, int], *,
                 from_edge: bool, to_edge: bool) -> list[Route]:
    """Routes that pass data from each PE of ``cells`` to the next.

    The link entering position ``m`` has color ``colors[m % 2]``: each
    router takes it from the previous router (or, at position 0 with
    ``from_edge``, from the mesh edge) into its PE, and sends the PE's output
    on the other color to the next router (or, at the last position with
    ``to_edge``, out of the mesh, where it is collected on color
    ``colors[len(cells) % 2]``).
    """
    back = forward.opposite
    routes: list[Route] = []
    last = len(cells) - 1
    for m, (x, y) in enumerate(cells):
        if m > 0 or from_edge:
            routes.append((x, y, chain_in_color(m, colors), back, (Port.RAMP,)))
        if m < last or to_edge:
            routes.append((x, y, chain_out_color(m, colors), Port.RAMP, (forward,)))
    return routes


def multicast_routes(cells, forward: Port, color: int, *, from_edge: bool) -> list[Route]:
    """Routes that copy ``color`` to every PE of ``cells``.

    With ``from_edge`` the wavelets enter the first router from the mesh edge
    and every router sends them to its PE and on (the last to its PE only).
    Otherwise the first PE is the source: its router takes the color from its
    PE and sends it on, and every later router delivers it to its PE and on.
    """
    back = forward.opposite
    routes: list[Route] = []
    last = len(cells) - 1
    for m, (x, y) in enumerate(cells):
        onward = (forward,) if m < last else ()
        if m == 0 and not from_edge:
            if onward:
                routes.append((x, y, color, Port.RAMP, onward))
        else:
            routes.append((x, y, color, back, (Port.RAMP,) + onward))
    return routes


# Programs and PE memory -----------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def _assemble(name: str, config: FabricConfig, defines: tuple[tuple[str, int], ...]) -> Program:
    return assemble_file(_KERNEL_DIR / f"{name}.s", config, dict(defines))


def kernel_program(name: str, config: FabricConfig, **defines: int) -> Program:
    """The assembled ``firmware/kernels/NAME.s`` for ``config``, with
    ``defines`` overriding its ``.equ`` constants (cached)."""
    return _assemble(name, config, tuple(sorted(defines.items())))


def write_params(device, program: Program, params: dict[str, np.ndarray]) -> None:
    """Write one word per PE into each parameter symbol: ``params[name]`` is
    an integer array ``[height, width]`` (negative values are stored modulo 2**32)."""
    for name, grid in params.items():
        grid = np.asarray(grid, dtype=np.int64)
        device.memcpy_h2d(program.symbol(name), grid[:, :, None])


def write_per_pe(device, addr: np.ndarray, words: dict[tuple[int, int], np.ndarray]) -> None:
    """Write ``words[(x, y)]`` (uint32) at ``addr[y, x]`` of PE ``(x, y)``;
    empty arrays are skipped."""
    for (x, y), data in words.items():
        if len(data):
            device.memcpy_h2d(int(addr[y, x]), np.asarray(data, dtype=np.uint32)[None, None, :], (x, y, 1, 1))


def read_per_pe(device, addr: np.ndarray, counts: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
    """Read ``counts[y, x]`` words at ``addr[y, x]`` of every PE."""
    height, width = counts.shape
    out = {}
    for y in range(height):
        for x in range(width):
            n = int(counts[y, x])
            out[(x, y)] = device.memcpy_d2h(int(addr[y, x]), n, (x, y, 1, 1))[0, 0] if n else \
                np.zeros(0, dtype=np.uint32)
    return out


# Kernels -----------------------------------------------------------------------

class Kernel(abc.ABC):
    """One library kernel.

    Members
    -------
    name:
        The name ``wse kernel`` and :func:`wse.sim.runner.run_kernel` know it by.
    summary:
        One line saying what it computes.
    defaults:
        Size arguments and their defaults (``rows``/``cols`` or ``n``, and
        ``variant`` for kernels with variants).
    variants:
        Allowed values of ``variant`` (empty: the kernel has none).
    colors, tasks:
        Colors ``0 .. colors-1`` and task ids ``0 .. tasks-1`` the kernel uses.
    """

    name: str
    summary: str
    defaults: dict[str, object]
    variants: tuple[str, ...] = ()
    colors: int
    tasks: int

    def resolve(self, config: FabricConfig, sizes: dict) -> dict:
        """The complete size arguments: defaults filled in, every value
        checked. Raises :class:`UsageError` for unknown names, sizes that are
        not positive integers, an unknown variant, or a configuration with too
        few colors or task slots."""
        unknown = sorted(k for k in sizes if k not in self.defaults)
        if unknown:
            raise UsageError(f"{self.name} takes {', '.join(self.defaults)}, not {unknown[0]}")
        resolved = {**self.defaults, **{k: v for k, v in sizes.items() if v is not None}}
        for key, value in resolved.items():
            if key == "variant":
                if value not in self.variants:
                    raise UsageError(f"{self.name} variant must be one of {', '.join(self.variants)}, not {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise UsageError(f"{self.name} {key} must be a positive integer, not {value!r}")
            else:
                resolved[key] = int(value)
        if config.colors < self.colors or config.tasks < self.tasks:
            raise UsageError(f"{self.name} needs {self.colors} colors and {self.tasks} task slots, but the "
                             f"configuration has colors={config.colors} and tasks={config.tasks}")
        return resolved

    @staticmethod
    def check_memory(what: str, config: FabricConfig, program: Program, buffer_words: int) -> int:
        """Raise :class:`UsageError` unless ``buffer_words`` words fit in every
        PE after the program's data; returns the first free address."""
        need = program.data_end + buffer_words
        if need > config.sram_words:
            raise MemoryNeedError(f"{what} on a {config.mesh} mesh needs {need} words per PE ({buffer_words} of "
                                  f"data + {program.data_end} of program) but sram_words is {config.sram_words}", need)
        return program.data_end

    def describe(self, sizes: dict) -> str:
        """The sizes in a few words, for the readable summary."""
        return ", ".join(f"{k}={v}" for k, v in sizes.items())

    @abc.abstractmethod
    def plan(self, config: FabricConfig, sizes: dict):
        """Layout, program and addresses for ``sizes`` on ``config``; raises
        :class:`UsageError` when the data does not fit."""

    @abc.abstractmethod
    def inputs(self, plan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Random float32 inputs."""

    @abc.abstractmethod
    def reference(self, plan, inputs) -> tuple[np.ndarray, np.ndarray]:
        """``(bits, exact)``: the expected ``uint32`` result in the documented
        order of operations, and the float64 result of the same inputs."""

    @abc.abstractmethod
    def execute(self, device, plan, inputs) -> tuple[np.ndarray, int]:
        """Load, route, fill, launch and run on ``device`` (any
        :class:`wse.sim.api.Device`); returns the result bits (same shape as
        the reference) and the cycles run."""

