"""The ``wse asm`` and ``wse disasm`` commands.

``wse asm FILE.s [-o FILE.bin] [--define NAME=VALUE ...]`` assembles a PE
program into a binary image (:mod:`wse.firmware.image`); ``wse disasm FILE.bin``
prints its disassembly. Mistakes in the input are printed as
``FILE:LINE: message`` lines (or one line for other problems) on stderr with
exit code 2, never as a traceback.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from wse.config import UsageError

from .asm import AsmError, assemble_file, disassemble
from .image import Program

__all__ = ["asm_main", "disasm_main"]


def _parse_define(text: str) -> tuple[str, int]:
    name, eq, value = text.partition("=")
    if not eq or not name.strip():
        raise UsageError(f"--define {text!r} must be NAME=VALUE such as N=16")
    try:
        return name.strip(), int(value.strip(), 0)
    except ValueError:
        raise UsageError(f"--define {text!r}: VALUE must be an integer such as 16, -3 or 0x10") from None


def asm_main(argv: list[str]) -> int:
    """``wse asm``: assemble a source file and write its program image.

    Prints ``wrote FILE.bin: N instructions, M data words, T tasks`` and
    returns 0; on errors prints them to stderr and returns 2.
    """
    parser = argparse.ArgumentParser(prog="wse asm", description="Assemble a PE program into a program image.")
    parser.add_argument("source", help="assembly source (.s)")
    parser.add_argument("-o", "--output", help="image to write (default: the source with .bin)")
    parser.add_argument("-D", "--define", action="append", default=[], metavar="NAME=VALUE",
                        help="set a constant, overriding a .equ of the same name (repeatable)")
    args = parser.parse_args(argv)
    source = Path(args.source)
    output = Path(args.output) if args.output else source.with_suffix(".bin")
    try:
        if output.resolve() == source.resolve():
            raise UsageError(f"the output {output} would overwrite the source; name another with -o")
        defines = dict(_parse_define(text) for text in args.define)
        program = assemble_file(source, defines=defines)
        try:
            program.save(output)
        except OSError as exc:
            raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    except AsmError as exc:
        for line in exc.diagnostics:
            print(line, file=sys.stderr)
        return 2
    except UsageError as exc:
        print(f"wse asm: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {output}: {program.code.size} instructions, {program.data_words} data words, "
          f"{len(program.tasks)} tasks")
    return 0


def disasm_main(argv: list[str]) -> int:
    """``wse disasm``: print the disassembly of a program image.

    Returns 0, or 2 with one line on stderr if the file is not a valid image.
    """
    parser = argparse.ArgumentParser(prog="wse disasm", description="Print the assembly of a program image.")
    parser.add_argument("image", help="program image (.bin) written by wse asm")
    args = parser.parse_args(argv)
    try:
        text = disassemble(Program.load(args.image))
    except UsageError as exc:
        print(f"wse disasm: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
