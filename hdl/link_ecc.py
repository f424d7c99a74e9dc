"""SECDED ECC on the links between routers (``docs/architecture.md`` section 3.7).

A wavelet crossing a router-to-router link travels with 7 check bits: the
code of the data memory (:mod:`.pe_ecc`) widened to the 38-bit wavelet
(Hamming positions 1..44, the wavelet's bits at the positions that are not
powers of two, bit 6 of the check the overall parity), bit for bit the code
of the golden model (:func:`wse.sim.golden.ecc.wavelet_check`). The coders
sit in the tile's link wiring (:class:`~wse.hdl.tile.Tile`), between the
router's mesh ports and the tile's, so the router is unchanged:

* **Sending side** (``tx``): the encoder adds the check bits to the router's
  outgoing payload. An armed flip (host-bus written: two masks and a cycle)
  XORs its masks into the code word of the first wavelet that leaves by the
  port in run cycle ``flip_at`` or later, then disarms: fault injection.
* **Receiving side** (``rx``): the decoder corrects one flipped bit before
  the router sees the payload and counts it (``corrected``); an
  uncorrectable word is not passed to the router, counts ``detected``,
  latches the report (the received code word, the syndrome and the cycle)
  and raises ``fault``, which stops the run (:class:`~wse.hdl.fabric.Fabric`)
  until the host writes the port's ``detected`` register.

The decoder is combinational between the link and the router's input, and
``ready`` still comes from the router's registered state, so a fault-free
mesh takes exactly the cycles it took without ECC.

**Host bus** (``HostSpace.LINK``, address ``port * 8 + register``, port N,
E, S, W = 0..3, registers :data:`LINK_REGS`): ``corrected`` and ``detected``
(read; a write sets them, writing ``detected`` also clears the report and
the fault), ``report_data`` (the received wavelet's bits 0..31),
``report_bits`` (bits 32..37 | check << 6 | syndrome << 13 | latched << 31),
``report_cycle``, and the flip: ``flip_word`` (write: wavelet bits 0..31 of
the mask), ``flip_high`` (write: wavelet bits 32..37 | check mask << 6) and
``flip_at`` (write: the cycle; arms the flip).
"""

from __future__ import annotations

from amaranth import Cat, Const, Mux, Signal

from .wavelet import HostSpace

__all__ = ["WAVELET_BITS", "CHECK_BITS", "POSITIONS", "LINK_REGS", "PORT_STRIDE", "link_encoder", "link_decoder",
           "LinkCoders"]

WAVELET_BITS = 38
CHECK_BITS = 7
#: Hamming position (1..44) of each wavelet bit: the positions that are not powers of two.
POSITIONS = [p for p in range(1, 45) if p & (p - 1)]
#: MASKS[j]: the wavelet bits that Hamming check bit j covers.
MASKS = [sum(1 << i for i, p in enumerate(POSITIONS) if p >> j & 1) for j in range(6)]
#: Registers of one port in the ``LINK`` host space (address ``port * PORT_STRIDE + register``).
LINK_REGS = {name: i for i, name in enumerate(
    ("corrected", "detected", "report_data", "report_bits", "report_cycle", "flip_word", "flip_high", "flip_at"))}
PORT_STRIDE = 8


def link_encoder(word) -> object:
    """The 7 check bits of a 38-bit wavelet ``word`` (bits 0..5 Hamming, bit 6 overall parity)."""
    hamming = Cat(*((word & Const(mask, WAVELET_BITS)).xor() for mask in MASKS))
    return Cat(hamming, Cat(word, hamming).xor())


def link_decoder(m, word, check, name: str):
    """Decode a received wavelet ``word`` (38 bits) with its ``check`` bits:
    returns ``(fixed, corrected, detected, syndrome)``."""
    syndrome = Signal(6, name=f"{name}_syndrome")
    odd = Signal(name=f"{name}_odd")
    m.d.comb += [syndrome.eq(link_encoder(word)[:6] ^ check[:6]), odd.eq(Cat(word, check).xor())]
    fixed = Signal(WAVELET_BITS, name=f"{name}_fixed")
    m.d.comb += fixed.eq(word ^ Cat(*(odd & (syndrome == p) for p in POSITIONS)))
    corrected = odd & (syndrome < WAVELET_BITS + CHECK_BITS)
    detected = (~odd & (syndrome != 0)) | (odd & (syndrome >= WAVELET_BITS + CHECK_BITS))
    return fixed, corrected, detected, syndrome


class LinkCoders:
    """The link coders of one tile, elaborated into the tile's module.

    Parameters
    ----------
    ports : sequence of wse.config.Port
        The tile's ports toward a neighbour (the links that carry check bits).
    """

    def __init__(self, ports):
        self.ports = tuple(ports)

    def elaborate(self, m, tile, router, host, addressed) -> tuple[Signal, Signal]:
        """Wire the coded ports between ``router`` and ``tile`` (members
        ``rx``, ``tx``, ``rx_check``, ``tx_check``, ``clock``, ``link_fault``)
        and answer ``host`` requests of the ``LINK`` space (``addressed``: the
        request is for this tile). Returns ``(read, rdata)``: a ``LINK`` read
        was made in the last cycle, and its data."""
        is_link = host.space == HostSpace.LINK
        write = host.stb & host.we & (host.sel | host.bcast) & is_link
        read = Signal(name="link_read")
        rdata = Signal(32, name="link_rdata")
        m.d.sync += read.eq(addressed & ~host.we & is_link)
        faults = []
        with m.If(addressed & ~host.we & is_link):
            m.d.sync += rdata.eq(0)
        for port in self.ports:
            regs, fault = self._port(m, tile, router, port, write, host)
            faults.append(fault)
            with m.If(addressed & ~host.we & is_link):
                with m.Switch(host.addr):
                    for reg, value in regs.items():
                        with m.Case(int(port) * PORT_STRIDE + LINK_REGS[reg]):
                            m.d.sync += rdata.eq(value)
        m.d.comb += tile.link_fault.eq(Cat(*faults).any() if faults else 0)
        return read, rdata

    def _port(self, m, tile, router, port, write, host) -> tuple[dict, Signal]:
        p = int(port)
        name = f"link_{port.name}"
        base = p * PORT_STRIDE
        out, inp = router.tx[port], router.rx[port]
        # Sending side: encode, and flip the first wavelet at or after the armed cycle.
        flip_word = Signal(WAVELET_BITS, name=f"{name}_flip_word")
        flip_check = Signal(CHECK_BITS, name=f"{name}_flip_check")
        flip_at = Signal(32, name=f"{name}_flip_at")
        armed = Signal(name=f"{name}_armed")
        fire = Signal(name=f"{name}_fire")
        payload = out.payload.as_value()
        m.d.comb += [
            fire.eq(armed & out.valid & (tile.clock >= flip_at)),
            tile.tx[port].valid.eq(out.valid),
            tile.tx[port].payload.eq(payload ^ Mux(fire, flip_word, 0)),
            tile.tx_check[port].eq(link_encoder(payload) ^ Mux(fire, flip_check, 0)),
            out.ready.eq(tile.tx[port].ready),
        ]
        with m.If(fire):
            m.d.sync += armed.eq(0)
        # Receiving side: decode, correct, count; an uncorrectable word stops the run.
        word = tile.rx[port].payload.as_value()
        check = tile.rx_check[port]
        fixed, corrected, detected, syndrome = link_decoder(m, word, check, name)
        counted = {"corrected": Signal(32, name=f"{name}_corrected"), "detected": Signal(32, name=f"{name}_detected")}
        fault = Signal(name=f"{name}_fault")
        report_word = Signal(WAVELET_BITS, name=f"{name}_report_word")
        report_check = Signal(CHECK_BITS, name=f"{name}_report_check")
        report_syndrome = Signal(6, name=f"{name}_report_syndrome")
        report_cycle = Signal(32, name=f"{name}_report_cycle")
        valid = tile.rx[port].valid
        bad = valid & detected
        m.d.comb += [
            inp.valid.eq(valid & ~detected),
            inp.payload.eq(fixed),
            tile.rx[port].ready.eq(inp.ready),
        ]
        with m.If(valid & corrected):
            m.d.sync += counted["corrected"].eq(counted["corrected"] + 1)
        with m.If(bad):
            m.d.sync += counted["detected"].eq(counted["detected"] + 1)
            with m.If(~fault):
                m.d.sync += [fault.eq(1), report_word.eq(word), report_check.eq(check),
                             report_syndrome.eq(syndrome), report_cycle.eq(tile.clock)]
        with m.If(write):
            with m.Switch(host.addr):
                with m.Case(base + LINK_REGS["corrected"]):
                    m.d.sync += counted["corrected"].eq(host.wdata)
                with m.Case(base + LINK_REGS["detected"]):
                    m.d.sync += [counted["detected"].eq(host.wdata), fault.eq(0)]
                with m.Case(base + LINK_REGS["flip_word"]):
                    m.d.sync += flip_word[:32].eq(host.wdata)
                with m.Case(base + LINK_REGS["flip_high"]):
                    m.d.sync += [flip_word[32:].eq(host.wdata[:6]), flip_check.eq(host.wdata[6:13])]
                with m.Case(base + LINK_REGS["flip_at"]):
                    m.d.sync += [flip_at.eq(host.wdata), armed.eq(1)]
        regs = {
            "corrected": counted["corrected"], "detected": counted["detected"],
            "report_data": report_word[:32],
            "report_bits": Cat(report_word[32:], report_check, report_syndrome, Const(0, 12), fault),
            "report_cycle": report_cycle,
        }
        return regs, fault
