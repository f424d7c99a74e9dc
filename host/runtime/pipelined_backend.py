"""The runtime's backend for resident layouts (the layer-pipelined mode,
``docs/layer_pipelined.md``): the parameters and the optimizer state stay
where the step runs, between steps.

:class:`PipelinedBackend` runs a layer-pipelined executable either on a
device of :mod:`wse.sim.devices` (``golden``, ``verilator``, ...) through
:class:`~.pipelined.PipelinedDevice`, or in the functional model
(:class:`~.pipelined.PipelinedFunctional`, the same bits); the plan is
rebuilt from the executable (:func:`wse.host.compiler.pipelined_codegen.plan_of`,
checked against the file). A training step returns no gradients (they never
leave the PEs): the update has run on the PEs. :meth:`~PipelinedBackend.write_state`
places parameters and momentum buffers, :meth:`~PipelinedBackend.read_state` reads
them back. The cycles of the functional backend are the executable's (the
static cycle model, equal to the golden model's).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from wse.config import UsageError
from wse.host.compiler.pipelined_codegen import passes_of, plan_of

from .backend import Backend, HostData, RunResult
from .pipelined import PipelinedDevice, PipelinedFunctional, functional_forward

__all__ = ["PipelinedBackend"]


class PipelinedBackend(Backend):
    """A layer-pipelined executable on ``device`` (a device name, or ``"functional"``)."""

    def __init__(self, executable, device: str = "functional"):
        super().__init__(executable)
        self.name = device
        self.plan = plan_of(executable)
        if device.startswith("functional-torch"):
            raise UsageError(f"the layer-pipelined mode runs on the functional backend or a device, not {device} "
                             "(which runs the weight-streaming mode: --mode weight-streaming)")
        self._device = None if device == "functional" else PipelinedDevice(self.plan, device)
        self._model: PipelinedFunctional | None = None
        self._loaded = False

    @property
    def fabric(self):
        """The device the steps run on (a :class:`wse.sim.api.Device`; None on the functional backend)."""
        return self._device.device if self._device is not None else None

    @property
    def steps(self) -> int:
        """Optimizer steps taken since the state was written (at least 1 once resumed)."""
        return self._device.steps if self._device is not None else (self._model.steps if self._model else 0)

    def write_state(self, params: Mapping[str, np.ndarray], momentum: Mapping[str, np.ndarray] | None = None,
                    steps: int = 0) -> None:
        """Place the parameters (and the momentum buffers, for a run that has taken
        ``steps`` > 0 steps) where the steps run."""
        if momentum and self.plan.optimizer is not None and self.plan.optimizer.hyper["momentum"] == 0:
            raise UsageError("momentum buffers given, but the executable's optimizer has no momentum")
        if self._device is not None:
            self._device.write_weights(params)
            if steps:
                self._device.write_state(momentum or {})
            self._device.steps = int(steps)
        else:
            self._model = PipelinedFunctional(self.plan, params)
            self._model.state = {name: np.array(value, dtype=np.float32) for name, value in (momentum or {}).items()}
            self._model.steps = int(steps)
        self._loaded = True

    def read_state(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(parameters, momentum buffers)`` by name (the buffers empty before the first step)."""
        self._need()
        if self._device is not None:
            return self._device.read_state()
        model = self._model
        return ({name: value.copy() for name, value in model.params.items()},
                {name: value.copy() for name, value in model.state.items()} if model.steps else {})

    def _need(self) -> None:
        if not self._loaded:
            raise UsageError("the layer-pipelined executable holds no weights yet: pass weights to the first "
                             "step or call Runtime.write_state")

    def run(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray] | None) -> RunResult:
        """``"train"``: one step on the ``host.n`` real samples (the update included);
        ``"eval"``: the logits of the whole padded batch. ``weights``, if given,
        become the resident parameters first (the momentum buffers are kept)."""
        if weights is not None:
            self._place(weights)
        self._need()
        exe, n = self.executable, host.n
        if sequence == "eval":
            return RunResult(self._forward(host.x), {}, self._cycles(exe.sequences["eval"]))
        if self.plan.optimizer is None:
            raise UsageError("this layer-pipelined executable was compiled without an optimizer and only "
                             "evaluates; compile it with optimizer=... to train")
        y = np.argmax(host.onehot[:n], axis=1).astype(np.int64)
        first = self.steps == 0
        if self._device is not None:
            _, logits, cycles = self._device.train_step(host.x[:n], y)
        else:
            _, logits = self._model.train_step(host.x[:n], y)
            names = self._step_phases(n, first)
            cycles = self._cycles(names)
        out = np.zeros((exe.batch, logits.shape[1]), dtype=np.float32)
        out[:n] = logits
        return RunResult(out, {}, cycles)

    def _place(self, weights: Mapping[str, np.ndarray]) -> None:
        if self._device is not None:
            self._device.write_weights(weights)
            self._loaded = True
        elif self._model is None:
            self.write_state(weights)
        else:
            self._model.params = PipelinedFunctional(self.plan, weights).params

    def _forward(self, x: np.ndarray) -> np.ndarray:
        plan, rows = self.plan, []
        for start in range(0, x.shape[0], plan.batch):
            xb = np.zeros((plan.batch, x.shape[1]), dtype=np.float32)
            part = x[start:start + plan.batch]
            xb[:len(part)] = part
            if self._device is not None:
                logits, _ = self._device.forward(xb)
            else:
                logits = functional_forward(plan, self._model.params, xb)[-1]
            rows.append(logits[:len(part)])
        return np.concatenate(rows)

    def _step_phases(self, n: int, first: bool) -> list[str]:
        seq = self.plan.sequences
        passes = passes_of(n, self.plan.batch)
        return seq["first_pass"] + seq["pass"] * (passes - 1) + seq["first_update" if first else "update"]

    def _cycles(self, names: list[str]) -> dict[str, int]:
        cycles: dict[str, int] = {}
        for name in names:
            cycles[name] = cycles.get(name, 0) + int(self.executable.phases[name].cycles)
        return cycles
