"""The PEs' vector instructions (spec 4.5) on torch tensors, for a group of PEs at once.

The torch form of :func:`wse.sim.vector.veck.memory_elements` and
:func:`wse.sim.vector.veck.memory_fmacw` (operands in memory, the whole
instruction) and of :func:`wse.sim.vector.veck.fabric_fmacw` and
:func:`wse.sim.vector.veck.fabric_elements` (an operand on the fabric: one
weight chunk or one element per PE and cycle, waiting on an empty input or a
full output queue, then the end of the instruction): the same arguments (the group's PE
indices and their decoded operands, descriptor slots ``dst, a, b``), with the
memory ``mem[pe, word]`` and registers ``regs[pe, r]`` as ``int32`` tensors of
bit patterns, changed in place. Each PE's elements are done in element order,
which is the instruction's definition: the loop runs over the element index
``i`` and every step handles the ``i``-th element of all PEs of the group that
have one (reads of step ``i`` see the writes of steps before it, so
overlapping operands give the element-ordered bits). The PEs of a group are
distinct, so the rows a step reads and writes never collide. PEs executing
different operations in the same step are the normal case: every step
computes the candidate results with :mod:`wse.sim.vector.torchfp`'s binary32
operations (operands and results flushed, NaN canonical, no fused
multiply-add) and selects each PE's by its operation code
(:data:`wse.sim.vector.fpk.VOPS`). ``tests/test_vector_torch.py`` checks each
against its numba kernel on random operations, strides, overlaps and queues.
"""

from __future__ import annotations

import torch

from . import torchfp as fp
from .fpk import VOPS

__all__ = ["memory_elements", "memory_fmacw"]

_DOT, _FSUM = VOPS["dot"], VOPS["fsum"]


def _read(mem: torch.Tensor, pes: torch.Tensor, addr: torch.Tensor) -> torch.Tensor:
    """``mem[pes, addr]`` with addresses clamped into the memory (lanes that do not use them)."""
    return mem[pes, addr.clamp(0, mem.shape[1] - 1)]


def _elementwise(op: torch.Tensor, a: torch.Tensor, b: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """Each lane's element of operation ``op`` (a :data:`VOPS` code below ``dot``)."""
    results = {VOPS["fmov"]: a, VOPS["fadd"]: fp.add(a, b), VOPS["fsub"]: fp.sub(a, b),
               VOPS["fmul"]: fp.mul(a, b), VOPS["fmax"]: fp.fmax(a, b), VOPS["fmacs"]: fp.add(a, fp.mul(b, s)),
               VOPS["fmuls"]: fp.mul(a, s), VOPS["fadds"]: fp.add(a, s)}
    out = fp.fmax(a, s)                                # fmaxs, and any other code (as the numba kernel)
    for code, value in results.items():
        out = torch.where(op == code, value, out)
    return out


def memory_elements(pes, vop, kind, base, stride, n, scalar, rd, mem: torch.Tensor, regs: torch.Tensor) -> None:
    """:func:`~wse.sim.vector.veck.memory_elements` on tensors: the memory-only vector
    instructions (not ``fmacw``) of ``pes``, whole; ``dot`` and ``fsum`` accumulate into
    register ``rd`` (``r0`` is not written). ``kind``, ``base``, ``stride``: ``[group, 3]``
    (slots dst, a, b; ``kind[:, 2] < 0``: no ``b`` operand); ``n``, ``scalar``, ``rd``: ``[group]``."""
    if pes.numel() == 0:
        return
    reduce = (vop == _DOT) | (vop == _FSUM)
    has_b = kind[:, 2] >= 0
    acc = regs[pes, rd]
    zero = torch.zeros_like(acc)
    for i in range(int(n.max())):
        live = n > i
        a = _read(mem, pes, base[:, 1] + i * stride[:, 1])
        b = torch.where(has_b | (vop == _DOT), _read(mem, pes, base[:, 2] + i * stride[:, 2]), zero)
        acc = torch.where(reduce & live, fp.add(acc, torch.where(vop == _DOT, fp.mul(a, b), a)), acc)
        write = live & ~reduce
        dst = (base[:, 0] + i * stride[:, 0]).clamp(0, mem.shape[1] - 1)
        mem[pes, dst] = torch.where(write, _elementwise(vop, a, b, scalar), mem[pes, dst])
    keep = reduce & (rd != 0)
    regs[pes, rd] = torch.where(keep, acc, regs[pes, rd])


def memory_fmacw(pes, base, ln, stride, n, mem: torch.Tensor) -> None:
    """:func:`~wse.sim.vector.veck.memory_fmacw` on tensors: ``fmacw`` with its weights in
    memory, ``mem[d] = add(mem[d], mul(mem[a], w))`` with ``d`` and ``a`` cycling over
    the dst and a lengths (``ln[:, 0]``, ``ln[:, 1]``) and a weight read at the start of
    each chunk of ``max(min(len_dst, len_a), 1)`` elements."""
    if pes.numel() == 0:
        return
    ld, la = ln[:, 0].clamp(min=1), ln[:, 1].clamp(min=1)
    period = torch.minimum(ln[:, 0], ln[:, 1]).clamp(min=1)
    w = torch.zeros(pes.shape[0], dtype=mem.dtype, device=mem.device)
    for i in range(int(n.max())):
        live = n > i
        index = torch.full_like(n, i)
        reload = live & (index % period == 0)
        w = torch.where(reload, _read(mem, pes, base[:, 2] + (index // period) * stride[:, 2]), w)
        dst = (base[:, 0] + (index % ld) * stride[:, 0]).clamp(0, mem.shape[1] - 1)
        a = _read(mem, pes, base[:, 1] + (index % la) * stride[:, 1])
        old = mem[pes, dst]
        mem[pes, dst] = torch.where(live, fp.add(old, fp.mul(a, w)), old)


def _end(p, end, s: dict, mask: torch.Tensor) -> None:
    """``veck._end`` for the lanes ``mask`` of PEs ``p``: the vector instruction's result register,
    stall count, ``pc`` and the time of the next action (``end``)."""
    row = s["vrow"][p]
    rd = s["code_rd"][row]
    regs = s["regs"]
    write = mask & (s["vkind"][p, 0] < 0) & (rd != 0)
    old = regs[p, rd]
    regs[p, rd] = torch.where(write, s["vacc"][p], old)
    stall = s["stall"]
    stall[p] = torch.where(mask, stall[p] + end - s["instr_start"][p] - (s["vn"][p] + s["code_cycles"][row]),
                           stall[p])
    for name, value in (("instr_start", -1), ("pc", s["pc"][p] + 1), ("vactive", False), ("time", end)):
        table = s[name]
        table[p] = torch.where(mask, torch.as_tensor(value, device=p.device).to(table.dtype), table[p])


def fabric_fmacw(pes, t: int, rdata, rhead, rcount, mem, vbase, vstride, vlen, vi, vn, vrow, vkind, vacc,
                 code_rd, code_cycles, regs, stall, instr_start, pc, vactive, time,
                 waiting) -> tuple[torch.Tensor, int]:
    """:func:`~wse.sim.vector.veck.fabric_fmacw` on tensors: each PE of the group takes the next
    weight from its input queue (color ``vbase[:, 2]``; without one it waits) and does the weight's
    chunk of elements, ``mem[d] = add(mem[d], mul(mem[a], w))`` in element order. Returns ``(the
    PEs that ended the instruction, in group order, the wavelets taken)``."""
    if pes.numel() == 0:
        return pes, 0
    s = dict(vrow=vrow, code_rd=code_rd, code_cycles=code_cycles, regs=regs, vkind=vkind, vacc=vacc, stall=stall,
             instr_start=instr_start, vn=vn, pc=pc, vactive=vactive, time=time)
    c = vbase[pes, 2]
    count = rcount[pes, c]
    go = count > 0
    waiting[pes] = waiting[pes] | ~go
    head = rhead[pes, c]
    w = rdata[pes, c, head]
    rhead[pes, c] = torch.where(go, (head + 1) % rdata.shape[2], head)
    rcount[pes, c] = count - go.to(count.dtype)
    i, n = vi[pes], vn[pes]
    ld, la = vlen[pes, 0].clamp(min=1), vlen[pes, 1].clamp(min=1)
    period = torch.minimum(ld, la)
    m = torch.where(go, torch.minimum(period - i % period, n - i), 0)
    words = mem.shape[1]
    for step in range(int(m.max()) if m.numel() else 0):
        live = m > step
        e = i + step
        dst = (vbase[pes, 0] + (e % ld) * vstride[pes, 0]).clamp(0, words - 1)
        a = mem[pes, (vbase[pes, 1] + (e % la) * vstride[pes, 1]).clamp(0, words - 1)]
        old = mem[pes, dst]
        mem[pes, dst] = torch.where(live, fp.add(old, fp.mul(a, w)), old)
    vi[pes] = i + m
    ended = go & (i + m == n)
    _end(pes, t + m + 1, s, ended)
    time[pes] = torch.where(go & ~ended, t + m, time[pes])
    return pes[ended], int(go.sum())


_MEM, _FABIN, _FABOUT = 0, 1, 2


def fabric_elements(pes, t: int, vop, rdata, rhead, rcount, tcount, tx_depth: int, inflight_due, mem, vbase,
                    vstride, vi, vn, vrow, vkind, vacc, vscalar, code_rd, code_cycles, regs, stall, instr_start, pc,
                    vactive, time, waiting) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], int]:
    """:func:`~wse.sim.vector.veck.fabric_elements` on tensors: the next element of each PE's
    fabric vector instruction (not ``fmacw``) in cycle ``t``; a PE whose fabric source is empty or
    whose output queue is full waits. Returns ``(the PEs that ended, (PEs, words, colors) of the
    results for the output queues, the wavelets taken)``, each in group order."""
    if pes.numel() == 0:
        return pes, (pes, pes, pes), 0
    s = dict(vrow=vrow, code_rd=code_rd, code_cycles=code_cycles, regs=regs, vkind=vkind, vacc=vacc, stall=stall,
             instr_start=instr_start, vn=vn, pc=pc, vactive=vactive, time=time)
    kind = vkind[pes]
    ok = torch.ones_like(pes, dtype=torch.bool)
    for slot in (1, 2):
        color = vbase[pes, slot].clamp(0, rcount.shape[1] - 1)              # (an address where not FABIN)
        ok &= ~((kind[:, slot] == _FABIN) & (rcount[pes, color] == 0))
    ok &= ~((kind[:, 0] == _FABOUT) & (tcount[pes] + (inflight_due[pes] == t).to(tcount.dtype) >= tx_depth))
    waiting[pes] = waiting[pes] | ~ok
    i = vi[pes]
    words = mem.shape[1]
    operands = []
    moved = 0
    for slot in (1, 2):
        take = ok & (kind[:, slot] == _FABIN)
        c = vbase[pes, slot].clamp(0, rdata.shape[1] - 1)
        head = rhead[pes, c]
        fabric = rdata[pes, c, head]
        rhead[pes, c] = torch.where(take, (head + 1) % rdata.shape[2], head)
        rcount[pes, c] = rcount[pes, c] - take.to(rcount.dtype)
        moved += int(take.sum())
        memory = mem[pes, (vbase[pes, slot] + i * vstride[pes, slot]).clamp(0, words - 1)]
        zero = torch.zeros_like(fabric)
        operands.append(torch.where(take, fabric, torch.where(kind[:, slot] == _MEM, memory, zero)))
    a, b = operands
    op = vop[vrow[pes]]
    acc = vacc[pes]
    acc = torch.where(op == _DOT, fp.add(acc, fp.mul(a, b)), torch.where(op == _FSUM, fp.add(acc, a), acc))
    vacc[pes] = torch.where(ok, acc, vacc[pes])
    result = _elementwise(op, a, b, vscalar[pes])
    element = ok & (op != _DOT) & (op != _FSUM)
    out = element & (kind[:, 0] == _FABOUT)
    inflight_due[pes] = torch.where(out, t + 1, inflight_due[pes])
    dst = (vbase[pes, 0] + i * vstride[pes, 0]).clamp(0, words - 1)
    mem[pes, dst] = torch.where(element & ~out, result, mem[pes, dst])
    vi[pes] = torch.where(ok, i + 1, i)
    ended = ok & (i + 1 == vn[pes])
    _end(pes, t + 2, s, ended)
    time[pes] = torch.where(ok & ~ended, t + 1, time[pes])
    return pes[ended], (pes[out], result[out], vbase[pes, 0][out]), moved
