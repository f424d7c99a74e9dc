"""The GPT training step on a device: the phases of
:func:`wse.host.compiler.gpt_phases.compile_gpt` run one after another on the
golden model or an RTL simulator (``docs/transformer.md`` section 11).

Each phase is a program of its own: the streamed GEMM's phases are the
training firmware's (``train.s``) on a one-layer executable of the linear
layer's shape, the others the library kernels (attention products, causal
softmax, LayerNorm, GELU, residual, relayout). A resident schedule (the
default of ``compile_gpt``) runs on ONE device: every value that crosses
phases stays in its slot of the memory plan, and ``move`` programs carry it
between the slots and the phases' buffers (:mod:`.gpt_resident`; the host
writes none of those words). Without the moves every phase run gets a fresh
device and the host carries the values: the words a phase leaves in the PEs
are read out and written into the next phase's buffers of the same PEs
(``memcpy``, which takes no fabric cycles). A head's ``q``, ``k``, ``v`` (and ``dout``) reach
the attention's tiles by a relayout program and its results leave by one
(:mod:`wse.host.compiler.gpt_tiles`); within a round of tiles every program
finds its inputs at the address the previous one left them (the round's
memory image). The embedding rows enter and their gradients leave as edge
streams of a program (``firmware/kernels/embedding_rows.py``): MemoryX (the
host) gathers the rows a batch uses and streams each token's row into its
PEs, takes every token's ``dx`` at the edges and adds them into the rows in
token order. The loss and its delta are the host's (float64 loss, the
reference's delta).

:class:`GptFabric` ``.step(params, tokens, targets)`` returns the loss, the
logits, every parameter's gradient, every run's cycles (each compared with
the static cycle model as it runs: a run that differs stops the step) and
the GEMMs' and attention products' multiply-accumulates as the PEs counted
them; it equals
``TransformerReference(graph, rows=H, blocks=schedule.blocks).step`` bit for
bit (``tests/test_gpt_fabric.py``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import numpy as np

from wse import numerics as fp
from wse.config import UsageError
from wse.firmware.deadlock import load_checked
from wse.firmware.kernels import layernorm as layernorm_kernel
from wse.firmware.kernels import residual as residual_kernel
from wse.firmware.kernels.common import read_per_pe, write_params
from wse.firmware.kernels.embedding_rows import plan_rows
from wse.firmware.kernels.gelu import Gelu
from wse.firmware.kernels.layernorm import LayerNorm as LayerNormKernel
from wse.firmware.kernels.layernorm_bwd import LayerNormBackward
from wse.firmware.training import transformer as ops
from wse.host.compiler.gpt_phases import (GEMM_GRAPH_BIAS, GEMM_GRAPH_WEIGHT, GptPhase, GptSchedule,
                                          linear_executable, tokens_kernel_plan)
from wse.host.compiler.gpt_tiles import MATRICES, HeadTiling, RoundKernel, head_tiling, relayout_in, relayout_out, \
    round_kernel, token_major
from wse.sim.devices import make_device

from . import transformer_kernels as tk
from . import transformer_loss as tl
from .device import DeviceBackend
from .gpt_resident import ResidentDevice, gemm_image, gemm_matrix
from .loss import cross_entropy

__all__ = ["GptFabric", "FabricStep"]


@dataclasses.dataclass(frozen=True)
class FabricStep:
    """One training step on the fabric.

    Members
    -------
    loss:
        Mean next-token cross-entropy (float64, host rule).
    logits:
        float32 ``[B, T, vocab]``.
    grads:
        float32 gradient of every parameter by ``state_dict`` key.
    cycles:
        Phase name -> the cycles of each of its device runs, in order.
    fmacs:
        Phase name -> the multiply-accumulates its device runs counted (the PEs' ``fmac``
        counters summed) of the phases the static model gives multiply-accumulates: the streamed
        GEMMs' and the attention products'.
    """
    loss: float
    logits: np.ndarray
    grads: dict[str, np.ndarray]
    cycles: dict[str, list[int]]
    fmacs: dict[str, int] = dataclasses.field(default_factory=dict)


class _GemmBackend(DeviceBackend):
    """A device backend for one linear layer's executable, on a device from ``factory``."""

    def __init__(self, executable, factory):
        super().__init__(executable)
        self.factory = factory

    def make_device(self, config):
        return self.factory(config)


def _region_image(exe, region: str, matrix: np.ndarray) -> np.ndarray:
    """``uint32 [H, W, words]`` of ``matrix [N, F]`` as the streamed GEMM keeps ``region``
    (:func:`~.gpt_resident.gemm_image` over the executable's token blocks)."""
    return gemm_image(exe.config, exe.layout.tokens, matrix, exe.regions[region][1])


def _region_matrix(exe, image: np.ndarray, features: int) -> np.ndarray:
    """The ``[N, F]`` matrix of a region's ``image`` (the inverse of :func:`_region_image`)."""
    return gemm_matrix(exe.config, exe.layout.tokens, image, features)


def _floats(bits: np.ndarray) -> np.ndarray:
    return fp.as_float(np.ascontiguousarray(bits, dtype=np.uint32))


class GptFabric:
    """Runs a :class:`~wse.host.compiler.gpt_phases.GptSchedule` on a device.

    Parameters
    ----------
    schedule:
        From :func:`~wse.host.compiler.gpt_phases.compile_gpt`.
    device:
        A device name of :mod:`wse.sim.devices` (``golden``, ``vector``, ``verilator``,
        ``icarus``) or a factory ``config -> device``: a resident schedule (the default) makes
        one device for the whole step; without moves every phase run gets a fresh one.
    """

    def __init__(self, schedule: GptSchedule, device: str | Callable = "golden"):
        self.schedule = schedule
        self.config = schedule.config
        self.make = device if callable(device) else (lambda config, name=device: make_device(name, config))
        self.factory = self.make
        self.shared: ResidentDevice | None = None

    def _device(self):
        return self.factory(self.config)

    # -- the step ----------------------------------------------------------------
    def step(self, params: Mapping[str, np.ndarray], tokens, targets) -> FabricStep:
        """Forward, loss and backward of token ids ``tokens [B, T]`` with next-token ``targets``
        on the device; ``params`` maps every ``state_dict`` key to its float32 value."""
        tokens, targets = np.asarray(tokens), np.asarray(targets)
        s = self.schedule
        if tokens.shape != (s.sequences, s.context) or targets.shape != tokens.shape:
            raise ValueError(f"the schedule runs {s.sequences} sequences of {s.context} tokens, not "
                             f"{tokens.shape} (targets {targets.shape})")
        self._check_ids(tokens, targets)
        self.w = {k: tk.flushed(np.asarray(v, dtype=np.float32)) for k, v in params.items()}
        self.values: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.rows: dict[str, tuple] = {}
        self.images: dict[tuple, np.ndarray] = {}
        self.partial: dict[str, np.ndarray] = {}
        self.fmacs: dict[str, int] = {}
        self.targets = targets
        self.loss = 0.0
        for node in s.graph.nodes:
            if node.kind == "tokens":
                self.values[node.name] = tokens
            elif node.kind == "positions":
                self.values[node.name] = np.arange(node.shape[0])
        cycles: dict[str, list[int]] = {}
        self.shared = ResidentDevice(self.make(self.config)) if s.moves else None
        self.factory = (lambda config: self.shared) if s.moves else self.make
        for phase in s.phases:
            if self.shared is not None:         # a host phase (the loss) keeps nothing: no stale ranges
                self.shared.set_ranges(*s.ranges.get(phase.name, ([], [], {})))
            runs = cycles[phase.name] = self._run(phase)
            if phase.cycles and runs != [phase.cycles] * phase.runs:
                raise RuntimeError(f"phase {phase.name!r} took {runs} device cycles but the static cycle model "
                                   f"gives {[phase.cycles] * phase.runs}")
        for name, (dx, index, rows) in self.rows.items():
            self.grads[name] = ops.floats(tk.embedding_rows_grad(dx, index, rows))
        logits = ops.floats(self.values[s.graph.output])
        return FabricStep(self.loss, logits, self.grads, cycles, self.fmacs)

    def _check_ids(self, tokens: np.ndarray, targets: np.ndarray) -> None:
        """Token ids index their embedding tables and targets the vocabulary: refuse any outside (a negative
        id would wrap around a table)."""
        graph = self.schedule.graph
        tables = [n.num_embeddings for n in graph.nodes if n.kind == "embedding"
                  and graph.node(n.inputs[0]).kind == "tokens"]
        vocab = graph.loss.vocab
        for label, ids, size in (("token", tokens, min(tables, default=vocab)), ("target", targets, vocab)):
            if not np.issubdtype(ids.dtype, np.integer) or (ids.size and (ids.min() < 0 or ids.max() >= size)):
                lo, hi = (ids.min(), ids.max()) if ids.size else (0, 0)
                raise UsageError(f"every {label} id must be an integer in 0..{size - 1}, not {ids.dtype} "
                                 f"values in {lo}..{hi}")

    def _run(self, phase: GptPhase) -> list[int]:
        handler = getattr(self, "_op_" + phase.op.replace("-", "_"))
        result = handler(phase)
        return list(result) if result is not None else []

    def _flat(self, name: str, features: int) -> np.ndarray:
        return np.ascontiguousarray(self.values[name]).reshape(-1, features)

    # -- MemoryX's embedding rows -----------------------------------------------------
    def _token_ids(self, name: str) -> np.ndarray:
        """The row of every token of the batch (``[B, T]``): token ids, or positions broadcast."""
        s = self.schedule
        return np.broadcast_to(self.values[name], (s.sequences, s.context))

    def _op_embedding(self, phase: GptPhase):
        """MemoryX gathers each token's row (only the rows the batch uses leave it)."""
        table = self.w[phase.arg("weight")]
        self.values[phase.outputs[0]] = table[self._token_ids(phase.inputs[0])]

    def _op_rows_in(self, phase: GptPhase):
        """The gathered rows streamed in at the edges into every token's PEs."""
        rows = self.values[phase.inputs[0]]
        plan = plan_rows(self.config, self.schedule.tokens, phase.arg("features"), "in")
        words, cycles = plan.execute(self.factory, rows.reshape(-1, rows.shape[-1]), f"rows {phase.node}")
        self.values[phase.outputs[0]] = words.reshape(rows.shape)
        return [cycles]

    def _op_rows_out(self, phase: GptPhase):
        """Every token's row gradient streamed out of its PEs to MemoryX at the edges."""
        g = self.values[phase.inputs[0]]
        plan = plan_rows(self.config, self.schedule.tokens, phase.arg("features"), "out")
        words, cycles = plan.execute(self.factory, np.ascontiguousarray(g).reshape(-1, g.shape[-1]),
                                     f"rows-grad {phase.node}")
        self.values[phase.outputs[0]] = words.reshape(g.shape)
        return [cycles]

    # -- host ops ------------------------------------------------------------------
    def _op_embedding_grad(self, phase: GptPhase):
        g, ids = self.values[phase.inputs[0]], self.values[phase.inputs[1]]
        index = np.broadcast_to(ids, g.shape[:-1])
        self.rows[phase.arg("weight")] = (np.ascontiguousarray(g).reshape(-1, g.shape[-1]),
                                          np.ascontiguousarray(index).reshape(-1), phase.arg("rows"))

    def _op_view(self, phase: GptPhase):
        x, op = self.values[phase.inputs[0]], phase.arg("op")
        if op == "view":
            x = x.reshape((self.schedule.sequences,) + tuple(phase.arg("shape")))
        elif op == "transpose":
            x = np.ascontiguousarray(np.swapaxes(x, *phase.arg("dims")))
        self.values[phase.outputs[0]] = x

    def _op_view_bwd(self, phase: GptPhase):
        g, x = self.values[phase.inputs[0]], self.values[phase.inputs[1]]
        if phase.arg("op") == "transpose":
            g = np.ascontiguousarray(np.swapaxes(g, *phase.arg("dims")))
        self.values[phase.outputs[0]] = g.reshape(x.shape)

    def _op_loss(self, phase: GptPhase):
        """The loss and its delta on the host; on a resident step the logits are read from their slot and the
        delta written into its slot."""
        vocab, memory = phase.arg("vocab"), self.schedule.memory
        if self.shared is not None:
            slot = memory.slot(phase.inputs[0])
            words = self.shared.memcpy_d2h(slot.addr, slot.words)
            shape = self.values[phase.inputs[0]].shape
            self.values[phase.inputs[0]] = gemm_matrix(self.config, self.schedule.blocks, words, vocab).reshape(shape)
        logits = self.values[phase.inputs[0]]
        flat = np.ascontiguousarray(logits).reshape(-1, vocab)
        target = self.targets.reshape(-1)
        self.loss = float(np.mean(cross_entropy(ops.floats(flat), target)))
        delta = tl.sequence_cross_entropy_delta(flat, target, None)
        self.values[phase.outputs[0]] = np.asarray(delta).reshape(logits.shape)
        if self.shared is not None:
            slot = memory.slot(phase.outputs[0])
            self.shared.memcpy_h2d(slot.addr, gemm_image(self.config, self.schedule.blocks, delta, slot.words))

    def _op_move(self, phase: GptPhase):
        """A move program: kept values between their slots and a phase's buffers, on the fabric."""
        plan = self.schedule.moves[phase.name].plan
        _, cycles = self._execute(plan, np.zeros(len(plan.src), dtype=np.uint32), phase.name)
        return [sum(cycles)]

    def _execute(self, plan, values, what: str):
        """Run a relayout ``plan``; on a resident step its words stay the device's (its span is resident)."""
        if self.shared is not None:
            self.shared.add_ranges(plan.span, plan.span)
        return plan.execute(self.factory, values, what)

    # -- kernels on the tokens x features layout ------------------------------------------
    def _op_residual(self, phase: GptPhase):
        a, b = (self.values[name] for name in phase.inputs)
        shape = np.broadcast_shapes(a.shape, b.shape)
        a, b = np.broadcast_to(a, shape), np.broadcast_to(b, shape)
        features = a.shape[-1]
        plan = tokens_kernel_plan(self.config, self.schedule.tokens, "residual", features)
        inputs = {"a": _floats(a.reshape(-1, features)), "b": _floats(np.ascontiguousarray(b).reshape(-1, features))}
        bits, cycles = residual_kernel.Residual().execute(self._device(), plan, inputs)
        self.values[phase.outputs[0]] = bits.reshape(a.shape)
        return [cycles]

    def _op_layernorm(self, phase: GptPhase):
        x = self.values[phase.inputs[0]]
        features = x.shape[-1]
        plan = tokens_kernel_plan(self.config, self.schedule.tokens, "layernorm", features, eps=phase.arg("eps"))
        device = self._device()
        y, cycles = LayerNormKernel().execute(device, plan, {
            "x": _floats(x.reshape(-1, features)), "gamma": _floats(self.w[phase.arg("weight")]),
            "beta": _floats(self.w[phase.arg("bias")])})
        addr = layernorm_kernel.addresses(plan)
        xhat = plan.gather(read_per_pe(device, addr["XC"], plan.counts))
        r = np.zeros(plan.tokens, dtype=np.uint32)
        for x0, block in enumerate(plan.token_blocks):
            if len(block):
                r[block.start:block.stop] = device.memcpy_d2h(int(addr["S"][0, x0]), len(block), (x0, 0, 1, 1))[0, 0]
        out, xh, rr = phase.outputs
        self.values[out], self.values[xh], self.values[rr] = y.reshape(x.shape), xhat, r
        return [cycles]

    def _op_layernorm_bwd(self, phase: GptPhase):
        g, xhat, r = (self.values[name] for name in phase.inputs)
        features = g.shape[-1]
        plan = tokens_kernel_plan(self.config, self.schedule.tokens, "layernorm-bwd", features)
        out, cycles = LayerNormBackward().execute(self._device(), plan, {
            "dy": _floats(g.reshape(-1, features)), "gamma": _floats(self.w[phase.arg("weight")]),
            "xhat": _floats(xhat), "r": _floats(r)})
        n = plan.tokens * features
        self.values[phase.outputs[0]] = out[:n].reshape(g.shape)
        self.grads[phase.arg("weight")] = ops.floats(out[n:n + features])
        self.grads[phase.arg("bias")] = ops.floats(out[n + features:])
        return [cycles]

    def _op_gelu(self, phase: GptPhase, backward: bool = False):
        x = self.values[phase.inputs[0]]
        features = x.shape[-1]
        plan = tokens_kernel_plan(self.config, self.schedule.tokens, "gelu", features, phase.arg("variant"))
        inputs = {"x": _floats(x.reshape(-1, features))}
        if backward:
            inputs["dy"] = _floats(self.values[phase.inputs[1]].reshape(-1, features))
        y, cycles = Gelu().execute(self._device(), plan, inputs)
        self.values[phase.outputs[0]] = y.reshape(x.shape)
        return [cycles]

    def _op_gelu_bwd(self, phase: GptPhase):
        return self._op_gelu(phase, backward=True)

    # -- the streamed GEMM ------------------------------------------------------------------
    def _executable(self, phase: GptPhase):
        """The one-layer executable of a linear layer's phase."""
        return linear_executable(self.config, self.schedule.tokens, phase.arg("k"), phase.arg("o"),
                                 phase.arg("bias") is not None)

    def _gemm(self, phase: GptPhase, exe, name: str, images: dict[str, np.ndarray], out: tuple[str, int] | None):
        """Run ``exe``'s phase ``name`` with ``images`` (region -> ``uint32 [H, W, words]``) written first;
        ``(the region out as [N, F] or None, the weight gradient pools, cycles)``."""
        bias = phase.arg("bias")
        weights = {GEMM_GRAPH_WEIGHT: _floats(self.w[phase.arg("weight")])}
        if bias is not None:
            weights[GEMM_GRAPH_BIAS] = _floats(self.w[bias])
        backend = _GemmBackend(exe, self.factory)
        backend.load()
        for region, image in images.items():
            backend.device.memcpy_h2d(exe.regions[region][0], image)
        pools: dict = {}
        cycles = backend.run_phase(name, weights, pools)
        self.fmacs[phase.name] = int(backend.device.counters()["pe"]["fmac"].sum())
        result = None
        if out is not None:
            region, features = out
            addr, words = exe.regions[region]
            result = _region_matrix(exe, backend.device.memcpy_d2h(addr, words), features)
        return result, pools, cycles

    def _op_linear(self, phase: GptPhase):
        x = self.values[phase.inputs[0]]
        k, o, exe = phase.arg("k"), phase.arg("o"), self._executable(phase)
        y, _, cycles = self._gemm(phase, exe, "fwd l2", {"act1": _region_image(exe, "act1", x.reshape(-1, k))},
                                  ("act2", o))
        self.values[phase.outputs[0]] = y.reshape(x.shape[:-1] + (o,))
        return [cycles]

    def _op_linear_data(self, phase: GptPhase):
        g = self.values[phase.inputs[0]]
        k, o, exe = phase.arg("k"), phase.arg("o"), self._executable(phase)
        dx, _, cycles = self._gemm(phase, exe, "bwd-data l2", {"grad2": _region_image(exe, "grad2", g.reshape(-1, o))},
                                   ("grad1", k))
        self.values[phase.outputs[0]] = dx.reshape(g.shape[:-1] + (k,))
        return [cycles]

    def _op_token_major(self, phase: GptPhase):
        """The layer's input copied token-major within every PE (a relayout of local moves): the words
        the weight gradient reads as ``act1tm``, kept as that region's image."""
        x = self.values[phase.inputs[0]]
        k, exe = phase.arg("k"), self._executable(phase)
        (src, _), (dst, words) = exe.regions["act1"], exe.regions["act1tm"]
        plan = token_major(self.config, self.schedule.tokens, k, src, dst)
        image = _region_image(exe, "act1", x.reshape(-1, k))
        xs, ys, a = plan.src.T
        copied, cycles = self._execute(plan, image[ys, xs, a - src], f"token-major {phase.node}")
        out = np.zeros((self.config.height, self.config.width, words), dtype=np.uint32)
        xs, ys, a = plan.dst.T
        out[ys, xs, a - dst] = copied
        self.values[phase.outputs[0]] = out
        return [sum(cycles)]

    def _op_linear_weight(self, phase: GptPhase):
        copy, g = (self.values[name] for name in phase.inputs)
        k, o, exe = phase.arg("k"), phase.arg("o"), self._executable(phase)
        _, pools, cycles = self._gemm(phase, exe, "bwd-weight l2", {
            "act1tm": copy, "grad2": _region_image(exe, "grad2", g.reshape(-1, o))}, None)
        (key, bits), = pools.items()
        self.grads[phase.arg("weight")] = ops.floats(bits[:o * k]).reshape(o, k)
        if phase.arg("bias") is not None:
            self.grads[phase.arg("bias")] = ops.floats(bits[o * k:])
        return [cycles]

    # -- attention: instances side by side, operands relaid on the fabric ------------------------------
    def _tiling(self, phase: GptPhase) -> HeadTiling:
        return head_tiling(self.config, self.schedule.sequences, phase.arg("heads"), phase.arg("t"), phase.arg("dh"),
                           phase.arg("scale"))

    def _heads(self, name: str, transposed: bool = False) -> np.ndarray:
        """The value ``name`` as ``[sequences, heads, rows, columns]`` (``transposed``: the last two swapped)."""
        value = self.values[name]
        if transposed:
            value = np.swapaxes(value, -1, -2)
        return np.ascontiguousarray(value).reshape(self.schedule.sequences, -1, *value.shape[-2:])

    def _image(self, phase: GptPhase) -> np.ndarray:
        """The round's attention region of every PE, ``uint32 [H, W, top - base]``: what the round's
        programs leave in the PEs, kept from one program to the next at the same addresses."""
        tiling = self._tiling(phase)
        key = (phase.node, phase.arg("round"))
        if key not in self.images:
            self.images[key] = np.zeros((self.config.height, self.config.width, tiling.top - tiling.base),
                                        dtype=np.uint32)
        return self.images[key]

    def _op_relayout_in(self, phase: GptPhase):
        group, tiling = self.schedule.groups[phase.node], self._tiling(phase)
        what = phase.arg("what")
        plan, index = relayout_in(tiling, phase.arg("round"), what)
        sources = {"q": (group.q, False), "k": (group.k, group.k_transposed), "v": (group.v, False)}
        stacked = [self._heads(*sources[m]) if m in sources else self._heads(phase.inputs[0])
                   for m in MATRICES if m in what]
        slots = [MATRICES.index(m) for m in MATRICES if m in what]
        values = np.zeros(len(index), dtype=np.uint32)
        for value, slot in zip(stacked, slots):
            rows = index[:, 0] == slot
            b, h, t, d = index[rows, 1:].T
            values[rows] = np.asarray(value)[b, h, t, d]
        words, cycles = self._execute(plan, values, f"relayout in {phase.node}")
        image = self._image(phase)
        x, y, a = plan.dst.T
        image[y, x, a - tiling.base] = words
        return [sum(cycles)]

    def _op_relayout_out(self, phase: GptPhase):
        group, tiling = self.schedule.groups[phase.node], self._tiling(phase)
        variant = phase.arg("what")
        plan, index = relayout_out(tiling, phase.arg("round"), variant)
        image = self._image(phase)
        x, y, a = plan.src.T
        words, cycles = self._execute(plan, image[y, x, a - tiling.base], f"relayout out {phase.node}")
        like = {"values": group.q, "backward-dv": group.v, "backward-dq": group.q, "backward-dk": group.k}[variant]
        transposed = variant == "backward-dk" and group.k_transposed
        target = phase.outputs[0]
        if target not in self.partial:
            self.partial[target] = np.zeros((tiling.sequences, tiling.heads, tiling.t, tiling.dh), dtype=np.uint32)
        out = self.partial[target]
        b, h, t, d = index.T
        out[b, h, t, d] = words
        shape = self.values[like].shape
        full = np.swapaxes(out.reshape(shape[:-2] + (tiling.t, tiling.dh)), -1, -2) if transposed else out
        self.values[target] = np.ascontiguousarray(full).reshape(shape)
        return [sum(cycles)]

    def _run_round(self, phase: GptPhase, kernel: RoundKernel, what: str) -> int:
        tiling = self._tiling(phase)
        image = self._image(phase)
        device = self._device()
        device.load(kernel.program)
        load_checked(device, self.config, kernel.routes, what, rings=kernel.rings)
        write_params(device, kernel.program, kernel.params)
        device.memcpy_h2d(tiling.base, image)
        device.launch(0)
        cycles = device.run()
        if phase.kind == "attention":
            self.fmacs[phase.name] = int(device.counters()["pe"]["fmac"].sum())
        image[:] = device.memcpy_d2h(tiling.base, image.shape[-1])
        return cycles

    def _op_attention(self, phase: GptPhase):
        tiling = self._tiling(phase)
        kernel = round_kernel(tiling, phase.arg("variant"), phase.arg("scale"), len(tiling.rounds[phase.arg("round")]))
        return [self._run_round(phase, kernel, f"attention {phase.name}")]

    _op_softmax = _op_attention
