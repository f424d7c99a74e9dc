"""``softmax``: the causal softmax of one attention head's scores over the mesh,
forward (``p`` from the scores) or backward (``ds`` from ``p`` and ``dp``)
(``softmax.s``).

Layout: the ``T`` queries are dealt over the mesh rows and the ``T`` keys over
the columns in contiguous blocks (:func:`~.common.block_partition`); PE
``(x, y)`` holds its queries times its keys, key-major. Query ``i`` sees keys
``j <= i``: the PEs touch only those, and every other probability is ``+0``.

Order of the float operations: exactly
:func:`wse.firmware.training.transformer.causal_softmax` and
:func:`~wse.firmware.training.transformer.causal_softmax_backward` (the
reference calls them). The row-wide max, sum ``Z`` and backward sum ``r`` are
folds in key order: they run along each mesh row as a chain, west to east,
each PE folding its keys into the running value, so the order is the one of
a single PE; the east PE computes the reciprocal of ``Z`` once per query and sends it
(or ``m``, or ``r``) back west along a second chain.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig, Port
from wse.firmware.deadlock import Ring, load_checked
from wse.firmware.image import Program
from wse.firmware.training.numerics import assembler_defines
from wse.firmware.training.transformer import causal_softmax, causal_softmax_backward

from .common import (Kernel, block_partition, chain_color_grids, chain_in_color, chain_out_color, chain_routes,
                     kernel_program, mesh_coordinates, read_per_pe, row_cells, write_params,
                     write_per_pe)

__all__ = ["Softmax", "SoftmaxPlan", "CHAIN_COLORS", "BACK_COLORS", "SCALE", "BLOCK_BUFFERS", "ROW_BUFFERS"]

T_START = 0
#: The chain east along each mesh row (two colors alternating by column parity).
CHAIN_COLORS = (0, 1)
#: The chain back west from the east PE (two colors alternating by position).
BACK_COLORS = (2, 3)
#: The scores' scale in the backward pass: ``1/sqrt(16)``, a 16-wide head.
SCALE = 0.25
#: Buffers of ``K * R`` words and of ``R`` words after ``p_heap`` (``softmax.s``).
BLOCK_BUFFERS = ("S", "DP", "E", "F", "OUT", "NB")
ROW_BUFFERS = ("M", "Z", "INV", "Q")


@dataclasses.dataclass
class SoftmaxPlan:
    """One head's ``T x T`` scores over the mesh.

    Members
    -------
    config, context, variant:
        The mesh, ``T`` and ``"forward"`` or ``"backward"``.
    query_blocks, key_blocks:
        The queries of each mesh row (north to south) and the keys of each
        column (west to east).
    program, heap:
        The kernel's program and the first free word (one for every PE, or a ``[height, width]`` grid).
    scale:
        The scores' scale the backward pass multiplies ``ds`` by (default :data:`SCALE`).
    """
    config: FabricConfig
    context: int
    variant: str
    query_blocks: list[range]
    key_blocks: list[range]
    program: Program
    heap: int
    scale: float = SCALE

    def grid(self, f) -> np.ndarray:
        """``[height, width]`` of ``f(query block, key block)``."""
        return np.array([[f(q, k) for k in self.key_blocks] for q in self.query_blocks], dtype=np.int64)

    @property
    def counts(self) -> np.ndarray:
        """Elements held by each PE."""
        return self.grid(lambda q, k: len(q) * len(k))

    def buffer(self, name: str) -> np.ndarray:
        """``[height, width]``: the address of a :data:`BLOCK_BUFFERS` buffer in every PE."""
        return self.heap + BLOCK_BUFFERS.index(name) * self.counts

    def pe_words(self, matrix: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Each PE's block of ``matrix [T, T]`` (query, key), key-major."""
        return {(x, y): np.ascontiguousarray(matrix[q.start:q.stop, k.start:k.stop].T).reshape(-1)
                for y, q in enumerate(self.query_blocks) for x, k in enumerate(self.key_blocks)}

    def gather(self, words: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        """``[T, T]`` from each PE's block (the inverse of :meth:`pe_words`)."""
        out = np.zeros((self.context, self.context), dtype=np.uint32)
        for y, q in enumerate(self.query_blocks):
            for x, k in enumerate(self.key_blocks):
                out[q.start:q.stop, k.start:k.stop] = words[(x, y)].reshape(len(k), len(q)).T
        return out

    def routes(self) -> list:
        """Per mesh row: the chain east and the chain back west from the east PE."""
        routes = []
        for y in range(self.config.height):
            cells = row_cells(y, self.config.width)
            routes += chain_routes(cells, Port.E, CHAIN_COLORS, from_edge=False, to_edge=False)
            routes += chain_routes(cells[::-1], Port.W, BACK_COLORS, from_edge=False, to_edge=False)
        return routes

    def rings(self) -> list[Ring]:
        """The two-PE cycles of the chain east and the chain back west, proved live
        by the rotation rule: for each pair of neighbours ``x, x+1`` of a row,
        ``x+1`` takes its whole row vector from ``x`` before it sends anything
        back (it folds and passes east first, or, in the east column, returns it)."""
        width, rings = self.config.width, []
        for y in range(self.config.height):
            for x in range(width - 1):
                back = width - 1 - x                     # positions along the chain back west
                members = ((x, y, chain_in_color(back, BACK_COLORS), chain_out_color(x, CHAIN_COLORS)),
                           (x + 1, y, chain_in_color(x + 1, CHAIN_COLORS), chain_out_color(back - 1, BACK_COLORS)))
                rings.append(Ring(f"softmax row {y} columns {x}, {x + 1}", members, receive_first=(False, True)))
        return rings

    def params(self) -> dict[str, np.ndarray]:
        """The parameter words of every PE."""
        column, _ = mesh_coordinates(self.config)
        c_in, c_out = chain_color_grids(column, CHAIN_COLORS)
        b_in, b_out = chain_color_grids(self.config.width - 1 - column, BACK_COLORS)
        shape = column.shape
        return {"p_r": self.grid(lambda q, k: len(q)), "p_k": self.grid(lambda q, k: len(k)),
                "p_q0": self.grid(lambda q, k: q.start), "p_k0": self.grid(lambda q, k: k.start),
                "p_heap": np.full(shape, self.heap), "p_variant": np.full(shape, int(self.variant == "backward")),
                "p_first": column == 0, "p_last": column == self.config.width - 1, "p_cin": c_in, "p_cout": c_out,
                "p_bin": b_in, "p_bout": b_out, "p_scale": np.full(shape, fp.f2b(self.scale))}


def _softmax64(scores: np.ndarray) -> np.ndarray:
    causal = np.tril(np.ones(scores.shape, dtype=bool))
    s = np.where(causal, scores, -np.inf)
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class Softmax(Kernel):
    name = "softmax"
    summary = ("causal softmax of one head's T x T scores (queries on rows, keys over columns), forward or "
               "backward; max and sums chained along the rows in key order")
    defaults = {"n": 32, "variant": "forward"}
    variants = ("forward", "backward")
    colors = 4
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"T={sizes['n']}, {sizes['variant']}"

    def plan(self, config: FabricConfig, sizes: dict) -> SoftmaxPlan:
        program = kernel_program("softmax", config, T_START=T_START, **assembler_defines())
        t = sizes["n"]
        queries, keys = block_partition(t, config.height), block_partition(t, config.width)
        r, k = len(queries[0]), len(keys[0])
        heap = self.check_memory(f"softmax of T={t}", config, program,
                                 len(BLOCK_BUFFERS) * r * k + len(ROW_BUFFERS) * r)
        return SoftmaxPlan(config, t, sizes["variant"], queries, keys, program, heap)

    def inputs(self, plan: SoftmaxPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        t = plan.context
        scores = (2.0 * rng.standard_normal((t, t))).astype(np.float32)
        inputs = {"scores": scores, "dp": rng.standard_normal((t, t), dtype=np.float32)}
        if plan.variant == "backward":
            inputs["p"] = fp.as_float(causal_softmax(fp.as_bits(scores)[None])[0]).copy()
        return inputs

    def reference(self, plan: SoftmaxPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        if plan.variant == "forward":
            bits = causal_softmax(fp.as_bits(inputs["scores"])[None])[0]
            return bits, _softmax64(inputs["scores"].astype(np.float64))
        p, dp = fp.as_bits(inputs["p"]), fp.as_bits(inputs["dp"])
        bits = causal_softmax_backward(p[None], dp[None], SCALE)[0]
        p64 = inputs["p"].astype(np.float64)
        dp64 = np.where(np.tril(np.ones(p.shape, dtype=bool)), inputs["dp"].astype(np.float64), 0.0)
        exact = p64 * (dp64 - (p64 * dp64).sum(axis=1, keepdims=True)) * SCALE
        return bits, exact

    def execute(self, device, plan: SoftmaxPlan, inputs) -> tuple[np.ndarray, int]:
        program = plan.program
        device.load(program)
        load_checked(device, plan.config, plan.routes(), f"kernel {self.name}", rings=plan.rings())
        write_params(device, program, plan.params())
        if plan.variant == "forward":
            write_per_pe(device, plan.buffer("S"), plan.pe_words(fp.as_bits(inputs["scores"])))
        else:
            write_per_pe(device, plan.buffer("S"), plan.pe_words(fp.as_bits(inputs["p"])))
            write_per_pe(device, plan.buffer("DP"), plan.pe_words(fp.as_bits(inputs["dp"])))
        device.launch(T_START)
        cycles = device.run()
        return plan.gather(read_per_pe(device, plan.buffer("OUT"), plan.counts)), cycles
