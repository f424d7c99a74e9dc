"""The mesh RTL (wse.hdl.fabric) against the golden fabric model.

Streams enter at edge ports, follow unicast and multicast routes through a
2x2 mesh and leave at other edge ports; the RTL must deliver the same
wavelets in the same order per port and color, and its cycle counter and hop
counter must equal the golden model's ``run()`` result and ``wavelet_hops``.
A pipeline of real PEs (``wse.hdl.pe.PE``) must also match every per-PE
counter, loaded through broadcast host writes. A stand-in PE (a one-wavelet
echo buffer) exercises the RAMP links, the host bus (route and CTRL reads,
tile select, read timing) and the run control on its own. Last, the
exported Verilog must lint clean.
"""

import random
import re
from collections import deque

import pytest
from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import Out
from amaranth.sim import Simulator

from wse.config import FabricConfig, Port
from wse.hdl.fabric import EDGES, Fabric
from wse.hdl.router import encode_route
from wse.hdl.tile import Tile, pe_signature
from wse.hdl.wavelet import HostSpace
from wse.sim.golden import Fabric as GoldenFabric


class EchoPE(wiring.Component):
    """Stand-in PE: holds one wavelet; sends it back on the next color.

    A CTRL write to address 0 loads ``(wdata, color 0)`` as if a task sent it
    (a launch); nothing leaves while ``enable`` is low. CTRL reads: address 1 = wavelets received, others = a marker
    with the tile's address bits, so reads prove the select and the timing.
    """

    def __init__(self, config):
        self._config = config
        super().__init__(pe_signature(config))

    def elaborate(self, platform):
        m = Module()
        colors = self._config.colors
        full = Signal()
        data = Signal(32)
        color = Signal(5)
        ctrl = Signal()
        received = Signal(32)
        m.d.comb += [
            self.rx.ready.eq(Mux(full, 0, (1 << colors) - 1)),
            self.tx.valid.eq(self.enable & full & (self.tx.ready >> color)[0]),
            self.tx.payload.data.eq(data),
            self.tx.payload.color.eq(color),
            self.tx.payload.ctrl.eq(ctrl),
            self.idle.eq(~full),
        ]
        with m.If(self.tx.valid):
            m.d.sync += full.eq(0)
        with m.If(self.rx.valid):
            m.d.sync += [full.eq(1), data.eq(self.rx.payload.data), ctrl.eq(self.rx.payload.ctrl),
                         color.eq((self.rx.payload.color + 1) % colors), received.eq(received + 1)]
        host = self.host
        with m.If(host.stb & host.sel):
            with m.If(host.we & (host.space == HostSpace.CTRL) & (host.addr == 0)):
                m.d.sync += [full.eq(1), data.eq(host.wdata), color.eq(0), ctrl.eq(0)]
            with m.If(~host.we):
                m.d.sync += host.rdata.eq(Mux(host.addr == 1, received, 0xC0DE0000 | host.addr))
        return m


class MeshBench:
    """Drives a :class:`Fabric` in Amaranth's simulator through its host bus and edges."""

    def __init__(self, config, pe=EchoPE):
        self.config = config
        self.dut = Fabric(config, pe=pe)
        self.out = []  # (run cycle, edge, index, data, color, ctrl)

    async def request(self, ctx, space, addr, x=0, y=0, wdata=0, we=0, bcast=0):
        host = self.dut.host
        for name, value in dict(stb=1, we=we, bcast=bcast, space=space, addr=addr, wdata=wdata, x=x, y=y).items():
            ctx.set(getattr(host, name), value)
        await ctx.tick()
        ctx.set(host.stb, 0)
        return ctx.get(host.rdata)

    async def set_routes(self, ctx, routes):
        """``routes``: {(x, y, color): (input, [outputs])}."""
        for (x, y, color), (inp, outs) in routes.items():
            await self.request(ctx, HostSpace.ROUTE, color, x, y, encode_route(inp, outs), we=1)

    async def run(self, ctx, streams, max_cycles=2000):
        """Start a run, inject ``streams`` {(edge, index): [(data, color, ctrl)]}
        as the host of spec 3.6 does (one queue per color, the first ready
        color in rotating order), collect every edge output; returns the
        cycle counter at the end."""
        dut, colors = self.dut, self.config.colors
        queues = {}
        for key, words in streams.items():
            for data, color, ctrl in words:
                queues.setdefault(key, {}).setdefault(color, deque()).append((data, ctrl))
        for edge in EDGES:
            for link in dut.edge_out(edge):
                ctx.set(link.ready, (1 << colors) - 1)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        t = 0
        while ctx.get(dut.running):
            assert t < max_cycles, "the mesh did not become idle"
            assert ctx.get(dut.cycle) == t
            ctx.set(dut.edge_pending, any(q for port in queues.values() for q in port.values()))
            for (edge, index), port in queues.items():
                link = dut.edge_in(edge)[index]
                ready = ctx.get(link.ready)
                order = sorted((c for c, q in port.items() if q and ready >> c & 1), key=lambda c: (c - t) % colors)
                ctx.set(link.valid, bool(order))
                if order:
                    data, ctrl = port[order[0]].popleft()
                    ctx.set(link.payload.as_value(), data | order[0] << 32 | ctrl << 37)
            for edge in EDGES:
                for index, link in enumerate(dut.edge_out(edge)):
                    if ctx.get(link.valid):
                        word = ctx.get(link.payload.as_value())
                        self.out.append((t, edge, index, word & 0xFFFFFFFF, word >> 32 & 31, word >> 37))
            await ctx.tick()
            t += 1
        for edge, index in queues:
            ctx.set(dut.edge_in(edge)[index].valid, 0)
        ctx.set(dut.edge_pending, 0)
        return ctx.get(dut.cycle)

    def simulate(self, testbench):
        sim = Simulator(self.dut)
        sim.add_clock(1e-6)
        sim.add_testbench(testbench)
        sim.run()

    def collected(self):
        """{(edge, index, color): [(data, ctrl)]} in arrival order."""
        got = {}
        for _, edge, index, data, color, ctrl in self.out:
            got.setdefault((edge, index, color), []).append((data, ctrl))
        return got


def golden_run(config, routes, streams):
    """Cycles, hops and outputs of the golden model for the same routes and streams."""
    fab = GoldenFabric(config)
    for (x, y, color), (inp, outs) in routes.items():
        fab.set_route(x, y, color, inp, outs)
    for (edge, index), words in streams.items():
        for data, color, ctrl in words:
            fab.stream_in(edge, index, color, [data], ctrl=[ctrl])
    cycles = fab.run(max_cycles=10_000)
    got = {}
    for key, count in fab.pending_out().items():
        edge, index, color = key
        data, ctrl = fab.stream_out(edge, index, color, with_ctrl=True)
        got[key] = [(int(d), int(c)) for d, c in zip(data, ctrl)]
    return cycles, fab.counters()["wavelet_hops"], got


def random_routes(rng, W, H, colors):
    """Edge-to-edge multicast trees, one per color: {(x, y, c): (input, outputs)} and the source port."""
    routes, sources = {}, {}
    for c in colors:
        edge = rng.choice(EDGES)
        index = rng.randrange(W if edge in "NS" else H)
        start = {"N": (index, 0), "S": (index, H - 1), "W": (0, index), "E": (W - 1, index)}[edge]
        tree = {start: Port[edge]}
        frontier = [start]
        while frontier:
            x, y = frontier.pop(rng.randrange(len(frontier)))
            outs, edges = [], []
            for port in (Port.N, Port.E, Port.S, Port.W):
                if port == tree[(x, y)]:
                    continue
                nx, ny = x + port.delta[0], y + port.delta[1]
                if not (0 <= nx < W and 0 <= ny < H):
                    edges.append(port)
                    if rng.random() < 0.4:
                        outs.append(port)
                elif (nx, ny) not in tree and rng.random() < 0.6:
                    tree[(nx, ny)] = port.opposite
                    outs.append(port)
                    frontier.append((nx, ny))
            if not outs:
                outs.append(rng.choice(edges))
            routes[(x, y, c)] = (tree[(x, y)], outs)
        sources[c] = (edge, index)
    return routes, sources


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_edge_streams_match_golden(seed):
    rng = random.Random(seed)
    config = FabricConfig(width=2, height=2, colors=6, router_depth=rng.choice([1, 2]))
    colors = rng.sample(range(config.colors), 4)
    routes, sources = random_routes(rng, 2, 2, colors)
    streams = {}
    for c in colors:
        streams.setdefault(sources[c], []).extend(
            (rng.getrandbits(32), c, int(rng.random() < 0.2)) for _ in range(rng.randint(3, 12)))
    for key in streams:  # interleave the colors that share an edge port
        rng.shuffle(streams[key])
    g_cycles, g_hops, g_out = golden_run(config, routes, streams)
    bench = MeshBench(config)
    result = {}

    async def testbench(ctx):
        await bench.set_routes(ctx, routes)
        result["cycles"] = await bench.run(ctx, streams)
        result["hops"] = ctx.get(bench.dut.hops)

    bench.simulate(testbench)
    assert bench.collected() == g_out
    assert result["cycles"] == g_cycles
    assert result["hops"] == g_hops
    assert g_cycles > 0 and len(g_out) >= len(colors)


def test_directed_path_and_multicast_cycles():
    """Color 1 enters at W0, crosses (0,0) -> (1,0) and leaves E0 and, by a
    multicast at (1,0), through (1,1) to S1. One hop a cycle: injected in
    run cycle 0, a wavelet is granted by (0,0) in 1, leaves E0 in 2 and S1 in 3."""
    config = FabricConfig(width=2, height=2, colors=4)
    routes = {(0, 0, 1): (Port.W, [Port.E]), (1, 0, 1): (Port.W, [Port.E, Port.S]), (1, 1, 1): (Port.N, [Port.S])}
    streams = {("W", 0): [(i, 1, 0) for i in range(5)]}
    bench = MeshBench(config)
    result = {}

    async def testbench(ctx):
        await bench.set_routes(ctx, routes)
        result["cycles"] = await bench.run(ctx, streams)

    bench.simulate(testbench)
    assert [(t, e, d) for t, e, _, d, _, _ in bench.out if e == "E"] == [(2 + i, "E", i) for i in range(5)]
    assert [(t, e, d) for t, e, _, d, _, _ in bench.out if e == "S"] == [(3 + i, "S", i) for i in range(5)]
    assert result["cycles"] == 8 == golden_run(config, routes, streams)[0]


def test_host_bus_ramp_and_launch():
    """Route read-back and CTRL reads reach the addressed tile only and answer
    in the next cycle; launches written before ``start`` wait for the run;
    the RAMP links carry wavelets to and from the PE."""
    config = FabricConfig(width=2, height=2, colors=4)
    bench = MeshBench(config)
    dut = bench.dut
    # Color 0 (launch output) at (1,0): RAMP -> E. Color 2 enters W1 at (0,1),
    # goes to its PE, comes back as color 3 and leaves by W.
    routes = {(1, 0, 0): (Port.RAMP, [Port.E]), (0, 1, 2): (Port.W, [Port.RAMP]), (0, 1, 3): (Port.RAMP, [Port.W]),
              (0, 0, 0): (Port.RAMP, [Port.N])}
    result = {}

    async def testbench(ctx):
        await bench.set_routes(ctx, routes)
        for (x, y, c), route in routes.items():
            assert await bench.request(ctx, HostSpace.ROUTE, c, x, y) == encode_route(*route)
        assert await bench.request(ctx, HostSpace.ROUTE, 1, 1, 0) == 7  # never written: not routed
        assert await bench.request(ctx, HostSpace.CTRL, 5, 1, 1) == 0xC0DE0005
        assert await bench.request(ctx, HostSpace.CTRL, 5, 2, 0) == 0  # no tile (2, 0)
        # Launch at (1,0), then wait: nothing may move before the run starts.
        await bench.request(ctx, HostSpace.CTRL, 0, 1, 0, wdata=0xAAAA, we=1)
        for _ in range(3):
            await ctx.tick()
        assert not ctx.get(dut.edge_out_E[0].valid) and not ctx.get(dut.idle)
        await bench.request(ctx, HostSpace.CTRL, 0, 0, 0, wdata=0xBBBB, we=1)
        result["cycles"] = await bench.run(ctx, {("W", 1): [(7, 2, 0), (8, 2, 1)]})
        assert await bench.request(ctx, HostSpace.CTRL, 1, 0, 1) == 2  # wavelets received by PE (0,1)
        assert await bench.request(ctx, HostSpace.CTRL, 1, 1, 0) == 0

    bench.simulate(testbench)
    # Both launched wavelets leave in run cycle 1 (PE tx -> router in 0, out in 1).
    assert sorted((t, e, d) for t, e, _, d, c, _ in bench.out if c == 0) == [(1, "E", 0xAAAA), (1, "N", 0xBBBB)]
    # Color 2: W1 -> FIFO (0) -> PE (1) -> router (2) -> W edge (3); the echo
    # buffer takes one wavelet every two cycles.
    assert [(t, d, c, k) for t, e, _, d, c, k in bench.out if e == "W"] == [(3, 7, 3, 0), (5, 8, 3, 1)]
    assert result["cycles"] == 6


def test_idle_start_runs_zero_cycles():
    bench = MeshBench(FabricConfig(width=2, height=2, colors=2))
    result = {}

    async def testbench(ctx):
        result["cycles"] = await bench.run(ctx, {})

    bench.simulate(testbench)
    assert result["cycles"] == 0 == GoldenFabric(FabricConfig(width=2, height=2, colors=2)).run()


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_constructor_errors():
    with pytest.raises(TypeError, match=r"config must be a FabricConfig, not 'x'"):
        Fabric("x")
    config = FabricConfig(width=1, height=1, colors=2)
    with pytest.raises(TypeError, match=r"pe must be a callable that builds a PE from a config, not 3"):
        Tile(config, pe=3)

    class Mute(wiring.Component):
        idle: Out(1)

        def elaborate(self, platform):
            return Module()

    with pytest.raises(TypeError, match=r"the PE's members \['rx', 'tx', 'host', 'enable'\] must match"):
        Tile(config, pe=lambda cfg: Mute())


# --------------------------------------------------------------------------- with the real PE
PIPELINE = """
.data
count: .word 0
.text
.data_task 1, on1
.data_task 2, on2
.task 4, burst
on1:    addi r3, r1, 1
        ld r4, count
        addi r4, r4, 1
        st r4, count
        beq r2, r0, plain1
        sendc r3, 2
        exit
plain1: send r3, 2
        exit
on2:    shli r3, r1, 1
        beq r2, r0, plain
        sendc r3, 3
        exit
plain:  send r3, 3
        exit
burst:  li r5, 5
again:  send r5, 0
        addi r5, r5, -1
        bne r5, r0, again
        exit
"""

#: Color 1: W0 -> PE (0,0) -> color 2 -> PE (1,0) and edge S0 -> color 3 -> edge E1;
#: color 0: a task launched on PE (1,1) -> edge N1 through (1,0).
PIPELINE_ROUTES = {
    (0, 0, 1): (Port.W, [Port.RAMP]),
    (0, 0, 2): (Port.RAMP, [Port.E, Port.S]), (1, 0, 2): (Port.W, [Port.RAMP]), (0, 1, 2): (Port.N, [Port.S]),
    (1, 0, 3): (Port.RAMP, [Port.S]), (1, 1, 3): (Port.N, [Port.E]),
    (1, 1, 0): (Port.RAMP, [Port.N]), (1, 0, 0): (Port.S, [Port.N]),
}


def test_pipeline_of_real_pes_matches_golden():
    from wse.firmware.asm import assemble
    from wse.hdl.wavelet import COUNTER_NAMES

    config = FabricConfig(width=2, height=2, colors=4, tasks=8, sram_words=32, imem_words=32)
    program = assemble(PIPELINE, filename="pipeline.s", config=config)
    streams = {("W", 0): [(100 + i, 1, int(i % 4 == 3)) for i in range(8)]}

    golden = GoldenFabric(config)
    golden.load(program)
    golden.load_routes((x, y, c, inp, outs) for (x, y, c), (inp, outs) in PIPELINE_ROUTES.items())
    for data, color, ctrl in streams[("W", 0)]:
        golden.stream_in("W", 0, color, [data], ctrl=[ctrl])
    golden.launch(4, rect=(1, 1, 1, 1))
    g_cycles = golden.run(max_cycles=10_000)
    g_out = {key: [(int(d), int(c)) for d, c in zip(*golden.stream_out(*key, with_ctrl=True))]
             for key in [("S", 0, 2), ("E", 1, 3), ("N", 1, 0)]}
    g_counters = golden.counters()

    bench = MeshBench(config, pe=None)
    result = {}

    async def testbench(ctx):
        for addr, word in enumerate(program.data_image(config.sram_words).tolist()):
            await bench.request(ctx, HostSpace.SRAM, addr, wdata=word, we=1, bcast=1)
        for addr, word in enumerate(program.code.tolist()):
            await bench.request(ctx, HostSpace.IMEM, addr, wdata=word, we=1, bcast=1)
        for task in program.tasks:
            word = task.entry | task.data_color << 16 | task.blocked << 17 | 1 << 18
            await bench.request(ctx, HostSpace.TASK, task.id, wdata=word, we=1, bcast=1)
        await bench.set_routes(ctx, PIPELINE_ROUTES)
        await bench.request(ctx, HostSpace.CTRL, 0, 1, 1, wdata=4, we=1)
        result["cycles"] = await bench.run(ctx, streams)
        result["hops"] = ctx.get(bench.dut.hops)
        result["counters"] = {
            name: [[await bench.request(ctx, HostSpace.CTRL, 1 + i, x, y) for x in range(2)] for y in range(2)]
            for i, name in enumerate(COUNTER_NAMES)}
        result["count"] = await bench.request(ctx, HostSpace.SRAM, program.symbols["count"].addr, 0, 0)

    bench.simulate(testbench)
    got = bench.collected()
    assert {key: got.get(key, []) for key in g_out} == g_out
    assert sum(map(len, got.values())) == sum(map(len, g_out.values()))
    assert g_out[("E", 1, 3)] == [(2 * (101 + i), int(i % 4 == 3)) for i in range(8)]
    assert result["cycles"] == g_cycles
    assert result["hops"] == g_counters["wavelet_hops"]
    for name in COUNTER_NAMES:
        assert result["counters"][name] == g_counters["pe"][name].tolist(), name
    assert result["count"] == 8


# --------------------------------------------------------------------------- export
def test_verilog_export_lints_clean(tmp_path):
    """The mesh's Verilog (stand-in PEs, so only the fabric's own RTL is judged)
    passes verilator --lint-only -Wall with the documented waivers."""
    from amaranth.back import verilog
    from wse.hdl.export import lint

    config = FabricConfig(width=2, height=1, colors=3)
    path = tmp_path / "fabric_2x1.v"
    path.write_text(verilog.convert(Fabric(config, pe=EchoPE), name="fabric_2x1"))
    text = path.read_text()
    for port in ("host__stb", "host__rdata", "edge_in_N__1__valid", "edge_out_E__0__payload", "cycle", "running"):
        assert re.search(rf"\b{port}\b", text), port
    clean, output = lint(path)
    assert clean, output


def test_export_cli_usage_errors(capsys):
    from wse.hdl.export import main

    assert main(["--mesh", "4by4"]) == 2
    assert capsys.readouterr().err.strip() == "python -m wse.hdl.export: mesh must be WIDTHxHEIGHT such as 4x4, not '4by4'"
    assert main(["--set", "colors=x"]) == 2
    assert "--set colors needs an integer value, not 'x'" in capsys.readouterr().err
    assert main(["--set", "depth=2"]) == 2
    assert "--set must be NAME=VALUE with NAME one of" in capsys.readouterr().err
