"""Argument checks and edge outputs of the host API (``docs/architecture.md`` section 5), shared by every device.

The golden model (:class:`wse.sim.golden.Fabric`) and the RTL backends
(:class:`wse.sim.cosim.device.RtlFabric`) accept the same arguments and
reject the same mistakes with the same :class:`~wse.config.UsageError`
messages; :class:`HostArgs` is that part, written once. A device using it
has ``width``, ``height``, ``colors`` and ``config`` (a
:class:`~wse.config.FabricConfig`).
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

from wse.config import Port, UsageError

__all__ = ["HostArgs", "EDGE_NAMES", "host_words", "stream_words", "Rect", "check_rect", "keep_ranges",
           "kept_words"]

Rect = tuple[int, int, int, int]  # x0, y0, width, height

#: The mesh's edges, in the order the RTL backends number their edge ports.
EDGE_NAMES = ("N", "E", "S", "W")


def host_words(array, what: str = "memcpy_h2d data") -> np.ndarray:
    """``array`` as 32-bit words: float32 by bit pattern, integers modulo 2**32.

    Raises
    ------
    UsageError
        For any other element type (``what`` names the argument).
    """
    arr = np.asarray(array)
    if arr.dtype == np.float32:
        return arr.view(np.uint32)
    if arr.dtype == np.uint32:
        return arr
    if not np.issubdtype(arr.dtype, np.integer):
        raise UsageError(f"{what} must be float32 or integer words, not {arr.dtype}")
    return (arr.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)


def stream_words(words, ctrl=None) -> tuple[np.ndarray, np.ndarray]:
    """``stream_in``'s wavelets as ``(uint32 data, uint8 ctrl flags)`` of equal length.

    ``words`` are float values (rounded to float32, sent by bit pattern) or
    integer patterns (modulo 2**32); ``ctrl`` is None (all data wavelets),
    one flag for all, or one flag per wavelet.
    """
    arr = np.atleast_1d(np.asarray(words))
    if np.issubdtype(arr.dtype, np.floating):
        data = arr.astype(np.float32).view(np.uint32)
    elif np.issubdtype(arr.dtype, np.integer):
        data = (arr.astype(np.int64) & 0xFFFFFFFF).astype(np.uint32)
    else:
        raise UsageError(f"stream_in words must be float or integer values, not {arr.dtype}")
    if ctrl is None:
        flags = np.zeros(len(data), dtype=np.uint8)
    else:
        try:
            flags = (np.broadcast_to(np.asarray(ctrl, dtype=np.int64), (len(data),)) & 1).astype(np.uint8)
        except ValueError:
            raise UsageError(f"stream_in ctrl must be one flag or one per wavelet ({len(data)}), "
                             f"not shape {np.shape(ctrl)}") from None
    return np.ascontiguousarray(data.ravel()), np.ascontiguousarray(flags)


def check_rect(rect, width: int, height: int) -> Rect:
    """``rect`` (x0, y0, width, height) checked against a ``width`` x ``height`` mesh, or the whole mesh for None.

    Raises:
        UsageError: a rect that is not four integers or does not fit the mesh.
    """
    if rect is None:
        return (0, 0, width, height)
    try:
        x0, y0, w, h = (int(v) for v in rect)
    except (TypeError, ValueError):
        raise UsageError(f"rect must be (x0, y0, width, height), not {rect!r}") from None
    if w < 1 or h < 1 or x0 < 0 or y0 < 0 or x0 + w > width or y0 + h > height:
        raise UsageError(f"rect {rect!r} does not fit the {width}x{height} mesh")
    return x0, y0, w, h


def keep_ranges(keep, program, sram_words: int) -> list[tuple[int, int]]:
    """``load``'s ``keep``: data-word ranges ``(lo, hi)`` (``lo`` included, ``hi`` not) that a load leaves
    as they are, checked against the memory and the program's data segments (the same message on every
    device).

    Raises:
        UsageError: ``keep`` is not a sequence of integer pairs with ``0 <= lo <= hi <= sram_words``, or a
            data segment of ``program`` writes a kept word (a load keeps a word or writes it, not both).
    """
    expected = f"load keep must be a sequence of (lo, hi) word ranges with 0 <= lo <= hi <= {sram_words}"
    if isinstance(keep, (str, bytes)):
        raise UsageError(f"{expected}, not {keep!r}")
    try:
        ranges = [(int(lo), int(hi)) for lo, hi in keep]
    except (TypeError, ValueError):
        raise UsageError(f"{expected}, not {keep!r}") from None
    for (lo, hi), given in zip(ranges, keep):
        if not (0 <= lo <= hi <= sram_words) or any(isinstance(v, bool) or int(v) != v for v in given):
            raise UsageError(f"{expected}, not {given!r}")
    ranges = [(lo, hi) for lo, hi in ranges if hi > lo]
    for addr, words in program.data:
        end = addr + len(words)
        for lo, hi in ranges:
            if addr < hi and lo < end:
                raise UsageError(f"program {program.source} has data at words {max(addr, lo)}..{min(end, hi) - 1}, "
                                 f"inside the kept range ({lo}, {hi}); a load keeps a word or writes it, not both")
    return ranges


def kept_words(ranges: list[tuple[int, int]], sram_words: int) -> np.ndarray:
    """A ``bool [sram_words]`` mask of the words in ``ranges``."""
    mask = np.zeros(sram_words, dtype=bool)
    for lo, hi in ranges:
        mask[lo:hi] = True
    return mask


class HostArgs:
    """Checks of the host API's arguments against the device's mesh, its route
    tables and its edge outputs (a mixin of the fabric models).

    The device keeps its route tables in ``routers`` (``set_route(x, y, color,
    input, outputs)`` and ``route(tile, color)``, as
    :class:`wse.sim.golden.router.Routers` has them) and collects the wavelets
    leaving the mesh in ``edge_out``: ``{(edge, index, color): [(data, ctrl),
    ...]}`` in the order they left.
    """

    width: int
    height: int
    colors: int
    edge_out: dict
    routers: Any

    def set_route(self, x: int, y: int, color: int, input: Port | int | None, outputs: Iterable[Port | int]) -> None:
        """Route ``color`` at router ``(x, y)``: accepted from ``input`` (None: not
        routed), sent to every port in ``outputs``."""
        self._tile(x, y)
        self._check_color(color)
        self.routers.set_route(x, y, color, input, outputs)

    def load_routes(self, table: Iterable[tuple]) -> None:
        """Apply many routes: an iterable of ``(x, y, color, input, outputs)``."""
        for x, y, color, input, outputs in table:
            self.set_route(x, y, color, input, outputs)

    def route(self, x: int, y: int, color: int) -> tuple[int, tuple[Port, ...]]:
        """The route of ``color`` at ``(x, y)``: (input code, output ports)."""
        return self.routers.route(self._tile(x, y), color)

    def stream_out(self, edge: str, index: int, color: int, with_ctrl: bool = False):
        """Take the wavelets that left the mesh at ``(edge, index)`` on ``color``:
        a uint32 array of data (and, with ``with_ctrl``, a uint8 array of ctrl flags)."""
        edge, index = self._edge_key(edge, index)
        got = self.edge_out.pop((edge, index, color), [])
        data = np.array([d for d, _ in got], dtype=np.uint32)
        if with_ctrl:
            return data, np.array([c for _, c in got], dtype=np.uint8)
        return data

    def pending_out(self) -> dict[tuple[str, int, int], int]:
        """Counts of collected, not yet taken, edge output wavelets by ``(edge, index, color)``."""
        return {k: len(v) for k, v in self.edge_out.items() if v}

    def _rect(self, rect) -> Rect:
        """``rect`` checked, or the whole mesh for None."""
        return check_rect(rect, self.width, self.height)

    def _tile(self, x: int, y: int) -> int:
        """The row-major index of PE ``(x, y)``, checked."""
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise UsageError(f"PE ({x}, {y}) is outside the {self.width}x{self.height} mesh")
        return y * self.width + x

    def _check_color(self, color) -> int:
        if not 0 <= color < self.colors:
            raise UsageError(f"color must be in 0..{self.colors - 1}, not {color!r}")
        return int(color)

    def _edge_key(self, edge: str, index: int) -> tuple[str, int]:
        """``(edge, index)`` of an edge port, checked (``edge`` in any case)."""
        edge = str(edge).upper()
        if edge not in EDGE_NAMES:
            raise UsageError(f"edge must be one of N, E, S, W, not {edge!r}")
        limit = self.width if edge in ("N", "S") else self.height
        if not 0 <= index < limit:
            raise UsageError(f"index {index} is outside edge {edge} (0..{limit - 1})")
        return edge, int(index)

    def _h2d_array(self, array, rect) -> tuple[Rect, np.ndarray]:
        """``memcpy_h2d``'s ``(rect, uint32 words [h, w, n])``: ``[n]`` goes to every PE of ``rect``."""
        x0, y0, w, h = self._rect(rect)
        arr = host_words(array)
        if arr.ndim == 1:
            arr = np.broadcast_to(arr, (h, w, arr.shape[0]))
        if arr.ndim != 3 or arr.shape[:2] != (h, w):
            raise UsageError(f"memcpy_h2d data must have shape [{h}, {w}, n] for rect {(x0, y0, w, h)}, "
                             f"not {list(arr.shape)}")
        return (x0, y0, w, h), arr

    def _check_span(self, call: str, addr: int, n: int) -> None:
        """Words ``addr .. addr+n-1`` must lie in the data memory."""
        words = self.config.sram_words
        if not (0 <= addr and n >= 0 and addr + n <= words):
            raise UsageError(f"{call} of {n} words at {addr} leaves memory 0..{words - 1}")
