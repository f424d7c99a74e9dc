"""The index cycles of the indexed vector instructions ``fmacx`` and ``fdotx`` in RTL.

Both run an ``fmacw dd, da, db`` per index read from the fabric
(``docs/architecture.md`` section 4.5; the golden model:
:mod:`wse.sim.golden.pe_indexed`). :func:`indexed_control` adds to the PE
the part that reads the indices: an *index cycle* is the instruction's
first cycle, a cycle after a waiting index cycle, or the cycle in which
the vector engine completes an index's elements (its ``done``). In an index
cycle the head wavelet of the instruction's ``color`` is popped through the
first pop port (the cycle waits while the queue is empty): a control
wavelet ends the instruction and writes its data to ``rd``; a data wavelet
writes ``da.base`` and starts the engine on the index's elements in the
next cycle (``in_chunk``), as ``fmacw`` (``weighted``). ``fdotx`` also adds
1 to ``dd.base`` in each index cycle that follows an index's elements. The
engine is held inactive outside ``in_chunk``.
"""

from __future__ import annotations

from typing import NamedTuple

from amaranth import Signal

from wse.config import DATA_BITS
from wse.firmware import isa

__all__ = ["Indexed", "indexed_control"]


class Indexed(NamedTuple):
    """The index logic as the PE sees it: ``is_x`` (the running instruction is
    ``fmacx`` or ``fdotx``), ``in_chunk`` (the engine runs an index's elements),
    ``pop`` (pop the head of the instruction's color), ``end`` (a control
    wavelet ends the instruction this cycle) and ``stall`` (an index cycle
    waits for a wavelet)."""

    is_x: Signal
    in_chunk: Signal
    pop: Signal
    end: Signal
    stall: Signal


def indexed_control(m, pe, d, rx, vec) -> Indexed:
    """The index cycles of ``pe``'s running ``fmacx``/``fdotx``: ``d`` its decoded
    instruction, ``rx`` its input queues, ``vec`` its vector engine."""
    cfg = pe.config
    dec = d.dec
    is_x, in_chunk = Signal(), Signal()
    index_cycle, has, pop, end, take, stall = (Signal() for _ in range(6))
    head = rx.head_a                       # the first pop port shows dec.color's head (see PE._execute)
    m.d.comb += [
        is_x.eq(d.is_(*isa.INDEXED)),
        index_cycle.eq(pe.running & is_x & (~in_chunk | vec.done)),
        has.eq((dec.color < cfg.colors) & rx.has.bit_select(dec.color, 1)),
        pop.eq(index_cycle & has),
        end.eq(pop & head[DATA_BITS]),
        take.eq(pop & ~head[DATA_BITS]),
        stall.eq(index_cycle & ~has),
    ]
    with m.If(index_cycle):
        m.d.sync += in_chunk.eq(take)
    # fdotx's +1 first: where dd and da name one register, the index written after it wins (as in golden)
    with m.If(index_cycle & in_chunk & d.is_("fdotx")):
        pe._write_dsd(m, dec.dd, base=d.vd.base + 1)
    with m.If(take):
        pe._write_dsd(m, dec.da, base=head[:16])
    with m.If(end):
        m.d.comb += [d.reg_we.eq(1), d.reg_data.eq(head[:DATA_BITS])]
    return Indexed(is_x, in_chunk, pop, end, stall)
