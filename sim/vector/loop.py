"""The vectorized model's cycle loop compiled whole (numba): many cycles per call, no Python per cycle.

:func:`run_cycles` advances the fabric cycle after cycle with the steps of
``docs/vector.md`` ("How a cycle is computed"), the same steps and in the
same order as the array stepper of :class:`~wse.sim.vector.fabric.VectorFabric`
(``stepper="arrays"``), calling the same compiled kernels
(:mod:`~wse.sim.vector.kernels` for the routers, :mod:`~wse.sim.vector.veck`
and :func:`~wse.sim.vector.scalar.scalar_kernel` for the PEs) on lists of
PEs kept in scratch arrays instead of numpy index arrays. It returns to
Python only when the run stops:

* ``IDLE``: the fabric is idle; ``HANG``: nothing can move before it is;
  ``LIMIT``: the cycle limit was reached;
* ``DRAIN``: the buffer of wavelets that left the mesh is nearly full (the
  caller moves them to ``edge_out`` and calls again: the loop resumes at the
  cycle it stopped before, from ``ctl``);
* a fault (``F_SCALAR``, ``F_VMEM``, ``F_FVEC``, ``F_COLOR``, ``F_INDEXED``), found before
  the faulting instruction changed any state: the caller raises the golden
  model's message (for the vector faults by running the group of PEs that
  met the fault through the array checks of :mod:`~wse.sim.vector.vector`).

Its arguments are the state as tuples of arrays, in the order of
:func:`pack` (the arrays of :class:`~wse.sim.vector.state.PeState`,
:class:`~wse.sim.vector.code.CodeTable` and
:class:`~wse.sim.vector.routers.VectorRouters`, shared, not copied).
"""

from __future__ import annotations

import os

import numpy as np
from numba import njit

from wse.firmware.isa import BY_NAME

from . import fpk, kernels, scalar, veck, vindexed
from .code import K_EXIT, K_INDEXED, K_SEND, K_VECTOR
from .scalar import SOP_OF, scalar_kernel
from .state import COUNTERS

__all__ = ["run_cycles", "pack", "scratch", "GROUP", "IDLE", "DRAIN", "LIMIT", "HANG", "F_SCALAR", "F_VMEM", "F_FVEC",
           "F_COLOR", "F_INDEXED"]

IDLE, DRAIN, LIMIT, HANG, F_SCALAR, F_VMEM, F_FVEC, F_COLOR, F_INDEXED = range(9)
_FMACW = BY_NAME["fmacw"].opcode
_SENDC = BY_NAME["sendc"].opcode
#: Lists of PEs in the scratch array ``G[list, pe]``.
_IDLE, _REST, _VEC, _A, _NOW, _CONT, _MORE, _CUR, _STOP, _PRIV, _PF, _PO, _RF, _RO, _OUT, _SUB, _XL = range(17)
#: The list ``G[GROUP]`` that holds the group of PEs of a vector fault.
GROUP = _SUB


def pack(fab) -> tuple:
    """The state tuples ``(S, K, R)`` of :func:`run_cycles` for the fabric ``fab`` (during a run)."""
    s, code, r = fab.s, fab.code, fab.routers
    c = s.counters
    S = (s.rdata, s.rctrl, s.rhead, s.rcount, s.tdata, s.tcolor, s.tctrl, s.thead, s.tcount, s.mem, s.regs,
         s.dsd_kind, s.dsd_base, s.dsd_len, s.dsd_stride, s.entry, s.bound, s.blocked, s.activated, s.base,
         s.ncode, s.running, s.task, s.pc, s.time, s.waiting, s.task_start, s.instr_start, s.inflight_due,
         s.vactive, s.vrow, s.vi, s.vn, s.vacc, s.vscalar, s.vkind, s.vbase, s.vlen, s.vstride) \
        + tuple(c[k] for k in COUNTERS) + (s.xstage, s.xbusy)
    K = (code.kind, code.op, code.vop, code.cycles, code.rd, code.ra, code.rb, code.imm, code.rs, code.target,
         code.task, code.dd, code.da, code.db, code.color, code.vec_fmt, code.has_db, code.has_rs, SOP_OF)
    R = (r.data, r.ctrl, r.head, r.count, r.route_in, r.route_mask, r.nbr, r.edge_r, r.edge_p, r.edge_stream,
         r.stream_color, r.stream_pos, r.stream_left, r.stream_words, r.stream_flags)
    return S, K, R


@njit(inline="always")
def _select(t, G, k, S, C):
    """Task selection of the idle PEs ``G[_IDLE, :k]`` (spec 4.3); the PEs that started a task go to
    ``G[_A]``. Returns ``(started, wavelets taken)``."""
    (rdata, rctrl, rhead, rcount, _, _, _, _, _, _, regs, _, _, _, _, entry, bound, blocked, activated, _, _,
     running, task, pc, time, waiting, task_start) = S[:27]
    tasks = S[44]
    slots, T = rdata.shape[2], entry.shape[1]
    started = moved = 0
    for i in range(k):
        p = G[_IDLE, i]
        found, by_data = -1, False
        for q in range(T):
            data = q < C and bound[p, q] and rcount[p, q] > 0
            if not blocked[p, q] and entry[p, q] >= 0 and (data or activated[p, q]):
                found, by_data = q, data
                break
        if found < 0:
            waiting[p] = True
            continue
        if by_data:
            h = rhead[p, found]
            regs[p, 1], regs[p, 2] = rdata[p, found, h], rctrl[p, found, h]
            rhead[p, found] = (h + 1) % slots
            rcount[p, found] -= 1
            moved += 1
        else:
            activated[p, found] = False
        running[p], task[p], pc[p] = True, found, entry[p, found]
        task_start[p] = t
        tasks[p] += 1
        time[p] = t + 1
        G[_A, started] = p
        started += 1
    return started, moved


@njit(inline="always")
def _operands(G, lst, rows, k, off, S, K, OP):
    """Decode the vector instructions of ``G[lst, :k]`` at ``G[rows, :k]`` into the operand scratch from row
    ``off``; the vop and rd columns go to ``OP[6]``, ``OP[7]``."""
    (_, _, _, _, _, _, _, _, _, _, regs, dsd_kind, dsd_base, dsd_len, dsd_stride) = S[:15]
    (_, _, vop, _, rd, _, _, _, rs, _, _, dd, da, db, _, vec_fmt, has_db, has_rs, _) = K
    kind, base, ln, stride, scalar, n, vop_g, rd_g = OP[:8]
    veck.decode_operands(G[lst, :k], G[rows, :k], vop, dd, da, db, vec_fmt, has_db, has_rs, rs, dsd_kind,
                         dsd_base, dsd_len, dsd_stride, regs, kind[off:], base[off:], ln[off:], stride[off:],
                         scalar[off:], n[off:])
    for j in range(k):
        vop_g[off + j], rd_g[off + j] = vop[G[rows, j]], rd[G[rows, j]]


@njit(inline="always")
def _private(t, G, kf, ko, S, K, C, OP):
    """Memory vector instructions of ``G[_PF, :kf]`` (``fmacw``) and ``G[_PO, :ko]`` (the others), whole:
    checks first (True: one faults, nothing changed), then counters, elements, pc and time."""
    mem, regs = S[9], S[10]
    pc, time = S[23], S[24]
    instructions, fmac, flops = S[40], S[41], S[42]
    cycles = K[3]
    kind, base, ln, stride, scalar, n, vop_g, rd_g = OP[:8]
    _operands(G, _PF, _RF, kf, 0, S, K, OP)
    _operands(G, _PO, _RO, ko, kf, S, K, OP)
    m = kf + ko
    if veck.any_fault(vop_g[:m], kind[:m], base[:m], ln[:m], stride[:m], n[:m], C, mem.shape[1], False):
        return True
    veck.count(G[_PF, :kf], vop_g[:kf], n[:kf], instructions, flops, fmac)
    veck.count(G[_PO, :ko], vop_g[kf:m], n[kf:m], instructions, flops, fmac)
    veck.memory_fmacw(G[_PF, :kf], base[:kf], ln[:kf], stride[:kf], n[:kf], mem)
    veck.memory_elements(G[_PO, :ko], vop_g[kf:m], kind[kf:m], base[kf:m], stride[kf:m], n[kf:m],
                         scalar[kf:m], rd_g[kf:m], mem, regs)
    for j in range(kf):
        p = G[_PF, j]
        pc[p] += 1
        time[p] += n[j] + cycles[G[_RF, j]]
    for j in range(ko):
        p = G[_PO, j]
        pc[p] += 1
        time[p] += n[kf + j] + cycles[G[_RO, j]]
    return False


@njit(inline="always")
def _run_ahead(t, G, src, k, S, K, C, limit, OP, touch):
    """Private instructions of ``G[src, :k]`` ahead of the clock (the array stepper's ``_run_ahead``): the
    PEs at a fabric instruction due in cycle ``t`` go to ``G[_NOW]``. Returns ``(count, code, a, b, c)``;
    at a fault ``code`` is not ``IDLE``: ``F_SCALAR`` with ``(pe, kind, value)``, ``F_VMEM`` with the
    group's size in ``a`` (the group in ``G[_SUB]``)."""
    (_, _, _, _, _, _, _, _, _, mem, regs, dsd_kind, dsd_base, dsd_len, dsd_stride, entry, _, blocked,
     activated, base, ncode, running, task, pc, time, waiting, task_start) = S[:27]
    busy, instructions = S[39], S[40]
    (kinds, op, vop, cycles, rd, ra, rb, imm, rs, target, tsk, dd, da, db, _, vec_fmt, has_db, _, sop) = K
    for j in range(k):
        G[_CUR, j] = G[src, j]
    nout = 0
    while k > 0:
        j, fk, value, ks = scalar_kernel(G[_CUR, :k], limit, base, ncode, kinds, sop, op, rd, ra, rb, imm, rs,
                                         target, tsk, dd, cycles, regs, mem, dsd_kind, dsd_base, dsd_len,
                                         dsd_stride, activated, blocked, entry, pc, time, instructions,
                                         G[_STOP])
        if j >= 0:
            return nout, F_SCALAR, G[_CUR, j], fk, value
        for i in range(ks):
            p = G[_STOP, i]
            G[_OUT, i] = base[p] + pc[p]
        veck.touches_fabric(G[_STOP, :ks], G[_OUT, :ks], dd, da, db, vec_fmt, has_db, dsd_kind, touch)
        kf = ko = npriv = 0
        for i in range(ks):
            p, r = G[_STOP, i], G[_OUT, i]
            if kinds[r] == K_VECTOR and not touch[i]:
                G[_PRIV, npriv] = p
                npriv += 1
                if op[r] == _FMACW:
                    G[_PF, kf], G[_RF, kf] = p, r
                    kf += 1
                else:
                    G[_PO, ko], G[_RO, ko] = p, r
                    ko += 1
        if npriv and _private(t, G, kf, ko, S, K, C, OP):
            for i in range(npriv):
                G[_SUB, i] = G[_PRIV, i]
            return nout, F_VMEM, npriv, 0, 0
        for i in range(ks):
            p, r = G[_STOP, i], G[_OUT, i]
            if kinds[r] == K_EXIT:
                instructions[p] += 1
                busy[p] += time[p] + 1 - task_start[p]
                running[p], task[p] = False, -1
                time[p] += 1
            elif not (kinds[r] == K_VECTOR and not touch[i]) and time[p] == t:
                G[_NOW, nout] = p
                nout += 1
        for i in range(npriv):
            G[_CUR, i] = G[_PRIV, i]
        k = npriv
    return nout, IDLE, 0, 0, 0


@njit(inline="always")
def _indexed(t, G, nx, S, K, C, XF):
    """Cycle ``t`` of the ``fmacx``/``fdotx`` of ``G[_XL, :nx]`` (:func:`.vindexed.indexed_cycle`); a fault
    leaves ``(pe, kind, value)`` in ``XF``. Returns the wavelets taken."""
    (rdata, rctrl, rhead, rcount, _, _, _, _, _, mem, regs, dsd_kind, dsd_base, dsd_len, dsd_stride) = S[:15]
    base, pc, time, waiting, instr_start = S[19], S[23], S[24], S[25], S[27]
    vi, vn = S[31], S[32]
    fmac, flops, stall = S[41], S[42], S[43]
    xstage, xbusy = S[45], S[46]
    op, rd, dd, da, db, color = K[1], K[4], K[11], K[12], K[13], K[14]
    XF[1] = 0
    return vindexed.indexed_cycle(G[_XL, :nx], t, C, op, rd, dd, da, db, color, base, pc, rdata, rctrl, rhead,
                                  rcount, mem, regs, dsd_kind, dsd_base, dsd_len, dsd_stride, xstage, xbusy, vi, vn,
                                  instr_start, time, waiting, stall, fmac, flops, XF)


@njit(inline="always")
def _fabric(t, G, k, nvec, nx, S, K, C, tx_depth, OP):
    """Fabric instructions of ``G[_NOW, :k]`` reached in cycle ``t`` (the array stepper's ``_fabric``):
    vector starts appended to ``G[_VEC]`` from ``nvec``, ``fmacx``/``fdotx`` starts to ``G[_XL]`` from
    ``nx``, the send/recv that went on to ``G[_CONT]``. Returns ``(nvec, ncont, nx, code, a, b)``:
    ``F_FVEC`` with the group's size (in ``G[_SUB]``), ``F_COLOR`` with ``(pe, color)``."""
    (rdata, _, rhead, rcount, tdata, tcolor, tctrl, thead, tcount, mem, regs) = S[:11]
    base, pc, time, waiting, instr_start = S[19], S[23], S[24], S[25], S[27]
    (vacc, vactive, vrow, vi, vn, vscalar, vkind, vbase, vlen, vstride) = (S[33], S[29], S[30], S[31], S[32],
                                                                        S[34], S[35], S[36], S[37], S[38])
    instructions, fmac, flops, stall = S[40], S[41], S[42], S[43]
    xstage, xbusy = S[45], S[46]
    (kinds, op, _, cycles, rd, ra, _, _, _, _, _, _, _, _, color, _, _, _, _) = K
    kind, vbase_g, ln, stride, scalar, n, vop_g, _ = OP[:8]
    nb = no = 0
    for j in range(k):
        p = G[_NOW, j]
        if instr_start[p] < 0:
            instr_start[p] = t
        r = base[p] + pc[p]
        if kinds[r] == K_VECTOR:
            G[_PF, nb], G[_RF, nb] = p, r
            nb += 1
        elif kinds[r] == K_INDEXED:
            instructions[p] += 1
            xstage[p], xbusy[p] = 3, 0
            G[_XL, nx] = p
            nx += 1
        else:
            G[_PO, no], G[_RO, no] = p, r
            no += 1
    if nb:
        _operands(G, _PF, _RF, nb, 0, S, K, OP)
        if veck.any_fault(vop_g[:nb], kind[:nb], vbase_g[:nb], ln[:nb], stride[:nb], n[:nb], C, mem.shape[1],
                          True):
            for i in range(nb):
                G[_SUB, i] = G[_PF, i]
            return nvec, 0, nx, F_FVEC, nb, 0
        veck.count(G[_PF, :nb], vop_g[:nb], n[:nb], instructions, flops, fmac)
        veck.begin(G[_PF, :nb], G[_RF, :nb], kind, vbase_g, ln, stride, scalar, n, rd, regs, vacc, vactive, vrow,
                   vi, vn, vscalar, vkind, vbase, vlen, vstride)
        for i in range(nb):
            G[_VEC, nvec + i] = G[_PF, i]
        nvec += nb
    if no == 0:
        return nvec, 0, nx, IDLE, 0, 0
    send = OP[8]
    for j in range(no):
        r = G[_RO, j]
        if color[r] >= C:
            return nvec, 0, nx, F_COLOR, G[_PO, j], color[r]
        send[j] = kinds[r] == K_SEND
    went = veck.send_recv(G[_PO, :no], G[_RO, :no], t, send[:no], _SENDC, op, ra, rd, color, cycles, regs,
                          rdata, rhead, rcount, tdata, tcolor, tctrl, thead, tcount, tx_depth, waiting,
                          instructions, stall, instr_start, pc, time, G[_CONT])
    return nvec, went, nx, IDLE, 0, 0


@njit(inline="always")
def _elements(t, G, nvec, nmore, S, K, tx_depth, NX):
    """The next element of the fabric vector instructions of ``G[_VEC, :nvec]`` in cycle ``t`` (the array
    stepper's ``vector_elements``): the PEs whose instruction ended are appended to ``G[_MORE]`` from
    ``nmore`` (the empty ones, then ``fmacw``, then the others), results for the output queues go to
    ``NX``. Returns ``(nmore, outputs, wavelets taken)``."""
    (rdata, _, rhead, rcount, _, _, _, _, tcount, mem, regs) = S[:11]
    pc, time, waiting, instr_start, inflight_due = S[23], S[24], S[25], S[27], S[28]
    (vactive, vrow, vi, vn, vacc, vscalar, vkind, vbase, vlen, vstride) = S[29:39]
    stall = S[43]
    op, vop, cycles, rd = K[1], K[2], K[3], K[4]
    nf = no = 0
    for j in range(nvec):
        p = G[_VEC, j]
        if vn[p] == 0:
            veck._end(p, t + 1, vrow, vkind, vacc, vn, rd, cycles, regs, stall, instr_start, pc, vactive, time)
            G[_MORE, nmore] = p
            nmore += 1
        elif op[vrow[p]] == _FMACW:
            G[_PF, nf] = p
            nf += 1
        else:
            G[_PO, no] = p
            no += 1
    moved = 0
    if nf:
        ne, m = veck.fabric_fmacw(G[_PF, :nf], t, rdata, rhead, rcount, mem, vbase, vstride, vlen, vi, vn, vrow,
                                  vkind, vacc, rd, cycles, regs, stall, instr_start, pc, vactive, time, waiting,
                                  G[_MORE, nmore:])
        nmore += ne
        moved += m
    nout = 0
    if no:
        ne, nout, m = veck.fabric_elements(G[_PO, :no], t, vop, rdata, rhead, rcount, tcount, tx_depth,
                                           inflight_due, mem, vbase, vstride, vi, vn, vrow, vkind, vacc, vscalar,
                                           rd, cycles, regs, stall, instr_start, pc, vactive, time, waiting,
                                           G[_MORE, nmore:], NX[0], NX[1], NX[2])
        nmore += ne
        moved += m
    return nmore, nout, moved


@njit(inline="always")
def _step(t, G, S, K, P, OP, touch, NX, XF):
    """The PEs' work of cycle ``t`` (the array stepper's ``_step_pes``). Returns ``(wavelets taken,
    outputs in NX, code, a, b, c)``, ``code`` not ``IDLE`` at a fault (see :func:`_run_ahead`, :func:`_fabric`)."""
    C, limit, tx_depth = P[0], P[1], P[2]
    running, time, waiting, vactive, xstage = S[21], S[24], S[25], S[29], S[45]
    ni = nr = nvec = nx = 0
    for p in range(time.size):
        if time[p] == t and not waiting[p]:
            if not running[p]:
                G[_IDLE, ni] = p
                ni += 1
            elif vactive[p]:
                G[_VEC, nvec] = p
                nvec += 1
            elif xstage[p] > 0:
                G[_XL, nx] = p
                nx += 1
            else:
                G[_REST, nr] = p
                nr += 1
    if ni + nr + nvec + nx == 0:
        return 0, 0, IDLE, 0, 0, 0
    na, moved = _select(t, G, ni, S, C) if ni else (0, 0)
    for j in range(nr):
        G[_A, na + j] = G[_REST, j]
    nnow = ncont = 0
    if na + nr:
        nnow, code, a, b, c = _run_ahead(t, G, _A, na + nr, S, K, C, limit, OP, touch)
        if code != IDLE:
            return moved, 0, code, a, b, c
    if nnow:
        nvec, ncont, nx, code, a, b = _fabric(t, G, nnow, nvec, nx, S, K, C, tx_depth, OP)
        if code != IDLE:
            return moved, 0, code, a, b, 0
    moved += ncont
    if nx:
        moved += _indexed(t, G, nx, S, K, C, XF)
        if XF[1] != 0:
            return moved, 0, F_INDEXED, XF[0], XF[1], XF[2]
    for j in range(ncont):
        G[_MORE, j] = G[_CONT, j]
    nmore, nout = ncont, 0
    if nvec:
        nmore, nout, m = _elements(t, G, nvec, ncont, S, K, tx_depth, NX)
        moved += m
    code = a = b = c = 0
    if nmore:
        _, code, a, b, c = _run_ahead(t, G, _MORE, nmore, S, K, C, limit, OP, touch)
    return moved, nout, code, a, b, c


@njit(inline="always")
def _stuck(S, R):
    """Whether anything still holds wavelets or a task (the fabric is not idle)."""
    rcount, tcount, running = S[3], S[8], S[21]
    count, stream_left = R[3], R[12]
    return count.any() or tcount.any() or stream_left.any() or running.any() or rcount.any()


@njit(fastmath=False, cache=True)
def run_cycles(S, K, R, P, W, ctl, edge_out):
    """Advance the fabric from cycle ``ctl[0]`` until it stops (see the module text); returns ``(code, a, b,
    c)``. ``P``: ``(colors, cycle limit, tx_depth, rx_depth, router_depth, most edge outputs in a cycle)``;
    ``W``: the scratch arrays; ``ctl``: ``[cycle, pending outputs, hops, edge outputs]``, the last two
    counted from this call; ``edge_out`` gets rows ``(port, router, color, data, ctrl)``."""
    C, limit, tx_depth, rx_depth, depth, edge_max = P
    G, OP, touch, NX, PD, woken, gr, gc, moves, chosen, XF = W
    (data, ctrl, head, count, route_in, route_mask, nbr, edge_r, edge_p, edge_stream, stream_color, stream_pos,
     stream_left, stream_words, stream_flags) = R
    rdata, rctrl, rhead, rcount, tdata, tcolor, tctrl, thead, tcount = S[:9]
    time, waiting = S[24], S[25]
    tslots = tdata.shape[1]
    t, npend = ctl[0], ctl[1]
    hops = ne = 0
    code = a = b = c = 0
    while True:
        if t >= limit:
            code = LIMIT
            break
        if ne + edge_max > edge_out.shape[0]:
            code = DRAIN
            break
        grants, nmoves, injections = kernels.decide(t % C, count, route_in, route_mask, nbr, depth, rcount,
                                                    rx_depth, tcount, thead, tcolor, edge_r, edge_p, edge_stream,
                                                    stream_left, gr, gc, moves, chosen)
        moved, nnext, code, a, b, c = _step(t, G, S, K, P, OP, touch, NX, XF)
        if code != IDLE:
            break
        progress = grants > 0 or nmoves > 0 or injections > 0 or moved > 0 or npend > 0
        nw = 0
        if grants or nmoves or injections:
            h, nw, e = kernels.apply(gr, gc, grants, data, ctrl, head, count, route_mask, nbr, rdata, rctrl,
                                     rhead, rcount, woken, edge_out[ne:])
            hops += h
            ne += e
            if injections:
                kernels.inject(chosen, edge_r, stream_color, stream_pos, stream_left, stream_words, stream_flags,
                               data, ctrl, head, count)
            if nmoves:
                kernels.take(moves, nmoves, data, ctrl, head, count, tdata, tcolor, tctrl, thead, tcount)
                woken[nw:nw + nmoves] = moves[:nmoves]
                nw += nmoves
        for i in range(npend):
            p = PD[0][i]
            slot = (thead[p] + tcount[p]) % tslots
            tdata[p, slot], tcolor[p, slot], tctrl[p, slot] = PD[1][i], PD[2][i], 0
            tcount[p] += 1
        for i in range(nnext):
            PD[0][i], PD[1][i], PD[2][i] = NX[0][i], NX[1][i], NX[2][i]
        npend = nnext
        for i in range(nw):
            w = woken[i]
            if waiting[w]:
                waiting[w] = False
                time[w] = t + 1
        t += 1
        if progress or npend:
            continue
        soonest = -1
        for p in range(time.size):
            if not waiting[p] and (soonest < 0 or time[p] < soonest):
                soonest = time[p]
        if soonest >= 0:
            t = max(t, soonest)
            continue
        code = HANG if _stuck(S, R) else IDLE
        break
    ctl[0], ctl[1], ctl[2], ctl[3] = t, npend, hops, ne
    return code, a, b, c


def _keyed_on_sources(dispatcher, modules) -> None:
    """Key numba's on-disk cache of ``dispatcher`` on the source files of ``modules`` too.

    numba checks only the file of the cached function itself, and the loop is built from the kernels
    of other files (inlined or linked in): without this an edit there would leave a stale compiled loop.
    """
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is None or not hasattr(cache_file, "_source_stamp"):
        return      # another numba version's cache layout: its own rule applies
    stamps = [cache_file._source_stamp]
    for module in modules:
        st = os.stat(module.__file__)
        stamps.append((st.st_mtime, st.st_size))
    cache_file._source_stamp = tuple(stamps)


_keyed_on_sources(run_cycles, (kernels, veck, scalar, fpk, vindexed))


def scratch(fab) -> tuple:
    """The scratch arrays ``W`` of :func:`run_cycles` for ``fab`` (lists of PEs, operands, buffers)."""
    n, C = fab.s.n, fab.colors
    i64 = np.int64
    G = np.zeros((17, n), dtype=i64)
    OP = (np.zeros((n, 3), dtype=i64), np.zeros((n, 3), dtype=i64), np.zeros((n, 3), dtype=i64),
          np.zeros((n, 3), dtype=i64), np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=i64),
          np.zeros(n, dtype=i64), np.zeros(n, dtype=i64), np.zeros(n, dtype=np.bool_))
    NX = (np.zeros(n, dtype=i64), np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=i64))
    PD = (np.zeros(n, dtype=i64), np.zeros(n, dtype=np.uint32), np.zeros(n, dtype=i64))
    r = fab.routers
    return (G, OP, np.zeros(n, dtype=np.bool_), NX, PD, np.zeros(n * C + n, dtype=i64), r._gr, r._gc, r._moves,
            r._chosen, np.zeros(3, dtype=i64))
