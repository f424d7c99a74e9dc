"""The host API through cocotb, inside a simulator running the full RTL mesh.

:class:`CocotbFabric` is an :class:`~.device.RtlFabric` whose primitives are
cocotb coroutines on the ``wse_mesh`` top (:mod:`.rtl`): the host bus, the
edge ports and the run control driven signal by signal as ``docs/rtl.md``
sections 2 and 3 say, Python in every clock cycle. It works in Verilator
and in Icarus alike.

The host API is blocking (``fabric.run()`` returns the cycles), so it is
called from a thread started with :func:`cocotb.task.bridge`; each primitive
runs its coroutine with :func:`cocotb.task.resume`::

    @cocotb.test()
    async def test_gemv(dut):
        fabric = CocotbFabric(dut, config)
        await fabric.setup()
        report = await bridge(run_kernel)("gemv", config, device=lambda cfg: fabric)

Timing: inputs are driven and outputs sampled at the falling edge of the
clock (10 ns period). A host request driven at one falling edge is taken at
the next rising edge and a read answers at the falling edge after it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

import cocotb
from cocotb.clock import Clock
from cocotb.task import resume
from cocotb.triggers import FallingEdge, Timer

from wse.config import FabricConfig

from .device import STATUS_CYCLE_LIMIT, STATUS_IDLE, STATUS_NO_PROGRESS, RtlFabric

__all__ = ["CocotbFabric", "CLOCK_NS"]

#: Clock period of the testbenches.
CLOCK_NS = 10

# Tops that an earlier device (an earlier test of the same simulation) used:
# their memories are no longer all zero.
_USED_TOPS: set[str] = set()


class CocotbFabric(RtlFabric):
    """The host API on the ``wse_mesh`` top under cocotb.

    Parameters
    ----------
    dut:
        The cocotb handle of the ``wse_mesh`` top.
    config:
        The configuration it was built for (its mesh shape included).

    Call :meth:`setup` (a coroutine) once before anything else; call the host
    API from a :func:`cocotb.task.bridge` thread.
    """

    def __init__(self, dut, config: FabricConfig):
        super().__init__(config)
        self.backend = f"cocotb-{cocotb.SIM_NAME.split()[0].lower()}" if cocotb.SIM_NAME else "cocotb"
        self.dut = dut
        self._clock_fall = FallingEdge(dut.clk)
        self._in_valid, self._in_payload, self._in_ready = [], [], []
        self._out_valid, self._out_payload = [], []
        for edge, index in self._ports:
            self._in_valid.append(getattr(dut, f"edge_in_{edge}__{index}__valid"))
            self._in_payload.append(getattr(dut, f"edge_in_{edge}__{index}__payload"))
            self._in_ready.append(getattr(dut, f"edge_in_{edge}__{index}__ready"))
            self._out_valid.append(getattr(dut, f"edge_out_{edge}__{index}__valid"))
            self._out_payload.append(getattr(dut, f"edge_out_{edge}__{index}__payload"))
        n = config.num_pes
        self._state = [getattr(dut, f"probe_state__{i}") for i in range(n)]
        self._tx = [getattr(dut, f"probe_tx__{i}") for i in range(n)]
        self._reg = [getattr(dut, f"probe_reg__{i}") for i in range(n)]
        self._queues = [[deque() for _ in range(config.colors)] for _ in self._ports]
        self._queued_total = 0
        self._outputs: list[list] = [[] for _ in self._ports]
        self._emits: list[list] = [[] for _ in range(n)]
        self._tracing = False
        #: Clock cycles spent in runs and on the host bus (for speed figures).
        self.run_cycles = self.host_cycles = 0

    async def setup(self) -> None:
        """Start the clock, drive every input to its idle value and reset the mesh."""
        dut = self.dut
        Clock(dut.clk, CLOCK_NS, unit="ns").start(start_high=False)
        all_colors = (1 << self.colors) - 1
        for edge, index in self._ports:
            getattr(dut, f"edge_out_{edge}__{index}__ready").value = all_colors
        for signal in self._in_valid:
            signal.value = 0
        for signal in self._in_payload:
            signal.value = 0
        for name in ("start", "edge_pending", "host__stb", "host__we", "host__bcast", "host__space", "host__addr",
                     "host__wdata", "host__x", "host__y", "probe_reg_sel"):
            getattr(dut, name).value = 0
        await self._reset_async()
        if self.dut._path in _USED_TOPS:
            self._dirty[:] = True
        _USED_TOPS.add(self.dut._path)

    async def _reset_async(self) -> None:
        self.dut.rst.value = 1
        for _ in range(2):
            await self._clock_fall
        self.dut.rst.value = 0
        await self._clock_fall

    # ------------------------------------------------------------------ primitives
    def _bus(self, ctl, xy, wdata):
        return resume(self._bus_async)(np.asarray(ctl), np.asarray(xy), np.asarray(wdata))

    async def _bus_async(self, ctl, xy, wdata):
        dut = self.dut
        rdata = np.zeros(len(ctl), dtype=np.uint32)
        reading = None
        for i, (c, where, data) in enumerate(zip(ctl.tolist(), xy.tolist(), wdata.tolist())):
            await self._clock_fall
            if reading is not None:
                rdata[reading] = int(dut.host__rdata.value)
            we = (c >> 19) & 1
            dut.host__stb.value = 1
            dut.host__we.value = we
            dut.host__bcast.value = (c >> 20) & 1
            dut.host__space.value = (c >> 16) & 7
            dut.host__addr.value = c & 0xFFFF
            dut.host__wdata.value = data
            dut.host__x.value = where & 0xFF
            dut.host__y.value = (where >> 8) & 0xFF
            reading = None if we else i
        await self._clock_fall
        if reading is not None:
            rdata[reading] = int(dut.host__rdata.value)
        dut.host__stb.value = 0
        self.host_cycles += len(ctl) + 1
        return rdata

    def _inject(self, port, color, data, ctrl):
        queue = self._queues[port][color]
        for word, flag in zip(data.tolist(), ctrl.tolist()):
            queue.append(word | color << 32 | flag << 37)
        self._queued_total += len(data)

    def _queued(self, port, color):
        return len(self._queues[port][color])

    def _execute(self, max_cycles, window):
        return resume(self._execute_async)(max_cycles, window)

    async def _execute_async(self, max_cycles, window):
        dut, colors, fall = self.dut, self.colors, self._clock_fall
        await fall
        dut.start.value = 1
        await fall
        dut.start.value = 0
        self.host_cycles += 1
        active = [port for port, queues in enumerate(self._queues) if any(queues)]
        driven: set[int] = set()
        t = quiet = 0
        status = STATUS_IDLE
        while True:
            # A falling edge inside run cycle t (running rose at the rising edge before it).
            if not int(dut.running.value):
                break
            if t >= max_cycles:
                status = STATUS_CYCLE_LIMIT
                break
            dut.edge_pending.value = int(self._queued_total > 0)
            injected = False
            first = t % colors
            for port in active:
                queues = self._queues[port]
                ready = int(self._in_ready[port].value)
                chosen = None
                for k in range(colors):
                    c = (first + k) % colors
                    if queues[c] and (ready >> c) & 1:
                        chosen = queues[c].popleft()
                        break
                if chosen is not None:
                    self._in_valid[port].value = 1
                    self._in_payload[port].value = chosen
                    driven.add(port)
                    self._queued_total -= 1
                    injected = True
                elif port in driven:
                    self._in_valid[port].value = 0
                    driven.discard(port)
            if not injected:
                active = [port for port in active if port in driven or any(self._queues[port])]
            for port, valid in enumerate(self._out_valid):
                if int(valid.value):
                    self._outputs[port].append((int(self._out_payload[port].value), t))
            if self._tracing and int(dut.probe_emit.value):
                for tile, state in enumerate(self._state):
                    if int(state.value) & 1:
                        self._emits[tile].append((int(self._tx[tile].value), t))
            quiet = 0 if injected or int(dut.probe_progress.value) else quiet + 1
            if window and quiet >= window:
                status = STATUS_NO_PROGRESS
                break
            t += 1
            await fall
        for port in driven:
            self._in_valid[port].value = 0
        dut.edge_pending.value = 0
        self.run_cycles += t + 1
        return status, int(dut.cycle.value)

    def _drain(self):
        for port, records in enumerate(self._outputs):
            if records:
                self._outputs[port] = []
                yield port, np.array([w for w, _ in records], dtype=np.uint64), np.array([c for _, c in records])

    def _run_hops(self):
        return resume(self._read_async)(self.dut.hops)

    async def _read_async(self, signal):
        return int(signal.value)

    def _tile_state(self, tile):
        return resume(self._read_async)(self._state[tile])

    def _registers(self, tile):
        return resume(self._registers_async)(tile)

    async def _registers_async(self, tile):
        values = []
        for r in range(16):
            self.dut.probe_reg_sel.value = r
            await Timer(1, unit="ns")
            values.append(int(self._reg[tile].value))
        return values

    def _take_emits(self, tile):
        records, self._emits[tile] = self._emits[tile], []
        return np.array([w for w, _ in records], dtype=np.uint64), np.array([c for _, c in records], dtype=np.uint64)

    def _trace(self, on):
        self._tracing = on

    def stats(self) -> dict:
        """``run_cycles`` and ``host_cycles``: clock cycles simulated in runs
        and on the host bus so far."""
        return {"run_cycles": self.run_cycles, "host_cycles": self.host_cycles}

    def _reset_hardware(self):
        resume(self._reset_async)()
        for queues in self._queues:
            for queue in queues:
                queue.clear()
        self._queued_total = 0
        self._outputs = [[] for _ in self._ports]
        self._emits = [[] for _ in range(self.config.num_pes)]
