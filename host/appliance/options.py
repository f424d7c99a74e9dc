"""What a training run is asked to do (:class:`TrainConfig`) and what it resolves to (:class:`Settings`).

A :class:`TrainConfig` holds the user's choices, with ``None`` for "not
given". :func:`resolve_settings` fills the gaps from the job file, then from
built-in defaults, and checks everything; a resumed run starts from the
settings recorded in its checkpoint instead, and refuses choices that would
change what the run computes.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from pathlib import Path
from typing import Any, Mapping

from wse.config import UsageError, parse_mesh
from wse.host.memoryx import OptimizerConfig, parse_size

from .job import DATASETS, Job

__all__ = ["TrainConfig", "Settings", "resolve_settings", "sparsity_settings", "PROGRESS_MODES", "DEFAULT_MESH", "DEFAULT_BACKEND",
           "MODES", "compiler_mode"]

DEFAULT_MESH = "16x16"
DEFAULT_BACKEND = "functional"
#: Execution modes of ``--mode`` (``auto``: the compiler's choice, ``docs/layer_pipelined.md``).
MODES = ("auto", "pipelined", "weight-streaming")
#: The mode runs recorded before ``--mode`` existed trained in.
_LEGACY_MODE = "weight-streaming"


def compiler_mode(mode: str) -> str:
    """The compiler's name of a ``--mode`` value (``weight-streaming`` -> ``weight_streaming``)."""
    return mode.replace("-", "_")


#: How progress is shown: a tqdm bar, log lines, nothing, or a bar on a terminal and lines elsewhere.
PROGRESS_MODES = ("auto", "bar", "lines", "none")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """A training run as asked for; ``None`` means "not given".

    Parameters
    ----------
    example : path
        The job file (see :mod:`wse.host.appliance.job`).
    out : path, optional
        The run folder. Default: ``runs/<job file stem>``, or the first free
        ``runs/<stem>-N`` when that one already holds a run (and ``resume``
        is off).
    backend : str, optional
        Runtime backend: ``"functional"`` (default), or a device of :mod:`wse.sim.devices`
        (``"golden"``, ``"vector"``, ``"verilator"``, ``"icarus"``).
    mode : {"auto", "pipelined", "weight-streaming"}, optional
        Execution mode; default ``auto``: layer-pipelined when the weights,
        the optimizer state and the in-flight activations fit PE memory,
        weight streaming otherwise.
    mesh : str, optional
        Fabric mesh ``"WxH"``; default ``"16x16"``.
    batch, epochs : int, optional
        Mini-batch size and passes over the training split; default from the
        job file (64 and 1 if it sets none).
    max_steps : int, optional
        Stop after this many optimizer steps in total (counting steps done
        before a resume), even within an epoch.
    optimizer : {"sgd", "adam", "adamw"}, optional
        Overrides the job file's optimizer; its hyper-parameters then start
        from PyTorch's defaults.
    lr, momentum, weight_decay : float, optional
        Optimizer hyper-parameters (PyTorch meaning).
    seed : int, optional
        Seeds the initial weights and the data order; default 0.
    dataset : {"mnist", "digits"}, optional
        Default from the job file.
    mnist_dir : path, optional
        A folder of MNIST IDX files instead of the bundled subset.
    resume : bool
        Continue the run in ``out`` from its latest checkpoint. The result is
        bit for bit the run that was never stopped (same backend).
    overwrite : bool
        Replace the run that ``out`` already holds.
    systems : int, optional
        Systems to train on (SwarmX data parallelism, ``docs/swarmx.md``):
        the global batch ``batch`` is shared among them, and the result is
        the single system's bit for bit. Default: 1, or under ``torchrun``
        the number of processes (``WORLD_SIZE``); a resumed run keeps its
        number unless given (it may change).
    memoryx_budget : int or str, optional
        RAM for MemoryX's weights and optimizer state per system, in bytes or
        as text such as ``"64K"``, ``"10MiB"``, ``"2GB"``; what does not fit
        lives in memory-mapped files under ``out/memoryx-disk`` (removed at
        the end of the run). Results do not change.
    swarmx_timeout : float, optional
        Seconds a system waits for a peer (to join, or within a collective)
        before the run stops with an error naming it; default 120 s to join
        and 600 s per transfer.
    checkpoint_every : int
        Also checkpoint every this many steps; 0 (default): at the end of each
        epoch and of the run only.
    keep_checkpoints : int
        Checkpoints kept in the run folder (the newest ones); default 2.
    progress : {"auto", "bar", "lines", "none"}
        ``auto``: a progress bar on a terminal, log lines otherwise.
    log_every : int, optional
        Steps between log lines; default about ten lines per epoch.
    tensorboard : bool
        Write TensorBoard event files under ``out/tensorboard``.
    eval_train : bool
        Evaluate the final weights on the whole training split too (one
        forward pass over it; turn off for slow backends).
    trace : path, optional
        Write the Perfetto timeline of step 1 here (``--backend golden``
        only: the other backends record no per-PE events).
    sparsity : float, optional
        Static unstructured weight sparsity in ``[0, 1)`` of every Linear
        layer (over the job file's ``SPARSITY``; weight streaming only).
    defects : str, optional
        ``--defects``: dead PEs and links of the mesh (``random:FRACTION,SEED``,
        ``X,Y[,PORT][;...]`` or a file; :func:`wse.sim.defects.parse_defects`);
        the model is compiled for the usable mesh they leave and runs around
        them on a device backend (``docs/faults.md`` section 4).
    """

    example: str | os.PathLike
    out: str | os.PathLike | None = None
    backend: str | None = None
    mode: str | None = None
    mesh: str | None = None
    batch: int | None = None
    epochs: int | None = None
    max_steps: int | None = None
    optimizer: str | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float | None = None
    seed: int | None = None
    dataset: str | None = None
    mnist_dir: str | os.PathLike | None = None
    resume: bool = False
    overwrite: bool = False
    systems: int | None = None
    memoryx_budget: int | str | None = None
    swarmx_timeout: float | None = None
    checkpoint_every: int = 0
    keep_checkpoints: int = 2
    progress: str = "auto"
    log_every: int | None = None
    tensorboard: bool = True
    eval_train: bool = True
    trace: str | os.PathLike | None = None
    sparsity: float | None = None
    defects: str | None = None

    def check(self) -> None:
        """Check each field on its own; raises :class:`UsageError` naming the option."""
        def integer(name: str, value: Any, low: int) -> None:
            if value is None and name not in ("checkpoint_every", "keep_checkpoints"):
                return
            if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < low:
                kind = "a positive" if low == 1 else "a non-negative"
                raise UsageError(f"--{name.replace('_', '-')} must be {kind} integer, not {value!r}")

        if not isinstance(self.example, (str, os.PathLike)):
            raise UsageError(f"example must be the path of a job file, not {self.example!r}")
        for name in ("batch", "epochs", "max_steps", "log_every", "keep_checkpoints"):
            integer(name, getattr(self, name), 1)
        for name in ("seed", "checkpoint_every"):
            integer(name, getattr(self, name), 0)
        integer("systems", self.systems, 1)
        self.budget_bytes    # checks --memoryx-budget
        timeout = self.swarmx_timeout
        if timeout is not None and (not isinstance(timeout, numbers.Real) or isinstance(timeout, bool)
                                    or not math.isfinite(timeout) or timeout <= 0):
            raise UsageError(f"--swarmx-timeout must be a positive number of seconds, not {timeout!r}")
        for name in ("lr", "momentum", "weight_decay"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, numbers.Real) or isinstance(value, bool)
                                      or not math.isfinite(value) or value < 0):
                raise UsageError(f"--{name.replace('_', '-')} must be a finite non-negative number, not {value!r}")
        if self.dataset is not None and self.dataset not in DATASETS:
            raise UsageError(f"--dataset must be one of {', '.join(DATASETS)}, not {self.dataset!r}")
        if self.mesh is not None:
            parse_mesh(self.mesh)
        if self.backend is not None and (not isinstance(self.backend, str) or not self.backend):
            raise UsageError(f"--backend must be a backend name such as functional or golden, not {self.backend!r}")
        if self.mode is not None and self.mode not in MODES:
            raise UsageError(f"--mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.progress not in PROGRESS_MODES:
            raise UsageError(f"progress must be one of {', '.join(PROGRESS_MODES)}, not {self.progress!r}")
        if self.resume and self.overwrite:
            raise UsageError("--resume and --overwrite exclude each other: continue the run or replace it")
        if self.mnist_dir is not None and not Path(self.mnist_dir).is_dir():
            raise UsageError(f"--mnist-dir {str(self.mnist_dir)!r} must be a folder of MNIST IDX files")
        if self.trace is not None:
            self._check_trace()
        if self.sparsity is not None:
            from wse.host.compiler.sparse import check_sparsity
            check_sparsity(self.sparsity, "--sparsity")
        if self.defects is not None and not self.resume:   # a resumed run's mesh is the recorded one
            from wse.sim.defects import parse_defects, plan_remap
            plan_remap(parse_defects(self.defects, *parse_mesh(self.mesh or DEFAULT_MESH)))

    def _check_trace(self) -> None:
        """``--trace FILE``: a fresh run on the golden backend, and a file name in an existing folder."""
        trace = Path(self.trace)
        if self.backend != "golden":
            raise UsageError(f"--trace needs --backend golden: the {self.backend or DEFAULT_BACKEND} backend "
                             "records no per-PE events (wse trace records one phase of a step)")
        if self.resume:
            raise UsageError("--trace records step 1 of a fresh run; a resumed run has taken it already")
        if trace.is_dir() or not trace.parent.is_dir():
            raise UsageError(f"--trace {str(trace)!r} must be a file name in an existing folder")

    @property
    def budget_bytes(self) -> int | None:
        """``memoryx_budget`` in bytes (None: no budget). Raises :class:`UsageError` for a bad size."""
        if self.memoryx_budget is None:
            return None
        try:
            return parse_size(self.memoryx_budget)
        except UsageError:
            raise UsageError(f"--memoryx-budget must be a size in bytes with an optional unit such as 64K, "
                             f"10MiB or 2GB, not {self.memoryx_budget!r}") from None


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything that decides what a run computes, resolved and checked (JSON-ready via :meth:`to_dict`).

    Members
    -------
    example, example_sha256 : str
        The job file's absolute path and hash.
    dataset : str
    mnist_dir : str or None
    backend : str
    mesh : str
        ``"WxH"``.
    batch, epochs, seed : int
    systems : int
        Systems of the invocation that wrote the settings (it may change on resume).
    mode : str
        The ``--mode`` asked for (``auto`` is resolved by the compiler, the same way on resume).
    max_steps : int or None
    optimizer : dict
        :meth:`OptimizerConfig.to_dict` form.
    sparsity : dict or None
        ``{"sparsity", "method", "seed", "layers"}`` (:func:`sparsity_settings`), None: dense.
    defects : str or None
        ``--defects``: the dead parts of the ``mesh`` (:func:`wse.sim.defects.parse_defects`);
        the run trains on the usable mesh they leave. None: a perfect mesh.
    """

    example: str
    example_sha256: str
    dataset: str
    mnist_dir: str | None
    backend: str
    mesh: str
    batch: int
    epochs: int
    max_steps: int | None
    optimizer: dict
    seed: int
    systems: int
    mode: str = _LEGACY_MODE
    sparsity: dict | None = None
    defects: str | None = None

    #: Fields a resumed run may change: they do not alter any step already taken, nor the bits of
    #: the steps to come (N systems compute one system's bits, ``docs/swarmx.md``).
    CHANGEABLE = ("example", "example_sha256", "backend", "epochs", "max_steps", "systems")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Settings":
        names = {f.name for f in dataclasses.fields(cls)}
        if isinstance(data, Mapping) and "mode" not in data:      # recorded before --mode: weight streaming
            data = {**data, "mode": _LEGACY_MODE}
        if isinstance(data, Mapping) and "sparsity" not in data:  # recorded before sparsity: dense
            data = {**data, "sparsity": None}
        if isinstance(data, Mapping) and "defects" not in data:   # recorded before defect maps: a perfect mesh
            data = {**data, "defects": None}
        if not isinstance(data, Mapping) or set(data) != names:
            raise UsageError(f"run settings must have the keys {sorted(names)}, not {data!r}")
        return cls(**data)

    @property
    def optimizer_config(self) -> OptimizerConfig:
        return OptimizerConfig.from_dict(self.optimizer)

    @property
    def mesh_shape(self) -> tuple[int, int]:
        return parse_mesh(self.mesh)


def _optimizer(base: Mapping[str, Any], config: TrainConfig) -> OptimizerConfig:
    """``base`` (a job file's ``OPTIMIZER`` or an ``OptimizerConfig.to_dict()``) with the config's choices applied."""
    if isinstance(base.get("hyper"), Mapping):
        recorded = OptimizerConfig.from_dict(base)
        name, hyper = recorded.name, dict(recorded.hyper)
    else:
        name, hyper = str(base["name"]).lower(), {k: v for k, v in base.items() if k != "name"}
    if config.optimizer is not None and config.optimizer.lower() != name:
        name, hyper = config.optimizer, {}
    for key in ("lr", "momentum", "weight_decay"):
        value = getattr(config, key)
        if value is not None:
            hyper[key] = float(value)
    return OptimizerConfig(name, **hyper)


def resolve_settings(config: TrainConfig, job: Job, saved: Settings | None = None) -> Settings:
    """The settings of a run: ``config`` over the job file's defaults, or over ``saved`` when resuming.

    Raises
    ------
    UsageError
        For a bad option, or (resuming) an option that differs from the
        recorded run in a field outside :attr:`Settings.CHANGEABLE`; the
        message names the option and both values.
    """
    config.check()
    mnist_dir = str(Path(config.mnist_dir).resolve()) if config.mnist_dir is not None else None
    if saved is None:
        return Settings(
            example=str(job.path), example_sha256=job.sha256,
            dataset=config.dataset or job.dataset, mnist_dir=mnist_dir,
            backend=config.backend or DEFAULT_BACKEND,
            mesh="x".join(map(str, parse_mesh(config.mesh or DEFAULT_MESH))),
            batch=config.batch or job.batch, epochs=config.epochs or job.epochs,
            max_steps=config.max_steps, optimizer=_optimizer(job.optimizer, config).to_dict(),
            seed=0 if config.seed is None else int(config.seed), systems=config.systems or 1,
            mode=config.mode or "auto", sparsity=sparsity_settings(job.sparsity, config.sparsity),
            defects=config.defects)
    given = {
        "dataset": config.dataset, "mnist_dir": mnist_dir,
        "mesh": "x".join(map(str, parse_mesh(config.mesh))) if config.mesh else None,
        "batch": config.batch, "seed": config.seed,
        "optimizer": _optimizer(saved.optimizer, config).to_dict(),
        "mode": None if config.mode == "auto" else config.mode,     # the run's mode is the one auto chose
        "sparsity": None if config.sparsity is None else sparsity_settings(saved.sparsity, config.sparsity),
        "defects": config.defects,
    }
    for name, value in given.items():
        if value is not None and value != getattr(saved, name):
            raise UsageError(f"--{name.replace('_', '-')} {_show(value)} differs from the run being resumed "
                             f"({_show(getattr(saved, name))}); a resumed run keeps the settings that "
                             "decide its steps")
    # max_steps is not inherited: resuming a run stopped by --max-steps goes on to its last epoch.
    return dataclasses.replace(saved, example=str(job.path), example_sha256=job.sha256,
                               backend=config.backend or saved.backend, epochs=config.epochs or saved.epochs,
                               max_steps=config.max_steps, systems=config.systems or saved.systems)


def sparsity_settings(job: Mapping[str, Any] | None, sparsity: float | None) -> dict | None:
    """The run's sparsity settings: a job file's ``SPARSITY`` (or a run's recorded
    settings) with ``--sparsity`` over its global level; None: dense.

    Raises
    ------
    UsageError
        For a sparsity outside ``[0, 1)``, an unknown method, a non-integer seed
        or a bad ``layers`` entry.
    """
    from wse.host.compiler.sparse import MASK_KINDS, check_sparsity

    if job is None and sparsity is None:
        return None
    base = dict(job or {})
    unknown = sorted(set(base) - {"sparsity", "method", "seed", "layers"})
    if unknown:
        raise UsageError(f"SPARSITY has unknown keys {unknown}; it takes sparsity, method, seed and layers")
    level = check_sparsity(base.get("sparsity", 0.0) if sparsity is None else sparsity,
                           "--sparsity" if sparsity is not None else "SPARSITY's sparsity")
    method = base.get("method", "magnitude")
    if method not in MASK_KINDS:
        raise UsageError(f"SPARSITY's method must be one of {', '.join(MASK_KINDS)}, not {method!r}")
    seed = base.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise UsageError(f"SPARSITY's seed must be an integer, not {seed!r}")
    layers = base.get("layers") or {}
    if not isinstance(layers, Mapping):
        raise UsageError(f"SPARSITY's layers must map weight names to sparsities, not {layers!r}")
    layers = {str(name): check_sparsity(value, f"the sparsity of {name}") for name, value in layers.items()}
    if level == 0 and not any(layers.values()):
        return None
    return {"sparsity": level, "method": method, "seed": seed, "layers": layers}


def _show(value: Any) -> str:
    if isinstance(value, Mapping) and "name" in value and "hyper" in value:
        return repr(OptimizerConfig.from_dict(value))
    return repr(value)
