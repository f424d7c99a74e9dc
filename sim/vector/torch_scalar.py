"""The PEs' scalar instructions on torch tensors, for a group of PEs at once.

The torch form of :func:`wse.sim.vector.scalar.scalar_kernel`: each PE of the
group runs its scalar instructions ahead of the clock, up to its next other
instruction or until its time reaches ``limit``, every PE at its own program
counter. The group advances in rounds: in each round every PE still running
does one instruction, its own, with every operation's candidate result
computed for the whole group and each PE's selected by its operation code
(:data:`wse.sim.vector.scalar.SOPS`), integers as ``int64`` values of the
32-bit patterns, binary32 operations by :mod:`wse.sim.vector.torchfp`. A
scalar instruction touches only its own PE's registers, memory, descriptors,
task table and clock, so the rounds give the bits of the numba kernel's PE by
PE loop.

At a fault (an address outside memory, a task without an entry point, an
unknown opcode, a fetch outside the program, an instruction that did not
assemble) the PE stops at the faulting instruction and the others run on;
the result names the first faulting PE in group order, the one the numba
kernel reports. The numba kernel leaves the PEs after that one untouched;
here they have run (a fault ends the run, so nothing reads their state).
``tests/test_vector_torch.py`` compares the two on random programs.
"""

from __future__ import annotations

import torch

from . import torchfp as fp
from .code import K_BAD, K_SCALAR

__all__ = ["scalar_kernel"]

M32 = 0xFFFFFFFF
_ADDRESS, _TASK, _UNKNOWN, _FETCH, _BAD = 1, 2, 3, 4, 5
_IMMEDIATE = (0, 2, 3, 4, 5, 6, 7)          # addi .. srai: the register operation with the immediate


def _s32(v: torch.Tensor) -> torch.Tensor:
    """``int64`` 32-bit patterns as signed values."""
    v = v & M32
    return torch.where(v >= 1 << 31, v - (1 << 32), v)


def _pattern(v: torch.Tensor) -> torch.Tensor:
    """``int64`` 32-bit patterns as ``int32`` (for registers, memory and torchfp)."""
    return _s32(v).to(torch.int32)


def _value(bits: torch.Tensor) -> torch.Tensor:
    """``int32`` patterns as ``int64`` values ``0 .. 2^32 - 1``."""
    return bits.to(torch.int64) & M32


def _mul32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a * b mod 2^32`` without overflowing ``int64``."""
    return ((a & 0xFFFF) * b + ((((a >> 16) * b) & 0xFFFF) << 16)) & M32


def _binop(code: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``scalar._binop`` for each lane's operation ``code`` (0 .. 15) on ``int64`` values."""
    shift = b & 31
    ia, ib = _pattern(a), _pattern(b)
    candidates = [
        (a + b) & M32, (a - b) & M32, a & b, a | b, a ^ b, (a << shift) & M32, a >> shift,
        (_s32(a) >> shift) & M32, _mul32(a, b), (_s32(a) < _s32(b)).to(torch.int64), (a < b).to(torch.int64)]
    out = candidates[-1]
    if bool(((code >= 11) & (code <= 15)).any()):        # the float operations only when a lane has one
        candidates += [_value(fp.add(ia, ib)), _value(fp.sub(ia, ib)), _value(fp.mul(ia, ib)),
                       _value(fp.fmax(ia, ib)), fp.lt(ia, ib).to(torch.int64)]
        out = candidates[-1]
    for k in range(len(candidates) - 2, -1, -1):
        out = torch.where(code == k, candidates[k], out)
    return out


def _put(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, mask: torch.Tensor, values) -> None:
    """``table[rows, cols] = values`` where ``mask`` (the old value elsewhere; rows distinct)."""
    cols = cols.clamp(0, table.shape[1] - 1)
    old = table[rows, cols]
    table[rows, cols] = torch.where(mask, torch.as_tensor(values, device=table.device).to(table.dtype), old)


def _execute(s: dict, p: torch.Tensor, r: torch.Tensor, run: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One instruction (rows ``r``) on the lanes ``run`` of PEs ``p``: ``(fault kind, value)`` per
    lane (kind 0: none; a faulting lane changes nothing)."""
    words, ntasks = s["mem"].shape[1], s["entry"].shape[1]
    sop = s["sop"]
    opcode = s["op"][r]
    index = torch.where(opcode < 0, opcode + sop.numel(), opcode)       # numba's indexing from the end
    o = torch.where(run, sop[index.clamp(0, sop.numel() - 1)], -2)
    regs = s["regs"]
    a, b = _value(regs[p, s["ra"][r]]), _value(regs[p, s["rb"][r]])
    im = s["imm"][r]
    value = torch.full_like(a, -1)
    value = torch.where(o <= 15, _binop(o, a, b), value)
    immediate = torch.tensor(_IMMEDIATE, device=a.device)[(o - 16).clamp(0, len(_IMMEDIATE) - 1)]
    value = torch.where((o >= 16) & (o <= 22), _binop(immediate, a, im), value)
    if bool(((o == 23) | (o == 24)).any()):
        value = torch.where(o == 23, _value(fp.ftoi(_pattern(a))), value)
        value = torch.where(o == 24, _value(fp.itof(_pattern(a))), value)
    value = torch.where(o == 25, im & M32, value)
    value = torch.where(o == 26, (im * 65536) & M32, value)
    value = torch.where(o == -2, -1, value)
    taken = (o == 28) | ((o == 29) & (a == b)) | ((o == 30) & (a != b)) | ((o == 31) & (_s32(a) < _s32(b))) \
        | ((o == 32) & (_s32(a) >= _s32(b)))
    npc = torch.where(taken, s["target"][r], s["pc"][p] + 1)
    fault = torch.where(o == -1, _UNKNOWN, 0)
    fvalue = torch.where(o == -1, opcode, 0)
    # Memory: ld, st, ldsd.
    memory = (o == 33) | (o == 34) | (o == 38)
    addr = (a + im) & M32
    outside = memory & (addr >= words)
    outside2 = (o == 38) & ~outside & (addr + 1 >= words)
    fault = torch.where(outside | outside2, _ADDRESS, fault)
    fvalue = torch.where(outside, addr, torch.where(outside2, addr + 1, fvalue))
    mem = s["mem"]
    w0 = _value(mem[p, addr.clamp(0, words - 1)])
    w1 = _value(mem[p, (addr + 1).clamp(0, words - 1)])
    value = torch.where(o == 33, w0, value)
    # Tasks: activate, block, unblock.
    k = s["task"][r]
    k = torch.where(k < 0, k + ntasks, k)                                # numba's indexing from the end
    tasks = (o >= 35) & (o <= 37)
    bad_task = tasks & ((k >= ntasks) | (s["entry"][p, k.clamp(0, ntasks - 1)] < 0))
    fault = torch.where(bad_task, _TASK, fault)
    fvalue = torch.where(bad_task, k, fvalue)
    ok = run & (fault == 0)
    _put(mem, p, addr, ok & (o == 34), regs[p, s["rs"][r]])
    d = s["dd"][r]
    stride = (w1 >> 16) & 0xFFFF
    ldsd = ok & (o == 38)
    _put(s["dsd_kind"], p, d, ldsd, w1 & 3)
    _put(s["dsd_base"], p, d, ldsd, w0 & 0xFFFF)
    _put(s["dsd_len"], p, d, ldsd, w0 >> 16)
    _put(s["dsd_stride"], p, d, ldsd, torch.where(stride >= 0x8000, stride - 0x10000, stride))
    _put(s["activated"], p, k, ok & (o == 35), True)
    _put(s["blocked"], p, k, ok & ((o == 36) | (o == 37)), o == 36)
    base = s["dsd_base"][p, d.clamp(0, s["dsd_base"].shape[1] - 1)]
    _put(s["dsd_base"], p, d, ok & (o == 39), a & 0xFFFF)
    _put(s["dsd_base"], p, d, ok & (o == 40), (base + a) & 0xFFFF)
    _put(s["dsd_len"], p, d, ok & (o == 41), a & 0xFFFF)
    rd = s["rd"][r]
    _put(regs, p, rd, ok & (value >= 0) & (rd != 0), _pattern(value))
    s["pc"][p] = torch.where(ok, npc, s["pc"][p])
    s["time"][p] = torch.where(ok, s["time"][p] + s["cycles"][r], s["time"][p])
    s["instructions"][p] = s["instructions"][p] + ok.to(s["instructions"].dtype)
    return fault, fvalue


def scalar_kernel(pes, limit, base, ncode, kinds, sop, op, rd, ra, rb, imm, rs, target, task, dd, cycles, regs,
                  mem, dsd_kind, dsd_base, dsd_len, dsd_stride, activated, blocked, entry, pc, time,
                  instructions) -> tuple[int, int, int, torch.Tensor]:
    """:func:`wse.sim.vector.scalar.scalar_kernel` on tensors (the same arguments, ``regs`` and
    ``mem`` as ``int32`` patterns, all changed in place; no ``stopped`` buffer). Returns
    ``(-1, 0, 0, stopped)`` with the PEs now at another instruction in group order, or at a
    fault ``(j, kind, value, stopped)`` for the first faulting PE ``pes[j]`` (see the module text)."""
    s = dict(sop=sop, op=op, rd=rd, ra=ra, rb=rb, imm=imm, rs=rs, target=target, task=task, dd=dd, cycles=cycles,
             regs=regs, mem=mem, dsd_kind=dsd_kind, dsd_base=dsd_base, dsd_len=dsd_len, dsd_stride=dsd_stride,
             activated=activated, blocked=blocked, entry=entry, pc=pc, time=time, instructions=instructions)
    g = pes.shape[0]
    dev = pes.device
    active = torch.ones(g, dtype=torch.bool, device=dev)
    stopped = torch.zeros(g, dtype=torch.bool, device=dev)
    fault = torch.zeros(g, dtype=torch.int64, device=dev)
    fvalue = torch.zeros(g, dtype=torch.int64, device=dev)
    while True:
        active &= time[pes] < limit
        if not bool(active.any()):
            break
        where = pc[pes]
        fetch = active & ((where < 0) | (where >= ncode[pes]))
        r = (base[pes] + where).clamp(0, kinds.numel() - 1)
        bad = active & ~fetch & (kinds[r] == K_BAD)
        other = active & ~fetch & ~bad & (kinds[r] != K_SCALAR)
        stopped |= other
        f, v = _execute(s, pes, r, active & ~fetch & ~bad & ~other)
        f = torch.where(fetch, _FETCH, torch.where(bad, _BAD, f))
        v = torch.where(fetch, ncode[pes] - 1, torch.where(bad, r, v))
        fault = torch.where(active & (f != 0), f, fault)
        fvalue = torch.where(active & (f != 0), v, fvalue)
        active &= (f == 0) & ~other
    faulted = torch.nonzero(fault).flatten()
    if faulted.numel():
        j = int(faulted[0])
        return j, int(fault[j]), int(fvalue[j]), pes[stopped]
    return -1, 0, 0, pes[stopped]
