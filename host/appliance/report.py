"""What a run shows and leaves behind: progress, log lines, TensorBoard scalars, the summary.

- :class:`Progress`: a ``tqdm`` bar on a terminal, or log lines every few
  steps elsewhere (and always into ``out/train.log``).
- :class:`Scalars`: TensorBoard event files under ``out/tensorboard``; every
  scalar is indexed by the global step (an epoch's scalars by the step that
  ends it), so a resumed run purges what an interrupted one wrote after its
  checkpoint.
- :class:`RunSummary` and :func:`finish_run`: ``summary.json`` and what the
  run returns; :func:`loss_curve` condenses the per-step losses for it and
  :func:`systems_report` describes the systems that ran it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping, Sequence

from wse.atomic import atomic_open
from wse.host.memoryx import OPTIMIZERS, OptimizerConfig

from .pictures import PICTURES_DIR
from .folder import (ELASTIC_NAME, EXECUTABLE_NAME, FABRIC_NAME, LOG_NAME, SCRATCH_DIR, SUMMARY_NAME,
                     TENSORBOARD_DIR)

if TYPE_CHECKING:
    from .preparation import Prepared

# The file names are the run folder's (wse.host.appliance.folder), re-exported here.
__all__ = ["Progress", "Scalars", "RunSummary", "finish_run", "systems_report", "loss_curve", "optimizer_text",
           "write_json", "SUMMARY_NAME", "EXECUTABLE_NAME", "LOG_NAME", "FABRIC_NAME", "TENSORBOARD_DIR",
           "ELASTIC_NAME", "SCRATCH_DIR"]


def _fmt_step(step: int, total: int, epoch: float, loss: float, accuracy: float, cycles: float,
              utilization: float, step_utilization: float | None = None) -> str:
    util = (f"FMAC util step {step_utilization:.3f} GEMMs {utilization:.3f}" if step_utilization is not None
            else f"FMAC util GEMMs {utilization:.3f}")
    return (f"step {step}/{total}  epoch {epoch:.2f}  loss {loss:.4f}  acc {accuracy:.3f}  "
            f"cycles/step {cycles:,.0f}  {util}")


class Progress:
    """Progress of the training loop.

    Parameters
    ----------
    total : int
        Steps of the whole run.
    initial : int
        Steps already done (a resumed run).
    mode : {"auto", "bar", "lines", "none"}
        ``auto`` picks ``bar`` when ``stream`` is a terminal, ``lines`` otherwise.
    log_every : int
        Steps between log lines.
    stream : file, optional
        Where bar and lines go; default ``sys.stderr`` for a bar, ``sys.stdout``
        for lines.
    log_file : path, optional
        A file that receives every log line (appended), whatever the mode.
    suffix : str
        Appended to every step line (e.g. the SwarmX cycles of a run on several systems).

    The steps/s rate of a line leaves out the first step of the invocation
    (it compiles and warms caches, often a hundred times slower); that step's
    line says how long it took instead.
    """

    def __init__(self, total: int, initial: int, mode: str, log_every: int, stream: IO[str] | None = None,
                 log_file: str | os.PathLike | None = None, suffix: str = ""):
        if mode == "auto":
            probe = stream if stream is not None else sys.stderr
            mode = "bar" if hasattr(probe, "isatty") and probe.isatty() else "lines"
        self.mode = mode
        self.total, self.log_every, self.suffix = total, max(1, log_every), suffix
        self._stream = stream if stream is not None else (sys.stderr if mode == "bar" else sys.stdout)
        self._log = open(log_file, "a", encoding="utf-8") if log_file is not None else None
        self._bar = None
        self._started = time.perf_counter()
        self._initial = initial
        self._warm: tuple[int, float] | None = None   # (step, time) at the end of the first step
        if mode == "bar":
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, file=self._stream, unit="step", dynamic_ncols=True,
                             desc="train")

    def _emit(self, line: str, *, show: bool = True) -> None:
        if self._log is not None:
            self._log.write(line + "\n")
            self._log.flush()
        if not show or self.mode == "none":
            return
        if self._bar is not None:
            self._bar.write(line, file=self._stream)
        else:
            print(line, file=self._stream, flush=True)

    def message(self, line: str) -> None:
        """Show one line (and log it)."""
        self._emit(line)

    def rate(self, step: int) -> float | None:
        """Steps per second after the first step of this invocation (None before a second step)."""
        if self._warm is None or step <= self._warm[0]:
            return None
        return (step - self._warm[0]) / max(time.perf_counter() - self._warm[1], 1e-9)

    def step(self, step: int, epoch: float, loss: float, accuracy: float, cycles: float,
             utilization: float, step_utilization: float | None = None) -> None:
        """Report one finished step (``step`` counts from 1); ``utilization`` is the streamed
        GEMMs' FMAC utilization, ``step_utilization`` the whole step's."""
        now = time.perf_counter()
        first = self._warm is None
        if first:
            self._warm = (step, now)
        if self._bar is not None:
            if first:   # the bar's rate, too, starts after the warm-up step
                self._bar.reset(total=self.total)
                self._bar.update(step)
            else:
                self._bar.update(1)
            self._bar.set_postfix(loss=f"{loss:.4f}", acc=f"{accuracy:.3f}", cycles=f"{cycles:,.0f}",
                                  util=f"{utilization:.3f}", refresh=False)
        if first or step % self.log_every == 0 or step == self.total:
            rate = self.rate(step)
            when = (f"  ({rate:.2f} steps/s)" if rate is not None else
                    f"  (first step {now - self._started:.2f} s, with compile warm-up)")
            line = (_fmt_step(step, self.total, epoch, loss, accuracy, cycles, utilization, step_utilization)
                    + self.suffix + when)
            self._emit(line, show=self._bar is None)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        if self._log is not None:
            self._log.close()
            self._log = None


class Scalars:
    """TensorBoard scalars of a run (no-op when ``log_dir`` is ``None``).

    ``purge_step`` is the first step this writer logs: TensorBoard then drops
    events at or after it left by an interrupted earlier writer.
    """

    def __init__(self, log_dir: str | os.PathLike | None, purge_step: int | None = None):
        self._writer = None
        if log_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(str(log_dir), purge_step=purge_step)

    def add(self, step: int, values: Mapping[str, float]) -> None:
        if self._writer is None:
            return
        for tag, value in values.items():
            self._writer.add_scalar(tag, float(value), step)

    def add_image(self, step: int, tag: str, png: str | os.PathLike) -> None:
        """Add a PNG picture (e.g. a heatmap) as an image at ``step``."""
        if self._writer is None:
            return
        import matplotlib.image

        pixels = matplotlib.image.imread(str(png))[..., :3]
        self._writer.add_image(tag, pixels, step, dataformats="HWC")

    def close(self) -> None:
        if self._writer is not None:
            self._writer.flush()
            self._writer.close()
            self._writer = None


def loss_curve(losses: Sequence[float], steps_per_epoch: int, points: int = 50) -> dict[str, Any]:
    """A compact description of a per-step loss curve for the run summary.

    Returns ``first``, ``last``, ``min`` (with its step), ``epoch_means`` (the
    mean loss of each epoch, the last one possibly partial) and ``curve``:
    at most ``points`` ``[step, mean loss of the steps up to it since the
    previous point]`` pairs.
    """
    if not losses:
        return {"first": None, "last": None, "min": None, "min_step": None, "epoch_means": [], "curve": []}
    best = min(range(len(losses)), key=losses.__getitem__)
    epoch_means = [sum(chunk) / len(chunk) for chunk in
                   (losses[i:i + steps_per_epoch] for i in range(0, len(losses), steps_per_epoch))]
    width = max(1, math.ceil(len(losses) / points))
    curve = [[min(i + width, len(losses)), sum(losses[i:i + width]) / len(losses[i:i + width])]
             for i in range(0, len(losses), width)]
    return {"first": losses[0], "last": losses[-1], "min": losses[best], "min_step": best + 1,
            "epoch_means": epoch_means, "curve": curve}


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON to ``path`` atomically."""
    with atomic_open(path, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What a run did (also written as ``out/summary.json``).

    Members
    -------
    out : pathlib.Path
        The run folder.
    steps : int
        Optimizer steps done (all invocations together).
    total_steps : int
        Steps this invocation aimed for: all epochs, or fewer with ``max_steps``.
    complete : bool
        Whether all epochs are done (a run stopped by ``max_steps`` is not).
    train_accuracy : float or None
        Accuracy of the final weights on the whole training split (``None``
        when ``eval_train`` is off; ``data["train_running_accuracy"]`` is then
        the accuracy of the last epoch's batches, each before its update).
    test_accuracy : float
        Accuracy of the final weights on the test split.
    test_loss : float
        Mean cross-entropy of the final weights on the test split.
    cycles_per_step : float
        Mean simulated fabric cycles per training step (of one system; the
        SwarmX cycles of a run on several systems are in ``data["systems"]``).
    fmac_utilization : float
        Mean FMAC utilization of the streamed GEMMs (as the runtime defines it);
        the whole step's is ``data["fabric"]["fmac_utilization_step"]``.
    wall_s : float
        Wall-clock seconds spent training, all invocations together.
    data : dict
        The full summary (settings, loss curve, per-epoch records, files, systems).
    """

    out: Path
    steps: int
    total_steps: int
    complete: bool
    train_accuracy: float | None
    test_accuracy: float
    test_loss: float
    cycles_per_step: float
    fmac_utilization: float
    wall_s: float
    data: dict

    def describe(self) -> str:
        """A few lines for people: what was trained, the results, where the files are."""
        s, files = self.data["settings"], self.data["files"]
        planned = self.data["settings"]["epochs"] * self.data["steps_per_epoch"]
        state = "complete" if self.complete else f"stopped at step {self.steps} of {planned} (--max-steps)"
        lines = [
            f"trained {self.data['model']} ({self.data['parameter_count']:,} parameters) on {s['dataset']} "
            f"for {self.steps} steps ({self.data['epochs_completed']:.2f} epochs, batch {s['batch']}, "
            f"{self.data['optimizer']}), {state}",
            f"  fabric      : {s['mesh']} mesh, {s['backend']} backend, {self.cycles_per_step:,.0f} cycles/step, "
            + (f"FMAC utilization: whole step {self.data['fabric']['fmac_utilization_step']:.3f}, "
               if self.data["fabric"].get("fmac_utilization_step") else "FMAC utilization: ")
            + ("GEMM phases" if s.get("mode") == "pipelined" else "streamed GEMMs") + f" {self.fmac_utilization:.3f}",
            f"  accuracy    : test {100 * self.test_accuracy:.2f}%  " + (
                f"train {100 * self.train_accuracy:.2f}%" if self.train_accuracy is not None else
                f"train (last epoch's batches) {100 * (self.data['train_running_accuracy'] or 0):.2f}%")
            + f"  (test loss {self.test_loss:.4f})",
            f"  wall time   : {self.wall_s:.1f} s ({1000 * self.data['step_time_s']:.1f} ms/step"
            + (f", {self.data['steps_per_s_after_first']:.2f} steps/s after the first step"
               if self.data.get("steps_per_s_after_first") else "") + ")",
            f"  summary     : {files['summary']}",
            f"  checkpoint  : {files['checkpoint']}",
        ]
        dense = self.data["fabric"].get("dense_cycles_per_step")
        if dense:
            state = self.data.get("memoryx_state") or {}
            lines.insert(2, f"  sparsity    : {self.cycles_per_step:,.0f} cycles/step against {dense:,} dense "
                            f"({self.cycles_per_step / dense:.3f}x)" + (
                                f"; optimizer state {state['state_bytes']:,} bytes ({state['dense_state_bytes']:,} "
                                "dense)" if state else ""))
        systems = self.data.get("systems") or {}
        swarmx = systems.get("swarmx")
        if systems.get("count", 1) > 1 and swarmx:
            transport = "in-process" if systems["transport"] == "inprocess" else systems["transport"]
            lines.insert(2, f"  systems     : {systems['count']} ({transport}), each {swarmx['compute']:,} fabric "
                            f"cycles/step; SwarmX broadcast {swarmx['broadcast']:,} + reduce {swarmx['reduce']:,} "
                            f"cycles/step; step {swarmx['overlapped']:,} cycles with streams overlapped "
                            f"({swarmx['serial']:,} serial)")
        tiers = systems.get("memoryx")
        if tiers:
            lines.insert(-2, f"  memoryx     : budget {tiers['budget_bytes']:,} bytes per system; system 0 keeps "
                             f"{tiers['resident_bytes']:,} bytes in RAM and {tiers['disk_bytes']:,} on disk")
        if files.get("tensorboard"):
            lines.append(f"  tensorboard : tensorboard --logdir {files['tensorboard']}")
        if files.get("pictures"):
            lines.append(f"  pictures    : {files['pictures']} (first step; wse report {files['run']})")
        return "\n".join(lines)


def optimizer_text(config: OptimizerConfig) -> str:
    """``sgd(lr=0.05, momentum=0.9)``: the name and the hyper-parameters that differ from PyTorch's defaults."""
    defaults = OPTIMIZERS[config.name].defaults()
    changed = ", ".join(f"{k}={v}" for k, v in config.hyper.items() if defaults.get(k) != v)
    return f"{config.name}({changed})"


def systems_report(engine: Any) -> dict:
    """The summary's ``"systems"`` entry for the engine of system 0 (see :func:`finish_run`).

    ``count`` and ``transport`` of the systems, ``swarmx`` (the link model and
    :class:`~wse.host.swarmx.StepCycles` of a step, None without them) and
    ``memoryx`` (``engine.memoryx_report()``).
    """
    report = {"count": engine.systems, "transport": engine.transport, "swarmx": None,
              "memoryx": engine.memoryx_report()}
    if engine.swarmx is not None:
        links = engine.links
        report["swarmx"] = {"link": {"wavelets_per_cycle": links.wavelets_per_cycle,
                                     "hop_latency": links.hop_latency, "fanout": links.fanout},
                            "reduce_order": "chain", **engine.swarmx.to_dict()}
    return report


def finish_run(p: "Prepared", trainer: dict, resumed_from: int | None, steps_before: int,
               train_acc: float | None, test_acc: float, test_loss: float, wall: float, step_s: float,
               checkpoint: Path | None, systems: dict | None = None) -> RunSummary:
    """Write ``summary.json`` for a run that has done its steps and return its :class:`RunSummary`.

    ``p`` is the :class:`~wse.host.appliance.preparation.Prepared` run, ``trainer``
    its trainer state (history, epoch records), ``steps_before`` the step it
    started from in this invocation and ``step_s`` the seconds its steps took.
    ``systems`` (the summary's ``"systems"`` entry) describes the systems of
    this invocation: ``count``, ``transport``, ``swarmx`` (the link model and
    :class:`~wse.host.swarmx.StepCycles` of a step) and ``memoryx`` (bytes in
    RAM and on disk of system 0's MemoryX under a budget).
    """
    hist, s = trainer["history"], p.settings
    step, total = trainer["step"], p.total_steps
    cycles = hist["cycles"]
    params = {name: list(p.memoryx.shape(name)) for name in p.memoryx.names()}
    ran = step - steps_before
    last = hist["correct"][-p.steps_per_epoch:]
    data = {
        "format": "wse.appliance.summary", "version": 1,
        "settings": s.to_dict(),
        "model": p.executable.graph.name if hasattr(p.executable, "graph") else type(p.model).__name__,
        "parameters": params, "parameter_count": int(sum(math.prod(v) for v in params.values())),
        "optimizer": optimizer_text(s.optimizer_config),
        "backend": s.backend, "mesh": s.mesh,
        "steps": step, "total_steps": total, "steps_per_epoch": p.steps_per_epoch,
        "epochs_completed": step / p.steps_per_epoch, "complete": step >= s.epochs * p.steps_per_epoch,
        "resumed_from": resumed_from,
        "train_accuracy": train_acc, "test_accuracy": test_acc, "test_loss": test_loss,
        "train_running_accuracy": sum(last) / (s.batch * len(last)) if last else None,
        "loss": loss_curve(hist["loss"], p.steps_per_epoch),
        "epochs": trainer["epochs"],
        "fabric": {
            "cycles_per_step": sum(cycles) / len(cycles) if cycles else 0.0,
            "cycles_per_step_min": min(cycles, default=0), "cycles_per_step_max": max(cycles, default=0),
            "fmac_utilization": (sum(hist["utilization"]) / len(hist["utilization"])) if cycles else 0.0,
            "fmac_utilization_step": (sum(hist["step_utilization"]) / len(hist["step_utilization"]))
            if hist.get("step_utilization") else None,
            "phases": trainer["phases"],
            "dense_cycles_per_step": getattr(p, "dense_cycles", None),
        },
        "systems": systems,
        "memoryx_state": p.memoryx.state_bytes() if hasattr(p.memoryx, "state_bytes") else None,
        "wall_s": wall,
        "step_time_s": step_s / ran if ran else 0.0,    # train_step + optimizer step, this invocation
        "steps_per_s_after_first": trainer.get("steps_per_s_after_first"),
        "files": {
            "run": str(p.out), "summary": str(p.out / SUMMARY_NAME),
            "checkpoint": str(checkpoint) if checkpoint else None,
            "tensorboard": str(p.out / TENSORBOARD_DIR) if p.config.tensorboard else None,
            "log": str(p.out / LOG_NAME), "fabric": str(p.out / FABRIC_NAME),
            "executable": str(p.out / EXECUTABLE_NAME),
            "pictures": str(p.out / PICTURES_DIR) if (p.out / PICTURES_DIR).is_dir() else None,
        },
    }
    write_json(p.out / SUMMARY_NAME, data)
    return RunSummary(p.out, step, total, data["complete"], train_acc, test_acc, test_loss,
                      data["fabric"]["cycles_per_step"], data["fabric"]["fmac_utilization"], wall, data)
