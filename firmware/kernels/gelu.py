"""``gelu``: GELU over a ``tokens x features`` block of activations spread over
the mesh, forward or backward, ``approximate='none'`` (erf) or ``'tanh'``
(``gelu.s``).

Layout (the streamed GEMM's, ``docs/transformer.md`` section 9): feature
``k`` lives on mesh row ``k mod H``; the ``N`` tokens are dealt over the
``W`` columns in contiguous blocks (:func:`~.common.block_partition`). PE
``(x, y)`` holds its features times its tokens, feature-major, and computes
them where they are: nothing crosses the fabric, so the run's cycles are the
busiest PE's instructions.

Order of the float operations: exactly :func:`wse.firmware.training.transformer.gelu`
and :func:`~wse.firmware.training.transformer.gelu_backward` (with the
transcendentals of :mod:`wse.firmware.training.transcendental`), which the
reference calls; ``docs/transformer.md`` section 3.3 writes it out.

Variants: ``none`` and ``tanh`` (forward: ``y`` from ``x``), ``backward-none``
and ``backward-tanh`` (``dx`` from ``x`` and ``dy``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig
from wse.firmware.deadlock import load_checked
from wse.firmware.image import Program
from wse.firmware.training import transcendental as tr
from wse.firmware.training.numerics import assembler_defines
from wse.firmware.training.transformer import GELU_CONSTANTS, gelu, gelu_backward

from .common import Kernel, block_partition, kernel_program, read_per_pe, write_params, write_per_pe

__all__ = ["Gelu", "TokenPlan", "plan_tokens", "gelu_defines", "VARIANTS", "BUFFERS"]

T_START = 0
#: ``p_variant`` of each variant.
VARIANTS = {"none": 0, "tanh": 1, "backward-none": 2, "backward-tanh": 3}
#: The buffers after ``p_heap``, ``p_n`` words each, in order (``gelu.s``).
BUFFERS = ("X", "DY", "A", "B", "C", "D", "E", "F", "G", "NB")


def gelu_defines() -> dict[str, int]:
    """The constants ``gelu.s`` names: exp and reciprocal (:func:`assembler_defines`),
    the erf and tanh polynomials and splits, the GELU constants."""
    defines = assembler_defines()
    defines.update({f"ERF_Q{k}": c for k, c in enumerate(tr.ERF_SMALL_COEFFS)})
    defines.update({f"ERF_R{k}": c for k, c in enumerate(tr.ERF_LARGE_COEFFS)})
    defines.update({f"TANH_P{k}": c for k, c in enumerate(tr.TANH_COEFFS)})
    defines.update({"ERF_SPLIT": tr.ERF_SPLIT, "TANH_SPLIT": tr.TANH_SPLIT})
    defines.update(GELU_CONSTANTS)
    return defines


@dataclasses.dataclass
class TokenPlan:
    """A ``tokens x features`` matrix over the mesh: feature ``k`` on row
    ``k mod H``, token blocks over the columns.

    Members
    -------
    config, tokens, features:
        The mesh and the matrix's shape ``[tokens, features]``.
    token_blocks:
        The tokens of each column, west to east.
    counts:
        ``[height, width]``: elements held by each PE.
    program, heap:
        The kernel's program and the first free word (its buffers start there).
    variant:
        The kernel's variant.
    """
    config: FabricConfig
    tokens: int
    features: int
    token_blocks: list[range]
    counts: np.ndarray
    program: Program
    heap: int
    variant: str

    def row_features(self, y: int) -> np.ndarray:
        """The features held by mesh row ``y``, in order."""
        return np.arange(y, self.features, self.config.height)

    def pe_words(self, matrix: np.ndarray) -> dict[tuple[int, int], np.ndarray]:
        """Each PE's elements of ``matrix [tokens, features]``, feature-major."""
        out = {}
        for y in range(self.config.height):
            feats = self.row_features(y)
            for x, block in enumerate(self.token_blocks):
                out[(x, y)] = np.ascontiguousarray(matrix[block.start:block.stop][:, feats].T).reshape(-1)
        return out

    def gather(self, words: dict[tuple[int, int], np.ndarray]) -> np.ndarray:
        """The matrix ``[tokens, features]`` from each PE's elements (the inverse of :meth:`pe_words`)."""
        out = np.zeros((self.tokens, self.features), dtype=np.uint32)
        for y in range(self.config.height):
            feats = self.row_features(y)
            for x, block in enumerate(self.token_blocks):
                out[block.start:block.stop, feats] = words[(x, y)].reshape(len(feats), len(block)).T
        return out

    def buffer(self, name: str) -> np.ndarray:
        """``[height, width]``: the address of buffer ``name`` in every PE."""
        return self.heap + BUFFERS.index(name) * self.counts


def plan_tokens(kernel: Kernel, config: FabricConfig, tokens: int, features: int, program: Program,
                buffers: int, variant: str) -> TokenPlan:
    """The :class:`TokenPlan` of a ``tokens x features`` matrix with ``buffers``
    words per element held; raises :class:`~wse.config.UsageError` when it does not fit."""
    blocks = block_partition(tokens, config.width)
    per_row = np.array([len(range(y, features, config.height)) for y in range(config.height)])
    counts = per_row[:, None] * np.array([len(b) for b in blocks])[None, :]
    heap = kernel.check_memory(f"{kernel.name} of {tokens} tokens x {features} features", config, program,
                               buffers * int(counts.max()))
    return TokenPlan(config, tokens, features, blocks, counts.astype(np.int64), program, heap, variant)


def _gelu64(x: np.ndarray, approximate: str, backward: bool) -> np.ndarray:
    """GELU or its derivative in float64 (the accuracy figure of the report)."""
    erf = np.frompyfunc(math.erf, 1, 1)
    if approximate == "none":
        cdf = 0.5 * (1.0 + erf(x / math.sqrt(2.0)).astype(np.float64))
        return cdf + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi) if backward else x * cdf
    c = math.sqrt(2.0 / math.pi)
    t = np.tanh(c * (x + 0.044715 * x ** 3))
    if not backward:
        return 0.5 * x * (1.0 + t)
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3 * 0.044715 * x * x)


class Gelu(Kernel):
    name = "gelu"
    summary = ("GELU of tokens x features (features on rows, tokens over columns), forward or backward, "
               "erf or tanh form, transcendentals from the PE's binary32 operations")
    defaults = {"rows": 16, "cols": 32, "variant": "none"}
    variants = tuple(VARIANTS)
    colors = 0
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']} tokens x {sizes['cols']} features, {sizes['variant']}"

    def plan(self, config: FabricConfig, sizes: dict) -> TokenPlan:
        program = kernel_program("gelu", config, T_START=T_START, **gelu_defines())
        return plan_tokens(self, config, sizes["rows"], sizes["cols"], program, len(BUFFERS), sizes["variant"])

    def inputs(self, plan: TokenPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (plan.tokens, plan.features)
        # scaled so that every branch of erf and tanh (and their clamps) is taken
        return {"x": (3.0 * rng.standard_normal(shape)).astype(np.float32),
                "dy": rng.standard_normal(shape, dtype=np.float32)}

    def reference(self, plan: TokenPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        x = fp.vftz(fp.as_bits(inputs["x"]))
        backward = plan.variant.startswith("backward")
        approximate = plan.variant.removeprefix("backward-")
        x64 = fp.as_float(x).astype(np.float64)
        exact = _gelu64(x64, approximate, backward)
        if backward:
            dy = fp.vftz(fp.as_bits(inputs["dy"]))
            return gelu_backward(dy, x, approximate), exact * fp.as_float(dy).astype(np.float64)
        return gelu(x, approximate), exact

    def execute(self, device, plan: TokenPlan, inputs) -> tuple[np.ndarray, int]:
        program = plan.program
        device.load(program)
        load_checked(device, plan.config, [], f"kernel {self.name}")
        write_params(device, program, {"p_n": plan.counts, "p_heap": np.full(plan.counts.shape, plan.heap),
                                       "p_variant": np.full(plan.counts.shape, VARIANTS[plan.variant])})
        write_per_pe(device, plan.buffer("X"), plan.pe_words(fp.as_bits(inputs["x"])))
        if plan.variant.startswith("backward"):
            write_per_pe(device, plan.buffer("DY"), plan.pe_words(fp.as_bits(inputs["dy"])))
        device.launch(T_START)
        cycles = device.run()
        return plan.gather(read_per_pe(device, plan.buffer("A"), plan.counts)), cycles
