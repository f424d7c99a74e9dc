"""Defect tolerance: a fabric with dead PEs and links runs a smaller, perfect logical mesh (``docs/faults.md`` section 4).

A :class:`DefectMap` names the dead parts of a physical mesh (dead PEs, dead
links), read from ``--defects SPEC`` by :func:`parse_defects`. The rule is
the wafer's: a dead PE's core is unusable but its router still forwards; a
dead link between E/W neighbours takes its row out, one between N/S
neighbours its column. :func:`plan_remap` chooses which physical rows and
columns to give up so that every dead PE lies in one of them (the largest
usable logical mesh, deterministically) and returns a :class:`Remap`.

:class:`DefectDevice` runs the logical mesh on a physical device through
the host API (:class:`wse.sim.api.Device`), so every kernel and compiler
works unchanged: logical ``(x, y)`` are mapped to physical coordinates for
loads, memory copies, launches, registers and counters; every logical route
is installed at its physical router, and every router of a removed row or
column that lies on a logical link (or between the mesh edge and the first
kept router) gets a pass-through route for the colors that cross it
(:class:`RouteMapper`). A color that would cross such a router in both
directions is refused (:class:`DefectError`: the route table holds one
route per color per router). The physical device is told the defects
(``kill``, where it has it: the golden model and the RTL devices), so a mapping mistake ends in
its hang report naming the dead part, never in silent success.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from wse.config import ROUTE_INPUT_NONE, FabricConfig, Port, UsageError

from .golden.hostargs import check_rect

__all__ = ["DefectMap", "DefectError", "Remap", "RouteMapper", "DefectDevice", "parse_defects", "plan_remap",
           "physical_routes", "check_physical", "defect_factory"]

_ONE = re.compile(r"^\s*(\d+)\s*,\s*(\d+)\s*(?:,\s*([NnEeSsWw])\s*)?$")
#: Subsets of candidate rows (or columns) tried exhaustively; above it the cover is greedy.
_EXHAUSTIVE = 16


class DefectError(UsageError):
    """A defect map or a route set that the remapping cannot serve (one line, exit code 2)."""


@dataclasses.dataclass(frozen=True)
class DefectMap:
    """The dead parts of a ``width x height`` physical mesh.

    Members
    -------
    width, height:
        The physical mesh.
    pes:
        Dead PEs as ``(x, y)``.
    links:
        Dead links as ``(x, y, "E")`` (between ``(x, y)`` and ``(x+1, y)``)
        or ``(x, y, "S")`` (between ``(x, y)`` and ``(x, y+1)``).
    spec:
        The text it was read from, for reports.
    """
    width: int
    height: int
    pes: frozenset = frozenset()
    links: frozenset = frozenset()
    spec: str = ""

    def describe(self) -> str:
        """One line: the dead parts."""
        pes = " ".join(f"({x},{y})" for x, y in sorted(self.pes)) or "none"
        links = " ".join(f"({x},{y})-{p}" for x, y, p in sorted(self.links)) or "none"
        return (f"defects {self.spec or 'given'} on the {self.width}x{self.height} mesh: "
                f"{len(self.pes)} dead PE(s) {pes}; {len(self.links)} dead link(s) {links}")


def _part(x: int, y: int, port: str | None, width: int, height: int, what: str) -> tuple:
    """One dead part checked against the mesh: ``(x, y)`` or ``(x, y, "E"|"S")`` (W and N normalized)."""
    if not (0 <= x < width and 0 <= y < height):
        raise DefectError(f"{what}: PE ({x}, {y}) is outside the {width}x{height} mesh")
    if port is None:
        return (x, y)
    p = Port[port.upper()]
    dx, dy = p.delta
    nx, ny = x + dx, y + dy
    if not (0 <= nx < width and 0 <= ny < height):
        raise DefectError(f"{what}: router ({x}, {y}) has no neighbour toward {p.name} on the {width}x{height} mesh")
    if p in (Port.W, Port.N):
        return (nx, ny, p.opposite.name)
    return (x, y, p.name)


def parse_defects(spec: str, width: int, height: int, what: str = "--defects") -> DefectMap:
    """A defect map of the ``width x height`` mesh from ``spec``.

    ``spec`` is ``random:FRACTION,SEED`` (``round(FRACTION * width * height)``
    dead PEs drawn without repeats by ``numpy.random.default_rng(SEED)``,
    FRACTION in ``[0, 0.5]``), an inline list ``X,Y[,PORT][;X,Y[,PORT]...]``
    (a dead PE, or the link leaving router ``(X, Y)`` through ``PORT``: N, E,
    S or W), or the path of a text file with one such part per line (``#``
    starts a comment).

    Raises
    ------
    DefectError
        One line naming ``what`` and what was expected.
    """
    form = (f"{what} must be random:FRACTION,SEED (FRACTION in [0, 0.5], SEED a non-negative integer), "
            "X,Y[,PORT][;X,Y[,PORT]...] or a file of such lines")
    text = str(spec).strip()
    if text.startswith("random:"):
        parts = text[len("random:"):].split(",")
        try:
            fraction, seed = float(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            raise DefectError(f"{form}, not {spec!r}") from None
        if len(parts) != 2 or not 0 <= fraction <= 0.5 or seed < 0:
            raise DefectError(f"{form}, not {spec!r}")
        count = int(round(fraction * width * height))
        chosen = np.random.default_rng(seed).choice(width * height, size=count, replace=False)
        return DefectMap(width, height, frozenset((int(i) % width, int(i) // width) for i in chosen), frozenset(),
                         text)
    if text and all(_ONE.match(item) for item in text.split(";")):
        lines, where = text.split(";"), what
    elif text and Path(text).is_file():
        try:
            raw = Path(text).read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise DefectError(f"{what} {text!r}: cannot read the file ({exc})") from None
        lines = [line.split("#", 1)[0] for line in raw]
        lines, where = [line for line in lines if line.strip()], f"{what} file {text!r}"
        bad = [line for line in lines if not _ONE.match(line)]
        if bad:
            raise DefectError(f"{where}: each line must be X,Y or X,Y,PORT (PORT N, E, S or W), not {bad[0].strip()!r}")
    else:
        raise DefectError(f"{form}, not {spec!r}")
    pes, links = set(), set()
    for line in lines:
        x, y, port = _ONE.match(line).groups()
        part = _part(int(x), int(y), port, width, height, where)
        (pes if len(part) == 2 else links).add(part)
    return DefectMap(width, height, frozenset(pes), frozenset(links), text)


@dataclasses.dataclass(frozen=True)
class Remap:
    """The logical mesh a defect map leaves: which physical rows and columns are kept.

    Members
    -------
    defects:
        The map it serves.
    rows, cols:
        The kept physical rows and columns, ascending: logical ``(x, y)`` is
        physical ``(cols[x], rows[y])``.
    """
    defects: DefectMap
    rows: tuple[int, ...]
    cols: tuple[int, ...]

    @property
    def width(self) -> int:
        """The logical mesh's width."""
        return len(self.cols)

    @property
    def height(self) -> int:
        """The logical mesh's height."""
        return len(self.rows)

    @property
    def removed_rows(self) -> tuple[int, ...]:
        """The physical rows given up."""
        return tuple(r for r in range(self.defects.height) if r not in self.rows)

    @property
    def removed_cols(self) -> tuple[int, ...]:
        """The physical columns given up."""
        return tuple(c for c in range(self.defects.width) if c not in self.cols)

    def physical(self, x: int, y: int) -> tuple[int, int]:
        """Physical coordinates of logical PE ``(x, y)``."""
        return self.cols[x], self.rows[y]

    def physical_config(self, config: FabricConfig) -> FabricConfig:
        """``config`` (of the logical mesh) with the physical mesh's shape."""
        return config.replace(width=self.defects.width, height=self.defects.height)

    def describe(self) -> str:
        """Two lines: the defects, and the rows and columns given up with the usable mesh."""
        d = self.defects
        gone = ", ".join(filter(None, [f"rows {list(self.removed_rows)}" if self.removed_rows else "",
                                       f"columns {list(self.removed_cols)}" if self.removed_cols else ""]))
        return (f"{d.describe()}\nusable mesh {self.width}x{self.height} of {d.width}x{d.height} "
                f"(spare {gone or 'nothing'} given up)")


def _cover_score(defects: DefectMap, rows: set, cols: set) -> tuple:
    """Sort key of a cover: the largest usable area, then the squarer mesh, then the earliest lines given up."""
    w, h = defects.width - len(cols), defects.height - len(rows)
    return (-(w * h), abs(w - h), sorted(rows), sorted(cols))


def plan_remap(defects: DefectMap) -> Remap:
    """The rows and columns to give up so that no kept PE is dead and no kept
    link is dead (a dead E/W link gives up its row, a dead N/S link its column).

    Among the covers of the dead PEs, the one with the largest usable mesh,
    then the squarest, then the earliest rows and columns. Exhaustive over
    the subsets of the rows (or columns, whichever are fewer) holding dead PEs
    up to 16 of them, greedy above.

    Raises
    ------
    DefectError
        When nothing usable is left.
    """
    rows = {y for _, y, p in defects.links if p == "E"}
    cols = {x for x, _, p in defects.links if p == "S"}
    left = sorted((x, y) for x, y in defects.pes if x not in cols and y not in rows)
    cand_rows, cand_cols = sorted({y for _, y in left}), sorted({x for x, _ in left})
    best = None
    if min(len(cand_rows), len(cand_cols)) <= _EXHAUSTIVE:
        by_rows = len(cand_rows) <= len(cand_cols)
        cand = cand_rows if by_rows else cand_cols
        for n in range(len(cand) + 1):
            for pick in itertools.combinations(cand, n):
                chosen = set(pick)
                if by_rows:
                    r, c = rows | chosen, cols | {x for x, y in left if y not in chosen}
                else:
                    r, c = rows | {y for x, y in left if x not in chosen}, cols | chosen
                key = _cover_score(defects, r, c)
                if best is None or key < best[0]:
                    best = (key, r, c)
        _, rows, cols = best
    else:
        rows, cols = set(rows), set(cols)
        while left:
            by_row, by_col = {}, {}
            for x, y in left:
                by_row[y] = by_row.get(y, 0) + 1
                by_col[x] = by_col.get(x, 0) + 1
            row = max(sorted(by_row), key=lambda k: by_row[k])
            col = max(sorted(by_col), key=lambda k: by_col[k])
            if by_row[row] >= by_col[col]:
                rows.add(row)
            else:
                cols.add(col)
            left = [(x, y) for x, y in left if x not in cols and y not in rows]
    kept_rows = tuple(r for r in range(defects.height) if r not in rows)
    kept_cols = tuple(c for c in range(defects.width) if c not in cols)
    if not kept_rows or not kept_cols:
        raise DefectError(f"{defects.spec or 'the defect map'}: no usable mesh is left of the "
                          f"{defects.width}x{defects.height} mesh once the defective rows and columns are given up")
    return Remap(defects, kept_rows, kept_cols)


_DIRS = (Port.N, Port.E, Port.S, Port.W)


def _route_key(input, outputs) -> tuple[int | None, frozenset]:
    """A route as ``(input port code or None, frozenset of output ports)``."""
    code = None if input is None or int(input) == ROUTE_INPUT_NONE else int(Port(input))
    return code, frozenset(Port(int(p)) for p in outputs)


class RouteMapper:
    """Logical routes to physical ones, incrementally (one logical route at a time).

    :meth:`set` records logical route ``(x, y, color)`` and returns the
    physical route-table writes it causes: the route itself at its physical
    router, and the pass-through routes of the removed routers on the four
    segments of logical links (or edge approaches) around it.
    """

    def __init__(self, remap: Remap):
        self.remap = remap
        self.routes: dict[tuple[int, int, int], tuple[int | None, frozenset]] = {}
        self.passes: dict[tuple[int, int, int], Port | None] = {}

    def _outputs(self, x: int, y: int, color: int) -> frozenset:
        return self.routes.get((x, y, color), (None, frozenset()))[1]

    def segment(self, x: int, y: int, port: Port) -> list[tuple[int, int]]:
        """The removed physical routers between logical router ``(x, y)`` and
        its neighbour toward ``port`` (or the mesh edge), nearest first."""
        rm = self.remap
        px, py = rm.physical(x, y)
        if port in (Port.E, Port.W):
            line, at, i, end = rm.cols, px, x, rm.defects.width
        else:
            line, at, i, end = rm.rows, py, y, rm.defects.height
        if port in (Port.E, Port.S):
            stop = line[i + 1] if i + 1 < len(line) else end
            span = range(at + 1, stop)
        else:
            stop = line[i - 1] if i > 0 else -1
            span = range(at - 1, stop, -1)
        return [(v, py) if port in (Port.E, Port.W) else (px, v) for v in span]

    def _flow(self, x: int, y: int, port: Port, color: int) -> tuple[bool, bool]:
        """Whether ``color`` leaves ``(x, y)`` toward ``port`` and whether it arrives from there."""
        rm = self.remap
        out = port in self._outputs(x, y, color)
        dx, dy = port.delta
        nx, ny = x + dx, y + dy
        if 0 <= nx < rm.width and 0 <= ny < rm.height:
            into = port.opposite in self._outputs(nx, ny, color)
        else:
            into = self.routes.get((x, y, color), (None,))[0] == int(port)
        return out, into

    def set_many(self, routes: Iterable[tuple]) -> list[tuple]:
        """Record logical routes ``(x, y, color, input, outputs)`` (all of them
        first, so a route set that turns a color around between runs is judged
        as a whole); the physical writes ``(x, y, color, input, outputs)`` they need.

        Raises
        ------
        DefectError
            If a removed router would have to pass a color both ways.
        """
        writes, touched = [], []
        for x, y, color, input, outputs in routes:
            key = _route_key(input, outputs)
            self.routes[(x, y, color)] = key
            px, py = self.remap.physical(x, y)
            writes.append((px, py, color, key[0], sorted(key[1])))
            touched.append((x, y, color))
        for x, y, color in dict.fromkeys(touched):
            writes += self._passes(x, y, color)
        return writes

    def _passes(self, x: int, y: int, color: int) -> list[tuple]:
        """The pass-through writes of the four segments around logical router ``(x, y)`` for ``color``."""
        writes = []
        for port in _DIRS:
            routers = self.segment(x, y, port)
            if not routers:
                continue
            out, into = self._flow(x, y, port, color)
            if out and into:
                rx, ry = routers[0]
                raise DefectError(f"color {color} would cross the spare router ({rx}, {ry}) both ways (toward "
                                  f"{port.name} and back) next to logical router ({x}, {y}); a router has one route "
                                  f"per color, so this route set cannot run around the defects "
                                  f"({self.remap.defects.spec or 'defect map'})")
            want = port if out else port.opposite if into else None
            for rx, ry in routers:
                if self.passes.get((rx, ry, color)) is want:
                    continue
                self.passes[(rx, ry, color)] = want
                writes.append((rx, ry, color, None, []) if want is None
                              else (rx, ry, color, int(want.opposite), [want]))
        return writes


def _runs(values: tuple[int, ...], start: int, count: int) -> list[tuple[int, int, int]]:
    """``values[start:start+count]`` as runs of consecutive numbers: ``(logical start, physical start, length)``."""
    runs = []
    for i in range(start, start + count):
        if runs and values[i] == runs[-1][1] + runs[-1][2]:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((i, values[i], 1))
    return runs


class DefectDevice:
    """A logical mesh on a physical device with defects (the host API of :class:`wse.sim.api.Device`).

    Parameters
    ----------
    device:
        The physical device (its mesh is the defect map's).
    remap:
        From :func:`plan_remap`.
    config:
        The logical fabric (default: the physical device's with the usable shape).

    The physical device is told the dead parts (``kill``) when it can model
    them. ``counters()["wavelet_hops"]`` counts physical hops (the pass-through
    routers' included); the per-PE counters are the kept PEs'.
    """

    def __init__(self, device, remap: Remap, config: FabricConfig | None = None):
        d = remap.defects
        if (device.width, device.height) != (d.width, d.height):
            raise DefectError(f"the defect map is for a {d.width}x{d.height} mesh, the device has "
                              f"{device.width}x{device.height}")
        self.device, self.remap = device, remap
        self.config = config or device.config.replace(width=remap.width, height=remap.height)
        self.width, self.height, self.colors = remap.width, remap.height, device.colors
        self.backend = device.backend
        self.mapper = RouteMapper(remap)
        #: Whether the physical device models the dead parts (its ``kill``: the golden model, the RTL devices).
        self.models_defects = hasattr(device, "kill")
        if self.models_defects:
            for x, y in sorted(d.pes):
                device.kill(x, y)
            for x, y, port in sorted(d.links):
                device.kill(x, y, port)

    # ------------------------------------------------------------------ coordinates
    def _rect(self, rect) -> tuple[int, int, int, int]:
        return check_rect(rect, self.width, self.height)

    def _blocks(self, rect):
        """The physical rectangles of logical ``rect``: ``(physical rect, logical y0, x0, h, w)``
        relative to ``rect``'s corner."""
        x0, y0, w, h = self._rect(rect)
        for ly, py, bh in _runs(self.remap.rows, y0, h):
            for lx, px, bw in _runs(self.remap.cols, x0, w):
                yield (px, py, bw, bh), ly - y0, lx - x0, bh, bw

    def _xy(self, x: int, y: int) -> tuple[int, int]:
        if not (0 <= x < self.width and 0 <= y < self.height):
            raise UsageError(f"PE ({x}, {y}) is outside the {self.width}x{self.height} mesh")
        return self.remap.physical(x, y)

    def _edge(self, edge: str, index: int) -> tuple[str, int]:
        edge = str(edge).upper()
        if edge not in ("N", "E", "S", "W"):
            raise UsageError(f"edge must be one of N, E, S, W, not {edge!r}")
        line = self.remap.cols if edge in ("N", "S") else self.remap.rows
        if not 0 <= index < len(line):
            raise UsageError(f"index {index} is outside edge {edge} (0..{len(line) - 1})")
        return edge, line[index]

    def _logical_grid(self, grid) -> np.ndarray:
        """A physical ``[H, W, ...]`` array's kept rows and columns."""
        return np.asarray(grid)[np.ix_(self.remap.rows, self.remap.cols)]

    # ------------------------------------------------------------------ host API
    def load(self, program, rect=None, keep=()) -> None:
        """Load ``program`` into the physical PEs of logical ``rect``, keeping the ``keep`` word ranges."""
        for block, *_ in self._blocks(rect):
            self.device.load(program, block, keep)

    def set_route(self, x: int, y: int, color: int, input, outputs) -> None:
        """Route ``color`` at logical router ``(x, y)`` (and the spare routers around it)."""
        self.load_routes([(x, y, color, input, outputs)])

    def load_routes(self, table) -> None:
        """Apply logical routes at their physical routers, with the pass-through routes they need."""
        table = list(table)
        for x, y, color, _, _ in table:
            self._xy(x, y)
            if not 0 <= color < self.colors:
                raise UsageError(f"color must be in 0..{self.colors - 1}, not {color!r}")
        self.device.load_routes(self.mapper.set_many(table))

    def route(self, x: int, y: int, color: int):
        """The route of ``color`` at logical router ``(x, y)`` (as its physical router holds it)."""
        return self.device.route(*self._xy(x, y), color)

    def memcpy_h2d(self, addr: int, array, rect=None) -> None:
        """Write ``array[h, w, n]`` (or ``[n]`` for every PE) into the PEs of logical ``rect``."""
        x0, y0, w, h = self._rect(rect)
        arr = np.asarray(array)
        if arr.ndim == 3 and arr.shape[:2] != (h, w):
            raise UsageError(f"memcpy_h2d data must have shape [{h}, {w}, n] for rect {(x0, y0, w, h)}, "
                             f"not {list(arr.shape)}")
        for block, by, bx, bh, bw in self._blocks(rect):
            self.device.memcpy_h2d(addr, arr if arr.ndim != 3 else arr[by:by + bh, bx:bx + bw], block)

    def memcpy_d2h(self, addr: int, n: int, rect=None) -> np.ndarray:
        """Words ``addr .. addr+n-1`` of each PE of logical ``rect`` as ``uint32[h, w, n]``."""
        x0, y0, w, h = self._rect(rect)
        out = np.empty((h, w, n), dtype=np.uint32)
        for block, by, bx, bh, bw in self._blocks(rect):
            out[by:by + bh, bx:bx + bw] = self.device.memcpy_d2h(addr, n, block)
        return out

    def stream_in(self, edge: str, index: int, color: int, words, ctrl=None) -> None:
        """Queue wavelets at logical edge port ``(edge, index)`` (its physical port)."""
        self.device.stream_in(*self._edge(edge, index), color, words, ctrl)

    def stream_out(self, edge: str, index: int, color: int, with_ctrl: bool = False):
        """Take the wavelets that left at logical edge port ``(edge, index)``."""
        return self.device.stream_out(*self._edge(edge, index), color, with_ctrl)

    def pending_out(self) -> dict[tuple[str, int, int], int]:
        """Untaken edge outputs by logical ``(edge, index, color)`` (all of them leave at kept lines)."""
        out = {}
        for (edge, index, color), count in self.device.pending_out().items():
            line = self.remap.cols if edge in ("N", "S") else self.remap.rows
            out[(edge, line.index(index) if index in line else -1 - index, color)] = count
        return out

    def launch(self, task: int, rect=None) -> None:
        """Activate ``task`` on the physical PEs of logical ``rect``."""
        for block, *_ in self._blocks(rect):
            self.device.launch(task, block)

    def run(self, max_cycles: int | None = None) -> int:
        """Run the physical device; its cycles."""
        return self.device.run(max_cycles)

    def counters(self) -> dict:
        """The physical device's counters; per-PE ones of the kept PEs only (``[height, width]``)."""
        c = self.device.counters()
        return {**c, "pe": {k: self._logical_grid(v) for k, v in c["pe"].items()}}

    def reset_counters(self) -> None:
        """Zero every counter of the physical device."""
        self.device.reset_counters()

    def registers(self, x: int, y: int) -> list[int]:
        """The scalar registers of logical PE ``(x, y)``."""
        return self.device.registers(*self._xy(x, y))

    def check_remapped(self, routes, *, what: str, traffic: dict | None = None, rings=()):
        """:func:`check_physical` of logical ``routes`` as this device would install them (after the routes
        installed so far); raises ``DeadlockError`` or :class:`DefectError`, returns the proof."""
        return check_physical(self.remap, self.config, routes, what=what, traffic=traffic, rings=rings,
                              installed=self.mapper.routes)

    # ------------------------------------------------------------------ faults
    def inject(self, x: int, y: int, addr: int, bits, cycle: int | None = None) -> None:
        """Flip stored bits of a word of logical PE ``(x, y)`` (a device with memory ECC), now or armed at ``cycle``."""
        if not hasattr(self.device, "inject"):
            raise UsageError(f"inject needs a device with memory ECC, not {self.backend}")
        self.device.inject(*self._xy(x, y), addr, bits, cycle)

    def ecc_counters(self) -> dict[str, np.ndarray]:
        """Memory ECC counters of the kept PEs (``[height, width]``)."""
        if not hasattr(self.device, "ecc_counters"):
            raise UsageError(f"ecc_counters needs a device with memory ECC, not {self.backend}")
        return {k: self._logical_grid(v) for k, v in self.device.ecc_counters().items()}


def physical_routes(remap: Remap, routes, installed: dict | None = None) -> list[tuple]:
    """The physical entries ``(x, y, color, input, outputs)`` of logical ``routes`` on ``remap``'s mesh:
    each route at its physical router and the spare routers' pass-throughs it needs (after the logical
    routes ``installed``, a :attr:`RouteMapper.routes`, if given); a :class:`DefectError` if a spare
    router would have to pass a color both ways."""
    mapper = RouteMapper(remap)
    mapper.routes = dict(installed or {})
    return mapper.set_many(list(routes))


def check_physical(remap: Remap, config: FabricConfig, routes, *, what: str, traffic: dict | None = None,
                   rings=(), installed: dict | None = None):
    """The static deadlock check (:func:`wse.firmware.deadlock.check_routes`) of
    logical ``routes`` on the physical mesh of ``remap``: the physical routes
    with their pass-throughs (:func:`physical_routes`), the logical PEs'
    ``traffic`` and the ``rings``' members at their physical places; ``config``
    is the logical fabric (its queue depths are the physical mesh's).
    Returns the proof (its ``what`` says "around the defects").

    Raises
    ------
    DeadlockError
        If the physical route set can deadlock (the cycle, channel by channel).
    DefectError
        If a spare router would have to pass a color both ways.
    """
    from wse.firmware.deadlock import Ring, check_routes

    physical = physical_routes(remap, routes, installed)
    if traffic is not None:
        traffic = {remap.physical(x, y): flows for (x, y), flows in traffic.items()}
    rings = [Ring(r.name, tuple(remap.physical(x, y) + (a, b) for x, y, a, b in r.members), r.message,
                  r.receive_first) for r in rings]
    return check_routes(remap.physical_config(config), physical, what=f"{what} (around the defects)",
                        traffic=traffic, rings=rings)


def defect_factory(make: Callable[[FabricConfig], object], remap: Remap) -> Callable[[FabricConfig], DefectDevice]:
    """A device factory (``config -> device``) for the logical mesh of ``remap``:
    ``make`` builds the physical device, wrapped in a :class:`DefectDevice`.

    Raises
    ------
    DefectError
        (when called) for a config whose mesh is not the usable one.
    """
    def factory(config: FabricConfig) -> DefectDevice:
        if (config.width, config.height) != (remap.width, remap.height):
            raise DefectError(f"the defects leave a {remap.width}x{remap.height} mesh, not "
                              f"{config.width}x{config.height}")
        return DefectDevice(make(remap.physical_config(config)), remap, config)

    return factory
