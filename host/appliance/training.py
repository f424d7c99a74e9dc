"""The appliance's training loop: a job file in; checkpoints, TensorBoard scalars and a summary out.

:func:`train` does everything ``wse train`` does. A run has two stages:

1. :func:`prepare` reads and checks everything (options, job file, data,
   compilation onto the fabric, the checkpoint to resume) and writes nothing;
   any problem raises :class:`~wse.config.UsageError` before the run folder is
   touched.
2. The loop streams each mini-batch through the fabric (``Runtime.train_step``
   with the weights MemoryX holds), hands the gradients to MemoryX for the
   optimizer step, evaluates on the test split after each epoch
   (``Runtime.forward``) and checkpoints. With ``systems`` > 1 the loop runs
   on every system and each step is a SwarmX data-parallel step
   (:mod:`~wse.host.appliance.systems`); system 0 evaluates and writes.

Training batches are whole: each epoch visits the training split in the order
:class:`~wse.host.data.Batches` draws from ``(seed, epoch)`` and leaves out the
last ``N mod batch`` samples of that order. Evaluation covers every sample:
the last batch is padded with zero rows whose logits are ignored.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from wse.config import FabricConfig, UsageError
from wse.host.data import Batches
from wse.host.memoryx import MemoryX, NonFiniteGradientError

from .checkpoint import CHECKPOINTS, decode_rng_state, encode_rng_state, latest_checkpoint, load_checkpoint, \
    save_checkpoint
from .job import Job, load_dataset, load_job
from .options import Settings, TrainConfig, resolve_settings
from .report import (ELASTIC_NAME, EXECUTABLE_NAME, FABRIC_NAME, LOG_NAME, SCRATCH_DIR, SUMMARY_NAME,
                     TENSORBOARD_DIR, Progress, RunSummary, Scalars, finish_run)

__all__ = ["RunSummary", "Prepared", "prepare", "run", "train", "evaluate", "load_run", "optimizer_threads",
           "SUMMARY_NAME", "EXECUTABLE_NAME"]

_OWNED = (SUMMARY_NAME, EXECUTABLE_NAME, CHECKPOINTS, TENSORBOARD_DIR, LOG_NAME, FABRIC_NAME, ELASTIC_NAME,
          SCRATCH_DIR)


# ------------------------------------------------------------------ the core's entry points
def _compile(model: torch.nn.Module, example_input: torch.Tensor, fabric: FabricConfig, batch: int):
    """Compile ``model`` for weight-streaming training (the compiler is imported when first needed)."""
    from wse.host.compiler import compile_model

    return compile_model(model, example_input, config=fabric, batch=batch, mode="weight_streaming",
                         loss="cross_entropy")


def _open_runtime(executable: Any, backend: str):
    from wse.host.runtime import Runtime

    return Runtime(executable, backend=backend)


@dataclasses.dataclass
class Prepared:
    """A checked run, ready to start; nothing has been written yet (see :func:`prepare`)."""

    config: TrainConfig
    settings: Settings
    job: Job
    out: Path
    replace_out: bool
    train_data: tuple[np.ndarray, np.ndarray]
    test_data: tuple[np.ndarray, np.ndarray]
    model: torch.nn.Module
    executable: Any
    runtime: Any
    memoryx: Any                # the whole MemoryX; while training, this system's (a ShardedMemoryX on N systems)
    batches: Batches
    trainer: dict | None        # the resumed checkpoint's trainer state

    @property
    def steps_per_epoch(self) -> int:
        return len(self.batches)

    @property
    def total_steps(self) -> int:
        total = self.settings.epochs * self.steps_per_epoch
        return min(total, self.settings.max_steps) if self.settings.max_steps is not None else total


# ------------------------------------------------------------------ preparation
def _holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds anything a run writes (even a run interrupted before its first checkpoint)."""
    return any((folder / name).exists() for name in _OWNED)


def _is_empty(folder: Path) -> bool:
    return not folder.exists() or (folder.is_dir() and not any(folder.iterdir()))


def _run_folder(config: TrainConfig, job: Job) -> tuple[Path, bool]:
    """The run folder and whether an existing run there is to be replaced."""
    if config.out is None:
        base = Path("runs") / job.path.stem
        if config.resume or config.overwrite:
            return base, config.overwrite and not _is_empty(base)
        candidate, n = base, 1
        while not _is_empty(candidate):
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        return candidate, False
    out = Path(config.out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r} is a file; expected a run folder")
    if config.resume or _is_empty(out):
        return out, False
    if not config.overwrite:
        raise UsageError(f"run folder {str(out)!r} is not empty; pass --resume to continue its run, "
                         "--overwrite to replace it, or another --out")
    if not _holds_run(out):
        raise UsageError(f"--overwrite refuses to clear {str(out)!r}: it holds no run "
                         f"(none of {', '.join(_OWNED)})")
    return out, True


def _fit_parameters(executable: Any, model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    params = {name: tuple(shape) for name, shape in executable.parameters().items()}
    state = model.state_dict()
    for name, shape in params.items():
        if name not in state or tuple(state[name].shape) != shape:
            raise RuntimeError(f"the executable streams parameter {name!r} of shape {shape}, "
                               f"which the model does not hold")
    return params


def load_run(job: Job, settings: Settings) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray],
                                                     torch.nn.Module]:
    """The training and test splits of a run and its model with its initial weights.

    The model gets the data's feature count and class count, and ``torch``
    is seeded with the run's seed just before it is built.
    """
    train_data = load_dataset(settings.dataset, "train", settings.mnist_dir)
    test_data = load_dataset(settings.dataset, "test", settings.mnist_dir)
    if settings.batch > len(train_data[0]):
        raise UsageError(f"--batch {settings.batch} exceeds the {len(train_data[0])} training samples of "
                         f"{settings.dataset}")
    classes = int(max(train_data[1].max(), test_data[1].max())) + 1
    return train_data, test_data, job.model(train_data[0].shape[1], classes, settings.seed)


def prepare(config: TrainConfig) -> Prepared:
    """Check and load everything a run needs, without writing anything.

    Raises
    ------
    UsageError
        For a bad option, job file, data set or checkpoint, a model the
        compiler cannot map (``UnsupportedModelError``: every problem listed)
        or one that does not fit the fabric.
    """
    if not isinstance(config, TrainConfig):
        raise UsageError(f"config must be a TrainConfig, not {type(config).__name__}")
    config.check()
    job = load_job(config.example)
    out, replace_out = _run_folder(config, job)
    trainer, saved_memoryx, saved = None, None, None
    if config.resume:
        folder = latest_checkpoint(out) if out.is_dir() else None
        if folder is None:
            raise UsageError(f"--resume: run folder {str(out)!r} has no checkpoint to resume from; "
                             "start the run again with --overwrite")
        trainer, saved_memoryx = load_checkpoint(folder)
        saved = Settings.from_dict(trainer.get("settings"))
    settings = resolve_settings(config, job, saved)
    (x_train, y_train), (x_test, y_test), model = load_run(job, settings)
    width, height = settings.mesh_shape
    fabric = FabricConfig(width=width, height=height)
    executable = _compile(model, torch.from_numpy(x_train[:settings.batch].copy()), fabric, settings.batch)
    params = _fit_parameters(executable, model)
    if saved_memoryx is None:
        state = model.state_dict()
        memoryx = MemoryX.from_state_dict({name: state[name].detach().numpy().copy() for name in params},
                                          settings.optimizer_config, order=list(params))
        batches = Batches(x_train, y_train, settings.batch, seed=settings.seed, drop_last=True)
    else:
        held = {name: saved_memoryx.shape(name) for name in saved_memoryx.names()}
        if held != params:
            raise UsageError(f"the checkpoint in {str(out)!r} holds tensors {held}, but the model of "
                             f"{job.path.name} has {params}; the job file changed since the run started")
        memoryx = saved_memoryx
        batches = Batches.from_state(x_train, y_train, trainer["batches"])
    runtime = _open_runtime(executable, settings.backend)
    if settings.systems > 1:
        _check_systems(settings, executable, runtime)
    return Prepared(config, settings, job, out, replace_out, (x_train, y_train), (x_test, y_test), model,
                    executable, runtime, memoryx, batches, trainer)


def _check_systems(settings: Settings, executable: Any, runtime: Any) -> None:
    """Raise :class:`UsageError` unless ``settings.systems`` systems can share the run's steps."""
    from wse.host.swarmx import token_blocks

    systems = settings.systems
    if not getattr(runtime, "supports_shards", False):
        raise UsageError(f"--systems {systems} needs a backend that runs part of a step (Runtime.train_shard: "
                         f"the functional backend); the {settings.backend} backend runs whole steps only")
    columns = len(token_blocks(executable))
    if systems > columns:
        raise UsageError(f"--systems {systems} exceeds the {columns} token columns of a batch of {settings.batch} "
                         f"on the {settings.mesh} mesh (each system takes whole columns); use at most {columns} "
                         "systems, a larger --batch or a wider --mesh")


# ------------------------------------------------------------------ evaluation
def _cross_entropy(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-sample softmax cross-entropy in float64."""
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(y)), y]


def evaluate(runtime: Any, weights: Mapping[str, np.ndarray], x: np.ndarray, y: np.ndarray,
             batch: int) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of ``runtime.forward`` over all of ``(x, y)``.

    The samples go through in batches of ``batch``; the last one is padded
    with zero rows whose logits are dropped.
    """
    losses, correct = 0.0, 0
    for start in range(0, len(x), batch):
        xb, yb = x[start:start + batch], y[start:start + batch]
        if len(xb) < batch:
            xb = np.concatenate([xb, np.zeros((batch - len(xb),) + xb.shape[1:], dtype=np.float32)])
        logits = np.asarray(runtime.forward(np.ascontiguousarray(xb, dtype=np.float32), weights))[:len(yb)]
        losses += float(_cross_entropy(logits, yb).sum())
        correct += int((logits.argmax(axis=1) == yb).sum())
    return losses / len(x), correct / len(x)


# ------------------------------------------------------------------ the loop
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


def _start_folder(prepared: Prepared) -> None:
    out = prepared.out
    if prepared.replace_out:
        for name in _OWNED:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    executable = prepared.executable
    if callable(getattr(executable, "summary", None)):
        (out / FABRIC_NAME).write_text(str(executable.summary()) + "\n", encoding="utf-8")
    if callable(getattr(executable, "save", None)):
        executable.save(out / EXECUTABLE_NAME)     # runs without the job file: Executable.load


def train(config: TrainConfig, *, stream=None) -> RunSummary | None:
    """Train the job of ``config`` on the fabric; see the module notes.

    Under ``torchrun`` this process is one system of the run (gloo);
    otherwise ``config.systems`` systems run in this process.

    Parameters
    ----------
    config : TrainConfig
    stream : file, optional
        Where progress goes (default: a bar on stderr on a terminal, lines on stdout).

    Returns
    -------
    RunSummary or None
        The summary; None in the processes of systems other than 0 under ``torchrun``.

    Raises
    ------
    UsageError
        As :func:`prepare` (then nothing is written), for a non-finite
        gradient during training (the last checkpoint stays valid), or a
        SwarmX peer that is missing or stopped (:class:`~wse.host.swarmx.PeerError`).
    """
    from .systems import detect_launch, train_gloo

    if not isinstance(config, TrainConfig):
        raise UsageError(f"config must be a TrainConfig, not {type(config).__name__}")
    config.check()
    launch = detect_launch(config)
    if launch.transport == "gloo":
        return train_gloo(config, launch, stream)
    return run(prepare(config), stream=stream)


def run(prepared: Prepared, *, stream=None) -> RunSummary:
    """Run a :class:`Prepared` run to its end (or ``max_steps``) and write its summary.

    ``prepared.settings.systems`` systems run in this process (as threads
    when more than one); ``prepared`` is used up.
    """
    from .systems import run_systems

    with optimizer_threads(1):
        return run_systems(prepared, stream)


def _run(prepared: Prepared, stream, engine) -> RunSummary | None:
    """The training loop of one system (``engine``): every system takes every step; system 0 writes."""
    from .systems import describe_launch

    p, s, root = prepared, prepared.settings, engine.root
    trainer = p.trainer if p.trainer is not None else _new_trainer(s)
    trainer["settings"] = s.to_dict()
    if trainer["torch_rng"] is not None and root:
        decode_rng_state(trainer["torch_rng"])     # as if the run had never stopped
    resumed_from = trainer["step"] if p.trainer is not None else None
    spe, total, batch = p.steps_per_epoch, p.total_steps, s.batch
    out = p.out
    swarmx = engine.swarmx if engine.systems > 1 else None
    scalars = Scalars(out / TENSORBOARD_DIR if p.config.tensorboard and root else None,
                      purge_step=trainer["step"] + 1)
    suffix = (f"  SwarmX broadcast {swarmx.broadcast:,} reduce {swarmx.reduce:,} step {swarmx.overlapped:,}"
              if swarmx is not None else "")
    progress = Progress(total, trainer["step"], p.config.progress if root else "none",
                        p.config.log_every or max(1, spe // 10), stream=stream,
                        log_file=out / LOG_NAME if root else None, suffix=suffix)
    hist = trainer["history"]
    checkpoint = None
    started, wall_before = time.perf_counter(), trainer["wall_s"]
    steps_before, step_s = trainer["step"], 0.0
    try:
        progress.message(f"training {p.job.path.name} on {s.dataset}: {s.mesh} mesh, {s.backend} backend, "
                         f"{describe_launch(engine)}, batch {batch}, {total} steps ({spe} per epoch)"
                         + (f", resumed at step {resumed_from}" if resumed_from is not None else ""))
        last_eval: tuple[float, float] | None = None
        evaluated = False
        while trainer["step"] < total:
            xb, yb = p.batches.next_batch()
            tick = time.perf_counter()
            try:
                result = engine.step(xb, yb)
            except NonFiniteGradientError as exc:
                error = type(exc)(f"step {trainer['step'] + 1}: {exc}")
                error.echo = getattr(exc, "echo", False)
                raise error from None
            step_s += time.perf_counter() - tick
            trainer["step"] += 1
            step = trainer["step"]
            loss, acc = result.loss, result.correct / batch
            hist["loss"].append(loss)
            hist["correct"].append(result.correct)
            hist["cycles"].append(result.cycles)
            hist["utilization"].append(result.utilization)
            trainer["phases"] = result.phases
            progress.step(step, step / spe, loss, acc, result.cycles, result.utilization)
            values = {"train/loss": loss, "train/batch_accuracy": acc, "fabric/cycles_per_step": result.cycles,
                      "fabric/fmac_utilization": result.utilization}
            if swarmx is not None:
                values.update({"swarmx/broadcast_cycles_per_step": swarmx.broadcast,
                               "swarmx/reduce_cycles_per_step": swarmx.reduce,
                               "swarmx/step_cycles": swarmx.overlapped})
            scalars.add(step, values)
            last_eval, evaluated = None, False
            epoch_end = p.batches.position == 0
            if epoch_end:
                epoch = p.batches.epoch         # the epoch just finished, counting from 1
                weights, evaluated = engine.weights(), True
                if root:
                    last_eval = evaluate(p.runtime, weights, *p.test_data, batch)
                    wall = wall_before + time.perf_counter() - started
                    record = _epoch_record(trainer, epoch, spe, batch, last_eval, wall)
                    trainer["epochs"].append(record)
                    scalars.add(step, {"epoch/train_loss": record["train_loss"],
                                       "epoch/train_accuracy": record["train_accuracy"],
                                       "epoch/test_loss": record["test_loss"],
                                       "epoch/test_accuracy": record["test_accuracy"], "epoch/epoch": epoch})
                    progress.message(f"epoch {epoch}: train loss {record['train_loss']:.4f}  "
                                     f"train acc {record['train_accuracy']:.4f}  test loss "
                                     f"{record['test_loss']:.4f}  test acc {record['test_accuracy']:.4f}")
            every = p.config.checkpoint_every
            if epoch_end or step == total or (every and step % every == 0):
                trainer.update(epoch=p.batches.epoch, batches=p.batches.state(), torch_rng=encode_rng_state(),
                               wall_s=wall_before + time.perf_counter() - started)
                checkpoint = engine.save(lambda memoryx: save_checkpoint(out, memoryx, trainer,
                                                                         keep=p.config.keep_checkpoints))
        weights = engine.weights() if not evaluated or p.config.eval_train else None
        if root:
            test_loss, test_acc = last_eval or evaluate(p.runtime, weights, *p.test_data, batch)
            train_acc = evaluate(p.runtime, weights, *p.train_data, batch)[1] if p.config.eval_train else None
    finally:
        progress.close()
        scalars.close()
    if not root:
        return None
    wall = wall_before + time.perf_counter() - started
    if checkpoint is None:
        checkpoint = latest_checkpoint(out)
    return finish_run(p, trainer, resumed_from, steps_before, train_acc, test_acc, test_loss, wall, step_s,
                      checkpoint, systems=_systems_report(engine))


def _systems_report(engine) -> dict:
    """The summary's ``"systems"`` entry: count, transport, SwarmX link figures, MemoryX tiers."""
    report = {"count": engine.systems, "transport": engine.transport, "swarmx": None,
              "memoryx": engine.memoryx_report()}
    if engine.swarmx is not None:
        links = engine.links
        report["swarmx"] = {"link": {"wavelets_per_cycle": links.wavelets_per_cycle,
                                     "hop_latency": links.hop_latency, "fanout": links.fanout},
                            "reduce_order": "chain", **engine.swarmx.to_dict()}
    return report
