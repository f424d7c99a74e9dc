"""The indexed vector instructions ``fmacx`` and ``fdotx`` in the vectorized model (numba).

The golden model's :mod:`wse.sim.golden.pe_indexed`, one PE at a time: a PE
running one has ``xstage`` 3 (its first cycle: the checks, then as 1), 1 (an
index cycle: pop the head of the instruction's color; a control wavelet ends
the instruction and its data goes to ``rd``, a data wavelet sets ``da.base``
and starts the index's ``fmacw`` elements) or 2 (``fmacx``: the next weight
chunk, which pops its weight from ``db``'s color). ``fdotx``'s elements read
their weights from memory and run in the index cycle; it then adds 1 to
``dd.base``. ``xbusy`` counts the instruction's cycles without waiting
(``n + 1`` per index), ``vi``/``vn`` the elements of the index in progress.
Both the compiled loop (:mod:`.loop`) and the array stepper
(:class:`~wse.sim.vector.fabric.VectorFabric`) call :func:`indexed_cycle`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.firmware.isa import BY_NAME, DsdKind

from .fpk import fadd, fmul

__all__ = ["indexed_cycle", "fault_message", "X_COLOR", "X_KINDS", "X_FMACX_DB", "X_FDOTX_DB", "X_EMPTY", "X_SPAN"]

_FDOTX = BY_NAME["fdotx"].opcode
_MEM, _FABIN = int(DsdKind.MEM), int(DsdKind.FABIN)
#: Faults (the second value returned with the PE): the golden model's messages, :func:`fault_message`.
X_COLOR, X_KINDS, X_FMACX_DB, X_FDOTX_DB, X_EMPTY, X_SPAN = range(1, 7)


def fault_message(kind: int, value: int, name: str, colors: int, words: int) -> str:
    """The golden model's message of fault ``kind`` of instruction ``name`` (``value``: the color, or
    ``(n << 32) | (base << 16) | (stride & 0xffff)`` of the span that leaves memory)."""
    if kind == X_COLOR:
        return f"color {value} is not below colors={colors}"
    if kind == X_KINDS:
        return f"{name} needs memory descriptors for dd and da"
    if kind == X_FMACX_DB:
        return "fmacx needs a fabric-in descriptor (a color below colors) for db"
    if kind == X_FDOTX_DB:
        return "fdotx needs a memory descriptor for db"
    if kind == X_EMPTY:
        return f"{name} with no elements per index (dd and da must not be empty)"
    n, base, stride = value >> 32, (value >> 16) & 0xFFFF, value & 0xFFFF
    stride = stride - 0x10000 if stride & 0x8000 else stride
    return f"vector of {n} elements from address {base} stride {stride} leaves memory 0..{words - 1}"


@njit(inline="always")
def _span(base, stride, n, words):
    """0 if ``n`` elements from ``base`` by ``stride`` stay in memory, else the fault's value."""
    last = base + (n - 1) * stride
    if n and not (0 <= base < words and 0 <= last < words):
        return (n << 32) | (base << 16) | (stride & 0xFFFF)
    return 0


@njit(fastmath=False, cache=True)
def indexed_cycle(pes, t, colors, op, code_rd, code_dd, code_da, code_db, code_color, base_of, pc, rdata, rctrl,
                  rhead, rcount, mem, regs, dsd_kind, dsd_base, dsd_len, dsd_stride, xstage, xbusy, vi, vn,
                  instr_start, time, waiting, stall, fmac, flops, fault):
    """Cycle ``t`` of the running ``fmacx``/``fdotx`` of each PE of ``pes``. Returns the wavelets taken;
    at a fault ``fault`` gets ``(pe, kind, value)`` and the PE's state is left as it was."""
    slots, words = rdata.shape[2], mem.shape[1]
    moved = 0
    for j in range(pes.size):
        p = pes[j]
        r = base_of[p] + pc[p]
        dd, da, db, c = code_dd[r], code_da[r], code_db[r], code_color[r]
        fdotx = op[r] == _FDOTX
        if xstage[p] == 3:
            kind = 0
            value = 0
            if c >= colors:
                kind, value = X_COLOR, c
            elif dsd_kind[p, dd] != _MEM or dsd_kind[p, da] != _MEM:
                kind = X_KINDS
            elif not fdotx and (dsd_kind[p, db] != _FABIN or dsd_base[p, db] >= colors):
                kind = X_FMACX_DB
            elif fdotx and dsd_kind[p, db] != _MEM:
                kind = X_FDOTX_DB
            if kind:
                fault[0], fault[1], fault[2] = p, kind, value
                return moved
            xstage[p] = 1
        ld, la = dsd_len[p, dd], dsd_len[p, da]
        if xstage[p] == 2:                                   # fmacx: the next weight chunk
            wc = dsd_base[p, db]
            if rcount[p, wc] == 0:
                waiting[p] = True
                continue
            w = rdata[p, wc, rhead[p, wc]]
            rhead[p, wc] = (rhead[p, wc] + 1) % slots
            rcount[p, wc] -= 1
            moved += 1
            i, n = vi[p], vn[p]
            period = min(ld, la)
            m = min(period - i % period, n - i)
            for e in range(i, i + m):
                d = dsd_base[p, dd] + (e % ld) * dsd_stride[p, dd]
                a = dsd_base[p, da] + (e % la) * dsd_stride[p, da]
                mem[p, d] = fadd(mem[p, d], fmul(mem[p, a], w))
            vi[p] = i + m
            if i + m == n:
                xstage[p] = 1
            time[p] = t + m
            continue
        if rcount[p, c] == 0:                                 # an index cycle
            waiting[p] = True
            continue
        h = rhead[p, c]
        data, ctrl = rdata[p, c, h], rctrl[p, c, h]
        if ctrl:
            rhead[p, c] = (h + 1) % slots
            rcount[p, c] -= 1
            moved += 1
            if code_rd[r] != 0:
                regs[p, code_rd[r]] = data
            stall[p] += t + 1 - instr_start[p] - (xbusy[p] + 1)
            instr_start[p] = -1
            xstage[p] = 0
            pc[p] += 1
            time[p] = t + 1
            continue
        n = max(ld, la) if min(ld, la) > 0 else 0
        old = dsd_base[p, da]
        dsd_base[p, da] = np.int64(data) & 0xFFFF
        bad = 0
        if n == 0:
            bad = X_EMPTY
        else:
            value = _span(dsd_base[p, dd], dsd_stride[p, dd], min(n, ld), words)
            if value == 0:
                value = _span(dsd_base[p, da], dsd_stride[p, da], min(n, la), words)
            if value == 0 and fdotx:
                value = _span(dsd_base[p, db], dsd_stride[p, db], -(-n // min(ld, la)), words)
            if value:
                bad = X_SPAN
        if bad:
            dsd_base[p, da] = old
            fault[0], fault[1], fault[2] = p, bad, value if bad == X_SPAN else 0
            return moved
        rhead[p, c] = (h + 1) % slots
        rcount[p, c] -= 1
        moved += 1
        flops[p] += n
        fmac[p] += n
        xbusy[p] += n + 1
        if fdotx:
            period = min(ld, la)
            wv = np.uint32(0)
            for e in range(n):
                if e % period == 0:
                    wv = mem[p, dsd_base[p, db] + (e // period) * dsd_stride[p, db]]
                d = dsd_base[p, dd] + (e % ld) * dsd_stride[p, dd]
                a = dsd_base[p, da] + (e % la) * dsd_stride[p, da]
                mem[p, d] = fadd(mem[p, d], fmul(mem[p, a], wv))
            dsd_base[p, dd] = (dsd_base[p, dd] + 1) & 0xFFFF
            time[p] = t + 1 + n
        else:
            vi[p], vn[p] = 0, n
            xstage[p] = 2
            time[p] = t + 1
    return moved
