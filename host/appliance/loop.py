"""The training loop: one function, :func:`train_loop`, over an engine, for one system or N.

The loop streams each mini-batch through the fabric by way of an
:class:`~wse.host.appliance.engines.Engine` (one system's whole step, or its
share of a SwarmX data-parallel step, in this process or under
``torchrun``), evaluates on the test split after each epoch
(``Runtime.forward``, :func:`~wse.host.appliance.evaluation.evaluate`; a run
on a cycle-level backend, the golden model or the RTL, evaluates on the
functional backend, the same bits, and says so) and checkpoints. A step on
the golden model prints a progress line every 10 seconds. Every system runs the loop and takes every step; system 0
(``engine.root``) evaluates and writes the log, the TensorBoard scalars, the
checkpoints and the summary.

Training batches are whole: each epoch visits the training split in the order
:class:`~wse.host.data.Batches` draws from ``(seed, epoch)`` and leaves out the
last ``N mod batch`` samples of that order. Evaluation covers every sample.
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable

import torch

from wse.host.memoryx import NonFiniteGradientError

from .checkpoint import decode_rng_state, encode_rng_state, latest_checkpoint, save_checkpoint
from .engines import Engine, describe_launch
from .evaluation import evaluate
from .folder import LOG_NAME, TENSORBOARD_DIR
from .options import Settings
from .pictures import FirstStep, golden_device
from .preparation import Prepared
from .report import Progress, RunSummary, Scalars, finish_run, systems_report

__all__ = ["train_loop", "optimizer_threads"]


@contextlib.contextmanager
def optimizer_threads(count: int = 1):
    """Run the block with ``torch`` limited to ``count`` intra-op threads, then restore the setting.

    MemoryX's optimizer steps are elementwise passes over tensors of at most
    a few million values: a thread team gains little there, and on a loaded
    machine (or beside the runtime's own threads) its barriers cost several
    times the work. Elementwise results do not depend on the thread count.
    """
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _new_trainer(settings: Settings) -> dict:
    return {"settings": settings.to_dict(), "step": 0, "epoch": 0, "batches": None, "torch_rng": None,
            "history": {"loss": [], "correct": [], "cycles": [], "utilization": []},
            "epochs": [], "wall_s": 0.0, "phases": {}}


def _epoch_record(trainer: dict, epoch: int, steps_per_epoch: int, batch: int, test: tuple[float, float],
                  wall_s: float) -> dict:
    hist = trainer["history"]
    losses, correct = hist["loss"][-steps_per_epoch:], hist["correct"][-steps_per_epoch:]
    return {"epoch": epoch, "step": trainer["step"], "train_loss": sum(losses) / len(losses),
            "train_accuracy": sum(correct) / (batch * len(correct)), "test_loss": test[0],
            "test_accuracy": test[1], "wall_s": wall_s}


def step_utilization(executable, phases: dict, cycles: int) -> float | None:
    """The whole step's FMAC utilization: every phase's FMACs over PEs times the step's cycles.

    The runtime's ``fmac_utilization`` counts the streamed GEMM phases only
    (their FMACs over their cycles); this one also counts the cycles of the
    other phases (loss, activations' derivatives, transfers). ``phases`` gives
    each phase's cycles summed over its runs (a layer-pipelined step runs its
    forward and backward phases once per pass), so each phase's FMACs count
    once per run. None for an executable without compiled phases."""
    if not hasattr(executable, "phases") or not hasattr(executable, "config"):
        return None
    fmacs = 0
    for name, count in phases.items():
        phase = executable.phases.get(name)
        if phase is not None:
            runs = round(int(count) / int(phase.cycles)) if phase.cycles else 1
            fmacs += int(phase.fmacs) * runs
    return float(fmacs / (executable.config.num_pes * cycles)) if cycles else 0.0


class _Lines:
    """A text stream whose lines go through :meth:`Progress.message` (under a bar, in the log, or nowhere)."""

    def __init__(self, progress: Progress):
        self.progress, self._part = progress, ""

    def write(self, text: str) -> int:
        *lines, self._part = (self._part + text).split("\n")
        for line in lines:
            self.progress.message(line)
        return len(text)

    def flush(self) -> None:
        pass


def _step_cycles(executable) -> int | None:
    """A training step's cycles by the static cycle model (None when the executable has no phases)."""
    try:
        return int(sum(executable.phases[name].cycles for name in executable.sequences["train"]))
    except (AttributeError, KeyError, TypeError):
        return None


def _eval_runtime(p: Prepared, progress: Progress):
    """The runtime that evaluates: the run's own, or for a cycle-level backend (the golden model,
    the RTL) the functional backend, which computes the same logits bit for bit in a fraction
    of the time (said in one line)."""
    if p.settings.backend == "functional" or p.settings.backend.startswith("functional-torch"):
        return p.runtime
    from . import preparation      # the one factory of runtimes (its module attribute, as tests replace it)

    progress.message(f"evaluation: on the functional backend (the same bits as the {p.settings.backend} "
                     "backend's forward pass, without simulating its cycles)")
    return preparation._open_runtime(p.executable, "functional")


def _take_step(p: Prepared, engine: Engine, trainer: dict, progress: Progress, scalars: Scalars) -> float:
    """Train on the next batch, record the step in ``trainer`` and report it; the seconds the step took."""
    from wse.sim.golden.progress import reporting

    xb, yb = p.batches.next_batch()
    tick = time.perf_counter()
    what = f"golden model, step {trainer['step'] + 1}"
    try:
        with reporting(golden_device(engine), what, _step_cycles(p.executable), stream=_Lines(progress)):
            result = engine.step(xb, yb)
    except NonFiniteGradientError as exc:
        error = type(exc)(f"step {trainer['step'] + 1}: {exc}")
        error.echo = getattr(exc, "echo", False)
        raise error from None
    seconds = time.perf_counter() - tick
    trainer["step"] += 1
    step, hist = trainer["step"], trainer["history"]
    loss, acc = result.loss, result.correct / p.settings.batch
    hist["loss"].append(loss)
    hist["correct"].append(result.correct)
    hist["cycles"].append(result.cycles)
    hist["utilization"].append(result.utilization)
    whole = step_utilization(p.executable, result.phases, result.cycles)
    if whole is not None:
        hist.setdefault("step_utilization", []).append(whole)
    trainer["phases"] = result.phases
    progress.step(step, step / p.steps_per_epoch, loss, acc, result.cycles, result.utilization, whole)
    values = {"train/loss": loss, "train/batch_accuracy": acc, "fabric/cycles_per_step": result.cycles,
              "fabric/fmac_utilization": result.utilization}
    if whole is not None:
        values["fabric/fmac_utilization_step"] = whole
    swarmx = engine.swarmx if engine.systems > 1 else None
    if swarmx is not None:
        values.update({"swarmx/broadcast_cycles_per_step": swarmx.broadcast,
                       "swarmx/reduce_cycles_per_step": swarmx.reduce,
                       "swarmx/step_cycles": swarmx.overlapped})
    scalars.add(step, values)
    return seconds


def _end_epoch(p: Prepared, engine: Engine, trainer: dict, progress: Progress, scalars: Scalars,
               wall: Callable[[], float], evaluator) -> tuple[float, float] | None:
    """Evaluate the weights at the end of an epoch; system 0 records and reports the epoch and returns
    ``(test loss, test accuracy)``, the others None. ``wall()`` gives the run's wall-clock seconds;
    ``evaluator`` is the runtime that evaluates (:func:`_eval_runtime`)."""
    epoch, step, batch = p.batches.epoch, trainer["step"], p.settings.batch   # the epoch just finished, from 1
    weights = engine.weights()
    if not engine.root:
        return None
    test = evaluate(evaluator, weights, *p.test_data, batch, what="evaluation of the test split",
                    stream=_Lines(progress))
    record = _epoch_record(trainer, epoch, p.steps_per_epoch, batch, test, wall())
    trainer["epochs"].append(record)
    scalars.add(step, {"epoch/train_loss": record["train_loss"], "epoch/train_accuracy": record["train_accuracy"],
                       "epoch/test_loss": record["test_loss"], "epoch/test_accuracy": record["test_accuracy"],
                       "epoch/epoch": epoch})
    progress.message(f"epoch {epoch}: train loss {record['train_loss']:.4f}  train acc {record['train_accuracy']:.4f}"
                     f"  test loss {record['test_loss']:.4f}  test acc {record['test_accuracy']:.4f}")
    return test


def _first_pictures(first: FirstStep, trainer: dict, progress: Progress, scalars: Scalars) -> None:
    """Write the first step's pictures (golden model) and show where they are."""
    if not first.active:
        return
    progress.message(f"pictures of step 1: drawing {len(trainer['phases'])} phases x (fmac, stalls, links) and "
                     "the timeline")
    index = first.finish(trainer["phases"])
    for phase, paths in index["phases"].items():
        scalars.add_image(1, f"fabric/fmac_utilization/{phase}", paths["fmac"])
    where = first.out
    progress.message(f"pictures of step 1: {len(index['phases'])} phases x (fmac, stalls, links) PNG in {where}, "
                     f"timeline {index['trace']}")


def train_loop(prepared: Prepared, engine: Engine, *, stream=None) -> RunSummary | None:
    """Run ``prepared`` to its end (or ``max_steps``) on this system (``engine``); system 0's summary.

    Every system of a run calls this with its own engine and its own copy
    of ``prepared`` (runtime, batches and trainer state); the engine's steps
    are collectives. System 0 writes the log, TensorBoard scalars,
    checkpoints and ``summary.json`` into ``prepared.out`` (which must have
    been started: :meth:`Prepared.start_folder`) and returns the
    :class:`RunSummary`; the other systems return None.

    Parameters
    ----------
    prepared : Prepared
        This system's view of the run; its batches and trainer state are used up.
    engine : Engine
        This system: :class:`~wse.host.appliance.engines.OneSystem` or
        :class:`~wse.host.appliance.engines.SwarmSystem`.
    stream : file, optional
        Where progress goes (default: a bar on stderr on a terminal, lines on stdout).
    """
    p, s, root = prepared, prepared.settings, engine.root
    trainer = p.trainer if p.trainer is not None else _new_trainer(s)
    trainer["settings"] = s.to_dict()
    if trainer["torch_rng"] is not None and root:
        decode_rng_state(trainer["torch_rng"])     # as if the run had never stopped
    resumed_from = trainer["step"] if p.trainer is not None else None
    spe, total, out = p.steps_per_epoch, p.total_steps, p.out
    swarmx = engine.swarmx if engine.systems > 1 else None
    scalars = Scalars(out / TENSORBOARD_DIR if p.config.tensorboard and root else None,
                      purge_step=trainer["step"] + 1)
    suffix = (f"  SwarmX broadcast {swarmx.broadcast:,} reduce {swarmx.reduce:,} step {swarmx.overlapped:,}"
              if swarmx is not None else "")
    progress = Progress(total, trainer["step"], p.config.progress if root else "none",
                        p.config.log_every or max(1, spe // 10), stream=stream,
                        log_file=out / LOG_NAME if root else None, suffix=suffix)
    checkpoint = None
    started, wall_before = time.perf_counter(), trainer["wall_s"]
    steps_before, step_s = trainer["step"], 0.0

    def wall() -> float:
        return wall_before + time.perf_counter() - started

    try:
        progress.message(f"training {p.job.path.name} on {s.dataset}: {s.mesh} mesh, {s.backend} backend, "
                         f"{describe_launch(engine)}, batch {s.batch}, {total} steps ({spe} per epoch)"
                         + (f", resumed at step {resumed_from}" if resumed_from is not None else ""))
        last_eval: tuple[float, float] | None = None
        evaluator = _eval_runtime(p, progress) if root else None
        evaluated = False
        first = FirstStep(engine, out, p.config.trace) if root and trainer["step"] == 0 else None
        if first is not None and not first.active:
            progress.message(f"pictures: none for the {s.backend} backend (per-PE heatmaps and the timeline "
                             "of the first step need --backend golden)")
        while trainer["step"] < total:
            step_s += _take_step(p, engine, trainer, progress, scalars)
            step = trainer["step"]
            if first is not None:
                _first_pictures(first, trainer, progress, scalars)
                first = None
            last_eval, evaluated = None, False
            epoch_end = p.batches.position == 0
            if epoch_end:
                last_eval, evaluated = _end_epoch(p, engine, trainer, progress, scalars, wall, evaluator), True
            every = p.config.checkpoint_every
            if epoch_end or step == total or (every and step % every == 0):
                trainer.update(epoch=p.batches.epoch, batches=p.batches.state(), torch_rng=encode_rng_state(),
                               wall_s=wall())
                checkpoint = engine.save(lambda memoryx: save_checkpoint(out, memoryx, trainer,
                                                                         keep=p.config.keep_checkpoints))
        weights = engine.weights() if not evaluated or p.config.eval_train else None
        if root:
            lines = _Lines(progress)
            test_loss, test_acc = last_eval or evaluate(evaluator, weights, *p.test_data, s.batch,
                                                        what="evaluation of the test split", stream=lines)
            train_acc = evaluate(evaluator, weights, *p.train_data, s.batch, what="evaluation of the "
                                 "training split", stream=lines)[1] if p.config.eval_train else None
        trainer["steps_per_s_after_first"] = progress.rate(trainer["step"])
    finally:
        progress.close()
        scalars.close()
    if not root:
        return None
    wall_s = wall()
    if checkpoint is None:
        checkpoint = latest_checkpoint(out)
    return finish_run(p, trainer, resumed_from, steps_before, train_acc, test_acc, test_loss, wall_s, step_s,
                      checkpoint, systems=systems_report(engine))
