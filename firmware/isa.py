"""The PE instruction set, as one table.

Every instruction is one :class:`Instr` row: mnemonic, opcode, format, cycle
cost and a one-line meaning. Formats say where each operand field sits in the
32-bit instruction word and how the assembler writes it. The assembler, the
disassembler, the golden model's decoder and the HDL decoder are all generated
from :data:`INSTRUCTIONS` and :data:`FORMATS`; adding an instruction is one row
here plus its semantics in the golden model and the PE.

Instruction word: ``opcode`` in bits 31..26, operand fields below it.
"""

from __future__ import annotations

import dataclasses
import enum

__all__ = [
    "Field", "Format", "Instr", "Unit", "DsdKind", "FORMATS", "INSTRUCTIONS",
    "BY_NAME", "BY_OPCODE", "OPCODE_BITS", "encode", "decode", "field_value",
    "DATA_TASK_DATA_REG", "DATA_TASK_CTRL_REG", "INDEXED",
]

OPCODE_BITS = 6
OPCODE_SHIFT = 26

#: On entry to a data task, the wavelet's data is in this register ...
DATA_TASK_DATA_REG = 1
#: ... and its control bit (0 or 1) in this one.
DATA_TASK_CTRL_REG = 2


class DsdKind(enum.IntEnum):
    """The kind field of a data-structure descriptor."""
    MEM = 0      #: memory: base word address, length, signed stride
    FABIN = 1    #: fabric input: color, length (wavelets popped from the PE's input queue)
    FABOUT = 2   #: fabric output: color, length (wavelets pushed to the PE's output queue)


class Unit(enum.Enum):
    """Which part of the PE executes an instruction (the HDL decoder groups by it)."""
    CTRL = "ctrl"      #: task control, branches
    ALU = "alu"        #: scalar integer
    MEM = "mem"        #: scalar loads and stores
    FPU = "fpu"        #: scalar binary32
    VEC = "vec"        #: vector engine over DSDs
    DSD = "dsd"        #: DSD register updates
    FABRIC = "fabric"  #: scalar send / receive


@dataclasses.dataclass(frozen=True)
class Field:
    """One operand field of an instruction word.

    ``kind`` is what the operand is: ``reg`` (r0..r15), ``dsd`` (d0..d7),
    ``imm`` (a number or constant expression), ``target`` (an instruction
    address, usually a label), ``color`` (0..31) or ``task`` (0..63).
    """
    name: str
    hi: int
    lo: int
    kind: str
    signed: bool = False

    @property
    def width(self) -> int:
        return self.hi - self.lo + 1

    @property
    def min(self) -> int:
        return -(1 << (self.width - 1)) if self.signed else 0

    @property
    def max(self) -> int:
        return (1 << (self.width - 1)) - 1 if self.signed else (1 << self.width) - 1


@dataclasses.dataclass(frozen=True)
class Format:
    """Field layout of a family of instructions and the assembly syntax.

    ``syntax`` is the operand text with ``{field}`` placeholders, for example
    ``"{rd}, {imm}({ra})"``.
    """
    name: str
    fields: tuple[Field, ...]
    syntax: str

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)


def _f(name, hi, lo, kind, signed=False):
    return Field(name, hi, lo, kind, signed)


RD, RA, RB = _f("rd", 25, 22, "reg"), _f("ra", 21, 18, "reg"), _f("rb", 17, 14, "reg")
DD, DA, DB = _f("dd", 25, 23, "dsd"), _f("da", 22, 20, "dsd"), _f("db", 19, 17, "dsd")

FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("N", (), ""),
    Format("R", (RD, RA, RB), "{rd}, {ra}, {rb}"),
    Format("R2", (RD, RA), "{rd}, {ra}"),
    Format("I", (RD, RA, _f("imm", 17, 0, "imm", True)), "{rd}, {ra}, {imm}"),
    Format("IU", (RD, RA, _f("imm", 17, 0, "imm")), "{rd}, {ra}, {imm}"),
    Format("L", (RD, _f("imm", 21, 0, "imm", True)), "{rd}, {imm}"),
    Format("U", (RD, _f("imm", 15, 0, "imm")), "{rd}, {imm}"),
    Format("M", (RD, RA, _f("imm", 17, 0, "imm", True)), "{rd}, {imm}({ra})"),
    Format("S", (_f("rs", 25, 22, "reg"), RA, _f("imm", 17, 0, "imm", True)), "{rs}, {imm}({ra})"),
    Format("B", (_f("ra", 25, 22, "reg"), _f("rb", 21, 18, "reg"), _f("target", 15, 0, "target")),
           "{ra}, {rb}, {target}"),
    Format("J", (_f("target", 15, 0, "target"),), "{target}"),
    Format("V2", (DD, DA), "{dd}, {da}"),
    Format("V3", (DD, DA, DB), "{dd}, {da}, {db}"),
    Format("VS", (DD, DA, _f("rs", 16, 13, "reg")), "{dd}, {da}, {rs}"),
    Format("VM", (DD, DA, DB, _f("rs", 16, 13, "reg")), "{dd}, {da}, {db}, {rs}"),
    Format("VR", (RD, _f("da", 21, 19, "dsd"), _f("db", 18, 16, "dsd")), "{rd}, {da}, {db}"),
    Format("VX", (DD, DA, DB, _f("color", 4, 0, "color"), _f("rd", 16, 13, "reg")), "{dd}, {da}, {db}, {color}, {rd}"),
    Format("VR1", (RD, _f("da", 21, 19, "dsd")), "{rd}, {da}"),
    Format("DL", (DD, RA, _f("imm", 17, 0, "imm", True)), "{dd}, {imm}({ra})"),
    Format("DR", (DD, RA), "{dd}, {ra}"),
    Format("SND", (RA, _f("color", 4, 0, "color")), "{ra}, {color}"),
    Format("RCV", (RD, _f("color", 4, 0, "color")), "{rd}, {color}"),
    Format("T", (_f("task", 5, 0, "task"),), "{task}"),
]}


@dataclasses.dataclass(frozen=True)
class Instr:
    """One instruction.

    ``cycles`` is the cost with no stalls; for vector instructions it is the
    cost beyond one cycle per element (an ``n``-element vector op takes
    ``n + cycles`` cycles when its operands never wait).
    """
    name: str
    opcode: int
    fmt: str
    unit: Unit
    cycles: int
    doc: str

    @property
    def format(self) -> Format:
        return FORMATS[self.fmt]

    @property
    def is_vector(self) -> bool:
        return self.unit is Unit.VEC


_C, _A, _M, _F, _V, _D, _X = Unit.CTRL, Unit.ALU, Unit.MEM, Unit.FPU, Unit.VEC, Unit.DSD, Unit.FABRIC

# name, opcode, format, unit, cycles, meaning
INSTRUCTIONS: tuple[Instr, ...] = tuple(Instr(*row) for row in [
    # Control and tasks
    ("nop",      0, "N",   _C, 1, "do nothing"),
    ("exit",     1, "N",   _C, 1, "end the running task"),
    ("jmp",      2, "J",   _C, 1, "pc = target"),
    ("beq",      3, "B",   _C, 1, "if ra == rb: pc = target"),
    ("bne",      4, "B",   _C, 1, "if ra != rb: pc = target"),
    ("blt",      5, "B",   _C, 1, "if ra < rb (signed): pc = target"),
    ("bge",      6, "B",   _C, 1, "if ra >= rb (signed): pc = target"),
    ("activate", 7, "T",   _C, 1, "mark task ready to run (local task)"),
    ("block",    8, "T",   _C, 1, "task may not be scheduled until unblocked"),
    ("unblock",  9, "T",   _C, 1, "task may be scheduled again"),
    # Scalar integer
    ("li",      10, "L",   _A, 1, "rd = sign_extend(imm22)"),
    ("lui",     11, "U",   _A, 1, "rd = imm16 << 16"),
    ("add",     12, "R",   _A, 1, "rd = ra + rb"),
    ("sub",     13, "R",   _A, 1, "rd = ra - rb"),
    ("and",     14, "R",   _A, 1, "rd = ra & rb"),
    ("or",      15, "R",   _A, 1, "rd = ra | rb"),
    ("xor",     16, "R",   _A, 1, "rd = ra ^ rb"),
    ("shl",     17, "R",   _A, 1, "rd = ra << (rb & 31)"),
    ("shr",     18, "R",   _A, 1, "rd = ra >> (rb & 31), logical"),
    ("sra",     19, "R",   _A, 1, "rd = ra >> (rb & 31), arithmetic"),
    ("mul",     20, "R",   _A, 1, "rd = low 32 bits of ra * rb"),
    ("slt",     21, "R",   _A, 1, "rd = 1 if ra < rb (signed) else 0"),
    ("sltu",    22, "R",   _A, 1, "rd = 1 if ra < rb (unsigned) else 0"),
    ("addi",    23, "I",   _A, 1, "rd = ra + sign_extend(imm18)"),
    ("andi",    24, "IU",  _A, 1, "rd = ra & imm18"),
    ("ori",     25, "IU",  _A, 1, "rd = ra | imm18"),
    ("xori",    26, "IU",  _A, 1, "rd = ra ^ imm18"),
    ("shli",    27, "IU",  _A, 1, "rd = ra << (imm & 31)"),
    ("shri",    28, "IU",  _A, 1, "rd = ra >> (imm & 31), logical"),
    ("srai",    29, "IU",  _A, 1, "rd = ra >> (imm & 31), arithmetic"),
    # Scalar memory
    ("ld",      30, "M",   _M, 2, "rd = mem[ra + imm]"),
    ("st",      31, "S",   _M, 1, "mem[ra + imm] = rs"),
    # Scalar binary32 (flush-to-zero, round to nearest even)
    ("sfadd",   32, "R",   _F, 1, "rd = ra + rb"),
    ("sfsub",   33, "R",   _F, 1, "rd = ra - rb"),
    ("sfmul",   34, "R",   _F, 1, "rd = ra * rb"),
    ("sfmax",   35, "R",   _F, 1, "rd = max(ra, rb)"),
    ("sflt",    36, "R",   _F, 1, "rd = 1 if ra < rb else 0 (0 if either is NaN)"),
    ("ftoi",    37, "R2",  _F, 1, "rd = int32(ra), truncated toward zero, saturating; NaN gives 0"),
    ("itof",    38, "R2",  _F, 1, "rd = binary32(signed ra), round to nearest even"),
    # Vector engine: one element per cycle over DSDs
    ("fmov",    39, "V2",  _V, 1, "dd[i] = da[i] (raw 32-bit copy)"),
    ("fadd",    40, "V3",  _V, 1, "dd[i] = da[i] + db[i]"),
    ("fsub",    41, "V3",  _V, 1, "dd[i] = da[i] - db[i]"),
    ("fmul",    42, "V3",  _V, 1, "dd[i] = da[i] * db[i]"),
    ("fmax",    43, "V3",  _V, 1, "dd[i] = max(da[i], db[i])"),
    ("fmacs",   44, "VM",  _V, 1, "dd[i] = da[i] + db[i] * rs (multiply, then add: two roundings)"),
    ("fmuls",   45, "VS",  _V, 1, "dd[i] = da[i] * rs"),
    ("fadds",   46, "VS",  _V, 1, "dd[i] = da[i] + rs"),
    ("fmaxs",   47, "VS",  _V, 1, "dd[i] = max(da[i], rs)"),
    ("dot",     48, "VR",  _V, 1, "for i in order: rd = rd + da[i] * db[i]"),
    ("fsum",    49, "VR1", _V, 1, "for i in order: rd = rd + da[i]"),
    ("fmacw",   57, "V3",  _V, 1, "dd[i % Ld] = dd[i % Ld] + da[i % La] * w[i // T], w = db (a weight stream)"),
    ("fmacx",   58, "VX",  _V, 1, "until a control wavelet of color (its data to rd): da.base = the next wavelet, "
                                  "then fmacw dd, da, db (db on the fabric); +1 cycle per index"),
    ("fdotx",   59, "VX",  _V, 1, "until a control wavelet of color (its data to rd): da.base = the next wavelet, "
                                  "then fmacw dd, da, db (db in memory), dd.base += 1; +1 cycle per index"),
    # DSD registers
    ("ldsd",    50, "DL",  _D, 2, "dd = descriptor in mem[ra + imm], mem[ra + imm + 1]"),
    ("setb",    51, "DR",  _D, 1, "dd.base = ra & 0xffff (the color, for fabric DSDs)"),
    ("addb",    52, "DR",  _D, 1, "dd.base = (dd.base + ra) & 0xffff"),
    ("setl",    53, "DR",  _D, 1, "dd.length = ra & 0xffff"),
    # Scalar fabric access
    ("send",    54, "SND", _X, 1, "push wavelet (data=ra, color, ctrl=0) to the output queue"),
    ("sendc",   55, "SND", _X, 1, "push wavelet (data=ra, color, ctrl=1) to the output queue"),
    ("recv",    56, "RCV", _X, 1, "rd = data of the next wavelet of color (waits for one)"),
])

BY_NAME: dict[str, Instr] = {i.name: i for i in INSTRUCTIONS}
#: The indexed vector instructions: an ``fmacw`` per index read from the fabric, until a control
#: wavelet (``docs/architecture.md`` section 4.5). Per index: one cycle for the index, then the
#: ``fmacw``'s elements; the control wavelet's cycle is the instruction's one extra cycle.
INDEXED = ("fmacx", "fdotx")
BY_OPCODE: dict[int, Instr] = {i.opcode: i for i in INSTRUCTIONS}


def _check_table() -> None:
    assert len(BY_NAME) == len(INSTRUCTIONS), "duplicate mnemonic"
    assert len(BY_OPCODE) == len(INSTRUCTIONS), "duplicate opcode"
    for ins in INSTRUCTIONS:
        assert 0 <= ins.opcode < (1 << OPCODE_BITS), ins
        used = 0
        for f in ins.format.fields:
            mask = ((1 << f.width) - 1) << f.lo
            assert not used & mask and f.hi < OPCODE_SHIFT, (ins, f)
            used |= mask
        if ins.is_vector:
            assert ins.name.startswith("f") or ins.name in ("dot",), ins


_check_table()


def field_value(word: int, field: Field) -> int:
    """The value of one operand field of an instruction word (sign-extended
    where the field is signed)."""
    value = (word >> field.lo) & ((1 << field.width) - 1)
    if field.signed and value >> (field.width - 1):
        value -= 1 << field.width
    return value


def encode(name: str, **operands: int) -> int:
    """Encode an instruction from its mnemonic and operand values.

    Raises :class:`ValueError` when an operand is missing, unknown or out of
    range (the assembler reports these with file and line).
    """
    ins = BY_NAME[name]
    word = ins.opcode << OPCODE_SHIFT
    expected = {f.name for f in ins.format.fields}
    unknown = set(operands) - expected
    if unknown:
        raise ValueError(f"{name} has no operand {sorted(unknown)[0]!r}")
    for f in ins.format.fields:
        if f.name not in operands:
            raise ValueError(f"{name} needs operand {f.name!r}")
        value = operands[f.name]
        if not f.min <= value <= f.max:
            raise ValueError(f"{f.name} of {name} must be in {f.min}..{f.max}, not {value}")
        word |= (value & ((1 << f.width) - 1)) << f.lo
    return word


def decode(word: int) -> tuple[Instr, dict[str, int]]:
    """Decode an instruction word into its :class:`Instr` and operand values.

    Raises :class:`ValueError` for an unknown opcode.
    """
    opcode = (word >> OPCODE_SHIFT) & ((1 << OPCODE_BITS) - 1)
    ins = BY_OPCODE.get(opcode)
    if ins is None:
        raise ValueError(f"unknown opcode {opcode} in instruction word {word:#010x}")
    return ins, {f.name: field_value(word, f) for f in ins.format.fields}
