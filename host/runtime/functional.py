"""The ``functional`` backend: the executable's phases computed on the host
with the firmware's order of binary32 operations, so its results equal the
fabric's bit for bit (``tests/test_runtime.py`` checks it against the golden
model).

Every phase's ``math`` entries (:mod:`wse.host.compiler.schedule`) are
executed in order on whole tensors (``[features, batch]``) by the compiled
loops of :mod:`.kernels`, one method per operation type: the streamed GEMMs,
the weight gradients, ReLU, the ReLU mask and the softmax delta (the last
three spelling out the fabric's binary32 rules, tested against
:mod:`wse.firmware.training.numerics`). The GEMMs' order of partial sums and
the weight gradients' token columns come from the executable's layout
(:attr:`~wse.host.compiler.layouts.Layout.feature_rows`,
:meth:`~wse.host.compiler.layouts.Layout.token_blocks`). Inputs are flushed to zero
where subnormal, as the fabric's operand flushing does. The cycles of each
phase are the executable's (the static cycle model, equal to the golden
model's).

:meth:`FunctionalBackend.run_shard` runs the training phases on the tokens
of a run of columns only and returns each column's weight-gradient partial
sum (:func:`.kernels.wgrad_partials`) instead of the row chain's total: a
system's share of a SwarmX data-parallel step. Every other operation treats
tokens independently, so the shard's activations equal the whole step's.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from wse.host.compiler.schedule import (MathOp, Relu, ReluMask, Sgemm, SgemmTransposed, SoftmaxDelta,
                                        SparseSgemm, SparseSgemmTransposed, SparseWeightGradient, WeightGradient)

from . import kernels, slots
from .backend import Backend, HostData, RunResult

__all__ = ["FunctionalBackend"]


def _flushed(values: np.ndarray) -> np.ndarray:
    """float32 copy with subnormals replaced by zeros of the same sign."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    sub = ((bits & 0x7F800000) == 0) & ((bits & 0x007FFFFF) != 0)
    if sub.any():
        values = values.copy()
        values.view(np.uint32)[sub] &= np.uint32(0x80000000)
    return values


class _Step:
    """The tensors of one run of a phase sequence, by name, and what the operations need."""

    def __init__(self, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray, counts: np.ndarray,
                 shapes: Mapping[str, tuple], partials: bool):
        self.w = {name: _flushed(value) for name, value in weights.items()}
        self.acts = {"act0": np.ascontiguousarray(_flushed(host.x).T)}
        self.grads: dict[str, np.ndarray] = {}
        self.onehot = np.ascontiguousarray(host.onehot.T)
        self.scale = host.scale
        self.starts, self.counts, self.shapes, self.partials = starts, counts, shapes, partials


class FunctionalBackend(Backend):
    """Bit-exact host execution of the compiled schedule (see the module docstring)."""

    name = "functional"

    def __init__(self, executable):
        super().__init__(executable)
        layout = executable.layout
        self.height = int(layout.feature_rows)
        blocks = layout.token_blocks()
        self.starts = np.array([block.start for block in blocks], dtype=np.int64)
        self.counts = np.array([len(block) for block in blocks], dtype=np.int64)
        self._ops: dict[type, Callable[[_Step, MathOp], None]] = {
            Sgemm: self._sgemm, SgemmTransposed: self._sgemm_transposed, SparseSgemm: self._spgemm,
            SparseSgemmTransposed: self._spgemm_transposed, SparseWeightGradient: self._spwgrad,
            Relu: self._relu, ReluMask: self._mask, SoftmaxDelta: self._softmax, WeightGradient: self._wgrad}

    def run(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray]) -> RunResult:
        return self._execute(sequence, host, weights, self.starts, self.counts, partials=False)

    def run_shard(self, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray,
                  counts: np.ndarray) -> RunResult:
        return self._execute("train", host, weights, np.asarray(starts, dtype=np.int64),
                             np.asarray(counts, dtype=np.int64), partials=True)

    def _execute(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray,
                 counts: np.ndarray, *, partials: bool) -> RunResult:
        """The phases of ``sequence`` on ``host``'s tokens, grouped into columns by
        ``starts``/``counts``; with ``partials`` the weight gradients are the
        per-column sums (``[columns, *shape]``) instead of their row chain."""
        exe = self.executable
        step = _Step(host, weights, starts, counts, exe.parameters(), partials)
        for name in exe.sequences[sequence]:
            for op in exe.phases[name].math:
                run = self._ops.get(type(op))
                if run is None:
                    raise RuntimeError(f"phase {name}: no functional execution of {type(op).__name__}")
                run(step, op)
        logits = np.ascontiguousarray(step.acts[exe.layout.logits].T)
        cycles = {name: int(exe.phases[name].cycles) for name in exe.sequences[sequence]}
        return RunResult(logits, step.grads, cycles)

    # -- one method per operation type ------------------------------------------
    def _sgemm(self, step: _Step, op: Sgemm) -> None:
        bias = step.w[op.bias] if op.bias else None
        step.acts[op.y] = slots.sgemm(kernels.sgemm, self.executable.layout, op, step.w[op.weight], step.acts[op.x],
                                      bias, self.height)

    def _spgemm(self, step: _Step, op: SparseSgemm) -> None:
        bias = step.w[op.bias] if op.bias else None
        step.acts[op.y] = slots.spgemm(kernels.spgemm, self.executable.layout, op, step.w[op.weight],
                                       step.acts[op.x], bias, op.nonzeros, self.height)

    def _spgemm_transposed(self, step: _Step, op: SparseSgemmTransposed) -> None:
        step.acts[op.y] = slots.spgemm(kernels.spgemm, self.executable.layout, op,
                                       np.ascontiguousarray(step.w[op.weight].T), step.acts[op.x], None, op.nonzeros,
                                       self.height)

    def _sgemm_transposed(self, step: _Step, op: SgemmTransposed) -> None:
        step.acts[op.y] = slots.sgemm_transposed(kernels.sgemm_transposed, self.executable.layout, op,
                                                 step.w[op.weight], step.acts[op.x], self.height)

    def _spwgrad(self, step: _Step, op: SparseWeightGradient) -> None:
        self._wgrad(step, op)               # the kept weights' values are wgrad's, in its order
        shape = tuple(step.shapes[op.weight])
        kept = np.zeros(int(np.prod(shape)), dtype=bool)
        kept[np.asarray(op.nonzeros, dtype=np.int64)] = True
        step.grads[op.weight] = np.where(kept.reshape(shape), step.grads[op.weight], np.float32(0))

    def _relu(self, step: _Step, op: Relu) -> None:
        step.acts[op.data] = kernels.relu(step.acts[op.data])

    def _mask(self, step: _Step, op: ReluMask) -> None:
        step.acts[op.grad] = kernels.relu_mask(step.acts[op.act], step.acts[op.grad])

    def _softmax(self, step: _Step, op: SoftmaxDelta) -> None:
        step.acts[op.dz] = kernels.softmax_delta(step.acts[op.z], step.onehot, step.scale)

    def _wgrad(self, step: _Step, op: WeightGradient) -> None:
        gradient = kernels.wgrad_partials if step.partials else kernels.wgrad
        dw, db = gradient(step.acts[op.dy], step.acts[op.x], step.starts, step.counts)
        step.grads[op.weight] = dw.reshape(dw.shape[:-2] + tuple(step.shapes[op.weight]))
        if op.bias:
            step.grads[op.bias] = db
