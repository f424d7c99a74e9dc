"""``wse report RUN``: the one page a hardware engineer reads first about a training run.

It reads what ``wse train`` left in the run folder (``summary.json``,
``fabric.txt``, and for a golden-model run ``pictures/phases.json`` with the
first step's heatmaps and timeline), prints a Markdown page and writes it to
``RUN/report.md``: mode, mesh, cycles per phase and the cycle window of each
(to jump there in GTKWave or the timeline), FMAC utilization (whole step and
streamed GEMMs, labelled), the most stalled PEs, the busiest links, stall
causes, MemoryX and SwarmX traffic, and links to the pictures and the trace.
For a GPT run: its model, backend and losses and, when the run's device ran
the step as fabric phases (``--backend golden|vector|verilator|icarus``), the
cycles per step and per phase kind that ``fabric.txt`` holds.

Usage: wse report RUN [--no-write]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from wse.atomic import atomic_open
from wse.config import UsageError

from .folder import FABRIC_NAME, SUMMARY_NAME
from .pictures import PICTURES_DIR

__all__ = ["report_text", "main", "REPORT_NAME"]

#: The report's file in the run folder.
REPORT_NAME = "report.md"


#: The first line of a GPT run's ``fabric.txt`` when its device runs the step as fabric phases
#: (:class:`~wse.host.appliance.gpt.GptPlan`): phases, cycles per step and cycles per kind.
_GPT_CYCLES = re.compile(r"the training step as (\d+) fabric phases \(.*?\): ([\d,]+) cycles per step "
                         r"by the static cycle model \((.*)\)\s*$")
_GPT_KIND = re.compile(r"([a-z_-]+) (\d{1,3}(?:,\d{3})*)(?=, [a-z]|$)")


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON file ({exc})") from None


def _summary_lines(summary: dict | None, fabric_text: str) -> list[str]:
    head = fabric_text.splitlines()[0] if fabric_text else "(no fabric.txt)"
    lines = ["## The run", "", f"- program: {head}"]
    if summary is None:
        return lines + ["- no summary.json yet: the run has not finished (figures below are the first step's)", ""]
    s, fab = summary["settings"], summary["fabric"]
    step_util = fab.get("fmac_utilization_step")
    resident = s.get("mode") == "pipelined"
    gemms = "GEMM phases" if resident else "streamed GEMMs"
    lines += [f"- model {summary['model']} ({summary['parameter_count']:,} parameters) on {s['dataset']}, "
              f"{s['mesh']} mesh, {s['backend']} backend, batch {s['batch']}, {summary['steps']} steps",
              f"- cycles per step: {fab['cycles_per_step']:,.0f}",
              "- FMAC utilization: " + (f"whole step {step_util:.3f}, " if step_util else "")
              + f"{gemms} {fab['fmac_utilization']:.3f}",
              f"- test accuracy {100 * summary['test_accuracy']:.2f}%, wall time {summary['wall_s']:.1f} s", ""]
    if fab.get("phases"):
        lines += ["| phase | cycles | share of the step |", "|---|---:|---:|"]
        total = max(sum(fab["phases"].values()), 1)
        lines += [f"| {name} | {c:,} | {c / total:.1%} |" for name, c in fab["phases"].items()]
        lines.append("")
    systems = summary.get("systems") or {}
    swarmx, memoryx = systems.get("swarmx"), systems.get("memoryx")
    lines += ["## MemoryX and SwarmX", ""]
    if memoryx:
        lines.append(f"- MemoryX: budget {memoryx['budget_bytes']:,} bytes, {memoryx['resident_bytes']:,} in RAM, "
                     f"{memoryx['disk_bytes']:,} on disk")
    elif resident:
        lines.append("- MemoryX: nothing streams during a step (layer-pipelined: the weights and optimizer state "
                     "live on the PEs; MemoryX keeps the copy read back for evaluation and checkpoints)")
    else:
        lines.append("- MemoryX: every weight in RAM (no budget)")
    if swarmx and systems.get("count", 1) > 1:
        lines.append(f"- SwarmX: {systems['count']} systems, broadcast {swarmx['broadcast']:,} + reduce "
                     f"{swarmx['reduce']:,} cycles per step, step {swarmx['overlapped']:,} cycles overlapped")
    else:
        lines.append(f"- SwarmX: {systems.get('count', 1)} system(s), no data-parallel traffic")
    return lines + [""]


def _gpt_lines(summary: dict | None, fabric_text: str) -> list[str]:
    """The report of a GPT run: what it trained and, from ``fabric.txt``, its fabric cycles if it has any."""
    head = fabric_text.splitlines()[0] if fabric_text else "(no fabric.txt)"
    lines = ["## The run", "", f"- program: {head}"]
    if summary is None:
        lines.append("- no summary.json yet: the run has not finished")
    else:
        s = summary["settings"]
        lines += [f"- GPT {summary['model']} ({summary['parameter_count']:,} parameters) on {summary['corpus']}, "
                  f"{s['mesh']} mesh, {summary['backend']} backend, batch {s['batch']}, {summary['steps']} steps",
                  f"- validation loss {summary['validation_loss']:.4f} (unigram {summary['unigram_validation_loss']:.4f}), "
                  f"wall time {summary['wall_s']:.1f} s"]
    found = _GPT_CYCLES.search(head)
    if found is None:
        backend = summary["backend"] if summary is not None else "functional"
        return lines + [f"- no fabric cycles: the {backend} backend runs the step on the functional model "
                        "(--backend golden, vector, verilator or icarus runs it as fabric phases, "
                        "docs/transformer.md section 11)", ""]
    phases, cycles = int(found.group(1)), int(found.group(2).replace(",", ""))
    kinds = {k: int(c.replace(",", "")) for k, c in _GPT_KIND.findall(found.group(3))}
    lines += [f"- cycles per step: {cycles:,} ({phases} fabric phases, static cycle model; "
              "docs/transformer.md section 11)", "",
              "| phase kind | cycles | share of the step |", "|---|---:|---:|"]
    lines += [f"| {kind} | {c:,} | {c / max(cycles, 1):.1%} |" for kind, c in kinds.items()]
    return lines + [""]


def _picture_lines(index: dict | None, run: Path) -> list[str]:
    if index is None:
        return ["## Inside the fabric", "", "- no pictures: per-PE heatmaps and the timeline of the first step "
                "are recorded with `--backend golden`", ""]
    lines = ["## Inside the fabric (step 1, golden model)", "",
             f"- timeline: `{index['trace']}` (open in ui.perfetto.dev; 1 us = 1 cycle)", "",
             "| phase | cycles (window) | FMAC util | stall rx / tx | most stalled PEs | busiest links "
             "| wavelets in / out |", "|---|---|---:|---|---|---|---|"]
    for phase, hot in index.get("hot", {}).items():
        w = index["windows"][phase]
        pes = ", ".join(f"({p['pe'][0]},{p['pe'][1]}) {p['stall_cycles']:,}" for p in hot["most_stalled_pes"]) or "-"
        links = ", ".join(f"({x['router'][0]},{x['router'][1]}) {x['port']} {x['occupancy']:.2f}"
                          for x in hot["busiest_links"]) or "-"
        stall, traffic = hot["stall_cycles"], hot["host_stream_wavelets"]
        lines.append(f"| {phase} | {hot['cycles']:,} ({w['first_cycle']:,}-{w['last_cycle']:,}) "
                     f"| {hot['fmac_utilization']:.3f} | {stall['rx']:,} / {stall['tx']:,} | {pes} | {links} "
                     f"| {traffic['in']:,} / {traffic['out']:,} |")
    lines += ["", "Heatmaps (docs/pictures.md says how to read them):", ""]
    for phase, paths in index["phases"].items():
        rel = {k: Path(v).relative_to(run) if Path(v).is_relative_to(run) else Path(v) for k, v in paths.items()}
        lines.append(f"- {phase}: " + ", ".join(f"[{k}]({v})" for k, v in rel.items()))
    first = next(iter(index["phases"].values()), None)
    if first:
        lines += ["", f"![FMAC utilization of the first phase]({Path(first['fmac']).relative_to(run)})"
                  if Path(first["fmac"]).is_relative_to(run) else ""]
    return lines + [""]


def report_text(run: str | Path) -> str:
    """The Markdown report of the run folder ``run``.

    Raises :class:`UsageError` when ``run`` is not a run folder of ``wse train``."""
    run = Path(run)
    if not run.is_dir():
        what = "is a file, not a folder" if run.exists() else "no such folder"
        raise UsageError(f"RUN {run}: {what} (expected a run folder of wse train, e.g. runs/fc_mnist)")
    fabric = run / FABRIC_NAME
    summary = _read_json(run / SUMMARY_NAME)
    if summary is None and not fabric.is_file():
        raise UsageError(f"RUN {run}: not a run folder of wse train (no {SUMMARY_NAME} or {FABRIC_NAME} in it)")
    fabric_text = fabric.read_text(encoding="utf-8") if fabric.is_file() else ""
    if (summary is not None and summary.get("kind") == "gpt") or fabric_text.startswith("mode: weight streaming,"):
        return "\n".join([f"# Run report: {run}", ""] + _gpt_lines(summary, fabric_text))
    index = _read_json(run / PICTURES_DIR / "phases.json")
    lines = [f"# Run report: {run}", ""] + _summary_lines(summary, fabric_text) + _picture_lines(index, run)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """``wse report RUN``: print the run's report and write it to ``RUN/report.md``."""
    parser = argparse.ArgumentParser(prog="wse report", description="The one-page report of a training run.")
    parser.error = lambda message: (_ for _ in ()).throw(UsageError(message))
    parser.add_argument("run", help="a run folder of wse train")
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write RUN/{REPORT_NAME}")
    args = parser.parse_args(argv)
    text = report_text(args.run)
    print(text)
    if not args.no_write:
        with atomic_open(Path(args.run) / REPORT_NAME, "w") as fh:
            fh.write(text + "\n")
    return 0
