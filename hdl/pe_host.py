"""The host bus port of the processing element (:class:`~wse.hdl.pe.PE`).

While the PE is idle the host reads and writes its memories, its task table
and its control registers (task activation, counters) through this port.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from amaranth import Cat, Const, Signal

from .wavelet import COUNTER_NAMES, HostSpace

if TYPE_CHECKING:
    from .pe import PE, _Memories, _Tasks

__all__ = ["host_port"]


def host_port(m, pe: PE, mem: _Memories, tasks: _Tasks, extra_reads: dict | None = None) -> None:
    """Elaborate ``pe``'s host bus (see :class:`~wse.hdl.pe.PE`, member ``host``):
    memory, task table and control access while the PE is idle.
    ``extra_reads``: ``{CTRL address: signal}`` also readable (the memory ECC
    registers of :mod:`.pe_ecc`, which decodes their writes itself)."""
    host, ntasks = pe.host, pe.config.tasks
    sram_wr, sram_rd, imem_wr, imem_rd = mem.sram_wr, mem.sram_rd[0], mem.imem_wr, mem.imem_rd
    entry, t_valid, t_bound, t_blocked, t_activated = tasks.entry, tasks.valid, tasks.bound, tasks.blocked, \
        tasks.activated
    write = host.stb & host.we & (host.sel | host.bcast)
    read = host.stb & ~host.we & host.sel
    counters = [pe.counters[name] for name in COUNTER_NAMES]

    with m.If(write):
        with m.Switch(host.space):
            with m.Case(HostSpace.SRAM):
                m.d.comb += [sram_wr.addr.eq(host.addr), sram_wr.data.eq(host.wdata), sram_wr.en.eq(1)]
            with m.Case(HostSpace.IMEM):
                m.d.comb += [imem_wr.addr.eq(host.addr), imem_wr.data.eq(host.wdata), imem_wr.en.eq(1)]
            with m.Case(HostSpace.TASK):
                with m.Switch(host.addr):
                    for t in range(ntasks):
                        with m.Case(t):
                            m.d.sync += [entry[t].eq(host.wdata[:16]), t_bound[t].eq(host.wdata[16]),
                                         t_blocked[t].eq(host.wdata[17]), t_valid[t].eq(host.wdata[18]),
                                         t_activated[t].eq(0)]
            with m.Case(HostSpace.CTRL):
                with m.Switch(host.addr):
                    with m.Case(0):
                        with m.If((host.wdata < ntasks) & t_valid.bit_select(host.wdata[:6], 1)):
                            m.d.sync += t_activated.bit_select(host.wdata[:6], 1).eq(1)
                    for i, counter in enumerate(counters):
                        with m.Case(i + 1):
                            m.d.sync += counter.eq(host.wdata)

    # Reads: memories through their read ports (data next cycle), the rest registered.
    with m.If(read):
        with m.Switch(host.space):
            with m.Case(HostSpace.SRAM):
                m.d.comb += sram_rd.addr.eq(host.addr)
            with m.Case(HostSpace.IMEM):
                m.d.comb += imem_rd.addr.eq(host.addr)
    read_space = Signal(HostSpace)
    read_value = Signal(32)
    with m.If(read):
        m.d.sync += [read_space.eq(host.space), read_value.eq(0)]
        with m.Switch(host.space):
            with m.Case(HostSpace.TASK):
                with m.Switch(host.addr):
                    for t in range(ntasks):
                        with m.Case(t):
                            m.d.sync += read_value.eq(Cat(entry[t], Const(0, 16 - len(entry[t])),
                                                          t_bound[t], t_blocked[t], t_valid[t]))
            with m.Case(HostSpace.CTRL):
                with m.Switch(host.addr):
                    for i, counter in enumerate(counters):
                        with m.Case(i + 1):
                            m.d.sync += read_value.eq(counter)
                    for addr, value in (extra_reads or {}).items():
                        with m.Case(addr):
                            m.d.sync += read_value.eq(value)
    with m.Switch(read_space):
        with m.Case(HostSpace.SRAM):
            m.d.comb += host.rdata.eq(sram_rd.data)
        with m.Case(HostSpace.IMEM):
            m.d.comb += host.rdata.eq(imem_rd.data)
        with m.Default():
            m.d.comb += host.rdata.eq(read_value)
