"""A backend for any device that implements the fabric host API
(``docs/architecture.md`` section 5): the golden model now, RTL simulators later.

Per phase the driver writes the phase's op-list address into the program's
``phase_ops`` word, queues the phase's weight streams
(:class:`~wse.host.compiler.schedule.StreamIn`), launches ``T_RUN``, runs the
fabric until it is idle and collects the gradient streams
(:class:`~wse.host.compiler.schedule.StreamOut`). Per step it copies the
batch in (and the labels' one-hot and scale) and the logits out through the
index maps of the executable that its layout names
(:attr:`~wse.host.compiler.layouts.Layout.host_inputs`,
:attr:`~wse.host.compiler.layouts.Layout.host_output`).
"""

from __future__ import annotations

import abc
from typing import Mapping

import numpy as np

from wse.firmware.training import T_RUN

from .backend import Backend, HostData, RunResult, pool_of

__all__ = ["DeviceBackend"]


def _gather(values: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``values.ravel()[index]`` as uint32 bits, 0 where ``index`` is -1."""
    flat = np.ascontiguousarray(values, dtype=np.float32).ravel().view(np.uint32)
    out = np.zeros(index.shape, dtype=np.uint32)
    used = index >= 0
    out[used] = flat[index[used]]
    return out


class DeviceBackend(Backend):
    """Drives a host-API device; subclasses implement :meth:`make_device`."""

    def __init__(self, executable):
        super().__init__(executable)
        self.device = None
        self.phase_word = executable.program.symbol("phase_ops")

    @abc.abstractmethod
    def make_device(self, config):
        """A fresh device for ``config`` implementing the host API."""

    def load(self) -> None:
        """Create the device and load the program, routes and op lists."""
        exe = self.executable
        device = self.make_device(exe.config)
        device.load(exe.program)
        device.load_routes(exe.routes)
        for addr, image in exe.static:
            device.memcpy_h2d(int(addr), image)
        self.device = device

    def _copy_in(self, host: HostData) -> None:
        """Copy the step's host data in through the transfers the layout names."""
        for name, field in self.executable.layout.host_inputs.items():
            addr, index = self.executable.transfers[name]
            self.device.memcpy_h2d(int(addr), _gather(getattr(host, field), index))

    def _logits(self) -> np.ndarray:
        exe = self.executable
        addr, index = exe.transfers[exe.layout.host_output]
        words = self.device.memcpy_d2h(int(addr), index.shape[2])
        classes = exe.graph.layers[-1].classes
        flat = np.zeros(exe.batch * classes, dtype=np.uint32)
        used = index >= 0
        flat[index[used]] = words[used]
        return flat.view(np.float32).reshape(exe.batch, classes)

    def run_phase(self, name: str, weights: Mapping[str, np.ndarray], grads: dict) -> int:
        """Run one phase; gradient streams are scattered into ``grads``; returns its cycles."""
        phase = self.executable.phases[name]
        device = self.device
        device.memcpy_h2d(self.phase_word, np.array([phase.ops_addr], dtype=np.uint32))
        for stream in phase.streams_in:
            pool = pool_of(weights, stream.tensors)
            if stream.words is not None:        # a sparse stream's index words and carriage returns
                pool = np.concatenate([pool, stream.words.astype(np.uint32)])
            device.stream_in(stream.edge, stream.index, stream.color, pool[stream.gather], stream.ctrl)
        device.launch(T_RUN)
        cycles = device.run()
        for stream in phase.streams_out:
            data = device.stream_out(stream.edge, stream.index, stream.color)
            if data.size != stream.scatter.size:
                raise RuntimeError(f"phase {name}: {data.size} gradient words left row {stream.index}, "
                                   f"expected {stream.scatter.size}")
            key = tuple(stream.tensors)
            if key not in grads:
                size = sum(int(np.prod(self.executable.parameters()[t])) for t in key)
                grads[key] = np.zeros(size, dtype=np.uint32)
            grads[key][stream.scatter] = data
        return int(cycles)

    def run(self, sequence: str, host: HostData, weights: Mapping[str, np.ndarray]) -> RunResult:
        if self.device is None:
            self.load()
        self._copy_in(host)
        pools: dict = {}
        cycles = {}
        for name in self.executable.sequences[sequence]:
            cycles[name] = self.run_phase(name, weights, pools)
        shapes = self.executable.parameters()
        grads = {}
        for key, bits in pools.items():
            values, at = bits.view(np.float32), 0
            for tensor in key:
                size = int(np.prod(shapes[tensor]))
                grads[tensor] = values[at:at + size].reshape(shapes[tensor]).copy()
                at += size
        return RunResult(self._logits(), grads, cycles)
