"""The layer-pipelined mode on a device and in its functional model.

:class:`PipelinedDevice` drives any device of :mod:`wse.sim.devices` through
the host API with a :class:`~wse.host.compiler.pipelined.PipelinedPlan`:
it loads the program, the routes and the op lists, writes every weight tile
into PE memory once, streams a batch in at the first region's north edge,
runs the phase and reads the logits where the last region's chains end.
:func:`functional_forward` computes the same logits on the host with the
firmware's order of binary32 operations (``pipe.s``; ``docs/layer_pipelined.md``
section 4), bit for bit.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from wse.firmware.training.pipe import T_RUN, pipelined_program
from wse.sim.devices import make_device

__all__ = ["PipelinedDevice", "functional_forward"]


def _ftz(values: np.ndarray) -> np.ndarray:
    """float32 copy with subnormals replaced by zeros of the same sign (the fabric's flushing)."""
    values = np.array(values, dtype=np.float32)
    bits = values.view(np.uint32)
    bits[(bits & 0x7F800000) == 0] &= np.uint32(0x80000000)
    return values


def _layer_forward(region, w: np.ndarray, b: np.ndarray | None, relu: bool, act: np.ndarray) -> np.ndarray:
    """One layer on ``act [batch, k]`` in ``pipe.s``'s order: per output line, each
    input line's partial sum ``P = W[o, k0] x[k0] + W[o, k1] x[k1] + ...`` (one
    rounding per operation), the chain ``y = ((P_0 + P_1) + ...) + b``, then the ReLU."""
    out = np.zeros((act.shape[0], region.o), dtype=np.float32)
    for block in region.out_blocks():
        outs = np.asarray(block)
        y = None
        for ins in region.in_blocks():
            ins = np.asarray(ins)
            wt = w[np.ix_(outs, ins)]
            part = _ftz(act[:, ins[0], None] * wt[None, :, 0])
            for j in range(1, len(ins)):
                part = _ftz(part + _ftz(act[:, ins[j], None] * wt[None, :, j]))
            y = part if y is None else _ftz(y + part)
        if b is not None:
            y = _ftz(y + b[outs][None, :])
        if relu:
            y = np.maximum(y, np.float32(0.0))
            y[y == 0] = np.float32(0.0)     # fmaxs(-0, +0) is +0 on the fabric
        out[:, outs] = y
    return out


def functional_forward(plan, weights: Mapping[str, np.ndarray], x: np.ndarray) -> list[np.ndarray]:
    """Every layer's output ``[batch, o]`` for the batch ``x [batch, features]``
    (the last one the logits), bit for bit as the fabric computes them."""
    act = _ftz(np.asarray(x, dtype=np.float32).reshape(x.shape[0], -1))
    outs = []
    for layer, region in zip(plan.layers, plan.regions):
        b = _ftz(weights[layer.bias]) if layer.bias is not None else None
        act = _layer_forward(region, _ftz(weights[layer.weight]), b, layer.relu, act)
        outs.append(act)
    return outs


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

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """``(logits [batch, classes], cycles)`` of the batch ``x`` through the resident weights."""
        plan = self.plan
        x = np.asarray(x, dtype=np.float32).reshape(plan.batch, -1)
        for edge, index, color, words in plan.input_streams(x):
            self.device.stream_in(edge, index, color, words)
        cycles = self.run_phase("forward")
        logits = np.zeros((plan.batch, plan.layers[-1].o), dtype=np.float32)
        for x0, y0, block in plan.logit_cells():
            words = self.device.memcpy_d2h(plan.addr("ys"), plan.batch * len(block), (x0, y0, 1, 1))[0, 0]
            logits[:, np.asarray(block)] = words.view(np.float32).reshape(plan.batch, len(block))
        return logits, cycles
