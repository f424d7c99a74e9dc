"""The layer-pipelined mode on a device and in its functional model.

:class:`PipelinedDevice` drives any device of :mod:`wse.sim.devices` through
the host API with a :class:`~wse.host.compiler.pipelined.PipelinedPlan`:
it loads the program, the routes and the op lists, writes every weight tile
into PE memory once, streams a batch in at the first region's north edge,
runs the phase and reads the logits where the last region's chains end; a
training step then writes the loss delta where the logits were, runs the
backward phase and the optimizer's update on the PEs, and the weights stay
there (:meth:`PipelinedDevice.read_state` reads them back for checkpoints).
:func:`functional_forward`, :func:`functional_backward` and
:func:`functional_update` compute the same on the host with the firmware's
order of binary32 operations (``pipe.s``; ``docs/layer_pipelined.md``
section 4), bit for bit; :class:`PipelinedFunctional` is the functional
model's training step.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from wse.firmware.training.pipe import T_RUN, pipelined_program
from wse.host.compiler.pipelined_reduce import reduce_sum
from wse.sim.devices import make_device

from . import pipelined_kernels as pk
from .kernels import relu_mask, softmax_delta
from .loss import mean_cross_entropy

__all__ = ["PipelinedDevice", "PipelinedFunctional", "functional_forward", "functional_backward",
           "functional_update", "loss_delta", "passes"]


def _ftz(values: np.ndarray) -> np.ndarray:
    """float32 copy with subnormals replaced by zeros of the same sign (the fabric's flushing)."""
    values = np.array(values, dtype=np.float32)
    bits = values.view(np.uint32)
    bits[(bits & 0x7F800000) == 0] &= np.uint32(0x80000000)
    return values


def _flushed(values) -> np.ndarray:
    """``values`` as float32 with subnormals flushed: the array itself when it holds none (no copy)."""
    values = np.asarray(values, dtype=np.float32)
    return _ftz(values) if pk.has_subnormal(values) else values


def functional_forward(plan, weights: Mapping[str, np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """Every layer's output ``[batch, o]`` for the batch ``x [batch, features]``
    (the last one the logits), bit for bit as the fabric computes them (a layer
    that harvests sparsity adds only its nonzero inputs' products, from +0)."""
    act = _flushed(np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1))
    outs = []
    harvest = getattr(plan, "harvest", ()) or (False,) * len(plan.layers)
    for layer, region, sparse in zip(plan.layers, plan.regions, harvest):
        b = _flushed(weights[layer.bias]) if layer.bias is not None else None
        act = pk.forward(region, _flushed(weights[layer.weight]), b, layer.relu, act, sparse)
        outs.append(act)
    return outs


def _mask(dy: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """``mul(mul(dy, max(mul(ys, -2^127), -1)), -1)``: ``dy`` where ``ys > 0``, a zero where ``ys == +0``."""
    return relu_mask(ys, dy)


def loss_delta(plan, logits: np.ndarray, y: np.ndarray, real: int, n: int) -> np.ndarray:
    """The softmax cross-entropy delta ``[batch, classes]`` of one pass's ``logits``
    for labels ``y`` of its first ``real`` samples (the rest padding), scaled by
    ``1/n`` for a batch of ``n`` samples, in the order of
    :func:`wse.firmware.training.numerics.softmax_delta` (its compiled loop,
    :func:`wse.host.runtime.kernels.softmax_delta`); through the ReLU mask if
    the model ends in one. The host computes it and writes it where the logits were."""
    batch, classes = logits.shape
    onehot = np.zeros((classes, batch), dtype=np.float32)
    onehot[np.asarray(y[:real]), np.arange(real)] = 1.0
    scale = np.zeros(batch, dtype=np.float32)
    scale[:real] = np.float32(1.0) / np.float32(n)
    delta = np.ascontiguousarray(softmax_delta(np.ascontiguousarray(logits.T), onehot, scale).T)
    return _mask(delta, logits) if plan.layers[-1].relu else delta


def functional_backward(plan, weights: Mapping[str, np.ndarray], x: np.ndarray, outs: list[np.ndarray],
                        delta: np.ndarray, grads: dict | None = None) -> dict[str, np.ndarray]:
    """The weight and bias gradients after one pass, bit for bit as ``pbwd`` leaves
    them in PE memory: ``x`` the pass's samples, ``outs`` :func:`functional_forward`'s
    outputs, ``delta`` :func:`loss_delta`'s, ``grads`` those of the batch's earlier
    passes (None: the first pass, from +0). Per layer, from the last:

    * ``dz`` = the delta (last layer), else the masked input gradient of the next layer;
    * ``db[o] = +0 + dz[0][o] + dz[1][o] + ...`` and
      ``dW[o, k] = +0 + dz[0][o]*x[0][k] + dz[1][o]*x[1][k] + ...`` over the samples in order;
    * the input gradient: per output line ``p``, ``D_p[k] = +0 + W[o0, k] dz[o0] + W[o1, k] dz[o1] + ...``
      over the line's outputs, then ``dx = ((D_{n-1} + D_{n-2}) + ...) + D_0``.
    """
    acts = [_flushed(np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1))] + list(outs[:-1])
    before = grads or {}
    grads = {}
    dz = np.asarray(delta, dtype=np.float32)
    for l in range(len(plan.layers) - 1, -1, -1):
        layer, region = plan.layers[l], plan.regions[l]
        if l < len(plan.layers) - 1 and layer.relu:
            dz = _mask(dz, outs[l])
        xin = acts[l]
        g = np.array(before[layer.weight], dtype=np.float32) if layer.weight in before else \
            np.zeros((region.o, region.k), dtype=np.float32)
        db = np.array(before[layer.bias], dtype=np.float32) if layer.bias in before else \
            np.zeros(region.o, dtype=np.float32)
        pk.weight_gradients(dz, xin, g, db)
        grads[layer.weight] = g
        if layer.bias is not None:
            grads[layer.bias] = db
        if l:
            dz = pk.input_gradient(region, _flushed(weights[layer.weight]), dz)
    return grads


def functional_update(plan, params: dict, grads: Mapping[str, np.ndarray], state: dict, first: bool) -> None:
    """The optimizer's step on ``params`` (name -> float32 array, changed in place)
    with ``grads``, as ``pupd`` computes it; ``state`` holds the momentum
    buffers by parameter name (filled on the ``first`` step)."""
    h = plan.optimizer.hyper
    for name, w in params.items():
        buf = pk.sgd_update(w, grads[name], state.get(name), h, first)
        if buf is not None:
            state[name] = buf


class PipelinedFunctional:
    """The functional model of layer-pipelined training: the parameters and the
    momentum buffers on the host, each step computed as the fabric computes it.

    Parameters
    ----------
    plan:
        A training plan (with an optimizer).
    weights:
        Initial parameters by name.
    """

    def __init__(self, plan, weights: Mapping[str, np.ndarray]):
        self.plan = plan
        self.params = {name: _ftz(np.asarray(weights[name], dtype=np.float32)) for name in _param_names(plan)}
        self.state: dict[str, np.ndarray] = {}
        self.steps = 0

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """One batch of ``n`` samples ``x [n, ...]``, labels ``y [n]``: ``(loss,
        logits [n, classes])``; the parameters are updated. With replicas, each
        copy's gradients accumulate over its shard of every pass, from +0, and
        the update takes their sum in copy order (:func:`~wse.host.compiler.pipelined_reduce.reduce_sum`)."""
        grads, logits = [None] * self.plan.replicas, []
        for xb, yb, real, n in passes(self.plan, x, y):
            outs = functional_forward(self.plan, self.params, xb)
            delta = loss_delta(self.plan, outs[-1], yb, real, n)
            for r, (_, s) in enumerate(self.plan.copies()):
                grads[r] = functional_backward(self.plan, self.params, xb[s.start:s.stop],
                                               [o[s.start:s.stop] for o in outs], delta[s.start:s.stop], grads[r])
            logits.append(outs[-1][:real])
        grads = reduce_sum(grads) if len(grads) > 1 else grads[0]
        functional_update(self.plan, self.params, grads, self.state, self.steps == 0)
        self.steps += 1
        logits = np.concatenate(logits)
        return mean_cross_entropy(logits, np.asarray(y)), logits


def passes(plan, x: np.ndarray, y: np.ndarray):
    """``(x [batch, features], y [batch], real, n)`` of each pass of a batch of
    ``n`` samples: ``plan.batch`` samples at a time, the last pass padded with zeros."""
    y = np.asarray(y)
    n = len(y)
    x = np.asarray(x, dtype=np.float32).reshape(n, -1)
    for start in range(0, n, plan.batch):
        real = min(plan.batch, n - start)
        xb = np.zeros((plan.batch, x.shape[1]), dtype=np.float32)
        yb = np.zeros(plan.batch, dtype=np.int64)
        xb[:real], yb[:real] = x[start:start + real], y[start:start + real]
        yield xb, yb, real, n


def _param_names(plan) -> list[str]:
    names = []
    for layer in plan.layers:
        names += [layer.weight] + ([layer.bias] if layer.bias is not None else [])
    return names


class PipelinedDevice:
    """A device running a layer-pipelined plan (see the module docstring).

    Parameters
    ----------
    plan:
        From :func:`wse.host.compiler.pipelined.plan`.
    device:
        A name of :data:`wse.sim.devices.DEVICES` (``"golden"``, ...).
    """

    def __init__(self, plan, device: str = "golden"):
        self.plan = plan
        self.program = pipelined_program(plan.config)
        self.device = make_device(device, plan.config)
        self.device.load(self.program)
        self.device.load_routes(plan.routes)
        self.steps = 0
        cfg = plan.config
        for name, (addr, records) in plan.phases.items():
            image = np.zeros((cfg.height, cfg.width, plan.memory[f"ops:{name}"][1]), dtype=np.uint32)
            for y, row in enumerate(records):
                for x, ops in enumerate(row):
                    if ops:
                        flat = np.concatenate(ops)
                        image[y, x, :flat.size] = flat
            self.device.memcpy_h2d(addr, image)

    def write_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Place every weight tile and bias in PE memory (once; they stay there)."""
        for x, y, addr, words in self.plan.weight_tiles(weights):
            self.device.memcpy_h2d(addr, words[None, None, :], (x, y, 1, 1))

    def run_phase(self, name: str) -> int:
        """Run phase ``name`` (its streams queued beforehand); returns its cycles."""
        addr, _ = self.plan.phases[name]
        self.device.memcpy_h2d(self.program.symbol("phase_ops"), np.array([addr], dtype=np.uint32))
        self.device.launch(T_RUN)
        return int(self.device.run())

    def _read(self, x: int, y: int, addr: int, words: int) -> np.ndarray:
        return self.device.memcpy_d2h(addr, words, (x, y, 1, 1))[0, 0]

    def write_state(self, state: Mapping[str, np.ndarray]) -> None:
        """Place the momentum buffers (by parameter name) in PE memory, for a resumed run."""
        for x, y, addr, words in self.plan.weight_tiles(state, "m", "mb"):
            self.device.memcpy_h2d(addr, words[None, None, :], (x, y, 1, 1))
        self.steps = max(self.steps, 1)

    def read_state(self, replica: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(parameters, momentum buffers)`` by name, read back from the PE memory of
        copy ``replica`` of the pipeline (the buffers empty before the first step or
        without momentum; every copy holds the same after a step)."""
        params = self.plan.read_tiles(self._read, replica=replica)
        has_buffers = "m" in self.plan.memory and self.steps
        return params, self.plan.read_tiles(self._read, "m", "mb", replica) if has_buffers else {}

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """``(logits [batch, classes], cycles)`` of the batch ``x`` through the resident weights
        (with replicas, each copy of the pipeline takes its shard of the batch at once)."""
        plan = self.plan
        x = np.asarray(x, dtype=np.float32).reshape(plan.batch, -1)
        for edge, index, color, words in plan.input_streams(x):
            self.device.stream_in(edge, index, color, words)
        cycles = self.run_phase("forward")
        logits = np.zeros((plan.batch, plan.layers[-1].o), dtype=np.float32)
        for x0, y0, block, samples in plan.output_cells():
            words = self._read(x0, y0, plan.addr("ys"), len(samples) * len(block))
            logits[samples.start:samples.stop, np.asarray(block)] = \
                words.view(np.float32).reshape(len(samples), len(block))
        return logits, cycles

    def train_step(self, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, dict]:
        """One batch of ``n`` samples on the fabric: ``(loss, logits [n, classes],
        cycles by phase, summed over the passes)``. Per pass of ``plan.batch``
        samples: the forward phase, the loss delta (:func:`loss_delta`) written
        where the logits were, the backward phase; then the update
        (``update_first`` on the first step of a run with momentum). The
        parameters stay in PE memory."""
        plan = self.plan
        cycles: dict[str, int] = {}
        logits = []
        for i, (xb, yb, real, n) in enumerate(passes(plan, x, y)):
            out, c = self.forward(xb)
            cycles["forward"] = cycles.get("forward", 0) + c
            delta = loss_delta(plan, out, yb, real, n)
            for x0, y0, block, s in plan.output_cells():
                words = np.ascontiguousarray(delta[s.start:s.stop, np.asarray(block)]).ravel().view(np.uint32)
                self.device.memcpy_h2d(plan.addr("ys"), words[None, None, :], (x0, y0, 1, 1))
            for name in plan.sequences["first_pass" if i == 0 else "pass"][1:]:
                cycles[name] = cycles.get(name, 0) + self.run_phase(name)
            logits.append(out[:real])
        for name in plan.sequences["first_update" if self.steps == 0 else "update"]:
            cycles[name] = self.run_phase(name)
        self.steps += 1
        logits = np.concatenate(logits)
        return mean_cross_entropy(logits, np.asarray(y)), logits, cycles
