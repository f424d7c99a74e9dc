"""The assembler's ``.include "FILE"`` (firmware/asm.py): the included lines in place,
errors located in the file they come from, cycles and missing files refused."""

from __future__ import annotations

import pytest

from wse.firmware.asm import AsmError, assemble, assemble_file


def _write(folder, name, text):
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_include_equals_the_text_in_place(tmp_path):
    body = "        .data\nval: .word 7\n        .text\nmore:\n        ld r1, val(r0)\n        exit\n"
    head = "        .text\nrun:\n        jmp more\n"
    tail = "        .task 0, run\n"
    _write(tmp_path, "sub/part.s", body)
    main = _write(tmp_path, "main.s", head + '        .include "sub/part.s"   ; the rest\n' + tail)
    included, inline = assemble_file(main), assemble(head + body + tail, str(main))
    assert (included.code == inline.code).all()
    assert [(a, list(w)) for a, w in included.data] == [(a, list(w)) for a, w in inline.data]
    assert included.symbols == inline.symbols and included.tasks == inline.tasks


def test_errors_name_the_included_file_and_line(tmp_path):
    _write(tmp_path, "part.s", "        nop\n        bogus r1\nrun:\n")
    main = _write(tmp_path, "main.s", '        .text\nrun:\n        .include "part.s"\n        frob\n')
    with pytest.raises(AsmError) as err:
        assemble_file(main)
    lines = err.value.diagnostics
    assert any(line.startswith(f"{tmp_path / 'part.s'}:2: ") and "bogus" in line for line in lines), lines
    assert any(line.startswith(f"{main}:4: ") for line in lines), lines
    assert any(line.startswith(f"{tmp_path / 'part.s'}:3: ") and f"{main}:2" in line for line in lines), lines


def test_missing_and_cyclic_includes_are_refused(tmp_path):
    main = _write(tmp_path, "main.s", '        .include "nowhere.s"\n')
    with pytest.raises(AsmError, match=r"main.s:1: .include: .*nowhere.s: no such file"):
        assemble_file(main)
    _write(tmp_path, "a.s", '        .include "b.s"\n')
    _write(tmp_path, "b.s", '        .include "a.s"\n')
    with pytest.raises(AsmError, match=r"b.s:1: .include of .*a.s includes itself"):
        assemble_file(tmp_path / "a.s")


def test_include_outside_a_file_or_misspelled_is_one_error():
    with pytest.raises(AsmError, match=r"<string>:1: .include needs a source file"):
        assemble('        .include "x.s"\n')
    with pytest.raises(AsmError, match=r"<string>:1: .include needs a source file"):
        assemble("        .include x.s\n")
