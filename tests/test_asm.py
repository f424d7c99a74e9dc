"""Assembler, disassembler, program image and the ``wse asm`` / ``wse disasm`` commands."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wse.config import FabricConfig, UsageError
from wse.firmware import isa
from wse.firmware.asm import MAX_ERRORS, AsmError, assemble, assemble_file, disassemble, format_instruction
from wse.firmware.image import Program, Symbol, TaskEntry
from wse.numerics import CANONICAL_NAN, f2b

REPO = Path(__file__).resolve().parents[1]
CFG = FabricConfig()


# A program that uses every instruction of the table ------------------------------

def _pick(field: isa.Field, i: int, cfg: FabricConfig) -> int:
    """A deterministic in-range operand value for field number ``i``."""
    if field.kind == "reg":
        return (3 * i + 1) % 16
    if field.kind == "dsd":
        return (i + 2) % 8
    if field.kind == "color":
        return i % cfg.colors
    if field.kind == "task":
        return (5 * i) % cfg.tasks
    choices = [field.min, field.max, 0, 1] + ([-1] if field.signed else [field.max // 3])
    return choices[i % len(choices)]


def _render(field: isa.Field, value) -> str:
    return {"reg": f"r{value}", "dsd": f"d{value}"}.get(field.kind, str(value))


def every_instruction(cfg: FabricConfig = CFG) -> tuple[str, list[int]]:
    """Source with one line per instruction of ``isa.INSTRUCTIONS`` (targets
    point at labels) and the words ``isa.encode`` gives for them."""
    lines, words, n = ["start:"], [], len(isa.INSTRUCTIONS)
    for i, ins in enumerate(isa.INSTRUCTIONS):
        values, text = {}, {}
        for j, field in enumerate(ins.format.fields):
            if field.kind == "target":
                values[field.name] = (7 * i) % n
                text[field.name] = f"at_{(7 * i) % n}"
            else:
                values[field.name] = _pick(field, i + j, cfg)
                text[field.name] = _render(field, values[field.name])
        lines.append(f"at_{i}: {ins.name} {ins.format.syntax.format(**text)}".rstrip())
        words.append(isa.encode(ins.name, **values))
    return "\n".join(lines) + "\n", words


DIRECTIVES = """
.equ COUNT, 3
.equ BASE, buf + 1          ; forward reference to a data label
.data
buf:    .word 1, -1, 0xffffffff, COUNT * 2, at_3
vals:   .float 1.5, -0.0, inf, -inf, nan, 1e-40, 3.4e38
gap:    .zero COUNT
        .org 0x20
hole:                       ; a label inside a gap between segments
        .org 0x40
desc:   .dsd mem, base=BASE, len=COUNT, stride=-2
        .dsd fabin, color=5, len=7
        .dsd fabout, color=6, len=0x10
tail:
.text
        exit
.task 0, start
.task 1, at_2, blocked
.data_task 3, at_4 blocked
"""


def full_program() -> tuple[str, list[int]]:
    source, words = every_instruction()
    return source + DIRECTIVES, words + [isa.encode("exit")]


def test_every_instruction_encodes_like_the_table():
    source, words = full_program()
    program = assemble(source, "all.s")
    assert program.code.tolist() == words
    assert {isa.decode(w)[0].name for w in program.code.tolist()} == set(isa.BY_NAME)


def test_directives_produce_the_documented_words():
    program = assemble(full_program()[0], "all.s")
    image = program.data_image(CFG.sram_words)
    buf, vals, desc = program.symbol("buf"), program.symbol("vals"), program.symbol("desc")
    assert image[buf:buf + 5].tolist() == [1, 0xFFFFFFFF, 0xFFFFFFFF, 6, 3]
    assert image[vals:vals + 7].tolist() == [0x3FC00000, 0x80000000, 0x7F800000, 0xFF800000, CANONICAL_NAN,
                                              f2b(1e-40), f2b(3.4e38)]
    assert f2b(1e-40) != 0  # a subnormal literal is stored unflushed
    assert program.symbol("gap") == vals + 7 and image[vals + 7:vals + 10].tolist() == [0, 0, 0]
    assert desc == 0x40
    stride = (-2) & 0xFFFF
    assert image[desc:desc + 6].tolist() == [
        (buf + 1) | 3 << 16, int(isa.DsdKind.MEM) | stride << 16,
        5 | 7 << 16, int(isa.DsdKind.FABIN),
        6 | 0x10 << 16, int(isa.DsdKind.FABOUT)]
    assert [(a, w.size) for a, w in program.data] == [(0, 15), (0x40, 6)]
    assert program.symbols["buf"] == Symbol("buf", "data", 0, 5)
    assert program.symbols["gap"].size == 3
    assert program.symbols["hole"] == Symbol("hole", "data", 0x20, 0)
    assert program.symbols["tail"] == Symbol("tail", "data", 0x46, 0)
    assert program.symbols["at_2"] == Symbol("at_2", "text", 2, 0)
    assert program.tasks == [TaskEntry(0, 0, False, False), TaskEntry(1, 2, False, True),
                             TaskEntry(3, 4, True, True)]


def test_disassembly_reassembles_to_the_same_image():
    program = assemble(full_program()[0], "all.s")
    text = disassemble(program)
    again = assemble(text, "again.s")
    assert again.same_image(program)
    data_symbols = {k: v for k, v in program.symbols.items() if v.section == "data"}
    assert {k: v for k, v in again.symbols.items() if v.section == "data"} == data_symbols
    assert all(again.symbols[k] == v for k, v in program.symbols.items())
    assert disassemble(again) == text.replace("; all.s:", "; again.s:")


def test_disassembly_invents_labels_for_unnamed_targets():
    words = [isa.encode("jmp", target=2), isa.encode("nop"), isa.encode("beq", ra=1, rb=0, target=0),
             isa.encode("jmp", target=3), isa.encode("jmp", target=900)]
    program = Program(code=np.array(words, dtype=np.uint32), tasks=[TaskEntry(2, 1, False, False)],
                      symbols={"L_0002": Symbol("L_0002", "data", 9, 0)})
    text = disassemble(program)
    assert "    jmp L_0002_1\n" in text and "L_0002_1:\n" in text  # no clash with the data label
    assert "    beq r1, r0, L_0000\n" in text and "    jmp 900\n" in text
    assert ".task 2, L_0001\n" in text
    assert assemble(text).same_image(program)


def test_format_instruction():
    assert format_instruction(isa.encode("ld", rd=1, ra=2, imm=-4)) == "ld r1, -4(r2)"
    assert format_instruction(isa.encode("lui", rd=3, imm=0x3F80)) == "lui r3, 0x3f80"
    assert format_instruction(isa.encode("jmp", target=5), {5: "loop"}) == "jmp loop"
    assert format_instruction(isa.encode("exit")) == "exit"
    with pytest.raises(ValueError, match="unknown opcode"):
        format_instruction(63 << isa.OPCODE_SHIFT)
    with pytest.raises(ValueError, match="outside its operand fields"):
        format_instruction(isa.encode("nop") | 1)
    with pytest.raises(UsageError, match="code word 1 is not a valid instruction"):
        disassemble(Program(code=np.array([0, 63 << isa.OPCODE_SHIFT], dtype=np.uint32)))


def test_operand_spellings():
    program = assemble("""
        LD R1, 8(ZERO)     ; case-insensitive mnemonic and registers
        ld r1, 8
        ld r1, (r2)
        ld r1, (4 + 4)(r2)
        st r3, -(2 * 4)(r15)
        ldsd D7, 2(r1)
    """)
    assert program.code.tolist() == [
        isa.encode("ld", rd=1, ra=0, imm=8), isa.encode("ld", rd=1, ra=0, imm=8),
        isa.encode("ld", rd=1, ra=2, imm=0), isa.encode("ld", rd=1, ra=2, imm=8),
        isa.encode("st", rs=3, ra=15, imm=-8), isa.encode("ldsd", dd=7, ra=1, imm=2)]


# Expressions ---------------------------------------------------------------------------

@pytest.mark.parametrize("expr, value", [
    ("7 / 2", 3), ("-7 / 2", -3), ("7 / -2", -3), ("-7 % 3", -1), ("7 % -3", 1),
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("1 << 4 | 1", 17), ("0xff & ~0x0f ^ 1", 0xF1),
    ("2 - 3 - 4", -5), ("0b1010 >> 1", 5), ("-(3)", -3), ("--3", 3), ("6 | 1 & 2", 6),
    ("later - 1", 3), ("K * 2", 8), ("16 % 5 + 100 / 10", 11),
])
def test_expression_values(expr, value):
    source = f".equ K, later\nli r1, {expr}\nnop\nnop\nnop\nlater: nop\n"
    assert isa.decode(int(assemble(source).code[0]))[1]["imm"] == value


def test_defines_set_and_override_constants():
    source = ".equ N, 5\n.equ M, N + 1\nli r1, M\nli r2, W\n"
    program = assemble(source, defines={"N": 40, "W": -3})
    assert [isa.decode(int(w))[1]["imm"] for w in program.code] == [41, -3]
    with pytest.raises(UsageError, match="define 'N' must be an integer"):
        assemble(source, defines={"N": "40"})
    with pytest.raises(UsageError, match="define name 'r1'"):
        assemble(source, defines={"r1": 1})


def test_config_limits_apply():
    small = FabricConfig(colors=4, tasks=8, imem_words=16, sram_words=16)
    with pytest.raises(AsmError) as info:
        assemble("send r1, 4\nactivate 8\njmp 16\n.data_task 4, x\nx: nop\n.data\n.zero 17\n", "c.s", config=small)
    assert str(info.value).splitlines() == [
        "c.s:1: color 4 out of range 0..3 for color of send",
        "c.s:2: task 8 out of range 0..7 for task of activate",
        "c.s:3: target 16 out of range 0..15 for target of jmp",
        "c.s:4: color 4 out of range 0..3 for .data_task",
        "c.s:7: program needs data words up to address 16 but sram_words is 16",
    ]
    with small:  # the context-manager default is used when config is None
        with pytest.raises(AsmError, match="c.s:17: program needs 20 instruction words but imem_words is 16"):
            assemble("nop\n" * 20, "c.s")


# Errors ---------------------------------------------------------------------------------

ERRORS = [
    ("nop\nfmadd r1, r2, r3\n", 2, "unknown mnemonic 'fmadd'"),
    ("add r16, r1, r2\n", 1, "bad operand 'r16' for rd of add: expected a register r0..r15"),
    ("fadd d1, d8, d2\n", 1, "bad operand 'd8' for da of fadd: expected a descriptor register d0..d7"),
    ("addi r1, r2, 300000\n", 1, "immediate 300000 out of range -131072..131071 for imm of addi"),
    ("andi r1, r2, -1\n", 1, "immediate -1 out of range 0..262143 for imm of andi"),
    ("addi r1, r2, r3\n", 1, "bad operand 'r3' for imm of addi: expected an immediate expression, not a register"),
    ("nop\njmp loop\n", 2, "undefined label 'loop'"),
    ("x: nop\nnop\nx: nop\n", 3, "duplicate label 'x' (first defined at line 1)"),
    ("add r1, r2\n", 1, "add takes 3 operands (rd, ra, rb), got 2"),
    ("ld r1\n", 1, "ld takes 2 operands (rd, imm(ra)), got 1"),
    ("exit 3\n", 1, "exit takes no operands, got 1"),
    ("ld r1, 4(x)\n", 1, "bad operand 'x' for ra of ld: expected a register r0..r15"),
    ("jmp buf\n.data\nbuf: .word 0\n", 1, "target of jmp is 'buf', a .data label; expected a .text label"),
    (".word 1\n", 1, ".word is only allowed in .data (the current section is .text)"),
    (".zero 1\n", 1, ".zero is only allowed in .data"),
    (".data\nnop\n", 2, "instruction 'nop' in .data: instructions belong in .text"),
    (".fill 3\n", 1, "unknown directive '.fill'; expected one of .text, .data"),
    (".data\n.word 4294967296\n", 2, ".word value 4294967296 out of range -2147483648..4294967295"),
    (".data\n.word -2147483649\n", 2, ".word value -2147483649 out of range"),
    (".data\n.word\n", 2, ".word needs at least one value"),
    (".data\n.float 1.0, 0x10\n", 2, "bad .float value '0x10': expected a decimal number"),
    ("li r1, 1.5\n", 1, "floating-point literal '1.5' in an expression: only .float takes them"),
    ("li r1, 2 +\n", 1, "bad expression '2 +': expected a number, name or '(' before the end"),
    ("li r1, (2\n", 1, "bad expression '(2': missing ')'"),
    ("li r1, 5 / (2 - 2)\n", 1, "division by zero in expression"),
    ("li r1, 0x\n", 1, "bad number '0x'"),
    (".data\n.word 1, 2\n.org 1\n", 3, ".org 1 would move the data location backwards from 2"),
    (".data\n.org 9000\n", 2, ".org 9000 is beyond the data memory: sram_words is 8192"),
    (".data\n.zero N\nN: .word 1\n", 2, "label 'N' is defined later in the file; .org and .zero need values"),
    (".data\n.zero -2\n", 2, ".zero -2: the word count must not be negative"),
    (".data\n.dsd mem, base=70000, len=1\n", 2, "base 70000 out of range 0..65535 for .dsd"),
    (".data\n.dsd mem, base=0, len=70000\n", 2, "len 70000 out of range 0..65535 for .dsd"),
    (".data\n.dsd mem, base=0, len=1, stride=40000\n", 2, "stride 40000 out of range -32768..32767 for .dsd"),
    (".data\n.dsd fabin, color=16, len=1\n", 2, "color 16 out of range 0..15 for .dsd"),
    (".data\n.dsd fabout, color=1, len=1, stride=2\n", 2, ".dsd fabout takes color, len, not 'stride'"),
    (".data\n.dsd mem, len=1\n", 2, ".dsd mem needs base"),
    (".data\n.dsd mem, base=1, base=2, len=1\n", 2, ".dsd field 'base' is given twice"),
    (".data\n.dsd ram, base=1\n", 2, "unknown .dsd kind 'ram'; expected mem, fabin or fabout"),
    (".data\n.dsd mem, base 1\n", 2, "bad .dsd field 'base 1': expected key=value"),
    (".task 32, x\nx: nop\n", 1, "task 32 out of range 0..31 for .task"),
    (".data_task 16, x\nx: nop\n", 1, "color 16 out of range 0..15 for .data_task"),
    (".task 1, x\n.data_task 1, x\nx: nop\n", 2, "task 1 is already defined at line 1"),
    (".task 1, x, soon\nx: nop\n", 1, "the third operand of .task must be 'blocked', not 'soon'"),
    (".data_task 1\nx: nop\n", 1, ".data_task takes COLOR, LABEL and an optional 'blocked', got 1 operand"),
    (".task 1, buf\nnop\n.data\nbuf: .word 0\n", 1, "task entry 'buf' is a .data label; expected a .text label"),
    ("nop\n.task 1, end\nend:\n", 2, "task entry 'end' is address 1, outside the code: the last instruction is at 0"),
    (".equ A, B\n.equ B, A\nli r1, A\n", 1, "constants A -> B -> A depend on each other in a cycle"),
    (".equ A, A + 1\n", 1, "constant 'A' is defined in terms of itself"),
    (".equ A, 1\n.equ A, 2\n", 2, "duplicate constant 'A' (first defined at line 1)"),
    (".equ A, 1\nA: nop\n", 2, "label 'A' has the name of the constant defined at line 1"),
    ("r3: nop\n", 1, "label 'r3' is a register name; choose another name"),
    ("3x: nop\n", 1, "bad label '3x'"),
    (".text 1\n", 1, ".text takes no operands, got 1"),
    ("li r1, 1 << 65\n", 1, "shift count 65 out of range 0..64"),
]


@pytest.mark.parametrize("source, line, message", ERRORS, ids=[e[2][:40] for e in ERRORS])
def test_error_messages(source, line, message):
    with pytest.raises(AsmError) as info:
        assemble(source, "k.s")
    assert isinstance(info.value, UsageError)
    first = info.value.diagnostics[0]
    assert first.startswith(f"k.s:{line}: {message}"), first


def test_errors_are_collected_sorted_and_capped():
    lines = ["nop"] * 30
    for i in range(2, 30, 2):
        lines[i] = f"bogus{i} r1"
    lines[1] = "li r1, undefined_thing"
    with pytest.raises(AsmError) as info:
        assemble("\n".join(lines), "many.s")
    reported = info.value.diagnostics
    assert reported[0] == "many.s:2: undefined label 'undefined_thing'"
    assert reported[1] == "many.s:3: unknown mnemonic 'bogus2'"
    assert len(reported) == 15 and str(info.value) == "\n".join(reported)
    with pytest.raises(AsmError) as info:
        assemble("bad r1\n" * (MAX_ERRORS + 5), "cap.s")
    assert len(info.value.diagnostics) == MAX_ERRORS + 1
    assert info.value.diagnostics[-1] == "cap.s: 5 more errors not shown"


def test_a_broken_constant_is_reported_once():
    with pytest.raises(AsmError) as info:
        assemble(".equ A, missing + 1\nli r1, A\nli r2, A\n", "c.s")
    assert info.value.diagnostics == ["c.s:1: undefined label 'missing'"]


def test_imem_overflow_names_the_first_instruction_past_the_end():
    with pytest.raises(AsmError) as info:
        assemble("nop\n" * 1100, "k.s")
    assert info.value.diagnostics == ["k.s:1025: program needs 1100 instruction words but imem_words is 1024"]


def test_assemble_file(tmp_path):
    path = tmp_path / "k.s"
    path.write_text("main: exit\n.task 0, main\n")
    assert assemble_file(path).source == str(path)
    with pytest.raises(UsageError, match="no such file"):
        assemble_file(tmp_path / "missing.s")


# Program image ----------------------------------------------------------------------

def test_image_save_load_round_trip(tmp_path):
    program = assemble(full_program()[0], "all.s")
    path = tmp_path / "all.bin"
    program.save(path)
    loaded = Program.load(path)
    assert loaded == program and loaded.code.dtype == np.uint32
    assert path.read_bytes()[:4] == b"WSEX"
    assert os.listdir(tmp_path) == ["all.bin"]


def test_image_load_rejects_damaged_files(tmp_path):
    good = assemble("main: exit\n.task 0, main\n.data\nx: .word 7\n").to_bytes()
    cases = {
        "magic.bin": (b"ELF!" + good[4:], "magic.bin is not a waferscale program image (bad magic)"),
        "short.bin": (b"WS", "short.bin is not a waferscale program image (bad magic)"),
        "version.bin": (good[:4] + struct.pack("<I", 9) + good[8:], "version 9 program image; expected version 1"),
        "cut.bin": (good[:-2], "cut.bin has 6 bytes of words but its header describes 2 words (8 bytes)"),
        "json.bin": (good[:12] + b"{" * (len(good) - 20) + good[-8:], "json.bin has a damaged program header"),
    }
    for name, (blob, message) in cases.items():
        (tmp_path / name).write_bytes(blob)
        with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
            Program.load(tmp_path / name)
    with pytest.raises(UsageError, match="nothing.bin: no such file"):
        Program.load(tmp_path / "nothing.bin")


def test_image_save_is_atomic(tmp_path, monkeypatch):
    path = tmp_path / "p.bin"
    Program(code=np.array([1], dtype=np.uint32)).save(path)
    before = path.read_bytes()

    def fail(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        Program(code=np.array([2, 3], dtype=np.uint32)).save(path)
    assert path.read_bytes() == before and os.listdir(tmp_path) == ["p.bin"]


def test_program_queries_and_checks():
    program = Program(code=np.array([0], dtype=np.uint32),
                      data=[(10, np.array([5, 6], dtype=np.uint32)), (0, [1]), (1, [2, 3])],
                      tasks=[TaskEntry(4, 0, True, False), TaskEntry(1, 0, False, False)],
                      symbols={"a": Symbol("a", "data", 10, 2), "b": Symbol("b", "text", 0)})
    assert [(a, w.tolist()) for a, w in program.data] == [(0, [1, 2, 3]), (10, [5, 6])]  # merged, sorted
    assert [t.id for t in program.tasks] == [1, 4]
    assert program.data_words == 5 and program.data_end == 12
    assert program.data_image(16).tolist() == [1, 2, 3] + [0] * 7 + [5, 6] + [0] * 4
    assert program.symbol("a") == 10
    with pytest.raises(UsageError, match="program has no symbol 'c'; it has: a, b"):
        program.symbol("c")
    with pytest.raises(UsageError, match="data up to word 11 but sram_words is 11"):
        program.data_image(11)
    program.check_fits(CFG)
    with pytest.raises(UsageError, match="binds a task to color 4 but colors is 4"):
        program.check_fits(FabricConfig(colors=4, tasks=8))
    with pytest.raises(UsageError, match="data segments overlap"):
        Program(code=[], data=[(0, [1, 2]), (1, [3])])
    with pytest.raises(UsageError, match="task id 2 appears twice"):
        Program(code=[], tasks=[TaskEntry(2, 0, False, False)] * 2)
    with pytest.raises(UsageError, match="32-bit unsigned words"):
        Program(code=[-1])


# Command line -----------------------------------------------------------------------

def _wse(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "wse", *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_cli_assemble_and_disassemble(tmp_path):
    (tmp_path / "k.s").write_text("main: li r1, N\n exit\n.task 0, main\n.data\nx: .word 1, 2\n")
    done = _wse("asm", "k.s", "--define", "N=0x10", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "wrote k.bin: 2 instructions, 2 data words, 1 tasks\n"
    program = Program.load(tmp_path / "k.bin")
    assert program.code.tolist() == [isa.encode("li", rd=1, imm=16), isa.encode("exit")]
    done = _wse("disasm", "k.bin", cwd=tmp_path)
    assert done.returncode == 0 and "    li r1, 16\n" in done.stdout and ".task 0, main" in done.stdout
    assert assemble(done.stdout).same_image(program)


def test_cli_errors_exit_2_without_traceback(tmp_path):
    (tmp_path / "bad.s").write_text("nop\nfmadd r1\nadd r1, r2\n")
    (tmp_path / "junk.bin").write_bytes(b"junk")
    runs = [
        (("asm", "bad.s", "-o", "out.bin"), ["bad.s:2: unknown mnemonic 'fmadd'",
                                             "bad.s:3: add takes 3 operands (rd, ra, rb), got 2"]),
        (("asm", "missing.s"), ["wse asm: missing.s: no such file"]),
        (("asm", "bad.s", "--define", "N=abc"), ["wse asm: --define 'N=abc': VALUE must be an integer"]),
        (("disasm", "junk.bin"), ["wse disasm: junk.bin is not a waferscale program image (bad magic)"]),
    ]
    for args, expected in runs:
        done = _wse(*args, cwd=tmp_path)
        assert done.returncode == 2, args
        assert "Traceback" not in done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == len(expected) and all(a.startswith(b) for a, b in zip(lines, expected)), lines
    assert not (tmp_path / "out.bin").exists()
    assert _wse("asm", cwd=tmp_path).returncode == 2  # argparse usage error


# Random operands ----------------------------------------------------------------------------

BIG = FabricConfig(imem_words=65536, colors=32, tasks=64)


@st.composite
def instruction_words(draw):
    ins = draw(st.sampled_from(isa.INSTRUCTIONS))
    values = {}
    for field in ins.format.fields:
        hi = {"color": BIG.colors - 1, "task": BIG.tasks - 1}.get(field.kind, field.max)
        values[field.name] = draw(st.integers(field.min, min(hi, field.max)))
    return ins, values


@settings(max_examples=300, deadline=None)
@given(st.lists(instruction_words(), min_size=1, max_size=4))
def test_random_operands_round_trip(items):
    words = [isa.encode(ins.name, **values) for ins, values in items]
    for word, (ins, values) in zip(words, items):
        assert isa.decode(word) == (ins, values)
    program = Program(code=np.array(words, dtype=np.uint32))
    text = disassemble(program)
    assert assemble(text, config=BIG).code.tolist() == words
