"""The PE assembler and disassembler, generated from the ISA table.

This module is the assembler (statements, sections, layout, encoding) and the
public API of both; the language's names, expressions and operand syntax are
:mod:`.asm_syntax` and the disassembler is :mod:`.disasm`.

Source language (one statement per line)
----------------------------------------
* Comments run from ``;`` or ``#`` to the end of the line. Mnemonics,
  directives and register names are case-insensitive; labels and constants
  are case-sensitive.
* ``name:`` defines a label at the current location of the current section:
  the instruction address in ``.text`` (the default section), the word address
  in ``.data``. Labels may stand alone or precede an item on the same line;
  several may precede one item.
* ``.equ NAME, expr`` defines a constant. The caller's ``defines`` take
  precedence over a ``.equ`` of the same name, so a source's ``.equ`` is a
  default the host may override.
* Expressions: integers (``12``, ``0x1f``, ``0b101``), constant and label
  names (forward references allowed), unary ``- + ~``, binary
  ``* / % + - << >> & ^ |`` with C precedence (``/`` and ``%`` truncate
  toward zero), parentheses.
* Data (only in ``.data``): ``.word e, ...`` (each in -2**31 .. 2**32-1,
  stored modulo 2**32), ``.float x, ...`` (decimal literals, ``inf``,
  ``-inf``, ``nan``; stored as binary32 bits, NaN as the canonical NaN),
  ``.zero N``, ``.org ADDR`` (forward only), ``.dsd KIND, key=expr, ...``
  (``mem`` with ``base``, ``len``, ``stride=1``; ``fabin`` / ``fabout`` with
  ``color``, ``len``) emitting the two descriptor words of
  ``docs/architecture.md`` section 4.4. ``.zero`` and ``.org`` need values
  known where they stand (constants and earlier labels).
* Tasks (anywhere): ``.task ID, LABEL`` (a local task) and
  ``.data_task COLOR, LABEL`` (task ``COLOR`` bound to that color), each with an
  optional trailing ``blocked``.
* ``.include "FILE"`` (alone on its line; :func:`assemble_file` only): FILE's
  lines in its place (relative to the including file; nested, no cycles).
* Instructions: ``mnemonic operands`` in the syntax of the instruction's
  :class:`~wse.firmware.isa.Format`: registers ``r0 .. r15`` (``zero`` is
  ``r0``), descriptor registers ``d0 .. d7``, expressions for immediates,
  targets, colors and tasks. ``imm(ra)`` also accepts ``imm`` alone
  (``ra = r0``) and ``(ra)`` alone (``imm = 0``).

Every error reads ``FILE:LINE: message``; all errors of a file (up to 20)
are raised together as one :class:`AsmError`.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import re
from pathlib import Path

import numpy as np

from wse.atomic import read_input
from wse.config import FabricConfig, UsageError

from . import isa
from .asm_syntax import (DSDS, KIND_TEXT, NAME_RE, REGS, SLOTS, StatementError, evaluate, float_bits, is_reserved,
                         parse_expr, plural, split_operands)
from .disasm import disassemble, format_instruction
from .image import Program, Symbol, TaskEntry

__all__ = ["AsmError", "assemble", "assemble_file", "disassemble", "format_instruction", "MAX_ERRORS"]

#: How many errors one :class:`AsmError` reports.
MAX_ERRORS = 20

_LABEL_RE = re.compile(r"\s*([^\s:,;#()]+)\s*:")
_DIRECTIVES = (".text", ".data", ".equ", ".word", ".float", ".zero", ".org", ".dsd", ".task", ".data_task")
_DATA_DIRECTIVES = (".word", ".float", ".zero", ".org", ".dsd")


class AsmError(UsageError):
    """Errors in an assembly source: ``str()`` is one ``FILE:LINE: message``
    line per error; :attr:`diagnostics` holds the lines as a list."""

    def __init__(self, diagnostics: list[str]):
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(self.diagnostics))


class _Reported(Exception):
    """A failure already reported elsewhere (a broken constant)."""


# The assembler -------------------------------------------------------------------

@dataclasses.dataclass
class _Stmt:
    line: int
    labels: list[str]
    op: str | None = None        # lower-case mnemonic or directive
    spelled: str = ""            # as written
    operands: list[str] = dataclasses.field(default_factory=list)
    addr: int = 0                # location when laid out
    size: int = 0                # data words emitted


class _Assembler:
    def __init__(self, source: str, filename: str, config: FabricConfig, defines: dict[str, int],
                 origins: list[tuple[str, int]] | None = None):
        self.source, self.filename, self.config = source, filename, config
        self.origins = origins            # (file, line) of each source line, when it spans included files
        self.defines = defines
        self.errors: list[tuple[int, str]] = []
        self.equs: dict[str, tuple[object | None, int]] = {}
        self.equ_values: dict[str, int] = {}
        self.failed_equs: set[str] = set()
        self.resolving: list[str] = []
        self.labels: dict[str, tuple[str, int, int]] = {}   # name -> (section, addr, line)
        self.all_labels: set[str] = set()
        self.layout_done = False

    def error(self, line: int, message: str) -> None:
        self.errors.append((line, message))

    # Names -----------------------------------------------------------------
    def lookup(self, name: str) -> int:
        if name in self.defines:
            return self.defines[name]
        if name in self.labels:
            return self.labels[name][1]
        if name in self.equs:
            return self.equ_value(name)
        if not self.layout_done and name in self.all_labels:
            raise StatementError(f"label {name!r} is defined later in the file; .org and .zero need values known here")
        raise StatementError(f"undefined label {name!r}")

    def equ_value(self, name: str) -> int:
        if name in self.equ_values:
            return self.equ_values[name]
        if name in self.failed_equs:
            raise _Reported()
        if name in self.resolving:
            cycle = self.resolving[self.resolving.index(name):]
            self.failed_equs.update(cycle)
            self.error(self.equs[name][1], f"constant {name!r} is defined in terms of itself" if len(cycle) == 1
                       else f"constants {' -> '.join(cycle + [name])} depend on each other in a cycle")
            raise _Reported()
        node, line = self.equs[name]
        self.resolving.append(name)
        try:
            value = evaluate(node, self.lookup)
        except StatementError as exc:
            if not self.layout_done:
                raise StatementError(f"{exc} (in constant {name!r} at line {line})") from None
            self.failed_equs.add(name)
            self.error(line, str(exc))
            raise _Reported() from None
        except _Reported:
            if self.layout_done:
                self.failed_equs.add(name)
            raise
        finally:
            self.resolving.pop()
        self.equ_values[name] = value
        return value

    def value(self, text: str) -> int:
        return evaluate(parse_expr(text), self.lookup)

    def define_label(self, name: str, section: str, addr: int, line: int) -> None:
        if not NAME_RE.fullmatch(name):
            self.error(line, f"bad label {name!r}: expected letters, digits and '_', not starting with a digit")
        elif is_reserved(name):
            self.error(line, f"label {name!r} is a register name; choose another name")
        elif name in self.labels:
            self.error(line, f"duplicate label {name!r} (first defined at line {self.labels[name][2]})")
        elif name in self.defines:
            self.error(line, f"label {name!r} has the name of a constant set by the caller's defines")
        elif name in self.equs:
            self.error(line, f"label {name!r} has the name of the constant defined at line {self.equs[name][1]}")
        else:
            self.labels[name] = (section, addr, line)

    # Pass 0: statements and constants ---------------------------------------------
    def parse(self) -> list[_Stmt]:
        stmts = []
        for number, raw in enumerate(self.source.splitlines(), start=1):
            text = re.split(r"[;#]", raw, maxsplit=1)[0]
            labels = []
            while (match := _LABEL_RE.match(text)):
                labels.append(match.group(1))
                text = text[match.end():]
            stmt = _Stmt(number, labels)
            text = text.strip()
            if text:
                head, rest = re.match(r"(\S+)\s*(.*)", text).groups()
                stmt.spelled, stmt.op = head, head.lower()
                stmt.operands = split_operands(rest)
            stmts.append(stmt)
            self.all_labels.update(labels)
        for stmt in stmts:
            if stmt.op == ".equ":
                self.collect_equ(stmt)
        return stmts

    def collect_equ(self, stmt: _Stmt) -> None:
        if len(stmt.operands) != 2:
            self.error(stmt.line, f".equ takes 2 operands (NAME, expr), got {len(stmt.operands)}")
            return
        name, expr = stmt.operands
        if not NAME_RE.fullmatch(name):
            self.error(stmt.line, f"bad constant name {name!r}: expected letters, digits and '_', not starting with a digit")
        elif is_reserved(name):
            self.error(stmt.line, f"constant {name!r} is a register name; choose another name")
        elif name in self.equs:
            self.error(stmt.line, f"duplicate constant {name!r} (first defined at line {self.equs[name][1]})")
        elif name not in self.defines:
            try:
                self.equs[name] = (parse_expr(expr), stmt.line)
            except StatementError as exc:
                self.equs[name] = (None, stmt.line)
                self.failed_equs.add(name)
                self.error(stmt.line, str(exc))
        else:
            self.equs[name] = (None, stmt.line)  # overridden by defines; kept for duplicate checks

    # Pass 1: addresses ------------------------------------------------------------
    def layout(self, stmts: list[_Stmt]) -> tuple[list[_Stmt], list[_Stmt], list[_Stmt]]:
        section, pc, lc = "text", 0, 0
        code, data, tasks = [], [], []
        sram = self.config.sram_words
        data_overflow = False
        for stmt in stmts:
            for name in stmt.labels:
                self.define_label(name, section, pc if section == "text" else lc, stmt.line)
            op = stmt.op
            if op is None or op == ".equ":
                continue
            try:
                if not op.startswith("."):
                    if section != "text":
                        raise StatementError(f"instruction {stmt.spelled!r} in .data: instructions belong in .text")
                    stmt.addr = pc
                    pc += 1
                    code.append(stmt)
                elif op in (".text", ".data"):
                    if stmt.operands:
                        raise StatementError(f"{op} takes no operands, got {len(stmt.operands)}")
                    section = op[1:]
                elif op in (".task", ".data_task"):
                    tasks.append(stmt)
                elif op == ".include":
                    raise StatementError('.include needs a source file (assemble_file) and the form .include "FILE"')
                elif op in _DATA_DIRECTIVES:
                    if section != "data":
                        raise StatementError(f"{op} is only allowed in .data (the current section is .text)")
                    stmt.addr = lc
                    if op == ".org":
                        lc = self.org(stmt, lc)
                        continue
                    stmt.size = self.data_size(stmt)
                    if stmt.addr + stmt.size > sram:
                        if data_overflow:
                            continue
                        data_overflow = True
                        raise StatementError(f"program needs data words up to address {stmt.addr + stmt.size - 1} "
                                     f"but sram_words is {sram}")
                    lc += stmt.size
                    data.append(stmt)
                else:
                    raise StatementError(self.unknown(stmt.spelled, _DIRECTIVES, "directive"))
            except StatementError as exc:
                self.error(stmt.line, str(exc))
            except _Reported:
                pass
        if pc > self.config.imem_words:
            self.error(code[self.config.imem_words].line,
                       f"program needs {pc} instruction words but imem_words is {self.config.imem_words}")
        self.layout_done = True
        return code, data, tasks

    def org(self, stmt: _Stmt, lc: int) -> int:
        if len(stmt.operands) != 1:
            raise StatementError(f".org takes 1 operand (ADDR), got {len(stmt.operands)}")
        addr = self.value(stmt.operands[0])
        if addr < lc:
            raise StatementError(f".org {addr} would move the data location backwards from {lc}; "
                                 ".org only moves forward")
        if addr > self.config.sram_words:
            raise StatementError(f".org {addr} is beyond the data memory: sram_words is {self.config.sram_words}")
        return addr

    def data_size(self, stmt: _Stmt) -> int:
        op, n = stmt.op, len(stmt.operands)
        if op in (".word", ".float"):
            if n == 0:
                raise StatementError(f"{op} needs at least one value")
            return n
        if op == ".dsd":
            return 2
        if n != 1:
            raise StatementError(f".zero takes 1 operand (N), got {n}")
        count = self.value(stmt.operands[0])
        if count < 0:
            raise StatementError(f".zero {count}: the word count must not be negative")
        return count

    @staticmethod
    def unknown(spelled: str, known, what: str) -> str:
        close = difflib.get_close_matches(spelled.lower(), known, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        if what == "directive":
            hint = f"; expected one of {', '.join(known)}"
        return f"unknown {what} {spelled!r}{hint}"

    # Pass 2: values ----------------------------------------------------------------
    @staticmethod
    def check_range(value: int, lo: int, hi: int, noun: str, where: str) -> int:
        if not lo <= value <= hi:
            raise StatementError(f"{noun} {value} out of range {lo}..{hi} for {where}")
        return value

    def operand(self, text: str, field: isa.Field, mnemonic: str) -> int:
        kind, where = field.kind, f"{field.name} of {mnemonic}"
        if not text:
            raise StatementError(f"missing operand for {where}: expected {KIND_TEXT[kind]}")
        if kind in ("reg", "dsd"):
            table = REGS if kind == "reg" else DSDS
            if text.lower() not in table:
                raise StatementError(f"bad operand {text!r} for {where}: expected {KIND_TEXT[kind]}")
            return table[text.lower()]
        if is_reserved(text):
            raise StatementError(f"bad operand {text!r} for {where}: expected {KIND_TEXT[kind]}, not a register")
        value = self.value(text)
        cfg = self.config
        if kind == "imm":
            return self.check_range(value, field.min, field.max, "immediate", where)
        if kind == "target":
            if text in self.labels and self.labels[text][0] == "data":
                raise StatementError(f"{where} is {text!r}, a .data label; expected a .text label")
            return self.check_range(value, 0, min(field.max, cfg.imem_words - 1), "target", where)
        if kind == "color":
            return self.check_range(value, 0, min(field.max, cfg.colors - 1), "color", where)
        return self.check_range(value, 0, min(field.max, cfg.tasks - 1), "task", where)

    def encode(self, stmt: _Stmt) -> int:
        ins = isa.BY_NAME.get(stmt.op)
        if ins is None:
            raise StatementError(self.unknown(stmt.spelled, list(isa.BY_NAME), "mnemonic"))
        slots = SLOTS[ins.fmt]
        if len(stmt.operands) != len(slots):
            wanted = (f"takes {plural(len(slots), 'operand')} ({', '.join(s.text for s in slots)})"
                      if slots else "takes no operands")
            raise StatementError(f"{ins.name} {wanted}, got {len(stmt.operands)}")
        values = {}
        for slot, text in zip(slots, stmt.operands):
            if len(slot.fields) == 1:
                values[slot.fields[0].name] = self.operand(text, slot.fields[0], ins.name)
                continue
            imm_field, reg_field = slot.fields
            imm_text, reg_text = text, "r0"
            match = re.fullmatch(r"(.*)\(\s*([^()]*?)\s*\)", text)
            if match and (match.group(2).lower() in REGS
                          or (match.group(1).strip() and not re.search(r"[-+*/%&|^~(<>]\s*$", match.group(1)))):
                imm_text, reg_text = match.group(1).strip() or "0", match.group(2)
            values[reg_field.name] = self.operand(reg_text, reg_field, ins.name)
            values[imm_field.name] = self.operand(imm_text, imm_field, ins.name)
        try:
            return isa.encode(ins.name, **values)
        except ValueError as exc:  # the checks above should make this unreachable
            raise StatementError(str(exc)) from None

    def data_words(self, stmt: _Stmt) -> list[int]:
        op = stmt.op
        if op == ".zero":
            return [0] * stmt.size
        if op == ".float":
            return [float_bits(text) for text in stmt.operands]
        if op == ".word":
            words = []
            for text in stmt.operands:
                value = self.value(text)
                if not -(1 << 31) <= value <= (1 << 32) - 1:
                    raise StatementError(f".word value {value} out of range {-(1 << 31)}..{(1 << 32) - 1}")
                words.append(value & 0xFFFFFFFF)
            return words
        return self.dsd(stmt)

    def dsd(self, stmt: _Stmt) -> list[int]:
        if not stmt.operands or not stmt.operands[0]:
            raise StatementError(".dsd needs a kind first: mem, fabin or fabout")
        kind_text = stmt.operands[0].lower()
        keys = {"mem": ("base", "len", "stride"), "fabin": ("color", "len"), "fabout": ("color", "len")}
        if kind_text not in keys:
            hint = " followed by ', key=value' fields" if "=" in kind_text else ""
            raise StatementError(f"unknown .dsd kind {stmt.operands[0]!r}; expected mem, fabin or fabout{hint}")
        kind = {"mem": isa.DsdKind.MEM, "fabin": isa.DsdKind.FABIN, "fabout": isa.DsdKind.FABOUT}[kind_text]
        given: dict[str, int] = {}
        for item in stmt.operands[1:]:
            key, eq, expr = item.partition("=")
            key = key.strip().lower()
            if not eq:
                raise StatementError(f"bad .dsd field {item!r}: expected key=value")
            if key not in keys[kind_text]:
                raise StatementError(f".dsd {kind_text} takes {', '.join(keys[kind_text])}, not {key!r}")
            if key in given:
                raise StatementError(f".dsd field {key!r} is given twice")
            given[key] = self.value(expr)
        required = ("base", "len") if kind_text == "mem" else ("color", "len")
        missing = [k for k in required if k not in given]
        if missing:
            raise StatementError(f".dsd {kind_text} needs {' and '.join(missing)}")
        if kind_text == "mem":
            base = self.check_range(given["base"], 0, 0xFFFF, "base", ".dsd")
            stride = self.check_range(given.get("stride", 1), -(1 << 15), (1 << 15) - 1, "stride", ".dsd")
        else:
            base = self.check_range(given["color"], 0, self.config.colors - 1, "color", ".dsd")
            stride = 0
        length = self.check_range(given["len"], 0, 0xFFFF, "len", ".dsd")
        return [base | length << 16, int(kind) | (stride & 0xFFFF) << 16]

    def task(self, stmt: _Stmt, code_size: int) -> TaskEntry:
        ops, blocked = list(stmt.operands), False
        if len(ops) == 3 and ops[2].lower() == "blocked":
            ops, blocked = ops[:2], True
        elif len(ops) == 2:
            words = ops[1].split()
            if len(words) == 2 and words[1].lower() == "blocked":
                ops[1], blocked = words[0], True
        name = "COLOR" if stmt.op == ".data_task" else "ID"
        if len(ops) == 3:
            raise StatementError(f"the third operand of {stmt.op} must be 'blocked', not {ops[2]!r}")
        if len(ops) != 2 or not all(ops):
            raise StatementError(f"{stmt.op} takes {name}, LABEL and an optional 'blocked', "
                                 f"got {plural(len(ops), 'operand')}")
        ident = self.value(ops[0])
        if stmt.op == ".data_task":
            self.check_range(ident, 0, self.config.colors - 1, "color", ".data_task")
        else:
            self.check_range(ident, 0, self.config.tasks - 1, "task", ".task")
        if ops[1] in self.labels and self.labels[ops[1]][0] == "data":
            raise StatementError(f"task entry {ops[1]!r} is a .data label; expected a .text label")
        entry = self.value(ops[1])
        if not 0 <= entry < code_size:
            last = f"the last instruction is at {code_size - 1}" if code_size else "the program has no instructions"
            raise StatementError(f"task entry {ops[1]!r} is address {entry}, outside the code: {last}")
        return TaskEntry(ident, entry, stmt.op == ".data_task", blocked)

    # Whole file ------------------------------------------------------------------------
    def run(self) -> Program:
        stmts = self.parse()
        code_stmts, data_stmts, task_stmts = self.layout(stmts)
        for name in self.equs:
            if self.equs[name][0] is not None:
                try:
                    self.equ_value(name)
                except (StatementError, _Reported):
                    pass
        code = []
        for stmt in code_stmts:
            code.append(self.attempt(stmt, self.encode, 0))
        segments: list[tuple[int, list[int]]] = []
        for stmt in data_stmts:
            words = self.attempt(stmt, self.data_words, [0] * stmt.size)
            if segments and segments[-1][0] + len(segments[-1][1]) == stmt.addr:
                segments[-1][1].extend(words)
            elif words:
                segments.append((stmt.addr, list(words)))
        tasks, seen = [], {}
        for stmt in task_stmts:
            entry = self.attempt(stmt, lambda s: self.task(s, len(code)), None)
            if entry is None:
                continue
            if entry.id in seen:
                self.error(stmt.line, f"task {entry.id} is already defined at line {seen[entry.id]}")
                continue
            seen[entry.id] = stmt.line
            tasks.append(entry)
        if self.errors:
            self.raise_errors()
        return Program(code=np.array(code, dtype=np.uint32),
                       data=[(addr, np.array(words, dtype=np.uint32)) for addr, words in segments],
                       tasks=tasks, symbols=self.symbols(segments), source=self.filename)

    def attempt(self, stmt: _Stmt, func, fallback):
        try:
            return func(stmt)
        except StatementError as exc:
            self.error(stmt.line, str(exc))
        except _Reported:
            pass
        return fallback

    def symbols(self, segments) -> dict[str, Symbol]:
        data_addrs = sorted({addr for section, addr, _ in self.labels.values() if section == "data"})
        result = {}
        for name, (section, addr, _) in self.labels.items():
            size = 0
            if section == "data":
                for start, words in segments:
                    if start <= addr < start + len(words):
                        later = [a for a in data_addrs if a > addr]
                        size = min([start + len(words)] + later) - addr
                        break
            result[name] = Symbol(name, section, addr, size)
        return result

    def where(self, line: int) -> tuple[str, int]:
        """The file and line a source line came from (``.include``)."""
        return self.origins[line - 1] if self.origins and 0 < line <= len(self.origins) else (self.filename, line)

    def located(self, line: int, message: str) -> str:
        name, local = self.where(line)

        def ref(match):                   # a line the message names: FILE:LINE when in another file
            other, at = self.where(int(match[1]))
            return f"line {at}" if other == name else f"{other}:{at}"
        return f"{name}:{local}: " + (re.sub(r"\bline (\d+)", ref, message) if self.origins else message)

    def raise_errors(self):
        ordered = sorted(dict.fromkeys(self.errors), key=lambda e: e[0])
        lines = [self.located(line, message) for line, message in ordered[:MAX_ERRORS]]
        if len(ordered) > MAX_ERRORS:
            lines.append(f"{self.filename}: {len(ordered) - MAX_ERRORS} more errors not shown")
        raise AsmError(lines)


def _check_defines(defines) -> dict[str, int]:
    checked = {}
    for name, value in (defines or {}).items():
        if not isinstance(name, str) or not NAME_RE.fullmatch(name) or is_reserved(name):
            raise UsageError(f"define name {name!r} must be a name of letters, digits and '_' (not a register)")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise UsageError(f"define {name!r} must be an integer, not {value!r}")
        checked[name] = int(value)
    return checked


def assemble(source: str, filename: str = "<string>", config: FabricConfig | None = None,
             defines: dict[str, int] | None = None) -> Program:
    """Assemble PE source text into a :class:`~wse.firmware.image.Program`.

    Parameters
    ----------
    source:
        The assembly text (language in the module docstring).
    filename:
        Name used in error messages and stored as ``Program.source``.
    config:
        Fabric sizes to check against (imem_words, sram_words, colors, tasks);
        default :meth:`FabricConfig.current`.
    defines:
        Constants set before assembly, as if by ``.equ``; they override a
        ``.equ`` of the same name in the source.

    Raises
    ------
    AsmError
        With every error found (up to :data:`MAX_ERRORS`), one
        ``FILE:LINE: message`` line each.
    UsageError
        If a define is not a name with an integer value.
    """
    config = FabricConfig.current() if config is None else config
    return _Assembler(source, filename, config, _check_defines(defines)).run()


_INCLUDE_RE = re.compile(r'\s*\.include\s+"([^"]+)"\s*(?:[;#].*)?$', re.IGNORECASE)


def _read_source(path: Path, within: tuple[Path, ...] = (), at: str = "") -> tuple[list[str], list[tuple[str, int]]]:
    """The lines of ``path`` with its ``.include`` lines replaced by the included files' lines,
    and the ``(file, line)`` each came from; ``at``: where ``path`` was included."""
    if path.resolve() in within:
        raise AsmError([f"{at}: .include of {path} includes itself (through {' -> '.join(map(str, within))})"])
    try:
        text = read_input(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    except UsageError as exc:
        if at:
            raise AsmError([f"{at}: .include: {exc}"]) from None
        raise
    lines, origins = [], []
    for number, raw in enumerate(text.splitlines(), start=1):
        match = _INCLUDE_RE.match(raw)
        if match:
            more, where = _read_source(path.parent / match.group(1), within + (path.resolve(),), f"{path}:{number}")
            lines, origins = lines + more, origins + where
        else:
            lines.append(raw)
            origins.append((str(path), number))
    return lines, origins


def assemble_file(path, config: FabricConfig | None = None, defines: dict[str, int] | None = None) -> Program:
    """Assemble the file at ``path`` (see :func:`assemble`), its ``.include "FILE"`` lines
    replaced by those files (relative to the including file's folder, nested; a cycle is an
    :class:`AsmError`); errors name the file and line of each statement. A missing or
    unreadable file raises :class:`~wse.config.UsageError`."""
    path = Path(path)
    lines, origins = _read_source(path)
    config = FabricConfig.current() if config is None else config
    return _Assembler("\n".join(lines), str(path), config, _check_defines(defines),
                      origins if any(name != str(path) for name, _ in origins) else None).run()
