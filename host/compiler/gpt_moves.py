"""The moves of a resident GPT step (``docs/transformer.md`` section 11, *Resident values*).

With the memory plan (:mod:`.gpt_memory`) every value kept between phases has a fixed range of every
PE's memory. A phase program reads its inputs from, and leaves its outputs in, its own buffers (a
kernel's heap, the streamed GEMM's regions, a relayout's GEMM-side slots, an attention round's agreed
``P``): its *ports*. :func:`resident_phases` puts a ``move`` phase before a phase that reads values
(their words from their slots into its input ports) and one after a phase that writes values (from
its output ports into their slots): programs of the relayout kernel (``relayout.s``), whose moves are
local (a PE's words to another address of the same PE) except LayerNorm's ``r``, which the column's
first row holds and every row of the column keeps in its slot (a column stage). Each move's cycles
come from the relayout's static mirror, equal to the golden model's. A move's staging and tables go
above every slot and every phase buffer (the plan's words before the moves); the memory plan counts
them (:func:`.gpt_memory.count_moves`), so one refusal covers the moves too.

Every port and slot lists its words in one order, per PE (rows, then columns) the PE's words in
order: for a value in the streamed GEMM's layout the PE's features in order, each with its column's
tokens (feature-major, ``ceil(F / H)`` runs of the column's tokens), the order of every kernel's
buffers and of the GEMM's ``act*`` and ``grad*`` regions; a token-major copy keeps its own order.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wse.config import FabricConfig
from wse.firmware.kernels import layernorm as layernorm_kernel
from wse.firmware.kernels import layernorm_bwd as layernorm_bwd_kernel
from wse.firmware.kernels import residual as residual_kernel
from wse.firmware.kernels.embedding_rows import plan_rows
from wse.firmware.kernels.relayout import RelayoutPlan, plan_relayout

from .gpt_memory import MemoryPlan, count_moves, relayout_footprint, value_features
from .gpt_tiles import MATRICES, HeadTiling, _region, head_tiling, relayout_cycles, relayout_out

__all__ = ["Move", "Ports", "phase_ports", "with_moves", "make_resident", "slot_words", "gemm_counts", "ROUND_OPS"]

#: Ops that run inside an attention round (the round's region is kept from its relayout in to its last relayout out).
ROUND_OPS = ("relayout-in", "relayout-out", "attention", "softmax")


@dataclasses.dataclass(frozen=True)
class Move:
    """A move phase's program: ``plan`` (a relayout), the original phase ``at`` it serves (its index in the
    schedule before the moves) and ``side`` (``"in"``: before it, ``"out"``: after it)."""
    plan: RelayoutPlan
    at: int
    side: str


@dataclasses.dataclass
class Ports:
    """A phase's ports: value -> ``int64 [n, 3]`` words ``(x, y, address)`` in slot order; ``partial``: values
    of which the phase writes only these words (an attention round's share of a head's result)."""
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    partial: frozenset = frozenset()


def _grid_words(base: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``(x, y, base[y, x] + k)`` for ``k < count[y, x]``, PE by PE (rows, then columns)."""
    out = []
    for y in range(count.shape[0]):
        for x in range(count.shape[1]):
            n = int(count[y, x])
            if n:
                out.append(np.stack([np.full(n, x), np.full(n, y), int(base[y, x]) + np.arange(n)], axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 3), dtype=np.int64)


def gemm_counts(config: FabricConfig, blocks, features: int) -> np.ndarray:
    """``[H, W]`` words per PE of a ``features``-wide value in the streamed GEMM's layout."""
    per_row = np.array([len(range(y, features, config.height)) for y in range(config.height)])
    cols = np.zeros(config.width, dtype=np.int64)
    cols[:len(blocks)] = blocks
    return per_row[:, None] * cols[None, :]


def _at(config: FabricConfig, addr) -> np.ndarray:
    return np.broadcast_to(np.asarray(addr, dtype=np.int64), (config.height, config.width))


class _Context:
    """What the ports need: the schedule's mesh, blocks, graph and executables."""

    def __init__(self, schedule, linear_executable, tokens_kernel_plan, tiling_of):
        """``schedule``: its phases, blocks, graph and memory plan; the others: :mod:`.gpt_phases`' helpers
        (``tokens_plan(op, features, variant, eps)``: :func:`~.gpt_phases.tokens_kernel_plan` over its tokens)."""
        self.s, self.config = schedule, schedule.config
        self.linear_executable, self.tiling_of = linear_executable, tiling_of
        self.tokens_plan = functools.partial(tokens_kernel_plan, schedule.config, schedule.tokens)

    def features(self, value: str) -> int:
        return value_features(value, self.s.graph)

    def counts(self, value: str) -> np.ndarray:
        return gemm_counts(self.config, self.s.blocks, self.features(self.root(value)))

    def root(self, value: str) -> str:
        return self.s.memory.aliases.get(value, value)

    def region(self, phase, name: str, value: str) -> np.ndarray:
        exe = self.linear_executable(self.config, self.s.tokens, phase.arg("k"), phase.arg("o"),
                                     phase.arg("bias") is not None)
        return _grid_words(_at(self.config, exe.regions[name][0]), self.counts(value))

    def r_counts(self) -> np.ndarray:
        return gemm_counts(self.config, self.s.blocks, self.config.height)     # one word per token, every row


def phase_ports(ctx: _Context, phase) -> Ports:
    """The ports of a device phase (host phases have none)."""
    op, ins, outs = phase.op, phase.inputs, phase.outputs
    if op in ("residual", "gelu", "gelu-bwd"):
        features = ctx.features(outs[0])
        kind = "residual" if op == "residual" else op
        plan = ctx.tokens_plan(kind, features, phase.arg("variant"))
        count = ctx.counts(outs[0])
        if op == "residual":
            names = ("A", "B")
            buf = {n: residual_kernel.buffer(plan, n) for n in ("A", "B", "Y")}
            return Ports({v: _grid_words(buf[n], count) for v, n in zip(ins, names)},
                         {outs[0]: _grid_words(buf["Y"], count)})
        names = ("X", "DY")
        return Ports({v: _grid_words(plan.buffer(n), count) for v, n in zip(ins, names)},
                     {outs[0]: _grid_words(plan.buffer("A"), count)})
    if op == "layernorm":
        plan = ctx.tokens_plan("layernorm", ctx.features(ins[0]), eps=phase.arg("eps"))
        addr, count = layernorm_kernel.addresses(plan), ctx.counts(ins[0])
        r_count = ctx.r_counts()
        r_count[1:] = 0                                     # the column's first row gives each token's r
        return Ports({ins[0]: _grid_words(addr["X"], count)},
                     {outs[0]: _grid_words(addr["Y"], count), outs[1]: _grid_words(addr["XC"], count),
                      outs[2]: _grid_words(addr["S"], r_count)})
    if op == "layernorm-bwd":
        plan = ctx.tokens_plan("layernorm-bwd", ctx.features(outs[0]))
        addr, count = layernorm_bwd_kernel.addresses(plan), ctx.counts(outs[0])
        return Ports({ins[0]: _grid_words(addr["DY"], count), ins[1]: _grid_words(addr["XH"], count),
                      ins[2]: _grid_words(addr["RR"], ctx.r_counts())}, {outs[0]: _grid_words(addr["DX"], count)})
    if op in ("linear", "linear-data", "linear-weight", "token-major"):
        regions = {"linear": (("act1",), "act2"), "linear-data": (("grad2",), "grad1"),
                   "linear-weight": (("act1tm", "grad2"), None), "token-major": (("act1",), "act1tm")}[op]
        inputs = {v: ctx.region(phase, name, v) for v, name in zip(ins, regions[0])}
        outputs = {outs[0]: ctx.region(phase, regions[1], outs[0])} if regions[1] else {}
        return Ports(inputs, outputs)
    if op in ("rows-in", "rows-out"):
        value = outs[0] if op == "rows-in" else ins[0]
        plan = plan_rows(ctx.config, ctx.s.tokens, phase.arg("features"), op[5:])
        words = _grid_words(_at(ctx.config, plan.base), ctx.counts(value))
        return Ports({}, {value: words}) if op == "rows-in" else Ports({value: words}, {})
    tiling = ctx.tiling_of(phase)
    if op == "relayout-in":
        top, region = tiling.top, _region(tiling)
        return Ports({v: _grid_words(_at(ctx.config, top + MATRICES.index(m) * region), ctx.counts(ctx.root(v)))
                      for m, v in zip(phase.arg("what"), ins)}, {})
    if op == "relayout-out":
        plan, _ = relayout_out(tiling, phase.arg("round"), phase.arg("what"))
        return Ports({}, {outs[0]: plan.dst}, frozenset(outs))
    variant = phase.arg("variant")
    p = [v for v in (*ins, *outs) if v.startswith("p:")]
    if variant in ("sf", "sb", "backward-dv") and p:
        words = _p_words(tiling, phase.arg("round"))
        return Ports({p[0]: words}, {}) if variant != "sf" else Ports({}, {p[0]: words})
    return Ports({}, {})


def _p_words(tiling: HeadTiling, round_: int) -> np.ndarray:
    """The ``P`` block of every PE of the round's tiles (the softmax's output the backward reads)."""
    cfg = tiling.config
    tile_base = np.asarray(dict(tiling.buffers)["P"], dtype=np.int64)      # per PE of a tile
    queries, keys = tiling.query_blocks(), tiling.key_blocks()
    count = np.zeros((cfg.height, cfg.width), dtype=np.int64)
    base = np.zeros((cfg.height, cfg.width), dtype=np.int64)
    for x0, y0 in tiling.origins[:len(tiling.rounds[round_])]:
        for ty, q in enumerate(queries):
            for tx, k in enumerate(keys):
                count[y0 + ty, x0 + tx] = len(q) * len(k)
                base[y0 + ty, x0 + tx] = tile_base[ty, tx]
    return _grid_words(base, count)


def slot_words(memory: MemoryPlan, value: str, port: np.ndarray, partial: bool, phase, tiling_of,
               held: int) -> np.ndarray:
    """The slot words matching ``port`` word for word: the same PE, the slot's address plus the word's rank
    among the PE's port words (``partial``: its offset in the GEMM-side region; ``p:``: after the earlier
    rounds' blocks)."""
    slot = memory.slot(value)
    if partial:
        top = tiling_of(phase).top
        offset = port[:, 2] - top
        if len(port) and (offset.min() < 0 or offset.max() >= slot.words):
            raise ValueError(f"{phase.name}: the words {int(port[:, 2].min())}..{int(port[:, 2].max())} of "
                             f"{value} are not within its {slot.words}-word slot's image from {top}")
        return np.stack([port[:, 0], port[:, 1], slot.addr + offset], axis=1)
    offset = phase.arg("round") * held if value.startswith("p:") else 0
    rank = np.zeros(len(port), dtype=np.int64)
    if len(port):
        pe = port[:, 1] * 1_000_000 + port[:, 0]
        starts = np.r_[0, np.flatnonzero(np.diff(pe)) + 1]
        lengths = np.diff(np.r_[starts, len(port)])
        rank = np.arange(len(port)) - np.repeat(starts, lengths)
    return np.stack([port[:, 0], port[:, 1], slot.addr + offset + rank], axis=1)


def _r_out(memory: MemoryPlan, value: str, port: np.ndarray, height: int) -> tuple[np.ndarray, np.ndarray]:
    """LayerNorm's ``r``: from the column's first row into the slot of every row of the column."""
    slot = memory.slot(value)
    first = {}
    for w in port:
        first.setdefault(int(w[0]), int(w[2]))
    rank = port[:, 2] - np.array([first[int(x)] for x in port[:, 0]])
    src = np.concatenate([port] * height)
    dst = np.concatenate([np.stack([port[:, 0], np.full(len(port), y), slot.addr + rank], axis=1)
                          for y in range(height)])
    return src, dst


def _move_words(ctx: _Context, memory: MemoryPlan, phase, ports: Ports, side: str, held: dict):
    """``(src, dst)`` of a phase's move ``side`` (None when it moves nothing)."""
    src, dst = [], []
    for value, port in (ports.inputs if side == "in" else ports.outputs).items():
        root = memory.aliases.get(value, value)
        if root not in memory.slots or not len(port):
            continue
        if side == "out" and root.startswith("r:"):
            s, d = _r_out(memory, root, port, ctx.config.height)
        else:
            words = slot_words(memory, root, port, value in ports.partial, phase, ctx.tiling_of,
                               held.get(root, 0))
            s, d = (words, port) if side == "in" else (port, words)
        src.append(s)
        dst.append(d)
    if not src:
        return None
    return np.concatenate(src), np.concatenate(dst)


#: Ops whose programs take their inputs as one region of every PE (the host writes it to the whole mesh).
WHOLE_REGIONS = ("linear", "linear-data", "linear-weight", "token-major", "relayout-in")


def _input_ranges(ports: Ports, whole: bool) -> tuple[list, dict]:
    """The words of a phase's input ports as ranges: ``whole``, one range on every PE per port (the streamed
    GEMM's regions, a relayout's GEMM-side slots), else per PE (a kernel's buffers, placed after the PE's own
    element counts)."""
    common, per_pe = [], {}
    for words in ports.inputs.values():
        if not len(words):
            continue
        if whole:
            common.append((int(words[:, 2].min()), int(words[:, 2].max()) + 1))
            continue
        pe = words[:, 1] * 1_000_000 + words[:, 0]
        starts = np.r_[0, np.flatnonzero(np.diff(pe)) + 1]
        ends = np.r_[starts[1:], len(words)]
        for a, b in zip(starts, ends):
            key = (int(words[a, 0]), int(words[a, 1]))
            per_pe.setdefault(key, []).append((int(words[a, 2]), int(words[b - 1, 2]) + 1))
    return common, per_pe


def with_moves(schedule, linear_executable, tokens_kernel_plan) -> tuple[list, dict[str, Move], dict]:
    """The schedule's phases with a ``move`` phase before every device phase that reads kept values and after
    every one that writes them, the moves by phase name, and per device phase (moves included) the word
    ranges ``(keep, resident, resident_per_pe)`` of a resident run: the words its load keeps (the live
    slots, the attention round's region, its input ports) and those the host does not write because the
    device holds them (its input ports, the round's region), on every PE or (``{(x, y): ranges}``) on one; a
    relayout's (a move's too) :attr:`~wse.firmware.kernels.relayout.RelayoutPlan.span` is both, added by the
    runner as the relayout runs. A move's staging and tables go above the plan's words, unchecked here:
    :func:`.gpt_memory.count_moves` counts them into the plan, whose one check covers them."""
    config, memory = schedule.config, schedule.memory

    def tiling_of(phase) -> HeadTiling:
        return head_tiling(config, schedule.sequences, phase.arg("heads"), phase.arg("t"), phase.arg("dh"),
                           phase.arg("scale"))

    ctx = _Context(schedule, linear_executable, tokens_kernel_plan, tiling_of)
    held = {}
    for phase in schedule.phases:
        for value in phase.outputs:
            if value.startswith("p:") and value in memory.slots:
                held[value] = memory.slots[value].words // len(tiling_of(phase).rounds)
    out, moves, ranges = [], {}, {}
    for i, phase in enumerate(schedule.phases):
        if phase.kind == "host":
            out.append(phase)
            continue
        ports = phase_ports(ctx, phase)
        live = [(s.addr, s.addr + s.words) for s in memory.slots.values() if s.first <= i <= s.last]
        region = [(tiling_of(phase).base, tiling_of(phase).top)] if phase.op in ROUND_OPS else []
        inputs, per_pe = _input_ranges(ports, phase.op in WHOLE_REGIONS)
        ranges[phase.name] = (live + region + inputs + [r for rs in per_pe.values() for r in rs],
                              region + inputs, per_pe)
        made = {}
        for side in ("in", "out"):
            words = _move_words(ctx, memory, phase, ports, side, held)
            if words is None:
                continue
            src, dst = words
            free = max(memory.words, int(max(src[:, 2].max(), dst[:, 2].max())) + 1)
            name = f"move-{side} {phase.name}"
            plan = plan_relayout(config, src, dst, free, f"the GPT's {name}", check=False)
            moves[name] = Move(plan, i, side)
            ranges[name] = (live + region, [], {})
            values = tuple(ports.inputs if side == "in" else ports.outputs)
            made[side] = dataclasses.replace(phase, name=name, kind="move", op="move", inputs=values, outputs=(),
                                             args=(("at", i), ("side", side)), runs=1,
                                             cycles=sum(relayout_cycles(plan)), fmacs=0,
                                             footprint=relayout_footprint(plan))
        out += [p for p in (made.get("in"), phase, made.get("out")) if p is not None]
    return out, moves, ranges


def make_resident(schedule, linear_executable, tokens_kernel_plan, check) -> None:
    """Make ``schedule`` resident: its phases with the moves (:func:`with_moves`), the moves' programs and
    ranges, and its memory plan with the moves' staging and tables counted (:func:`.gpt_memory.count_moves`);
    then ``check(plan, phases)`` (the plan and the phases before the moves) refuses a step that does not fit."""
    phases = schedule.phases
    schedule.phases, schedule.moves, schedule.ranges = with_moves(schedule, linear_executable, tokens_kernel_plan)
    schedule.memory = count_moves(schedule.memory, [(p.name, p.arg("at"), p.footprint) for p in schedule.phases
                                                    if p.kind == "move"])
    check(schedule.memory, phases)
