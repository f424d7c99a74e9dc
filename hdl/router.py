"""The five-port fabric router (``docs/architecture.md`` section 3).

One FIFO per color, fed by the color's one input port; a route table per
color (input port, output mask) loaded by the host; every cycle a grant set
built in rotating color order with atomic multicast. The router's decisions
are those of the golden router model (:mod:`wse.sim.golden.router`) cycle for
cycle.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from wse.config import COLOR_BITS, DATA_BITS, ROUTE_INPUT_NONE, FabricConfig, Port

from .fifo import RouterFIFO
from .wavelet import link_signature

__all__ = ["PORTS", "ROUTE_BITS", "route_port_signature", "encode_route", "decode_route", "Router"]

#: Router ports, in :class:`wse.config.Port` order (N, E, S, W, RAMP).
PORTS = len(Port)

#: Bits of one route-table entry: ``input[2:0] | outputs[7:3]`` (``HostSpace.ROUTE``).
ROUTE_BITS = 3 + PORTS


def encode_route(input, outputs) -> int:
    """The route-table word for ``input`` (a port, or None for "not routed")
    and the iterable of output ports ``outputs``."""
    code = ROUTE_INPUT_NONE if input is None else int(Port(input))
    mask = 0
    for port in outputs:
        mask |= 1 << int(Port(port))
    return code | mask << 3


def decode_route(word: int) -> tuple[int, int]:
    """Split a route-table word into ``(input code, output mask)``."""
    return word & 0b111, (word >> 3) & ((1 << PORTS) - 1)


def route_port_signature(config: FabricConfig) -> wiring.Signature:
    """The route-table access port, from the writer's (the tile's) side.

    Members
    -------
    we : Out(1)
        Write ``wdata`` into the route of color ``color`` at the end of the
        cycle; colors ``>= config.colors`` are ignored.
    color : Out(5)
    wdata : Out(8)
        ``input[2:0] | outputs[7:3]`` (see :func:`encode_route`).
    rdata : In(8)
        The route of ``color``, combinationally (0 for colors out of range).
    """
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    return wiring.Signature({
        "we": Out(1),
        "color": Out(COLOR_BITS),
        "wdata": Out(ROUTE_BITS),
        "rdata": In(ROUTE_BITS),
    })


class Router(wiring.Component):
    """The router of one tile.

    Parameters
    ----------
    config : FabricConfig
        ``colors`` and ``router_depth`` size the router.
    visible : bool
        Give each FIFO a read port per slot (:class:`~wse.hdl.fifo.RouterFIFO`),
        for the formal harness (``hdl/formal.py``); the RTL leaves it off.

    Members
    -------
    rx : In(link_signature(config)).array(5)
        Links entering the router, indexed by :class:`~wse.config.Port`.
        ``rx[p].ready[c]`` is ``route[c].input == p`` and the FIFO of ``c``
        holding fewer than ``router_depth`` wavelets at the start of the cycle.
    tx : Out(link_signature(config)).array(5)
        Links leaving the router, indexed by port. ``tx[p].valid`` is only
        driven for a color whose ``tx[p].ready`` bit is high in the same cycle.
    first_color : In(5)
        The color visited first by this cycle's arbitration (the global cycle
        count modulo ``colors``; the mesh keeps it, so the router needs no
        divider). Values ``>= colors`` are not allowed.
    route : In(route_port_signature(config))
        Route-table writes and reads (``HostSpace.ROUTE``). Every route
        starts as "not routed" (input 7, no outputs).
    idle : Out(1)
        Every FIFO is empty.
    sent : Out(range(6))
        Wavelets leaving this cycle (one per output port used: router hops).

    The router's state is readable for proofs (not ports): ``fifos`` (one
    :class:`~wse.hdl.fifo.RouterFIFO` per color), ``route_in`` and
    ``route_out`` (the route table's registers per color).

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`FabricConfig`.
    """

    def __init__(self, config: FabricConfig, *, visible: bool = False):
        if not isinstance(config, FabricConfig):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self._config = config
        link = link_signature(config)
        super().__init__({
            "rx": In(link).array(PORTS),
            "tx": Out(link).array(PORTS),
            "first_color": In(COLOR_BITS),
            "route": In(route_port_signature(config)),
            "idle": Out(1),
            "sent": Out(range(PORTS + 1)),
        })
        colors = config.colors
        self.route_in = [Signal(3, init=ROUTE_INPUT_NONE, name=f"route_in_{c}") for c in range(colors)]
        self.route_out = [Signal(PORTS, name=f"route_out_{c}") for c in range(colors)]
        self.fifos = [RouterFIFO(width=DATA_BITS + 1, depth=config.router_depth, visible=visible)
                      for _ in range(colors)]

    @property
    def config(self) -> FabricConfig:
        """The configuration the router was built for."""
        return self._config

    def elaborate(self, platform):
        m = Module()
        colors = self._config.colors

        # Route table: registers, since every color's route is read every cycle.
        route_in, route_out = self.route_in, self.route_out
        with m.Switch(self.route.color):
            for c in range(colors):
                with m.Case(c):
                    m.d.comb += self.route.rdata.eq(Cat(route_in[c], route_out[c]))
                    with m.If(self.route.we):
                        m.d.sync += [route_in[c].eq(self.route.wdata[:3]),
                                     route_out[c].eq(self.route.wdata[3:])]

        # Per-color FIFOs of data and ctrl (the color is implicit).
        fifos = self.fifos
        for c, fifo in enumerate(fifos):
            m.submodules[f"fifo_{c}"] = fifo
            for p in range(PORTS):
                m.d.comb += self.rx[p].ready[c].eq((route_in[c] == p) & fifo.w_rdy)
            # A color is taken only from its route's input port.
            with m.Switch(route_in[c]):
                for p in range(PORTS):
                    with m.Case(p):
                        link = self.rx[p]
                        m.d.comb += [
                            fifo.w_en.eq(link.valid & (link.payload.color == c)),
                            fifo.w_data.eq(Cat(link.payload.data, link.payload.ctrl)),
                        ]

        # A color wants to go when its head exists, it has outputs, and every
        # output it needs is ready for it (multicast is all copies or none).
        want = Signal(colors)
        for c in range(colors):
            outputs_ready = Const(1)
            for p in range(PORTS):
                outputs_ready &= ~route_out[c][p] | self.tx[p].ready[c]
            m.d.comb += want[c].eq(fifos[c].r_rdy & route_out[c].any() & outputs_ready)

        # Rotating order without rotating anything: walk the colors twice in
        # fixed order, the first pass taking colors >= first_color, the second
        # the colors below it. The greedy chain is longer (2 * colors steps)
        # but needs no barrel shifters, which cost far more area.
        grant = Signal(colors)
        grant_late = Signal(colors)  # granted in the first pass (c >= first_color)
        grant_wrap = Signal(colors)  # granted in the second pass (c < first_color)
        used = Const(0, PORTS)
        steps = [(grant_late, c, c >= self.first_color) for c in range(colors)] + \
                [(grant_wrap, c, c < self.first_color) for c in range(colors)]
        for step, (granted, c, in_pass) in enumerate(steps):
            m.d.comb += granted[c].eq(want[c] & in_pass & ((route_out[c] & used) == 0))
            if step + 1 < len(steps):
                used_next = Signal(PORTS, name=f"ports_used_{step}")
                m.d.comb += used_next.eq(used | Mux(granted[c], route_out[c], 0))
                used = used_next
        m.d.comb += grant.eq(grant_late | grant_wrap)

        # Pop granted heads and drive every output of their masks.
        for c in range(colors):
            m.d.comb += fifos[c].r_en.eq(grant[c])
        for p in range(PORTS):
            link = self.tx[p]
            hits = [grant[c] & route_out[c][p] for c in range(colors)]
            # At most one color is granted a port: OR together the gated heads.
            head = Const(0, DATA_BITS + 1)
            color = Const(0, COLOR_BITS)
            for c in range(colors):
                head = head | Mux(hits[c], fifos[c].r_data, 0)
                color = color | Mux(hits[c], c, 0)
            m.d.comb += [
                link.valid.eq(Cat(*hits).any()),
                link.payload.data.eq(head[:DATA_BITS]),
                link.payload.ctrl.eq(head[DATA_BITS]),
                link.payload.color.eq(color),
            ]

        m.d.comb += [
            self.idle.eq(~Cat(*(fifo.r_rdy for fifo in fifos)).any()),
            self.sent.eq(sum(self.tx[p].valid for p in range(PORTS))),
        ]
        return m
