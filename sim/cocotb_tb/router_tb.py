"""Router testbench: random multi-color multicast traffic with random
backpressure on every port.

One :class:`RouterBench` owns the clock, the reset, a driver per input port,
a monitor per output port, the reference and two checkers:

* a scoreboard fed by the golden router's route table
  (:class:`wse.sim.golden.router.Router`, :meth:`~wse.sim.golden.router.Router.set_route`
  / ``route``): every wavelet a driver hands the router is expected, in
  order, on every output port that the table gives its color; the monitors
  pop those expectations;
* the golden router itself as the cycle-level reference of
  ``docs/architecture.md`` sections 3.3 and 3.4 (per-color FIFOs, ``ready``
  from start-of-cycle counts, grants in rotating order, atomic multicast):
  every cycle, the router's ``ready`` bits and every output port's ``valid``
  and payload must equal it.

Traffic runs in phases: random routes (each color from one random port to a
random set of ports, some colors unrouted), random streams on every routed
color, drivers that send when the color's ``ready`` bit is high (or idle at
random), output ports whose ``ready`` bits are random every cycle. A watchdog
fails the test when nothing leaves the router for a while although
wavelets are expected (a deadlock). The second test flips one bit of one
observed wavelet and expects the scoreboard to fail.

Parameters (environment): ``WSE_COSIM_CONFIG``, ``WSE_COSIM_WAVELETS``
(wavelets to inject, default 100,000), ``WSE_COSIM_SEED``.
"""

from __future__ import annotations

import random
from collections import deque

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import FallingEdge, ReadOnly

from wse.config import ROUTE_INPUT_NONE, Port, pack_wavelet
from wse.hdl.router import encode_route
from wse.sim.golden.router import Router

from .common import config_from_env, env_int

PORTS = len(Port)
WATCHDOG = 2000  # cycles without output while wavelets are expected


class ScoreboardMismatch(AssertionError):
    """An output wavelet that the scoreboard or the reference did not expect."""


class RouterBench:
    """Clock, reset, drivers, monitors, reference and checkers of one router."""

    def __init__(self, dut, seed: int, flip_at: int | None = None):
        self.dut = dut
        self.config = config_from_env().with_mesh(1, 1)
        self.colors = self.config.colors
        self.rng = random.Random(seed)
        self.flip_at = flip_at                       # index of the observed wavelet to corrupt
        self.golden = Router(self.config)            # the reference; its route table feeds the scoreboard
        self.rx = [(getattr(dut, f"rx__{p}__valid"), getattr(dut, f"rx__{p}__payload"),
                    getattr(dut, f"rx__{p}__ready")) for p in range(PORTS)]
        self.tx = [(getattr(dut, f"tx__{p}__valid"), getattr(dut, f"tx__{p}__payload"),
                    getattr(dut, f"tx__{p}__ready")) for p in range(PORTS)]
        # The golden route table, as the drivers and the scoreboard read it.
        self.route_in = [ROUTE_INPUT_NONE] * self.colors
        self.mask = [0] * self.colors
        # Scoreboard: expected wavelets per (output port, color).
        self.expected = [[deque() for _ in range(self.colors)] for _ in range(PORTS)]
        self.pending = 0
        self.cycle = 0
        self.sent = self.delivered = self.observed = 0

    async def setup(self) -> None:
        dut = self.dut
        Clock(dut.clk, 10, unit="ns").start(start_high=False)
        for valid, payload, _ in self.rx:
            valid.value = 0
            payload.value = 0
        for _, _, ready in self.tx:
            ready.value = 0
        dut.first_color.value = 0
        dut.route__we.value = 0
        dut.rst.value = 1
        await FallingEdge(dut.clk)
        await FallingEdge(dut.clk)
        dut.rst.value = 0

    async def program_routes(self) -> None:
        """Random routes through the host port (and into the golden router's table)."""
        dut = self.dut
        for c in range(self.colors):
            if self.rng.random() < 0.2:
                source, outputs = None, []
            else:
                source = self.rng.randrange(PORTS)
                outputs = [p for p in range(PORTS) if p != source and self.rng.random() < 0.35]
                if not outputs:
                    outputs = [self.rng.choice([p for p in range(PORTS) if p != source])]
            self.golden.set_route(c, source, outputs)
            code, ports = self.golden.route(c)
            self.route_in[c] = code
            self.mask[c] = sum(1 << int(p) for p in ports)
            await FallingEdge(dut.clk)
            dut.route__we.value = 1
            dut.route__color.value = c
            dut.route__wdata.value = encode_route(source, outputs)
        await FallingEdge(dut.clk)
        dut.route__we.value = 0

    async def run_phase(self, wavelets: int) -> None:
        """Inject ``wavelets`` on random routed colors and drain them, checking every cycle."""
        streams = {c: deque() for c in range(self.colors) if self.route_in[c] != ROUTE_INPUT_NONE}
        colors = list(streams)
        for _ in range(wavelets):
            streams[self.rng.choice(colors)].append((self.rng.getrandbits(32), int(self.rng.random() < 0.1)))
        by_port = {p: [c for c in colors if self.route_in[c] == p] for p in range(PORTS)}
        quiet = 0
        dut, rng = self.dut, self.rng
        while any(streams.values()) or self.pending:
            await FallingEdge(dut.clk)
            first = self.cycle % self.colors
            dut.first_color.value = first
            # Drivers: one wavelet per input port, of a color whose ready bit is high.
            ready_in = [int(ready.value) for _, _, ready in self.rx]
            self.check_ready(ready_in)
            accepted, offers = [], [None] * PORTS
            for p, (valid, payload, _) in enumerate(self.rx):
                choices = [c for c in by_port[p] if streams[c] and ready_in[p] >> c & 1]
                if choices and rng.random() < 0.85:
                    c = rng.choice(choices)
                    data, ctrl = streams[c].popleft()
                    offers[p] = pack_wavelet(data, c, ctrl)
                    valid.value = 1
                    payload.value = offers[p]
                    accepted.append((c, data, ctrl))
                else:
                    valid.value = 0
            # Backpressure: random ready bits on every output port.
            ready_out = []
            for _, _, ready in self.tx:
                bits = 0 if rng.random() < 0.1 else rng.getrandbits(self.colors) | rng.getrandbits(self.colors)
                ready.value = bits
                ready_out.append(bits)
            await ReadOnly()
            got = [(int(valid.value), int(payload.value)) for valid, payload, _ in self.tx]
            delivered = self.check_outputs(self.golden.step(first, offers, ready_out), got)
            for c, data, ctrl in accepted:
                for p in range(PORTS):
                    if self.mask[c] >> p & 1:
                        self.expected[p][c].append((data, ctrl))
                        self.pending += 1
                self.sent += 1
            quiet = 0 if delivered else quiet + 1
            if quiet > WATCHDOG:
                raise AssertionError(f"deadlock: nothing left the router for {WATCHDOG} cycles with "
                                     f"{self.pending} wavelet(s) expected")
            self.cycle += 1
        await FallingEdge(dut.clk)
        for valid, _, _ in self.rx:
            valid.value = 0

    def check_ready(self, ready_in) -> None:
        """``ready`` on every input port must be the golden router's (route from
        the port and room in the color's FIFO)."""
        for p, expected in enumerate(self.golden.ready()):
            if ready_in[p] != expected:
                raise ScoreboardMismatch(f"cycle {self.cycle}: ready bits of input port {Port(p).name} are "
                                         f"{ready_in[p]:#x}, the reference says {expected:#x}")

    def check_outputs(self, expected, got) -> int:
        """Compare the outputs of this cycle with the golden router's
        (``expected``, one packed wavelet or None per port) and the
        scoreboard. Returns the wavelets delivered."""
        delivered = 0
        for p, (valid, word) in enumerate(got):
            if valid:
                self.observed += 1
                if self.flip_at is not None and self.observed == self.flip_at:
                    word ^= 1 << 5
                color = (word >> 32) & 31
                queue = self.expected[p][color] if color < self.colors else None
                if not queue:
                    raise ScoreboardMismatch(f"cycle {self.cycle}: port {Port(p).name} sent a wavelet of color "
                                             f"{color} that nothing routed there")
                data, ctrl = queue.popleft()
                self.pending -= 1
                if (word & 0xFFFFFFFF, word >> 37 & 1) != (data, ctrl):
                    raise ScoreboardMismatch(
                        f"cycle {self.cycle}: port {Port(p).name} color {color} wavelet #{self.delivered}: got data "
                        f"{word & 0xFFFFFFFF:#010x} ctrl {word >> 37 & 1}, the golden routes expect {data:#010x} "
                        f"ctrl {ctrl}")
                delivered += 1
                self.delivered += 1
            if (word if valid else None) != expected[p]:
                raise ScoreboardMismatch(f"cycle {self.cycle}: port {Port(p).name} sent "
                                         f"{'nothing' if not valid else hex(word)}, the reference grants "
                                         f"{'nothing' if expected[p] is None else hex(expected[p])}")
        return delivered


@cocotb.test()
async def random_traffic(dut):
    """Random routes, streams and backpressure; every cycle checked."""
    bench = RouterBench(dut, env_int("SEED", 1))
    await bench.setup()
    total = env_int("WAVELETS", 100_000)
    per_phase = max(1, total // 10)
    while bench.sent < total:
        await bench.program_routes()
        await bench.run_phase(min(per_phase, total - bench.sent))
    assert bench.pending == 0 and bench.delivered >= bench.sent
    dut._log.info("%d wavelets in, %d copies out, %d cycles", bench.sent, bench.delivered, bench.cycle)


@cocotb.test()
async def checker_catches_a_flipped_bit(dut):
    """One bit of one observed wavelet flipped: the scoreboard must fail."""
    bench = RouterBench(dut, env_int("SEED", 1) + 1, flip_at=500)
    await bench.setup()
    await bench.program_routes()
    try:
        await bench.run_phase(2_000)
    except ScoreboardMismatch as exc:
        dut._log.info("caught: %s", exc)
        assert bench.observed == 500, f"the checker failed at wavelet {bench.observed}, not at the flipped one"
    else:
        raise AssertionError("the scoreboard did not notice a flipped bit")
