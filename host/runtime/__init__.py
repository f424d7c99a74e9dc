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
  (:mod:`.device` drives any such device).
* ``verilator``, ``icarus`` (:mod:`.rtl`): the same driver on the RTL mesh,
  Verilator-compiled or under cocotb in Icarus (``docs/cosim.md``).

Batches smaller than the executable's batch (the last batch of an epoch) are
padded with zeros; the padded samples get a zero loss delta, so they change
no gradient, and are left out of the loss, the count and the logits.

An executable of a *resident* layout (the layer-pipelined mode,
``docs/layer_pipelined.md``) keeps its parameters and optimizer state where
the step runs (:mod:`.pipelined_backend`, on any backend name): the first
step (or :meth:`Runtime.write_state`) places them, every step updates them
there and returns no gradients, :meth:`Runtime.read_state` reads them back.

:meth:`Runtime.train_shard` is the SwarmX hook (``docs/swarmx.md`` section 3):
one system's share of a data-parallel step, a run of the executable's token
columns, with the per-column weight-gradient sums the row chain would add.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from wse.config import UsageError
from wse.sim.devices import DEVICES

from .backend import Backend, HostData
from .loss import cross_entropy, mean_cross_entropy
from .rtl import device_backend
from .shard import ShardResult

__all__ = ["Runtime", "StepResult", "ShardResult", "BACKENDS", "Backend", "register_backend", "cross_entropy",
           "mean_cross_entropy"]

#: Backend name -> class, or its ``"module:Class"`` path (imported on first use): ``functional``, and
#: the device backend (:func:`.rtl.device_backend`) of every device of :data:`wse.sim.devices.DEVICES`.
BACKENDS: dict[str, str | type] = {"functional": "wse.host.runtime.functional:FunctionalBackend",
                                   "functional-torch": "wse.host.runtime.functional_torch:FunctionalTorchBackend",
                                   "functional-torch-cpu": "wse.host.runtime.functional_torch:FunctionalTorchCpuBackend",
                                   "functional-torch-cuda":
                                       "wse.host.runtime.functional_torch:FunctionalTorchCudaBackend",
                                   **{name: device_backend(name) for name in DEVICES}}


#: Registered backends that commands do not offer by name (a run's own, e.g. a mesh behind a defect map).
_UNLISTED: set[str] = set()


def register_backend(name: str, target: str | type, listed: bool = True) -> None:
    """Make a backend available to :class:`Runtime` by name: a :class:`Backend`
    subclass or its ``"module:Class"`` path; ``listed=False`` keeps it out of
    the names that errors offer."""
    BACKENDS[name] = target
    if listed:
        _UNLISTED.discard(name)
    else:
        _UNLISTED.add(name)


def _backend_class(name: str) -> type:
    target = BACKENDS.get(name) if isinstance(name, str) else None
    if target is None:
        raise UsageError(f"backend must be one of {', '.join(sorted(set(BACKENDS) - _UNLISTED))}, not {name!r}")
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
        the label's logit, :func:`~wse.host.runtime.loss.mean_cross_entropy`)
        and rounded to a Python float.
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
        if executable.layout.resident:
            _backend_class(backend)                  # checks the name
            from .pipelined_backend import PipelinedBackend
            self.backend: Backend = PipelinedBackend(executable, backend)
        else:
            self.backend = _backend_class(backend)(executable)
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

    def _check_y(self, y, n: int) -> np.ndarray:
        y = np.asarray(y)
        if y.dtype != np.int64 or y.shape != (n,):
            raise UsageError(f"y must be int64 of shape [{n}], not {y.dtype} of shape {list(y.shape)}")
        if y.size and (y.min() < 0 or y.max() >= self._classes):
            raise UsageError(f"labels y must be in 0..{self._classes - 1}, found {int(y.min())}..{int(y.max())}")
        return y

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

    def _shard_host(self, x, y, n: int, columns: range) -> tuple[HostData, np.ndarray, np.ndarray]:
        """The tokens of ``columns`` as host data (loss deltas scaled by ``1/n``) and
        each column's first token and token count among them."""
        exe = self.executable
        blocks = exe.layout.token_blocks()
        starts = np.array([block.start for block in blocks], dtype=np.int64)
        counts = np.array([len(block) for block in blocks], dtype=np.int64)
        width = len(counts)
        if not isinstance(columns, range) or columns.step != 1 or not 0 <= columns.start <= columns.stop <= width:
            raise UsageError(f"columns must be a range of step 1 within 0..{width} (the executable's token "
                             f"columns), not {columns!r}")
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= exe.batch:
            raise UsageError(f"n must be the global batch's sample count, an integer in 1..{exe.batch}, not {n!r}")
        first = int(starts[columns.start]) if len(columns) else 0
        starts, counts = starts[columns.start:columns.stop] - first, counts[columns.start:columns.stop]
        tokens = int(counts.sum())
        real = max(0, min(tokens, int(n) - first))
        shape = tuple(exe.graph.input.shape)
        x, y = np.asarray(x), np.asarray(y)
        if x.dtype != np.float32 or tuple(x.shape) != (real, *shape):
            raise UsageError(f"x must be float32 of shape {[real, *shape]} (the real samples among the tokens "
                             f"of columns {columns.start}..{columns.stop - 1}), not {x.dtype} of shape "
                             f"{list(x.shape)}")
        if y.dtype != np.int64 or y.shape != (real,):
            raise UsageError(f"y must be int64 of shape [{real}], not {y.dtype} of shape {list(y.shape)}")
        if y.size and (y.min() < 0 or y.max() >= self._classes):
            raise UsageError(f"labels y must be in 0..{self._classes - 1}, found {int(y.min())}..{int(y.max())}")
        xb = np.zeros((tokens, self._features), dtype=np.float32)
        xb[:real] = x.reshape(real, self._features)
        onehot = np.zeros((tokens, self._classes), dtype=np.float32)
        onehot[np.arange(real), y] = 1.0
        scale = np.zeros(tokens, dtype=np.float32)
        scale[:real] = np.float32(1.0) / np.float32(n)
        return HostData(xb, onehot, scale, real), starts, counts

    # -- the API ----------------------------------------------------------
    @property
    def resident(self) -> bool:
        """Whether the parameters and optimizer state stay on the backend between
        steps and the optimizer runs there (the executable's layout says)."""
        return bool(self.executable.layout.resident)

    def write_state(self, weights: Mapping, momentum: Mapping | None = None, steps: int = 0) -> None:
        """Resident layouts: place the parameters (and the momentum buffers of a run
        that has taken ``steps`` > 0 optimizer steps, to continue it bit for bit).

        Raises
        ------
        UsageError
            For a layout that is not resident, or missing or misshapen tensors.
        """
        if not self.resident:
            raise UsageError(f"write_state is for resident layouts; the {self.executable.mode} mode takes the "
                             "weights with every step")
        if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
            raise UsageError(f"steps must be a non-negative integer, not {steps!r}")
        params = self._check_weights(weights)
        buffers = {}
        if momentum:
            given = dict(momentum)
            buffers = self._check_weights({**params, **given})
            buffers = {name: buffers[name] for name in given if name in params}
        self.backend.write_state(params, buffers, int(steps))

    def read_state(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Resident layouts: ``(parameters, momentum buffers)`` by PyTorch name, read
        back from where they live (the buffers empty before the first step)."""
        if not self.resident:
            raise UsageError(f"read_state is for resident layouts; in the {self.executable.mode} mode the "
                             "weights live in MemoryX")
        return self.backend.read_state()

    def begin_phases(self, x, y, weights: Mapping) -> dict:
        """Set up one training step to be run phase by phase on a device backend
        (``self.backend.run_phase(name, weights, grads)`` for each name of
        ``executable.sequences["train"]``): ``x``, ``y`` and ``weights`` are
        checked as :meth:`train_step` checks them, the device is loaded and the
        padded batch copied in. Returns the checked weights.

        Raises
        ------
        UsageError
            For bad arguments, or a backend that runs whole steps only (the
            functional backend, a layer-pipelined executable).
        """
        if not hasattr(self.backend, "run_phase"):
            raise UsageError(f"the {self.executable.mode} executable on the {self.backend_name} backend runs whole "
                             "steps only, not phase by phase")
        x = self._check_x(x)
        host = self._host(x, self._check_y(y, x.shape[0]))
        checked = self._check_weights(weights)
        self.backend.load()
        self.backend._copy_in(host)
        return checked

    def train_step(self, x, y, weights: Mapping | None = None) -> StepResult:
        """One forward and backward pass of the batch ``(x, y)`` with ``weights``.

        With a resident layout the update runs there too: ``weights`` (if
        given) first become the resident parameters, and the result's
        ``grads`` are empty.

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
        y = self._check_y(y, x.shape[0])
        weights = self._weights_of(weights)
        host = self._host(x, y)
        out = self.backend.run("train", host, weights)
        n = host.n
        logits = out.logits[:n]
        loss = mean_cross_entropy(logits, y)
        correct = int(np.count_nonzero(np.argmax(logits, axis=1) == y))
        return StepResult(loss=loss, correct=correct, logits=logits, grads=out.grads,
                          cycles=int(sum(out.cycles.values())), fmac_utilization=self.fmac_utilization(out.cycles),
                          phases=dict(out.cycles))

    def fmac_utilization(self, cycles: Mapping[str, int] | None = None) -> float:
        """FMAC utilization of a training step's streamed GEMMs (see :attr:`StepResult.fmac_utilization`).

        ``cycles`` gives each phase's cycles (a backend's counts); by default
        the executable's static cycle model, which every backend matches.
        """
        exe = self.executable
        streamed = [name for name in exe.sequences["train"] if exe.phases[name].group in exe.layout.gemm_groups]
        fmacs = sum(exe.phases[name].fmacs for name in streamed)
        if cycles is not None:       # a backend's counts, by phase (summed over a phase's runs)
            count = sum(int(cycles.get(name, 0)) for name in dict.fromkeys(streamed))
            runs = {name: 0 for name in streamed}
            for name in cycles:
                if name in runs:
                    runs[name] = round(cycles[name] / exe.phases[name].cycles) if exe.phases[name].cycles else 0
            fmacs = sum(exe.phases[name].fmacs * runs[name] for name in runs)
        else:
            count = sum(int(exe.phases[name].cycles) for name in streamed)
        return float(fmacs / (exe.config.num_pes * count)) if count else 0.0

    @property
    def supports_shards(self) -> bool:
        """Whether the backend runs part of a step (:meth:`train_shard`, the SwarmX hook)."""
        return not self.resident and type(self.backend).run_shard is not Backend.run_shard

    def train_shard(self, x, y, weights: Mapping, *, n: int, columns: range):
        """One system's share of a data-parallel step: the tokens of ``columns`` (the SwarmX hook).

        Parameters
        ----------
        x:
            float32 ``[m, *input_shape]``: the real samples among the tokens of
            ``columns``, in order, ``m = clamp(n - first token, 0, tokens)``
            (the rest of the columns' tokens are padding).
        y:
            int64 labels ``[m]``.
        weights:
            float32 arrays (or tensors) by PyTorch name.
        n:
            Real samples of the whole global batch, ``1 <= n <= batch``: every
            real token's loss delta is scaled by ``float32(1) / float32(n)``,
            padding's by 0.
        columns:
            A ``range`` (step 1) of the executable's token columns
            (``executable.layout.token_blocks()``), possibly empty.

        Returns
        -------
        ShardResult
            ``logits`` float32 ``[m, classes]``; ``grad_partials[name]`` float32
            ``[len(columns), *shape]``, row ``i`` the partial gradient sum of
            column ``columns.start + i`` over its tokens in the fabric's order,
            before the row chain adds the columns; ``cycles``: the fabric
            cycles of the step, ``executable.cycles("train")`` (a system runs
            the compiled program on every column whatever its share, and the
            static cycle model does not depend on data), 0 for no columns.
            For ``columns = range(C)`` and ``n = len(x)``,
            ``wse.host.swarmx.fold_partials`` of each ``grad_partials[name]``
            is :meth:`train_step`'s ``grads[name]`` bit for bit and the
            logits are its logits.

        Raises
        ------
        UsageError
            For inputs of the wrong type, dtype, shape or range, missing
            weights, or a backend other than ``functional``.
        """
        exe = self.executable
        if self.resident:
            raise UsageError(f"train_shard splits a weight-streaming step; the {exe.mode} mode keeps its weights "
                             "on one fabric")
        host, starts, counts = self._shard_host(x, y, n, columns)
        weights = self._check_weights(weights)
        out = self.backend.run_shard(host, weights, starts, counts)
        cycles = exe.cycles("train") if len(columns) else 0
        return ShardResult(np.ascontiguousarray(out.logits[:host.n]), dict(out.grads), int(cycles))

    def _weights_of(self, weights: Mapping | None) -> dict | None:
        if weights is None and self.resident:
            return None
        if weights is None:
            raise UsageError(f"weights are needed: the {self.executable.mode} mode takes them with every step")
        return self._check_weights(weights)

    def forward(self, x, weights: Mapping | None = None) -> np.ndarray:
        """Logits ``float32 [n, classes]`` of ``x`` (evaluation: forward phases only);
        with a resident layout ``weights`` (if given) first become the resident parameters."""
        x = self._check_x(x)
        weights = self._weights_of(weights)
        out = self.backend.run("eval", self._host(x, None), weights)
        return out.logits[:x.shape[0]]
