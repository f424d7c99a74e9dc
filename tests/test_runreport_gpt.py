"""`wse report` of a GPT run: the fabric cycles per step and per phase kind when its device ran the step
as fabric phases, else that the functional backend has none; one error line for a folder that is not a run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_gpt_appliance import _run, job  # noqa: F401  (job: the fixture)

from wse.cli import main
from wse.host.appliance.gpt import GptPlan
from wse.host.appliance.runreport import report_text


def _report(run: Path, capsys) -> str:
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out
    assert (run / "report.md").read_text().strip() == out.strip()
    return out


def _rows(text: str) -> dict[str, int]:
    """The phase-kind table of a report: ``{kind: cycles}``."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 3 and cells[1].replace(",", "").isdigit():
            rows[cells[0]] = int(cells[1].replace(",", ""))
    return rows


def test_report_reads_the_cycles_of_the_plan(tmp_path: Path):
    """The cycles the plan of a device run writes (:meth:`GptPlan.summary`) come back exactly, commas
    and all, kinds without cycles left out."""
    kinds = {"gemm": {"cycles": 1_234_567}, "attention": {"cycles": 89}, "softmax": {"cycles": 0},
             "relayout": {"cycles": 10_000}}
    schedule = SimpleNamespace(phases=[None] * 7, by_kind=lambda: kinds,
                               cycles=lambda: sum(k["cycles"] for k in kinds.values()))
    plan = GptPlan(SimpleNamespace(summary=lambda: "graph"), SimpleNamespace(describe=lambda: "layout"), schedule)
    (tmp_path / "fabric.txt").write_text(plan.summary() + "\n")
    text = report_text(tmp_path)
    assert "- cycles per step: 1,244,656 (7 fabric phases" in text
    assert _rows(text) == {"gemm": 1_234_567, "attention": 89, "relayout": 10_000}
    assert "no summary.json yet" in text


def test_report_of_a_functional_gpt_run(job: Path, tmp_path: Path, capsys):  # noqa: F811
    _run(job, tmp_path / "run", max_steps=1, batch=4)
    text = _report(tmp_path / "run", capsys)
    assert "functional backend" in text and "no fabric cycles" in text and "validation loss" in text
    assert "GPT" in text and not _rows(text)


@pytest.mark.slow
def test_report_of_a_gpt_run_on_the_golden_fabric(job: Path, tmp_path: Path, capsys):  # noqa: F811
    """The cycles its plan holds, per step and per kind (the kinds add up to the step)."""
    _run(job, tmp_path / "golden", max_steps=1, batch=4, backend="golden")
    text = _report(tmp_path / "golden", capsys)
    summary = json.loads((tmp_path / "golden" / "summary.json").read_text())
    assert summary["backend"] == "golden" and "golden backend" in text
    rows = _rows(text)
    cycles = int(text.split("- cycles per step: ")[1].split(" ")[0].replace(",", ""))
    assert rows and cycles > 0 and sum(rows.values()) == cycles
    head = (tmp_path / "golden" / "fabric.txt").read_text().splitlines()[0]
    assert f"{cycles:,} cycles per step" in head


def test_report_of_a_folder_that_is_not_a_run(tmp_path: Path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "not a run folder" in err and err.count("\n") == 1
