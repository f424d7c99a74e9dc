"""``attention``: the products of one causal attention head, activations times
activations on the wafer, forward and backward (``attention.s``).

Layout: the softmax kernel's (:class:`~.softmax.SoftmaxPlan`): the ``T``
queries dealt over the mesh rows and the ``T`` keys over the columns in
contiguous blocks; PE ``(x, y)`` holds its queries times its keys of a
``T x T`` matrix, key-major. So ``scores`` leaves ``s`` in the blocks the
softmax reads, and the softmax leaves ``p`` (or ``ds``) in the blocks
``values`` (``dq``, ``dv``, ``dk``) reads: strung into one step, ``s`` and
``p`` need not leave the PEs (the three are separate programs here; the
step's mapping is ``docs/transformer.md`` section 11).

What crosses the fabric: the ``T x Dh`` operands as rows. A mesh row's
queries' rows (``q`` or ``dout``) enter at its west edge and the router
multicasts them along the row; a column's keys' rows (``k`` or ``v``) enter
at its north edge and are multicast down the column. A sum over keys
(``o = p v``, ``dq = ds k``) is a chain east along each mesh row, one
query's row of ``Dh`` partial sums at a time; a sum over queries
(``dv = p^T dout``, ``dk = ds^T q``) a chain south down each column, one
key's row at a time. The chains are wavefronts (a PE folds row ``i`` while
the next folds row ``i - 1``); the last PE of a chain keeps the result.

Order of the float operations: exactly
:func:`wse.firmware.training.transformer.attention` and
:func:`~wse.firmware.training.transformer.attention_backward` (the
references call them): every element is ``+0`` followed by one
``add(acc, mul(a, b))`` per term in index order (one ``dot`` of length
``Dh`` for a score or ``dp``, one ``fmacs`` of ``Dh`` per term in a chain);
the chains carry the running sums from PE to PE, so a sum over a spread
index has the one-PE order. Masked terms are never computed: the scores
above the diagonal stay ``+0``, and the sums skip the ``+0`` probabilities,
which would add ``+-0`` to a sum that started at ``+0`` and so change no
bit (finite operands).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, Port
from wse.firmware.deadlock import load_checked
from wse.firmware.image import Program
from wse.firmware.training import transformer as tf

from .common import (Kernel, block_partition, chain_color_grids, chain_routes, column_cells, kernel_program,
                     mesh_coordinates, multicast_routes, read_per_pe, row_cells, write_params, write_per_pe)
from .softmax import SoftmaxPlan

__all__ = ["Attention", "AttentionPlan", "VARIANTS", "ROW_COLOR", "COL_COLOR", "CHAIN_COLORS", "BUFFERS"]

T_START = 0
#: The multicast of a mesh row's query rows (from the west edge) and of a column's key rows (from the north).
ROW_COLOR, COL_COLOR = 0, 1
#: The chain east (``values``, ``backward-dq``) or south (``backward-dv``, ``backward-dk``).
CHAIN_COLORS = (2, 3)
#: Buffers after the program's data: ``R x Dh``, ``K x Dh``, ``R x K`` and the result.
BUFFERS = ("ROW", "COL", "BLK", "OUT")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One product: ``mode`` 0 local (a ``T x T`` result), 1 a chain east, 2 a chain south;
    the inputs it takes as query rows (``row``), key rows (``col``) and a ``T x T`` block
    (``blk``); whether the sums are scaled."""
    mode: int
    row: str | None
    col: str | None
    blk: str | None
    scaled: bool = False


#: The products by variant name.
VARIANTS = {
    "scores": Variant(0, "q", "k", None, True),
    "values": Variant(1, None, "v", "p"),
    "backward-dp": Variant(0, "dout", "v", None),
    "backward-dv": Variant(2, "dout", None, "p"),
    "backward-dq": Variant(1, None, "k", "ds"),
    "backward-dk": Variant(2, "q", None, "ds"),
}


def _causal(t: int) -> np.ndarray:
    return np.tril(np.ones((t, t), dtype=bool))


@dataclasses.dataclass
class AttentionPlan:
    """One head's products over the mesh.

    Members
    -------
    config, context, width, variant:
        The mesh, ``T``, the head width ``Dh`` and the variant name.
    query_blocks, key_blocks:
        The queries of each mesh row and the keys of each column (the softmax's).
    program, heap:
        The kernel's program and the first free word.
    scale_value:
        The scores' scale (a model's own, such as ``1/sqrt(8)`` as it wrote it); ``None``: ``1/sqrt(Dh)``.
    resident:
        The row and key operands are already in ``ROW`` and ``COL`` (put there by a relayout,
        ``docs/transformer.md`` section 11): no edge streams, no multicasts.
    buffers:
        ``(name, address)`` pairs overriding :meth:`address` (the step's agreed addresses); an
        address is one for every PE, or a ``[height, width]`` grid of nested tuples.
    """
    config: FabricConfig
    context: int
    width: int
    variant: str
    query_blocks: list[range]
    key_blocks: list[range]
    program: Program
    heap: int
    scale_value: float | None = None
    resident: bool = False
    buffers: tuple[tuple[str, int], ...] = ()

    @property
    def spec(self) -> Variant:
        """The variant's :class:`Variant`."""
        return VARIANTS[self.variant]

    @property
    def scale(self) -> float:
        """The scores' scale: ``scale_value`` if given, else ``1/sqrt(Dh)``."""
        return 1.0 / math.sqrt(self.width) if self.scale_value is None else self.scale_value

    @property
    def rows_used(self) -> int:
        """Mesh rows that hold queries (the empty blocks come last)."""
        return sum(1 for q in self.query_blocks if len(q))

    @property
    def cols_used(self) -> int:
        """Mesh columns that hold keys."""
        return sum(1 for k in self.key_blocks if len(k))

    def sizes(self) -> tuple[np.ndarray, np.ndarray]:
        """``(R, K)``: ``[height, width]`` queries and keys held by every PE."""
        r = np.array([len(q) for q in self.query_blocks])[:, None]
        k = np.array([len(b) for b in self.key_blocks])[None, :]
        return np.broadcast_to(r, (len(r), k.shape[1])).copy(), np.broadcast_to(k, (len(r), k.shape[1])).copy()

    def address(self, name: str) -> int:
        """The address of a :data:`BUFFERS` buffer (the same in every PE)."""
        given = dict(self.buffers)
        if name in given and isinstance(given[name], int):
            return given[name]
        r0, k0, dh = len(self.query_blocks[0]), len(self.key_blocks[0]), self.width
        sizes = (r0 * dh, k0 * dh, r0 * k0, max(r0 * k0, r0 * dh, k0 * dh))
        return self.heap + sum(sizes[:BUFFERS.index(name)])

    def address_grid(self, name: str) -> np.ndarray:
        """``[height, width]``: the address of a :data:`BUFFERS` buffer in every PE."""
        given = dict(self.buffers).get(name)
        if given is not None and not isinstance(given, int):
            return np.array(given, dtype=np.int64)
        return np.full((self.config.height, self.config.width), self.address(name))

    def routes(self) -> list:
        """The multicasts of the operands' rows and the chain of the sums."""
        spec, routes = self.spec, []
        nq, nk = self.rows_used, self.cols_used
        for y in range(nq):
            cells = row_cells(y, self.config.width)[:nk]
            if spec.row and not self.resident:
                routes += multicast_routes(cells, Port.E, ROW_COLOR, from_edge=True)
            if spec.mode == 1:
                routes += chain_routes(cells, Port.E, CHAIN_COLORS, from_edge=False, to_edge=False)
        for x in range(nk):
            cells = column_cells(x, self.config.height)[:nq]
            if spec.col and not self.resident:
                routes += multicast_routes(cells, Port.S, COL_COLOR, from_edge=True)
            if spec.mode == 2:
                routes += chain_routes(cells, Port.S, CHAIN_COLORS, from_edge=False, to_edge=False)
        return routes

    def chain_position(self) -> tuple[np.ndarray, int]:
        """``[height, width]`` position of every PE along its chain, and the chain's length."""
        column, row = mesh_coordinates(self.config)
        return (column, self.cols_used) if self.spec.mode == 1 else (row, self.rows_used)

    def params(self) -> dict[str, np.ndarray]:
        """The parameter words of every PE."""
        spec = self.spec
        r, k = self.sizes()
        shape = r.shape
        q0 = np.broadcast_to(np.array([q.start for q in self.query_blocks])[:, None], shape)
        k0 = np.broadcast_to(np.array([b.start for b in self.key_blocks])[None, :], shape)
        position, length = self.chain_position()
        c_in, c_out = chain_color_grids(position, CHAIN_COLORS)

        def full(value) -> np.ndarray:
            return np.full(shape, int(value))

        params = {"p_r": r, "p_k": k, "p_q0": q0, "p_k0": k0, "p_dh": full(self.width), "p_mode": full(spec.mode),
                  "p_rowin": full(spec.row is not None and not self.resident),
                  "p_colin": full(spec.col is not None and not self.resident),
                  "p_rcolor": full(ROW_COLOR), "p_ccolor": full(COL_COLOR), "p_scaled": full(spec.scaled),
                  "p_scale": full(fp.f2b(self.scale)), "p_first": position == 0, "p_last": position == length - 1,
                  "p_cin": c_in, "p_cout": c_out}
        params.update({f"p_{name.lower()}": self.address_grid(name) for name in BUFFERS})
        return params

    def blocks(self) -> SoftmaxPlan:
        """The same blocks as a :class:`~.softmax.SoftmaxPlan`: the one code that places them."""
        return SoftmaxPlan(self.config, self.context, "forward", self.query_blocks, self.key_blocks,
                           self.program, self.heap)

    def block_words(self, matrix: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Each PE's block of ``matrix [T, T]`` (query, key), key-major (the softmax's layout)."""
        return self.blocks().pe_words(matrix)

    def gather_blocks(self, words: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        """``[T, T]`` from each PE's key-major block."""
        return self.blocks().gather(words)

    def read_result(self, device) -> np.ndarray:
        """The result from the PEs that hold it: ``[T, T]`` (mode 0) or ``[T, Dh]``."""
        mode, dh = self.spec.mode, self.width
        addr = np.full((self.config.height, self.config.width), self.address("OUT"))
        if mode == 0:
            r, k = self.sizes()
            return self.gather_blocks(read_per_pe(device, addr, r * k))
        out = np.zeros((self.context, dh), dtype=np.uint32)
        if mode == 1:
            x = self.cols_used - 1
            for y, q in enumerate(self.query_blocks[:self.rows_used]):
                out[q.start:q.stop] = device.memcpy_d2h(int(addr[y, x]), len(q) * dh, (x, y, 1, 1))[0, 0] \
                    .reshape(len(q), dh)
        else:
            y = self.rows_used - 1
            for x, k in enumerate(self.key_blocks[:self.cols_used]):
                out[k.start:k.stop] = device.memcpy_d2h(int(addr[y, x]), len(k) * dh, (x, y, 1, 1))[0, 0] \
                    .reshape(len(k), dh)
        return out

    def stream(self, device, rows: np.ndarray | None, cols: np.ndarray | None) -> None:
        """Queue the query rows at the west edge of each mesh row and the key rows
        at the north edge of each column (``uint32 [T, Dh]`` bits); nothing when resident."""
        if self.resident:
            return
        if rows is not None:
            for y, q in enumerate(self.query_blocks[:self.rows_used]):
                device.stream_in("W", y, ROW_COLOR, rows[q.start:q.stop].reshape(-1))
        if cols is not None:
            for x, k in enumerate(self.key_blocks[:self.cols_used]):
                device.stream_in("N", x, COL_COLOR, cols[k.start:k.stop].reshape(-1))


def attention_operands(q, k, v, dout, scale: float) -> dict[str, np.ndarray]:
    """Every operand of the products as bits (``[T, Dh]`` or ``[T, T]``): the
    inputs, and ``p``, ``dp``, ``ds`` by the reference operations."""
    q, k, v, dout = (tf.bits(a) for a in (q, k, v, dout))
    causal = _causal(q.shape[0])
    _, saved = tf.attention(q[None], k[None], v[None], scale)
    p = saved["p"][0]
    dp = np.where(causal, tf.outer_sum(dout.T, v.T), 0).astype(np.uint32)
    ds = tf.causal_softmax_backward(p[None], dp[None], scale)[0]
    return {"q": q, "k": k, "v": v, "dout": dout, "p": p, "dp": dp, "ds": ds}


def attention_products(variant: str, operands: dict[str, np.ndarray], scale: float) -> np.ndarray:
    """The reference bits of one variant's product, by
    :func:`~wse.firmware.training.transformer.attention` and
    :func:`~wse.firmware.training.transformer.attention_backward`
    (``scores``: the scaled ``q k^T`` where ``j <= i``, ``+0`` above the diagonal)."""
    o = operands
    q, k, v, dout = (o[name][None] for name in ("q", "k", "v", "dout"))
    if variant == "scores":
        s = fp.vmul(tf.outer_sum(o["q"].T, o["k"].T), tf.bits(np.float32(scale)))
        return np.where(_causal(len(s)), s, 0).astype(np.uint32)
    if variant == "backward-dp":
        return o["dp"]
    if variant == "values":
        return tf.attention(q, k, v, scale)[0][0]
    dq, dk, dv = tf.attention_backward(dout, q, k, v, {"p": o["p"][None]}, scale)
    return {"backward-dq": dq, "backward-dk": dk, "backward-dv": dv}[variant][0]


def _exact(variant: str, f: dict[str, np.ndarray], scale: float) -> np.ndarray:
    """The float64 product from the float32 operands."""
    causal = _causal(len(f["q"]))
    if variant == "scores":
        return np.where(causal, f["q"] @ f["k"].T * scale, 0.0)
    if variant == "backward-dp":
        return np.where(causal, f["dout"] @ f["v"].T, 0.0)
    if variant == "values":
        return f["p"] @ f["v"]
    if variant == "backward-dv":
        return f["p"].T @ f["dout"]
    if variant == "backward-dq":
        return f["ds"] @ f["k"]
    return f["ds"].T @ f["q"]


class Attention(Kernel):
    name = "attention"
    summary = ("one causal head's products in the softmax's layout (queries on rows, keys over columns): "
               "scores, p v and the backward's dp, dv, dq, dk; rows multicast, sums chained")
    defaults = {"n": 32, "cols": 16, "variant": "scores"}
    variants = tuple(VARIANTS)
    colors = 4
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"T={sizes['n']}, Dh={sizes['cols']}, {sizes['variant']}"

    def plan(self, config: FabricConfig, sizes: dict) -> AttentionPlan:
        program = kernel_program("attention", config, T_START=T_START)
        t, dh = sizes["n"], sizes["cols"]
        queries, keys = block_partition(t, config.height), block_partition(t, config.width)
        r, k = len(queries[0]), len(keys[0])
        words = r * dh + k * dh + r * k + max(r * k, r * dh, k * dh)
        heap = self.check_memory(f"attention of T={t}, Dh={dh}", config, program, words)
        return AttentionPlan(config, t, dh, sizes["variant"], queries, keys, program, heap)

    def inputs(self, plan: AttentionPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (plan.context, plan.width)
        raw = {name: rng.standard_normal(shape, dtype=np.float32) for name in ("q", "k", "v", "dout")}
        ops = attention_operands(raw["q"], raw["k"], raw["v"], raw["dout"], plan.scale)
        return {name: fp.as_float(bits).copy() for name, bits in ops.items()}

    def reference(self, plan: AttentionPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        operands = {name: fp.as_bits(value) for name, value in inputs.items()}
        bits = attention_products(plan.variant, operands, plan.scale)
        exact = _exact(plan.variant, {name: value.astype(np.float64) for name, value in inputs.items()}, plan.scale)
        return bits, exact

    def execute(self, device, plan: AttentionPlan, inputs) -> tuple[np.ndarray, int]:
        program, spec = plan.program, plan.spec
        device.load(program)
        load_checked(device, plan.config, plan.routes(), f"kernel {self.name}")
        write_params(device, program, plan.params())
        operand = {name: fp.as_bits(value) for name, value in inputs.items()}
        if spec.blk:
            address = np.full((plan.config.height, plan.config.width), plan.address("BLK"))
            write_per_pe(device, address, plan.block_words(operand[spec.blk]))
        plan.stream(device, operand.get(spec.row), operand.get(spec.col))
        device.launch(T_START)
        cycles = device.run()
        return plan.read_result(device), cycles
