"""The one fabric configuration object, read by the HDL, the golden model, the
compiler and the tests, plus the wavelet format and router port numbering.

Everything that sizes the fabric (mesh shape, memories, colors, queue depths)
is a field of :class:`FabricConfig`; nothing else in the project writes those
numbers down a second time.
"""

from __future__ import annotations

import dataclasses
import enum
import re

__all__ = [
    "FabricConfig", "Port", "UsageError", "MemoryNeedError",
    "WAVELET_BITS", "DATA_BITS", "COLOR_BITS", "CTRL_BITS",
    "pack_wavelet", "unpack_wavelet", "parse_mesh", "route_outputs",
]


class UsageError(ValueError):
    """A mistake in what a user asked for: reported as one sentence, exit code 2."""


class MemoryNeedError(UsageError):
    """A refusal because a PE's data memory is too small: ``need`` is the words per PE that were asked
    for (the message says it too; callers that search for the least memory read ``need``, not the text)."""

    def __init__(self, message: str, need: int | None = None):
        super().__init__(message)
        self.need = need


# Wavelet: 38 bits = data[31:0] | color[36:32] | ctrl[37].
DATA_BITS = 32
COLOR_BITS = 5
CTRL_BITS = 1
WAVELET_BITS = DATA_BITS + COLOR_BITS + CTRL_BITS
COLOR_SHIFT = DATA_BITS
CTRL_SHIFT = DATA_BITS + COLOR_BITS


def pack_wavelet(data: int, color: int, ctrl: int = 0) -> int:
    """Pack a wavelet into its 38-bit integer form (data in bits 31..0,
    color in 36..32, control flag in 37)."""
    return (data & 0xFFFFFFFF) | ((color & 0x1F) << COLOR_SHIFT) | ((ctrl & 1) << CTRL_SHIFT)


def unpack_wavelet(word: int) -> tuple[int, int, int]:
    """Split a 38-bit wavelet into ``(data, color, ctrl)``."""
    return word & 0xFFFFFFFF, (word >> COLOR_SHIFT) & 0x1F, (word >> CTRL_SHIFT) & 1


class Port(enum.IntEnum):
    """Router ports. N, E, S, W lead to the neighbours (or the mesh edge);
    RAMP leads to and from the tile's own PE. The values are the 3-bit
    encoding used in route tables."""
    N = 0
    E = 1
    S = 2
    W = 3
    RAMP = 4

    @property
    def opposite(self) -> "Port":
        """The port on the neighbouring router that this port's link reaches."""
        return {Port.N: Port.S, Port.S: Port.N, Port.E: Port.W, Port.W: Port.E}[self]

    @property
    def delta(self) -> tuple[int, int]:
        """``(dx, dy)`` to the neighbour this port leads to; y grows southward."""
        return {Port.N: (0, -1), Port.S: (0, 1), Port.E: (1, 0), Port.W: (-1, 0)}[self]


#: Route-table input code meaning "this color is not routed here".
ROUTE_INPUT_NONE = 7


def route_outputs(x: int, y: int, outputs, width: int, height: int) -> tuple[int, list[tuple[Port, int | None]]]:
    """Where a route's ``outputs`` at router ``(x, y)`` of a ``width`` x ``height`` mesh lead.

    Returns ``(mask, targets)``: the route table's output bit mask and, for
    each distinct port in the order given (repeats ignored), ``(port,
    neighbour)`` where ``neighbour`` is the row-major index of the router
    the port's link reaches, or None for ``RAMP`` and for a port on the
    mesh edge (tell them apart by the port).
    """
    mask, targets = 0, []
    for port in outputs:
        port = Port(port)
        if mask >> port & 1:
            continue
        mask |= 1 << port
        neighbour = None
        if port is not Port.RAMP:
            dx, dy = port.delta
            nx, ny = x + dx, y + dy
            if 0 <= nx < width and 0 <= ny < height:
                neighbour = ny * width + nx
        targets.append((port, neighbour))
    return mask, targets

_MESH_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_mesh(text: str) -> tuple[int, int]:
    """Parse ``"WxH"`` into ``(width, height)``; raises :class:`UsageError`."""
    match = _MESH_RE.match(str(text))
    if not match:
        raise UsageError(f"mesh must be WIDTHxHEIGHT such as 4x4, not {text!r}")
    width, height = int(match.group(1)), int(match.group(2))
    if width < 1 or height < 1:
        raise UsageError(f"mesh must have at least one column and one row, not {text!r}")
    return width, height


@dataclasses.dataclass(frozen=True)
class FabricConfig:
    """Sizes of the fabric.

    Parameters
    ----------
    width, height:
        Mesh shape in tiles (columns, rows). PE ``(x, y)``: x grows east, y south.
    sram_words:
        Data memory of each PE, in 32-bit words.
    imem_words:
        Instruction memory of each PE, in 32-bit instructions.
    colors:
        Number of colors (virtual channels); at most 32, the 5-bit color field.
    router_depth:
        Per-color buffer depth in each router (2 sustains one wavelet per cycle).
    rx_depth:
        Per-color input queue depth at each PE.
    tx_depth:
        Depth of each PE's output queue toward its router.
    tasks:
        Number of task slots per PE (ids ``0 .. tasks-1``); ids below
        ``colors`` can be bound to the color of the same number.
    registers:
        Scalar registers per PE (``r0`` reads as zero).
    dsd_registers:
        Data-structure-descriptor registers per PE.

    The configuration is also a context manager: ``with cfg:`` makes it the
    default returned by :meth:`current`.
    """

    width: int = 4
    height: int = 4
    sram_words: int = 8192
    imem_words: int = 1024
    colors: int = 16
    router_depth: int = 2
    rx_depth: int = 2
    tx_depth: int = 3
    tasks: int = 32
    registers: int = 16
    dsd_registers: int = 8

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise UsageError(msg)
        for name in ("width", "height"):
            value = getattr(self, name)
            need(isinstance(value, int) and value >= 1, f"{name} must be a positive integer, not {value!r}")
        need(isinstance(self.sram_words, int) and 16 <= self.sram_words <= 65536,
             f"sram_words must be an integer in 16..65536, not {self.sram_words!r}")
        need(isinstance(self.imem_words, int) and 16 <= self.imem_words <= 65536,
             f"imem_words must be an integer in 16..65536, not {self.imem_words!r}")
        need(isinstance(self.colors, int) and 1 <= self.colors <= 32,
             f"colors must be an integer in 1..32, not {self.colors!r}")
        for name in ("router_depth", "rx_depth", "tx_depth"):
            value = getattr(self, name)
            need(isinstance(value, int) and 1 <= value <= 64, f"{name} must be an integer in 1..64, not {value!r}")
        need(isinstance(self.tasks, int) and self.colors <= self.tasks <= 64,
             f"tasks must be an integer in colors..64, not {self.tasks!r}")
        need(self.registers == 16, f"registers must be 16 (the encoding has 4-bit fields), not {self.registers!r}")
        need(self.dsd_registers == 8, f"dsd_registers must be 8 (the encoding has 3-bit fields), not {self.dsd_registers!r}")

    # Derived values -----------------------------------------------------
    @property
    def num_pes(self) -> int:
        """Tiles in the mesh."""
        return self.width * self.height

    @property
    def mesh(self) -> str:
        """The mesh as ``"WxH"``."""
        return f"{self.width}x{self.height}"

    @property
    def sram_addr_bits(self) -> int:
        """Bits of a data-memory word address."""
        return max(1, (self.sram_words - 1).bit_length())

    @property
    def imem_addr_bits(self) -> int:
        """Bits of an instruction address."""
        return max(1, (self.imem_words - 1).bit_length())

    @property
    def task_bits(self) -> int:
        """Bits of a task id."""
        return max(1, (self.tasks - 1).bit_length())

    def with_mesh(self, width: int, height: int) -> "FabricConfig":
        """The same configuration on another mesh shape."""
        return dataclasses.replace(self, width=width, height=height)

    def replace(self, **changes) -> "FabricConfig":
        """A copy with some fields changed (checked like the original)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain-dict form, for executables and reports."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "FabricConfig":
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - fields)
        if unknown:
            raise UsageError(f"fabric config has unknown fields {unknown}; expected some of {sorted(fields)}")
        return cls(**data)

    # Context-manager default ---------------------------------------------
    def __enter__(self) -> "FabricConfig":
        _DEFAULT_STACK.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _DEFAULT_STACK.pop()

    @staticmethod
    def current() -> "FabricConfig":
        """The innermost configuration entered with ``with``, else the defaults."""
        return _DEFAULT_STACK[-1] if _DEFAULT_STACK else FabricConfig()


_DEFAULT_STACK: list[FabricConfig] = []
