"""The router RTL (wse.hdl.router) against the golden router, cycle for cycle.

``ref_route`` drives the golden router (:class:`wse.sim.golden.router.Router`,
the rules of ``docs/architecture.md`` section 3: per-color FIFOs, ``ready``
from start-of-cycle counts, rotating-priority grants with atomic multicast);
``rtl_route`` drives the Amaranth router with the same seeded traffic:
senders on all five inputs offering random colors whose ``ready`` bit is
high, random backpressure on every output. Both return the per-cycle record
of every link, which must be equal. Independently of the reference, the RTL's
deliveries are checked for order, loss, duplication and multicast copies, and
two directed cases check hand-derived cycles.
"""

import random
from collections import deque

import pytest
from amaranth.sim import Simulator

from wse.config import FabricConfig, Port, ROUTE_INPUT_NONE, pack_wavelet, unpack_wavelet
from wse.hdl.router import PORTS, Router, decode_route, encode_route, route_port_signature
from wse.sim.golden.router import Router as GoldenRouter

RAMP = int(Port.RAMP)


class Traffic:
    """Seeded stimulus shared by the reference and the RTL run.

    ``streams[c]`` lists the ``(data, ctrl)`` of color ``c``, sent by the port
    its route accepts from. Decisions depend only on the cycle, the port and
    what the sender can see (``ready`` bits, its own pending colors), so two
    routers that behave alike receive identical traffic.
    """

    def __init__(self, seed, colors, routes, streams, cycles, gap=0.2, out_busy=0.35, out_ready=None):
        rng = random.Random(seed)
        self.colors, self.routes, self.streams, self.cycles = colors, routes, streams, cycles
        self.pick = [[rng.random() for _ in range(PORTS)] for _ in range(cycles)]
        self.gap = [[rng.random() < gap for _ in range(PORTS)] for _ in range(cycles)]
        if out_ready is None:
            out_ready = [[sum((rng.random() >= out_busy) << c for c in range(colors)) for _ in range(PORTS)]
                         for _ in range(cycles)]
        self.out_ready = out_ready

    def senders(self):
        """Per input port, per color, a queue of packed wavelets still to send."""
        queues = [dict() for _ in range(PORTS)]
        for c, words in self.streams.items():
            port = self.routes[c][0]
            queues[port][c] = deque(pack_wavelet(d, c, k) for d, k in words)
        return queues

    def offer(self, t, port, ready_bits, queues):
        """The packed wavelet that ``port``'s sender drives in cycle ``t``, or None."""
        if self.gap[t][port]:
            return None
        ok = sorted(c for c, q in queues[port].items() if q and ready_bits >> c & 1)
        if not ok:
            return None
        return queues[port][ok[int(self.pick[t][port] * len(ok))]].popleft()


def ref_route(config, routes, traffic, rotate=True):
    """Per-cycle records ``(ready bits per input, output wavelet or None per port)``
    of the golden router; ``rotate=False`` is a deliberately wrong fixed-priority
    variant (every cycle starts at color 0) used to prove the comparison can fail."""
    router = GoldenRouter(config)
    for c, (inp, outs) in routes.items():
        router.write_route(c, encode_route(inp, outs))
    queues = traffic.senders()
    records = []
    for t in range(traffic.cycles):
        ready_in = tuple(router.ready())
        offers = [traffic.offer(t, p, ready_in[p], queues) for p in range(PORTS)]
        outputs = router.step(t % config.colors if rotate else 0, offers, traffic.out_ready[t])
        records.append((ready_in, tuple(outputs)))
        if router.idle and not any(q for port in queues for q in port.values()):
            break
    return records


def rtl_route(config, routes, traffic):
    """The same records from the Amaranth router in Amaranth's simulator."""
    dut = Router(config)
    C = config.colors
    records = []

    async def testbench(ctx):
        for c, (inp, outs) in routes.items():
            ctx.set(dut.route.we, 1)
            ctx.set(dut.route.color, c)
            ctx.set(dut.route.wdata, encode_route(inp, outs))
            await ctx.tick()
        ctx.set(dut.route.we, 0)
        for c in range(32):
            ctx.set(dut.route.color, c)
            expect = encode_route(*routes[c]) if c in routes else (ROUTE_INPUT_NONE if c < C else 0)
            assert ctx.get(dut.route.rdata) == expect, f"route read-back of color {c}"
        queues = traffic.senders()
        for t in range(traffic.cycles):
            ctx.set(dut.first_color, t % C)
            for p in range(PORTS):
                ctx.set(dut.tx[p].ready, traffic.out_ready[t][p])
            ready_in = tuple(ctx.get(dut.rx[p].ready) for p in range(PORTS))
            for p in range(PORTS):
                word = traffic.offer(t, p, ready_in[p], queues)
                ctx.set(dut.rx[p].valid, word is not None)
                ctx.set(dut.rx[p].payload.as_value(), word or 0)
            outputs = []
            for p in range(PORTS):
                word = ctx.get(dut.tx[p].payload.as_value()) if ctx.get(dut.tx[p].valid) else None
                if word is not None:
                    assert traffic.out_ready[t][p] >> unpack_wavelet(word)[1] & 1, \
                        f"cycle {t}: port {Port(p).name} sent a color whose ready bit is low"
                outputs.append(word)
            assert ctx.get(dut.sent) == sum(w is not None for w in outputs)
            records.append((ready_in, tuple(outputs)))
            await ctx.tick()
            if ctx.get(dut.idle) and not any(q for port in queues for q in port.values()):
                break

    sim = Simulator(dut)
    sim.add_clock(1e-6)
    sim.add_testbench(testbench)
    sim.run()
    return records


def first_difference(a, b):
    for t, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"cycle {t}: reference {x} != RTL {y}"
    return f"lengths differ: {len(a)} != {len(b)}" if len(a) != len(b) else None


def check_deliveries(records, routes, streams):
    """Every output port in a color's mask got the color's stream, once, in order."""
    got = {}
    for _, outputs in records:
        for p, word in enumerate(outputs):
            if word is not None:
                data, color, ctrl = unpack_wavelet(word)
                got.setdefault((p, color), []).append((data, ctrl))
    expect = {}
    for c, words in streams.items():
        for port in routes[c][1]:
            expect[(int(port), c)] = list(words)
    assert got == expect


def random_case(seed, colors, n_colors, per_color, max_cycles):
    rng = random.Random(seed)
    used = rng.sample(range(colors), n_colors)
    routes, streams = {}, {}
    for c in used:
        inp = rng.randrange(PORTS)
        outs = [p for p in range(PORTS) if rng.random() < 0.35] or [rng.randrange(PORTS)]
        routes[c] = (inp, outs)
        streams[c] = [(rng.getrandbits(32), int(rng.random() < 0.1)) for _ in range(rng.randint(1, per_color))]
    return routes, streams, Traffic(seed, colors, routes, streams, max_cycles)


@pytest.mark.parametrize("colors, depth, seed", [(16, 2, 1), (16, 2, 2), (5, 1, 3), (3, 3, 4), (7, 2, 5)])
def test_random_traffic_matches_spec(colors, depth, seed):
    config = FabricConfig(colors=colors, router_depth=depth)
    routes, streams, traffic = random_case(seed, colors, min(colors, 8), 40, 1500)
    ref = ref_route(config, routes, traffic)
    rtl = rtl_route(config, routes, traffic)
    assert len(ref) < traffic.cycles, "the reference did not drain: make the case shorter or the run longer"
    diff = first_difference(ref, rtl)
    assert diff is None, diff
    check_deliveries(rtl, routes, streams)


def test_comparison_detects_a_wrong_priority():
    """A fixed-priority reference must disagree with the RTL on contended traffic."""
    config = FabricConfig(colors=4)
    routes = {c: (c, [Port.E, Port.RAMP]) for c in range(4)}
    streams = {c: [(c * 100 + i, 0) for i in range(6)] for c in range(4)}
    traffic = Traffic(9, 4, routes, streams, 200, gap=0.0, out_busy=0.0)
    assert first_difference(ref_route(config, routes, traffic, rotate=False), rtl_route(config, routes, traffic))


def test_rotating_priority_exact_cycles():
    """Colors 0 (from W) and 1 (from N) share output E, three wavelets each,
    senders always offering; cycles derived by hand from spec 3.3-3.4."""
    config = FabricConfig(colors=4, router_depth=2)
    routes = {0: (Port.W, [Port.E]), 1: (Port.N, [Port.E])}
    streams = {0: [(10, 0), (11, 0), (12, 0)], 1: [(20, 0), (21, 0), (22, 1)]}
    traffic = Traffic(0, 4, routes, streams, 20, gap=0.0, out_busy=0.0)
    rtl = rtl_route(config, routes, traffic)
    east = {t: unpack_wavelet(out[Port.E])[:2] for t, (_, out) in enumerate(rtl) if out[Port.E] is not None}
    # cycle 1: start color 1 wins; 2..4: color 0 (color 1's turn comes at 5);
    # color 0's third wavelet waits a cycle at 2 because its FIFO was full.
    assert east == {1: (20, 1), 2: (10, 0), 3: (11, 0), 4: (12, 0), 5: (21, 1), 6: (22, 1)}
    assert [ready[Port.W] & 1 for ready, _ in rtl[:4]] == [1, 1, 0, 1]


def test_stalled_color_and_atomic_multicast():
    """Color 2 (W -> N) is never accepted downstream: it fills its FIFO and
    stalls, while color 0 (W -> E + RAMP) and color 1 (S -> E) keep moving over
    the same links. RAMP refuses color 0 in cycles 5..14: no copy of color 0
    may leave by E then."""
    config = FabricConfig(colors=4, router_depth=2)
    routes = {0: (Port.W, [Port.E, Port.RAMP]), 1: (Port.S, [Port.E]), 2: (Port.W, [Port.N])}
    streams = {0: [(i, 0) for i in range(8)], 1: [(100 + i, 0) for i in range(8)], 2: [(200 + i, 0) for i in range(5)]}
    cycles = 60
    out_ready = []
    for t in range(cycles):
        ready = [0b1111] * PORTS
        ready[Port.N] = 0b1011
        if 5 <= t < 15:
            ready[Port.RAMP] = 0b1110
        out_ready.append(ready)
    traffic = Traffic(3, 4, routes, streams, cycles, gap=0.0, out_ready=out_ready)
    rtl = rtl_route(config, routes, traffic)
    assert len(rtl) == cycles  # color 2 never drains
    sent = {(p, c): [] for p in range(PORTS) for c in range(config.colors)}
    for t, (_, outputs) in enumerate(rtl):
        for p, word in enumerate(outputs):
            if word is not None:
                sent[(p, unpack_wavelet(word)[1])].append((t, unpack_wavelet(word)[0]))
    assert sent[(Port.N, 2)] == []
    assert [d for _, d in sent[(Port.E, 0)]] == [d for _, d in sent[(Port.RAMP, 0)]] == list(range(8))
    assert [t for t, _ in sent[(Port.E, 0)]] == [t for t, _ in sent[(Port.RAMP, 0)]]
    assert not any(5 <= t < 15 for t, _ in sent[(Port.E, 0)])
    assert [d for _, d in sent[(Port.E, 1)]] == [100 + i for i in range(8)]
    assert any(5 <= t < 15 for t, _ in sent[(Port.E, 1)]), "color 1 must use E while color 0 waits"
    # Color 2 filled its FIFO; from then on its ready bit on W stayed low.
    assert all(not ready[Port.W] >> 2 & 1 for ready, _ in rtl[10:])
    assert first_difference(ref_route(config, routes, traffic), rtl) is None


@pytest.mark.filterwarnings("ignore:.*created but never used")
def test_constructor_errors():
    with pytest.raises(TypeError, match=r"config must be a FabricConfig, not 'x'"):
        Router("x")
    with pytest.raises(TypeError, match=r"config must be a FabricConfig, not 4"):
        route_port_signature(4)


def test_route_encoding():
    assert encode_route(Port.W, [Port.E, Port.RAMP]) == 3 | 0b10010 << 3
    assert encode_route(None, []) == ROUTE_INPUT_NONE
    assert decode_route(encode_route(Port.S, [Port.N, Port.S])) == (2, 0b101)
