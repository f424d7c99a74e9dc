"""Embedding rows between MemoryX and the fabric (``docs/transformer.md``
sections 3.6 and 11): MemoryX streams each token's embedding row into the
PEs that hold the token (the streamed GEMM's layout: feature ``k`` on mesh
row ``k mod H``, the tokens dealt over the columns in contiguous blocks), and
streams every token's row gradient (``dx``) out of them, as edge streams of a
real program.

The program is ``relayout.s`` (a table of raw ``fmov`` moves per PE; the bits
pass unchanged). Each mesh row is cut into two segments, each served by its
own edge port: the western columns by the west edge (a chain east), the
eastern ones by the east edge (a chain west), split where the two carry the
most even share of words. Along a segment's chain, in (direction ``"in"``):

- MemoryX injects the segment's words at the edge, PE after PE in chain
  order, each PE's words in its address order;
- a PE keeps its own words (the first to arrive: one ``fmov`` from the
  fabric to memory) and forwards the rest (one ``fmov`` fabric to fabric).

Out (direction ``"out"``), the chain runs the other way, toward the edge: a
PE sends its own words (memory to the fabric) and then forwards everything
arriving from upstream; MemoryX takes the words at the edge, nearest PE
first. Neither chain closes a cycle of channels, so the routes need no ring
(the deadlock check proves them as they are).

A PE ``(x, y)`` keeps its words at ``base`` onwards, feature-major: feature
``f`` (the ``i``-th of row ``y``'s features ``y, y + H, ...``) of its ``j``-th
token at ``base + i * count + j`` (``count``: the column's tokens), the
streamed GEMM's feature-major order. ``embedding_rows_timing`` mirrors the
tables for the static cycle model (equal to the golden model's cycles, tested).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wse.config import FabricConfig, MemoryNeedError, Port, UsageError
from wse.firmware.deadlock import load_checked
from wse.firmware.image import Program
from wse.firmware.isa import DsdKind

from .common import block_partition, chain_in_color, chain_out_color, chain_routes, kernel_program, write_params
from .relayout import MAX_RUN

__all__ = ["RowsPlan", "plan_rows", "Segment", "WEST_COLORS", "EAST_COLORS"]

T_START = 0
#: The chain of the western segment of a row (from or to the west edge) and of the eastern one.
WEST_COLORS, EAST_COLORS = (0, 1), (2, 3)


def _mem(base: int, count: int) -> tuple[int, int]:
    return (int(base) | int(count) << 16, int(DsdKind.MEM) | 1 << 16)


def _fab(kind: DsdKind, color: int, count: int) -> tuple[int, int]:
    return (int(color) | int(count) << 16, int(kind))


@dataclasses.dataclass(frozen=True)
class Segment:
    """One chain of a mesh row: ``cells`` in chain order (the first at the edge when streaming in,
    the last when streaming out), the ``edge`` (``"W"`` or ``"E"``), its ``colors`` and the direction
    ``forward`` of the words along it."""
    y: int
    cells: tuple[tuple[int, int], ...]
    edge: str
    colors: tuple[int, int]
    forward: Port


@dataclasses.dataclass
class RowsPlan:
    """A planned stream of a ``tokens x features`` block between MemoryX and the PEs.

    Members
    -------
    config, program:
        The mesh and ``relayout.s``.
    direction:
        ``"in"`` (MemoryX to the PEs) or ``"out"``.
    tokens, features:
        The block's shape.
    blocks:
        Each column's tokens (``range``; empty for a column without tokens).
    base, table:
        Where each PE's words start, and its table.
    segments:
        The chains, two per mesh row at most.
    tables:
        Per PE its moves ``(source descriptor, destination descriptor, count, color in, color out)``.
    """
    config: FabricConfig
    program: Program
    direction: str
    tokens: int
    features: int
    blocks: list[range]
    base: int
    table: int
    segments: list[Segment]
    tables: dict[tuple[int, int], list[tuple]]

    def feats(self, y: int) -> np.ndarray:
        """The features of mesh row ``y``."""
        return np.arange(y, self.features, self.config.height)

    def count(self, x: int, y: int) -> int:
        """The words PE ``(x, y)`` holds."""
        return len(self.feats(y)) * len(self.blocks[x])

    def entries(self, x: int, y: int) -> list[tuple]:
        """The moves of PE ``(x, y)``."""
        return self.tables.get((x, y), [])

    def routes(self) -> list:
        """The chains of every segment, from (in) or to (out) its edge."""
        routes = []
        for s in self.segments:
            cells = list(s.cells)
            if self.direction == "in":
                routes += chain_routes(cells, s.forward, s.colors, from_edge=True, to_edge=False)
            else:
                routes += chain_routes(cells, s.forward, s.colors, from_edge=False, to_edge=True)
        return routes

    def order(self, segment: Segment) -> list[tuple[int, int]]:
        """The PEs in the order their words pass the segment's edge."""
        cells = list(segment.cells)
        return cells if self.direction == "in" else cells[::-1]

    def edge_color(self, segment: Segment) -> int:
        """The color of the words at the segment's edge port."""
        if self.direction == "in":
            return chain_in_color(0, segment.colors)
        return chain_out_color(len(segment.cells) - 1, segment.colors)

    def edge_words(self, segment: Segment) -> int:
        """The words that pass the segment's edge port."""
        return sum(self.count(x, y) for x, y in segment.cells)

    def pe_words(self, matrix: np.ndarray, x: int, y: int) -> np.ndarray:
        """PE ``(x, y)``'s words of ``matrix [tokens, features]`` in address order."""
        return np.ascontiguousarray(matrix[self.blocks[x]][:, self.feats(y)].T).reshape(-1)

    @property
    def words_needed(self) -> int:
        """Words per PE the plan needs: its table's address plus four words (two descriptors) for each move of
        the longest table."""
        return self.table + 4 * max((len(e) for e in self.tables.values()), default=0)

    def params(self) -> dict[str, np.ndarray]:
        """``p_n``, ``p_tab`` of every PE."""
        n = np.zeros((self.config.height, self.config.width), dtype=np.int64)
        for (x, y), entries in self.tables.items():
            n[y, x] = len(entries)
        return {"p_n": n, "p_tab": np.full(n.shape, self.table)}

    def execute(self, factory, matrix: np.ndarray, what: str = "embedding rows") -> tuple[np.ndarray, int]:
        """Run the stream on a device from ``factory(config)``: ``matrix`` is ``uint32 [tokens,
        features]``, injected at the edges (in) or written into the PEs first (out). Returns the
        matrix as it arrived (read from the PEs, or taken at the edges) and the run's cycles."""
        matrix = np.asarray(matrix, dtype=np.uint32).reshape(self.tokens, self.features)
        device = factory(self.config)
        device.load(self.program)
        load_checked(device, self.config, self.routes(), what)
        write_params(device, self.program, self.params())
        for (x, y), entries in self.tables.items():
            words = np.array([w for e in entries for w in e[0] + e[1]], dtype=np.uint32)
            device.memcpy_h2d(self.table, words[None, None, :], (x, y, 1, 1))
            if self.direction == "out" and self.count(x, y):
                device.memcpy_h2d(self.base, self.pe_words(matrix, x, y)[None, None, :], (x, y, 1, 1))
        if self.direction == "in":
            for s in self.segments:
                words = [self.pe_words(matrix, x, y) for x, y in self.order(s)]
                device.stream_in(s.edge, s.y, self.edge_color(s), np.concatenate(words))
        device.launch(T_START)
        cycles = device.run()
        out = np.zeros_like(matrix)
        for s in self.segments:
            taken = device.stream_out(s.edge, s.y, self.edge_color(s)) if self.direction == "out" else None
            at = 0
            for x, y in self.order(s):
                n = self.count(x, y)
                if not n:
                    continue
                if taken is None:
                    words = device.memcpy_d2h(self.base, n, (x, y, 1, 1))[0, 0]
                else:
                    words = np.asarray(taken[at:at + n], dtype=np.uint32)
                    at += n
                block = self.blocks[x]
                out[block.start:block.stop, self.feats(y)] = words.reshape(len(self.feats(y)), len(block)).T
        return out, int(cycles)


def _split(words: list[int]) -> int:
    """The first column of the eastern segment: the most even split of the row's words (and hops)."""
    width = len(words)
    best, at = None, width
    for h in range(1, width + 1):
        cost = max(sum(words[:h]) + h, sum(words[h:]) + width - h)
        if best is None or cost < best:
            best, at = cost, h
    return at


def _tables(plan: RowsPlan) -> None:
    """Each PE of each segment: its own words kept (in) or sent (out), the rest forwarded."""
    for s in plan.segments:
        cells = list(s.cells)
        for m, (x, y) in enumerate(cells):
            c_in, c_out = chain_in_color(m, s.colors), chain_out_color(m, s.colors)
            own = plan.count(x, y)
            entries = []
            if plan.direction == "in":
                passing = sum(plan.count(*c) for c in cells[m + 1:])
                if own:
                    entries.append((_fab(DsdKind.FABIN, c_in, own), _mem(plan.base, own), own, c_in, -1))
            else:
                passing = sum(plan.count(*c) for c in cells[:m])
                if own:
                    entries.append((_mem(plan.base, own), _fab(DsdKind.FABOUT, c_out, own), own, -1, c_out))
            while passing:
                k = min(passing, MAX_RUN)
                entries.append((_fab(DsdKind.FABIN, c_in, k), _fab(DsdKind.FABOUT, c_out, k), k, c_in, c_out))
                passing -= k
            if entries:
                plan.tables[(x, y)] = entries


@functools.lru_cache(maxsize=64)
def plan_rows(config: FabricConfig, tokens: int, features: int, direction: str) -> RowsPlan:
    """Plan streaming a ``tokens x features`` block in (``"in"``) or out (``"out"``) of the PEs,
    the tokens dealt over ``min(W, tokens)`` columns in contiguous blocks.

    Raises :class:`UsageError` if the PEs' memory cannot hold the words and the table."""
    if direction not in ("in", "out"):
        raise ValueError(f"direction must be 'in' or 'out', not {direction!r}")
    if tokens < 1 or features < 1:
        raise UsageError(f"embedding rows need at least one token and one feature, not {tokens} x {features}")
    program = kernel_program("relayout", config, T_START=T_START)
    used = min(config.width, tokens)
    blocks = block_partition(tokens, used) + [range(0)] * (config.width - used)
    rows_per_pe = len(range(0, features, config.height))
    base = program.data_end
    table = base + rows_per_pe * len(blocks[0])
    plan = RowsPlan(config, program, direction, tokens, features, blocks, base, table, [], {})
    for y in range(config.height):
        if not len(plan.feats(y)):
            continue
        h = _split([plan.count(x, y) for x in range(config.width)])
        west = tuple((x, y) for x in range(h))
        east = tuple((x, y) for x in range(config.width - 1, h - 1, -1))
        if direction == "out":
            west, east = west[::-1], east[::-1]
        inward = direction == "in"
        plan.segments.append(Segment(y, west, "W", WEST_COLORS, Port.E if inward else Port.W))
        if east:
            plan.segments.append(Segment(y, east, "E", EAST_COLORS, Port.W if inward else Port.E))
    _tables(plan)
    if plan.words_needed > config.sram_words:
        raise MemoryNeedError(f"embedding rows of {tokens} tokens x {features} features on a {config.mesh} mesh "
                              f"need {plan.words_needed} words per PE but sram_words is {config.sram_words}",
                              plan.words_needed)
    return plan
