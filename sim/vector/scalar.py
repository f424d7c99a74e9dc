"""Scalar instructions of the vectorized model, for a group of PEs at once.

:func:`execute_scalar` runs one scalar instruction on each PE of a group
(each PE may be at a different program counter; the group is split by
opcode, and each opcode's PEs gather their operand fields from the code
table). The semantics are those of :mod:`wse.sim.golden.decode`, bit for bit.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.firmware.isa import BY_OPCODE

__all__ = ["execute_scalar", "M32"]

M32 = 0xFFFFFFFF


def _s32(v: np.ndarray) -> np.ndarray:
    return v.astype(np.uint32).view(np.int32).astype(np.int64)


def _u(v) -> np.ndarray:
    return np.asarray(v, dtype=np.int64) & M32


_BINOP = {
    "add": lambda a, b: (a + b) & M32, "sub": lambda a, b: (a - b) & M32,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
    "shl": lambda a, b: (a << (b & 31)) & M32, "shr": lambda a, b: a >> (b & 31),
    "sra": lambda a, b: (_s32(a) >> (b & 31)) & M32,
    "mul": lambda a, b: ((a & 0xFFFF) * b + (((a >> 16) * b & 0xFFFF) << 16)) & M32,
    "slt": lambda a, b: (_s32(a) < _s32(b)).astype(np.int64), "sltu": lambda a, b: (a < b).astype(np.int64),
    "sfadd": lambda a, b: _u(fp.vadd(a.astype(np.uint32), b.astype(np.uint32))),
    "sfsub": lambda a, b: _u(fp.vsub(a.astype(np.uint32), b.astype(np.uint32))),
    "sfmul": lambda a, b: _u(fp.vmul(a.astype(np.uint32), b.astype(np.uint32))),
    "sfmax": lambda a, b: _u(fp.vmax(a.astype(np.uint32), b.astype(np.uint32))),
    "sflt": lambda a, b: _u(fp.vlt(a.astype(np.uint32), b.astype(np.uint32))),
}
_IMMOP = {
    "addi": lambda a, imm: (a + imm) & M32, "andi": lambda a, imm: a & imm, "ori": lambda a, imm: a | imm,
    "xori": lambda a, imm: a ^ imm, "shli": lambda a, imm: (a << (imm & 31)) & M32,
    "shri": lambda a, imm: a >> (imm & 31), "srai": lambda a, imm: (_s32(a) >> (imm & 31)) & M32,
    "ftoi": lambda a, imm: _u(fp.vftoi(a.astype(np.uint32))),
    "itof": lambda a, imm: _u(fp.vitof(a.astype(np.uint32))),
}
_BRANCH = {"beq": lambda a, b: a == b, "bne": lambda a, b: a != b,
           "blt": lambda a, b: _s32(a) < _s32(b), "bge": lambda a, b: _s32(a) >= _s32(b)}


def _write(s, pes, rd, value) -> None:
    keep = rd != 0
    if keep.all():
        s.regs[pes, rd] = value
    elif keep.any():
        s.regs[pes[keep], rd[keep]] = np.asarray(value)[keep] if np.ndim(value) else value


def _address(fab, pes, rows, addr) -> np.ndarray:
    bad = addr >= fab.s.sram_words
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise fab.fault(int(pes[k]), f"data address {int(addr[k])} outside memory 0..{fab.s.sram_words - 1}")
    return addr


def execute_scalar(fab, pes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Run the scalar instruction at ``rows`` on ``pes``; returns each PE's next pc (-1: the next one)."""
    s, code = fab.s, fab.code
    ops = code.op[rows]
    npc = np.full(pes.size, -1, dtype=np.int64)
    for op in np.unique(ops).tolist():
        sel = np.flatnonzero(ops == op) if ops.size > 1 else np.arange(1)
        p, r = pes[sel], rows[sel]
        name = BY_OPCODE[op].name
        rd, ra, rb, imm = code.rd[r], code.ra[r], code.rb[r], code.imm[r]
        regs = s.regs
        if name in _BINOP:
            _write(s, p, rd, _BINOP[name](regs[p, ra].astype(np.int64), regs[p, rb].astype(np.int64)))
        elif name in _IMMOP:
            _write(s, p, rd, _IMMOP[name](regs[p, ra].astype(np.int64), imm))
        elif name == "li":
            _write(s, p, rd, imm & M32)
        elif name == "lui":
            _write(s, p, rd, (imm << 16) & M32)
        elif name == "nop":
            pass
        elif name == "jmp":
            npc[sel] = code.target[r]
        elif name in _BRANCH:
            taken = _BRANCH[name](regs[p, ra].astype(np.int64), regs[p, rb].astype(np.int64))
            npc[sel] = np.where(taken, code.target[r], -1)
        elif name == "ld":
            addr = _address(fab, p, r, (regs[p, ra].astype(np.int64) + imm) & M32)
            _write(s, p, rd, s.mem[p, addr])
        elif name == "st":
            addr = _address(fab, p, r, (regs[p, ra].astype(np.int64) + imm) & M32)
            s.mem[p, addr] = regs[p, code.rs[r]]
        elif name in ("activate", "block", "unblock"):
            task = code.task[r]
            fab.check_task(p, task)
            if name == "activate":
                s.activated[p, task] = True
            else:
                s.blocked[p, task] = name == "block"
        elif name == "ldsd":
            addr = _address(fab, p, r, (regs[p, ra].astype(np.int64) + imm) & M32)
            w0 = s.mem[p, addr].astype(np.int64)
            w1 = s.mem[p, _address(fab, p, r, addr + 1)].astype(np.int64)
            dd = code.dd[r]
            stride = (w1 >> 16) & 0xFFFF
            s.dsd_kind[p, dd] = w1 & 3
            s.dsd_base[p, dd] = w0 & 0xFFFF
            s.dsd_len[p, dd] = w0 >> 16
            s.dsd_stride[p, dd] = np.where(stride & 0x8000, stride - 0x10000, stride)
        elif name in ("setb", "addb", "setl"):
            dd = code.dd[r]
            value = regs[p, ra].astype(np.int64)
            if name == "setb":
                s.dsd_base[p, dd] = value & 0xFFFF
            elif name == "addb":
                s.dsd_base[p, dd] = (s.dsd_base[p, dd] + value) & 0xFFFF
            else:
                s.dsd_len[p, dd] = value & 0xFFFF
        else:  # the ISA table grew: add its semantics here and in the golden decoder
            raise AssertionError(f"no vector-model semantics for {name}")
    return npc
