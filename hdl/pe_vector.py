"""The PE's vector engine: element sequencing over descriptors.

:class:`VectorEngine` decides, cycle by cycle, whether the next element of
the running vector instruction issues (``docs/architecture.md`` section 4.5),
presents its memory read addresses, pops its fabric-in sources and, one cycle
later, hands the element's operands to the PE, which computes the result with
the floating-point blocks and writes it. It also counts ``fmacw``'s three
indices (``i mod Ld``, ``i mod La``, ``i div T``).
"""

from amaranth import Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from wse.config import FabricConfig
from wse.firmware.isa import DsdKind

__all__ = ["Dsd", "VectorEngine"]

#: A descriptor register (``docs/architecture.md`` section 4.4).
Dsd = data.StructLayout({"kind": 2, "base": 16, "length": 16, "stride": signed(16)})


class VectorEngine(wiring.Component):
    """Issue and operand logic of the vector instructions.

    An element *issues* in a cycle when every fabric-in source has a wavelet
    waiting and, for a fabric-out destination, ``tx_level + inflight <
    tx_depth`` (``inflight``: the previous element issued last cycle and goes
    to the fabric). Issuing presents the memory addresses (the data arrives
    in the next cycle on ``read_data``) and pops the fabric-in sources; in
    the next cycle ``wb_valid`` is high with the element's operands. The
    instruction completes (``done``) in the cycle after its last element
    issued, or at once when it has no elements: ``n + 1`` cycles with no
    waiting.

    Descriptor kinds follow the RTL's fault rules (see :mod:`wse.hdl.pe`):
    only a fabric-in source reads the fabric and only a fabric-out
    destination writes it, anything else is memory; ``fmacw`` reads ``dd``
    and ``da`` as memory.

    Parameters
    ----------
    config : FabricConfig

    Members
    -------
    active : ``In(1)``
        The running instruction is a vector instruction (this cycle).
    weighted : ``In(1)``
        It is ``fmacw``.
    has_dd, has_db : ``In(1)``
        Its format has a destination descriptor / a second source descriptor.
    dd, da, db : ``In(Dsd)``
        The descriptor registers it names.
    rx_has : ``In(64)``
        Bit ``c``: input queue ``c`` holds a wavelet.
    tx_level : ``In(range(tx_depth + 1))``
        Wavelets in the output queue.
    head_a, head_b : ``In(32)``
        Data of the head wavelets of colors ``color_a`` and ``color_b``.
    read_data : ``In(32).array(3)``
        Data memory read ports 0..2 (addresses given in the previous cycle).
    issue, done, stalled : ``Out(1)``
        An element issues / the instruction completes / it waits for the fabric.
    read_addr : ``Out(16).array(3)``
        Port 0: ``da``; port 1: ``db`` (``fmacw``: ``dd``, the accumulator
        word); port 2: the ``fmacw`` weight.
    reads : ``Out(1).array(3)``
        The issuing element takes the word of read port ``k`` (a memory
        source; the memory ECC counts only such reads).
    pop_a, pop_b : ``Out(1)``; color_a, color_b : ``Out(16)``
        Pop the input queue of this color (``da``'s, ``db``'s).
    wb_valid : ``Out(1)``
        The element that issued last cycle is written this cycle ...
    wb_fabout : ``Out(1)``
        ... to the output queue, color ``dd.base`` (else to memory at
        ``wb_addr`` when there is a ``dd``, else to the register ``rd``).
    wb_addr : ``Out(16)``
    a, b, acc : ``Out(32)``
        Its first source, its second source (``fmacw``: the weight) and, for
        ``fmacw``, the destination word it accumulates into.
    """

    def __init__(self, config: FabricConfig):
        if not isinstance(config, FabricConfig):
            self._MustUse__silence = True  # a rejected design is not an unused one
            raise TypeError(f"config must be a FabricConfig, not {config!r}")
        self.config = config
        super().__init__({
            "active": In(1), "weighted": In(1), "has_dd": In(1), "has_db": In(1),
            "dd": In(Dsd), "da": In(Dsd), "db": In(Dsd),
            "rx_has": In(64), "tx_level": In(range(config.tx_depth + 1)),
            "head_a": In(32), "head_b": In(32),
            "read_data": In(32).array(3),
            "issue": Out(1), "done": Out(1), "stalled": Out(1),
            "read_addr": Out(16).array(3), "reads": Out(1).array(3),
            "pop_a": Out(1), "pop_b": Out(1), "color_a": Out(16), "color_b": Out(16),
            "wb_valid": Out(1), "wb_fabout": Out(1), "wb_addr": Out(16),
            "a": Out(32), "b": Out(32), "acc": Out(32),
        })

    def elaborate(self, platform):
        cfg = self.config
        m = Module()
        dd, da, db, weighted = self.dd, self.da, self.db, self.weighted

        a_fabin = ~weighted & (da.kind == DsdKind.FABIN)
        b_fabin = self.has_db & (db.kind == DsdKind.FABIN)
        d_fabout = ~weighted & self.has_dd & (dd.kind == DsdKind.FABOUT)

        # Elements: the destination's length (dot, fsum: da's); fmacw: max(Ld, La), chunks of T = min(Ld, La).
        period, n = Signal(16), Signal(16)
        m.d.comb += [
            period.eq(Mux(dd.length < da.length, dd.length, da.length)),
            n.eq(Mux(weighted, Mux(period == 0, 0, Mux(dd.length < da.length, da.length, dd.length)),
                     Mux(self.has_dd, dd.length, da.length))),
        ]

        count = Signal(16)                          # elements issued
        started = Signal()                          # past the instruction's first cycle
        index_a, index_d, index_t = Signal(16), Signal(16), Signal(16)  # fmacw: i mod La, i mod Ld, i mod T
        addr_a, addr_b, addr_d = Signal(16), Signal(16), Signal(16)
        cur_a, cur_b, cur_d = Signal(16), Signal(16), Signal(16)
        m.d.comb += [
            cur_a.eq(Mux(started, addr_a, da.base)),
            cur_b.eq(Mux(started, addr_b, db.base)),
            cur_d.eq(Mux(started, addr_d, dd.base)),
        ]
        chunk_first = ~weighted | (index_t == 0)   # the element reads db (fmacw: the next weight)
        need_b = b_fabin & chunk_first

        def has_wavelet(color):
            return (color < cfg.colors) & self.rx_has.bit_select(color[:5], 1)

        wb_valid, wb_first = Signal(), Signal()
        inflight = wb_valid & d_fabout
        room = (dd.base < cfg.colors) & (self.tx_level + inflight < cfg.tx_depth)
        m.d.comb += [
            self.done.eq(count == n),
            self.issue.eq(self.active & ~self.done & (~a_fabin | has_wavelet(da.base))
                          & (~need_b | has_wavelet(db.base)) & (~d_fabout | room)),
            self.stalled.eq(self.active & ~self.done & ~self.issue),
            self.read_addr[0].eq(cur_a),
            self.read_addr[1].eq(Mux(weighted, cur_d, cur_b)),
            self.read_addr[2].eq(cur_b),
            self.reads[0].eq(self.issue & ~a_fabin),
            self.reads[1].eq(self.issue & (weighted | (self.has_db & ~b_fabin))),
            self.reads[2].eq(self.issue & weighted & chunk_first & ~b_fabin),
            self.pop_a.eq(self.issue & a_fabin), self.color_a.eq(da.base),
            self.pop_b.eq(self.issue & need_b), self.color_b.eq(db.base),
        ]

        fab_a, fab_b = Signal(32), Signal(32)     # fabric-in data of the element being written
        with m.If(self.active):
            m.d.sync += started.eq(~self.done)
            with m.If(self.done):
                m.d.sync += [count.eq(0), index_a.eq(0), index_d.eq(0), index_t.eq(0)]
            with m.Elif(self.issue):
                # fmacw walks dd and da cyclically and moves to the next weight after T elements.
                wrap_a = weighted & (index_a + 1 == da.length)
                wrap_d = weighted & (index_d + 1 == dd.length)
                next_weight = ~weighted | (index_t + 1 == period)
                m.d.sync += [
                    count.eq(count + 1),
                    index_a.eq(Mux(wrap_a, 0, index_a + 1)),
                    index_d.eq(Mux(wrap_d, 0, index_d + 1)),
                    index_t.eq(Mux(next_weight, 0, index_t + 1)),
                    addr_a.eq(Mux(wrap_a, da.base, cur_a + da.stride)),
                    addr_d.eq(Mux(wrap_d, dd.base, cur_d + dd.stride)),
                    addr_b.eq(Mux(next_weight, cur_b + db.stride, cur_b)),
                    self.wb_addr.eq(cur_d),
                    wb_first.eq(chunk_first),
                    fab_a.eq(self.head_a),
                ]
                with m.If(need_b):
                    m.d.sync += fab_b.eq(self.head_b)
            with m.Else():
                m.d.sync += [addr_a.eq(cur_a), addr_b.eq(cur_b), addr_d.eq(cur_d)]
        m.d.sync += wb_valid.eq(self.issue)

        # Write stage. fmacw's weight is read with the first element of its chunk and held.
        b_read = Signal(32)
        weight = Signal(32)
        m.d.comb += b_read.eq(Mux(b_fabin, fab_b, Mux(weighted, self.read_data[2], self.read_data[1])))
        with m.If(wb_valid & wb_first):
            m.d.sync += weight.eq(b_read)
        m.d.comb += [
            self.wb_valid.eq(wb_valid),
            self.wb_fabout.eq(d_fabout),
            self.a.eq(Mux(a_fabin, fab_a, self.read_data[0])),
            self.b.eq(Mux(weighted & ~wb_first, weight, b_read)),
            self.acc.eq(self.read_data[1]),
        ]
        return m
