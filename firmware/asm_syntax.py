"""The syntax of the PE assembly language: names, expressions and operands.

The lexical and expression layer of :mod:`wse.firmware.asm` (the language is
described there): register and descriptor names, integer expressions parsed
into a small tree and evaluated against the assembler's names, ``.float``
literals, and each instruction format's operand slots, generated from
:data:`wse.firmware.isa.FORMATS`. Errors are :class:`StatementError`, which
the assembler reports with the file and line.
"""

from __future__ import annotations

import dataclasses
import re

from wse.numerics import CANONICAL_NAN, f2b

from . import isa

__all__ = ["StatementError", "NAME_RE", "REGS", "DSDS", "is_reserved", "parse_expr", "evaluate", "float_bits",
           "Slot", "SLOTS", "KIND_TEXT", "split_operands", "plural"]

#: A label or constant name.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: Register names and descriptor register names, with their numbers.
REGS = {f"r{i}": i for i in range(16)} | {"zero": 0}
DSDS = {f"d{i}": i for i in range(8)}


class StatementError(Exception):
    """An error in one statement; the assembler adds the file and line."""


def is_reserved(name: str) -> bool:
    """Whether ``name`` is a register name (any case), which labels and constants may not use."""
    return name.lower() in REGS or name.lower() in DSDS


# Expressions ------------------------------------------------------------------

_TOKEN_RE = re.compile(r"\s*(?:(?P<num>[0-9][0-9.]*[eE][-+][0-9]+|[0-9][0-9A-Za-z_.]*)|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                       r"|(?P<op><<|>>|[-+*/%&|^~()]))")
_INT_RE = re.compile(r"0[xX][0-9A-Fa-f]+|0[bB][01]+|[0-9]+")
_FLOAT_RE = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
_BINARY = {"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5, "*": 6, "/": 6, "%": 6}


def _tokenize(text: str) -> list[tuple[str, object]]:
    tokens, pos, text = [], 0, text.rstrip()
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if not match or match.end() == pos:
            bad = text[pos:].strip()[:1] or text[pos:pos + 1]
            if bad == ".":
                raise StatementError(f"floating-point literal in {text.strip()!r}: only .float takes them")
            raise StatementError(f"bad expression {text.strip()!r}: unexpected {bad!r}")
        pos = match.end()
        if match.group("num"):
            lit = match.group("num")
            if _INT_RE.fullmatch(lit):
                tokens.append(("num", int(lit, 0) if lit[:2].lower() in ("0x", "0b") else int(lit, 10)))
            elif _FLOAT_RE.fullmatch(lit):
                raise StatementError(f"floating-point literal {lit!r} in an expression: only .float takes them")
            else:
                raise StatementError(f"bad number {lit!r}: expected decimal, 0x hex or 0b binary digits")
        elif match.group("name"):
            tokens.append(("name", match.group("name")))
        else:
            tokens.append(("op", match.group("op")))
    return tokens


def parse_expr(text: str):
    """Parse an expression into a tree of tuples (the form :func:`evaluate` takes)."""
    tokens = _tokenize(text)
    if not tokens:
        raise StatementError("missing value: expected an expression")
    pos = 0

    def peek():
        return tokens[pos] if pos < len(tokens) else ("end", None)

    def unary():
        nonlocal pos
        kind, value = peek()
        pos += 1
        if kind == "num":
            return ("num", value)
        if kind == "name":
            return ("name", value)
        if value in ("-", "+", "~"):
            return ("un", value, unary())
        if value == "(":
            node = binary(0)
            if peek() != ("op", ")"):
                raise StatementError(f"bad expression {text.strip()!r}: missing ')'")
            pos += 1
            return node
        what = "the end" if kind == "end" else repr(value)
        raise StatementError(f"bad expression {text.strip()!r}: expected a number, name or '(' before {what}")

    def binary(min_prec):
        nonlocal pos
        left = unary()
        while True:
            kind, op = peek()
            prec = _BINARY.get(op) if kind == "op" else None
            if prec is None or prec <= min_prec:
                return left
            pos += 1
            left = ("bin", op, left, binary(prec))

    node = binary(0)
    if pos != len(tokens):
        raise StatementError(f"bad expression {text.strip()!r}: unexpected {peek()[1]!r}")
    return node


def evaluate(node, lookup) -> int:
    """The value of a parsed expression; ``lookup(name)`` gives a name's value."""
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "name":
        return lookup(node[1])
    if kind == "un":
        value = evaluate(node[2], lookup)
        return {"-": -value, "+": value, "~": ~value}[node[1]]
    op, a, b = node[1], evaluate(node[2], lookup), evaluate(node[3], lookup)
    if op in ("/", "%"):
        if b == 0:
            raise StatementError("division by zero in expression")
        quotient = abs(a) // abs(b) * (1 if (a < 0) == (b < 0) else -1)
        return quotient if op == "/" else a - b * quotient
    if op in ("<<", ">>"):
        if not 0 <= b <= 64:
            raise StatementError(f"shift count {b} out of range 0..64")
        return a << b if op == "<<" else a >> b
    return {"+": a + b, "-": a - b, "*": a * b, "&": a & b, "|": a | b, "^": a ^ b}[op]


def float_bits(text: str) -> int:
    """The binary32 bits of a ``.float`` literal (NaN as the canonical NaN)."""
    lit = text.strip().lower()
    if lit.lstrip("+-") in ("inf", "infinity", "nan") or _FLOAT_RE.fullmatch(lit):
        value = float(lit)
        return CANONICAL_NAN if value != value else f2b(value)
    raise StatementError(f"bad .float value {text.strip()!r}: expected a decimal number such as 1.5 or -2e-3, "
                         "inf, -inf or nan")


# Operand syntax, generated from isa.FORMATS ----------------------------------------

@dataclasses.dataclass(frozen=True)
class Slot:
    """One comma-separated operand: a field, or ``imm(ra)`` (two fields)."""
    text: str
    fields: tuple[isa.Field, ...]


def _slots(fmt: isa.Format) -> tuple[Slot, ...]:
    if not fmt.syntax:
        return ()
    slots = []
    for piece in fmt.syntax.split(", "):
        one = re.fullmatch(r"\{(\w+)\}", piece)
        mem = re.fullmatch(r"\{(\w+)\}\(\{(\w+)\}\)", piece)
        if one:
            slots.append(Slot(one.group(1), (fmt.field(one.group(1)),)))
        elif mem:
            slots.append(Slot(f"{mem.group(1)}({mem.group(2)})", (fmt.field(mem.group(1)), fmt.field(mem.group(2)))))
        else:  # a new kind of syntax in the ISA table needs support here
            raise AssertionError(f"format {fmt.name}: unsupported operand syntax {piece!r}")
    assert sorted(f.name for s in slots for f in s.fields) == sorted(f.name for f in fmt.fields), fmt
    return tuple(slots)


#: The operand slots of each instruction format, by format name.
SLOTS = {name: _slots(fmt) for name, fmt in isa.FORMATS.items()}
#: What an operand of each field kind must be, for error messages.
KIND_TEXT = {"reg": "a register r0..r15", "dsd": "a descriptor register d0..d7", "imm": "an immediate expression",
             "target": "an instruction address or .text label", "color": "a color number", "task": "a task number"}


def split_operands(text: str) -> list[str]:
    """The comma-separated operands of a statement (commas inside parentheses do not split)."""
    if not text.strip():
        return []
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def plural(n: int, word: str) -> str:
    """``"1 operand"``, ``"2 operands"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"
