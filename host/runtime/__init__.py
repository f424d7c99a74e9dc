"""The runtime: run a compiled :class:`~wse.host.compiler.Executable` on a backend.

:class:`Runtime` takes host data (a batch, labels, the weights from MemoryX),
runs the executable's phases on a backend and returns a :class:`StepResult`
(loss, accuracy count, logits, gradients in PyTorch names and shapes, cycles).

Backends (:data:`BACKENDS`) are small classes with a few hooks:

* ``functional`` (:mod:`.functional`): the compiled schedule executed in
  numpy/numba with the same order of float operations as the firmware:
  bit-exact with the fabric, fast; its cycles come from the executable's
  static cycle model.
* ``golden`` (:mod:`.golden`): the golden fabric model through the host API
  (:mod:`.device` drives any such device, so RTL backends plug in the same way).

Batches smaller than the executable's batch (the last batch of an epoch) are
padded with zeros; the padded samples get a zero loss delta, so they change
no gradient, and are left out of the loss, the count and the logits.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from wse.config import UsageError

from .backend import Backend, HostData

__all__ = ["Runtime", "StepResult", "BACKENDS", "Backend", "register_backend"]

#: Backend name -> class. The classes are imported on first use.
BACKENDS: dict[str, str] = {"functional": "wse.host.runtime.functional:FunctionalBackend",
                            "golden": "wse.host.runtime.golden:GoldenBackend"}


def register_backend(name: str, target: str | type) -> None:
    """Make a backend available to :class:`Runtime` by name: a :class:`Backend`
    subclass or its ``"module:Class"`` path."""
    BACKENDS[name] = target


def _backend_class(name: str) -> type:
    target = BACKENDS.get(name) if isinstance(name, str) else None
    if target is None:
        raise UsageError(f"backend must be one of {', '.join(sorted(BACKENDS))}, not {name!r}")
    if isinstance(target, str):
        import importlib
        module, _, attr = target.partition(":")
        target = getattr(importlib.import_module(module), attr)
    return target


@dataclasses.dataclass
class StepResult:
    """What one training step returns.

    Members
    -------
    loss:
        Mean softmax cross-entropy of the real samples of the batch, computed
        on the host in float64 from the fabric's logits (log-sum-exp minus
        the label's logit) and rounded to a Python float.
    correct:
        Real samples whose argmax logit (first maximum) is the label.
    logits:
        float32 ``[n, classes]`` for the ``n`` real samples.
    grads:
        float32 gradients of the mean loss, by PyTorch name and shape.
    cycles:
        Fabric cycles of the step (the sum of ``phases``): the golden model's count.
    fmac_utilization:
        FMAC elements of the streamed GEMMs (forward and input-gradient
        phases: ``fmacs`` and ``fmacw`` elements) divided by PEs times the
        cycles of those phases.
    phases:
        Cycles per phase, in execution order.
    """
    loss: float
    correct: int
    logits: np.ndarray
    grads: dict
    cycles: int
    fmac_utilization: float
    phases: dict


class Runtime:
    """Runs a compiled executable on a backend.

    Parameters
    ----------
    executable:
        From :func:`wse.host.compiler.compile_model` or ``Executable.load``.
    backend:
        ``"functional"`` or ``"golden"`` (see :data:`BACKENDS`).

    Raises
    ------
    UsageError
        For an unknown backend or an executable that is not an ``Executable``.
    """

    def __init__(self, executable, backend: str = "functional"):
        from wse.host.compiler.executable import Executable
        if not isinstance(executable, Executable):
            raise UsageError(f"executable must be an Executable, not {type(executable).__name__}")
        self.executable = executable
        self.backend_name = backend
        self.backend: Backend = _backend_class(backend)(executable)
        self._classes = executable.graph.layers[-1].classes
        self._features = int(np.prod(executable.graph.input.shape))

    # -- checks ----------------------------------------------------------
    def _check_x(self, x) -> np.ndarray:
        exe = self.executable
        shape = tuple(exe.graph.input.shape)
        x = np.asarray(x)
        if x.dtype != np.float32:
            raise UsageError(f"x must be float32, not {x.dtype}")
        if x.ndim < 1 or tuple(x.shape[1:]) != shape:
            raise UsageError(f"x must have shape [n, {', '.join(map(str, shape))}], not {list(x.shape)}")
        if not 1 <= x.shape[0] <= exe.batch:
            raise UsageError(f"x must hold 1 to {exe.batch} samples (the compiled batch), not {x.shape[0]}")
        return x.reshape(x.shape[0], -1)

    def _check_weights(self, weights: Mapping) -> dict:
        expected = self.executable.parameters()
        if not isinstance(weights, Mapping):
            raise UsageError(f"weights must map parameter names to float32 arrays, not {type(weights).__name__}")
        missing = [name for name in expected if name not in weights]
        if missing:
            raise UsageError(f"weights lack {', '.join(missing)}; the model's parameters are "
                             f"{', '.join(expected)}")
        out = {}
        for name, shape in expected.items():
            value = weights[name]
            if hasattr(value, "detach"):
                value = value.detach().cpu().numpy()
            value = np.asarray(value)
            if value.dtype != np.float32 or value.shape != tuple(shape):
                raise UsageError(f"weight {name!r} must be float32 of shape {list(shape)}, not "
                                 f"{value.dtype} of shape {list(value.shape)}")
            out[name] = value
        return out

    def _host(self, x: np.ndarray, y: np.ndarray | None) -> HostData:
        exe, n = self.executable, x.shape[0]
        xb = np.zeros((exe.batch, self._features), dtype=np.float32)
        xb[:n] = x
        onehot = np.zeros((exe.batch, self._classes), dtype=np.float32)
        scale = np.zeros(exe.batch, dtype=np.float32)
        if y is not None:
            onehot[np.arange(n), y] = 1.0
            scale[:n] = np.float32(1.0) / np.float32(n)
        return HostData(xb, onehot, scale, n)

    # -- the API ----------------------------------------------------------
    def train_step(self, x, y, weights: Mapping) -> StepResult:
        """One forward and backward pass of the batch ``(x, y)`` with ``weights``.

        Parameters
        ----------
        x:
            float32 ``[n, *input_shape]``, ``1 <= n <= batch``.
        y:
            int64 labels ``[n]`` in ``0 .. classes-1``.
        weights:
            float32 arrays (or tensors) by PyTorch name, as from ``MemoryX.weight``.

        Raises
        ------
        UsageError
            For inputs of the wrong dtype, shape or range, or missing weights.
        """
        x = self._check_x(x)
        y = np.asarray(y)
        if y.dtype != np.int64 or y.shape != (x.shape[0],):
            raise UsageError(f"y must be int64 of shape [{x.shape[0]}], not {y.dtype} of shape {list(y.shape)}")
        if y.size and (y.min() < 0 or y.max() >= self._classes):
            raise UsageError(f"labels y must be in 0..{self._classes - 1}, found {int(y.min())}..{int(y.max())}")
        weights = self._check_weights(weights)
        host = self._host(x, y)
        out = self.backend.run("train", host, weights)
        n = host.n
        logits = out.logits[:n]
        z = logits.astype(np.float64)
        top = z.max(axis=1, keepdims=True)
        lse = np.log(np.exp(z - top).sum(axis=1)) + top[:, 0]
        loss = float(np.mean(lse - z[np.arange(n), y]))
        correct = int(np.count_nonzero(np.argmax(logits, axis=1) == y))
        exe = self.executable
        streamed = [name for name in exe.sequences["train"]
                    if exe.phases[name]["group"] in ("forward", "backward-data")]
        cycles = sum(out.cycles[name] for name in streamed)
        fmacs = sum(exe.phases[name]["fmacs"] for name in streamed)
        util = fmacs / (exe.config.num_pes * cycles) if cycles else 0.0
        return StepResult(loss=loss, correct=correct, logits=logits, grads=out.grads,
                          cycles=int(sum(out.cycles.values())), fmac_utilization=float(util), phases=dict(out.cycles))

    def forward(self, x, weights: Mapping) -> np.ndarray:
        """Logits ``float32 [n, classes]`` of ``x`` (evaluation: forward phases only)."""
        x = self._check_x(x)
        weights = self._check_weights(weights)
        out = self.backend.run("eval", self._host(x, None), weights)
        return out.logits[:x.shape[0]]
