"""The run folder: what a run leaves in it, which folder a run takes, and starting it.

A run folder holds ``summary.json``, ``train.log``, ``fabric.txt``,
``executable.npz``, ``tensorboard/``, ``checkpoints/`` and, while some runs
train, ``elastic.json`` and ``memoryx-disk/`` (:data:`OWNED`). A folder that
holds none of these holds no run, and ``--overwrite`` refuses to clear it.

The lock: a run holds ``run.lock`` (:data:`LOCK_NAME`) locked
(``fcntl.flock``, exclusive) from before it writes anything until it ends;
the file names the holder (pid, host, start time). A second run on the same
folder, ``--resume`` or ``--overwrite`` included, is refused with one error
naming the holder, before it writes anything. The kernel drops the lock when
its process dies, so the lock of a killed run is never in the way; the file
stays (an empty folder but for it counts as empty). Once it holds the lock a
run removes the temporaries a killed run left (:func:`clean_run_folder`).
"""

from __future__ import annotations

import errno
import math
import os
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from wse.atomic import file_error, free_bytes
from wse.config import UsageError
from wse.host.memoryx import ShardMap, planned_disk_bytes, state_slots

from .checkpoint import CHECKPOINTS, clean_checkpoints, latest_checkpoint
from .job import Job
from .options import TrainConfig

try:
    import fcntl
except ImportError:         # not POSIX: runs are not locked
    fcntl = None

__all__ = ["SUMMARY_NAME", "EXECUTABLE_NAME", "LOG_NAME", "FABRIC_NAME", "TENSORBOARD_DIR", "ELASTIC_NAME",
           "SCRATCH_DIR", "LOCK_NAME", "OWNED", "RunLock", "choose_run_folder", "check_run_folder_free",
           "start_run_folder", "clean_run_folder", "tier_disk_bytes", "check_tier_space"]

SUMMARY_NAME = "summary.json"
EXECUTABLE_NAME = "executable.npz"
LOG_NAME = "train.log"
FABRIC_NAME = "fabric.txt"
TENSORBOARD_DIR = "tensorboard"
#: The file naming the ``torchrun`` job that started a run (for automatic restarts).
ELASTIC_NAME = "elastic.json"
#: The folder that holds MemoryX's disk tier while a run with ``--memoryx-budget`` trains.
SCRATCH_DIR = "memoryx-disk"
#: The lock file of a run folder (see the module notes); kept, never removed.
LOCK_NAME = "run.lock"
#: Everything a run writes into its folder (and ``--overwrite`` removes).
OWNED = (SUMMARY_NAME, EXECUTABLE_NAME, CHECKPOINTS, TENSORBOARD_DIR, LOG_NAME, FABRIC_NAME, ELASTIC_NAME,
         SCRATCH_DIR)


def _holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds anything a run writes (even a run interrupted before its first checkpoint)."""
    return any((folder / name).exists() for name in OWNED)


def _is_empty(folder: Path) -> bool:
    return not folder.exists() or (folder.is_dir() and all(p.name == LOCK_NAME for p in folder.iterdir()))


# ------------------------------------------------------------------ the lock
def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError):
        text = []
    if len(text) >= 3 and text[2].isdigit():
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(text[2])))
        return f"pid {text[0]} on host {text[1]}, since {since}"
    return "a process that has not named itself yet"


def _in_use(out: Path) -> UsageError:
    return UsageError(f"run folder {str(out)!r} is in use by another run ({_holder(out / LOCK_NAME)}); "
                      "wait for it to end, or choose another --out")


class RunLock:
    """The exclusive lock of a run folder, held while a run writes it (see the module notes)."""

    def __init__(self, out: Path, fd: int | None):
        self.out, self._fd = out, fd

    @classmethod
    def acquire(cls, out: str | os.PathLike) -> "RunLock":
        """Lock the existing folder ``out`` for this process and record the holder in :data:`LOCK_NAME`.

        Raises :class:`UsageError` naming the holder when another process holds it.
        """
        out = Path(out)
        if fcntl is None:
            return cls(out, None)
        path = out / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise file_error(exc, "create the lock of run folder", out) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise _in_use(out) from None
            raise file_error(exc, "lock run folder", out) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.time():.0f}\n".encode(), 0)
        except OSError:
            pass            # the holder's name is for messages only
        return cls(out, fd)

    def release(self) -> None:
        """Unlock (the file stays); a second call does nothing."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)        # closing the only descriptor drops the flock

    def __del__(self):
        self.release()


def check_run_folder_free(out: str | os.PathLike) -> None:
    """Raise :class:`UsageError` naming the holder when a live run holds ``out``; writes nothing."""
    path = Path(out) / LOCK_NAME
    if fcntl is None or not path.is_file():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise _in_use(Path(out)) from None
    finally:
        os.close(fd)


def _check_writable(out: Path, option: str) -> None:
    """Raise :class:`UsageError` unless ``out`` is, or can be created as, a writable folder."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"{option} {str(out)!r} is a file; expected a run folder")
    scratch = out / SCRATCH_DIR
    if scratch.exists() and not scratch.is_dir():
        raise UsageError(f"{str(scratch)!r} is a file; expected the MemoryX disk tier folder (or nothing)")
    base = out.absolute()
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise UsageError(f"{option} {str(out)!r} cannot be created: {str(base)!r} is a file; expected a folder")
    if not os.access(base, os.W_OK | os.X_OK):
        reason = "is on a read-only file system" if _read_only(base) else "is not writable by this user"
        raise UsageError(f"{option} {str(out)!r} cannot be written: {str(base)!r} {reason}; "
                         "expected a folder this run can write")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


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
            _check_writable(base, "run folder")
            check_run_folder_free(base)
            return base, config.overwrite and not _is_empty(base)
        candidate, n = base, 1
        while not _is_empty(candidate):
            n += 1
            candidate = base.with_name(f"{base.name}-{n}")
        _check_writable(candidate, "run folder")
        return candidate, False
    out = Path(config.out)
    _check_writable(out, "--out")
    check_run_folder_free(out)
    if config.resume or _is_empty(out):
        return out, False
    if not config.overwrite:
        raise UsageError(f"run folder {str(out)!r} is not empty; pass --resume to continue its run, "
                         "--overwrite to replace it, or another --out")
    if not _holds_run(out):
        raise UsageError(f"--overwrite refuses to clear {str(out)!r}: it holds no run "
                         f"(none of {', '.join(OWNED)})")
    return out, True


def clean_run_folder(out: str | os.PathLike) -> list[str]:
    """Remove the temporaries a killed run left in ``out`` (hidden ``.*.tmp`` files beside the run's files
    and under ``checkpoints/``, hidden ``.old`` folders being removed); the names removed. Call with the
    lock held."""
    out = Path(out)
    removed = []
    for path in sorted(out.iterdir()) if out.is_dir() else ():
        if path.name.startswith(".") and path.name.endswith(".tmp") and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path.name)
        elif path.name.startswith(".") and path.name.endswith(".old") and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed + [f"{CHECKPOINTS}/{name}" for name in clean_checkpoints(out)]


def start_run_folder(out: Path, executable: Any, *, replace: bool, resumed: Path | None = None) -> RunLock:
    """Create and lock the run folder ``out``, then remove what a killed run left there (and, when
    ``replace``, the run it holds) and write the executable's summary (:data:`FABRIC_NAME`) and the
    executable itself (:data:`EXECUTABLE_NAME`); the lock, for the caller to release when the run ends.

    ``resumed`` is the checkpoint the run was prepared from: it must still be the latest once the lock is
    held. Raises :class:`UsageError` (one line naming the path and what it needs) when the folder is held
    by another run or cannot be written; a folder this call created is then removed again.
    """
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise file_error(exc, "create run folder", out) from None
    lock = None
    try:
        lock = RunLock.acquire(out)
        if resumed is not None:
            if latest_checkpoint(out) != resumed:
                raise UsageError(f"the latest checkpoint of {str(out)!r} changed while this run prepared to "
                                 f"resume from {resumed.name}; start it again")
        _fill(out, executable, replace)
    except BaseException:
        if lock is not None:
            lock.release()
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    return lock


def _fill(out: Path, executable: Any, replace: bool) -> None:
    try:
        clean_run_folder(out)
        if replace:
            for name in OWNED:
                path = out / name
                if path.is_dir():           # out of sight first: a half-removed run never looks like one
                    hidden = out / f".{name}.{os.getpid()}.old"
                    os.replace(path, hidden)
                    shutil.rmtree(hidden)
                elif path.exists():
                    path.unlink()
        if callable(getattr(executable, "summary", None)):
            (out / FABRIC_NAME).write_text(str(executable.summary()) + "\n", encoding="utf-8")
        if callable(getattr(executable, "save", None)):
            executable.save(out / EXECUTABLE_NAME)     # runs without the job file: Executable.load
    except OSError as exc:
        raise file_error(exc, "write run folder", out) from None


# ------------------------------------------------------------------ the disk tier
def tier_disk_bytes(memoryx: Any, budget: int, systems: int = 1, rank: int | None = None) -> int:
    """Disk bytes the MemoryX disk tier of a run takes under ``budget`` per system: for system ``rank``, or
    for all ``systems`` together (``rank`` None). ``memoryx`` is the run's whole MemoryX (weights, and the
    optimizer state its optimizer will create, a masked weight's for its kept weights only); tensors are
    placed in MemoryX's creation order."""
    names = memoryx.names()
    shapes = {name: tuple(memoryx.shape(name)) for name in names}
    shard_map = ShardMap(shapes, systems) if systems > 1 else None
    slots = sorted(state_slots(memoryx.config))
    total = 0
    for r in range(systems) if rank is None else [rank]:
        count = {name: len(shard_map.range(name, r)) if shard_map else math.prod(shapes[name]) for name in names}
        sizes = [4 * count[name] for name in names]
        kept = {} if shard_map else {n: int(m.sum()) for n, m in getattr(memoryx, "masks", {}).items()}
        sizes += [4 * (1 if slot == "step" else kept.get(name, count[name])) for name in names for slot in slots]
        total += planned_disk_bytes(sizes, budget)
    return total


def check_tier_space(out: Path, memoryx: Any, budget: int | None, systems: int) -> None:
    """Raise :class:`UsageError` (naming the folder and the bytes needed) when the file system of ``out``
    lacks the room for the run's MemoryX disk tier; writes nothing."""
    if budget is None:
        return
    need = tier_disk_bytes(memoryx, budget, systems)
    free = free_bytes(out)
    if free is not None and need > free:
        raise UsageError(f"the MemoryX disk tier {str(out / SCRATCH_DIR)!r} needs {need:,} bytes for "
                         f"--memoryx-budget {budget:,} but its file system has {free:,} bytes free; "
                         "free space, raise the budget or choose another --out")
