"""``residual``: ``y = add(a, b)`` over a ``tokens x features`` block of
activations spread over the mesh (``residual.s``): a transformer's residual
additions, the token and position embeddings' sum, and the gradient sums of
a value read by several operations (``docs/transformer.md`` sections 3.5
and 11).

Layout: :class:`~.gelu.TokenPlan`'s, the streamed GEMM's (feature ``k`` on
mesh row ``k mod H``, token blocks over the columns). PE ``(x, y)`` holds
its features times its tokens of both operands and adds them where they
are: nothing crosses the fabric. Order of the float operations: one
``add(a, b)`` per element, :func:`wse.firmware.training.transformer.residual`.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.config import FabricConfig
from wse.firmware.deadlock import load_checked
from wse.firmware.training.transformer import residual

from .common import Kernel, kernel_program, read_per_pe, write_params, write_per_pe
from .gelu import TokenPlan, plan_tokens
from .gelu_timing import elementwise_ops

__all__ = ["Residual", "BUFFERS", "pe_cycles", "timing_ops", "buffer", "load", "add_words"]

T_START = 0
#: The buffers after ``p_heap``, ``p_n`` words each, in order (``residual.s``).
BUFFERS = ("A", "B", "Y")


def pe_cycles(n: int) -> int:
    """Cycles of one PE holding ``n`` elements, from the task's select cycle to its ``exit``
    (scalar instructions 1 cycle, ``ld``/``ldsd`` 2, a vector instruction ``n + 1``)."""
    if n == 0:
        return 1 + 2 + 1 + 1                             # select, ld, beq, exit
    return 1 + 2 + 1 + 2 + 3 * (2 + 2) + 2 * 1 + (n + 1) + 1


def timing_ops(plan: TokenPlan):
    """``(routes, ops, starts, ends, inject)`` for :func:`wse.host.compiler.replay.replay`:
    one ``BUSY`` row of :func:`pe_cycles` per PE (:func:`~.gelu_timing.elementwise_ops`)."""
    return elementwise_ops(plan.counts, pe_cycles)


def buffer(plan: TokenPlan, name: str) -> np.ndarray:
    """``[height, width]``: the address of buffer ``name`` (:data:`BUFFERS`) in every PE."""
    return plan.heap + BUFFERS.index(name) * plan.counts


def load(device, plan: TokenPlan) -> None:
    """Load the program and its parameters (no routes)."""
    device.load(plan.program)
    load_checked(device, plan.config, [], "kernel residual")
    write_params(device, plan.program, {"p_n": plan.counts, "p_heap": np.full(plan.counts.shape, plan.heap)})


def add_words(device, plan: TokenPlan, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, int]:
    """``add(a, b)`` of two ``uint32 [tokens, features]`` matrices on ``device``
    (loaded by :func:`load`): fill A and B, run, read Y; returns the bits and the cycles."""
    write_per_pe(device, buffer(plan, "A"), plan.pe_words(a))
    write_per_pe(device, buffer(plan, "B"), plan.pe_words(b))
    device.launch(T_START)
    cycles = device.run()
    return plan.gather(read_per_pe(device, buffer(plan, "Y"), plan.counts)), cycles


class Residual(Kernel):
    name = "residual"
    summary = ("y = add(a, b) of tokens x features (features on rows, tokens over columns): residual "
               "additions and gradient sums where the activations are")
    defaults = {"rows": 16, "cols": 32}
    colors = 0
    tasks = 1

    def describe(self, sizes: dict) -> str:
        return f"{sizes['rows']} tokens x {sizes['cols']} features"

    def plan(self, config: FabricConfig, sizes: dict) -> TokenPlan:
        program = kernel_program("residual", config, T_START=T_START)
        return plan_tokens(self, config, sizes["rows"], sizes["cols"], program, len(BUFFERS), "add")

    def inputs(self, plan: TokenPlan, rng: np.random.Generator) -> dict[str, np.ndarray]:
        shape = (plan.tokens, plan.features)
        return {"a": rng.standard_normal(shape, dtype=np.float32), "b": rng.standard_normal(shape, dtype=np.float32)}

    def reference(self, plan: TokenPlan, inputs) -> tuple[np.ndarray, np.ndarray]:
        a, b = fp.as_bits(inputs["a"]), fp.as_bits(inputs["b"])
        return residual(a, b), inputs["a"].astype(np.float64) + inputs["b"].astype(np.float64)

    def execute(self, device, plan: TokenPlan, inputs) -> tuple[np.ndarray, int]:
        load(device, plan)
        return add_words(device, plan, fp.as_bits(inputs["a"]), fp.as_bits(inputs["b"]))
