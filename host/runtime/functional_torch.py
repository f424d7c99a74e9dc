"""The ``functional-torch`` backends: the functional backend's phases on torch tensors,
on the CPU or a CUDA device, with the same bits as the numba ``functional`` backend.

:class:`FunctionalTorchBackend` executes every phase's ``math`` entries
(:mod:`wse.host.compiler.schedule`) in order, as
:class:`~.functional.FunctionalBackend` does, with the operations of
:mod:`.torch_kernels` (the documented orders of binary32 operations,
vectorized over the independent dimensions; eager elementwise operations, so
no fused multiply-add and no reassociation on either device). The tensors stay
on the device for the whole sequence; only the logits and the gradients come
back. The cycles of each phase are the executable's (the static cycle model).

Three names (:data:`DEVICE_OF`): ``functional-torch`` runs on CUDA where a
device is present and on the CPU otherwise, ``functional-torch-cpu`` and
``functional-torch-cuda`` pick one (the latter is a usage error without CUDA).
:meth:`~FunctionalTorchBackend.run_shard` gives a system's share of a SwarmX
data-parallel step, as the numba backend's does. The layer-pipelined mode
(resident layouts) is not covered: it runs on ``functional`` or a device.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np
import torch

from wse.config import UsageError
from wse.host.compiler.schedule import (MathOp, Relu, ReluMask, Sgemm, SgemmTransposed, SoftmaxDelta,
                                        SparseSgemm, SparseSgemmTransposed, WeightGradient)

from . import slots
from . import torch_kernels as tk
from .backend import Backend, HostData, RunResult

__all__ = ["FunctionalTorchBackend", "DEVICE_OF", "torch_device"]

#: Backend name -> torch device (``None``: CUDA where present, else the CPU).
DEVICE_OF: dict[str, str | None] = {"functional-torch": None, "functional-torch-cpu": "cpu",
                                    "functional-torch-cuda": "cuda"}


def torch_device(name: str) -> str:
    """The torch device the backend ``name`` (a key of :data:`DEVICE_OF`) runs on.

    Raises
    ------
    UsageError
        For ``functional-torch-cuda`` where torch sees no CUDA device.
    """
    device = DEVICE_OF[name]
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"backend {name} needs a CUDA device, and torch finds none here "
                         "(use functional-torch-cpu or functional-torch)")
    return device


class _Step:
    """The tensors of one run of a phase sequence, by name, on the backend's device."""

    def __init__(self, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray, counts: np.ndarray,
                 shapes: Mapping[str, tuple], partials: bool, device: str):
        def tensor(values: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.array(values, dtype=np.float32, order="C", copy=True)).to(device)

        self.w = {name: tk.flushed(tensor(value)) for name, value in weights.items()}
        self.acts = {"act0": tk.flushed(tensor(host.x)).t().contiguous()}
        self.grads: dict[str, torch.Tensor] = {}
        self.onehot = tensor(host.onehot).t().contiguous()
        self.scale = tensor(host.scale)
        self.starts, self.counts, self.shapes, self.partials = starts, counts, shapes, partials


def _numpy(values: torch.Tensor) -> np.ndarray:
    return np.ascontiguousarray(values.detach().to("cpu").numpy(), dtype=np.float32)


class FunctionalTorchBackend(Backend):
    """Bit-exact execution of the compiled schedule on torch tensors (see the module docstring).

    Parameters
    ----------
    executable:
        A weight-streaming executable.
    device:
        ``"cpu"``, ``"cuda"``, or ``None`` for the device of the backend's :attr:`name`.
    """

    name = "functional-torch"

    def __init__(self, executable, device: str | None = None):
        super().__init__(executable)
        self.device = device if device is not None else torch_device(self.name)
        layout = executable.layout
        self.height = int(layout.feature_rows)
        blocks = layout.token_blocks()
        self.starts = np.array([block.start for block in blocks], dtype=np.int64)
        self.counts = np.array([len(block) for block in blocks], dtype=np.int64)
        self._ops: dict[type, Callable[[_Step, MathOp], None]] = {
            Sgemm: self._sgemm, SgemmTransposed: self._sgemm_transposed, SparseSgemm: self._spgemm,
            SparseSgemmTransposed: self._spgemm_transposed, Relu: self._relu, ReluMask: self._mask, SoftmaxDelta: self._softmax, WeightGradient: self._wgrad}

    def run(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray]) -> RunResult:
        return self._execute(sequence, host, weights, self.starts, self.counts, partials=False)

    def run_shard(self, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray,
                  counts: np.ndarray) -> RunResult:
        return self._execute("train", host, weights, np.asarray(starts, dtype=np.int64),
                             np.asarray(counts, dtype=np.int64), partials=True)

    def _execute(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray], starts: np.ndarray,
                 counts: np.ndarray, *, partials: bool) -> RunResult:
        """The phases of ``sequence`` on ``host``'s tokens (see :meth:`.functional.FunctionalBackend._execute`)."""
        exe = self.executable
        step = _Step(host, weights, starts, counts, exe.parameters(), partials, self.device)
        for name in exe.sequences[sequence]:
            for op in exe.phases[name].math:
                run = self._ops.get(type(op))
                if run is None:
                    raise RuntimeError(f"phase {name}: no functional execution of {type(op).__name__}")
                run(step, op)
        logits = _numpy(step.acts[exe.layout.logits].t())
        grads = {name: _numpy(value) for name, value in step.grads.items()}
        cycles = {name: int(exe.phases[name].cycles) for name in exe.sequences[sequence]}
        return RunResult(logits, grads, cycles)

    # -- one method per operation type ------------------------------------------
    def _sgemm(self, step: _Step, op: Sgemm) -> None:
        bias = step.w[op.bias] if op.bias else None
        step.acts[op.y] = slots.sgemm(tk.sgemm, self.executable.layout, op, step.w[op.weight], step.acts[op.x], bias,
                                      self.height)

    def _spgemm(self, step: _Step, op: SparseSgemm) -> None:
        bias = step.w[op.bias] if op.bias else None
        step.acts[op.y] = slots.spgemm(tk.spgemm, self.executable.layout, op, step.w[op.weight], step.acts[op.x],
                                       bias, op.nonzeros, self.height)

    def _spgemm_transposed(self, step: _Step, op: SparseSgemmTransposed) -> None:
        step.acts[op.y] = slots.spgemm(tk.spgemm, self.executable.layout, op, step.w[op.weight].t().contiguous(),
                                       step.acts[op.x], None, op.nonzeros, self.height)

    def _sgemm_transposed(self, step: _Step, op: SgemmTransposed) -> None:
        step.acts[op.y] = slots.sgemm_transposed(tk.sgemm_transposed, self.executable.layout, op, step.w[op.weight],
                                                 step.acts[op.x], self.height)

    def _relu(self, step: _Step, op: Relu) -> None:
        step.acts[op.data] = tk.relu(step.acts[op.data])

    def _mask(self, step: _Step, op: ReluMask) -> None:
        step.acts[op.grad] = tk.relu_mask(step.acts[op.act], step.acts[op.grad])

    def _softmax(self, step: _Step, op: SoftmaxDelta) -> None:
        step.acts[op.dz] = tk.softmax_delta(step.acts[op.z], step.onehot, step.scale)

    def _wgrad(self, step: _Step, op: WeightGradient) -> None:
        gradient = tk.wgrad_partials if step.partials else tk.wgrad
        dw, db = gradient(step.acts[op.dy], step.acts[op.x], step.starts, step.counts)
        step.grads[op.weight] = dw.reshape(dw.shape[:-2] + tuple(step.shapes[op.weight]))
        if op.bias:
            step.grads[op.bias] = db


class FunctionalTorchCpuBackend(FunctionalTorchBackend):
    """``functional-torch-cpu``: :class:`FunctionalTorchBackend` on the CPU."""

    name = "functional-torch-cpu"


class FunctionalTorchCudaBackend(FunctionalTorchBackend):
    """``functional-torch-cuda``: :class:`FunctionalTorchBackend` on the CUDA device."""

    name = "functional-torch-cuda"
