"""The indexed vector instructions ``fmacx`` and ``fdotx`` on the golden PE.

Both run ``fmacw dd, da, db`` once per index read from the fabric
(``docs/architecture.md`` section 4.5): in its *index cycle* the instruction
pops the head wavelet of ``color`` (waiting while the queue is empty). A
control wavelet ends it: its data goes to ``rd`` and the next instruction
starts in the next cycle. A data wavelet sets ``da.base`` (its low 16 bits)
and the ``fmacw``'s elements follow, one per cycle from the next cycle on:
``fmacx``'s weights come from the fabric (``db`` fabric-in: the first element
of each chunk waits for its weight and pops it), ``fdotx``'s from memory, and
``fdotx`` then adds 1 to ``dd.base``. The next index cycle is the cycle
after the last element. So an index with ``n`` elements costs ``n + 1``
cycles and the whole instruction ``sum(n + 1) + 1`` with no waiting.

:class:`~wse.sim.golden.pe.PE` keeps the instruction in ``pe.xvec`` and runs
``fmacx``'s elements through its own ``fmacw`` path (``pe.vec``).
"""

from __future__ import annotations

from wse.firmware import isa
from wse.firmware.isa import DsdKind

from .events import pe_stall_begin, pe_stall_end

__all__ = ["begin", "index_cycle", "chunk_done"]

_FMACW = isa.BY_NAME["fmacw"]


def begin(pe, f: dict, ins) -> None:
    """Start ``fmacx``/``fdotx`` (``f`` its fields) on ``pe``: check its descriptors."""
    dst, (da, db) = pe.dsd[f["dd"]], (pe.dsd[f["da"]], pe.dsd[f["db"]])
    if f["color"] >= pe.ncolors:
        raise pe.fault(f"color {f['color']} is not below colors={pe.ncolors}")
    if dst[0] != DsdKind.MEM or da[0] != DsdKind.MEM:
        raise pe.fault(f"{ins.name} needs memory descriptors for dd and da")
    if ins.name == "fmacx":
        if db[0] != DsdKind.FABIN or db[1] >= pe.ncolors:
            raise pe.fault("fmacx needs a fabric-in descriptor (a color below colors) for db")
    elif db[0] != DsdKind.MEM:
        raise pe.fault("fdotx needs a memory descriptor for db")
    pe.xvec = [ins, f, dst, [da, db], 0]
    pe.counters["instructions"] += 1


def index_cycle(pe, t: int) -> None:
    """The index cycle of the running ``fmacx``/``fdotx`` in cycle ``t``."""
    ins, f, dst, srcs, _ = pe.xvec
    color, fab = f["color"], pe.fabric
    queue = pe.rx[color]
    if not queue:
        pe.wait = ("rx", color)
        if pe.rec is not None:
            pe_stall_begin(pe, t, pe.wait)
        return
    if pe.stall_at is not None:
        pe_stall_end(pe, t)
    data, ctrl = queue[0]
    da = srcs[0]
    if not ctrl:
        _check_index(pe, ins, dst, srcs, data)
    fab.rx_pops.append((pe, color))
    if pe.trace is not None:
        pe.trace.append(f"{t:8d} recv  color {color} data {data:#010x} ctrl {ctrl}")
    if ctrl:
        _finish(pe, t, data)
        return
    da[1] = data & 0xFFFF
    ld, la = dst[2], da[2]
    n = max(ld, la) if min(ld, la) else 0
    pe.counters["flops"] += n
    pe.counters["fmac"] += n
    pe.xvec[4] += n + 1
    if ins.name == "fdotx":
        pe._fmacw_chunk(dst, srcs, 0, n, None)
        dst[1] = (dst[1] + 1) & 0xFFFF
        fab.schedule(pe, t + 1 + n)
    else:
        pe.vec = [_FMACW, f, dst, srcs, 0, n, 0, 0]
        fab.schedule(pe, t + 1)


def _check_index(pe, ins, dst, srcs, data: int) -> None:
    """Raise the fault of index wavelet ``data`` (no elements, or a span leaving memory) before the PE
    changes: at a fault the wavelet stays queued and ``da.base`` keeps its value, as in the vector model."""
    da = srcs[0]
    ld, la = dst[2], da[2]
    n = max(ld, la) if min(ld, la) else 0
    if n == 0:
        raise pe.fault(f"{ins.name} with no elements per index (dd and da must not be empty)")
    old = da[1]
    da[1] = data & 0xFFFF
    try:
        pe._fmacw_check(dst, srcs, n)
    finally:
        da[1] = old


def chunk_done(pe, last_write: int) -> None:
    """``fmacx``'s elements of one index ended; the next index cycle is ``last_write``."""
    pe.vec = None
    pe.fabric.schedule(pe, last_write)


def _finish(pe, t: int, data: int) -> None:
    ins, f, _, _, busy = pe.xvec
    pe.xvec = None
    if f["rd"]:
        pe.regs[f["rd"]] = data
    pe.retire_vector(ins, t + 1, busy + ins.cycles, t)
