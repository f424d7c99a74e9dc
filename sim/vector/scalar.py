"""Scalar instructions of the vectorized model, for a group of PEs at once.

:func:`run_scalars` runs the scalar instructions of each PE of a group
ahead of the clock, up to its next other instruction (each PE may be at a
different program counter), in one compiled loop over the group
(:func:`scalar_kernel`): each PE's operand fields come from the code
table's columns. The semantics are those of
:mod:`wse.sim.golden.decode`, bit for bit; binary32 operations are
:mod:`wse.sim.vector.fpk`'s. A fault stops the loop and is raised with the
golden model's message.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.firmware.isa import BY_OPCODE

from .code import K_BAD, K_SCALAR
from .fpk import as_f32, as_u32, fadd, fmax, fmul, fsub, ftz

__all__ = ["run_scalars", "scalar_kernel", "scalar_fault", "M32", "SOPS", "SOP_OF"]

M32 = 0xFFFFFFFF

#: The scalar operations of the compiled kernel, in code order.
SOPS = ("add", "sub", "and", "or", "xor", "shl", "shr", "sra", "mul", "slt", "sltu", "sfadd", "sfsub",
        "sfmul", "sfmax", "sflt", "addi", "andi", "ori", "xori", "shli", "shri", "srai", "ftoi", "itof",
        "li", "lui", "nop", "jmp", "beq", "bne", "blt", "bge", "ld", "st", "activate", "block", "unblock",
        "ldsd", "setb", "addb", "setl")
_CODE = {name: i for i, name in enumerate(SOPS)}
#: Scalar operation code by opcode (-1: not a scalar instruction of the table).
SOP_OF = np.full(max(BY_OPCODE) + 1, -1, dtype=np.int64)
for _op, _ins in BY_OPCODE.items():
    SOP_OF[_op] = _CODE.get(_ins.name, -1)

_ADDRESS, _TASK, _UNKNOWN, _FETCH, _BAD = 1, 2, 3, 4, 5
_K_SCALAR, _K_BAD = K_SCALAR, K_BAD


@njit(inline="always")
def _s32(v):
    v = np.int64(v) & M32
    return v - (1 << 32) if v & 0x80000000 else v


@njit(inline="always")
def _ftoi(a):
    a = ftz(a)
    f = as_f32(a)
    if f != f:
        return 0
    v = np.float64(f)
    if v >= 2147483648.0:
        return 0x7FFFFFFF
    if v < -2147483648.0:
        return 0x80000000
    return np.int64(v) & M32


@njit(inline="always")
def _binop(o, a, b):
    if o == 0:
        return (a + b) & M32
    if o == 1:
        return (a - b) & M32
    if o == 2:
        return a & b
    if o == 3:
        return a | b
    if o == 4:
        return a ^ b
    if o == 5:
        return (a << (b & 31)) & M32
    if o == 6:
        return a >> (b & 31)
    if o == 7:
        return (_s32(a) >> (b & 31)) & M32
    if o == 8:
        return np.int64((np.uint64(a) * np.uint64(b)) & np.uint64(M32))
    if o == 9:
        return 1 if _s32(a) < _s32(b) else 0
    if o == 10:
        return 1 if a < b else 0
    ua, ub = np.uint32(a), np.uint32(b)
    if o == 11:
        return np.int64(fadd(ua, ub))
    if o == 12:
        return np.int64(fsub(ua, ub))
    if o == 13:
        return np.int64(fmul(ua, ub))
    if o == 14:
        return np.int64(fmax(ua, ub))
    fa, fb = as_f32(ftz(ua)), as_f32(ftz(ub))
    return 1 if fa < fb else 0


@njit(fastmath=False, cache=True)
def scalar_kernel(pes, limit, base, ncode, kinds, sop, op, rd, ra, rb, imm, rs, target, task, dd, cycles, regs,
                   mem, dsd_kind, dsd_base, dsd_len, dsd_stride, activated, blocked, entry, pc, time, instructions,
                   stopped):
    """Run each PE's scalar instructions ahead of the clock (pc, time and the instruction count
    advanced) until its next instruction is not a scalar one (the PE is written to ``stopped``) or its
    time reaches ``limit`` (left out). Returns ``(-1, 0, 0, stopped count)``, or at a fault
    ``(j, kind, value, 0)`` with that PE at the faulting instruction."""
    words, ntasks = mem.shape[1], entry.shape[1]
    k = 0
    for j in range(pes.size):
        p = pes[j]
        while time[p] < limit:
            if pc[p] < 0 or pc[p] >= ncode[p]:
                return j, _FETCH, ncode[p] - 1, 0
            r = base[p] + pc[p]
            if kinds[r] != _K_SCALAR:
                if kinds[r] == _K_BAD:
                    return j, _BAD, r, 0
                stopped[k] = p
                k += 1
                break
            fault, value = _scalar(p, r, sop, op, rd, ra, rb, imm, rs, target, task, dd, cycles, regs, mem,
                                   dsd_kind, dsd_base, dsd_len, dsd_stride, activated, blocked, entry, pc, time,
                                   instructions, words, ntasks)
            if fault:
                return j, fault, value, 0
    return -1, 0, 0, k


@njit(inline="always")
def _scalar(p, r, sop, op, rd, ra, rb, imm, rs, target, task, dd, cycles, regs, mem, dsd_kind, dsd_base,
            dsd_len, dsd_stride, activated, blocked, entry, pc, time, instructions, words, ntasks):
    """One scalar instruction (row ``r``) on PE ``p``: ``(0, 0)`` or ``(fault kind, value)``."""
    o = sop[op[r]]
    a = np.int64(regs[p, ra[r]])
    b = np.int64(regs[p, rb[r]])
    im = imm[r]
    value = np.int64(-1)
    npc = pc[p] + 1
    if o < 0:
        return _UNKNOWN, op[r]
    if o <= 15:
        value = _binop(o, a, b)
    elif o <= 22:    # addi .. srai: add .. sra with the immediate
        value = _binop((0, 2, 3, 4, 5, 6, 7)[o - 16], a, im)
    elif o == 23:
        value = _ftoi(np.uint32(a))
    elif o == 24:
        value = np.int64(as_u32(np.float32(_s32(a))))
    elif o == 25:
        value = im & M32
    elif o == 26:
        value = (im << 16) & M32
    elif o == 28:
        npc = target[r]
    elif 29 <= o <= 32:
        if o == 29:
            taken = a == b
        elif o == 30:
            taken = a != b
        elif o == 31:
            taken = _s32(a) < _s32(b)
        else:
            taken = _s32(a) >= _s32(b)
        if taken:
            npc = target[r]
    elif o == 33 or o == 34 or o == 38:
        addr = (a + im) & M32
        if addr >= words:
            return _ADDRESS, addr
        if o == 33:
            value = np.int64(mem[p, addr])
        elif o == 34:
            mem[p, addr] = regs[p, rs[r]]
        else:
            if addr + 1 >= words:
                return _ADDRESS, addr + 1
            w0, w1 = np.int64(mem[p, addr]), np.int64(mem[p, addr + 1])
            d = dd[r]
            stride = (w1 >> 16) & 0xFFFF
            dsd_kind[p, d] = w1 & 3
            dsd_base[p, d] = w0 & 0xFFFF
            dsd_len[p, d] = w0 >> 16
            dsd_stride[p, d] = stride - 0x10000 if stride & 0x8000 else stride
    elif 35 <= o <= 37:
        k = task[r]
        if k >= ntasks or entry[p, k] < 0:
            return _TASK, k
        if o == 35:
            activated[p, k] = True
        else:
            blocked[p, k] = o == 36
    elif o == 39:
        dsd_base[p, dd[r]] = a & 0xFFFF
    elif o == 40:
        dsd_base[p, dd[r]] = (dsd_base[p, dd[r]] + a) & 0xFFFF
    elif o == 41:
        dsd_len[p, dd[r]] = a & 0xFFFF
    if value >= 0 and rd[r] != 0:
        regs[p, rd[r]] = value
    pc[p] = npc
    time[p] += cycles[r]
    instructions[p] += 1
    return 0, 0


def run_scalars(fab, pes: np.ndarray) -> np.ndarray:
    """Run the scalar instructions of ``pes`` ahead of the clock (below the run's cycle limit);
    returns the PEs now at another instruction. A fault is raised with the golden model's message."""
    s, code = fab.s, fab.code
    stopped = np.empty(pes.size, dtype=np.int64)
    j, kind, value, k = scalar_kernel(
        pes, fab.cycle_limit, s.base, s.ncode, code.kind, SOP_OF, code.op, code.rd, code.ra, code.rb, code.imm,
        code.rs, code.target, code.task, code.dd, code.cycles, s.regs, s.mem, s.dsd_kind, s.dsd_base, s.dsd_len,
        s.dsd_stride, s.activated, s.blocked, s.entry, s.pc, s.time, s.counters["instructions"], stopped)
    if j < 0:
        return stopped[:k]
    raise scalar_fault(fab, int(pes[j]), kind, value)


def scalar_fault(fab, pe: int, kind: int, value: int) -> Exception:
    """The golden model's fault of PE ``pe`` for the fault ``kind`` and ``value`` that
    :func:`scalar_kernel` returned."""
    s, code = fab.s, fab.code
    if kind == _ADDRESS:
        return fab.fault(pe, f"data address {value} outside memory 0..{s.sram_words - 1}")
    if kind == _TASK:
        return fab.fault(pe, f"task {value} has no entry point in the program")
    if kind == _FETCH:
        return fab.fault(pe, f"instruction fetch outside the program (0..{value})")
    if kind == _BAD:
        return fab.fault(pe, code.errors[int(value)])
    # the ISA table grew: add its semantics here and in the golden decoder
    return AssertionError(f"no vector-model semantics for {BY_OPCODE[int(value)].name}")
