"""The run folder: what a run leaves in it, which folder a run takes, and starting it.

A run folder holds ``summary.json``, ``train.log``, ``fabric.txt``,
``executable.npz``, ``tensorboard/``, ``checkpoints/`` and, while some runs
train, ``elastic.json`` and ``memoryx-disk/`` (:data:`OWNED`). A folder that
holds none of these holds no run, and ``--overwrite`` refuses to clear it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from wse.config import UsageError

from .checkpoint import CHECKPOINTS
from .job import Job
from .options import TrainConfig

__all__ = ["SUMMARY_NAME", "EXECUTABLE_NAME", "LOG_NAME", "FABRIC_NAME", "TENSORBOARD_DIR", "ELASTIC_NAME",
           "SCRATCH_DIR", "OWNED", "choose_run_folder", "start_run_folder"]

SUMMARY_NAME = "summary.json"
EXECUTABLE_NAME = "executable.npz"
LOG_NAME = "train.log"
FABRIC_NAME = "fabric.txt"
TENSORBOARD_DIR = "tensorboard"
#: The file naming the ``torchrun`` job that started a run (for automatic restarts).
ELASTIC_NAME = "elastic.json"
#: The folder that holds MemoryX's disk tier while a run with ``--memoryx-budget`` trains.
SCRATCH_DIR = "memoryx-disk"
#: Everything a run writes into its folder (and ``--overwrite`` removes).
OWNED = (SUMMARY_NAME, EXECUTABLE_NAME, CHECKPOINTS, TENSORBOARD_DIR, LOG_NAME, FABRIC_NAME, ELASTIC_NAME,
         SCRATCH_DIR)


def _holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds anything a run writes (even a run interrupted before its first checkpoint)."""
    return any((folder / name).exists() for name in OWNED)


def _is_empty(folder: Path) -> bool:
    return not folder.exists() or (folder.is_dir() and not any(folder.iterdir()))


def choose_run_folder(config: TrainConfig, job: Job) -> tuple[Path, bool]:
    """The run folder of ``config`` and whether an existing run there is to be replaced.

    Without ``config.out`` the folder is ``runs/<job name>`` (``runs/<job
    name>-N``, the first empty one, for a new run). Writes nothing.

    Raises
    ------
    UsageError
        For an ``out`` that is a file, or that holds something without
        ``resume`` or ``overwrite``, or that ``overwrite`` may not clear.
    """
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
                         f"(none of {', '.join(OWNED)})")
    return out, True


def start_run_folder(out: Path, executable: Any, *, replace: bool) -> None:
    """Create the run folder ``out`` (first removing what a run left there when ``replace``) and write the
    executable's summary (:data:`FABRIC_NAME`) and the executable itself (:data:`EXECUTABLE_NAME`)."""
    if replace:
        for name in OWNED:
            path = out / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
    out.mkdir(parents=True, exist_ok=True)
    if callable(getattr(executable, "summary", None)):
        (out / FABRIC_NAME).write_text(str(executable.summary()) + "\n", encoding="utf-8")
    if callable(getattr(executable, "save", None)):
        executable.save(out / EXECUTABLE_NAME)     # runs without the job file: Executable.load
