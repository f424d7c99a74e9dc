"""The GPT training step as fabric phases (``docs/transformer.md`` section 11).

:func:`compile_gpt` takes a captured :class:`~.transformer_ir.TransformerGraph`,
a mesh and a batch of sequences and returns a :class:`GptSchedule`: the ordered
phases of one training step, each with the static cycle model's count.

Every activation lives in the streamed GEMM's layout (feature ``k`` on mesh
row ``k mod H``, the batch's ``N = B*T`` tokens dealt over ``min(W, N)``
columns in contiguous blocks), the layout the GELU, LayerNorm and residual
kernels share. Phases by kind:

=============  ======================================================================
``gemm``       a linear layer's streamed GEMM: forward, input gradient, weight
               gradient (weights streamed from MemoryX per token pass; the MLP's
               phases of ``train.s``, run on a one-layer executable of its shape)
``attention``  the heads' products (``firmware/kernels/attention.s``): scores, ``p v``,
               ``dp``, ``dv``, ``dq``, ``dk``; every (sequence, head) instance on a tile of
               its own, as many at once as there are tiles (a round, :mod:`.gpt_tiles`)
``softmax``    the causal softmax forward and backward (``softmax.s``), per round of tiles
``relayout``   the heads' ``q``, ``k``, ``v``, ``dout`` from the GEMM layout into the
               tiles and the products' results back (``relayout.s``, a program with routes);
               each linear layer's input copied token-major within every PE for its weight
               gradient (``token-major``: the relayout's local moves)
``layernorm``  LayerNorm forward and backward (``layernorm.s``, ``layernorm_bwd.s``)
``gelu``       GELU forward and backward (``gelu.s``)
``residual``   ``add(a, b)`` (``residual.s``): residual additions, the embeddings' sum,
               the gradient sums of a value read by several operations
``rows``       MemoryX's embedding rows in and their gradients out: edge streams of a program
               (``firmware/kernels/embedding_rows.py``), each token's row into its PEs
``host``       the loss and its delta (host, float64 loss as for the MLP); MemoryX's gather of
               the rows a batch uses and its token-order sums of their gradients; views
=============  ======================================================================

The float order of every phase is the reference's
(:mod:`wse.firmware.training.transformer`) for ``rows = H`` and the token
blocks of the columns, so the functional model
``TransformerReference(graph, rows=H, blocks=schedule.blocks)`` gives the
fabric's bits.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from wse.config import FabricConfig, MemoryNeedError, UsageError
from wse.firmware.kernels import attention_timing, embedding_rows_timing, gelu_timing, layernorm_bwd_timing
from wse.firmware.kernels import layernorm_timing, softmax_timing
from wse.firmware.kernels import residual as residual_kernel
from wse.firmware.kernels.attention import Attention
from wse.firmware.kernels.common import block_partition
from wse.firmware.kernels.embedding_rows import plan_rows
from wse.firmware.kernels.gelu import Gelu
from wse.firmware.kernels.layernorm import LayerNorm as LayerNormKernel
from wse.firmware.kernels.layernorm_bwd import LayerNormBackward
from wse.firmware.kernels.softmax import Softmax as SoftmaxKernel
from wse.firmware.training import records as records_format

from . import codegen
from . import weight_streaming as ws
from .ir import Graph, Input, Linear, SoftmaxCrossEntropy
from .gpt_memory import MemoryPlan, check_step, gemm_footprint, least_memory, relayout_footprint, step_memory
from .gpt_moves import make_resident
from .gpt_tiles import (HeadTiling, head_tiling, relayout_cycles, relayout_in, relayout_out, round_cycles,
                        token_major)
from .replay import Network, replay
from .transformer_ir import (GELU, Add, CausalAttention, CausalMask, Embedding, LayerNorm, MatMul, Positions,
                             Rearrange, Scale, SequenceCrossEntropy, Softmax, TNode, TokenLinear, Tokens,
                             TransformerGraph)

__all__ = ["GptPhase", "GptSchedule", "AttentionGroup", "compile_gpt", "attention_groups", "linear_executable",
           "kernel_plan", "kernel_cycles", "rows_cycles", "kernel_footprint", "KINDS", "GEMM_GRAPH_WEIGHT",
           "GEMM_GRAPH_BIAS", "tokens_kernel_plan"]

#: The phase kinds, in the order reports list them.
KINDS = ("gemm", "attention", "softmax", "layernorm", "gelu", "residual", "relayout", "rows", "move", "host")
#: The parameter names of the one-layer executable a linear layer's phases run on.
GEMM_GRAPH_WEIGHT, GEMM_GRAPH_BIAS = "l2.weight", "l2.bias"


@dataclasses.dataclass(frozen=True)
class GptPhase:
    """One phase of the step.

    Members
    -------
    name:
        Unique, readable (``"fwd blocks.0.attn.q"``, ``"scores matmul_1"``).
    kind:
        One of :data:`KINDS`.
    op:
        What the driver runs (``linear``, ``linear-data``, ``linear-weight``,
        ``attention``, ``softmax``, ``layernorm``, ``layernorm-bwd``, ``gelu``,
        ``gelu-bwd``, ``residual``, ``embedding``, ``embedding-grad``, ``rows-in``, ``rows-out``,
        ``relayout-in``, ``relayout-out``, ``token-major``, ``view``, ``view-bwd``, ``loss``).
    node:
        The graph node it belongs to.
    inputs, outputs:
        Names of the values it reads and writes (a node's activation is its
        name; gradients, saved values and intermediates have prefixed names).
    args:
        The op's arguments (sizes, variant, scale, parameter names).
    runs:
        Device runs of the phase.
    cycles:
        Fabric cycles of one run by the static cycle model (a relayout: its stages' together;
        ``host``: 0).
    fmacs:
        Multiply-accumulate elements of one run (the GEMMs' and the attention
        products'; 0 for the others, which multiply and add but not as
        multiply-accumulates).
    footprint:
        The first data word above every buffer of the phase's program (its
        data, heap, regions, tables; ``host``: 0): the memory plan's store
        starts above the largest (:mod:`.gpt_memory`).
    """
    name: str
    kind: str
    op: str
    node: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    args: tuple[tuple[str, Any], ...] = ()
    runs: int = 1
    cycles: int = 0
    fmacs: int = 0
    footprint: int = 0

    def arg(self, key: str, default=None):
        """The argument ``key``."""
        return dict(self.args).get(key, default)


@dataclasses.dataclass(frozen=True)
class AttentionGroup:
    """A causal attention: its q, k, v inputs (``k_transposed``: the graph reads ``k^T``), scale,
    and the nodes it covers."""
    node: str
    q: str
    k: str
    v: str
    scale: float
    k_transposed: bool
    covered: tuple[str, ...]


@dataclasses.dataclass
class GptSchedule:
    """The compiled training step of a GPT on a mesh.

    Members
    -------
    graph, config:
        What was compiled.
    sequences, context:
        ``B`` sequences of ``T`` tokens per step.
    blocks:
        Tokens of each column holding tokens (the weight gradients' and LayerNorm's token blocks).
    phases:
        In execution order.
    groups:
        The attention groups by node name.
    memory:
        The memory plan: every value kept between phases at a fixed address above the phases'
        own buffers (:class:`~.gpt_memory.MemoryPlan`).
    moves:
        The ``move`` phases' programs by phase name (:class:`~.gpt_moves.Move`; none when not resident).
    ranges:
        Per device phase of a resident step, the ``(keep, resident)`` word ranges of its load
        (:func:`~.gpt_moves.with_moves`, by :func:`~.gpt_moves.make_resident`).
    """
    graph: TransformerGraph
    config: FabricConfig
    sequences: int
    context: int
    blocks: list[int]
    phases: list[GptPhase]
    groups: dict[str, AttentionGroup]
    memory: MemoryPlan | None = None
    moves: dict = dataclasses.field(default_factory=dict)
    ranges: dict = dataclasses.field(default_factory=dict)

    @property
    def tokens(self) -> int:
        """``N = B*T``."""
        return self.sequences * self.context

    def cycles(self) -> int:
        """Fabric cycles of the whole step (every run of every phase)."""
        return sum(p.cycles * p.runs for p in self.phases)

    def by_kind(self) -> dict[str, dict[str, float]]:
        """Per kind: ``cycles``, ``runs``, ``fmacs`` and ``fmac_utilization``
        (multiply-accumulate elements per PE and cycle)."""
        pes = self.config.num_pes
        out = {}
        for kind in KINDS:
            phases = [p for p in self.phases if p.kind == kind]
            cycles = sum(p.cycles * p.runs for p in phases)
            fmacs = sum(p.fmacs * p.runs for p in phases)
            out[kind] = {"cycles": cycles, "runs": sum(p.runs for p in phases if p.cycles), "fmacs": fmacs,
                         "fmac_utilization": fmacs / (pes * cycles) if cycles else 0.0}
        return out


# Attention groups --------------------------------------------------------------------------------

def attention_groups(graph: TransformerGraph) -> dict[str, AttentionGroup]:
    """Every causal attention of ``graph`` by the node that ends it (the values ``MatMul`` of the
    written-out form, or ``CausalAttention``). Raises :class:`UsageError` for any other shape."""
    groups = {}
    for node in graph.of_kind(CausalAttention):
        q, k, v = node.inputs
        groups[node.name] = AttentionGroup(node.name, q, k, v, node.scale, False, ())
    readers: dict[str, list[str]] = {n.name: [] for n in graph.nodes}
    for n in graph.nodes:
        for source in n.inputs:
            readers[source].append(n.name)
    for softmax in graph.of_kind(Softmax):
        node, scale, covered = graph.node(softmax.inputs[0]), 1.0, [softmax.name]
        if not isinstance(node, CausalMask):
            raise UsageError(f"softmax {softmax.name!r} does not follow a causal mask")
        covered.append(node.name)
        node = graph.node(node.inputs[0])
        while isinstance(node, Scale):
            scale = scale / node.factor if node.divide else scale * node.factor
            covered.append(node.name)
            node = graph.node(node.inputs[0])
        values = [graph.node(r) for r in readers[softmax.name]]
        if not isinstance(node, MatMul) or node.role != "scores" or len(values) != 1 \
                or not isinstance(values[0], MatMul) or values[0].inputs[0] != softmax.name:
            raise UsageError(f"softmax {softmax.name!r} must read q @ k^T scaled and causally masked, and be "
                             f"multiplied by v")
        covered.append(node.name)
        q, k_t = node.inputs
        groups[values[0].name] = AttentionGroup(values[0].name, q, k_t, values[0].inputs[1], scale, True,
                                                tuple(covered))
    return groups


# Static cycles -----------------------------------------------------------------------------------

_KERNELS = {"attention": Attention(), "softmax": SoftmaxKernel(), "layernorm": LayerNormKernel(),
            "layernorm-bwd": LayerNormBackward(), "gelu": Gelu(), "gelu-bwd": Gelu(),
            "residual": residual_kernel.Residual()}
_TIMING = {"attention": attention_timing, "softmax": softmax_timing, "layernorm": layernorm_timing,
           "layernorm-bwd": layernorm_bwd_timing, "gelu": gelu_timing, "gelu-bwd": gelu_timing,
           "residual": residual_kernel}


def kernel_plan(config: FabricConfig, op: str, sizes: dict, eps: float | None = None):
    """The library kernel's plan for a phase's ``op`` and ``sizes`` (LayerNorm with its ``eps``)."""
    kernel = _KERNELS[op]
    resolved = kernel.resolve(config, sizes)
    return kernel.plan(config, resolved, eps) if op == "layernorm" else kernel.plan(config, resolved)


def tokens_kernel_plan(config: FabricConfig, tokens: int, op: str, features: int, variant=None, eps=None):
    """:func:`kernel_plan` of a kernel over ``tokens`` x ``features`` (GELU's ``variant``, LayerNorm's ``eps``)."""
    sizes = {"rows": tokens, "cols": features}
    return kernel_plan(config, op, sizes if variant is None else {**sizes, "variant": variant}, eps)


@functools.lru_cache(maxsize=256)
def _kernel_cycles(config: FabricConfig, op: str, sizes: tuple, eps: float | None) -> int:
    plan = kernel_plan(config, op, dict(sizes), eps)
    routes, ops, starts, ends, inject = _TIMING[op].timing_ops(plan)
    return int(replay(Network(config, routes), ops, starts, ends, inject, periods=False))


def kernel_cycles(config: FabricConfig, op: str, sizes: dict, eps: float | None = None) -> int:
    """Cycles of one run of a kernel phase by its static cycle mirror (cached)."""
    return _kernel_cycles(config, op, tuple(sorted(sizes.items())), eps)


@functools.lru_cache(maxsize=64)
def rows_cycles(config: FabricConfig, features: int, tokens: int, direction: str) -> int:
    """Cycles of one stream of a ``tokens x features`` block of embedding rows between MemoryX and
    the PEs (``direction``: ``"in"`` or ``"out"``) by its static cycle mirror (cached)."""
    plan = plan_rows(config, tokens, features, direction)
    routes, ops, starts, ends, inject = embedding_rows_timing.timing_ops(plan)
    return int(replay(Network(config, routes), ops, starts, ends, inject, periods=False))


# Footprints: the first word above every buffer of a phase's program -----------------------------

@functools.lru_cache(maxsize=256)
def _kernel_footprint(config: FabricConfig, op: str, sizes: tuple, eps: float | None) -> int:
    return least_memory(config, lambda cfg: kernel_plan(cfg, op, dict(sizes), eps))


def kernel_footprint(config: FabricConfig, op: str, sizes: dict, eps: float | None = None) -> int:
    """The footprint of a kernel phase: the least ``sram_words`` its plan accepts (its data and heap buffers)."""
    return _kernel_footprint(config, op, tuple(sorted(sizes.items())), eps)


# Streamed GEMM executables -----------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def linear_executable(config: FabricConfig, tokens: int, k: int, o: int, bias: bool, cycles: bool = True):
    """The weight-streaming executable whose middle layer ``l2`` is a ``k -> o`` linear layer of
    ``tokens`` tokens: phases ``fwd l2`` (the streamed GEMM), ``bwd-data l2`` and ``bwd-weight l2``
    (which reads the input's token-major copy ``act1tm``, made by a ``token-major`` phase,
    :func:`~.gpt_tiles.token_major`), with the static cycle model's counts. The one-feature
    layers around it (``l1``: ``1 -> k``, ``l3``: ``o -> 1``, a one-class loss) only make ``l2`` a
    middle layer, so that its input gradient is computed and no loss buffers over ``o`` classes
    take its memory. Its features stay cyclic (``spread=False``), as the GPT's other kernels hold
    them. As a middle layer of an MLP, ``fwd l2`` would end with its output's
    token-major copy (the next layer's weight gradient reads it); no phase of a GPT reads that
    copy, so its records are left out of ``fwd l2``."""
    graph = Graph([Input((1,)), Linear(1, k, True, "l1.weight", "l1.bias"),
                   Linear(k, o, bias, GEMM_GRAPH_WEIGHT, GEMM_GRAPH_BIAS if bias else None),
                   Linear(o, 1, False, "l3.weight"), SoftmaxCrossEntropy(1)], name=f"linear{k}x{o}")
    planned = ws.plan(graph, config, tokens, spread=False)      # the GPT's kernels: feature k on row k mod H
    _drop_output_copy(planned)
    return codegen.generate(planned, cycles=cycles, progress=False)


def _drop_output_copy(planned) -> None:
    """Leave the output's token-major copy (the last record of every PE: a ``transpose`` into ``act2tm``)
    out of ``planned``'s ``fwd l2``."""
    phase = planned.phases["fwd l2"]
    target = planned.regions["act2tm"][0]
    records = []
    for row in phase.records:
        out_row = []
        for ops in row:
            kind, fields, _ = records_format.decode(ops[-1]) if ops else ("end", {}, [])
            if kind != "transpose" or fields["dst"][1] != target:
                raise AssertionError("fwd l2 of a linear executable does not end with its output's token-major copy")
            out_row.append(list(ops[:-1]))
        records.append(out_row)
    planned.phases["fwd l2"] = dataclasses.replace(phase, records=records)


# The compiler pass -------------------------------------------------------------------------------

class _Builder:
    """Walks the graph forward and backward, emitting phases."""

    def __init__(self, graph: TransformerGraph, config: FabricConfig, sequences: int, cycles: bool):
        self.graph, self.config, self.B, self.with_cycles = graph, config, sequences, cycles
        self.T = next(n for n in graph.nodes if isinstance(n, Tokens)).shape[0]
        self.N = self.B * self.T
        self.groups = attention_groups(graph)
        self.covered = {name for g in self.groups.values() for name in g.covered}
        self.phases: list[GptPhase] = []
        self.count = 0

    def emit(self, name, kind, op, node, inputs, outputs, args=None, runs=1, cycles=0, fmacs=0, footprint=0) -> None:
        self.phases.append(GptPhase(name, kind, op, node, tuple(inputs), tuple(outputs),
                                    tuple(sorted((args or {}).items())), runs, int(cycles), int(fmacs),
                                    int(footprint)))

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}#{self.count}"

    def kernel_sized(self, op: str, sizes: dict, eps: float | None = None) -> tuple[int, int, int]:
        """``(cycles, fmacs, footprint)`` of a kernel phase (cycles 0 without the cycle model; no
        multiply-accumulates)."""
        footprint = self.fits(f"{op} of {sizes['cols']} features",
                              lambda: kernel_footprint(self.config, op, sizes, eps))
        cycles = kernel_cycles(self.config, op, sizes, eps) if self.with_cycles else 0
        return cycles, 0, footprint

    def gemm(self, node: TokenLinear, phase: str) -> tuple[int, int, int]:
        try:
            exe = linear_executable(self.config, self.N, node.in_features, node.out_features, node.bias,
                                    self.with_cycles)
        except ws.FitError as error:       # name the GPT's layer, not the helper executable
            need = error.need if isinstance(error, MemoryNeedError) else None
            detail = (f"its streamed GEMM needs {need} words per PE, sram_words is "
                      f"{self.config.sram_words}" if need is not None else str(error))
            raise ws.FitError(f"the GPT's linear layer {node.name} ({node.in_features} -> {node.out_features}) "
                              f"over {self.N} tokens ({self.B} sequences of {self.T}) does not fit a "
                              f"{self.config.mesh} mesh: {detail}; use a smaller batch or a wider mesh") from None
        p = exe.phases[phase]
        return p.cycles, p.fmacs, gemm_footprint(exe)

    def fits(self, what: str, build):
        """``build()``; a memory refusal of it (a kernel's :class:`~wse.config.MemoryNeedError`) names the
        GPT's ``what``, the batch and the mesh, as :meth:`gemm` does."""
        try:
            return build()
        except MemoryNeedError as error:
            if error.need is None:
                raise
            raise ws.MemoryFitError(f"the GPT's {what} over {self.N} tokens ({self.B} sequences of {self.T}) does "
                                    f"not fit a {self.config.mesh} mesh: it needs {error.need} words per PE, "
                                    f"sram_words is {self.config.sram_words}; use a smaller batch or a wider mesh",
                                    error.need) from None

    def rows(self, name: str, node: str, features: int, direction: str, inputs, outputs) -> None:
        """MemoryX's rows into the tokens' PEs, or the tokens' row gradients out (a program)."""
        what = f"embedding {node} ({features} features, rows {'in' if direction == 'in' else 'gradients out'})"
        plan = self.fits(what, lambda: plan_rows(self.config, self.N, features, direction))
        cycles = rows_cycles(self.config, features, self.N, direction) if self.with_cycles else 0
        self.emit(name, "rows", f"rows-{direction}", node, inputs, outputs,
                  {"words": self.N * features, "features": features}, 1, cycles, 0, plan.words_needed)

    # -- forward --
    def forward(self, node: TNode) -> None:
        n = node.name
        if isinstance(node, (Tokens, Positions, SequenceCrossEntropy)) or n in self.covered:
            return
        if isinstance(node, Embedding):
            self.emit(f"gather {n}", "host", "embedding", n, node.inputs, (f"rows:{n}",),
                      {"weight": node.weight_name})
            self.rows(f"rows {n}", n, node.dim, "in", (f"rows:{n}",), (n,))
        elif isinstance(node, Add):
            self.emit(f"add {n}", "residual", "residual", n, node.inputs, (n,), {},
                      1, *self.kernel_sized("residual", {"rows": self.N, "cols": node.shape[-1]}))
        elif isinstance(node, LayerNorm):
            sizes = {"rows": self.N, "cols": node.features}
            self.emit(f"layernorm {n}", "layernorm", "layernorm", n, node.inputs, (n, f"xhat:{n}", f"r:{n}"),
                      {"eps": node.eps, "weight": node.weight_name, "bias": node.bias_name}, 1,
                      *self.kernel_sized("layernorm", sizes, node.eps))
        elif isinstance(node, TokenLinear):
            self.emit(f"fwd {n}", "gemm", "linear", n, node.inputs, (n,), self.linear_args(node), 1,
                      *self.gemm(node, "fwd l2"))
        elif isinstance(node, GELU):
            self.emit(f"gelu {n}", "gelu", "gelu", n, node.inputs, (n,), {"variant": node.approximate}, 1,
                      *self.kernel_sized("gelu", {"rows": self.N, "cols": node.shape[-1],
                                                  "variant": node.approximate}))
        elif isinstance(node, Rearrange):
            self.emit(f"view {n}", "host", "view", n, node.inputs, (n,), {"op": node.op, "dims": node.dims,
                                                                         "shape": node.shape})
        elif n in self.groups:
            self.attention_forward(self.groups[n])
        else:
            raise UsageError(f"the fabric step cannot run {node.kind} node {n!r}")

    def token_major(self, node: TokenLinear, copy: str) -> None:
        """The ``token-major`` phase: the layer's input copied token-major (``act1tm``) within every PE, a
        relayout of local moves from the executable's ``act1`` to its ``act1tm``."""
        exe = linear_executable(self.config, self.N, node.in_features, node.out_features, node.bias,
                                self.with_cycles)
        src, dst = exe.regions["act1"][0], exe.regions["act1tm"][0]
        plan = self.fits(f"token-major copy of {node.name}'s input ({node.in_features} features)",
                         lambda: token_major(self.config, self.N, node.in_features, src, dst))
        cycles = sum(relayout_cycles(plan)) if self.with_cycles else 0
        self.emit(f"token-major {node.name}", "relayout", "token-major", node.name, (node.inputs[0],), (copy,),
                  {"k": node.in_features, "o": node.out_features, "bias": node.bias_name}, 1, cycles, 0,
                  relayout_footprint(plan))

    def linear_args(self, node: TokenLinear) -> dict:
        return {"weight": node.weight_name, "bias": node.bias_name, "k": node.in_features,
                "o": node.out_features}

    def head_sizes(self, group: AttentionGroup) -> tuple[int, int]:
        node = self.graph.node(group.q)
        return node.shape[-2], node.shape[-1]          # T, Dh

    def tiling(self, group: AttentionGroup) -> HeadTiling:
        t, dh = self.head_sizes(group)
        return head_tiling(self.config, self.B, self.heads(group), t, dh, group.scale)

    def attention_phase(self, group: AttentionGroup, variant: str, round_: int, inputs, outputs,
                        kind="attention") -> None:
        """One kernel over a round's tiles (``sf``/``sb``: the softmax forward/backward)."""
        tiling = self.tiling(group)
        active = len(tiling.rounds[round_])
        args = {"variant": variant, "scale": group.scale, "t": tiling.t, "dh": tiling.dh, "round": round_,
                "heads": tiling.heads}
        cycles = round_cycles(tiling, variant, group.scale, active) if self.with_cycles else 0
        fmacs = 0 if kind == "softmax" else active * tiling.t * (tiling.t + 1) // 2 * tiling.dh
        label = {"sf": "softmax-forward", "sb": "softmax-backward"}.get(variant, variant)
        self.emit(f"{label} {group.node} r{round_}", kind, kind, group.node, inputs, outputs, args, 1, cycles, fmacs,
                  tiling.top)

    def relayout(self, group: AttentionGroup, round_: int, op: str, what, inputs, outputs) -> None:
        """A relayout phase: ``what`` is the matrices in (``relayout-in``) or the product out."""
        tiling = self.tiling(group)
        label = f"{op} {group.node} r{round_}" + (f" {'+'.join(what)}" if op == "relayout-in" else f" {what}")
        build = relayout_in if op == "relayout-in" else relayout_out
        plan = self.fits(f"attention {label} ({tiling.heads} heads of {tiling.t} x {tiling.dh})",
                         lambda: build(tiling, round_, what))[0]
        cycles = sum(relayout_cycles(plan)) if self.with_cycles else 0
        self.emit(label, "relayout", op, group.node, inputs, outputs,
                  {"what": what, "round": round_, "scale": group.scale, "t": tiling.t, "dh": tiling.dh,
                   "heads": tiling.heads}, 1, cycles, 0, relayout_footprint(plan))

    def attention_forward(self, g: AttentionGroup) -> None:
        n = g.node
        for r in range(len(self.tiling(g).rounds)):
            self.relayout(g, r, "relayout-in", ("q", "k", "v"), (g.q, g.k, g.v), ())
            self.attention_phase(g, "scores", r, (g.q, g.k), (f"s:{n}",))
            self.attention_phase(g, "sf", r, (f"s:{n}",), (f"p:{n}",), "softmax")
            self.attention_phase(g, "values", r, (f"p:{n}", g.v), (f"o:{n}",))
            self.relayout(g, r, "relayout-out", "values", (f"o:{n}",), (n,))

    def heads(self, g: AttentionGroup) -> int:
        return int(np.prod(self.graph.node(g.q).shape[:-2]))

    # -- backward --
    def backward(self) -> None:
        output = self.graph.output
        vocab = self.graph.node(output).shape[-1]
        self.emit("loss", "host", "loss", "loss", (output,), (f"d:{output}",), {"vocab": vocab})
        pending = {output: f"d:{output}"}
        for node in reversed(self.graph.nodes):
            g = pending.pop(node.name, None)
            if g is None:
                continue
            for name, contribution in self.backward_node(node, g):
                if name not in pending:
                    pending[name] = contribution
                    continue
                total = self.fresh(f"d:{name}")
                self.emit(f"sum {total}", "residual", "residual", name, (pending[name], contribution), (total,), {},
                          1, *self.kernel_sized("residual", {"rows": self.N, "cols": self.graph.node(name).shape[-1]}))
                pending[name] = total

    def backward_node(self, node: TNode, g: str) -> list[tuple[str, str]]:
        n = node.name
        if isinstance(node, Add):
            return [(node.inputs[0], g), (node.inputs[1], g)]
        if isinstance(node, Embedding):
            self.rows(f"rows-grad {n}", n, node.dim, "out", (g,), (f"dx:{n}",))
            self.emit(f"scatter {n}", "host", "embedding-grad", n, (f"dx:{n}", node.inputs[0]), (),
                      {"weight": node.weight_name, "rows": node.num_embeddings})
            return []
        if isinstance(node, LayerNorm):
            dx = self.fresh(f"d:{node.inputs[0]}")
            self.emit(f"layernorm-bwd {n}", "layernorm", "layernorm-bwd", n, (g, f"xhat:{n}", f"r:{n}"), (dx,),
                      {"weight": node.weight_name, "bias": node.bias_name}, 1,
                      *self.kernel_sized("layernorm-bwd", {"rows": self.N, "cols": node.features}))
            return [(node.inputs[0], dx)]
        if isinstance(node, TokenLinear):
            dx = self.fresh(f"d:{node.inputs[0]}")
            args = self.linear_args(node)
            self.emit(f"bwd-data {n}", "gemm", "linear-data", n, (g,), (dx,), args, 1, *self.gemm(node, "bwd-data l2"))
            copy = f"tm:{node.inputs[0]}#{n}"
            self.token_major(node, copy)
            self.emit(f"bwd-weight {n}", "gemm", "linear-weight", n, (copy, g), (), args, 1,
                      *self.gemm(node, "bwd-weight l2"))
            return [(node.inputs[0], dx)]
        if isinstance(node, GELU):
            dx = self.fresh(f"d:{node.inputs[0]}")
            variant = f"backward-{node.approximate}"
            self.emit(f"gelu-bwd {n}", "gelu", "gelu-bwd", n, (node.inputs[0], g), (dx,), {"variant": variant}, 1,
                      *self.kernel_sized("gelu-bwd", {"rows": self.N, "cols": node.shape[-1], "variant": variant}))
            return [(node.inputs[0], dx)]
        if isinstance(node, Rearrange):
            dx = self.fresh(f"d:{node.inputs[0]}")
            self.emit(f"view-bwd {n}", "host", "view-bwd", n, (g, node.inputs[0]), (dx,),
                      {"op": node.op, "dims": node.dims})
            return [(node.inputs[0], dx)]
        if n in self.groups:
            return self.attention_backward(self.groups[n], g)
        return []

    def attention_backward(self, grp: AttentionGroup, g: str) -> list[tuple[str, str]]:
        n = grp.node
        dq, dk, dv = (self.fresh(f"d:{name}") for name in (grp.q, grp.k, grp.v))
        for r in range(len(self.tiling(grp).rounds)):
            self.relayout(grp, r, "relayout-in", ("dout", "q", "k", "v"), (g, grp.q, grp.k, grp.v), ())
            self.attention_phase(grp, "backward-dp", r, (g, grp.v), (f"dp:{n}",))
            self.attention_phase(grp, "sb", r, (f"p:{n}", f"dp:{n}"), (f"ds:{n}",), "softmax")
            self.attention_phase(grp, "backward-dv", r, (g, f"p:{n}"), (f"dv:{n}",))
            self.relayout(grp, r, "relayout-out", "backward-dv", (f"dv:{n}",), (dv,))
            self.attention_phase(grp, "backward-dq", r, (f"ds:{n}", grp.k), (f"dq:{n}",))
            self.relayout(grp, r, "relayout-out", "backward-dq", (f"dq:{n}",), (dq,))
            self.attention_phase(grp, "backward-dk", r, (grp.q, f"ds:{n}"), (f"dk:{n}",))
            self.relayout(grp, r, "relayout-out", "backward-dk", (f"dk:{n}",), (dk,))
        return [(grp.q, dq), (grp.k, dk), (grp.v, dv)]


def compile_gpt(graph: TransformerGraph, config: FabricConfig, sequences: int, *, cycles: bool = True,
                resident: bool = True) -> GptSchedule:
    """The phases of one training step of ``graph`` on ``sequences`` sequences on ``config``'s mesh.

    ``cycles=False`` skips the static cycle model (every phase reads 0 cycles); ``resident=False`` leaves
    out the ``move`` phases that keep the values in the memory plan's slots between phases
    (:mod:`.gpt_moves`; the host then carries them).

    Raises
    ------
    UsageError
        If the graph has no loss, an operation the step cannot run, or a batch that does not fit
        (:class:`~.weight_streaming.FitError`, from the streamed GEMM's or a kernel's memory check).
    """
    if graph.loss is None:
        raise UsageError(f"graph {graph.name!r} has no loss; capture it with loss='cross_entropy'")
    if isinstance(sequences, bool) or not isinstance(sequences, (int, np.integer)) or sequences < 1:
        raise UsageError(f"sequences must be a positive integer, not {sequences!r}")
    builder = _Builder(graph, config, int(sequences), cycles)
    for node in graph.nodes:
        builder.forward(node)
    builder.backward()
    blocks = [len(b) for b in block_partition(builder.N, min(config.width, builder.N))]
    schedule = GptSchedule(graph, config, int(sequences), builder.T, blocks, builder.phases, builder.groups,
                           step_memory(builder, blocks))
    if resident:
        make_resident(schedule, linear_executable, tokens_kernel_plan, functools.partial(check_step, builder))
    return schedule
