"""Attention instances side by side, and the relayouts that feed them
(``docs/transformer.md`` section 11).

A causal attention has ``B * heads`` instances (one per sequence and head).
:func:`head_tiling` cuts the mesh into tiles of ``tw x th`` PEs and runs one
instance per tile, as many at once as there are tiles (a *round*): each
tile runs the attention and softmax kernels exactly as a mesh of its own
size would (the same blocks, the same chains, the same float order), so the
instances' bits are the one-head kernels' bits. The tile shape is the one
whose rounds take the fewest static cycles.

Every buffer of a round has one address in every PE (:class:`HeadTiling`
``.buffers``), agreed between the kernels: the scores land where the
softmax reads them, the softmax leaves ``p`` where ``values`` and
``backward-dv`` read it, ``dp`` lands where the softmax backward reads it,
and so on. A head's ``q``, ``k``, ``v`` (and ``dout``) enter the tiles'
row and key buffers by a relayout (:mod:`wse.firmware.kernels.relayout`) from
the streamed GEMM's layout, kept above the attention's buffers; the
products' outputs leave by a relayout into that layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from wse.config import FabricConfig, UsageError
from wse.firmware.kernels import attention_timing, relayout_timing, softmax_timing
from wse.firmware.kernels.attention import Attention, AttentionPlan
from wse.firmware.kernels.common import block_partition, kernel_program
from wse.firmware.kernels.mirrors import mesh_ops
from wse.firmware.kernels.relayout import RelayoutPlan, plan_relayout
from wse.firmware.kernels.softmax import BLOCK_BUFFERS, ROW_BUFFERS, Softmax, SoftmaxPlan
from wse.firmware.timing_ops import OpRows
from wse.firmware.training.numerics import assembler_defines

from .replay import Network, replay

__all__ = ["HeadTiling", "head_tiling", "RoundKernel", "round_kernel", "round_cycles", "relayout_in",
           "relayout_out", "relayout_cycles", "token_major", "ROW_OF", "COL_OF", "BLK_OF", "OUT_OF", "MATRICES"]

#: Per attention variant: the buffer its query rows, key rows, ``T x T`` block and result use.
ROW_OF = {"scores": "ROW_Q", "backward-dp": "ROW_D", "backward-dv": "ROW_D", "backward-dk": "ROW_Q"}
COL_OF = {"scores": "COL_K", "values": "COL_V", "backward-dp": "COL_V", "backward-dq": "COL_K"}
BLK_OF = {"values": "P", "backward-dv": "P", "backward-dq": "DS", "backward-dk": "DS"}
OUT_OF = {"scores": "S", "backward-dp": "DP", "values": "OUT", "backward-dv": "OUT", "backward-dq": "OUT",
          "backward-dk": "OUT"}
#: The matrices a relayout brings in, each with its slot above the attention's buffers.
MATRICES = ("q", "k", "v", "dout")
_BUFFER_OF = {"q": "ROW_Q", "k": "COL_K", "v": "COL_V", "dout": "ROW_D"}
_VARIANTS = ("scores", "values", "backward-dp", "backward-dv", "backward-dq", "backward-dk")


@dataclasses.dataclass(frozen=True)
class HeadTiling:
    """The tiles of a causal attention's instances.

    Members
    -------
    config, tile:
        The mesh and one tile's shape (a configuration of its own).
    sequences, heads, t, dh:
        ``B``, heads, ``T`` and ``Dh``.
    origins:
        Every tile's north-west PE, column by column.
    buffers:
        ``(name, address)``: the agreed addresses (``S``, ``P``, ``DP``, ``DS``, the softmax's heaps
        ``HEAP_F``, ``HEAP_B``, ``ROW_Q``, ``ROW_D``, ``COL_K``, ``COL_V``, ``OUT``).
    base, top:
        The attention region ``[base, top)`` of every PE; the relayouts' GEMM-layout words go above.
    """
    config: FabricConfig
    tile: FabricConfig
    sequences: int
    heads: int
    t: int
    dh: int
    origins: tuple[tuple[int, int], ...]
    buffers: tuple[tuple[str, int], ...]
    base: int
    top: int

    @property
    def instances(self) -> int:
        """``B * heads``."""
        return self.sequences * self.heads

    @property
    def rounds(self) -> list[list[int]]:
        """The instances (``b * heads + h``) of each round, the ``k``-th on ``origins[k]``."""
        n = len(self.origins)
        return [list(range(s, min(s + n, self.instances))) for s in range(0, self.instances, n)]

    def address(self, name: str) -> int:
        """An agreed address that is the same in every PE (``ROW_Q``, ``ROW_D``, ``COL_K``, ``COL_V``,
        ``OUT``, ``S``)."""
        return dict(self.buffers)[name]

    def query_blocks(self) -> list[range]:
        """The queries of each tile row."""
        return block_partition(self.t, self.tile.height)

    def key_blocks(self) -> list[range]:
        """The keys of each tile column."""
        return block_partition(self.t, self.tile.width)


def _layout(config: FabricConfig, t: int, dh: int) -> tuple[tuple[tuple[str, int], ...], int, int] | None:
    """The agreed addresses on a tile ``config``, the region's base and top, or None if they do not fit."""
    att = kernel_program("attention", config, T_START=0)
    soft = Softmax().plan(config, {"n": t, "variant": "forward"})
    base = max(att.data_end, soft.heap)
    queries, keys = block_partition(t, config.height), block_partition(t, config.width)
    r, k = len(queries[0]), len(keys[0])
    n = r * k
    held = np.array([len(q) for q in queries])[:, None] * np.array([len(b) for b in keys])[None, :]

    def grid(a: np.ndarray) -> tuple:
        return tuple(tuple(int(v) for v in row) for row in a)
    # the softmax's buffers follow its heap by multiples of the PE's own block (softmax.s)
    heap_b = base + BLOCK_BUFFERS.index("OUT") * held
    rows = base + BLOCK_BUFFERS.index("OUT") * n + len(BLOCK_BUFFERS) * n + len(ROW_BUFFERS) * r
    names = {"HEAP_F": base, "S": base, "P": grid(heap_b), "HEAP_B": grid(heap_b), "DP": grid(heap_b + held),
             "DS": grid(heap_b + BLOCK_BUFFERS.index("OUT") * held), "ROW_Q": rows, "ROW_D": rows + r * dh,
             "COL_K": rows + 2 * r * dh, "COL_V": rows + 2 * r * dh + k * dh, "OUT": rows + 2 * (r + k) * dh}
    top = names["OUT"] + max(r, k) * dh
    if top > config.sram_words:
        return None
    return tuple(sorted(names.items())), base, top


def _powers(n: int) -> list[int]:
    return sorted({1 << i for i in range(n.bit_length()) if 1 << i <= n} | {n})


@functools.lru_cache(maxsize=64)
def head_tiling(config: FabricConfig, sequences: int, heads: int, t: int, dh: int, scale: float) -> HeadTiling:
    """The tiling of ``sequences * heads`` instances of ``T = t``, ``Dh = dh`` whose rounds take the
    fewest static cycles (tile widths and heights: powers of two and the mesh's own, at most ``T``).
    Raises :class:`UsageError` if no tile holds an instance."""
    best, best_cost = None, None
    for tw in _powers(config.width):
        for th in _powers(config.height):
            if tw > t or th > t:
                continue
            tile = dataclasses.replace(config, width=tw, height=th)
            layout = _layout(tile, t, dh)
            if layout is None:
                continue
            origins = tuple((x, y) for x in range(0, config.width - tw + 1, tw)
                            for y in range(0, config.height - th + 1, th))
            rounds = math.ceil(sequences * heads / len(origins))
            cost = rounds * sum(_tile_cycles(tile, t, dh, v, scale, layout[0]) for v in _VARIANTS + ("sf", "sb"))
            if best_cost is None or cost < best_cost:
                best, best_cost = HeadTiling(config, tile, sequences, heads, t, dh, origins, *layout), cost
    if best is None:
        raise UsageError(f"no tile of the {config.mesh} mesh holds an attention head of T={t}, Dh={dh}")
    return best


def _tile_plan(tile: FabricConfig, t: int, dh: int, variant: str, scale: float, buffers) -> AttentionPlan | SoftmaxPlan:
    """One instance's plan on a tile: ``sf``/``sb`` the softmax forward/backward, else an attention variant."""
    given = dict(buffers)
    if variant in ("sf", "sb"):
        kernel = Softmax()
        plan = kernel.plan(tile, {"n": t, "variant": "forward" if variant == "sf" else "backward"})
        heap = given["HEAP_F"] if variant == "sf" else np.array(given["HEAP_B"], dtype=np.int64)
        return dataclasses.replace(plan, scale=scale, heap=heap)
    plan = Attention().plan(tile, {"n": t, "cols": dh, "variant": variant})
    addresses = {"ROW": given[ROW_OF.get(variant, "ROW_Q")], "COL": given[COL_OF.get(variant, "COL_K")],
                 "BLK": given[BLK_OF.get(variant, "P")], "OUT": given[OUT_OF[variant]]}
    return dataclasses.replace(plan, scale_value=scale, resident=True, buffers=tuple(sorted(addresses.items())))


@functools.lru_cache(maxsize=256)
def _tile_cycles(tile: FabricConfig, t: int, dh: int, variant: str, scale: float, buffers) -> int:
    plan = _tile_plan(tile, t, dh, variant, scale, buffers)
    timing = softmax_timing if variant in ("sf", "sb") else attention_timing
    routes, ops, starts, ends, inject = timing.timing_ops(plan)
    return int(replay(Network(tile, routes), ops, starts, ends, inject, periods=False))


def _offset_routes(routes, x0: int, y0: int) -> list:
    return [(x + x0, y + y0, c, i, o) for x, y, c, i, o in routes]


@dataclasses.dataclass
class RoundKernel:
    """One kernel over a round's tiles: the whole mesh's program, parameters, routes and rings."""
    plan: AttentionPlan | SoftmaxPlan
    program: object
    params: dict[str, np.ndarray]
    routes: list
    rings: list
    origins: tuple[tuple[int, int], ...]

    def pe_ops(self, timing, x: int, y: int) -> np.ndarray:
        """PE ``(x, y)``'s timing ops: its tile's, or an idle PE's (no queries: it exits)."""
        tw, th = self.plan.config.width, self.plan.config.height
        for x0, y0 in self.origins:
            if x0 <= x < x0 + tw and y0 <= y < y0 + th:
                return timing.pe_ops(self.plan, x - x0, y - y0)
        ops = OpRows()
        ops.busy(1 + 2 + 1)
        return ops.end()


@functools.lru_cache(maxsize=256)
def round_kernel(tiling: HeadTiling, variant: str, scale: float, active: int) -> RoundKernel:
    """The kernel ``variant`` (an attention variant, ``sf`` or ``sb``) over the first ``active`` tiles."""
    plan = _tile_plan(tiling.tile, tiling.t, tiling.dh, variant, scale, tiling.buffers)
    name = "softmax" if variant in ("sf", "sb") else "attention"
    program = kernel_program(name, tiling.config, T_START=0, **({} if name == "attention" else assembler_defines()))
    if program.data_end != plan.program.data_end:
        raise AssertionError("a kernel's data differs between a tile and the mesh")
    cfg = tiling.config
    params = {k: np.zeros((cfg.height, cfg.width), dtype=np.int64) for k in plan.params()}
    routes, rings = [], []
    origins = tiling.origins[:active]
    for x0, y0 in origins:
        for k, grid in plan.params().items():
            params[k][y0:y0 + grid.shape[0], x0:x0 + grid.shape[1]] = grid
        routes += _offset_routes(plan.routes(), x0, y0)
        for ring in (plan.rings() if name == "softmax" else []):
            members = tuple((x + x0, y + y0, ci, co) for x, y, ci, co in ring.members)
            rings.append(dataclasses.replace(ring, name=f"{ring.name} tile ({x0}, {y0})", members=members))
    return RoundKernel(plan, program, params, routes, rings, origins)


@functools.lru_cache(maxsize=256)
def round_cycles(tiling: HeadTiling, variant: str, scale: float, active: int) -> int:
    """Static cycles of :func:`round_kernel`'s run."""
    kernel = round_kernel(tiling, variant, scale, active)
    timing = softmax_timing if variant in ("sf", "sb") else attention_timing
    ops, starts, ends = mesh_ops(tiling.config, lambda x, y: kernel.pe_ops(timing, x, y))
    return int(replay(Network(tiling.config, kernel.routes), ops, starts, ends, {}, periods=False))


# Relayouts ---------------------------------------------------------------------------------------

def _gemm_words(tiling: HeadTiling, b, h, i, d, base: int) -> np.ndarray:
    """``(x, y, address)`` of the words ``[b, h, i, d]`` (broadcast index arrays) of a ``[B, heads, T, Dh]``
    value kept in the streamed GEMM's layout at ``base``: token ``b*T + i`` in its column's block,
    feature ``h*Dh + d`` on row ``feature mod H``, feature-major."""
    cfg = tiling.config
    n = tiling.sequences * tiling.t
    blocks = block_partition(n, min(cfg.width, n))
    starts = np.array([blk.start for blk in blocks])
    counts = np.array([len(blk) for blk in blocks])
    token = b * tiling.t + i
    column = np.searchsorted(starts, token, side="right") - 1
    feature = h * tiling.dh + d
    address = base + (feature // cfg.height) * counts[column] + token - starts[column]
    return np.stack(np.broadcast_arrays(column, feature % cfg.height, address), axis=-1).reshape(-1, 3)


def _region(tiling: HeadTiling) -> int:
    """Words of one ``[B, heads, T, Dh]`` value in the streamed GEMM's layout, per PE."""
    cfg = tiling.config
    n = tiling.sequences * tiling.t
    return math.ceil(tiling.heads * tiling.dh / cfg.height) * len(block_partition(n, min(cfg.width, n))[0])


def _instance_index(tiling: HeadTiling, round_: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    ids = np.array(tiling.rounds[round_])
    origins = np.array(tiling.origins[:len(ids)])
    return ids // tiling.heads, ids % tiling.heads, origins


@functools.lru_cache(maxsize=64)
def relayout_in(tiling: HeadTiling, round_: int, matrices: tuple[str, ...]) -> tuple[RelayoutPlan, np.ndarray]:
    """The relayout of ``matrices`` (of :data:`MATRICES`) of a round's instances from the streamed
    GEMM's layout (slot ``MATRICES.index(m)`` above the attention region) into the tiles' row
    buffers (``q``, ``dout``: every PE of a tile row holds its queries' rows) and key buffers
    (``k``, ``v``: every PE of a tile column its keys' rows). Returns the plan and each word's
    ``(matrix, b, h, token, d)``."""
    b, h, origins = _instance_index(tiling, round_)
    dh, region = tiling.dh, _region(tiling)
    src, dst, index = [], [], []
    for name in matrices:
        rows = name in ("q", "dout")
        blocks = tiling.query_blocks() if rows else tiling.key_blocks()
        buffer = tiling.address(_BUFFER_OF[name])
        for pos, blk in enumerate(blocks):
            if not len(blk):
                continue
            others = range(tiling.tile.width) if rows else range(tiling.tile.height)
            for other in others:
                tx, ty = (other, pos) if rows else (pos, other)
                # [instance, token, d]
                ii, tt, dd = np.meshgrid(np.arange(len(b)), np.arange(blk.start, blk.stop), np.arange(dh),
                                         indexing="ij")
                dst.append(np.stack([origins[ii, 0] + tx, origins[ii, 1] + ty,
                                     buffer + (tt - blk.start) * dh + dd], axis=-1).reshape(-1, 3))
                src.append(_gemm_words(tiling, b[ii], h[ii], tt, dd, tiling.top + MATRICES.index(name) * region))
                index.append(np.stack(np.broadcast_arrays(MATRICES.index(name), b[ii], h[ii], tt, dd),
                                      axis=-1).reshape(-1, 5))
    src, dst = np.concatenate(src), np.concatenate(dst)
    plan = plan_relayout(tiling.config, src, dst, tiling.top + len(MATRICES) * region, "attention relayout in")
    return plan, np.concatenate(index)


@functools.lru_cache(maxsize=64)
def relayout_out(tiling: HeadTiling, round_: int, variant: str) -> tuple[RelayoutPlan, np.ndarray]:
    """The relayout of a product's result (``values``, ``backward-dq``: ``T x Dh`` rows at each tile
    row's east PE; ``backward-dv``, ``backward-dk``: at each tile column's south PE) into the
    streamed GEMM's layout at the first slot above the attention region. Returns the plan and
    each word's ``(b, h, token, d)``."""
    b, h, origins = _instance_index(tiling, round_)
    dh, out = tiling.dh, tiling.address("OUT")
    rows = variant in ("values", "backward-dq")
    queries, keys = tiling.query_blocks(), tiling.key_blocks()
    last = (sum(1 for k in keys if len(k)) - 1) if rows else (sum(1 for q in queries if len(q)) - 1)
    src, dst, index = [], [], []
    for pos, blk in enumerate(queries if rows else keys):
        if not len(blk):
            continue
        tx, ty = (last, pos) if rows else (pos, last)
        ii, tt, dd = np.meshgrid(np.arange(len(b)), np.arange(blk.start, blk.stop), np.arange(dh), indexing="ij")
        src.append(np.stack([origins[ii, 0] + tx, origins[ii, 1] + ty, out + (tt - blk.start) * dh + dd],
                            axis=-1).reshape(-1, 3))
        dst.append(_gemm_words(tiling, b[ii], h[ii], tt, dd, tiling.top))
        index.append(np.stack(np.broadcast_arrays(b[ii], h[ii], tt, dd), axis=-1).reshape(-1, 4))
    src, dst = np.concatenate(src), np.concatenate(dst)
    plan = plan_relayout(tiling.config, src, dst, tiling.top + _region(tiling), "attention relayout out")
    return plan, np.concatenate(index)


@functools.lru_cache(maxsize=64)
def token_major(config: FabricConfig, tokens: int, features: int, src: int, dst: int) -> RelayoutPlan:
    """The token-major copy a linear layer's weight gradient reads of its input (the executable's ``act1tm``):
    within every PE, the ``features x tokens`` block the streamed GEMM keeps at ``src`` (feature-major: each
    of the PE's features, ``feature mod H`` its row, its column's tokens in order) copied to ``dst`` token
    after token (each token's features in order). No word leaves its PE: the relayout's local moves."""
    blocks = block_partition(tokens, min(config.width, tokens))
    src_words, dst_words = [], []
    for x, blk in enumerate(blocks):
        count = len(blk)
        for y in range(config.height):
            local = len(range(y, features, config.height))
            if not local or not count:
                continue
            f, t = np.meshgrid(np.arange(local), np.arange(count), indexing="ij")
            src_words.append(np.stack(np.broadcast_arrays(x, y, src + f * count + t), axis=-1).reshape(-1, 3))
            dst_words.append(np.stack(np.broadcast_arrays(x, y, dst + t * local + f), axis=-1).reshape(-1, 3))
    src_all, dst_all = np.concatenate(src_words), np.concatenate(dst_words)
    free = int(max(src_all[:, 2].max(), dst_all[:, 2].max())) + 1
    return plan_relayout(config, src_all, dst_all, free, "token-major copy")


def relayout_cycles(plan: RelayoutPlan) -> list[int]:
    """Static cycles of each stage of a relayout."""
    out = []
    for stage in plan.stages:
        routes, ops, starts, ends, inject = relayout_timing.timing_ops(stage)
        out.append(int(replay(Network(plan.config, routes), ops, starts, ends, inject, periods=False)))
    return out
