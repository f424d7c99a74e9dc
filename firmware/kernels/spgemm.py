"""``spgemm`` and ``spmv``: Y = W X with W sparse, streamed from the host as
index/value pairs (``spgemm.s``); only non-zero weights leave the host.

Layout on a ``width x height`` mesh (the weight-streaming layout of
``docs/weight_streaming.md`` section 3, with the features dealt by load):

* **Tokens to columns**: the ``n`` tokens (columns of X) are dealt over the
  first ``min(width, n)`` mesh columns (:func:`~.common.block_partition`);
  column ``j`` holds ``T_j``. ``spmv`` is the one-token case.
* **Input features to rows, by load**: the features ``k`` are sorted by the
  non-zero count of ``W[:, k]`` (most first, ties by index) and dealt round
  robin by load, each to the mesh row with the fewest non-zeros so far
  among those with fewer than ``ceil(K/H)`` features (:func:`deal_features`). Row ``i``'s ``l``-th feature keeps its token block
  at ``x + l*S`` on every PE of the row (``S = T_0``, the largest block).
* **Outputs to rows**: ``y[o]`` ends on row ``o mod H`` at slot ``o div H``
  (address ``y + (o div H)*S``), spread as the inputs were.

The weight stream of row ``i`` (west edge, color 0, multicast east) visits
the outputs in the streamed GEMM's order (round ``r``, step ``p``: output
``o = r*H + (i - 1 - p) mod H``, ring position ``p``), and per output holds
the pairs ``(address of x[l], W[o, k])`` of the row's non-zeros, ``l``
ascending, then a carriage return (a control wavelet naming the ring
operation, ``spgemm.s``); one ``END`` closes it. Partial sums go round the
column as a ring: south on colors 1 and 2 (alternating by row), from the
last row back to row 0 on color 3.

Order of the float operations (what the reference computes), per output
``o``, column token ``t``, with ``s = (o mod H) + 1 mod H``::

    P_i = +0; P_i = add(P_i, mul(x[k, t], W[o, k]))  for the non-zeros of row i, l ascending
    y   = P_s;  y = add(y, P_q)  for q = s+1, s+2, ..., o mod H (mod H)

A row without a non-zero of ``o`` contributes ``P_i = +0``; no zero weight
is ever multiplied.

Cycles: :func:`~.spgemm_timing.timing_ops` mirrors ``spgemm.s`` for the static cycle model
(:mod:`.spgemm_timing`, replayed by :func:`wse.host.compiler.replay.replay`); the golden model's
count equals it (``tests/test_sparse_kernel.py``).
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, Port, UsageError
from wse.firmware.deadlock import Ring, load_checked
from wse.firmware.image import Program

from .common import Kernel, block_partition, kernel_program, multicast_routes, row_cells, write_params

__all__ = ["Spgemm", "Spmv", "SpgemmPlan", "sparse_mask", "deal_features", "row_imbalance", "plan_streams",
           "command_words", "step_counts", "ring_routes"]

W_COLOR = 0
RING_COLORS = (1, 2)
WRAP_COLOR = 3
T_START = 4
FIRST, MID, END = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD
LAST, ONLY = 0x80000000, 0xC0000000


def sparse_mask(rows: int, cols: int, sparsity: float, rng: np.random.Generator, kind: str = "random") -> np.ndarray:
    """A boolean ``[rows, cols]`` mask with ``round((1 - sparsity) * rows * cols)``
    true entries.

    ``kind="random"`` picks them uniformly. ``kind="power"`` gives the input
    features (columns) power-law loads: column ``k`` is weighted ``(k+1)^-1``
    (a Zipf law, shuffled over the columns), each column's count is its share
    of the total (at most ``rows``), and the rows within a column are uniform.
    """
    total = int(round((1.0 - sparsity) * rows * cols))
    if kind == "random":
        flat = np.zeros(rows * cols, dtype=bool)
        flat[rng.choice(rows * cols, size=total, replace=False)] = True
        return flat.reshape(rows, cols)
    if kind != "power":
        raise UsageError(f"mask kind must be random or power, not {kind!r}")
    weight = 1.0 / np.arange(1, cols + 1)
    weight = weight[rng.permutation(cols)]
    counts = np.minimum(np.floor(weight / weight.sum() * total).astype(np.int64), rows)
    for k in np.argsort(-weight, kind="stable"):        # hand out the rounding left-overs
        if counts.sum() >= total:
            break
        counts[k] = min(rows, counts[k] + total - counts.sum())
    mask = np.zeros((rows, cols), dtype=bool)
    for k in range(cols):
        mask[rng.choice(rows, size=int(counts[k]), replace=False), k] = True
    return mask


def deal_features(counts: np.ndarray, height: int) -> list[np.ndarray]:
    """The input features of each mesh row, dealt by load: sorted by
    ``counts`` (most first, ties by index), each goes to the row with the
    fewest non-zeros so far (ties: the lowest row) that has fewer than
    ``ceil(K / H)`` features (the room every PE keeps). With equal counts this is
    plain round robin; on skewed counts it is the longest-first greedy deal,
    whose most loaded row exceeds the mean by less than one feature's count.
    Each row's features are in the order dealt (its local indices)."""
    counts = np.asarray(counts, dtype=np.int64)
    room = -(-len(counts) // height)
    heap = [(0, i) for i in range(height)]
    rows: list[list[int]] = [[] for _ in range(height)]
    for k in np.argsort(-counts, kind="stable").tolist():
        load, i = heapq.heappop(heap)
        rows[i].append(k)
        if len(rows[i]) < room:
            heapq.heappush(heap, (load + int(counts[k]), i))
    return [np.array(r, dtype=np.int64) for r in rows]


def row_imbalance(counts: np.ndarray, height: int) -> dict:
    """Non-zeros per mesh row after :func:`deal_features`: the most loaded
    row's count over the mean (``max_over_mean``), and the same for a plain
    block deal of the features in index order (``block_max_over_mean``)."""
    counts = np.asarray(counts, dtype=np.int64)
    dealt = np.array([counts[f].sum() for f in deal_features(counts, height)])
    block = np.array([counts[b.start:b.stop].sum() for b in block_partition(len(counts), height)])
    mean = counts.sum() / height
    return {"max_over_mean": float(dealt.max() / mean) if mean else 1.0,
            "block_max_over_mean": float(block.max() / mean) if mean else 1.0}


@dataclasses.dataclass
class SpgemmPlan:
    """Where everything of one sparse GEMM lives.

    Members
    -------
    config, rows, cols, tokens, sparsity, mask_kind:
        The mesh, W's shape, the tokens, the fraction of zero weights and
        the mask's distribution.
    token_blocks:
        The tokens of each used mesh column (``min(width, tokens)`` columns).
    program:
        The assembled ``spgemm.s``.
    acc, zero, x, y:
        Addresses of the accumulator, the zero block, the feature blocks and
        the output slots (the same on every PE); ``stride`` is ``S``.
    """
    config: FabricConfig
    rows: int
    cols: int
    tokens: int
    sparsity: float
    mask_kind: str
    token_blocks: list[range]
    program: Program
    acc: int
    zero: int
    x: int
    y: int
    stride: int


def command_words(plan: SpgemmPlan, o: int, position: int) -> int:
    """The carriage return's data for ring position ``position`` of output ``o``."""
    height = plan.config.height
    slot = plan.y + (o // height) * plan.stride
    if height == 1:
        return ONLY | slot
    if position == height - 1:
        return LAST | slot
    return FIRST if position == 0 else MID


def step_counts(plan: SpgemmPlan, mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per mesh row, in stream order: the outputs, their ring positions and
    the row's non-zeros of each (what the row's stream and timing depend on)."""
    out = []
    for i, feats in enumerate(deal_features(mask.sum(axis=0), plan.config.height)):
        steps = np.array(list(_steps(plan, i)), dtype=np.int64).reshape(-1, 2)
        counts = mask[:, feats].sum(axis=1)[steps[:, 0]] if len(feats) else np.zeros(len(steps), dtype=np.int64)
        out.append((steps[:, 0], steps[:, 1], counts.astype(np.int64)))
    return out


def _steps(plan: SpgemmPlan, i: int):
    """``(o, position)`` of row ``i``'s outputs in stream order."""
    height = plan.config.height
    for r in range((plan.rows + height - 1) // height):
        for p in range(height):
            o = r * height + (i - 1 - p) % height
            if o < plan.rows:
                yield o, p


def plan_streams(plan: SpgemmPlan, w: np.ndarray, mask: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each mesh row's weight stream: ``(words, ctrl flags)``."""
    features = deal_features(mask.sum(axis=0), plan.config.height)
    wbits = fp.as_bits(w)
    streams = []
    for i, feats in enumerate(features):
        addr = (plan.x + np.arange(len(feats)) * plan.stride).astype(np.uint32)
        local_mask, local_w = mask[:, feats], wbits[:, feats]
        words, flags = [], []
        for o, p in _steps(plan, i):
            nz = np.flatnonzero(local_mask[o])
            pairs = np.empty(2 * len(nz), dtype=np.uint32)
            pairs[0::2], pairs[1::2] = addr[nz], local_w[o, nz]
            words += [pairs, np.array([command_words(plan, o, p)], dtype=np.uint32)]
            flags += [np.zeros(len(pairs), dtype=bool), np.ones(1, dtype=bool)]
        words.append(np.array([END], dtype=np.uint32))
        flags.append(np.ones(1, dtype=bool))
        streams.append((np.concatenate(words), np.concatenate(flags)))
    return streams


def _ring_colors(height: int) -> tuple[list[int], list[int]]:
    """Per mesh row: the ring color arriving and the one leaving."""
    c_out = [RING_COLORS[i % 2] for i in range(height - 1)] + [WRAP_COLOR]
    c_in = [c_out[(i - 1) % height] for i in range(height)]
    return c_in, c_out


def ring_routes(plan: SpgemmPlan):
    """Weight multicast per row; per used column, the partial-sum ring."""
    height, columns = plan.config.height, len(plan.token_blocks)
    routes = []
    for i in range(height):
        routes += multicast_routes(row_cells(i, columns), Port.E, W_COLOR, from_edge=True)
    rings = []
    if height > 1:
        c_in, c_out = _ring_colors(height)
        for j in range(columns):
            for i in range(height - 1):
                routes.append((j, i, c_out[i], Port.RAMP, (Port.S,)))
                routes.append((j, i + 1, c_out[i], Port.N, (Port.RAMP,)))
            routes.append((j, height - 1, WRAP_COLOR, Port.RAMP, (Port.N,)))
            routes += [(j, i, WRAP_COLOR, Port.S, (Port.N,)) for i in range(1, height - 1)]
            routes.append((j, 0, WRAP_COLOR, Port.S, (Port.RAMP,)))
            members = tuple((j, i, c_in[i], c_out[i]) for i in range(height))
            rings.append(Ring(f"column {j} partial sums", members, message=len(plan.token_blocks[j])))
    return routes, rings


class Spgemm(Kernel):
    name = "spgemm"
    summary = "Y = W X, W sparse: index/value pairs streamed, carriage returns, partial sums round a column ring"
    defaults = {"rows": 64, "cols": 64, "n": 16, "sparsity": 0.9, "variant": "random"}
    variants = ("random", "power")
    colors = 4
    tasks = 5

    def resolve(self, config: FabricConfig, sizes: dict) -> dict:
        """As :meth:`Kernel.resolve`, with ``sparsity`` a number in ``[0, 1)``."""
        sizes = dict(sizes)
        sparsity = sizes.pop("sparsity", None)
        resolved = super().resolve(config, {**sizes, "sparsity": 1})
        if sparsity is None:
            sparsity = self.defaults["sparsity"]
        if isinstance(sparsity, bool) or not isinstance(sparsity, (int, float, np.floating, np.integer)) \
                or not 0.0 <= float(sparsity) < 1.0:
            raise UsageError(f"{self.name} sparsity must be a number in [0, 1), not {sparsity!r}")
        resolved["sparsity"] = float(sparsity)
        return resolved

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']}x{sizes['cols']} matrix, {sizes['n']} tokens, sparsity {sizes['sparsity']:g}"

    def plan(self, config: FabricConfig, sizes: dict) -> SpgemmPlan:
        rows, cols, tokens = sizes["rows"], sizes["cols"], sizes["n"]
        program = kernel_program("spgemm", config, C_W=W_COLOR, T_START=T_START)
        blocks = block_partition(tokens, min(config.width, tokens))
        stride = len(blocks[0])
        height = config.height
        capacity = config.tx_depth + 2 * config.router_depth + config.rx_depth
        if height > 1 and stride > capacity - 1:
            raise UsageError(f"{self.name} with {tokens} tokens on a {config.mesh} mesh puts {stride} on a column, but "
                             f"the partial-sum ring carries at most {capacity - 1} (tx_depth + 2*router_depth + "
                             f"rx_depth - 1): use fewer tokens or a wider mesh")
        local_in, local_out = -(-cols // height), -(-rows // height)
        heap = self.check_memory(f"{self.name} {rows}x{cols} x {tokens} tokens", config, program,
                                 stride * (2 + local_in + local_out))
        x = heap + 2 * stride
        return SpgemmPlan(config, rows, cols, tokens, sizes["sparsity"], sizes["variant"], blocks, program,
                          heap, heap + stride, x, x + local_in * stride, stride)

    def inputs(self, plan: SpgemmPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        mask = sparse_mask(plan.rows, plan.cols, plan.sparsity, rng, plan.mask_kind)
        w = rng.standard_normal((plan.rows, plan.cols), dtype=np.float32) * mask
        return {"w": w.astype(np.float32), "mask": mask,
                "x": rng.standard_normal((plan.cols, plan.tokens), dtype=np.float32)}

    def reference(self, plan: SpgemmPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        height = plan.config.height
        mask, w, x = inputs["mask"], fp.as_bits(inputs["w"]), fp.as_bits(inputs["x"])
        partial = np.zeros((height, plan.rows, plan.tokens), dtype=np.uint32)
        for i, feats in enumerate(deal_features(mask.sum(axis=0), height)):
            for k in feats:
                nz = mask[:, k]
                partial[i, nz] = fp.vadd(partial[i, nz], fp.vmul(x[k][None, :], w[nz, k][:, None]))
        o = np.arange(plan.rows)
        y = partial[(o % height + 1) % height, o]
        for p in range(1, height):
            y = fp.vadd(y, partial[(o % height + 1 + p) % height, o])
        exact = inputs["w"].astype(np.float64) @ inputs["x"].astype(np.float64)
        return y, exact

    def execute(self, device, plan: SpgemmPlan, inputs) -> tuple[np.ndarray, int]:
        cfg, height, columns = plan.config, plan.config.height, len(plan.token_blocks)
        device.load(plan.program)
        routes, rings = ring_routes(plan)
        load_checked(device, cfg, routes, f"kernel {self.name}", rings=rings)
        c_in, c_out = _ring_colors(height)
        tokens = np.zeros((height, cfg.width), dtype=np.int64)
        tokens[:, :columns] = [len(b) for b in plan.token_blocks]
        write_params(device, plan.program, {
            "p_t": tokens, "p_acc": np.full_like(tokens, plan.acc), "p_zero": np.full_like(tokens, plan.zero),
            "p_cin": np.repeat(np.array(c_in)[:, None], cfg.width, axis=1),
            "p_cout": np.repeat(np.array(c_out)[:, None], cfg.width, axis=1)})
        mask, x = inputs["mask"], fp.as_bits(inputs["x"])
        features = deal_features(mask.sum(axis=0), height)
        for i, feats in enumerate(features):
            for j, block in enumerate(plan.token_blocks):
                data = np.zeros((len(feats), plan.stride), dtype=np.uint32)
                data[:, :len(block)] = x[feats][:, block.start:block.stop]
                if data.size:
                    device.memcpy_h2d(plan.x, data.reshape(1, 1, -1), (j, i, 1, 1))
        for i, (words, flags) in enumerate(plan_streams(plan, inputs["w"], mask)):
            device.stream_in("W", i, W_COLOR, words, ctrl=flags)
        device.launch(T_START, (0, 0, columns, height))
        cycles = device.run()
        y = np.zeros((plan.rows, plan.tokens), dtype=np.uint32)
        slots = -(-plan.rows // height)
        for i in range(height):
            outs = np.arange(i, plan.rows, height)
            for j, block in enumerate(plan.token_blocks):
                got = device.memcpy_d2h(plan.y, slots * plan.stride, (j, i, 1, 1))[0, 0].reshape(slots, plan.stride)
                y[outs, block.start:block.stop] = got[:len(outs), :len(block)]
        return y, cycles


class Spmv(Spgemm):
    name = "spmv"
    summary = "y = W x, W sparse: the one-token spgemm"
    defaults = {"rows": 64, "cols": 64, "sparsity": 0.9, "variant": "random"}

    def resolve(self, config: FabricConfig, sizes: dict) -> dict:
        """As :meth:`Spgemm.resolve`, for one token."""
        return {**super().resolve(config, sizes), "n": 1}

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']}x{sizes['cols']} matrix, sparsity {sizes['sparsity']:g}"

