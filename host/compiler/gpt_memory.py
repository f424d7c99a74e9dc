"""The memory plan of a GPT training step (``docs/transformer.md`` section 11, *Memory plan*).

Every phase of :func:`~.gpt_phases.compile_gpt`'s schedule is a program with its own buffers: the
streamed GEMM's executable regions, a kernel's data and heap, an attention round's agreed region, a
relayout's or the embedding rows' words and tables. Its *footprint* is the first word above all of
them (:attr:`~.gpt_phases.GptPhase.footprint`). The values that cross from one phase to a later one
(the activations, the saved activations the backward reads, the gradients in flight) need words that
no program of their lifetime overwrites: :func:`plan_memory` gives each a fixed range of every PE's
memory for its lifetime (from the phase that writes it to the last that reads it), above the largest
footprint of the phases in that lifetime, by a linear scan over the phases in order, first fit beside
the values live at the same time (the ranges of values no longer live are free again). A resident
step's ``move`` programs (:mod:`.gpt_moves`) put their staging and tables above every slot and phase
buffer; :func:`count_moves` counts each move's footprint at the phase it serves. The highest word in
use at any phase (its own footprint, a live value's range or a move's tables) is the step's memory
per PE; a step that needs more than ``sram_words`` is refused at compile time (:func:`check_step`),
naming the model's sizes, the phase at the peak and the words needed against those available.

Which values live on the wafer: every value a device phase reads or writes in the streamed GEMM's
layout (feature ``k`` on mesh row ``k mod H``, each column's tokens), ``ceil(F / H)`` words per token
of the column; LayerNorm's ``r`` (one word per token, on every row); an attention's ``p`` (the
softmax's output, read by the backward's rounds: its block of every PE of a tile, per round). Not
on the wafer: the token and position ids, MemoryX's gathered rows before they stream in and the
row gradients after they stream out (``rows:``, ``dx:``). Within an attention round the kernels'
intermediates (``s``, ``o``, ``dp``, ``ds``, the products' results) stay in the round's own region,
part of the round's footprint. A view (``Rearrange``) moves no word: its value is its input's.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from wse.config import FabricConfig, MemoryNeedError

from .weight_streaming import MemoryFitError

__all__ = ["Slot", "MemoryPlan", "plan_memory", "step_memory", "count_moves", "check_fits", "check_step",
           "least_memory", "gemm_footprint", "relayout_footprint", "value_features",
           "ROUND_VALUES", "OFF_WAFER"]

#: Prefixes of the values an attention round keeps in its own region (never in the store).
ROUND_VALUES = ("s:", "o:", "dp:", "ds:", "dv:", "dq:", "dk:")
#: Prefixes of values held by MemoryX (the rows a batch uses, gathered; the rows' gradients, streamed out).
OFF_WAFER = ("rows:", "dx:")


@dataclasses.dataclass(frozen=True)
class Slot:
    """A value's words ``[addr, addr + words)`` of every PE, from phase ``first`` (the one that writes it) to
    phase ``last`` (the last that reads it), indices into the schedule's phases; ``floor`` is the largest
    footprint of those phases, which the slot is above."""
    value: str
    addr: int
    words: int
    first: int
    last: int
    floor: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Where every value kept between phases lives, and the step's memory per PE.

    Members
    -------
    sram_words:
        The PE's data memory.
    largest, largest_phase:
        The largest phase footprint and its phase (a move's, once counted).
    slots:
        The values kept between phases by name, in the order they are written.
    aliases:
        A view's value -> the value whose words it is.
    live:
        Per phase, the words of the values live during it.
    high:
        Per phase, the first word above everything in use during it: its own footprint, the live slots and
        (after :func:`count_moves`) the staging and tables of the moves serving it.
    peak_phase:
        The (first) phase with the largest :attr:`high` (the move's name where a move's tables are the peak).
    moves:
        ``(name, phase index, footprint)`` of every move program counted (:func:`count_moves`).
    """
    sram_words: int
    largest: int
    largest_phase: str
    slots: dict[str, Slot]
    aliases: dict[str, str]
    live: tuple[int, ...]
    high: tuple[int, ...]
    peak_phase: str
    moves: tuple[tuple[str, int, int], ...] = ()

    @property
    def words(self) -> int:
        """Words per PE the step needs: the largest :attr:`high` (every phase's buffers, the slots live
        during it and, once counted by :func:`count_moves`, its moves' staging and tables)."""
        return max(self.high, default=0)

    @property
    def peak_live(self) -> int:
        """The most words of kept values live during one phase."""
        return max(self.live, default=0)

    @property
    def fits(self) -> bool:
        """Whether the step fits ``sram_words``."""
        return self.words <= self.sram_words

    def slot(self, value: str) -> Slot:
        """The slot of ``value`` (a view's: its input's)."""
        return self.slots[self.aliases.get(value, value)]

    def describe(self) -> list[str]:
        """Readable lines: the totals, then every slot."""
        lines = [f"{len(self.slots)} values kept between phases, at most {self.peak_live} words of them live at "
                 f"once; the largest phase footprint {self.largest} words ('{self.largest_phase}'); "
                 f"{self.words} of {self.sram_words} words per PE at the fullest ('{self.peak_phase}')"]
        for s in sorted(self.slots.values(), key=lambda s: (s.addr, s.first)):
            lines.append(f"  {s.addr:6d} +{s.words:<5d} {s.value}  (phases {s.first}..{s.last}, above {s.floor})")
        return lines


def _roots(phases: Sequence) -> dict[str, str]:
    """A view's output -> the value it views (followed to the root)."""
    aliases: dict[str, str] = {}
    for p in phases:
        if p.op in ("view", "view-bwd"):
            source = p.inputs[0]
            aliases[p.outputs[0]] = aliases.get(source, source)
    return aliases


def _on_wafer(name: str, host: set[str]) -> bool:
    return name not in host and not name.startswith(ROUND_VALUES + OFF_WAFER)


def value_words(name: str, graph, config: FabricConfig, blocks: Sequence[int], saved: dict[str, int]) -> int:
    """Words per PE of a value kept between phases: ``saved`` gives the attention's ``p:`` values; LayerNorm's
    ``r:`` is one word per token; any other is ``ceil(F / H)`` words per token of the fullest column, ``F``
    the features per token of its node (a gradient ``d:NAME#k``: of ``NAME``)."""
    if name in saved:
        return saved[name]
    tokens = max(blocks)
    if name.startswith("r:"):
        return tokens
    return math.ceil(value_features(name, graph) / config.height) * tokens


def value_features(name: str, graph) -> int:
    """The features per token of a value in the streamed GEMM's layout: its node's (``NAME``, ``d:NAME#k`` or
    any ``prefix:NAME``), the last dimension, or for a shape ``[..., T, D]`` of three or more dimensions all but
    the tokens' ``T`` multiplied."""
    node = name.split(":", 1)[1] if ":" in name else name
    shape = graph.node(node.split("#", 1)[0]).shape
    return math.prod(shape) // shape[-2] if len(shape) > 2 else shape[-1]


def plan_memory(phases: Sequence, graph, config: FabricConfig, blocks: Sequence[int], saved: dict[str, int],
                host_values: Sequence[str]) -> MemoryPlan:
    """The store of a schedule's ``phases`` (each with ``name``, ``op``, ``inputs``, ``outputs``, ``footprint``):
    every value a phase writes and a later phase reads gets a fixed range above the largest footprint for its
    lifetime (linear scan, first fit into the ranges of values no longer live). ``saved`` are the words per PE
    of the attention's ``p:`` values, ``host_values`` the graph's host inputs (token and position ids).
    The plan is returned whether or not it fits; :meth:`MemoryPlan.words` against ``sram_words`` decides."""
    host = set(host_values)
    aliases = _roots(phases)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    reader: dict[str, int] = {}
    for i, p in enumerate(phases):
        if p.op in ("view", "view-bwd"):
            continue                           # no word moves: the readers of a view read its root
        for n in p.outputs:
            n = aliases.get(n, n)
            if _on_wafer(n, host):
                first.setdefault(n, i)
        for n in (*p.inputs, *p.outputs):
            n = aliases.get(n, n)
            if _on_wafer(n, host):
                last[n] = i
                reader.setdefault(n, i)
    for n in list(last):
        first.setdefault(n, reader[n])        # read but written by no phase: live from its first reader
    base_index = max(range(len(phases)), key=lambda i: phases[i].footprint, default=0)
    foot = [p.footprint for p in phases]
    words = {n: value_words(n, graph, config, blocks, saved) for n in first}
    slots: dict[str, Slot] = {}
    live, high = [], []
    for i, p in enumerate(phases):
        for n in sorted((n for n in first if first[n] == i), key=lambda n: (-words[n], n)):
            floor = max(foot[i:last[n] + 1])
            taken = sorted((s.addr, s.addr + s.words) for s in slots.values() if s.last >= i)
            addr = _first_fit(taken, floor, words[n])
            slots[n] = Slot(n, addr, words[n], i, last[n], floor)
        current = [s for s in slots.values() if s.first <= i <= s.last]
        live.append(sum(s.words for s in current))
        high.append(max([foot[i]] + [s.addr + s.words for s in current]))
    peak = max(range(len(phases)), key=lambda i: high[i], default=0)
    ordered = dict(sorted(slots.items(), key=lambda item: (item[1].first, item[1].addr)))
    return MemoryPlan(config.sram_words, foot[base_index] if phases else 0, phases[base_index].name if phases else "",
                      ordered, aliases, tuple(live), tuple(high), phases[peak].name if phases else "")


def _first_fit(taken: list[tuple[int, int]], floor: int, words: int) -> int:
    """The lowest address at or above ``floor`` where ``words`` words meet none of the ``taken`` ``[lo, hi)``."""
    addr = floor
    for lo, hi in taken:
        if hi <= addr:
            continue
        if lo >= addr + words:
            break
        addr = hi
    return addr


def count_moves(plan: MemoryPlan, moves: Sequence[tuple[str, int, int]]) -> MemoryPlan:
    """``plan`` with the move programs ``(name, index of the phase it serves, footprint)`` counted: a move's
    staging and tables lie above the plan's words, so each raises its phase's :attr:`MemoryPlan.high`."""
    high = list(plan.high)
    for _, at, footprint in moves:
        high[at] = max(high[at], footprint)
    peak_phase = plan.peak_phase
    if high and max(high) > plan.words:
        peak = high.index(max(high))
        peak_phase = max((m for m in moves if m[1] == peak), key=lambda m: m[2])[0]
    largest, largest_phase = plan.largest, plan.largest_phase
    for name, _, footprint in moves:
        if footprint > largest:
            largest, largest_phase = footprint, name
    return dataclasses.replace(plan, high=tuple(high), peak_phase=peak_phase, largest=largest,
                               largest_phase=largest_phase,
                               moves=plan.moves + tuple((str(n), int(a), int(f)) for n, a, f in moves))


def check_fits(plan: MemoryPlan, phases: Sequence, what: str, config: FabricConfig) -> None:
    """Raise :class:`~.weight_streaming.MemoryFitError` (a :class:`UsageError`), one line naming ``what`` (the
    model and its batch), the phase at the peak and the words, if ``plan`` needs more than ``sram_words``
    (``phases``: those the plan was made of, before any move)."""
    if plan.fits:
        return
    peak = plan.high.index(plan.words)
    own = max([phases[peak].footprint] + [f for _, at, f in plan.moves if at == peak])
    raise MemoryFitError(f"{what} does not fit a {config.mesh} mesh: at phase '{plan.peak_phase}' (its own buffers "
                   f"{own} words, {plan.live[peak]} words of values kept between phases live, "
                   f"each above the buffers of every phase of its life) the step needs {plan.words} words per PE, "
                   f"sram_words is {config.sram_words}; use a smaller batch or a mesh with more rows (each PE "
                   f"holds fewer features) or columns (fewer tokens)", plan.words)


# Footprints: the first word above every buffer of a phase's program -------------------------------

def least_memory(config: FabricConfig, build) -> int:
    """The least ``sram_words`` for which ``build(config)`` (a kernel's plan, with the program's own memory
    checks, whose refusals are :class:`~wse.config.MemoryNeedError` with the words they need) succeeds."""
    need = max(16, build(config).program.data_end)     # 16: the configuration's least memory
    while True:
        try:
            build(config.replace(sram_words=need))
            return need
        except MemoryNeedError as error:
            if error.need is None or error.need <= need:
                raise
            need = error.need


def gemm_footprint(exe) -> int:
    """The footprint of a linear layer's executable: its program's data and every region (op lists included)."""
    return max([exe.program.data_end] + [addr + words for addr, words in exe.regions.values()])


def relayout_footprint(plan) -> int:
    """The footprint of a relayout: its sources, staging and destinations, then its tables (four words a move)."""
    return max(plan.words_needed, int(plan.src[:, 2].max()) + 1 if len(plan.src) else 0,
               int(plan.dst[:, 2].max()) + 1 if len(plan.dst) else 0)


def step_memory(builder, blocks: Sequence[int]) -> MemoryPlan:
    """The memory plan of :func:`~.gpt_phases.compile_gpt`'s phases (``builder``: its graph, mesh, phases,
    attention groups and their tilings), fitting or not (:func:`check_step` decides)."""
    tilings = {f"p:{g.node}": builder.tiling(g) for g in builder.groups.values()}
    saved = {k: len(t.rounds) * len(t.query_blocks()[0]) * len(t.key_blocks()[0]) for k, t in tilings.items()}
    graph = builder.graph
    hosts = [n.name for n in graph.nodes if n.kind in ("tokens", "positions")]
    return plan_memory(builder.phases, graph, builder.config, blocks, saved, hosts)


def check_step(builder, plan: MemoryPlan, phases: Sequence) -> None:
    """Refuse, in one line naming the GPT's sizes and batch, a step whose ``plan`` (of ``phases``, the
    schedule before its moves) does not fit ``sram_words``."""
    graph = builder.graph
    d_model = max((n.dim for n in graph.nodes if n.kind == "embedding"), default=0)
    heads = "/".join(map(str, sorted({builder.heads(g) for g in builder.groups.values()}))) or "0"
    check_fits(plan, phases, f"the GPT {graph.name} ({len(builder.groups)} attention layer(s), "
               f"d_model {d_model}, {heads} heads, context {builder.T}, vocabulary {graph.loss.vocab}) "
               f"with {builder.B} sequences", builder.config)
