"""``bench/gpt_reference.py`` refuses a non-positive count or learning rate in one line, exit
code 2, before it loads anything (0 is not taken for "the default")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpt_reference.py"


@pytest.mark.parametrize("args,shown", [(["--validation", "--steps", "0"], "--steps 0"),
                                        (["--lr", "nan", "--batch", "-2", "--sequences", "0", "--report", "0"],
                                         "--lr nan, --batch -2, --sequences 0, --report 0")])
def test_non_positive_arguments_are_one_line_exit_2(args, shown):
    run = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == ("gpt_reference: --steps, --lr, --batch, --sequences and --report must be positive, not "
                          f"{shown}\n")
