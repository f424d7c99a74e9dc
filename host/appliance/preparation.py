"""The first stage of a run: read and check everything, write nothing (:func:`prepare`).

:func:`prepare` resolves the options, imports the job file, loads the data,
compiles the model in the execution mode of ``--mode`` (``auto``: the
compiler's choice, layer-pipelined when the model fits PE memory), opens the
runtime and loads the checkpoint to resume; any problem raises :class:`~wse.config.UsageError`
before the run folder is touched. The result, a :class:`Prepared` run, is
what the training loop (:func:`wse.host.appliance.loop.train_loop`) runs.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from wse.config import FabricConfig, UsageError
from wse.host.data import Batches
from wse.host.memoryx import MemoryX

from .checkpoint import latest_checkpoint, load_checkpoint
from .defects import defects_text, on_defects, runtime_backend, usable_fabric
from .folder import RunLock, check_tier_space, choose_run_folder, start_run_folder
from .job import Job, load_dataset, load_job
from .options import Settings, TrainConfig, compiler_mode, resolve_settings

__all__ = ["Prepared", "prepare", "load_run"]


def _compile(model: torch.nn.Module, example_input: torch.Tensor, fabric: FabricConfig, batch: int, *,
             mode: str = "auto", optimizer=None):
    """Compile ``model`` for training in ``mode`` (a ``--mode`` value), with ``optimizer`` on the PEs
    in the layer-pipelined mode (the compiler is imported when first needed)."""
    from wse.host.compiler import compile_model

    return compile_model(model, example_input, config=fabric, batch=batch, mode=compiler_mode(mode),
                         loss="cross_entropy", optimizer=optimizer)


def plan_text(executable: Any, settings: Settings) -> str:
    """The plan a person reads: the mode asked for and chosen, why, and the layout and memory per PE."""
    head = f"mode: {executable.mode}"
    defects = defects_text(settings)
    return "\n".join([head] + (defects.splitlines() if defects else []) + executable.summary().splitlines()) + "\n"


def _open_runtime(executable: Any, backend: str):
    from wse.host.runtime import Runtime

    return Runtime(executable, backend=backend)


class RunSteps:
    """What every prepared run (an MLP's :class:`Prepared`, a GPT's ``GptRun``) derives from its ``batches``,
    ``settings`` and ``lock``: its step counts, and the release of its run folder."""

    @property
    def steps_per_epoch(self) -> int:
        """Batches in one epoch of the training split."""
        return len(self.batches)

    @property
    def total_steps(self) -> int:
        """Steps of the whole run: the epochs' steps, capped by ``--max-steps``."""
        total = self.settings.epochs * self.steps_per_epoch
        return min(total, self.settings.max_steps) if self.settings.max_steps is not None else total

    def release_folder(self) -> None:
        """Unlock the run folder (at the end of the run, or when it stops)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


@dataclasses.dataclass
class Prepared(RunSteps):
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
    resumed: Path | None = None     # the checkpoint folder resumed from
    lock: RunLock | None = None     # the run folder's lock while system 0 runs
    dense_cycles: int | None = None     # a sparse run: the dense executable's step cycles

    def open_runtime(self):
        """A new runtime of the run's executable on its backend (each system of this process has its own)."""
        return _open_runtime(self.executable, runtime_backend(self.settings))

    def start_folder(self) -> None:
        """Create the run folder (replacing the run it holds with ``--overwrite``) and write the executable
        there; system 0 does this once all systems are prepared. The folder stays locked until
        :meth:`release_folder`."""
        self.lock = start_run_folder(self.out, self.executable, replace=self.replace_out, resumed=self.resumed)
        from .placement import write_plan
        write_plan(self.out, self.executable, plan_text(self.executable, self.settings))
        from wse.host.compiler.cycle_cache import take_report_line
        cycle_line = take_report_line()     # where the cycle counts came from: the cycle cache or replays
        if cycle_line:
            print(cycle_line)



def _fit_parameters(executable: Any, model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    params = {name: tuple(shape) for name, shape in executable.parameters().items()}
    state = model.state_dict()
    for name, shape in params.items():
        if name not in state or tuple(state[name].shape) != shape:
            raise RuntimeError(f"the executable streams parameter {name!r} of shape {shape}, "
                               f"which the model does not hold")
    return params


def resume_point(config: TrainConfig, out: Path) -> tuple[dict | None, Any, Settings | None, Path | None]:
    """What ``--resume`` continues from in run folder ``out``: the trainer state, the saved MemoryX, the saved
    settings and the checkpoint folder (all ``None`` without ``--resume``).

    Raises:
        UsageError: ``--resume`` on a folder with no checkpoint.
    """
    if not config.resume:
        return None, None, None, None
    folder = latest_checkpoint(out) if out.is_dir() else None
    if folder is None:
        raise UsageError(f"--resume: run folder {str(out)!r} has no checkpoint to resume from; "
                         "start the run again with --overwrite")
    trainer, saved_memoryx = load_checkpoint(folder)
    return trainer, saved_memoryx, Settings.from_dict(trainer.get("settings")), folder


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
    out, replace_out = choose_run_folder(config, job)
    trainer, saved_memoryx, saved, folder = resume_point(config, out)
    settings = resolve_settings(config, job, saved)
    (x_train, y_train), (x_test, y_test), model = load_run(job, settings)
    fabric = usable_fabric(settings)        # the usable mesh around --defects, else the whole mesh
    if settings.systems > 1 and settings.mode == "pipelined":
        raise UsageError(f"--systems {settings.systems} with --mode pipelined: the layer-pipelined mode keeps "
                         "the weights on one fabric and trains on one system; use --systems 1 or "
                         "--mode weight-streaming")
    mode = settings.mode
    if mode == "auto" and settings.systems > 1:     # the layer-pipelined mode trains on one system
        mode = "weight-streaming"
    if mode == "auto" and settings.backend.startswith("functional-torch"):     # it runs weight streaming only
        mode = "weight-streaming"
    masks, dense_cycles = None, None
    if settings.sparsity is not None:
        from .sparsity import sparse_compile
        executable, masks, dense_cycles = sparse_compile(model, torch.from_numpy(x_train[:settings.batch].copy()),
                                                         fabric, settings, saved_memoryx)
    else:
        executable = _compile(model, torch.from_numpy(x_train[:settings.batch].copy()), fabric, settings.batch,
                              mode=mode, optimizer=settings.optimizer_config)
    executable = on_defects(executable, settings)   # around --defects: checked and timed on the physical mesh
    # the mode auto chose is the run's: a resumed run keeps it whatever its --systems
    settings = dataclasses.replace(settings, mode=executable.mode.replace("_", "-"))
    if settings.systems > 1 and settings.mode == "pipelined":
        raise UsageError(f"--systems {settings.systems}: this run trains in the layer-pipelined mode, which "
                         "keeps the weights on one fabric; resume it with --systems 1")
    params = _fit_parameters(executable, model)
    if saved_memoryx is None:
        state = model.state_dict()
        memoryx = MemoryX.from_state_dict({name: state[name].detach().numpy().copy() for name in params},
                                          settings.optimizer_config, order=list(params))
        if masks:
            memoryx.set_masks(masks)
        batches = Batches(x_train, y_train, settings.batch, seed=settings.seed, drop_last=True)
    else:
        held = {name: saved_memoryx.shape(name) for name in saved_memoryx.names()}
        if held != params:
            raise UsageError(f"the checkpoint in {str(out)!r} holds tensors {held}, but the model of "
                             f"{job.path.name} has {params}; the job file changed since the run started")
        memoryx = saved_memoryx
        batches = Batches.from_state(x_train, y_train, trainer["batches"])
    check_tier_space(out, memoryx, config.budget_bytes, settings.systems)
    runtime = _open_runtime(executable, runtime_backend(settings))
    if settings.systems > 1:
        _check_systems(settings, executable, runtime)
    return Prepared(config, settings, job, out, replace_out, (x_train, y_train), (x_test, y_test), model,
                    executable, runtime, memoryx, batches, trainer, folder, dense_cycles=dense_cycles)


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
