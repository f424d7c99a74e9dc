"""Shared RTL interfaces: the wavelet layout, the fabric link and the host bus.

Every block of the mesh is joined through these signatures, so the router,
the PE, the tile and the mesh agree on one definition of each.
"""


from amaranth.lib import enum

from amaranth.hdl import unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from wse.config import COLOR_BITS, DATA_BITS, FabricConfig

__all__ = ["Wavelet", "link_signature", "HostSpace", "host_bus_signature", "HOST_ADDR_BITS", "COUNTER_NAMES"]


class Wavelet(data.Struct):
    """A 38-bit wavelet: data in bits 31..0, color in 36..32, ctrl in 37
    (``docs/architecture.md`` section 2)."""
    data: unsigned(DATA_BITS)
    color: unsigned(COLOR_BITS)
    ctrl: unsigned(1)


def link_signature(config: FabricConfig) -> wiring.Signature:
    """One direction of a fabric link, from the sender's side.

    Members
    -------
    valid : Out(1)
        A wavelet moves this cycle (the sender only asserts it for a color
        whose ``ready`` bit is high in the same cycle).
    payload : Out(Wavelet)
    ready : In(config.colors)
        Bit ``c``: the receiver accepts color ``c`` this cycle; a function of
        the receiver's registered state only.
    """
    if not isinstance(config, FabricConfig):
        raise TypeError(f"config must be a FabricConfig, not {config!r}")
    return wiring.Signature({
        "valid": Out(1),
        "payload": Out(Wavelet),
        "ready": In(config.colors),
    })


class HostSpace(enum.Enum, shape=3):
    """Address spaces of the host bus."""
    SRAM = 0     #: data memory word ``addr``
    IMEM = 1     #: instruction ``addr``
    TASK = 2     #: task table entry ``addr``: entry[15:0] | bound << 16 | blocked << 17 | valid << 18
    ROUTE = 3    #: route of color ``addr``: input[2:0] | outputs[7:3]
    CTRL = 4     #: ``addr`` 0: write = activate task ``wdata`` (launch); reads: see ``COUNTER_ADDRS``
    LINK = 5     #: link ECC registers of the tile's ports (``wse.hdl.link_ecc.LINK_REGS``)
    DEAD = 6     #: ``addr`` 0: the tile's dead parts, bit p port p (N, E, S, W), bit 4 the PE (``Tile``)


#: Counter read addresses in the CTRL space (reads only), in this order from address 1
#: (the golden model's per-PE counters of the same names).
COUNTER_NAMES = ("busy", "instructions", "fmac", "flops", "stall", "tasks")

HOST_ADDR_BITS = 16


def host_bus_signature(config: FabricConfig, *, select_tile: bool = True) -> wiring.Signature:
    """The host bus, from the host's side.

    A request is one cycle with ``stb`` high. Writes (``we``) take effect at
    the end of that cycle; a read returns ``rdata`` in the next cycle. With
    ``select_tile`` the request names the tile ``(x, y)``; a tile sees the bus
    with ``sel`` instead (asserted when it is addressed). Writes with
    ``bcast`` go to every tile (used to load one program everywhere).
    Host requests are only made while the fabric is idle (between runs).

    Members
    -------
    stb, we, bcast : Out(1)
    space : Out(HostSpace)
    addr : Out(16)
    wdata : Out(32)
    x, y : Out(8) (``select_tile``) or sel : Out(1)
    rdata : In(32)
    """
    members = {
        "stb": Out(1), "we": Out(1), "bcast": Out(1),
        "space": Out(HostSpace), "addr": Out(HOST_ADDR_BITS), "wdata": Out(32),
        "rdata": In(32),
    }
    if select_tile:
        members.update({"x": Out(8), "y": Out(8)})
    else:
        members["sel"] = Out(1)
    return wiring.Signature(members)


