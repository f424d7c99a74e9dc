"""Vector instructions of the vectorized model (spec 4.5), for groups of PEs at once.

A vector instruction whose operands are all in memory runs whole when it is
reached (:func:`vector_memory`), as in the golden model. A vector
instruction touching the fabric keeps its state in the ``v*`` columns of
:class:`~wse.sim.vector.state.PeState` and issues one element per cycle (one
weight chunk for ``fmacw``) in :func:`vector_elements`. The checks, faults
and counters are array operations over the group; the elements themselves
are done by the compiled kernels of :mod:`wse.sim.vector.veck`, PE by PE in
element order.
"""

from __future__ import annotations

import numpy as np

from wse.firmware.isa import BY_OPCODE, DsdKind

from . import veck

__all__ = ["operands", "vector_memory", "begin_fabric_vector", "vector_elements"]

MEM, FABIN, FABOUT = int(DsdKind.MEM), int(DsdKind.FABIN), int(DsdKind.FABOUT)
FMAC_OPS = ("fmacs", "dot", "fmacw")

def operands(fab, pes, rows):
    """Descriptors of the instruction at ``rows``: ``kind, base, len, stride`` as ``[k, 3]``
    arrays (slots dst, a, b; a missing one has kind -1), the scalar operands and the element
    counts (spec 4.5)."""
    s, code = fab.s, fab.code
    k = pes.size
    kind, base, ln, stride = (np.empty((k, 3), dtype=np.int64) for _ in range(4))
    scalar, n = np.empty(k, dtype=np.uint32), np.empty(k, dtype=np.int64)
    veck.decode_operands(pes, rows, code.vop, code.dd, code.da, code.db, code.vec_fmt, code.has_db, code.has_rs,
                         code.rs, s.dsd_kind, s.dsd_base, s.dsd_len, s.dsd_stride, s.regs, kind, base, ln, stride,
                         scalar, n)
    return kind, base, ln, stride, scalar, n


BY_NAME_FMACW = next(i.opcode for i in BY_OPCODE.values() if i.name == "fmacw")


def check_kinds(fab, pes, kind, base) -> None:
    """The descriptor faults of ``_check_kinds`` in the golden PE."""
    C = fab.colors
    srcs = kind[:, 1:]
    bad = (kind[:, 0] == FABIN) | (srcs == FABOUT).any(axis=1) | (srcs > FABOUT).any(axis=1)
    bad |= (kind[:, 1] == FABIN) & (kind[:, 2] == FABIN) & (base[:, 1] == base[:, 2])
    bad |= ((kind > MEM) & (base >= C)).any(axis=1)
    if bad.any():
        _kind_fault(fab, pes, kind, base, int(np.flatnonzero(bad)[0]))


def _kind_fault(fab, pes, kind, base, k) -> None:
    C = fab.colors
    dst, a, b = kind[k].tolist()
    msg = None
    if dst == FABIN:
        msg = "a fabric-in descriptor cannot be a destination"
    for src in (a, b):
        if msg is None and src == FABOUT:
            msg = "a fabric-out descriptor cannot be a source"
        if msg is None and src not in (-1, MEM, FABIN, FABOUT):
            msg = f"descriptor kind {src} is not mem, fabin or fabout"
    if msg is None and a == FABIN and b == FABIN and base[k, 1] == base[k, 2]:
        msg = "two fabric-in sources of the same color"
    for slot in range(3):
        if msg is None and kind[k, slot] not in (-1, MEM) and base[k, slot] >= C:
            msg = f"fabric descriptor color {int(base[k, slot])} is not below colors={C}"
    raise fab.fault(int(pes[k]), msg)


def check_span(fab, pes, base, stride, n, need) -> None:
    """``n`` elements from ``base`` by ``stride`` stay in memory, where ``need``."""
    S = fab.s.sram_words
    k = veck.first_bad_span(np.ascontiguousarray(base), np.ascontiguousarray(stride), n, need, S)
    if k >= 0:
        raise fab.fault(int(pes[k]), f"vector of {int(n[k])} elements from address {int(base[k])} stride "
                                     f"{int(stride[k])} leaves memory 0..{S - 1}")


def _count(fab, pes, name, n) -> None:
    c = fab.s.counters
    c["instructions"][pes] += 1
    if name != "fmov":
        c["flops"][pes] += n
    if name in FMAC_OPS:
        c["fmac"][pes] += n


def _fmacw_check(fab, pes, kind, base, ln, stride, n) -> None:
    bad = (kind[:, 0] != MEM) | (kind[:, 1] != MEM)
    if bad.any():
        raise fab.fault(int(pes[np.flatnonzero(bad)[0]]), "fmacw needs memory descriptors for dd and da")
    has = n > 0
    check_span(fab, pes, base[:, 0], stride[:, 0], np.minimum(n, ln[:, 0]), has)
    check_span(fab, pes, base[:, 1], stride[:, 1], np.minimum(n, ln[:, 1]), has)
    period = np.maximum(np.minimum(ln[:, 0], ln[:, 1]), 1)
    check_span(fab, pes, base[:, 2], stride[:, 2], -(-n // period), has & (kind[:, 2] == MEM))


def vector_memory(fab, pes, rows) -> np.ndarray:
    """Run memory-only vector instructions whole; returns each PE's element count."""
    s, code = fab.s, fab.code
    kind, base, ln, stride, scalar, n = operands(fab, pes, rows)
    vop = code.vop[rows]
    if veck.any_fault(vop, kind, base, ln, stride, n, fab.colors, s.sram_words, False):
        _memory_by_opcode(fab, pes, rows, kind, base, ln, stride, scalar, n)
        raise AssertionError("the compiled checks found a fault that the array checks do not")
    c = s.counters
    veck.count(pes, vop, n, c["instructions"], c["flops"], c["fmac"])
    counts = n
    fm = vop == 11
    if fm.any():
        veck.memory_fmacw(pes[fm], base[fm], ln[fm], stride[fm], n[fm], s.mem)
        pes, rows, vop, kind, base, stride, n, scalar = (a[~fm] for a in (pes, rows, vop, kind, base, stride, n,
                                                                           scalar))
    if pes.size:
        veck.memory_elements(pes, vop, kind, base, stride, n, scalar, code.rd[rows], s.mem, s.regs)
    return counts


def _memory_by_opcode(fab, pes, rows, kind, base, ln, stride, scalar, n) -> None:
    """The group's instructions opcode by opcode with the array checks, which raise the golden
    model's fault message (used when the compiled checks found a fault)."""
    s, code = fab.s, fab.code
    ops = code.op[rows]
    for op in np.unique(ops).tolist():
        sel = np.flatnonzero(ops == op)
        p, k, b, st, nn, sc = pes[sel], kind[sel], base[sel], stride[sel], n[sel], scalar[sel]
        name = BY_OPCODE[op].name
        _count(fab, p, name, nn)
        if name == "fmacw":
            _fmacw_check(fab, p, k, b, ln[sel], st, nn)
            veck.memory_fmacw(p, b, ln[sel], st, nn, s.mem)
            continue
        for slot in range(3):
            check_span(fab, p, b[:, slot], st[:, slot], nn, k[:, slot] >= 0)
        veck.memory_elements(p, code.vop[rows[sel]], k, b, st, nn, sc, code.rd[rows[sel]], s.mem, s.regs)


def begin_fabric_vector(fab, pes, rows) -> None:
    """Start fabric vector instructions: checks, counters, the ``v*`` state."""
    s, code = fab.s, fab.code
    kind, base, ln, stride, scalar, n = operands(fab, pes, rows)
    vop = code.vop[rows]
    if veck.any_fault(vop, kind, base, ln, stride, n, fab.colors, s.sram_words, True):
        _fabric_checks(fab, pes, vop, kind, base, ln, stride, n)
        raise AssertionError("the compiled checks found a fault that the array checks do not")
    c = s.counters
    veck.count(pes, vop, n, c["instructions"], c["flops"], c["fmac"])
    veck.begin(pes, rows, kind, base, ln, stride, scalar, n, code.rd, s.regs, s.vacc, s.vactive, s.vrow, s.vi,
               s.vn, s.vscalar, s.vkind, s.vbase, s.vlen, s.vstride)


def _fabric_checks(fab, pes, vop, kind, base, ln, stride, n) -> None:
    """The array checks of starting fabric vector instructions: raise the golden model's fault message."""
    check_kinds(fab, pes, kind, base)
    fmacw = vop == 11
    if fmacw.any():
        f = np.flatnonzero(fmacw)
        _fmacw_check(fab, pes[f], kind[f], base[f], ln[f], stride[f], n[f])
    for slot in range(3):
        check_span(fab, pes, base[:, slot], stride[:, slot], n, ~fmacw & (kind[:, slot] == MEM))


def vector_elements(fab, pes, t: int) -> np.ndarray:
    """Issue the next element of each PE's fabric vector instruction in cycle ``t``; returns the PEs
    whose instruction ended (their ``time`` set to the next instruction's cycle)."""
    s, code = fab.s, fab.code
    ended = []
    empty = s.vn[pes] == 0
    if empty.any():
        ended.append(_end(fab, pes[empty], t + 1))
        pes = pes[~empty]
    ops = code.op[s.vrow[pes]]
    fm = ops == BY_NAME_FMACW
    if fm.any():
        ended.append(_fmacw_elements(fab, pes[fm], t))
    pes = pes[~fm]
    if pes.size:
        ended.append(_elements(fab, pes, t))
    return np.concatenate(ended) if ended else np.zeros(0, dtype=np.int64)


def _fmacw_elements(fab, pes, t):
    s, code = fab.s, fab.code
    ended = np.empty(pes.size, dtype=np.int64)
    ne, moved = veck.fabric_fmacw(
        pes, t, s.rdata, s.rhead, s.rcount, s.mem, s.vbase, s.vstride, s.vlen, s.vi, s.vn, s.vrow, s.vkind,
        s.vacc, code.rd, code.cycles, s.regs, s.counters["stall"], s.instr_start, s.pc, s.vactive, s.time,
        s.waiting, ended)
    fab.moved += moved
    return ended[:ne]


def _elements(fab, pes, t):
    s, code = fab.s, fab.code
    k = pes.size
    ended, out_pe = np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)
    out_data, out_color = np.empty(k, dtype=np.uint32), np.empty(k, dtype=np.int64)
    ne, no, moved = veck.fabric_elements(
        pes, t, code.vop, s.rdata, s.rhead, s.rcount, s.tcount, s.tx_depth, s.inflight_due, s.mem, s.vbase,
        s.vstride, s.vi, s.vn, s.vrow, s.vkind, s.vacc, s.vscalar, code.rd, code.cycles, s.regs,
        s.counters["stall"], s.instr_start, s.pc, s.vactive, s.time, s.waiting, ended, out_pe, out_data,
        out_color)
    fab.moved += moved
    if no:
        fab.push_next(out_pe[:no], out_data[:no], out_color[:no])
    return ended[:ne]


def _end(fab, pes, end) -> np.ndarray:
    """Finish the vector instructions of ``pes``; the next instruction runs at cycle ``end``."""
    s, code = fab.s, fab.code
    rows = s.vrow[pes]
    rd = code.rd[rows]
    reg = (s.vkind[pes, 0] < 0) & (rd != 0)
    s.regs[pes[reg], rd[reg]] = s.vacc[pes[reg]]
    s.counters["stall"][pes] += end - s.instr_start[pes] - (s.vn[pes] + code.cycles[rows])
    s.instr_start[pes] = -1
    s.pc[pes] += 1
    s.vactive[pes] = False
    s.time[pes] = end
    return pes
