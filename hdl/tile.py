"""One fabric tile: a router beside its processing element.

The PE's output link feeds the router's RAMP input and the router's RAMP
output feeds the PE. The tile splits the host bus between them (the route
table answers ``HostSpace.ROUTE``, the PE every other space) and lets the PE
select tasks only while the mesh runs, which is what makes ``launch`` take
effect at the start of the next run (``docs/architecture.md`` section 5).

Dead parts (``docs/faults.md`` section 3.3): a host-bus register
(``HostSpace.DEAD``, address 0; bit ``p`` the link by mesh port ``p``, bit 4
the PE) kills them. A dead PE is never enabled (it selects no task) and its
RAMP links carry nothing (both ``valid`` and ``ready`` held low), so its
router never delivers to it; a dead port's link carries nothing either way.
The register resets to 0: nothing is dead.
"""

from amaranth import Module, Mux, Shape, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from wse.config import COLOR_BITS, FabricConfig, Port

from .link_ecc import CHECK_BITS, LinkCoders
from .router import PORTS, ROUTE_BITS, Router
from .wavelet import HostSpace, host_bus_signature, link_signature

__all__ = ["MESH_PORTS", "Tile", "pe_signature"]

#: The tile's ports toward its neighbours (or the mesh edge): N, E, S, W.
MESH_PORTS = (Port.N, Port.E, Port.S, Port.W)


def pe_signature(config: FabricConfig) -> dict:
    """The members a PE must have (name -> member) to sit in a tile.

    ``rx`` receives from the router's RAMP output and ``tx`` feeds its RAMP
    input (both obey the link rules of spec 3.1); ``host`` is the host bus
    with ``sel`` (``HostSpace.ROUTE`` requests never reach it; a read answers
    in the next cycle); ``idle`` says that no task runs or is ready and the
    ``rx`` and ``tx`` queues are empty; while ``enable`` is low the PE selects
    no task. Other members are allowed and left at their defaults.
    """
    link = link_signature(config)
    return {
        "rx": In(link),
        "tx": Out(link),
        "host": In(host_bus_signature(config, select_tile=False)),
        "idle": Out(1),
        "enable": In(1),
    }


def _same_port(a, b) -> bool:
    """Members ``a`` and ``b`` agree in flow and signature or shape (not in init)."""
    if a.flow != b.flow or a.is_signature != b.is_signature:
        return False
    if a.is_signature:
        return a.signature == b.signature
    return Shape.cast(a.shape) == Shape.cast(b.shape)


def _default_pe(config):
    from .pe import PE
    return PE(config)


class Tile(wiring.Component):
    """A router and a PE joined by the RAMP links.

    Parameters
    ----------
    config : FabricConfig
    pe : callable, optional
        ``pe(config)`` returns the PE component; default :class:`wse.hdl.pe.PE`.
        Its signature must contain the members of :func:`pe_signature`.
    link_ecc : sequence of Port, optional
        The mesh ports whose links carry check bits (the ones toward a
        neighbour, :mod:`wse.hdl.link_ecc`); default none.

    Members
    -------
    rx : In(link_signature(config)).array(4)
        Links entering the tile's router from the N, E, S and W side.
    tx : Out(link_signature(config)).array(4)
        Links leaving by the N, E, S and W side.
    host : In(host_bus_signature(config, select_tile=False))
        Requests with ``stb & sel`` are for this tile; ``rdata`` answers a
        read in the cycle after it. Route reads return ``input | outputs << 3``.
    run : In(1)
        The mesh is running: drives the PE's ``enable`` (no task starts
        between runs).
    first_color : In(5)
        ``cycle mod colors``, for the router's arbitration.
    idle : Out(1)
        The PE is idle and every router FIFO is empty.
    sent : Out(range(6))
        Wavelets leaving the router this cycle.
    tx_check : Out(7).array(4), rx_check : In(7).array(4)
        With ``link_ecc``: the check bits beside ``tx`` and ``rx`` (zero on
        the other ports).
    clock : In(32)
        The run cycle (every cycle of a run from 0), for flips armed at a
        cycle: the PE's memory flips and, with ``link_ecc``, link flips and reports.
    link_fault : Out(1)
        With ``link_ecc``: an uncorrectable wavelet arrived (stops the run).

    The ``DEAD`` host space (address 0, read and write) holds the tile's dead
    parts: bit ``p`` kills the link by mesh port ``p`` (N, E, S, W = 0..3),
    bit 4 the PE (``docs/faults.md`` section 3.3).

    Attributes
    ----------
    router : Router
    pe : the PE component

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`FabricConfig`, ``pe`` is not callable,
        or the PE lacks a member of :func:`pe_signature`.
    """

    def __init__(self, config: FabricConfig, *, pe=None, link_ecc=()):
        if not isinstance(config, FabricConfig):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        if pe is None:
            pe = _default_pe
        if not callable(pe):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"pe must be a callable that builds a PE from a config, not {pe!r}")
        self._config = config
        self.pe = pe(config)
        members = getattr(getattr(self.pe, "signature", None), "members", None)
        if members is None:
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"pe must build a wiring.Component, not {self.pe!r}")
        wrong = [name for name, member in pe_signature(config).items()
                 if name not in members or not _same_port(members[name], member)]
        if wrong:
            self._MustUse__silence = True  # a rejected design is not an unused one
            self.pe._MustUse__silence = True
            raise TypeError(f"the PE's members {wrong} must match pe_signature(config), not "
                            f"{[members[name] if name in members else None for name in wrong]}")
        self.router = Router(config)
        self.link_ecc = LinkCoders(Port(p) for p in link_ecc) if link_ecc else None
        link = link_signature(config)
        members = {
            "rx": In(link).array(len(MESH_PORTS)),
            "tx": Out(link).array(len(MESH_PORTS)),
            "host": In(host_bus_signature(config, select_tile=False)),
            "run": In(1),
            "first_color": In(COLOR_BITS),
            "idle": Out(1),
            "sent": Out(range(PORTS + 1)),
            "clock": In(32),
        }
        if self.link_ecc:
            members.update({"tx_check": Out(CHECK_BITS).array(len(MESH_PORTS)),
                            "rx_check": In(CHECK_BITS).array(len(MESH_PORTS)),
                            "link_fault": Out(1)})
        super().__init__(members)

    @property
    def config(self) -> FabricConfig:
        """The configuration the tile was built for."""
        return self._config

    def elaborate(self, platform):
        m = Module()
        router, pe, host = self.router, self.pe, self.host

        m.submodules.router = router
        m.submodules.pe = pe
        addressed = Signal()
        m.d.comb += addressed.eq(host.stb & host.sel)

        coded = self.link_ecc.ports if self.link_ecc else ()
        for port in MESH_PORTS:
            if port not in coded:
                wiring.connect(m, wiring.flipped(self.rx[port]), router.rx[port])
                wiring.connect(m, router.tx[port], wiring.flipped(self.tx[port]))
        wiring.connect(m, pe.tx, router.rx[Port.RAMP])
        wiring.connect(m, router.tx[Port.RAMP], pe.rx)

        dead = Signal(len(MESH_PORTS) + 1)      # HostSpace.DEAD: bit p port p, bit 4 the PE
        m.d.comb += [
            pe.enable.eq(self.run & ~dead[4]),
            router.first_color.eq(self.first_color),
            self.idle.eq(router.idle & pe.idle),
            self.sent.eq(router.sent),
        ]

        # Host bus: ROUTE requests go to the router's table, the rest to the PE.
        is_route = Signal()
        m.d.comb += [
            is_route.eq(host.space == HostSpace.ROUTE),
            pe.host.stb.eq(host.stb & ~is_route & (host.space != HostSpace.LINK) & (host.space != HostSpace.DEAD)),
            pe.host.sel.eq(host.sel),
            pe.host.we.eq(host.we),
            pe.host.bcast.eq(host.bcast),
            pe.host.space.eq(host.space),
            pe.host.addr.eq(host.addr),
            pe.host.wdata.eq(host.wdata),
            router.route.color.eq(host.addr),
            router.route.wdata.eq(host.wdata),
            # Addresses beyond the 5-bit color field name no route.
            router.route.we.eq(addressed & is_route & host.we & (host.addr >> COLOR_BITS == 0)),
        ]
        route_read = Signal()
        route_rdata = Signal(ROUTE_BITS)
        with m.If(addressed & ~host.we):
            m.d.sync += [
                route_read.eq(is_route | (host.space == HostSpace.DEAD)),
                route_rdata.eq(Mux(is_route, Mux(host.addr >> COLOR_BITS == 0, router.route.rdata, 0),
                                   Mux(host.addr == 0, dead, 0))),
            ]
        with m.If(host.stb & host.we & (host.sel | host.bcast) & (host.space == HostSpace.DEAD) & (host.addr == 0)):
            m.d.sync += dead.eq(host.wdata)
        if "clock" in pe.signature.members:      # a PE with memory flips armed at a cycle
            m.d.comb += pe.clock.eq(self.clock)
        pe_rdata = pe.host.rdata
        if self.link_ecc:
            link_read, link_rdata = self.link_ecc.elaborate(m, self, router, host, addressed)
            pe_rdata = Mux(link_read, link_rdata, pe_rdata)
        m.d.comb += host.rdata.eq(Mux(route_read, route_rdata, pe_rdata))
        self._deaden(m, dead)
        return m

    def _deaden(self, m, dead) -> None:
        """Hold the links of the dead parts at nothing: ``valid`` and ``ready``
        low both ways (these statements come after the wiring, so they win)."""
        router, pe = self.router, self.pe
        for port in MESH_PORTS:
            with m.If(dead[int(port)]):
                m.d.comb += [self.tx[port].valid.eq(0), router.tx[port].ready.eq(0),
                             self.rx[port].ready.eq(0), router.rx[port].valid.eq(0)]
        with m.If(dead[4]):
            m.d.comb += [pe.rx.valid.eq(0), router.tx[Port.RAMP].ready.eq(0),
                         pe.tx.ready.eq(0), router.rx[Port.RAMP].valid.eq(0)]
