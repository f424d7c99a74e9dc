"""A GPT run's training loop, its systems and its summary (:func:`gpt_loop`, called by :func:`~.training.train_gpt`).

Each step takes the next batch of sequences (:class:`~wse.host.data.Batches`
over the training split's windows, the order drawn from ``(seed, epoch)``),
streams MemoryX's weights to the systems, runs the functional model's
forward and backward pass on each system's columns
(:meth:`~wse.host.runtime.transformer_reference.TransformerReference.shard`),
joins the gradients in the fixed order (:class:`GptSystems`) and hands them
to MemoryX for the optimizer step. On a device backend the step is the
compiled fabric phases instead (:attr:`GptRun.fabric`, the same bits). Every ``log_every`` steps the loop prints
the mean training loss since the last line and the validation loss on a
fixed choice of validation sequences; at each epoch's end, the validation
loss on the whole validation split; all in nats per character beside the
corpus's unigram entropy (the loss of the best model that ignores context).
Checkpoints, TensorBoard scalars, ``train.log`` and ``summary.json`` are the
MLP run's (:mod:`~wse.host.appliance.checkpoint`, :mod:`~wse.host.appliance.report`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

import numpy as np

from wse.config import UsageError
from wse.host.memoryx import NonFiniteGradientError
from wse.host.swarmx import column_shards, run_inprocess

from .checkpoint import latest_checkpoint, save_checkpoint
from .folder import LOG_NAME, SUMMARY_NAME, TENSORBOARD_DIR
from .gpt import GptRun
from .report import Progress, Scalars, loss_curve, optimizer_text, write_json

__all__ = ["GptSystems", "GptSummary", "gpt_loop", "text_loss"]


#: Sequences per forward pass when a run evaluates (at least the training batch).
EVAL_BATCH = 64


def text_loss(reference, weights, x: np.ndarray, y: np.ndarray, batch: int = EVAL_BATCH) -> float:
    """Mean next-character cross-entropy (nats) of the sequences ``x`` with targets ``y``,
    ``batch`` sequences per forward pass of the functional model (each sequence's
    logits are its own: the batch size does not change them)."""
    from wse.host.runtime.loss import cross_entropy

    losses = []
    for start in range(0, len(x), batch):
        logits = reference.logits(weights, x[start:start + batch])
        losses.append(cross_entropy(logits.reshape(-1, logits.shape[-1]), y[start:start + batch].reshape(-1)))
    return float(np.mean(np.concatenate(losses)))


class GptSystems:
    """The systems of a GPT run: one, or N in this process joined by SwarmX.

    System ``r`` takes the columns :func:`~wse.host.swarmx.column_shards` deals it
    (their sequences of the batch). A step broadcasts the weights from system
    0, each system runs its share, and system 0 receives the gradients: each
    parameter's column partial sums chained in column order
    (``Group.reduce_partials``, the order one system uses), each embedding
    table's rows from every token's gradient in token order (gathered), and
    the loss as the mean of every token's (gathered). N systems therefore
    give one system's bits.
    """

    def __init__(self, run: GptRun):
        self.reference, self.layout, self.fabric = run.reference, run.layout, run.fabric
        self.count = run.settings.systems
        self.shards = column_shards(len(self.layout.columns), self.count)

    def step(self, x: np.ndarray, y: np.ndarray, weights: dict[str, np.ndarray]) -> tuple[float, dict]:
        """``(loss, gradients)`` of the batch ``x``, ``y`` (``[B, T]`` ids) at ``weights``."""
        if self.fabric is not None:                  # the fabric phases on the run's device
            result = self.fabric.step(weights, x, y)
            return result.loss, result.grads
        if self.count == 1:
            shard = self.reference.shard(weights, x, y, count=x.size, blocks=self.layout.blocks())
            return float(np.mean(shard.losses)), self.reference.combine([shard])
        return run_inprocess(self._system, self.count, x, y, weights)[0]

    def _system(self, group, x: np.ndarray, y: np.ndarray, weights: dict[str, np.ndarray]):
        rank, root = group.rank, group.rank == 0
        local = {}
        for name, value in weights.items():
            local[name] = np.array(value, dtype=np.float32) if root else np.empty(value.shape, np.float32)
            group.broadcast(local[name], 0)
        columns = self.shards[rank]
        mine = self.layout.sequences(columns)
        shard = self.reference.shard(local, x[mine], y[mine], count=x.size, blocks=self.layout.blocks(columns))
        grads = {}
        for name in sorted(shard.partials):
            out = np.empty(shard.partials[name].shape[1:], np.float32) if root else None
            group.reduce_partials(shard.partials[name], 0, out=out)
            grads[name] = out
        tokens = [sum(self.layout.columns[c] for c in shard) * x.shape[1] for shard in self.shards]
        for name in sorted(shard.rows):
            dx, index, rows = shard.rows[name]
            parts = [np.empty((n, dx.shape[1]), np.float32) for n in tokens] if root else None
            where = [np.empty(n, index.dtype) for n in tokens] if root else None
            group.gather(np.ascontiguousarray(dx), parts, 0)
            group.gather(np.ascontiguousarray(index), where, 0)
            if root:
                grads[name] = _rows(np.concatenate(parts), np.concatenate(where), rows)
        losses = [np.empty(n, np.float64) for n in tokens] if root else None
        group.gather(np.ascontiguousarray(shard.losses, dtype=np.float64), losses, 0)
        return (float(np.mean(np.concatenate(losses))), grads) if root else None


#: How each backend runs a GPT step, for the run's summary.
_BACKEND_NOTE = {"functional": "the functional model of the transformer's float order"}
_FABRIC_NOTE = "the training step's fabric phases on the device; evaluations on the functional model, the same bits"


def _rows(dx: np.ndarray, index: np.ndarray, rows: int) -> np.ndarray:
    from wse.firmware.training import transformer as ops
    from wse.host.runtime import transformer_kernels as tk

    return ops.floats(tk.embedding_rows_grad(ops.bits(dx), index, rows))


@dataclasses.dataclass(frozen=True)
class GptSummary:
    """What a GPT run did (also ``out/summary.json``).

    Members
    -------
    out : pathlib.Path
    steps, total_steps : int
        Steps done (all invocations) and the steps this invocation aimed for.
    complete : bool
        Whether every epoch is done.
    validation_loss : float
        Mean next-character loss of the final weights on the whole validation split (nats).
    unigram_entropy : float
        The training characters' entropy (nats): the loss of a model that ignores context.
    wall_s : float
        Seconds spent training, all invocations together.
    data : dict
        The whole summary.
    """

    out: Path
    steps: int
    total_steps: int
    complete: bool
    validation_loss: float
    unigram_entropy: float
    wall_s: float
    data: dict

    def describe(self) -> str:
        """A few lines for people."""
        s, files = self.data["settings"], self.data["files"]
        state = "complete" if self.complete else f"stopped at step {self.steps} (--max-steps)"
        lines = [
            f"trained {self.data['model']} ({self.data['parameter_count']:,} parameters) on {s['dataset']} "
            f"for {self.steps} steps ({self.data['epochs_completed']:.2f} epochs, batch {s['batch']} x "
            f"{self.data['context']} characters, {self.data['optimizer']}), {state}",
            f"  backend     : {s['backend']} ({_BACKEND_NOTE.get(s['backend'], _FABRIC_NOTE)}), "
            f"{self.data['systems']} system(s), {s['mesh']} mesh layout",
            f"  loss        : validation {self.validation_loss:.4f} nats/char, unigram entropy "
            f"{self.unigram_entropy:.4f} ({self.validation_loss - self.unigram_entropy:+.4f}); last training "
            f"steps {self.data['loss']['last_mean']:.4f}",
            f"  wall time   : {self.wall_s:.1f} s ({1000 * self.data['step_time_s']:.0f} ms/step)",
            f"  summary     : {files['summary']}",
            f"  checkpoint  : {files['checkpoint']}",
            f"  sample      : wse generate {files['run']} --prompt \"...\"",
        ]
        if files.get("tensorboard"):
            lines.append(f"  tensorboard : tensorboard --logdir {files['tensorboard']}")
        return "\n".join(lines)


def _new_trainer(run: GptRun) -> dict:
    return {"settings": run.settings.to_dict(), "step": 0, "epoch": 0, "batches": None, "torch_rng": None,
            "history": {"loss": [], "validation": []}, "epochs": [], "wall_s": 0.0, "phases": {}}


def _weights(run: GptRun) -> dict[str, np.ndarray]:
    return {name: run.memoryx.weight(name) for name in run.memoryx.names()}


class _Reports:
    """The loop's lines, scalars and log."""

    def __init__(self, run: GptRun, trainer: dict, stream):
        c = run.config
        self.run, self.entropy = run, run.corpus.unigram_entropy()
        self.every = c.log_every or max(1, run.steps_per_epoch // 10)
        self.progress = Progress(run.total_steps, trainer["step"], "none" if c.progress == "none" else "lines",
                                 self.every, stream=stream, log_file=run.out / LOG_NAME)
        self.scalars = Scalars(run.out / TENSORBOARD_DIR if c.tensorboard else None, purge_step=trainer["step"] + 1)
        self.recent: list[float] = []
        self.started = time.perf_counter()

    def step(self, step: int, loss: float) -> float | None:
        """Record a step's loss; every ``log_every`` steps (and at the last) print a line and return
        the validation loss on the fixed validation sequences (else None)."""
        self.recent.append(loss)
        self.scalars.add(step, {"train/loss": loss})
        if step % self.every and step != self.run.total_steps:
            return None
        probe = text_loss(self.run.reference, _weights(self.run), *self.run.probe)
        self.scalars.add(step, {"validation/probe_loss": probe, "train/unigram_entropy": self.entropy})
        self.progress.message(
            f"step {step}/{self.run.total_steps} ({time.perf_counter() - self.started:.0f} s): train loss "
            f"{np.mean(self.recent):.4f}, validation loss {probe:.4f} on {len(self.run.probe[0])} sequences "
            f"(unigram entropy {self.entropy:.4f} nats/char)")
        self.recent = []
        return probe

    def epoch(self, trainer: dict, epoch: int) -> float:
        run = self.run
        val = text_loss(run.reference, _weights(run), *run.validation)
        losses = trainer["history"]["loss"][-run.steps_per_epoch:]
        record = {"epoch": epoch, "step": trainer["step"], "train_loss": float(np.mean(losses)),
                  "validation_loss": val, "unigram_entropy": self.entropy}
        trainer["epochs"].append(record)
        self.scalars.add(trainer["step"], {"epoch/train_loss": record["train_loss"], "epoch/validation_loss": val,
                                           "epoch/unigram_entropy": self.entropy, "epoch/epoch": epoch})
        self.progress.message(f"epoch {epoch}: train loss {record['train_loss']:.4f}, validation loss {val:.4f} "
                              f"nats/char on the whole validation split ({len(run.validation[0])} sequences), "
                              f"unigram entropy {self.entropy:.4f}")
        return val

    def close(self) -> None:
        self.progress.close()
        self.scalars.close()


def gpt_loop(run: GptRun, *, stream=None) -> GptSummary:
    """Train ``run`` (its folder started: :meth:`GptRun.start_folder`) to its end or ``max_steps``;
    write checkpoints, scalars, the log and the summary."""
    s, out = run.settings, run.out
    trainer = run.trainer if run.trainer is not None else _new_trainer(run)
    trainer["settings"] = s.to_dict()
    resumed_from = trainer["step"] if run.trainer is not None else None
    systems, reports = GptSystems(run), _Reports(run, trainer, stream)
    started, wall_before, steps_before, step_s = time.perf_counter(), trainer["wall_s"], trainer["step"], 0.0
    checkpoint, validation = None, None
    try:
        reports.progress.message(
            f"training {run.job.path.name} ({run.graph.parameter_count:,} parameters) on {s.dataset} "
            f"({run.corpus.source}): {len(run.train_data[0]):,} training sequences of {run.job.context}, "
            f"{s.backend} backend, {s.systems} system(s), batch {s.batch}, {run.total_steps} steps "
            f"({run.steps_per_epoch} per epoch)" + (f", resumed at step {resumed_from}" if resumed_from else ""))
        while trainer["step"] < run.total_steps:
            xb, yb = run.batches.next_batch()
            tick = time.perf_counter()
            loss, grads = systems.step(xb, yb, _weights(run))
            try:
                run.memoryx.apply_gradients(grads)
            except NonFiniteGradientError as exc:
                raise type(exc)(f"step {trainer['step'] + 1}: {exc}") from None
            step_s += time.perf_counter() - tick
            trainer["step"] += 1
            step = trainer["step"]
            trainer["history"]["loss"].append(loss)
            probe = reports.step(step, loss)
            if probe is not None:
                trainer["history"]["validation"].append([step, probe])
            validation = None
            epoch_end = run.batches.position == 0
            if epoch_end:
                validation = reports.epoch(trainer, run.batches.epoch)
            every = run.config.checkpoint_every
            if epoch_end or step == run.total_steps or (every and step % every == 0):
                trainer.update(epoch=run.batches.epoch, batches=run.batches.state(),
                               wall_s=wall_before + time.perf_counter() - started)
                checkpoint = save_checkpoint(out, run.memoryx, trainer, keep=run.config.keep_checkpoints)
        if validation is None:
            validation = text_loss(run.reference, _weights(run), *run.validation)
    finally:
        reports.close()
    wall = wall_before + time.perf_counter() - started
    return _finish(run, trainer, resumed_from, trainer["step"] - steps_before, step_s, validation, wall,
                   checkpoint or latest_checkpoint(out), reports.entropy)


def _finish(run: GptRun, trainer: dict, resumed_from, ran: int, step_s: float, validation: float, wall: float,
            checkpoint, entropy: float) -> GptSummary:
    s, out, hist = run.settings, run.out, trainer["history"]
    params = {name: list(run.memoryx.shape(name)) for name in run.memoryx.names()}
    step = trainer["step"]
    curve = loss_curve(hist["loss"], run.steps_per_epoch)
    tail = hist["loss"][-max(1, run.steps_per_epoch // 10):]
    curve["last_mean"] = float(np.mean(tail)) if tail else math.nan
    data = {
        "format": "wse.appliance.summary", "version": 1, "kind": "gpt",
        "settings": s.to_dict(), "model": run.graph.name, "parameters": params,
        "parameter_count": int(run.graph.parameter_count), "optimizer": optimizer_text(s.optimizer_config),
        "corpus": run.corpus.source, "vocab": run.corpus.vocab_size, "context": run.job.context,
        "layout": {"rows": run.layout.rows, "columns": run.layout.columns},
        "systems": s.systems, "backend": s.backend, "mesh": s.mesh,
        "steps": step, "total_steps": run.total_steps, "steps_per_epoch": run.steps_per_epoch,
        "epochs_completed": step / run.steps_per_epoch, "complete": step >= s.epochs * run.steps_per_epoch,
        "resumed_from": resumed_from, "validation_loss": validation, "unigram_entropy": entropy,
        "unigram_validation_loss": run.corpus.unigram_validation_loss(),
        "loss": curve, "validation_probe": hist["validation"], "epochs": trainer["epochs"],
        "wall_s": wall, "step_time_s": step_s / ran if ran else 0.0,
        "files": {"run": str(out), "summary": str(out / SUMMARY_NAME),
                  "checkpoint": str(checkpoint) if checkpoint else None,
                  "tensorboard": str(out / TENSORBOARD_DIR) if run.config.tensorboard else None,
                  "log": str(out / LOG_NAME)},
    }
    write_json(out / SUMMARY_NAME, data)
    return GptSummary(out, step, run.total_steps, data["complete"], validation, entropy, wall, data)


def check_gpt_launch(transport: str) -> None:
    """A GPT run trains its systems in one process (``--systems N``); refuse ``torchrun``."""
    if transport != "inprocess":
        raise UsageError("a transformer (GPT) job trains its systems in one process: run wse train FILE --systems N "
                         "instead of under torchrun")
