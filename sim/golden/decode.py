"""Decoding a program for the golden PE: instruction words to executable tuples.

:func:`compile_program` turns each instruction word into ``(kind,
fn_or_fields, cycles, instr)``: scalar instructions become closures over the
PE (:class:`wse.sim.golden.pe.PE` runs them), the others keep their decoded
fields. ``ELEMENT`` and ``VECTOR`` are the element operations of the vector
instructions, one element at a time and over whole arrays.
"""

from __future__ import annotations

import numpy as np

from wse import numerics as fp
from wse.firmware import isa

__all__ = ["M32", "K_SCALAR", "K_VECTOR", "K_SEND", "K_RECV", "K_EXIT", "K_INDEXED", "ELEMENT", "VECTOR",
           "FMAC_OPS", "compile_program"]

M32 = 0xFFFFFFFF

# Kinds of compiled instructions.
K_SCALAR, K_VECTOR, K_SEND, K_RECV, K_EXIT = range(5)
#: ``fmacx`` and ``fdotx`` (:data:`wse.firmware.isa.INDEXED`): vector instructions that read their
#: indices from the fabric (6: the vectorized model's code table uses 5 for an undecodable word).
K_INDEXED = 6

# Scalar element operations of the vector instructions, on bit patterns.
ELEMENT = {
    "fmov": lambda a, b, s: a,
    "fadd": lambda a, b, s: fp.add(a, b),
    "fsub": lambda a, b, s: fp.sub(a, b),
    "fmul": lambda a, b, s: fp.mul(a, b),
    "fmax": lambda a, b, s: fp.fmax(a, b),
    "fmacs": lambda a, b, s: fp.add(a, fp.mul(b, s)),
    "fmuls": lambda a, b, s: fp.mul(a, s),
    "fadds": lambda a, b, s: fp.add(a, s),
    "fmaxs": lambda a, b, s: fp.fmax(a, s),
}
# The same, vectorized over uint32 arrays (b may be None, s a Python int).
VECTOR = {
    "fmov": lambda a, b, s: a.copy(),
    "fadd": lambda a, b, s: fp.vadd(a, b),
    "fsub": lambda a, b, s: fp.vsub(a, b),
    "fmul": lambda a, b, s: fp.vmul(a, b),
    "fmax": lambda a, b, s: fp.vmax(a, b),
    "fmacs": lambda a, b, s: fp.vadd(a, fp.vmul(b, np.uint32(s))),
    "fmuls": lambda a, b, s: fp.vmul(a, np.uint32(s)),
    "fadds": lambda a, b, s: fp.vadd(a, np.uint32(s)),
    "fmaxs": lambda a, b, s: fp.vmax(a, np.uint32(s)),
}
FMAC_OPS = ("fmacs", "dot", "fmacw") + isa.INDEXED


def _s32(value: int) -> int:
    return value - (1 << 32) if value & 0x80000000 else value


def _scalar_closure(name: str, f: dict, sram_words: int):
    """A function ``fn(pe) -> new pc or None`` for a scalar instruction."""
    rd, ra, rb, imm = f.get("rd", 0), f.get("ra", 0), f.get("rb", 0), f.get("imm", 0)
    binop = {
        "add": lambda a, b: (a + b) & M32, "sub": lambda a, b: (a - b) & M32,
        "and": lambda a, b: a & b, "or": lambda a, b: a | b, "xor": lambda a, b: a ^ b,
        "shl": lambda a, b: (a << (b & 31)) & M32, "shr": lambda a, b: a >> (b & 31),
        "sra": lambda a, b: (_s32(a) >> (b & 31)) & M32, "mul": lambda a, b: (a * b) & M32,
        "slt": lambda a, b: int(_s32(a) < _s32(b)), "sltu": lambda a, b: int(a < b),
        "sfadd": fp.add, "sfsub": fp.sub, "sfmul": fp.mul, "sfmax": fp.fmax, "sflt": fp.lt,
    }
    immop = {
        "addi": lambda a: (a + imm) & M32, "andi": lambda a: a & imm, "ori": lambda a: a | imm,
        "xori": lambda a: a ^ imm, "shli": lambda a: (a << (imm & 31)) & M32,
        "shri": lambda a: a >> (imm & 31), "srai": lambda a: (_s32(a) >> (imm & 31)) & M32,
        "ftoi": fp.ftoi, "itof": fp.itof,
    }
    if name in binop:
        op = binop[name]
        if rd == 0:
            return lambda pe: None
        def fn(pe):
            regs = pe.regs
            regs[rd] = op(regs[ra], regs[rb])
        return fn
    if name in immop:
        op = immop[name]
        if rd == 0:
            return lambda pe: None
        def fn(pe):
            regs = pe.regs
            regs[rd] = op(regs[ra])
        return fn
    if name == "li":
        value = imm & M32
        def fn(pe):
            if rd:
                pe.regs[rd] = value
        return fn
    if name == "lui":
        value = (imm << 16) & M32
        def fn(pe):
            if rd:
                pe.regs[rd] = value
        return fn
    if name == "nop":
        return lambda pe: None
    if name == "jmp":
        target = f["target"]
        return lambda pe: target
    if name in ("beq", "bne", "blt", "bge"):
        target = f["target"]
        cond = {"beq": lambda a, b: a == b, "bne": lambda a, b: a != b,
                "blt": lambda a, b: _s32(a) < _s32(b), "bge": lambda a, b: _s32(a) >= _s32(b)}[name]
        def fn(pe):
            regs = pe.regs
            return target if cond(regs[ra], regs[rb]) else None
        return fn
    if name == "ld":
        def fn(pe):
            word = int(pe.mem[pe.address(pe.regs[ra] + imm)])     # read (ECC-counted) even for r0
            if rd:
                pe.regs[rd] = word
        return fn
    if name == "st":
        rs = f["rs"]
        def fn(pe):
            pe.mem[pe.address(pe.regs[ra] + imm)] = pe.regs[rs]
        return fn
    if name in ("activate", "block", "unblock"):
        task = f["task"]
        def fn(pe):
            pe.check_task(task)
            if name == "activate":
                pe.activated[task] = True
            else:
                pe.blocked[task] = name == "block"
        return fn
    if name == "ldsd":
        dd = f["dd"]
        def fn(pe):
            addr = pe.address(pe.regs[ra] + imm)
            w0, w1 = int(pe.mem[addr]), int(pe.mem[pe.address(addr + 1)])
            stride = (w1 >> 16) & 0xFFFF
            pe.dsd[dd] = [w1 & 3, w0 & 0xFFFF, w0 >> 16, stride - 0x10000 if stride & 0x8000 else stride]
        return fn
    if name in ("setb", "addb", "setl"):
        dd = f["dd"]
        def fn(pe):
            value = pe.regs[ra]
            d = pe.dsd[dd]
            if name == "setb":
                d[1] = value & 0xFFFF
            elif name == "addb":
                d[1] = (d[1] + value) & 0xFFFF
            else:
                d[2] = value & 0xFFFF
        return fn
    raise AssertionError(f"no golden semantics for {name}")  # the ISA table grew: add them here


def compile_program(code: np.ndarray, sram_words: int) -> list:
    """Decode instruction words into the PE's executable form: one tuple
    ``(kind, fn_or_fields, cycles, instr)`` per instruction address. Unknown
    opcodes compile to a fault raised only if they are executed."""
    compiled = []
    for word in np.asarray(code, dtype=np.uint32).tolist():
        try:
            ins, fields = isa.decode(word)
        except ValueError as exc:
            compiled.append((None, str(exc), 1, None))
            continue
        name = ins.name
        if name in isa.INDEXED:
            compiled.append((K_INDEXED, fields, ins.cycles, ins))
        elif ins.is_vector:
            compiled.append((K_VECTOR, fields, ins.cycles, ins))
        elif name in ("send", "sendc"):
            compiled.append((K_SEND, fields, ins.cycles, ins))
        elif name == "recv":
            compiled.append((K_RECV, fields, ins.cycles, ins))
        elif name == "exit":
            compiled.append((K_EXIT, fields, ins.cycles, ins))
        else:
            compiled.append((K_SCALAR, _scalar_closure(name, fields, sram_words), ins.cycles, ins))
    return compiled
