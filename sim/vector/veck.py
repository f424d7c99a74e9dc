"""Compiled (numba) kernels of the vector instructions (spec 4.5), a loop over the group's PEs.

Each PE's elements are done in element order, which is the instruction's
definition; the array form (:mod:`wse.sim.vector.vector`) chooses between a
flat evaluation and an element-ordered one, and both give these bits. The
kernels change only the state of the PEs they are given (their memory,
registers, queues and the ``v*`` columns), so the order of the PEs does not
matter. Binary32 arithmetic is :mod:`wse.sim.vector.fpk`'s.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .fpk import elementwise, fadd, fmul

__all__ = ["memory_elements", "memory_fmacw", "fabric_elements", "fabric_fmacw"]

_MEM, _FABIN, _FABOUT = 0, 1, 2
_DOT, _FSUM = 9, 10


@njit(fastmath=False, cache=True)
def memory_elements(pes, vop, kind, base, stride, n, scalar, rd, mem, regs):
    """Memory-only vector instructions (not ``fmacw``) of ``pes``, whole; the reductions
    accumulate into register ``rd`` (``r0`` is not written)."""
    for j in range(pes.size):
        p, op = pes[j], vop[j]
        b0, b1, b2 = base[j, 0], base[j, 1], base[j, 2]
        s0, s1, s2 = stride[j, 0], stride[j, 1], stride[j, 2]
        if op == _DOT or op == _FSUM:
            acc = regs[p, rd[j]]
            for i in range(n[j]):
                a = mem[p, b1 + i * s1]
                acc = fadd(acc, fmul(a, mem[p, b2 + i * s2]) if op == _DOT else a)
            if rd[j] != 0:
                regs[p, rd[j]] = acc
            continue
        has_b = kind[j, 2] >= 0
        for i in range(n[j]):
            b = mem[p, b2 + i * s2] if has_b else np.uint32(0)
            mem[p, b0 + i * s0] = elementwise(op, mem[p, b1 + i * s1], b, scalar[j])


@njit(fastmath=False, cache=True)
def memory_fmacw(pes, base, ln, stride, n, mem):
    """``fmacw`` with its weights in memory: a weight read at the start of each chunk."""
    for j in range(pes.size):
        p = pes[j]
        ld, la = ln[j, 0], ln[j, 1]
        period = max(min(ld, la), 1)
        w = np.uint32(0)
        for i in range(n[j]):
            if i % period == 0:
                w = mem[p, base[j, 2] + (i // period) * stride[j, 2]]
            d = base[j, 0] + (i % ld) * stride[j, 0]
            a = base[j, 1] + (i % la) * stride[j, 1]
            mem[p, d] = fadd(mem[p, d], fmul(mem[p, a], w))


@njit(inline="always")
def _end(p, end, vrow, vkind, vacc, vn, rd, cycles, regs, stall, instr_start, pc, vactive, time):
    row = vrow[p]
    if vkind[p, 0] < 0 and rd[row] != 0:
        regs[p, rd[row]] = vacc[p]
    stall[p] += end - instr_start[p] - (vn[p] + cycles[row])
    instr_start[p] = -1
    pc[p] += 1
    vactive[p] = False
    time[p] = end


@njit(fastmath=False, cache=True)
def fabric_fmacw(pes, t, rdata, rhead, rcount, mem, vbase, vstride, vlen, vi, vn, vrow, vkind, vacc,
                 code_rd, code_cycles, regs, stall, instr_start, pc, vactive, time, waiting, ended):
    """The next weight chunk of each PE's ``fmacw`` in cycle ``t`` (a PE without a weight waits).
    Returns ``(PEs that ended, written to ended, wavelets taken)``."""
    slots = rdata.shape[2]
    ne = 0
    moved = 0
    for j in range(pes.size):
        p = pes[j]
        c = vbase[p, 2]
        if rcount[p, c] == 0:
            waiting[p] = True
            continue
        w = rdata[p, c, rhead[p, c]]
        rhead[p, c] = (rhead[p, c] + 1) % slots
        rcount[p, c] -= 1
        moved += 1
        i, n = vi[p], vn[p]
        ld, la = vlen[p, 0], vlen[p, 1]
        period = min(ld, la)
        m = min(period - i % period, n - i)
        for e in range(i, i + m):
            d = vbase[p, 0] + (e % ld) * vstride[p, 0]
            a = vbase[p, 1] + (e % la) * vstride[p, 1]
            mem[p, d] = fadd(mem[p, d], fmul(mem[p, a], w))
        vi[p] = i + m
        if i + m == n:
            _end(p, t + m + 1, vrow, vkind, vacc, vn, code_rd, code_cycles, regs, stall, instr_start, pc,
                 vactive, time)
            ended[ne] = p
            ne += 1
        else:
            time[p] = t + m
    return ne, moved


@njit(fastmath=False, cache=True)
def fabric_elements(pes, t, vop, rdata, rhead, rcount, tcount, tx_depth, inflight_due, mem, vbase, vstride,
                    vi, vn, vrow, vkind, vacc, vscalar, code_rd, code_cycles, regs, stall, instr_start, pc,
                    vactive, time, waiting, ended, out_pe, out_data, out_color):
    """The next element of each PE's fabric vector instruction (not ``fmacw``) in cycle ``t``; a PE
    whose fabric source is empty or whose output queue is full waits. Results for the output queues
    go to ``out_*`` (pushed at the end of the next cycle). Returns ``(ended, outputs, wavelets taken)``."""
    slots = rdata.shape[2]
    ne = 0
    no = 0
    moved = 0
    for j in range(pes.size):
        p = pes[j]
        ok = True
        for slot in (1, 2):
            if vkind[p, slot] == _FABIN and rcount[p, vbase[p, slot]] == 0:
                ok = False
        if vkind[p, 0] == _FABOUT and tcount[p] + (1 if inflight_due[p] == t else 0) >= tx_depth:
            ok = False
        if not ok:
            waiting[p] = True
            continue
        i = vi[p]
        a = np.uint32(0)
        b = np.uint32(0)
        for slot in (1, 2):
            k = vkind[p, slot]
            v = np.uint32(0)
            if k == _FABIN:
                c = vbase[p, slot]
                v = rdata[p, c, rhead[p, c]]
                rhead[p, c] = (rhead[p, c] + 1) % slots
                rcount[p, c] -= 1
                moved += 1
            elif k == _MEM:
                v = mem[p, vbase[p, slot] + i * vstride[p, slot]]
            if slot == 1:
                a = v
            else:
                b = v
        op = vop[vrow[p]]
        if op == _DOT:
            vacc[p] = fadd(vacc[p], fmul(a, b))
        elif op == _FSUM:
            vacc[p] = fadd(vacc[p], a)
        else:
            result = elementwise(op, a, b, vscalar[p])
            if vkind[p, 0] == _FABOUT:
                out_pe[no], out_data[no], out_color[no] = p, result, vbase[p, 0]
                no += 1
                inflight_due[p] = t + 1
            else:
                mem[p, vbase[p, 0] + i * vstride[p, 0]] = result
        vi[p] = i + 1
        if i + 1 == vn[p]:
            _end(p, t + 2, vrow, vkind, vacc, vn, code_rd, code_cycles, regs, stall, instr_start, pc,
                 vactive, time)
            ended[ne] = p
            ne += 1
        else:
            time[p] = t + 1
    return ne, no, moved


@njit(fastmath=False, cache=True)
def decode_operands(pes, rows, vop, dd, da, db, vec_fmt, has_db, has_rs, rs, dsd_kind, dsd_base, dsd_len,
                    dsd_stride, regs, kind, base, ln, stride, scalar, n):
    """The descriptors of the vector instruction at ``rows`` into ``kind/base/ln/stride[k, 3]`` (slots
    dst, a, b; a missing one has kind -1 and zeros), its scalar operand and its element count (spec 4.5)."""
    for j in range(pes.size):
        p, r = pes[j], rows[j]
        regs3 = (dd[r], da[r], db[r])
        present = (vec_fmt[r] == 0, True, has_db[r] == 1)
        for slot in range(3):
            if present[slot]:
                d = regs3[slot]
                kind[j, slot], base[j, slot] = dsd_kind[p, d], dsd_base[p, d]
                ln[j, slot], stride[j, slot] = dsd_len[p, d], dsd_stride[p, d]
            else:
                kind[j, slot], base[j, slot], ln[j, slot], stride[j, slot] = -1, 0, 0, 0
        scalar[j] = regs[p, rs[r]] if has_rs[r] == 1 else np.uint32(0)
        if vop[r] == 11:
            per = min(ln[j, 0], ln[j, 1])
            n[j] = max(ln[j, 0], ln[j, 1]) if per > 0 else 0
        else:
            n[j] = ln[j, 1] if kind[j, 0] < 0 else ln[j, 0]


@njit(fastmath=False, cache=True)
def first_bad_span(base, stride, n, need, words):
    """The first ``j`` whose ``n[j]`` elements from ``base[j]`` by ``stride[j]`` leave memory
    ``0 .. words-1`` where ``need[j]``; -1 if none."""
    for j in range(base.size):
        if need[j] and n[j] > 0:
            last = base[j] + (n[j] - 1) * stride[j]
            if not (0 <= base[j] < words and 0 <= last < words):
                return j
    return -1


@njit(fastmath=False, cache=True)
def touches_fabric(pes, rows, dd, da, db, vec_fmt, has_db, dsd_kind, out):
    """``out[j]``: the vector instruction at ``rows[j]`` has a fabric descriptor."""
    for j in range(pes.size):
        p, r = pes[j], rows[j]
        t = dsd_kind[p, da[r]] != _MEM
        if vec_fmt[r] == 0 and dsd_kind[p, dd[r]] != _MEM:
            t = True
        if has_db[r] == 1 and dsd_kind[p, db[r]] != _MEM:
            t = True
        out[j] = t


@njit(fastmath=False, cache=True)
def send_recv(pes, rows, t, kind_send, sendc, op, ra, rd, color, cycles, regs, rdata, rhead, rcount,
              tdata, tcolor, tctrl, thead, tcount, tx_depth, waiting, instructions, stall, instr_start, pc, time,
              went):
    """``send``/``sendc``/``recv`` attempts of ``pes`` in cycle ``t`` on their queues' start-of-cycle
    counts; a PE that cannot go on waits. The PEs that went on are written to ``went``; returns their count."""
    rslots, tslots = rdata.shape[2], tdata.shape[1]
    k = 0
    for j in range(pes.size):
        p, r = pes[j], rows[j]
        c = color[r]
        if kind_send[j]:
            if tcount[p] >= tx_depth:
                waiting[p] = True
                continue
            slot = (thead[p] + tcount[p]) % tslots
            tdata[p, slot] = regs[p, ra[r]]
            tcolor[p, slot] = c
            tctrl[p, slot] = 1 if op[r] == sendc else 0
            tcount[p] += 1
        else:
            if rcount[p, c] == 0:
                waiting[p] = True
                continue
            h = rhead[p, c]
            if rd[r] != 0:
                regs[p, rd[r]] = rdata[p, c, h]
            rhead[p, c] = (h + 1) % rslots
            rcount[p, c] -= 1
        instructions[p] += 1
        stall[p] += t - instr_start[p]
        instr_start[p] = -1
        pc[p] += 1
        time[p] = t + cycles[r]
        went[k] = p
        k += 1
    return k


@njit(inline="always")
def _span_bad(base, stride, n, words):
    last = base + (n - 1) * stride
    return n > 0 and not (0 <= base < words and 0 <= last < words)


@njit(fastmath=False, cache=True)
def any_fault(vop, kind, base, ln, stride, n, colors, words, fabric):
    """Whether any of the group's vector instructions faults (bad descriptor kinds, ``fmacw``
    operands, a vector leaving memory): then the caller's array checks raise the golden model's
    message. ``fabric``: the instructions touch the fabric (kinds are checked, spans only of
    memory descriptors); otherwise every descriptor present is a memory one."""
    for j in range(vop.size):
        k0, k1, k2 = kind[j, 0], kind[j, 1], kind[j, 2]
        if fabric:
            if k0 == _FABIN or k1 >= _FABOUT or k2 >= _FABOUT:
                return True
            if k1 == _FABIN and k2 == _FABIN and base[j, 1] == base[j, 2]:
                return True
            for slot in range(3):
                if kind[j, slot] > _MEM and base[j, slot] >= colors:
                    return True
        if vop[j] == 11:
            if n[j] > 0:
                if k0 != _MEM or k1 != _MEM:
                    return True
                if _span_bad(base[j, 0], stride[j, 0], min(n[j], ln[j, 0]), words):
                    return True
                if _span_bad(base[j, 1], stride[j, 1], min(n[j], ln[j, 1]), words):
                    return True
                period = max(min(ln[j, 0], ln[j, 1]), 1)
                if k2 == _MEM and _span_bad(base[j, 2], stride[j, 2], -(-n[j] // period), words):
                    return True
            elif k0 != _MEM or k1 != _MEM:
                return True
            continue
        for slot in range(3):
            need = kind[j, slot] == _MEM if fabric else kind[j, slot] >= 0
            if need and _span_bad(base[j, slot], stride[j, slot], n[j], words):
                return True
    return False


@njit(fastmath=False, cache=True)
def count(pes, vop, n, instructions, flops, fmac):
    """The counters of the vector instructions ``vop`` of ``pes`` with ``n`` elements."""
    for j in range(pes.size):
        p, op = pes[j], vop[j]
        instructions[p] += 1
        if op != 0:
            flops[p] += n[j]
        if op == 5 or op == _DOT or op == 11:
            fmac[p] += n[j]


@njit(fastmath=False, cache=True)
def begin(pes, rows, kind, base, ln, stride, scalar, n, code_rd, regs, vacc, vactive, vrow, vi, vn, vscalar,
          vkind, vbase, vlen, vstride):
    """The ``v*`` state of the fabric vector instructions started by ``pes``."""
    for j in range(pes.size):
        p, r = pes[j], rows[j]
        vacc[p] = regs[p, code_rd[r]] if kind[j, 0] < 0 else np.uint32(0)
        vactive[p] = True
        vrow[p], vi[p], vn[p], vscalar[p] = r, 0, n[j], scalar[j]
        for slot in range(3):
            vkind[p, slot], vbase[p, slot] = kind[j, slot], base[j, slot]
            vlen[p, slot], vstride[p, slot] = ln[j, slot], stride[j, slot]
