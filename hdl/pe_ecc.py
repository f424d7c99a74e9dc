"""SECDED ECC on the data memory of the processing element (:class:`~wse.hdl.pe.PE`).

The RTL of ``docs/architecture.md`` section 4.7, bit for bit the code of the
golden model (:mod:`wse.sim.golden.ecc`): every data-memory word is stored as
a 39-bit code word (bits 0..31 the data, 32..37 the six Hamming check bits,
38 the overall parity).

* **Write port**: the memory has one, the PE's (so that it maps to block
  RAM: the three read ports become three replicas of a one-write,
  one-read memory). The PE writes 32-bit data; the encoder adds the check
  bits (:func:`ecc_storage` hands the PE a port of the old shape, so the
  rest of the PE is unchanged). Scrubs and flips share the port with it.
* **Read ports**: each of the three read ports has a decoder; the PE sees the
  corrected word. A read is *used* when an instruction or the host takes its
  word (``ld``/``ldsd``, a vector element's memory source, a host ``SRAM``
  read); only used reads count. A used read of a word with one flip counts
  ``ecc corrected`` (a word read by two ports in the same cycle counts once)
  and its corrected code word goes to the *pending-scrub buffer*
  (:data:`SCRUB_SLOTS` slots of address and code word): it takes the lowest
  slot free at the start of the cycle, in port order. A slot is written back,
  the lowest first, in a cycle in which the PE runs no task and the port is
  free; every read bypasses the buffer (a pending word reads corrected, so it
  counts nothing again); every write through the port empties the slots of
  its address, one taken in the same cycle included. A correction that finds
  no free slot is dropped: the word stays flipped and its next used read
  counts it again (the golden model keeps the same slots,
  :mod:`wse.sim.golden.ecc`). An uncorrectable word counts ``ecc
  detected``, latches the report (address, stored data, check bits,
  syndrome, task and pc) and stops the PE: its task ends, no task is
  selected and its ECC counts freeze until the host writes the ``detected``
  counter.
* **Host bus** (``CTRL`` space, after the counters of
  :data:`~wse.hdl.wavelet.COUNTER_NAMES`): :data:`ECC_ADDRS`. ``corrected``
  and ``detected`` read the counters and a write sets them (writing
  ``detected`` also clears the latched report); ``where``, ``stored`` and
  ``syndrome`` read the report; ``flip_data`` (write) holds a mask of data
  bits and a write of ``addr | check_mask << 16`` to ``flip`` flips those
  bits of the stored code word at ``addr`` (read in that cycle through read
  port 0, a pending slot's word if it has one, and written through the write
  port in the PE's next cycle, emptying the word's slot; a PE or host write
  in that cycle takes the port and the flip is lost, so the host keeps that
  cycle free): fault injection. A write of ``flip_at`` (a run
  cycle) first makes the next ``flip`` write arm the flip instead (its masks
  and address kept): it happens in the first cycle of a run, at or after
  that cycle (the PE's ``clock`` input), in which the PE is enabled, runs
  no task and selects none (a flip that falls during a task waits for its
  end, so it never lands inside an instruction, ``docs/architecture.md``
  section 4.7); one armed flip per PE, arming again replaces it.

The fault-free PE takes exactly the cycles it took without ECC: the decoders
are combinational on the read data, and scrubs never take the write port
from the PE (a fault-free PE never fills a slot).
"""

from __future__ import annotations

from functools import reduce
from typing import NamedTuple

from amaranth import Cat, Const, Mux, Signal

from .wavelet import COUNTER_NAMES, HostSpace

__all__ = ["CODE_BITS", "SCRUB_SLOTS", "POSITIONS", "ECC_ADDRS", "EccPorts", "ecc_storage", "ecc_logic", "encoder", "decoder"]

DATA_BITS = 32
CODE_BITS = 39
#: Hamming position (1..38) of each data bit: the positions that are not powers of two.
POSITIONS = [p for p in range(1, 39) if p & (p - 1)]
#: Entries of the pending-scrub buffer (the golden model's ``wse.sim.golden.ecc.SCRUB_SLOTS``).
SCRUB_SLOTS = 4
#: ``CTRL`` addresses of the ECC registers (after the performance counters).
ECC_ADDRS = {name: len(COUNTER_NAMES) + 1 + i for i, name in enumerate(
    ("corrected", "detected", "where", "stored", "syndrome", "flip_data", "flip", "flip_at"))}


#: MASKS[j]: the data bits that Hamming check bit j covers.
MASKS = [sum(1 << i for i, p in enumerate(POSITIONS) if p >> j & 1) for j in range(6)]


def encoder(data) -> object:
    """The 7 check bits of 32-bit ``data`` (bits 0..5 Hamming, bit 6 overall parity)."""
    hamming = Cat(*((data & Const(mask, DATA_BITS)).xor() for mask in MASKS))
    return Cat(hamming, Cat(data, hamming).xor())


def decoder(m, word, name: str):
    """Decode a stored 39-bit ``word``: returns ``(data, corrected, detected,
    syndrome)``, the corrected data and whether the word had one flip or an
    uncorrectable error."""
    data, check = word[:DATA_BITS], word[DATA_BITS:]
    syndrome = Signal(6, name=f"{name}_syndrome")
    odd = Signal(name=f"{name}_odd")
    m.d.comb += [syndrome.eq(encoder(data)[:6] ^ check[:6]), odd.eq(word.xor())]
    fixed = Signal(DATA_BITS, name=f"{name}_data")
    m.d.comb += fixed.eq(data ^ Cat(*(odd & (syndrome == p) for p in POSITIONS)))
    corrected = odd & (syndrome < CODE_BITS)
    detected = (~odd & (syndrome != 0)) | (odd & (syndrome >= CODE_BITS))
    return fixed, corrected, detected, syndrome


class _WritePort(NamedTuple):
    """The PE's view of the write port: 32-bit ``data``, encoded on the way in."""

    addr: Signal
    data: Signal
    en: Signal


class _ReadPort(NamedTuple):
    """The PE's view of a read port: ``data`` is the corrected word."""

    addr: Signal
    data: Signal


class _Slot(NamedTuple):
    """One entry of the pending-scrub buffer: a corrected code word waiting for the write port."""

    valid: Signal
    addr: Signal
    word: Signal


class EccPorts(NamedTuple):
    """The raw 39-bit ports behind the PE's ports: the memory's one write
    port and the PE's request for it (``view``), the read ports, their
    registered addresses (``addr_q``: the address of the word arriving now),
    the words they deliver after the bypass of the pending-scrub buffer
    (``raw``), their decoders' outputs ``(data, corrected, detected,
    syndrome)`` and the buffer's :data:`SCRUB_SLOTS` ``slots``."""

    write: object
    view: _WritePort
    read: list
    addr_q: list
    raw: list
    decoded: list
    slots: list


def ecc_storage(m, memory) -> tuple[_WritePort, list, EccPorts]:
    """The ports of the 39-bit data ``memory``: the PE's write port and its
    three read ports (32-bit views; the reads are transparent for the one
    write port and bypass the pending-scrub buffer), and the raw ports for
    :func:`ecc_logic`, which drives the memory's write port."""
    wr = memory.write_port()
    rd = [memory.read_port(transparent_for=(wr,)) for _ in range(3)]
    addr_bits = len(wr.addr)
    view = _WritePort(Signal(addr_bits, name="sram_waddr"), Signal(DATA_BITS, name="sram_wdata"),
                      Signal(name="sram_we"))
    # Part of the memory's contents: a reset keeps the pending scrubs, as it keeps the memory.
    slots = [_Slot(Signal(name=f"scrub{j}_valid", reset_less=True),
                   Signal(addr_bits, name=f"scrub{j}_addr", reset_less=True),
                   Signal(CODE_BITS, name=f"scrub{j}_word", reset_less=True)) for j in range(SCRUB_SLOTS)]
    addr_q = [Signal(addr_bits, name=f"ecc_addr{k}") for k in range(3)]
    m.d.sync += [addr_q[k].eq(port.addr) for k, port in enumerate(rd)]
    views, raws, decoded = [], [], []
    for k, port in enumerate(rd):
        raw = Signal(CODE_BITS, name=f"sram_rd{k}_raw")
        m.d.comb += raw.eq(port.data)
        for slot in slots:                # an address is pending in one slot at most
            with m.If(slot.valid & (slot.addr == addr_q[k])):
                m.d.comb += raw.eq(slot.word)
        dec = decoder(m, raw, f"sram_rd{k}")
        raws.append(raw)
        decoded.append(dec)
        views.append(_ReadPort(port.addr, dec[0]))
    return view, views, EccPorts(wr, view, rd, addr_q, raws, decoded, slots)


def _lowest(m, bits, name: str) -> Signal:
    """The lowest set bit of ``bits``, one-hot (0 when none is set)."""
    one = Signal(len(bits), name=name)
    m.d.comb += one.eq(bits & (~bits + 1))
    return one


def _scrub_buffer(m, pe, ports: EccPorts, fix: list, flip) -> None:
    """The pending-scrub buffer and the memory's one write port.

    The port writes, in this order of priority: the PE's (or the host's)
    word; the flipped word of a host flip (``flip``: ``(pending, addr,
    word)``); the lowest pending slot, in a cycle in which the PE runs no
    task. A corrected word (``fix[k]``: port ``k`` corrects its word this
    cycle) takes the lowest slot free at the start of the cycle, in port
    order; with none free its write-back is dropped (the word stays flipped).
    Every write empties the slots of its address, new ones included."""
    wr, view, slots = ports.write, ports.view, ports.slots
    valid = Cat(*(s.valid for s in slots))
    free = Signal(SCRUB_SLOTS, name="scrub_free")
    m.d.comb += free.eq(~valid)
    takes, picks = [], []
    for k in range(3):
        pick = _lowest(m, free, f"scrub_pick{k}")
        take = Signal(name=f"scrub_take{k}")
        m.d.comb += take.eq(fix[k] & free.any())
        nxt = Signal(SCRUB_SLOTS, name=f"scrub_free{k + 1}")
        m.d.comb += nxt.eq(Mux(take, free & ~pick, free))
        takes.append(take)
        picks.append(pick)
        free = nxt
    oldest = _lowest(m, valid, "scrub_drain")
    flip_pending, flip_addr, flip_word = flip
    with m.If(view.en):
        m.d.comb += [wr.addr.eq(view.addr), wr.data.eq(Cat(view.data, encoder(view.data))), wr.en.eq(1)]
    with m.Elif(flip_pending):
        m.d.comb += [wr.addr.eq(flip_addr), wr.data.eq(flip_word), wr.en.eq(1)]
    with m.Elif(~pe.running & valid.any()):
        m.d.comb += wr.en.eq(1)
        for j, slot in enumerate(slots):
            with m.If(oldest[j]):
                m.d.comb += [wr.addr.eq(slot.addr), wr.data.eq(slot.word)]
    for j, slot in enumerate(slots):
        addr = Signal.like(slot.addr, name=f"scrub{j}_next_addr")
        m.d.comb += addr.eq(slot.addr)
        alloc = Const(0)
        for k in range(3):
            taken = takes[k] & picks[k][j]
            alloc = alloc | taken
            with m.If(taken):
                data = ports.decoded[k][0]
                m.d.comb += addr.eq(ports.addr_q[k])
                m.d.sync += [slot.addr.eq(ports.addr_q[k]), slot.word.eq(Cat(data, encoder(data)))]
        m.d.sync += slot.valid.eq((slot.valid | alloc) & ~(wr.en & (wr.addr == addr)))


def ecc_logic(m, pe, ports: EccPorts, used: list, select) -> dict:
    """Counting, scrubbing, the error report, stopping the PE and injection.

    ``used[k]``: read port ``k`` presents the address of a word that an
    instruction or the host takes (its word is decoded in the next cycle).
    ``select``: the scheduler's select signal, forced low while the PE is
    stopped. Returns ``{CTRL address: signal}`` of the readable registers
    for the host port."""
    host = pe.host
    count = pe.ecc_counters
    addr_bits = len(ports.read[0].addr)
    addr_q = ports.addr_q
    # The used reads, as their data arrives.
    used_q = [Signal(name=f"ecc_used{k}") for k in range(3)]
    m.d.sync += [used_q[k].eq(used[k]) for k in range(3)]
    stopped = Signal()        # an uncorrectable word was read: the PE stops, the report is latched
    where, stored, syndrome = Signal(32), Signal(32), Signal(32)
    fix, bad = [], []
    for k, (data, corrected, detected, _) in enumerate(ports.decoded):
        # A word that an earlier port read in this cycle counts there.
        first = ~reduce(lambda a, b: a | b, [used_q[j] & (addr_q[j] == addr_q[k]) for j in range(k)], Const(0))
        # An uncorrectable word on an earlier port stops the read there: this port's correction is not
        # counted and takes no slot (the golden model raises at the first bad word in port order).
        earlier_bad = reduce(lambda a, b: a | b, bad, Const(0))
        fix.append(Signal(name=f"ecc_fix{k}"))
        bad.append(Signal(name=f"ecc_bad{k}"))
        m.d.comb += [fix[k].eq(~stopped & used_q[k] & first & corrected & ~earlier_bad),
                     bad[k].eq(~stopped & used_q[k] & detected)]
    n_fixed = sum(fix[k] for k in range(3))
    any_bad = Signal()
    m.d.comb += any_bad.eq(Cat(*bad).any())
    m.d.sync += count["corrected"].eq(count["corrected"] + n_fixed)
    with m.If(any_bad):
        m.d.sync += [count["detected"].eq(count["detected"] + 1), stopped.eq(1), pe.running.eq(0)]
        # The report of the first port with an uncorrectable word.
        for k in reversed(range(3)):
            with m.If(bad[k]):
                raw = ports.raw[k]
                m.d.sync += [
                    where.eq(Cat(addr_q[k], Const(0, 16 - addr_bits), pe.task, Const(0, 8 - len(pe.task)),
                                 pe.running)),
                    stored.eq(raw[:DATA_BITS]),
                    syndrome.eq(Cat(raw[DATA_BITS:], Const(0, 1), ports.decoded[k][3], Const(0, 2), pe.pc)),
                ]
    with m.If(stopped):
        m.d.comb += select.eq(0)

    # Host: set the counters (writing `detected` clears the report), inject flips.
    write = host.stb & host.we & (host.sel | host.bcast) & (host.space == HostSpace.CTRL)
    flip_data = Signal(DATA_BITS)
    flip_pending = Signal()
    flip_addr = Signal(addr_bits)
    flip_check = Signal(CODE_BITS - DATA_BITS)
    flip_mask = Signal(DATA_BITS)       # the data mask of the flip in progress
    m.d.sync += flip_pending.eq(0)
    # A flip armed at a run cycle: lands in the first enabled cycle at or after it with no task running
    # or starting.
    timed, armed = Signal(), Signal()
    armed_at, armed_data = Signal(32), Signal(DATA_BITS)
    armed_addr, armed_check = Signal(addr_bits), Signal(CODE_BITS - DATA_BITS)
    with m.If(armed & pe.enable & ~pe.running & ~select & (pe.clock >= armed_at)):
        m.d.comb += ports.read[0].addr.eq(armed_addr)
        m.d.sync += [armed.eq(0), flip_pending.eq(1), flip_addr.eq(armed_addr), flip_check.eq(armed_check),
                     flip_mask.eq(armed_data)]
    with m.If(write):
        with m.Switch(host.addr):
            with m.Case(ECC_ADDRS["corrected"]):
                m.d.sync += count["corrected"].eq(host.wdata)
            with m.Case(ECC_ADDRS["detected"]):
                m.d.sync += [count["detected"].eq(host.wdata), stopped.eq(0)]
            with m.Case(ECC_ADDRS["flip_data"]):
                m.d.sync += flip_data.eq(host.wdata)
            with m.Case(ECC_ADDRS["flip_at"]):
                m.d.sync += [armed_at.eq(host.wdata), timed.eq(1)]
            with m.Case(ECC_ADDRS["flip"]):
                with m.If(timed):
                    m.d.sync += [timed.eq(0), armed.eq(1), armed_addr.eq(host.wdata[:addr_bits]),
                                 armed_check.eq(host.wdata[16:16 + CODE_BITS - DATA_BITS]),
                                 armed_data.eq(flip_data)]
                with m.Else():
                    m.d.comb += ports.read[0].addr.eq(host.wdata[:addr_bits])
                    m.d.sync += [flip_pending.eq(1), flip_addr.eq(host.wdata[:addr_bits]),
                                 flip_check.eq(host.wdata[16:16 + CODE_BITS - DATA_BITS]), flip_mask.eq(flip_data)]
    # The flip is written in the PE's next cycle (a PE or host write then takes the port instead).
    _scrub_buffer(m, pe, ports, fix, (flip_pending, flip_addr, ports.raw[0] ^ Cat(flip_mask, flip_check)))
    return {ECC_ADDRS["corrected"]: count["corrected"], ECC_ADDRS["detected"]: count["detected"],
            ECC_ADDRS["where"]: Cat(where[:31], stopped), ECC_ADDRS["stored"]: stored, ECC_ADDRS["syndrome"]: syndrome}
