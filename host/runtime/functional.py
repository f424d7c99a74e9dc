"""The ``functional`` backend: the executable's phases computed on the host
with the firmware's order of binary32 operations, so its results equal the
fabric's bit for bit (``tests/test_runtime.py`` checks it against the golden
model).

Every phase's ``math`` entries are executed in order on whole tensors
(``[features, batch]``) by the compiled loops of :mod:`.kernels`: the
streamed GEMMs, the weight gradients, ReLU, the ReLU mask and the softmax
delta (the last three spelling out the fabric's binary32 rules, tested
against :mod:`wse.firmware.training.numerics`). Inputs are flushed to zero
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

from typing import Mapping

import numpy as np

from . import kernels
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


class FunctionalBackend(Backend):
    """Bit-exact host execution of the compiled schedule (see the module docstring)."""

    name = "functional"

    def __init__(self, executable):
        super().__init__(executable)
        layout = executable.layout
        self.height = int(layout["height"])
        self.starts = np.asarray(layout["token_start"], dtype=np.int64)
        self.counts = np.asarray(layout["tokens"], dtype=np.int64)

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
        shapes = exe.parameters()
        w = {name: _flushed(value) for name, value in weights.items()}
        acts = {"act0": np.ascontiguousarray(_flushed(host.x).T)}
        grads: dict[str, np.ndarray] = {}
        onehot = np.ascontiguousarray(host.onehot.T)
        scale = host.scale
        for name in exe.sequences[sequence]:
            for op in exe.phases[name]["math"]:
                kind = op["op"]
                if kind == "sgemm" and not op["transposed"]:
                    bias = w[op["bias"]] if op["bias"] else None
                    acts[op["y"]] = kernels.sgemm(w[op["weight"]], acts[op["x"]], bias, self.height)
                elif kind == "sgemm":
                    acts[op["y"]] = kernels.sgemm_transposed(w[op["weight"]], acts[op["x"]], self.height)
                elif kind == "relu":
                    acts[op["data"]] = kernels.relu(acts[op["data"]])
                elif kind == "mask":
                    acts[op["grad"]] = kernels.relu_mask(acts[op["act"]], acts[op["grad"]])
                elif kind == "softmax":
                    acts[op["dz"]] = kernels.softmax_delta(acts[op["z"]], onehot, scale)
                elif kind == "wgrad":
                    gradient = kernels.wgrad_partials if partials else kernels.wgrad
                    dw, db = gradient(acts[op["dy"]], acts[op["x"]], starts, counts)
                    grads[op["weight"]] = dw.reshape(dw.shape[:-2] + tuple(shapes[op["weight"]]))
                    if op["bias"]:
                        grads[op["bias"]] = db
                else:
                    raise RuntimeError(f"phase {name}: unknown operation {kind!r}")
        last = f"act{len(exe.layout['layers'])}"
        logits = np.ascontiguousarray(acts[last].T)
        cycles = {name: int(exe.phases[name]["cycles"]) for name in exe.sequences[sequence]}
        return RunResult(logits, grads, cycles)
