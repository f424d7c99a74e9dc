"""The router's FIFO: Amaranth's ``SyncFIFO`` behaviour, with its state visible to a proof.

:class:`RouterFIFO` is a synchronous first-in first-out queue with the
interface, the cycle behaviour and the generated logic of
:class:`amaranth.lib.fifo.SyncFIFO` (a write is seen by the reader one cycle
later; the read data is the memory at ``consume``, combinationally; ``w_rdy``
and ``r_rdy`` come from ``level``). What it adds is for the router's formal
harness (``hdl/formal.py``): its write and read pointers ``produce`` and
``consume`` are attributes, so an invariant can name them, and with
``visible=True`` each storage slot has a read port of its own (``slots``),
so an invariant can say which slot holds which wavelet. The RTL builds it
with ``visible=False``: the same memory, the same ports and the same
Verilog as ``SyncFIFO`` (``tests/test_formal.py`` compares them).

Under ``platform="formal"`` it asserts its own pointer invariants (both
pointers inside the memory; ``level`` is the distance from ``consume`` to
``produce``, full or empty when they meet). ``SyncFIFO`` assumes them in the
first cycle and asserts them later; here the reset state satisfies them and
they are proved, so a k-induction step may use them as hypotheses.
"""

from amaranth import Module, Mux, Signal
from amaranth.hdl import Assert, Elaboratable
from amaranth.lib.memory import Memory

__all__ = ["RouterFIFO"]


def _incr(signal, modulo):
    """``signal + 1`` modulo ``modulo`` (a plain add when the modulo is the signal's range)."""
    if modulo == 2 ** len(signal):
        return signal + 1
    return Mux(signal == modulo - 1, 0, signal + 1)


class RouterFIFO(Elaboratable):
    """A ``SyncFIFO`` of ``depth`` entries of ``width`` bits whose pointers (and, if asked, slots) can be read.

    Parameters
    ----------
    width, depth : int
        Entry width in bits and number of entries (``depth >= 1``).
    visible : bool
        Give every storage slot a combinational read port (``slots[i]`` is
        the entry at address ``i``); for the formal harness only.

    Members
    -------
    w_data, w_en, w_rdy, w_level, r_data, r_en, r_rdy, r_level, level
        As in :class:`amaranth.lib.fifo.SyncFIFO`.
    produce, consume : Signal(range(depth))
        The addresses of the next write and of the head.
    slots : list of Signal(width)
        With ``visible``: the stored entries by address (empty list otherwise).

    Raises
    ------
    TypeError
        If ``width`` or ``depth`` is not a positive integer.
    """

    def __init__(self, *, width: int, depth: int, visible: bool = False):
        for name, value in (("width", width), ("depth", depth)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                self._MustUse__silence = True  # a rejected FIFO is not an unused one
                raise TypeError(f"FIFO {name} must be a positive integer, not {value!r}")
        self.width, self.depth, self.visible = width, depth, bool(visible)
        self.w_data = Signal(width, reset_less=True)
        self.w_rdy = Signal()
        self.w_en = Signal()
        self.w_level = Signal(range(depth + 1))
        self.r_data = Signal(width, reset_less=True)
        self.r_rdy = Signal()
        self.r_en = Signal()
        self.r_level = Signal(range(depth + 1))
        self.level = Signal(range(depth + 1))
        self.produce = Signal(range(depth))
        self.consume = Signal(range(depth))
        self.slots = [Signal(width, name=f"slot_{i}") for i in range(depth)] if self.visible else []

    def elaborate(self, platform):
        m = Module()
        m.d.comb += [
            self.w_rdy.eq(self.level != self.depth),
            self.r_rdy.eq(self.level != 0),
            self.w_level.eq(self.level),
            self.r_level.eq(self.level),
        ]
        do_read = self.r_rdy & self.r_en
        do_write = self.w_rdy & self.w_en

        storage = m.submodules.storage = Memory(shape=self.width, depth=self.depth, init=[])
        w_port = storage.write_port()
        r_port = storage.read_port(domain="comb")
        produce, consume = self.produce, self.consume
        m.d.comb += [
            w_port.addr.eq(produce),
            w_port.data.eq(self.w_data),
            w_port.en.eq(self.w_en & self.w_rdy),
        ]
        with m.If(do_write):
            m.d.sync += produce.eq(_incr(produce, self.depth))
        m.d.comb += [
            r_port.addr.eq(consume),
            self.r_data.eq(r_port.data),
        ]
        with m.If(do_read):
            m.d.sync += consume.eq(_incr(consume, self.depth))
        with m.If(do_write & ~do_read):
            m.d.sync += self.level.eq(self.level + 1)
        with m.If(do_read & ~do_write):
            m.d.sync += self.level.eq(self.level - 1)

        for address, slot in enumerate(self.slots):
            port = storage.read_port(domain="comb")
            m.d.comb += [port.addr.eq(address), slot.eq(port.data)]
        if platform == "formal":
            m.d.comb += [Assert(produce < self.depth), Assert(consume < self.depth)]
            with m.If(produce == consume):
                m.d.comb += Assert((self.level == 0) | (self.level == self.depth))
            with m.If(produce > consume):
                m.d.comb += Assert(self.level == produce - consume)
            with m.If(produce < consume):
                m.d.comb += Assert(self.level == self.depth + produce - consume)
        return m
