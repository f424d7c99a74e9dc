"""Vector instructions of the vectorized model (spec 4.5), for groups of PEs at once.

A vector instruction whose operands are all in memory runs whole when it is
reached (:func:`vector_memory`), as in the golden model: each PE's elements
laid out flat (PE after PE) and computed in one array operation per opcode,
or element by element across the PEs whose operands overlap so that element
order matters. A vector instruction touching the fabric keeps its state in
the ``v*`` columns of :class:`~wse.sim.vector.state.PeState` and issues one
element per cycle (one weight chunk for ``fmacw``) in :func:`vector_elements`.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.firmware.isa import BY_OPCODE, DsdKind

__all__ = ["operands", "vector_memory", "begin_fabric_vector", "vector_elements", "ELEMENTWISE"]

MEM, FABIN, FABOUT = int(DsdKind.MEM), int(DsdKind.FABIN), int(DsdKind.FABOUT)
FMAC_OPS = ("fmacs", "dot", "fmacw")

#: Element operations over uint32 arrays; ``s`` is an array of scalars too.
ELEMENTWISE = {
    "fmov": lambda a, b, s: a.copy(),
    "fadd": lambda a, b, s: fp.vadd(a, b),
    "fsub": lambda a, b, s: fp.vsub(a, b),
    "fmul": lambda a, b, s: fp.vmul(a, b),
    "fmax": lambda a, b, s: fp.vmax(a, b),
    "fmacs": lambda a, b, s: fp.vadd(a, fp.vmul(b, s)),
    "fmuls": lambda a, b, s: fp.vmul(a, s),
    "fadds": lambda a, b, s: fp.vadd(a, s),
    "fmaxs": lambda a, b, s: fp.vmax(a, s),
}


def operands(fab, pes, rows):
    """Descriptors of the instruction at ``rows``: ``kind, base, len, stride`` as ``[k, 3]``
    arrays (slots dst, a, b; a missing one has kind -1) and the scalar operands."""
    s, code = fab.s, fab.code
    k = pes.size
    out = [np.full((k, 3), -1, dtype=np.int64) for _ in range(4)]
    slots = ((0, code.dd[rows], code.vec_fmt[rows] == 0), (1, code.da[rows], np.ones(k, dtype=bool)),
             (2, code.db[rows], code.has_db[rows] == 1))
    for slot, reg, present in slots:
        for arr, src in zip(out, (s.dsd_kind, s.dsd_base, s.dsd_len, s.dsd_stride)):
            arr[:, slot] = np.where(present, src[pes, reg], -1 if arr is out[0] else 0)
    scalar = np.where(code.has_rs[rows] == 1, s.regs[pes, code.rs[rows]], 0).astype(np.uint32)
    return out[0], out[1], out[2], out[3], scalar


def lengths(ops, kind, ln) -> np.ndarray:
    """Elements of each instruction (spec 4.5)."""
    fmacw = ops == BY_NAME_FMACW
    n = np.where(kind[:, 0] < 0, ln[:, 1], ln[:, 0])
    per = np.minimum(ln[:, 0], ln[:, 1])
    return np.where(fmacw, np.where(per > 0, np.maximum(ln[:, 0], ln[:, 1]), 0), n)


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
    last = base + (n - 1) * stride
    bad = need & (n > 0) & ~((base >= 0) & (base < S) & (last >= 0) & (last < S))
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
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


def _flat(pes, n, S):
    """Flat element layout of ragged vectors: (PE offset into flat memory, element index)."""
    rep = np.repeat(np.arange(pes.size), n)
    starts = np.cumsum(n) - n
    i = np.arange(rep.size) - starts[rep]
    return rep, i


def _needs_order(kind, base, stride, n) -> np.ndarray:
    """PEs whose elementwise instruction must be evaluated in element order (golden ``_needs_sequential``)."""
    lo_d = np.minimum(base[:, 0], base[:, 0] + (n - 1) * stride[:, 0])
    hi_d = np.maximum(base[:, 0], base[:, 0] + (n - 1) * stride[:, 0])
    seq = stride[:, 0] == 0
    for slot in (1, 2):
        present = kind[:, slot] >= 0
        same = (base[:, slot] == base[:, 0]) & (stride[:, slot] == stride[:, 0])
        lo = np.minimum(base[:, slot], base[:, slot] + (n - 1) * stride[:, slot])
        hi = np.maximum(base[:, slot], base[:, slot] + (n - 1) * stride[:, slot])
        seq |= present & ~same & (lo <= hi_d) & (lo_d <= hi)
    return seq & (n > 1)


def vector_memory(fab, pes, rows) -> np.ndarray:
    """Run memory-only vector instructions whole; returns each PE's element count."""
    s, code = fab.s, fab.code
    ops = code.op[rows]
    kind, base, ln, stride, scalar = operands(fab, pes, rows)
    n = lengths(ops, kind, ln)
    S = s.sram_words
    flat = s.mem.reshape(-1)
    for op in np.unique(ops).tolist():
        sel = np.flatnonzero(ops == op)
        p, k, b, st, nn, sc = pes[sel], kind[sel], base[sel], stride[sel], n[sel], scalar[sel]
        name = BY_OPCODE[op].name
        _count(fab, p, name, nn)
        if name == "fmacw":
            _fmacw_check(fab, p, k, b, ln[sel], st, nn)
            _fmacw_memory(fab, p, b, ln[sel], st, nn)
            continue
        for slot in range(3):
            check_span(fab, p, b[:, slot], st[:, slot], nn, k[:, slot] >= 0)
        if name in ("dot", "fsum"):
            rd = code.rd[rows[sel]]
            acc = s.regs[p, rd].copy()
            for i in range(int(nn.max(initial=0))):
                live = i < nn
                a = flat[p * S + b[:, 1] + i * st[:, 1]]
                x = fp.vmul(a, flat[p * S + b[:, 2] + i * st[:, 2]]) if name == "dot" else a
                acc = np.where(live, fp.vadd(acc, x), acc)
            keep = rd != 0
            s.regs[p[keep], rd[keep]] = acc[keep]
            continue
        fn = ELEMENTWISE[name]
        order = _needs_order(k, b, st, nn)
        plain = np.flatnonzero(~order & (nn > 0))
        if plain.size:
            rep, i = _flat(plain, nn[plain], S)
            q = plain[rep]
            off = p[q] * S
            a = flat[off + b[q, 1] + i * st[q, 1]]
            bb = flat[off + b[q, 2] + i * st[q, 2]] if (k[q, 2] >= 0).all() else None
            flat[off + b[q, 0] + i * st[q, 0]] = fn(a, bb, sc[q])
        seq = np.flatnonzero(order)
        for i in range(int(nn[seq].max(initial=0))):
            q = seq[i < nn[seq]]
            off = p[q] * S
            a = flat[off + b[q, 1] + i * st[q, 1]]
            bb = flat[off + b[q, 2] + i * st[q, 2]] if (k[q, 2] >= 0).all() else None
            flat[off + b[q, 0] + i * st[q, 0]] = fn(a, bb, sc[q])
    return n


def _fmacw_memory(fab, p, b, ln, st, n) -> None:
    """``fmacw`` with weights in memory, element by element across the PEs (weights read per chunk)."""
    S = fab.s.sram_words
    flat = fab.s.mem.reshape(-1)
    ld, la = ln[:, 0], ln[:, 1]
    period = np.maximum(np.minimum(ld, la), 1)
    w = np.zeros(p.size, dtype=np.uint32)
    off = p * S
    for i in range(int(n.max(initial=0))):
        live = np.flatnonzero(i < n)
        o = off[live]
        start = i % period[live] == 0
        k = i // period[live]
        w[live] = np.where(start, flat[o + b[live, 2] + k * st[live, 2]], w[live])
        d = o + b[live, 0] + (i % ld[live]) * st[live, 0]
        a = o + b[live, 1] + (i % la[live]) * st[live, 1]
        flat[d] = fp.vadd(flat[d], fp.vmul(flat[a], w[live]))


def begin_fabric_vector(fab, pes, rows) -> None:
    """Start fabric vector instructions: checks, counters, the ``v*`` state."""
    s, code = fab.s, fab.code
    ops = code.op[rows]
    kind, base, ln, stride, scalar = operands(fab, pes, rows)
    check_kinds(fab, pes, kind, base)
    n = lengths(ops, kind, ln)
    fmacw = ops == BY_NAME_FMACW
    if fmacw.any():
        f = np.flatnonzero(fmacw)
        _fmacw_check(fab, pes[f], kind[f], base[f], ln[f], stride[f], n[f])
    for slot in range(3):
        check_span(fab, pes, base[:, slot], stride[:, slot], n, ~fmacw & (kind[:, slot] == MEM))
    for op in np.unique(ops).tolist():
        sel = ops == op
        _count(fab, pes[sel], BY_OPCODE[op].name, n[sel])
    reduce = kind[:, 0] < 0
    s.vacc[pes] = np.where(reduce, s.regs[pes, code.rd[rows]], 0)
    s.vactive[pes] = True
    s.vrow[pes], s.vi[pes], s.vn[pes], s.vscalar[pes] = rows, 0, n, scalar
    s.vkind[pes], s.vbase[pes], s.vlen[pes], s.vstride[pes] = kind, base, ln, stride


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


def _wait(fab, pes) -> None:
    fab.s.waiting[pes] = True


def _fmacw_elements(fab, pes, t):
    s = fab.s
    color = s.vbase[pes, 2]
    ok = s.rcount[pes, color] > 0
    _wait(fab, pes[~ok])
    pes, color = pes[ok], color[ok]
    if pes.size == 0:
        return pes
    w, _ = s.rx_head(pes, color)
    s.rx_pop(pes, color)
    fab.moved += pes.size
    i, n = s.vi[pes], s.vn[pes]
    ld, la = s.vlen[pes, 0], s.vlen[pes, 1]
    period = np.minimum(ld, la)
    m = np.minimum(period - i % period, n - i)
    S = s.sram_words
    flat = s.mem.reshape(-1)
    b, st = s.vbase[pes], s.vstride[pes]
    lo_d = np.minimum(b[:, 0], b[:, 0] + (ld - 1) * st[:, 0])
    hi_d = np.maximum(b[:, 0], b[:, 0] + (ld - 1) * st[:, 0])
    lo_a = np.minimum(b[:, 1], b[:, 1] + (la - 1) * st[:, 1])
    hi_a = np.maximum(b[:, 1], b[:, 1] + (la - 1) * st[:, 1])
    alias = (st[:, 0] == 0) | ((lo_a <= hi_d) & (lo_d <= hi_a))
    plain = np.flatnonzero(~alias)
    if plain.size:
        rep, j = _flat(plain, m[plain], S)
        q = plain[rep]
        e = i[q] + j
        off = pes[q] * S
        d = off + b[q, 0] + (e % ld[q]) * st[q, 0]
        a = off + b[q, 1] + (e % la[q]) * st[q, 1]
        flat[d] = fp.vadd(flat[d], fp.vmul(flat[a], w[q]))
    seq = np.flatnonzero(alias)
    for j in range(int(m[seq].max(initial=0))):
        q = seq[j < m[seq]]
        e = i[q] + j
        off = pes[q] * S
        d = off + b[q, 0] + (e % ld[q]) * st[q, 0]
        a = off + b[q, 1] + (e % la[q]) * st[q, 1]
        flat[d] = fp.vadd(flat[d], fp.vmul(flat[a], w[q]))
    s.vi[pes] = i + m
    done = i + m == n
    s.time[pes[~done]] = t + m[~done]
    return _end(fab, pes[done], t + m[done] + 1) if done.any() else pes[:0]


def _elements(fab, pes, t):
    s, code = fab.s, fab.code
    kind, base = s.vkind[pes], s.vbase[pes]
    ok = np.ones(pes.size, dtype=bool)
    for slot in (1, 2):
        fin = kind[:, slot] == FABIN
        if fin.any():
            ok &= ~fin | (s.rcount[pes, np.where(fin, base[:, slot], 0)] > 0)
    out = kind[:, 0] == FABOUT
    inflight = (s.inflight_due[pes] == t).astype(np.int64)
    ok &= ~out | (s.tcount[pes] + inflight < s.tx_depth)
    _wait(fab, pes[~ok])
    pes = pes[ok]
    if pes.size == 0:
        return pes
    kind, base, st, i = s.vkind[pes], s.vbase[pes], s.vstride[pes], s.vi[pes]
    S = s.sram_words
    flat = s.mem.reshape(-1)
    values = []
    for slot in (1, 2):
        v = np.zeros(pes.size, dtype=np.uint32)
        fin = kind[:, slot] == FABIN
        mem = kind[:, slot] == MEM
        if fin.any():
            f, c = pes[fin], base[fin, slot]
            v[fin] = s.rx_head(f, c)[0]
            s.rx_pop(f, c)
            fab.moved += f.size
        if mem.any():
            v[mem] = flat[pes[mem] * S + base[mem, slot] + i[mem] * st[mem, slot]]
        values.append(v)
    ops = code.op[s.vrow[pes]]
    for op in np.unique(ops).tolist():
        sel = np.flatnonzero(ops == op)
        p, name = pes[sel], BY_OPCODE[op].name
        a, b = values[0][sel], values[1][sel]
        if name in ("dot", "fsum"):
            s.vacc[p] = fp.vadd(s.vacc[p], fp.vmul(a, b) if name == "dot" else a)
            continue
        result = ELEMENTWISE[name](a, b, s.vscalar[p])
        to_fab = kind[sel, 0] == FABOUT
        if to_fab.any():
            fab.push_next(p[to_fab], result[to_fab], base[sel, 0][to_fab])
            s.inflight_due[p[to_fab]] = t + 1
        m = ~to_fab
        if m.any():
            flat[p[m] * S + base[sel, 0][m] + i[sel][m] * st[sel, 0][m]] = result[m]
    s.vi[pes] = i + 1
    done = i + 1 == s.vn[pes]
    s.time[pes[~done]] = t + 1
    return _end(fab, pes[done], t + 2) if done.any() else pes[:0]


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
