"""The PE disassembler: program images back to assembly text.

:func:`disassemble` writes source that :func:`wse.firmware.asm.assemble`
turns back into the same code, data and task table; :func:`format_instruction`
writes one instruction word. Both are generated from the ISA table
(:mod:`wse.firmware.isa`) and are also exported by :mod:`wse.firmware.asm`.
"""

from __future__ import annotations

from wse.config import UsageError

from . import isa
from .asm_syntax import NAME_RE, is_reserved
from .image import Program

__all__ = ["disassemble", "format_instruction"]


def format_instruction(word: int, labels: dict[int, str] | None = None) -> str:
    """One instruction word as assembly text, such as ``"ld r1, -4(r2)"``.

    Branch and jump targets found in ``labels`` (address -> name) are printed
    as the name, others as numbers.

    Raises
    ------
    ValueError
        If the word has an unknown opcode or bits set outside its fields.
    """
    word = int(word)
    ins, values = isa.decode(word)
    if isa.encode(ins.name, **values) != word:
        raise ValueError(f"instruction word {word:#010x} ({ins.name}) has bits set outside its operand fields")
    text = {}
    for field in ins.format.fields:
        value = values[field.name]
        if field.kind == "reg":
            text[field.name] = f"r{value}"
        elif field.kind == "dsd":
            text[field.name] = f"d{value}"
        elif field.kind == "target" and labels and value in labels:
            text[field.name] = labels[value]
        elif field.kind == "imm" and not field.signed and value > 255:
            text[field.name] = hex(value)
        else:
            text[field.name] = str(value)
    operands = ins.format.syntax.format(**text)
    return f"{ins.name} {operands}" if operands else ins.name


def _unique(name: str, taken: set[str]) -> str:
    candidate, n = name, 1
    while candidate in taken:
        candidate, n = f"{name}_{n}", n + 1
    taken.add(candidate)
    return candidate


def _usable(name: str) -> bool:
    return bool(NAME_RE.fullmatch(name)) and not is_reserved(name)


def disassemble(program: Program) -> str:
    """Assembly text that re-assembles to the same code, data and task table.

    Text labels of the program are kept; branch targets and task entries
    without one get ``L_XXXX`` labels (hex address). Data is printed as
    ``.word`` lines with the program's data labels, and ``.org`` where
    segments leave gaps.

    Raises
    ------
    UsageError
        If a code word is not a valid instruction.
    """
    code = [int(w) for w in program.code]
    decoded = []
    for addr, word in enumerate(code):
        try:
            format_instruction(word)
        except ValueError as exc:
            raise UsageError(f"{program.source}: code word {addr} is not a valid instruction: {exc}") from None
        decoded.append(isa.decode(word))
    taken = set(program.symbols)
    text_labels: dict[int, list[str]] = {}
    for sym in program.symbols.values():
        if sym.section == "text" and _usable(sym.name) and 0 <= sym.addr <= len(code):
            text_labels.setdefault(sym.addr, []).append(sym.name)
    wanted = {t.entry for t in program.tasks}
    for ins, values in decoded:
        wanted.update(values[f.name] for f in ins.format.fields if f.kind == "target")
    for addr in sorted(wanted):
        if 0 <= addr <= len(code) and addr not in text_labels:
            text_labels[addr] = [_unique(f"L_{addr:04x}", taken)]
    first = {addr: names[0] for addr, names in text_labels.items()}

    source = program.source.replace("\n", " ")
    lines = [f"; {source}: {len(code)} instructions, {program.data_words} data words, "
             f"{len(program.tasks)} tasks", ".text"]
    for addr, word in enumerate(code + [None]):
        lines += [f"{name}:" for name in text_labels.get(addr, [])]
        if word is not None:
            lines.append(f"    {format_instruction(word, first)}")
    lines += _disassemble_data(program)
    for task in program.tasks:
        directive = ".data_task" if task.data_color else ".task"
        entry = first.get(task.entry, str(task.entry))
        lines.append(f"{directive} {task.id}, {entry}" + (", blocked" if task.blocked else ""))
    return "\n".join(lines) + "\n"


def _disassemble_data(program: Program, per_line: int = 8) -> list[str]:
    labels = sorted(((s.addr, s.name) for s in program.symbols.values() if s.section == "data" and _usable(s.name)),
                    key=lambda item: item[0])
    if not program.data and not labels:
        return []
    lines, loc, pending = [".data"], 0, list(labels)

    def emit_labels_before(limit: int, inclusive: bool) -> None:
        nonlocal loc
        while pending and (pending[0][0] < limit or (inclusive and pending[0][0] == limit)):
            addr, name = pending.pop(0)
            if addr != loc:
                lines.append(f".org {addr:#x}")
                loc = addr
            lines.append(f"{name}:")

    for start, words in program.data:
        emit_labels_before(start, inclusive=False)
        if start != loc:
            lines.append(f".org {start:#x}")
            loc = start
        pos, end = start, start + words.size
        while pos < end:
            loc = pos
            emit_labels_before(pos, inclusive=True)
            stop = min(end, pos + per_line, *[a for a, _ in pending[:1] if a > pos])
            lines.append("    .word " + ", ".join(f"{int(w):#010x}" for w in words[pos - start:stop - start]))
            pos = stop
        loc = end
    emit_labels_before(1 << 62, inclusive=True)
    return lines
