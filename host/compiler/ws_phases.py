"""Phase builders of the weight-streaming mapping: per-PE op records, stream
orders and the functional description of each phase (used by
:func:`wse.host.compiler.weight_streaming.plan`).

Naming: ``act{l}`` is the activation entering Linear layer ``l`` (``act0`` is
the model input), ``grad{l}`` the gradient of the loss with respect to
``act{l}`` (after the ReLU mask, when one follows layer ``l``), ``act{l}tm``
the token-major copy of ``act{l}``.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from wse.config import FabricConfig
from wse.firmware.image import Program
from wse.firmware.training import C_W, records as rec

from .layouts import feature_slots, last_round_counter, spread_activation
from .schedule import (Relu, ReluMask, Sgemm, SgemmTransposed, SoftmaxDelta, SparseSgemm, SparseSgemmTransposed,
                       SparseWeightGradient, StreamIn, StreamOut, WeightGradient)
from .weight_streaming import EAST, PlannedPhase, WSLayer, ring_colors

__all__ = ["Context", "build", "transfers", "sgemm_steps", "row_features"]


@functools.lru_cache(maxsize=256)
def row_features(n: int, height: int, spread: bool) -> tuple[np.ndarray, ...]:
    """Per row, the features of ``n`` that it holds in local order (ascending), under
    :func:`~.layouts.feature_slots`: cyclic ``i, i+H, ...``; spread, the last round's on its rows."""
    slots = feature_slots(n, height, spread)
    rows = slots % height
    order = np.argsort(rows, kind="stable")
    bounds = np.cumsum(np.bincount(rows, minlength=height))[:-1]
    out = tuple(np.split(order, bounds))
    for part in out:
        part.setflags(write=False)
    return out


@dataclasses.dataclass
class Context:
    """What the builders share: the fabric, program, layers, tokens and memory."""
    config: FabricConfig
    program: Program
    layers: list
    relu_input: bool
    tokens: list
    mem: object
    H: int
    columns: int
    masks: dict = dataclasses.field(default_factory=dict)
    dense_phases: frozenset = frozenset()
    passes: list = dataclasses.field(default_factory=list)
    spread: bool = False

    def spread_of(self, l: int) -> bool:
        """Whether activation ``l`` (``act{l}``, ``grad{l}``; 0 the input) may spread its last round
        (:func:`~.layouts.spread_activation`)."""
        return spread_activation(self.spread, l, len(self.layers))

    def rows(self, l: int, n: int) -> tuple[np.ndarray, ...]:
        """:func:`row_features` of activation ``l``'s ``n`` features."""
        return row_features(n, self.H, self.spread_of(l))

    def local(self, l: int, n: int, i: int) -> int:
        """Features of activation ``l``'s ``n`` that row ``i`` holds."""
        return len(self.rows(l, n)[i])

    def gemm_sides(self, layer: WSLayer, transposed: bool, contracted: int) -> tuple[tuple[np.ndarray, ...], bool]:
        """``(rows, spread)`` of a streamed GEMM of ``layer`` (forward, or input gradients if
        ``transposed``): :meth:`rows` of its ``contracted`` input features, and whether its
        outputs spread (:meth:`spread_of`)."""
        l_in, l_out = (layer.index + 1, layer.index) if transposed else (layer.index, layer.index + 1)
        return self.rows(l_in, contracted), self.spread_of(l_out)

    def sparse(self, layer: WSLayer, phase: str) -> np.ndarray | None:
        """The mask of ``layer`` if its phase ``phase`` (such as ``"fwd fc1"``) runs sparse, else None."""
        return None if phase in self.dense_phases else self.masks.get(layer.weight)

    def T(self, j: int) -> int:
        """Tokens of column ``j`` (0 for columns without any)."""
        return len(self.tokens[j]) if j < self.columns else 0

    def token_passes(self, j: int) -> list[tuple[int, int]]:
        """``(offset, count)`` of each token pass of column ``j`` (one pass of every token by default)."""
        return self.passes[j] if self.passes else [(0, self.T(j))]

    def addr(self, name: str) -> int:
        return self.mem.regions[name][0]

    @property
    def zero(self) -> int:
        return self.program.symbol("f_zero")


#: Whether PEs with equal records share one array, built once per key (row, tokens, passes, column
#: parity); ``False``: built PE by PE, the same words (``tests/test_compile_cpu.py`` compares both).
SHARE = True


def _share(j: int, *key) -> tuple:
    """The memo key of a record that column ``j`` holds: ``key``, or with :data:`SHARE` off one per column."""
    return key if SHARE else (j,) + key


def sgemm_steps(row: int, height: int, outputs: int, spread: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``(o, p)``: the outputs row ``row`` handles, in order, and its ring position for each.

    Step ``p`` of round ``r`` handles the output in slot ``r*H + (row - 1 - p) mod H``
    (:func:`~.layouts.feature_slots` of the outputs, ``spread`` as there; steps of a slot
    without an output are skipped); the ring of an output homed on row ``e`` starts at
    position 0 on row ``e + 1 mod H`` and ends at position ``H - 1`` on row ``e``.
    """
    rounds = -(-outputs // height)
    p = np.tile(np.arange(height), rounds)
    r = np.repeat(np.arange(rounds), height)
    o = _slot_outputs(outputs, height, spread)[r * height + (row - 1 - p) % height]
    keep = o >= 0
    return o[keep], p[keep]


@functools.lru_cache(maxsize=64)
def _slot_outputs(outputs: int, height: int, spread: bool) -> np.ndarray:
    """The output in each slot of :func:`sgemm_steps`' rounds (-1: none), built once per GEMM shape."""
    of_slot = np.full(-(-outputs // height) * height, -1, dtype=np.int64)
    of_slot[feature_slots(outputs, height, spread)] = np.arange(outputs)
    of_slot.setflags(write=False)
    return of_slot


def _sgemm(ctx: Context, layer: WSLayer, transposed: bool, x: str, y: str) -> tuple[list, list, int]:
    """Records and weight streams of one streamed GEMM (forward, or input
    gradients with the weights transposed): one ``[H][W]`` part of records per
    record position, in order.

    With several token passes (:func:`~.weight_streaming.token_passes`) each
    pass is a ``transpose`` record gathering the pass's tokens of ``x`` into
    ``tmp`` (``[feature][pass token]``) and an ``sgemm`` record on them whose
    output slots keep the column's stride ``T`` (so ``y`` is written in place),
    and each row's weight stream repeats once per pass. One pass is the
    ``sgemm`` record alone on ``x``."""
    H, cfg = ctx.H, ctx.config
    k_total, outputs = (layer.o, layer.k) if transposed else (layer.k, layer.o)
    rows_in, spread_out = ctx.gemm_sides(layer, transposed, k_total)
    bias = layer.bias is not None and not transposed
    n_passes = len(ctx.token_passes(0))
    parts = [[[None] * cfg.width for _ in range(H)] for _ in range(2 * n_passes if n_passes > 1 else 1)]
    streams = []
    n_pool = layer.o * layer.k + (layer.o if bias else 0)
    minus_zero = n_pool + 1
    xa, ya, tmp = ctx.addr(x), ctx.addr(y), ctx.addr("tmp")
    for i in range(H):
        k = len(rows_in[i])
        c_in, c_out = ring_colors(i, H)
        rounds, o_last = divmod(outputs, H)
        e0, e_step = last_round_counter(i, H, outputs, spread_out)
        row_memo: dict = {}
        for j in range(cfg.width):
            T = ctx.T(j)
            if not T:
                continue
            first = row_memo.setdefault(_share(j, T, tuple(ctx.token_passes(j))), j)
            if first != j:      # columns with the same tokens and passes hold the same records
                for part in parts:
                    part[i][j] = part[i][first]
                continue
            for q, (off, t) in enumerate(ctx.token_passes(j)):
                xb = xa
                if n_passes > 1:     # gather the pass: tmp[f][u] = x[f][off + u], one token per iteration
                    xb = tmp
                    parts[2 * q][i][j] = rec.encode("transpose", dict(
                        k=1, t=t, dst=rec.dsd_mem(tmp, k, t), src=rec.dsd_mem(xa + off, k, T))) if k else None
                acc = rec.dsd_mem(ctx.zero, t, 0) if k == 0 else rec.dsd_mem(ctx.addr("acc"), t)
                parts[2 * q + 1 if n_passes > 1 else 0][i][j] = rec.encode("sgemm", dict(
                    k=k, t=T, rounds=rounds, h=H, o_last=o_last, e0=e0, e_step=e_step, acc=acc,
                    zero=rec.dsd_mem(ctx.zero, t, 0), x0=rec.dsd_mem(xb, t),
                    x1=rec.dsd_mem(xb + t, max(k - 1, 0) * t), w=rec.dsd_fabin(C_W, max(k - 1, 0)),
                    out=rec.dsd_fabout(c_out, t), inp=rec.dsd_fabin(c_in, t), y=rec.dsd_mem(ya + off, t)))
        o, p = sgemm_steps(i, H, outputs, spread_out)
        feats = rows_in[i]
        if transposed:   # W[f, o] for the row's outputs f of the layer
            idx = feats[None, :] * layer.k + o[:, None]
        else:            # W[o, f]
            idx = o[:, None] * layer.k + feats[None, :]
        ctrl_idx = (layer.o * layer.k + o) if bias else np.full(len(o), minus_zero)
        table = np.concatenate([idx, ctrl_idx[:, None]], axis=1)
        keep = np.concatenate([np.ones((len(o), len(feats)), bool), (p == 0)[:, None]], axis=1)
        flags = np.concatenate([np.zeros((len(o), len(feats)), np.uint8), np.ones((len(o), 1), np.uint8)], axis=1)
        if len(table[keep]):     # MemoryX streams the weights again for every pass
            streams.append(StreamIn("W", i, C_W, (layer.weight,) + ((layer.bias,) if bias else ()),
                                    np.tile(table[keep].astype(np.int64), n_passes),
                                    np.tile(flags[keep], n_passes)))
    fmacs = outputs * k_total * sum(ctx.T(j) for j in range(cfg.width))
    return parts, streams, fmacs


#: The marker words of a sparse stream (``spgemm`` of ``train_sparse.s``, included by ``train.s``), as
#: the pool holds them after +0 and -0: in the compute part -1 the carriage return after a step's pairs, -3 the ring part; in the ring part
#: -1 FIRST, -2 MID, -3 LAST, -4 ONLY on the step's slot, 1, 0, 2, 3 the same for a step without a
#: non-zero on the row (on the zero block), -5 the next block, -6 the end of the stream.
_MARKS = (-1, -2, -3, -4, -5, -6, 0, 1, 2, 3)
#: The ring part's marker of each :data:`~wse.firmware.training.records.SPARSE_KINDS` code: a step with
#: a non-zero on the row, one without.
_RING_MARKS = ((-1, -2, -3, -4), (1, 0, 2, 3))

#: Scratch regions that follow ``acc`` in the memory map; the sparse GEMM's slots use the run of them.
_SLOT_REGIONS = ("acc", "tmp", "g", "buf0", "buf1")


def sparse_slots(ctx: Context, T: int) -> tuple[int, int]:
    """``(address, count)``: the slots of ``T`` words for a block of the sparse GEMM's partials,
    over the contiguous scratch regions from ``acc`` on (free while a GEMM record runs)."""
    start, words = _scratch_run(ctx, _SLOT_REGIONS)
    return start, max(1, words // max(T, 1))


def _spgemm_stream(kept: np.ndarray, out: np.ndarray, kinds: np.ndarray, weight_index, bias_index,
                   block: int, w0: int) -> tuple[np.ndarray, np.ndarray]:
    """``(gather, ctrl)`` of one row's sparse stream: per block of ``block`` steps, the steps'
    index/value pairs and a carriage return (-1; nothing for a step without any), -3, then each step's
    ring kind (:data:`_RING_MARKS`; and bias word for FIRST and ONLY), then -5, or -6 after the last
    block. The pool holds the markers from ``w0`` on and the feature addresses after them."""
    gather, ctrl = [], []

    def mark(code):
        gather.append(np.array([w0 + _MARKS.index(code)], dtype=np.int64))
        ctrl.append(np.ones(1, np.uint8))

    first, only = rec.SPARSE_KINDS["first"], rec.SPARSE_KINDS["only"]
    for b0 in range(0, len(out), block):
        steps = range(b0, min(b0 + block, len(out)))
        for s in steps:
            local = np.flatnonzero(kept[s])
            if len(local):
                pairs = np.empty(2 * len(local), dtype=np.int64)
                pairs[0::2] = w0 + len(_MARKS) + local
                pairs[1::2] = weight_index(out[s], local)
                gather.append(pairs)
                ctrl.append(np.zeros(len(pairs), np.uint8))
                mark(-1)                                    # the carriage return: fmacx stops at it
        mark(-3)
        for s in steps:
            mark(_RING_MARKS[not kept[s].any()][int(kinds[s])])
            if kinds[s] in (first, only):
                gather.append(np.array([bias_index(out[s])], dtype=np.int64))
                ctrl.append(np.zeros(1, np.uint8))
        mark(-5 if b0 + block < len(out) else -6)
    return np.concatenate(gather), np.concatenate(ctrl)


def _spgemm(ctx: Context, layer: WSLayer, mask: np.ndarray, transposed: bool, x: str,
            y: str) -> tuple[list, list, int]:
    """Records and weight streams of a masked layer's sparse streamed GEMM
    (``docs/weight_streaming.md`` section 13; forward, or input gradients with
    the masked weights transposed): the dense GEMM's steps and ring, in blocks
    of steps (:func:`sparse_slots`), each row's stream holding only its kept
    weights as (index, value) pairs (:func:`_spgemm_stream`)."""
    H, cfg = ctx.H, ctx.config
    T = ctx.T(0)
    bias = layer.bias is not None and not transposed
    grid = mask.T if transposed else mask                   # [outputs, contracted features]
    rows_in, spread_out = ctx.gemm_sides(layer, transposed, grid.shape[1])
    n_pool = layer.o * layer.k + (layer.o if layer.bias is not None else 0)
    xa = ctx.addr(x)
    slots, block = sparse_slots(ctx, T)
    records = [[None] * cfg.width for _ in range(H)]
    streams = []
    for i in range(H):
        feats = rows_in[i]
        o, p = sgemm_steps(i, H, grid.shape[0], spread_out)
        kinds = np.where(p == 0, rec.SPARSE_KINDS["first"],
                         np.where(p == H - 1, rec.SPARSE_KINDS["last"], rec.SPARSE_KINDS["mid"]))
        if H == 1:
            kinds[:] = rec.SPARSE_KINDS["only"]
        kept = grid[o][:, feats] if len(o) else np.zeros((0, len(feats)), bool)
        counts = kept.sum(axis=1)
        c_in, c_out = ring_colors(i, H)
        def make(c_in=c_in, c_out=c_out, counts=counts, kinds=kinds):
            return rec.encode("spgemm", dict(
                t=T, b=block, acc=rec.dsd_mem(slots, T), zero=rec.dsd_mem(ctx.zero, T, 0), x=rec.dsd_mem(0, T),
                w=rec.dsd_fabin(C_W, 0), out=rec.dsd_fabout(c_out, T), inp=rec.dsd_fabin(c_in, T),
                y=rec.dsd_mem(ctx.addr(y), T)), table=(counts << 2 | kinds).tolist())
        record = make()         # the same in every column of the row
        for j in range(ctx.columns):
            records[i][j] = record if SHARE else make()
        # the pool: weight (, bias), +0, -0, then the words: the markers, the feature addresses
        words = np.array(list(_MARKS) + [xa + l * T for l in range(len(feats))], dtype=np.int64).astype(np.uint32)
        if transposed:
            def weight_index(out, local, feats=feats):
                return feats[local] * layer.k + out
        else:
            def weight_index(out, local, feats=feats):
                return out * layer.k + feats[local]

        def bias_index(out):
            return layer.o * layer.k + out if bias else n_pool + 1
        gather, ctrl = _spgemm_stream(kept, o, kinds, weight_index, bias_index, block, n_pool + 2)
        streams.append(StreamIn("W", i, C_W, (layer.weight,) + ((layer.bias,) if layer.bias is not None else ()),
                                gather, ctrl, words))
    fmacs = int(mask.sum()) * sum(ctx.T(j) for j in range(cfg.width))
    return records, streams, fmacs


def _per_pe(ctx: Context, make, key=lambda i, j, T: (i, T)) -> list:
    """``[H][W]`` records from ``make(i, j, T)`` for PEs holding tokens.

    ``make`` depends on the PE only through ``key(i, j, T)`` (by default the
    row and the tokens), so it runs once per distinct key and the PEs with
    equal keys share its record (records are never written in place)."""
    memo: dict = {}

    def one(i, j, T):
        k = _share(j, *key(i, j, T))
        if k not in memo:
            memo[k] = make(i, j, T)
        return memo[k]
    tokens = [ctx.T(j) for j in range(ctx.config.width)]
    return [[one(i, j, T) if T else None for j, T in enumerate(tokens)] for i in range(ctx.H)]


def _relu(ctx: Context, l: int, features: int) -> list:
    """``relu`` records of activation ``l`` (``act{l}``) in place."""
    return _per_pe(ctx, lambda i, j, T: rec.encode("relu", dict(
        data=rec.dsd_mem(ctx.addr(f"act{l}"), ctx.local(l, features, i) * T))))


def _transpose(ctx: Context, l: int, features: int) -> list:
    """``transpose`` records of activation ``l`` into its token-major copy ``act{l}tm``."""
    def make(i, j, T):
        k = ctx.local(l, features, i)
        return rec.encode("transpose", dict(k=k, t=T, dst=rec.dsd_mem(ctx.addr(f"act{l}tm"), k),
                                            src=rec.dsd_mem(ctx.addr(f"act{l}"), k, T)))
    return _per_pe(ctx, make)


def _mask(ctx: Context, l: int, features: int) -> list:
    """``mask`` records of ``grad{l}`` by ``act{l}``: one over the PE's block, or (``tmp``
    sized for a token pass) one per chunk of the block that ``tmp`` holds."""
    act, grad = f"act{l}", f"grad{l}"
    room = ctx.mem.regions["tmp"][1]
    n_of = [ctx.local(l, features, i) * ctx.T(0) for i in range(ctx.H)]
    chunks = max(1, *(-(-n // room) for n in n_of))

    def chunk(c):
        def make(i, j, T):
            n = ctx.local(l, features, i) * T
            lo, hi = c * room, min(n, (c + 1) * room)
            if c and lo >= hi:
                return None
            return rec.encode("mask", dict(act=rec.dsd_mem(ctx.addr(act) + lo, hi - lo),
                                           grad=rec.dsd_mem(ctx.addr(grad) + lo, hi - lo),
                                           tmp=rec.dsd_mem(ctx.addr("tmp"), hi - lo)))
        return _per_pe(ctx, make)
    return [chunk(c) for c in range(chunks)]


def _wgrad(ctx: Context, layer: WSLayer, l: int) -> tuple[list, list, int]:
    """Records and gradient streams of the weight gradients of layer ``l`` (1-based)."""
    H, cfg = ctx.H, ctx.config
    bias = layer.bias is not None
    g = ctx.addr("g")
    rows_x, rows_dy = ctx.rows(l - 1, layer.k), ctx.rows(l, layer.o)
    counts_of = [len(rows_dy[r]) for r in range(H)]

    def make(i, j, T):
        kx = len(rows_x[i])
        c_in, c_out = ring_colors(i, H)
        xt = ctx.addr(f"act{l - 1}tm")
        ein = rec.dsd_fabin(EAST[j % 2]) if j else rec.dsd_mem(ctx.zero, 0, 0)
        return rec.encode("wgrad", dict(
            kx=kx, t=T, h=H, bias=int(bias), send_first=int(i % 2 == 0), own=ctx.addr(f"grad{l}"),
            buf0=ctx.addr("buf0"), buf1=ctx.addr("buf1"), gk=g + kx, g=rec.dsd_mem(g, kx),
            zero=rec.dsd_mem(ctx.zero, kx, 0), x0=rec.dsd_mem(xt, kx), x1=rec.dsd_mem(xt + kx, (T - 1) * kx),
            dyr=rec.dsd_mem(0, T - 1), eout=rec.dsd_fabout(EAST[(j + 1) % 2]), ein=ein, dyo=rec.dsd_mem(0, T),
            rout=rec.dsd_fabout(c_out), rin=rec.dsd_fabin(c_in), mem=rec.dsd_mem(0, 0)),
            table=[counts_of[(i - s) % H] for s in range(H)])

    records = _per_pe(ctx, make, key=lambda i, j, T: (i, T, j % 2, j == 0))   # ein, eout: by column parity
    streams = []
    n_weight = layer.o * layer.k
    # Row i's outputs in rotation order, rows i, i - 1, ..., i + 1 (mod H): a slice of the rows'
    # outputs laid out from row H - 1 down to row 0, twice (H^2 small arrays a layer before: 6 s
    # on 994 rows).
    down = [np.asarray(rows_dy[r], dtype=np.int64) for r in range(H - 1, -1, -1)]
    twice = np.concatenate(down + down) if H else np.zeros(0, np.int64)
    begins = np.concatenate([[0], np.cumsum([len(d) for d in down])])
    total = int(begins[-1])
    for i in range(H):
        feats = np.asarray(rows_x[i], dtype=np.int64)
        first = H - 1 - i                              # row i's place in the rows laid out downwards
        outs = twice[begins[first]:begins[first] + total]
        own = len(rows_dy[i])                          # step 0's outputs, row i's own
        head = outs[:own, None] * layer.k + feats[None, :]
        if bias:
            head = np.concatenate([head, (n_weight + outs[:own])[:, None]], axis=1)
        scatter = np.concatenate([head.ravel(), (outs[own:, None] * layer.k + feats[None, :]).ravel()])
        if len(scatter):
            tensors = (layer.weight,) + ((layer.bias,) if bias else ())
            streams.append(StreamOut("E", i, EAST[ctx.columns % 2], tensors, scatter))
    fmacs = layer.o * layer.k * sum(ctx.T(j) for j in range(cfg.width))
    return records, streams, fmacs


#: The words of G that ``spwgrad`` gathers before a row chain (at least one output's): measured on the
#: 2048-wide layer at 90%, longer chains leave the rows waiting longer for each other (1,161 words:
#: 444,117 cycles, 256: 438,166, 100: 441,225, 60: 446,116, the chains' own overhead growing).
_CHAIN_WORDS = 256


def _scratch_run(ctx: Context, names) -> tuple[int, int]:
    """``(address, words)`` of the contiguous run of the scratch regions ``names`` (in order) from the first."""
    start = end = ctx.mem.regions[names[0]][0]
    for name in names:
        addr, words = ctx.mem.regions[name]
        if addr != end:
            break
        end = addr + words
    return start, end - start


def _spwgrad(ctx: Context, layer: WSLayer, l: int, mask: np.ndarray) -> tuple[list, list, list, int]:
    """Records, the mask's index streams and the gradient streams of a masked
    layer's weight gradients (``spwgrad`` of ``train_sparse.s``, which ``train.s`` includes): wgrad's
    rotation and row chain over the kept weights only. Row ``i``'s index stream holds, per
    rotation step and output of the held block, a marker (-1, or -5 for a bias
    partial first) and the addresses of the kept features' blocks of ``x``
    (feature-major; ``fdotx`` takes them and stops at the next marker); the row
    chain of the gradients gathered in G (``-6, N``) when the next output would
    not fit (:func:`~wse.firmware.training.timing.spwgrad_items`) and at the
    end; -7 ends a rotation step."""
    from wse.firmware.training.timing import spwgrad_items

    H = ctx.H
    T = ctx.T(0)
    bias = layer.bias is not None
    xa = ctx.addr(f"act{l - 1}")
    g, run = _scratch_run(ctx, ("acc", "tmp", "g"))         # G: scratch free while the record runs
    rows_x, rows_dy = ctx.rows(l - 1, layer.k), ctx.rows(l, layer.o)
    cap = min(run, max(_CHAIN_WORDS, max(len(f) for f in rows_x) + 1))
    counts_of = [len(rows_dy[r]) for r in range(H)]
    records = [[None] * ctx.config.width for _ in range(H)]
    streams_in, streams_out = [], []
    n_weight = layer.o * layer.k
    for i in range(H):
        feats = rows_x[i]
        kept_n, kept_local, scatter = [], [], []
        for s in range(H):
            for o in rows_dy[(i - s) % H]:
                local = np.flatnonzero(mask[o, feats])
                kept_n.append(len(local))
                kept_local.append(local)
                if bias and s == 0:
                    scatter.append([n_weight + o])
                scatter.append(o * layer.k + feats[local])
        c_in, c_out = ring_colors(i, H)
        counts = [counts_of[(i - s) % H] for s in range(H)]
        row_memo: dict = {}      # a row's records differ only by the column's parity and column 0
        for j in range(ctx.columns):
            key = _share(j, j % 2, j == 0)
            if key in row_memo:
                records[i][j] = row_memo[key]
                continue
            ein = rec.dsd_fabin(EAST[j % 2]) if j else rec.dsd_mem(ctx.zero, 0, 0)
            records[i][j] = row_memo[key] = rec.encode("spwgrad", dict(
                t=T, h=H, bias=int(bias), send_first=int(i % 2 == 0), own=ctx.addr(f"grad{l}"),
                buf0=ctx.addr("buf0"), buf1=ctx.addr("buf1"), ga=g, g=rec.dsd_mem(g, 1),
                gall=rec.dsd_mem(g, cap), zero=rec.dsd_mem(ctx.zero, 1, 0),
                x=rec.dsd_mem(0, T), eout=rec.dsd_fabout(EAST[(j + 1) % 2]), ein=ein, dyo=rec.dsd_mem(0, T),
                rout=rec.dsd_fabout(c_out), rin=rec.dsd_fabin(c_in), mem=rec.dsd_mem(0, 0),
                w=rec.dsd_fabin(C_W, 0)), table=counts + kept_n)
        # the pool: +0, -0, the markers -1 .. -7, the feature addresses, then the chain lengths 0 .. cap
        marks, addrs = 2, 2 + 7
        lengths = addrs + len(feats)
        gather, at = [], 0
        for items in spwgrad_items(counts, kept_n, bias, cap):
            for item in items:
                if item[0] == "out":
                    local = addrs + kept_local[at]
                    at += 1
                    gather += [[marks + (4 if item[2] else 0)], local]     # -5 (a bias partial first) or -1
                else:
                    gather.append([marks + 5, lengths + item[1]])          # -6, N
            gather.append([marks + 6])                                     # -7
        words = np.array([-1, -2, -3, -4, -5, -6, -7] + [xa + m * T for m in range(len(feats))]
                         + list(range(cap + 1)), dtype=np.int64).astype(np.uint32)
        index = np.concatenate([np.asarray(v, dtype=np.int64) for v in gather])
        ctrl = ((index >= marks) & (index < addrs)).astype(np.uint8)
        streams_in.append(StreamIn("W", i, C_W, (), index, ctrl, words))
        flat = np.concatenate(scatter).astype(np.int64) if scatter else np.zeros(0, np.int64)
        if len(flat):
            tensors = (layer.weight,) + ((layer.bias,) if bias else ())
            streams_out.append(StreamOut("E", i, EAST[ctx.columns % 2], tensors, flat))
    fmacs = int(mask.sum()) * sum(ctx.T(j) for j in range(ctx.config.width))
    return records, streams_in, streams_out, fmacs


def _softmax(ctx: Context, l: int) -> tuple[list, int]:
    """Records of the loss delta: ``[H][W]`` parts in order.

    One pass: a ``softmax`` record on the logits ``act{l}`` in place, writing
    ``grad{l}``. With token passes, per pass: a ``transpose`` record gathering
    the pass's logits into ``tmp`` (``[class][pass token]``), the ``softmax``
    record on ``tmp`` (its buffers sized for a pass; the host lays ``onehot``
    out pass by pass) writing the delta back into ``tmp``, and a
    ``transpose`` record scattering it into ``grad{l}`` in place."""
    H = ctx.H
    classes = ctx.layers[-1].o
    counts_of = [ctx.local(l, classes, r) for r in range(H)]
    a = ctx.addr
    n_passes = len(ctx.token_passes(0))
    parts = [[[None] * ctx.config.width for _ in range(H)] for _ in range(3 * n_passes if n_passes > 1 else 1)]
    for i in range(H):
        c_in, c_out = ring_colors(i, H)
        ci = counts_of[i]
        row_memo: dict = {}
        for j in range(ctx.columns):
            T = ctx.T(j)
            first = row_memo.setdefault(_share(j, T, tuple(ctx.token_passes(j))), j)
            if first != j:      # columns with the same tokens and passes hold the same records
                for part in parts:
                    part[i][j] = part[i][first]
                continue
            for q, (off, t) in enumerate(ctx.token_passes(j)):
                own, dz = a(f"act{l}"), a(f"grad{l}")
                if n_passes > 1:
                    own = dz = a("tmp")
                    if ci:      # tmp[c][u] = z[c][off + u]; after the record, dz[c][off + u] = tmp[c][u]
                        parts[3 * q][i][j] = rec.encode("transpose", dict(
                            k=1, t=t, dst=rec.dsd_mem(own, ci, t), src=rec.dsd_mem(a(f"act{l}") + off, ci, T)))
                        parts[3 * q + 2][i][j] = rec.encode("transpose", dict(
                            k=1, t=t, dst=rec.dsd_mem(a(f"grad{l}") + off, ci, T), src=rec.dsd_mem(own, ci, t)))
                n = classes * t
                parts[3 * q + 1 if n_passes > 1 else 0][i][j] = rec.encode("softmax", dict(
                    c=classes, ci=ci, t=t, h=H, row=i, send_first=int(i % 2 == 0), own=own, buf0=a("buf0"),
                    buf1=a("buf1"), zall=a("zall"), ht=H * t, n=n, nb=a("nb"), fb=a("fb"), sb=a("s"), ib=a("inv"),
                    tmem=rec.dsd_mem(0, t), rout=rec.dsd_fabout(c_out), rin=rec.dsd_fabin(c_in),
                    mem=rec.dsd_mem(0, 0), m=rec.dsd_mem(a("m"), t), s=rec.dsd_mem(a("s"), t),
                    inv=rec.dsd_mem(a("inv"), t), tmp=rec.dsd_mem(a("stmp"), t),
                    two=rec.dsd_mem(ctx.program.symbol("two"), t, 0), zn=rec.dsd_mem(a("zall"), n),
                    fn=rec.dsd_mem(a("fb"), n), rn=rec.dsd_mem(a("rb"), n),
                    onehot=rec.dsd_mem(a("onehot") + ci * off, t), scale=rec.dsd_mem(a("scale") + off, t),
                    dz=rec.dsd_mem(dz, t)), table=[counts_of[(i - s) % H] for s in range(H)])
    fmacs = 2 * classes * sum(ctx.T(j) for j in range(ctx.config.width)) * sum(1 for i in range(H) if counts_of[i])
    return parts, fmacs


def _merge(ctx: Context, *parts) -> list:
    """Per-PE op lists: the records of ``parts`` (each ``[H][W]``) in order."""
    return [[[part[i][j] for part in parts if part[i][j] is not None] for j in range(ctx.config.width)]
            for i in range(ctx.H)]


def build(ctx: Context) -> tuple[dict, dict]:
    """Every phase of a training step and the phase sequences ``train`` and ``eval``."""
    layers, L = ctx.layers, len(ctx.layers)
    phases: dict[str, PlannedPhase] = {}

    def add(name, group, parts, streams_in=(), streams_out=(), math=(), fmacs=0):
        lists = _merge(ctx, *parts)
        words = max(sum(len(r) for r in lst) for row in lists for lst in row) + rec.HEADER_WORDS
        addr = ctx.mem.take(f"ops:{name}", words, "op lists")
        phases[name] = PlannedPhase(name, group, addr, lists, tuple(streams_in), tuple(streams_out), tuple(math),
                                    fmacs)

    for l, layer in enumerate(layers, start=1):
        parts, math = [], []
        if l == 1 and ctx.relu_input:
            parts.append(_relu(ctx, 0, layer.k))
            parts.append(_transpose(ctx, 0, layer.k))
            math.append(Relu("act0"))
        mask = ctx.sparse(layer, f"fwd {layer.name}")
        if mask is not None:
            records, streams, fmacs = _spgemm(ctx, layer, mask, False, f"act{l - 1}", f"act{l}")
            math.append(SparseSgemm(layer.weight, layer.bias, f"act{l - 1}", f"act{l}", np.flatnonzero(mask.ravel())))
        else:
            records, streams, fmacs = _sgemm(ctx, layer, False, f"act{l - 1}", f"act{l}")
            math.append(Sgemm(layer.weight, layer.bias, f"act{l - 1}", f"act{l}"))
            parts += records[:-1]     # the token passes before the last
            records = records[-1]
        parts.append(records)
        if layer.relu:
            parts.append(_relu(ctx, l, layer.o))
            math.append(Relu(f"act{l}"))
        if l < L:
            parts.append(_transpose(ctx, l, layer.o))
        add(f"fwd {layer.name}", "forward", parts, streams, (), math, fmacs)
    parts, fmacs = _softmax(ctx, L)
    math = [SoftmaxDelta(f"act{L}", f"grad{L}")]
    if layers[-1].relu:
        parts += _mask(ctx, L, layers[-1].o)
        math.append(ReluMask(f"act{L}", f"grad{L}"))
    add("loss", "loss", parts, math=math, fmacs=fmacs)
    backward = []
    for l in range(L, 0, -1):
        layer = layers[l - 1]
        if l > 1:
            before = []
            mask = ctx.sparse(layer, f"bwd-data {layer.name}")
            if mask is not None:
                records, streams, fmacs = _spgemm(ctx, layer, mask, True, f"grad{l}", f"grad{l - 1}")
                math = [SparseSgemmTransposed(layer.weight, f"grad{l}", f"grad{l - 1}", np.flatnonzero(mask.T.ravel()))]
            else:
                records, streams, fmacs = _sgemm(ctx, layer, True, f"grad{l}", f"grad{l - 1}")
                math = [SgemmTransposed(layer.weight, f"grad{l}", f"grad{l - 1}")]
                before, records = records[:-1], records[-1]     # the token passes before the last
            parts = before + [records]
            if layers[l - 2].relu:
                parts += _mask(ctx, l - 1, layer.k)
                math.append(ReluMask(f"act{l - 1}", f"grad{l - 1}"))
            add(f"bwd-data {layer.name}", "backward-data", parts, streams, (), math, fmacs)
            backward.append(f"bwd-data {layer.name}")
        mask = ctx.sparse(layer, f"bwd-weight {layer.name}")
        if mask is not None:
            records, streams_in, streams, fmacs = _spwgrad(ctx, layer, l, mask)
            add(f"bwd-weight {layer.name}", "backward-weight", [records], streams_in, streams,
                [SparseWeightGradient(layer.weight, layer.bias, f"act{l - 1}", f"grad{l}",
                                      np.flatnonzero(mask.ravel()))], fmacs)
        else:
            records, streams, fmacs = _wgrad(ctx, layer, l)
            add(f"bwd-weight {layer.name}", "backward-weight", [records], (), streams,
                [WeightGradient(layer.weight, layer.bias, f"act{l - 1}", f"grad{l}")], fmacs)
        backward.append(f"bwd-weight {layer.name}")
    forward = [f"fwd {layer.name}" for layer in layers]
    return phases, {"train": forward + ["loss"] + backward, "eval": forward}


def transfers(ctx: Context) -> dict:
    """Host copies of a step: index maps ``[H, W, n]`` (-1: write 0 / ignore).

    ``x`` indexes the flattened input ``[B, K]``, ``onehot`` and ``logits``
    the ``[B, C]`` arrays, ``scale`` the ``[B]`` vector.
    """
    H, W = ctx.H, ctx.config.width
    K, C = ctx.layers[0].k, ctx.layers[-1].o
    L = len(ctx.layers)

    # Columns whose token blocks have one size and one list of passes, built together (PE by PE,
    # the wafer's five maps took 15 s).
    groups: dict = {}
    for j in range(ctx.columns):
        toks = np.asarray(ctx.tokens[j], dtype=np.int64)
        if len(toks):
            groups.setdefault((len(toks), tuple(ctx.token_passes(j))), []).append((j, toks))
    blocks = [(np.array([j for j, _ in members]), np.stack([t for _, t in members]), passes)
              for (_, passes), members in groups.items()]

    def build_map(region: str, l: int, features: int, width: int, token_major: bool, per_token: bool = False):
        addr, words = ctx.mem.regions[region]
        index = np.full((H, W, words), -1, dtype=np.int64)
        rows = ctx.rows(l, features)
        for cols, toks, passes in blocks:           # toks: [column][token]
            if per_token:
                index[:, cols, :toks.shape[1]] = toks[None]
                continue
            for i in range(H):
                grid = toks[:, None, :] * width + np.asarray(rows[i], dtype=np.int64)[None, :, None]
                if region == "onehot":              # [column][feature][token], pass by pass: [pass][class][token]
                    flat = np.concatenate([grid[:, :, off:off + t].reshape(len(cols), -1) for off, t in passes], axis=1)
                else:
                    flat = (grid.transpose(0, 2, 1) if token_major else grid).reshape(len(cols), -1)
                index[i, cols, :flat.shape[1]] = flat
        return addr, index

    return {"x": build_map("act0", 0, K, K, False), "xtm": build_map("act0tm", 0, K, K, True),
            "onehot": build_map("onehot", L, C, C, False), "scale": build_map("scale", L, 0, 0, False, True),
            "logits": build_map(f"act{L}", L, C, C, False)}
