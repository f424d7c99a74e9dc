"""The weight-streaming mapping: where every value of a training step lives
on the mesh, what each PE does in each phase, and in which order weights
stream in and gradients stream out.

Layout (``docs/weight_streaming.md``): the batch's tokens are dealt over the
mesh columns in contiguous blocks (:func:`~wse.firmware.kernels.common.block_partition`),
``T_j`` to column ``j``; the features of every activation are dealt to rows
cyclically, feature ``k`` to row ``k mod H`` at local index ``k div H``, except
that with :data:`SPREAD` a partial last round (of every activation but the
logits) is spread evenly over the ring (:func:`~.layouts.feature_slots`). A PE
keeps its activations feature-major (``[local feature][token]``) and, for the
weight gradients, a token-major copy. Weights never stay on the wafer. A
column with more tokens than one message of the partial-sum ring carries runs
its streamed GEMMs in token passes (:func:`token_passes`), the weights
streaming once per pass.

:func:`plan` returns a :class:`Plan`: the memory map, the phases with their
per-PE op records (:mod:`wse.firmware.training.records`), the host's stream
orders and the functional description of every phase.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import FabricConfig, MemoryNeedError, Port, UsageError
from wse.firmware.kernels.common import block_partition, chain_routes, multicast_routes, row_cells
from wse.firmware.training import C_W, training_program

from .ir import Graph, Linear, ReLU, SoftmaxCrossEntropy
from .layouts import WeightStreamingLayout, WSLayer
from .schedule import MathOp, Phase, StreamIn, StreamOut

__all__ = ["FitError", "MemoryFitError", "WSLayer", "PlannedPhase", "Plan", "plan", "RING", "WRAP", "EAST", "COLORS_USED",
           "ring_colors", "ring_capacity", "pass_limit", "token_passes"]

#: Colors of the column ring: the chain south (alternating by row) and the wrap north.
RING = (1, 2)
WRAP = 3
#: Colors of the row chain of the weight gradients (alternating by column).
EAST = (4, 5)
#: Colors the mapping needs.
COLORS_USED = 6

#: Whether new plans spread a partial last round of features over the ring
#: (:func:`~.layouts.feature_slots`; ``docs/weight_streaming.md`` section 3): the rows holding a
#: feature more are then spaced evenly, which keeps the ring's rows at one pace and lets the static
#: cycle model find its periods (section 9). ``False``: every activation cyclic, as executables
#: written before the choice existed.
SPREAD = True


class FitError(UsageError):
    """A model or batch does not fit the fabric; the message states what is
    needed and what is available."""


class MemoryFitError(FitError, MemoryNeedError):
    """A model or batch does not fit a PE's data memory: ``need`` words per PE."""


@dataclasses.dataclass
class PlannedPhase:
    """One phase of the plan: its per-PE op records and what the executable's
    :class:`~.schedule.Phase` keeps of it (the cycles come later, from the
    static cycle model).

    Members
    -------
    records:
        ``[H][W]`` lists of op-record word arrays, one list per PE.
    name, group, ops_addr, streams_in, streams_out, math, fmacs:
        As in :class:`~.schedule.Phase`.
    """
    name: str
    group: str
    ops_addr: int
    records: list
    streams_in: tuple[StreamIn, ...]
    streams_out: tuple[StreamOut, ...]
    math: tuple[MathOp, ...]
    fmacs: int = 0

    def to_phase(self, cycles: int) -> Phase:
        """The executable's description of this phase, taking ``cycles`` fabric cycles."""
        return Phase(self.name, self.group, self.ops_addr, tuple(self.streams_in), tuple(self.streams_out),
                     tuple(self.math), int(self.fmacs), int(cycles))


@dataclasses.dataclass
class Plan:
    """The weight-streaming mapping of one model, batch and fabric.

    Members
    -------
    config, batch, graph:
        What was mapped.
    layers:
        The Linear layers in order, with their ReLU flags.
    relu_input:
        Whether a ReLU is applied to the model input.
    columns, tokens:
        Columns holding tokens (``min(width, batch)``) and each one's token block.
    regions:
        Name -> (address, words) of every buffer in PE memory.
    phases:
        Every :class:`PlannedPhase` by name, in training order.
    sequences:
        ``{"train": [...], "eval": [...]}``: the phases of a step.
    routes:
        Route-table entries ``(x, y, color, input, outputs)``.
    transfers:
        Per-step host copies: ``{name: (address, index map [H, W, n])}`` for the
        inputs ``x``, ``onehot``, ``scale`` and the output ``logits``.
    passes:
        Per column, the ``(offset, count)`` of each token pass of the streamed
        GEMMs (:func:`token_passes`; one pass when the ring carries every token).
    spread:
        Whether the activations but the logits spread a partial last round over the ring
        (:data:`SPREAD` when planned).
    """
    config: FabricConfig
    batch: int
    graph: Graph
    layers: list
    relu_input: bool
    columns: int
    tokens: list
    regions: dict
    phases: dict
    sequences: dict
    routes: list
    transfers: dict
    passes: list = dataclasses.field(default_factory=list)
    spread: bool = False

    def layout(self, reason: str = "") -> WeightStreamingLayout:
        """The executable's record of this mapping (``reason``: why the mode was chosen)."""
        return WeightStreamingLayout(tuple(self.layers), bool(self.relu_input), self.config.height, self.columns,
                                     tuple(len(block) for block in self.tokens),
                                     tuple(block.start for block in self.tokens), reason, self.spread)


def ring_colors(row: int, height: int) -> tuple[int, int]:
    """``(c_in, c_out)``: colors of the partial sums entering and leaving ``row``."""
    c_in = WRAP if row == 0 else RING[row % 2]
    c_out = WRAP if row == height - 1 else RING[(row + 1) % 2]
    return c_in, c_out


def ring_capacity(config: FabricConfig) -> int:
    """Wavelets one link of the ring can hold: output queue, two router buffers, input queue."""
    return config.tx_depth + 2 * config.router_depth + config.rx_depth


def _local(n: int, height: int, row: int) -> int:
    """Features of ``n`` dealt cyclically that land on ``row``."""
    return len(range(row, n, height))


def _lower(graph: Graph) -> tuple[list[WSLayer], bool]:
    layers, relu_input, pending = [], False, False
    for layer in graph.layers[1:]:
        if isinstance(layer, Linear):
            layers.append(WSLayer(len(layers), layer.name, layer.weight_name, layer.bias_name,
                                  layer.in_features, layer.out_features, False))
        elif isinstance(layer, ReLU):
            if layers:
                layers[-1] = dataclasses.replace(layers[-1], relu=True)
            else:
                relu_input = True
        elif isinstance(layer, SoftmaxCrossEntropy):
            pending = True
    if not pending:
        raise UsageError(f"model {graph.name} has no loss; weight-streaming training needs softmax "
                         f"cross-entropy as the last layer")
    if graph.loss.reduction != "mean":
        raise UsageError(f"the loss of model {graph.name} uses reduction {graph.loss.reduction!r}; "
                         f"weight streaming supports 'mean'")
    return layers, relu_input


class _Memory:
    """A bump allocator over PE memory that remembers who asked for what."""

    def __init__(self, start: int):
        self.next = start
        self.regions: dict[str, tuple[int, int]] = {}
        self.owners: dict[str, int] = {}

    def take(self, name: str, words: int, owner: str) -> int:
        addr = self.next
        self.regions[name] = (addr, int(words))
        self.next += int(words)
        self.owners[owner] = self.owners.get(owner, 0) + int(words)
        return addr

    def overlay(self, regions: list, base: int, room: int) -> int:
        """Place ``(name, words, owner)`` regions in order into the ``room`` words
        from ``base`` (words another buffer no longer needs), each that no longer
        fits in fresh words; returns the first word after those placed."""
        at = base
        for name, words, owner in regions:
            if at + words <= base + room:
                self.regions[name] = (at, int(words))
                at += int(words)
            else:
                self.take(name, words, owner)
        return at


def _check_fit(config: FabricConfig) -> None:
    if config.colors < COLORS_USED:
        raise FitError(f"weight streaming needs {COLORS_USED} colors but the configuration has "
                       f"colors={config.colors}")


def pass_limit(config: FabricConfig) -> int:
    """Tokens per PE in one pass of a streamed GEMM: a link of the column ring holds one
    partial-sum message plus one wavelet (``docs/weight_streaming.md`` section 5)."""
    return ring_capacity(config) - 1


def token_passes(tokens: list, limit: int) -> list[list[tuple[int, int]]]:
    """Per column, the ``(offset, count)`` of each token pass within its block.

    Every column runs ``ceil(max T_j / limit)`` passes (the weights stream once
    per pass to the whole row), its ``T_j`` tokens dealt over them in
    contiguous blocks, larger first (so a pass of a west column is never
    smaller than the same pass of a column east of it). One pass is the
    whole block."""
    tmax = max(len(block) for block in tokens)
    passes = -(-tmax // max(limit, 1))
    out = []
    for block in tokens:
        parts = block_partition(len(block), passes)
        out.append([(part.start, len(part)) for part in parts])
    return out


def plan(graph: Graph, config: FabricConfig, batch: int, masks=None, dense_phases=(), spread: bool | None = None) -> Plan:
    """Map ``graph`` for training with batches of ``batch`` samples on ``config``.

    ``masks`` (weight name to a boolean ``[O, K]`` array, :mod:`.sparse`) makes
    those layers' phases sparse: only the kept weights stream
    (``docs/weight_streaming.md`` section 13), except the phases named in
    ``dense_phases`` (such as ``"bwd-weight fc1"``), which stream the masked
    layer densely. ``spread`` (None: :data:`SPREAD`) says whether a partial last round of features
    spreads over the ring (``False``: every activation cyclic, as a caller whose other kernels
    assume feature ``k`` on row ``k mod H`` needs).

    Raises
    ------
    FitError
        If the activations, buffers and op lists do not fit in ``sram_words``,
        a masked layer's batch puts more tokens on a PE than one pass of the
        ring carries (dense layers run token passes instead: section 5 of
        ``docs/weight_streaming.md``), or the fabric has too few colors.
    UsageError
        If the graph has no softmax cross-entropy loss with ``mean`` reduction.
    """
    from . import ws_phases  # the phase builders (split for size)

    if isinstance(batch, bool) or not isinstance(batch, (int, np.integer)) or batch < 1:
        raise UsageError(f"batch must be a positive integer, not {batch!r}")
    batch = int(batch)
    layers, relu_input = _lower(graph)
    H = config.height
    columns = min(config.width, batch)
    tokens = block_partition(batch, columns)
    tmax = len(tokens[0])
    _check_fit(config)
    passes = token_passes(tokens, pass_limit(config))
    if len(passes[0]) > min(len(block) for block in tokens):
        raise FitError(f"a batch of {batch} on {columns} columns needs {len(passes[0])} token passes of at most "
                       f"{pass_limit(config)} tokens per PE, more than the {len(tokens[-1])} tokens of the "
                       f"last column; use a batch that is a multiple of {columns}")
    try:            # assembled for the mesh, it fits: no second assembly to measure it
        program = training_program(config)
    except UsageError:
        code = len(training_program(config.replace(imem_words=65536)).code)
        if code > config.imem_words:
            raise FitError(f"the weight-streaming PE program needs {code} instruction words but imem_words is "
                           f"{config.imem_words}") from None
        raise
    masks = _check_masks(masks, layers, tokens, batch, config)
    mem = _Memory(program.data_end)
    _memory_map(mem, layers, H, tmax, max(n for col in passes for _, n in col),
                reuse_input=layers[0].weight not in masks or f"bwd-weight {layers[0].name}" in dense_phases)
    _check_memory(mem, config, graph, batch, program)
    spread = SPREAD if spread is None else bool(spread)
    ctx = ws_phases.Context(config, program, layers, relu_input, tokens, mem, H, columns, masks,
                            frozenset(dense_phases), passes, spread)
    phases, sequences = ws_phases.build(ctx)
    _check_memory(mem, config, graph, batch, program)
    return Plan(config, batch, graph, layers, relu_input, columns, tokens, dict(mem.regions), phases, sequences,
                _routes(config, columns), ws_phases.transfers(ctx), passes, spread)


def _memory_map(mem: _Memory, layers: list, H: int, tmax: int, tpass: int, reuse_input: bool) -> None:
    """Every buffer of a step in PE memory (``docs/weight_streaming.md`` sections 3 and 5.1).

    Activations hold the column's ``tmax`` tokens; the buffers a token pass
    uses (``acc``, the pass gather ``tmp``, the softmax's) hold the largest
    pass, ``tpass`` (``tmax`` in one pass). The model input ``act0`` is dead
    once the first layer's forward phase has read it (unless a sparse weight
    gradient reads it at the end): with ``reuse_input`` the activation
    gradients (written from the loss phase on) and then the softmax's buffers
    (the loss phase only; they may share words with every gradient but the
    last, which the loss phase writes) take its words first, fresh words only
    for what does not fit."""
    feats = [layers[0].k] + [layer.o for layer in layers]
    per_row = [max(_local(n, H, i) for i in range(H)) for n in feats]
    L, classes = len(layers), layers[-1].o
    for l, n in enumerate(per_row):
        owner = "the model input" if l == 0 else f"the activations of layer {layers[l - 1].name}"
        mem.take(f"act{l}", n * tmax, owner)
        if l < L:
            mem.take(f"act{l}tm", n * tmax, owner)
    base, room = mem.regions["act0"] if reuse_input else (0, 0)
    mem.overlay([(f"grad{l}", per_row[l] * tmax, f"the activations of layer {layers[l - 1].name}")
                 for l in range(L, 0, -1)], base, room)
    block = max(per_row[1:]) * tmax
    scratch = "scratch buffers"
    mem.take("acc", tpass, scratch)
    mem.take("tmp", max(per_row) * tpass, scratch)
    mem.take("g", max(per_row[:-1]) + 1, scratch)
    mem.take("buf0", block, scratch)
    mem.take("buf1", block, scratch)
    loss = f"the loss over {classes} classes"
    g_addr, g_words = mem.regions[f"grad{L}"]
    last = g_addr + g_words if base <= g_addr < base + room else base     # after grad{L} when it is in act0
    mem.overlay([(name, classes * tpass, loss) for name in ("zall", "nb", "fb", "rb")]
                + [(name, tpass, loss) for name in ("m", "s", "inv", "stmp")], last, base + room - last)
    mem.take("scale", tmax, loss)
    mem.take("onehot", per_row[-1] * tmax, loss)


def _check_masks(masks, layers: list, tokens: list, batch: int, config: FabricConfig) -> dict:
    """The masks by weight name, checked against the layers; a sparse layer needs
    equal token blocks (a stream's index word is one address on every PE of a row)
    and one token pass (the sparse records run none)."""
    from .sparse import check_mask

    masks = dict(masks or {})
    shapes = {layer.weight: (layer.o, layer.k) for layer in layers}
    for name in masks:
        if name not in shapes:
            raise UsageError(f"a mask is given for {name!r}, which is no Linear weight of the model "
                             f"(weights: {', '.join(shapes)})")
        masks[name] = check_mask(name, masks[name], shapes[name])
    if masks and len({len(block) for block in tokens}) > 1:
        raise FitError(f"sparse weight streaming needs the same tokens on every column, but a batch of {batch} "
                       f"on {len(tokens)} columns gives blocks of {len(tokens[0])} and {len(tokens[-1])}; use "
                       f"a batch that is a multiple of {len(tokens)}")
    limit = pass_limit(config)
    if masks and len(tokens[0]) > limit:
        raise FitError(f"sparse weight streaming holds at most {limit} tokens per PE (its records run in one "
                       f"token pass), but a batch of {batch} on {len(tokens)} columns puts {len(tokens[0])} on "
                       f"a PE; use a smaller batch or a wider mesh")
    return masks


def _check_memory(mem: _Memory, config: FabricConfig, graph: Graph, batch: int, program) -> None:
    if mem.next > config.sram_words:
        detail = ", ".join(f"{owner} {words}" for owner, words in mem.owners.items())
        raise MemoryFitError(f"model {graph.name} with batch {batch} needs {mem.next} words per PE on a "
                             f"{config.mesh} mesh ({detail}, program data {program.data_end}) but sram_words is "
                             f"{config.sram_words} (token passes bound the ring, not memory: every token's "
                             f"activations stay on its PE); use a smaller batch or a wider mesh", mem.next)


def _routes(config: FabricConfig, columns: int) -> list:
    W, H = config.width, config.height
    routes = []
    for i in range(H):
        routes += multicast_routes(row_cells(i, W)[:columns], Port.E, C_W, from_edge=True)
        routes += chain_routes(row_cells(i, W)[:columns], Port.E, EAST, from_edge=False, to_edge=True)
        leaving = EAST[columns % 2]
        routes += [(x, i, leaving, Port.W, (Port.E,)) for x in range(columns, W)]
    if H > 1:
        for j in range(columns):
            for i in range(H):
                c_in, c_out = ring_colors(i, H)
                if i > 0:
                    routes.append((j, i, c_in, Port.N, (Port.RAMP,)))
                if i < H - 1:
                    routes.append((j, i, c_out, Port.RAMP, (Port.S,)))
                    if i > 0:
                        routes.append((j, i, WRAP, Port.S, (Port.N,)))
            routes.append((j, H - 1, WRAP, Port.RAMP, (Port.N,)))
            routes.append((j, 0, WRAP, Port.S, (Port.RAMP,)))
    return routes
