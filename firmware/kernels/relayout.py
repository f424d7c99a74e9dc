"""``relayout``: move words between PEs over the fabric (``relayout.s``), the
layout changes of the GPT's step (``docs/transformer.md`` section 11): a
head's ``q``, ``k``, ``v`` from the streamed GEMM's layout (feature ``k`` on
mesh row ``k mod H``, token blocks over the columns) into the attention's
row and key buffers, the heads' outputs and gradients back.

A relayout is given word by word: word ``i`` goes from ``(x, y, address)``
of ``src[i]`` to ``(x, y, address)`` of ``dst[i]`` (a source word may go to
several destinations). :func:`plan_relayout` groups the words into *pieces*
(runs with one source stride and one destination stride, a ``.dsd`` each) and
routes every piece in dimension order: along its mesh row to the destination
column (the **row stage**), then along that column to the destination row
(the **column stage**); a piece that turns is kept in a staging buffer of
the PE where it turns. A stage is one program run: a chain east and a chain
west along every row (or south and north along every column), each PE
taking in turn one of its own pieces (sent) and one of the pieces arriving
from upstream (kept if it is its own, else forwarded: one ``fmov`` each,
forwards merged where several follow each other). Every PE runs its whole
first direction before its second, so the two chains of a line form two-PE
cycles of channels that the rotation rule proves (:meth:`RelayoutStage.rings`).
A run that several PEs of a line need at the same address leaves its source
once (each of them keeps it and passes its copy on, :func:`_pass_on`), and a
run turning into several rows of one column is staged there once. Words that stay on their
PE are one local ``fmov`` (memory to memory) in the first stage.

The bits arrive unchanged: ``fmov`` is a raw copy. Between the two stages
the host carries each PE's words (sources, staged and delivered words) into
the second program's run at the same addresses, as ``memcpy`` (no cycles):
the same PE keeps the same words, which is what residency means.

Cycles: ``relayout_timing.timing_ops`` mirrors each stage's table (the
static cycle model equals the golden model's count, tested).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, MemoryNeedError, Port, UsageError
from wse.firmware.deadlock import Ring, load_checked
from wse.firmware.image import Program
from wse.firmware.isa import DsdKind

from .common import chain_in_color, chain_out_color, chain_routes, column_cells, kernel_program, row_cells, \
    write_params

__all__ = ["RelayoutPlan", "RelayoutStage", "plan_relayout", "FORWARD_COLORS", "BACK_COLORS", "MAX_RUN",
           "pieces"]

T_START = 0
#: The chain east (south in the column stage) and the chain west (north).
FORWARD_COLORS, BACK_COLORS = (0, 1), (2, 3)
#: The longest ``fmov`` (a descriptor's 16-bit length).
MAX_RUN = 0xFFFF
_STRIDE = 1 << 15


def _mem(base: int, count: int, stride: int) -> tuple[int, int]:
    return (int(base) | int(count) << 16, int(DsdKind.MEM) | (int(stride) & 0xFFFF) << 16)


def _fab(kind: DsdKind, color: int, count: int) -> tuple[int, int]:
    return (int(color) | int(count) << 16, int(kind))


def pieces(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Group words into runs: ``int64 [pieces, 9]`` rows ``(sx, sy, s_addr, s_stride, dx, dy, d_addr,
    d_stride, count)``. Words are taken per (source PE, destination PE) in destination-address
    order; a run keeps one stride on each side (within a descriptor's signed 16 bits) and at most
    :data:`MAX_RUN` words."""
    n = len(src)
    if n == 0:
        return np.zeros((0, 9), dtype=np.int64)
    order = np.lexsort((src[:, 2], dst[:, 2], dst[:, 1], dst[:, 0], src[:, 1], src[:, 0]))
    s, d = src[order], dst[order]
    same = np.zeros(n, dtype=bool)          # word k and word k + 1 are between the same two PEs
    same[:-1] = np.all(s[1:, :2] == s[:-1, :2], axis=1) & np.all(d[1:, :2] == d[:-1, :2], axis=1)
    ss, ds = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
    ss[:-1], ds[:-1] = s[1:, 2] - s[:-1, 2], d[1:, 2] - d[:-1, 2]
    valid = same & (np.abs(ss) < _STRIDE) & (np.abs(ds) < _STRIDE) & (ds != 0)
    cont = np.zeros(n, dtype=bool)          # the step from word k to k + 1 keeps the previous step's strides
    cont[1:] = same[1:] & (ss[1:] == ss[:-1]) & (ds[1:] == ds[:-1])
    stops = np.flatnonzero(~cont)           # a run starting before k + 1 ends at word k
    rows = []
    i = 0
    while i < n:
        if valid[i]:
            last = int(stops[np.searchsorted(stops, i + 1)])
            count = min(last - i + 1, MAX_RUN)
            rows.append((*s[i, :2], s[i, 2], ss[i], *d[i, :2], d[i, 2], ds[i], count))
        else:
            count = 1
            rows.append((*s[i, :2], s[i, 2], 1, *d[i, :2], d[i, 2], 1, 1))
        i += count
    return np.array(rows, dtype=np.int64)


@dataclasses.dataclass
class RelayoutStage:
    """One program run of a relayout.

    Members
    -------
    name:
        ``"rows"`` or ``"columns"``.
    config:
        The mesh.
    tables:
        Per PE ``(x, y)``: its moves in order, each ``(source descriptor, destination descriptor,
        count, color in, color out)`` (colors ``-1`` where the side is memory).
    """
    name: str
    config: FabricConfig
    tables: dict[tuple[int, int], list[tuple]]

    def lines(self) -> list[list[tuple[int, int]]]:
        """The lines of the stage, each in forward order (west to east, north to south)."""
        cfg = self.config
        if self.name == "local":
            return []
        if self.name == "rows":
            return [row_cells(y, cfg.width) for y in range(cfg.height)]
        return [column_cells(x, cfg.height) for x in range(cfg.width)]

    @property
    def forward(self) -> Port:
        """The forward direction of the stage's chains."""
        return Port.E if self.name == "rows" else Port.S

    def routes(self) -> list:
        """Both chains of every line of at least two PEs."""
        routes = []
        for cells in self.lines():
            if len(cells) > 1:
                routes += chain_routes(cells, self.forward, FORWARD_COLORS, from_edge=False, to_edge=False)
                routes += chain_routes(cells[::-1], self.forward.opposite, BACK_COLORS, from_edge=False,
                                       to_edge=False)
        return routes

    def rings(self) -> list[Ring]:
        """Each pair of neighbours of a line: the later one takes all its forward words before
        it sends any back (every PE runs its forward chain's moves first)."""
        rings = []
        for cells in self.lines():
            n = len(cells)
            for m in range(n - 1):
                back = n - 1 - m
                (x0, y0), (x1, y1) = cells[m], cells[m + 1]
                members = ((x0, y0, chain_in_color(back, BACK_COLORS), chain_out_color(m, FORWARD_COLORS)),
                           (x1, y1, chain_in_color(m + 1, FORWARD_COLORS), chain_out_color(back - 1, BACK_COLORS)))
                rings.append(Ring(f"relayout {self.name} {cells[m]}, {cells[m + 1]}", members,
                                  receive_first=(False, True)))
        return rings

    def entries(self, x: int, y: int) -> list[tuple]:
        """The moves of PE ``(x, y)``."""
        return self.tables.get((x, y), [])


@dataclasses.dataclass
class RelayoutPlan:
    """A planned relayout.

    Members
    -------
    config, program:
        The mesh and ``relayout.s``.
    src, dst:
        ``int64 [n, 3]``: every word's source and destination ``(x, y, address)``.
    stages:
        The program runs, in order (none when no word moves).
    table:
        The address of every PE's table (after the staging buffers).
    spans:
        Per PE the ``[lo, hi)`` words it carries from stage to stage (sources, staging, destinations).
    """
    config: FabricConfig
    program: Program
    src: np.ndarray
    dst: np.ndarray
    stages: list[RelayoutStage]
    table: int
    spans: dict[tuple[int, int], tuple[int, int]]

    @property
    def words_needed(self) -> int:
        """Words per PE the plan needs: its table's address plus four words (two descriptors) for each move of
        the longest table of any stage."""
        longest = max((len(e) for stage in self.stages for e in stage.tables.values()), default=0)
        return self.table + 4 * longest

    @property
    def span(self) -> list[tuple[int, int]]:
        """``[(lo, hi)]``: one range from the lowest to the highest word any PE carries (:attr:`spans`)."""
        return [(min(lo for lo, _ in self.spans.values()), max(hi for _, hi in self.spans.values()))]

    def params(self, stage: RelayoutStage) -> dict[str, np.ndarray]:
        """``p_n``, ``p_tab`` of every PE for ``stage``."""
        cfg = self.config
        n = np.zeros((cfg.height, cfg.width), dtype=np.int64)
        for (x, y), entries in stage.tables.items():
            n[y, x] = len(entries)
        return {"p_n": n, "p_tab": np.full(n.shape, self.table)}

    def table_words(self, stage: RelayoutStage, x: int, y: int) -> np.ndarray:
        """The table of PE ``(x, y)`` as words (two descriptors per move)."""
        words = [w for entry in stage.entries(x, y) for w in entry[0] + entry[1]]
        return np.array(words, dtype=np.uint32)

    def execute(self, factory, values: np.ndarray, what: str = "relayout") -> tuple[np.ndarray, list[int]]:
        """Run the relayout on devices from ``factory(config)`` (one per stage): ``values`` are the
        source words (``uint32 [n]``, in word order), written at their sources first. Returns the
        words read at the destinations after the last stage (``uint32 [n]``) and each stage's cycles."""
        values = np.asarray(values, dtype=np.uint32)
        memory: dict[tuple[int, int], np.ndarray] = {}
        for (x, y), (lo, hi) in self.spans.items():
            memory[(x, y)] = np.zeros(hi - lo, dtype=np.uint32)
        for (x, y, a), v in zip(self.src.tolist(), values.tolist()):
            memory[(x, y)][a - self.spans[(x, y)][0]] = v
        cycles = []
        for stage in self.stages:
            device = factory(self.config)
            device.load(self.program)
            load_checked(device, self.config, stage.routes(), f"{what} ({stage.name})", rings=stage.rings())
            write_params(device, self.program, self.params(stage))
            for (x, y), words in memory.items():
                device.memcpy_h2d(self.spans[(x, y)][0], words[None, None, :], (x, y, 1, 1))
                table = self.table_words(stage, x, y)
                if len(table):
                    device.memcpy_h2d(self.table, table[None, None, :], (x, y, 1, 1))
            device.launch(T_START)
            cycles.append(device.run())
            for (x, y), (lo, hi) in self.spans.items():
                memory[(x, y)] = device.memcpy_d2h(lo, hi - lo, (x, y, 1, 1))[0, 0].copy()
        out = np.array([memory[(x, y)][a - self.spans[(x, y)][0]] for x, y, a in self.dst.tolist()],
                       dtype=np.uint32)
        return out, cycles


def _interleave(own: list, incoming: list, m: int) -> list[tuple[bool, tuple]]:
    """PE ``m``'s order of work on one chain: its own runs and the runs arriving from upstream
    taken in turn (one of its own, then one from upstream, ...), so that its own words do not wait
    for everything upstream to pass. A run it passes on (:func:`_pass_on`) waits until the run
    that brings it here has been kept."""
    ready = [p for p in own if len(p) == 5]
    waiting: dict[tuple, list[tuple]] = {}
    for p in own:
        if len(p) > 5:
            waiting.setdefault(p[2], []).append(p)
    out, i, j = [], 0, 0
    while i < len(ready) or j < len(incoming):
        if i < len(ready):
            out.append((True, ready[i]))
            i += 1
        if j < len(incoming):
            p = incoming[j]
            j += 1
            out.append((False, p))
            if p[1] == m:
                ready += waiting.pop(p[3], [])
    if waiting:
        raise AssertionError("a run is passed on by a PE that never receives it")
    return out


def _line_tables(line_pieces: list[list[tuple]], colors_fwd, colors_back, tables, cells) -> None:
    """Append the moves of one line's pieces to ``tables``: the forward chain, then the back one.
    ``line_pieces[m]``: pieces ``(src position, dst position, src descriptor, dst descriptor,
    count)`` starting at position ``m``."""
    n = len(cells)
    for direction in (1, -1):
        colors = colors_fwd if direction == 1 else colors_back
        positions = range(n) if direction == 1 else range(n - 1, -1, -1)
        incoming: list[tuple] = []
        for step, m in enumerate(positions):
            c_in, c_out = chain_in_color(step, colors), chain_out_color(step, colors)
            entries = tables.setdefault(cells[m], [])
            own = sorted((p for p in line_pieces[m] if (p[1] - m) * direction > 0), key=lambda p: p[1] * direction)
            onward, run = [], 0
            for mine, p in _interleave(own, incoming, m) + [(False, None)]:
                if p is not None and not mine and p[1] != m:
                    run += p[4]
                    onward.append(p)
                    continue
                while run:                                       # the forwards before: merged
                    k = min(run, MAX_RUN)
                    entries.append((_fab(DsdKind.FABIN, c_in, k), _fab(DsdKind.FABOUT, c_out, k), k, c_in, c_out))
                    run -= k
                if p is None:
                    continue
                if mine:
                    entries.append((p[2], _fab(DsdKind.FABOUT, c_out, p[4]), p[4], -1, c_out))
                    onward.append(p)
                else:
                    entries.append((_fab(DsdKind.FABIN, c_in, p[4]), p[3], p[4], c_in, -1))
            incoming = onward


def _pass_on(line: list[list[tuple]]) -> None:
    """Runs that one PE sends to several PEs of a line on one side (the same words to the same
    addresses, such as a key row every PE of a tile needs) leave it once: the nearest of those
    PEs keeps them and sends its copy on to the next, and so on (as its own runs)."""
    for m in range(len(line)):
        groups: dict[tuple, list[tuple]] = {}
        for p in line[m]:
            groups.setdefault((p[1] > m, p[2], p[3], p[4]), []).append(p)
        first = set()
        for (_, _, target, count), members in groups.items():
            members.sort(key=lambda p: abs(p[1] - m))
            first.add(id(members[0]))
            for near, far in zip(members, members[1:]):
                line[near[1]].append((near[1], far[1], target, target, count, "passed on"))
        line[m] = [p for p in line[m] if id(p) in first]


def plan_relayout(config: FabricConfig, src: np.ndarray, dst: np.ndarray, free: int,
                  what: str = "relayout", check: bool = True) -> RelayoutPlan:
    """Plan moving word ``i`` from ``src[i]`` to ``dst[i]`` (``int64 [n, 3]`` of ``(x, y, address)``).

    ``free`` is the first address above every source and destination word; staging buffers and
    the tables go there. Raises :class:`UsageError` if an address is below the program's data or
    the PEs' memory is too small, or if two words go to one destination. ``check=False`` leaves the memory
    check to the caller (the GPT's memory plan counts a move's staging and tables with everything else)."""
    program = kernel_program("relayout", config, T_START=T_START)
    src, dst = np.asarray(src, dtype=np.int64).reshape(-1, 3), np.asarray(dst, dtype=np.int64).reshape(-1, 3)
    for name, a in (("source", src), ("destination", dst)):
        if len(a) and (a[:, 2].min() < program.data_end or a[:, 2].max() >= free):
            raise UsageError(f"{what}: a {name} address is outside {program.data_end}..{free - 1}")
    depth = max(config.sram_words, free)
    cells = (dst[:, 1] * config.width + dst[:, 0]) * depth + dst[:, 2]
    if len(np.unique(cells)) != len(cells):
        raise UsageError(f"{what}: two words go to one destination")
    rows = pieces(src, dst)
    stage_top: dict[tuple[int, int], int] = {}
    staging: dict[tuple, tuple[int, int]] = {}
    row_moves: dict[int, list[list[tuple]]] = {y: [[] for _ in range(config.width)] for y in range(config.height)}
    col_moves: dict[int, list[list[tuple]]] = {x: [[] for _ in range(config.height)] for x in range(config.width)}
    local: dict[tuple[int, int], list[tuple]] = {}
    for sx, sy, sa, ss, dx, dy, da, ds, count in rows.tolist():
        source, target = _mem(sa, count, ss), _mem(da, count, ds)
        if sx == dx and sy == dy:
            local.setdefault((sx, sy), []).append((source, target, count, -1, -1))
            continue
        if sx != dx:
            if sy != dy:                                         # turns at (dx, sy): staged there, once
                staged = staging.get((sx, sy, source, dx))
                if staged is None:
                    at = stage_top.get((dx, sy), free)
                    stage_top[(dx, sy)] = at + count
                    staged = staging[(sx, sy, source, dx)] = _mem(at, count, 1)
                    row_moves[sy][sx].append((sx, dx, source, staged, count))
                col_moves[dx][sy].append((sy, dy, staged, target, count))
            else:
                row_moves[sy][sx].append((sx, dx, source, target, count))
        else:
            col_moves[dx][sy].append((sy, dy, source, target, count))
    stages = []
    for name, moves, cells_of in (("rows", row_moves, lambda i: row_cells(i, config.width)),
                                  ("columns", col_moves, lambda i: column_cells(i, config.height))):
        if not any(any(line) for line in moves.values()):
            continue
        tables: dict[tuple[int, int], list[tuple]] = {}
        for i, line in moves.items():
            _pass_on(line)
            _line_tables(line, FORWARD_COLORS, BACK_COLORS, tables, cells_of(i))
        stages.append(RelayoutStage(name, config, tables))
    if local:
        if not stages:
            stages.append(RelayoutStage("local", config, {}))
        for pe, entries in local.items():
            stages[0].tables[pe] = entries + stages[0].tables.get(pe, [])
    table = max(stage_top.values(), default=free)
    lo = np.full((config.height, config.width), np.iinfo(np.int64).max)
    hi = np.full((config.height, config.width), -1)
    for a in (src, dst):
        np.minimum.at(lo, (a[:, 1], a[:, 0]), a[:, 2])
        np.maximum.at(hi, (a[:, 1], a[:, 0]), a[:, 2] + 1)
    for (x, y), top in stage_top.items():
        lo[y, x], hi[y, x] = min(lo[y, x], free), max(hi[y, x], top)
    spans = {(int(x), int(y)): (int(lo[y, x]), int(hi[y, x])) for y, x in zip(*np.nonzero(hi >= 0))}
    plan = RelayoutPlan(config, program, src, dst, stages, table, spans)
    if check and plan.words_needed > config.sram_words:
        raise MemoryNeedError(f"{what} on a {config.mesh} mesh needs {plan.words_needed} words per PE but "
                              f"sram_words is {config.sram_words}", plan.words_needed)
    return plan
