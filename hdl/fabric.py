"""The mesh: ``width x height`` tiles, their links, the edge ports, the host
bus with tile select and the run control (``docs/architecture.md`` sections
1, 3.6, 5 and 6).
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from wse.config import COLOR_BITS, FabricConfig, Port

from .link_ecc import link_encoder
from .tile import MESH_PORTS, Tile
from .wavelet import host_bus_signature, link_signature

__all__ = ["EDGES", "Fabric"]

#: Mesh edges, named as in the host API (``stream_in(edge, index, ...)``).
EDGES = ("N", "E", "S", "W")


class Fabric(wiring.Component):
    """The whole mesh.

    Parameters
    ----------
    config : FabricConfig
        ``width x height`` tiles of that configuration.
    pe : callable, optional
        Builds each tile's PE (see :class:`~wse.hdl.tile.Tile`); default
        :class:`wse.hdl.pe.PE`.

    Members
    -------
    host : In(host_bus_signature(config))
        Requests name a tile by ``x, y``; ``bcast`` writes reach every tile.
        ``rdata`` answers a read in the next cycle (0 for a tile outside the
        mesh). Requests are made only while ``running`` is low.
    start : In(1)
        Strobe: zero ``cycle`` and ``hops`` and start a run in the next cycle
        (run cycle 0). PEs select no task between runs, so tasks launched
        before the strobe start in run cycle 0.
    edge_pending : In(1)
        The host still has wavelets to inject at the edge ports: the run is
        not over even if the mesh is idle.
    running : Out(1)
        A run is in progress: set by ``start``, cleared at the end of the
        first run cycle that begins with the mesh idle and ``edge_pending`` low.
    idle : Out(1)
        Every tile is idle (PEs idle, router FIFOs, ``rx`` and ``tx`` queues empty).
    cycle : Out(32)
        Cycles of the current or last run: counts the run cycles that begin
        with the mesh not idle, so at the end it equals the golden model's
        ``run()`` result.
    hops : Out(32)
        Wavelets moved by routers during the run (one per output port used).
    edge_in_N, edge_in_S : In(link_signature(config)).array(width)
    edge_in_E, edge_in_W : In(link_signature(config)).array(height)
        The host's injection ports, by edge and index (column for N and S,
        row for E and W). The host drives ``valid`` only while ``running``
        and only for a color whose ``ready`` bit is high.
    edge_out_N, edge_out_S : Out(link_signature(config)).array(width)
    edge_out_E, edge_out_W : Out(link_signature(config)).array(height)
        Wavelets leaving the mesh. The spec's host accepts everything: drive
        every ``ready`` bit high.

    Attributes
    ----------
    tiles : list of list of Tile
        ``tiles[y][x]``.

    Raises
    ------
    TypeError
        If ``config`` is not a :class:`FabricConfig` (or ``pe`` is unusable,
        see :class:`~wse.hdl.tile.Tile`).
    """

    def __init__(self, config: FabricConfig, *, pe=None):
        if not isinstance(config, FabricConfig):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self._config = config
        def inner(x, y):      # the ports toward a neighbour: their links carry check bits (wse.hdl.link_ecc)
            return tuple(p for p in MESH_PORTS
                         if 0 <= x + p.delta[0] < config.width and 0 <= y + p.delta[1] < config.height)
        self.tiles = [[Tile(config, pe=pe, link_ecc=inner(x, y)) for x in range(config.width)]
                      for y in range(config.height)]
        link = link_signature(config)
        members = {
            "host": In(host_bus_signature(config)),
            "start": In(1),
            "edge_pending": In(1),
            "running": Out(1),
            "idle": Out(1),
            "cycle": Out(32),
            "hops": Out(32),
        }
        for edge in EDGES:
            count = config.width if edge in ("N", "S") else config.height
            members[f"edge_in_{edge}"] = In(link).array(count)
            members[f"edge_out_{edge}"] = Out(link).array(count)
        super().__init__(members)

    @property
    def config(self) -> FabricConfig:
        """The configuration the mesh was built for."""
        return self._config

    def edge_in(self, edge: str):
        """The injection links of ``edge`` ("N", "E", "S" or "W"), by index."""
        return getattr(self, f"edge_in_{edge}")

    def edge_out(self, edge: str):
        """The output links of ``edge``, by index."""
        return getattr(self, f"edge_out_{edge}")

    def elaborate(self, platform):
        m = Module()
        cfg = self._config
        W, H = cfg.width, cfg.height
        tiles = [tile for row in self.tiles for tile in row]
        for y, row in enumerate(self.tiles):
            for x, tile in enumerate(row):
                m.submodules[f"tile_{x}_{y}"] = tile

        # Links: each tile's output by port p feeds the neighbour's input by
        # the opposite port, or the edge output; edge inputs feed boundary tiles.
        for y, row in enumerate(self.tiles):
            for x, tile in enumerate(row):
                for port in MESH_PORTS:
                    dx, dy = port.delta
                    nx, ny = x + dx, y + dy
                    if 0 <= nx < W and 0 <= ny < H:
                        wiring.connect(m, tile.tx[port], self.tiles[ny][nx].rx[port.opposite])
                        if tile.link_ecc:
                            m.d.comb += self.tiles[ny][nx].rx_check[port.opposite].eq(tile.tx_check[port])
                    else:
                        index = x if port in (Port.N, Port.S) else y
                        wiring.connect(m, tile.tx[port], wiring.flipped(self.edge_out(port.name)[index]))
                        wiring.connect(m, wiring.flipped(self.edge_in(port.name)[index]), tile.rx[port])
                        if tile.link_ecc and port in tile.link_ecc.ports:
                            # A tile that codes its edge ports too (the co-simulation's shared tile
                            # module): the host side of the edge link sends valid check bits.
                            payload = self.edge_in(port.name)[index].payload.as_value()
                            m.d.comb += tile.rx_check[port].eq(link_encoder(payload))

        # Run control: the cycle counter and the arbitration start color; the run
        # clock (every run cycle, for flips armed at a cycle); an uncorrectable wavelet stops the run.
        first_color = Signal(COLOR_BITS)
        clock = Signal(32)
        coded = [tile for tile in tiles if tile.link_ecc]
        link_fault = Signal()
        m.d.comb += [self.idle.eq(Cat(*(tile.idle for tile in tiles)).all()),
                     link_fault.eq(Cat(*(tile.link_fault for tile in coded)).any() if coded else 0)]
        for tile in tiles:
            m.d.comb += tile.clock.eq(clock)
        with m.If(self.start):
            m.d.sync += [self.running.eq(1), self.cycle.eq(0), self.hops.eq(0), first_color.eq(0), clock.eq(0)]
        with m.Elif(self.running):
            m.d.sync += clock.eq(clock + 1)
            with m.If((self.idle & ~self.edge_pending) | link_fault):
                m.d.sync += self.running.eq(0)
            with m.Else():
                m.d.sync += [
                    self.cycle.eq(self.cycle + 1),
                    first_color.eq(Mux(first_color == cfg.colors - 1, 0, first_color + 1)),
                ]
            m.d.sync += self.hops.eq(self.hops + sum(tile.sent for tile in tiles))
        for tile in tiles:
            m.d.comb += [
                tile.run.eq(self.running),
                tile.first_color.eq(first_color),
            ]

        # Host bus: decode the tile select; answer a read from the tile that
        # was addressed in the previous cycle.
        host = self.host
        read_from = []
        for y, row in enumerate(self.tiles):
            for x, tile in enumerate(row):
                match = Signal(name=f"host_match_{x}_{y}")
                was_read = Signal(name=f"host_read_{x}_{y}")
                m.d.comb += [
                    match.eq((host.x == x) & (host.y == y)),
                    tile.host.stb.eq(host.stb),
                    tile.host.sel.eq(match | host.bcast),
                    tile.host.we.eq(host.we),
                    tile.host.bcast.eq(host.bcast),
                    tile.host.space.eq(host.space),
                    tile.host.addr.eq(host.addr),
                    tile.host.wdata.eq(host.wdata),
                ]
                m.d.sync += was_read.eq(host.stb & ~host.we & match)
                read_from.append(Mux(was_read, tile.host.rdata, 0))
        rdata = read_from[0]
        for value in read_from[1:]:
            rdata = rdata | value
        m.d.comb += host.rdata.eq(rdata)
        return m
