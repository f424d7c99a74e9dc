"""Launching a run on one system or on N systems joined by SwarmX (``wse train --systems N``).

Each system of a run gets an engine (:mod:`~wse.host.appliance.engines`:
:class:`~wse.host.appliance.engines.OneSystem` or
:class:`~wse.host.appliance.engines.SwarmSystem`) and runs the one training
loop (:func:`~wse.host.appliance.loop.train_loop`) over it
(:func:`run_system`). N systems give one system's bits (``docs/swarmx.md``).

Launching (:func:`detect_launch`): under ``torchrun`` (the environment holds
``RANK`` and ``WORLD_SIZE``) every process is one system and the systems talk
over gloo (:func:`train_gloo`); otherwise ``--systems N`` systems run as
threads of this process (:func:`run_systems`). System 0 alone writes the run
folder: log, TensorBoard, checkpoints (the whole, gathered MemoryX) and the
summary; it also evaluates. With ``--memoryx-budget`` each system keeps what
does not fit in memory-mapped files under ``out/memoryx-disk/system-<rank>``,
removed at the end of the run.

Restarts: when ``torchrun --max-restarts`` restarts the worker group
(``TORCHELASTIC_RESTART_COUNT > 0``), the new workers continue the run from
its latest checkpoint (or start it again when none was written), provided the
run folder was started by this same ``torchrun`` job (``elastic.json`` records
its run id and agent); a folder another job wrote is never touched.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np

from wse.config import UsageError
from wse.host.data import Batches
from wse.host.memoryx import ShardedMemoryX, TieredStore
from wse.host.swarmx import DEFAULT_JOIN_TIMEOUT, DEFAULT_TIMEOUT, init_gloo, run_inprocess

from .checkpoint import latest_checkpoint
from .engines import OneSystem, SwarmSystem
from .folder import ELASTIC_NAME, SCRATCH_DIR, tier_disk_bytes
from .loop import optimizer_threads, train_loop
from .options import TrainConfig
from .preparation import Prepared, prepare
from .report import RunSummary, write_json

__all__ = ["Launch", "detect_launch", "run_system", "run_systems", "train_gloo"]


# ------------------------------------------------------------------ launching
@dataclasses.dataclass(frozen=True)
class Launch:
    """How this process takes part in a run.

    Members
    -------
    transport : {"inprocess", "gloo"}
        Threads of this process, or one process per system under ``torchrun``.
    rank, world : int
        This process's system and the number of processes (0 and 1 in-process).
    restart, max_restarts : int
        ``TORCHELASTIC_RESTART_COUNT`` and ``TORCHELASTIC_MAX_RESTARTS`` (0 without torchelastic).
    identity : dict or None
        The ``torchrun`` job (run id and agent) that a run folder records in
        :data:`ELASTIC_NAME`; None when not started by ``torchrun``.
    """

    transport: str
    rank: int = 0
    world: int = 1
    restart: int = 0
    max_restarts: int = 0
    identity: dict | None = None


def _env_int(env, name: str, default: int | None = None) -> int:
    value = env.get(name)
    if value is None and default is not None:
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise UsageError(f"environment variable {name} must be an integer, not {value!r}") from None


def detect_launch(config: TrainConfig, environ=None) -> Launch:
    """The launch of this process: gloo under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), else in-process.

    Raises
    ------
    UsageError
        Under ``torchrun``, for ``--systems`` other than the number of
        processes, or malformed environment variables.
    """
    env = os.environ if environ is None else environ
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return Launch("inprocess")
    rank, world = _env_int(env, "RANK"), _env_int(env, "WORLD_SIZE")
    if config.systems is not None and config.systems != world:
        raise UsageError(f"--systems {config.systems} differs from the {world} processes torchrun started "
                         f"(WORLD_SIZE): under torchrun every process is one system; omit --systems or pass "
                         f"--systems {world}")
    identity = None
    if "TORCHELASTIC_RUN_ID" in env:
        identity = {"run_id": env["TORCHELASTIC_RUN_ID"], "agent": f"{socket.gethostname()}:{os.getppid()}"}
    return Launch("gloo", rank, world, _env_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
                  _env_int(env, "TORCHELASTIC_MAX_RESTARTS", 0), identity)


# ------------------------------------------------------------------ running
def run_system(prepared: Prepared, stream=None, *, group=None, source: list | None = None,
               transport: str = "inprocess", identity: dict | None = None) -> RunSummary | None:
    """Run one system of a prepared run to its end; returns the summary on system 0, None elsewhere.

    Parameters
    ----------
    prepared : Prepared
        This system's view of the run (its own runtime and batches).
    group : Group, optional
        The systems; None for a single-system run.
    source : list, optional
        In-process runs: a one-item list holding the whole MemoryX every
        system takes its shard from (emptied once all have; default:
        ``prepared.memoryx``).
    identity : dict, optional
        The ``torchrun`` job, recorded by system 0 in :data:`ELASTIC_NAME`.
    """
    rank = 0 if group is None else group.rank
    if rank == 0:
        prepared.start_folder()            # locked until the run ends: prepared.release_folder() below
    budget = prepared.config.budget_bytes
    scratch = prepared.out / SCRATCH_DIR / f"system-{rank}" if budget is not None else None
    store = None
    try:
        if rank == 0 and identity is not None:
            write_json(prepared.out / ELASTIC_NAME, identity)
        if group is not None:
            group.barrier()                # the run folder is ready before any system writes its disk tier
        whole = source[0] if source else prepared.memoryx
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)       # left by a killed run
            store = TieredStore(budget, scratch)
            store.reserve(tier_disk_bytes(whole, budget, group.size if group else 1, rank))
        if group is None:
            engine = OneSystem(prepared.runtime, whole.copy(store=store) if store is not None else whole,
                               prepared.executable, budget=budget)
        else:
            engine = SwarmSystem(group, prepared.runtime, ShardedMemoryX.from_memoryx(group, whole, store=store),
                                 prepared.executable, transport=transport, budget=budget, scratch=scratch)
        prepared.memoryx = engine.memoryx                    # the whole copy in RAM is no longer needed
        del whole
        if source:
            group.barrier()
            source.clear()
        return train_loop(prepared, engine, stream=stream)
    finally:
        if store is not None:
            store.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
            try:
                scratch.parent.rmdir()                       # the last system to finish removes the folder
            except OSError:
                pass
        if rank == 0:
            prepared.release_folder()


def _inprocess_system(group, prepared, source: list, batches_state: dict, trainer: dict | None, stream):
    if group.rank == 0:
        mine = prepared
    else:
        mine = dataclasses.replace(
            prepared, runtime=prepared.open_runtime(),
            batches=Batches.from_state(*prepared.train_data, batches_state),
            trainer=copy.deepcopy(trainer))
    return run_system(mine, stream, group=group, source=source, transport="inprocess")


def run_systems(prepared: Prepared, stream=None) -> RunSummary:
    """Run a prepared run on ``prepared.settings.systems`` systems of this process; system 0's summary."""
    systems = prepared.settings.systems
    if systems == 1:
        return run_system(prepared, stream)
    source = [prepared.memoryx]
    prepared.memoryx = None
    timeout = prepared.config.swarmx_timeout or DEFAULT_TIMEOUT
    # Every system gets its own copies of what the loop changes, taken before any system starts.
    return run_inprocess(_inprocess_system, systems, prepared, source, prepared.batches.state(),
                         copy.deepcopy(prepared.trainer), stream, timeout=timeout)[0]


# ------------------------------------------------------------------ one process per system
def _echo(message: str) -> UsageError:
    """An error every system raises but system 0 reports (the CLI prints it on system 0 only)."""
    error = UsageError(message)
    error.echo = True
    return error


def _broadcast_text(group, text: str) -> str:
    data = np.frombuffer(text.encode(), np.uint8).copy()
    size = np.array([len(data)], np.int64)
    group.broadcast(size, 0)
    if group.rank != 0:
        data = np.empty(int(size[0]), np.uint8)
    group.broadcast(data, 0)
    return data.tobytes().decode()


def _agree(group, problem: str | None) -> int | None:
    """Every system says whether it is ready (``problem`` None) or not; the first problem's rank, or None.

    Systems other than that one raise the problem (system 0 naming the system it came from).
    """
    data = np.frombuffer((problem or "").encode(), np.uint8).copy()
    root = group.rank == 0
    sizes = [np.zeros(1, np.int64) for _ in range(group.size)] if root else None
    group.gather(np.array([len(data)], np.int64), sizes, 0)
    texts = [np.empty(int(s[0]), np.uint8) for s in sizes] if root else None
    group.gather(data, texts, 0)
    verdict = ""
    if root:
        origin = next((r for r, t in enumerate(texts) if t.size), None)
        if origin is not None:
            verdict = json.dumps([origin, texts[origin].tobytes().decode()])
    verdict = _broadcast_text(group, verdict)
    if not verdict:
        return None
    origin, message = json.loads(verdict)
    if origin == group.rank:
        return origin
    if root:
        raise UsageError(f"SwarmX system {origin}: {message}")
    raise _echo(message if origin == 0 else f"SwarmX system {origin}: {message}")


def _restart_mode(config: TrainConfig, identity: dict) -> str:
    """``"resume"``, ``"overwrite"`` or ``"as-given"`` for a worker group that torchrun restarted."""
    out = Path(config.out)
    try:
        recorded = json.loads((out / ELASTIC_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        recorded = None
    if recorded != identity:
        return "as-given"
    return "resume" if latest_checkpoint(out) is not None else "overwrite"


def _restarted(config: TrainConfig, launch: Launch, group) -> TrainConfig:
    """``config`` for a restarted worker group: resume the run it started (see the module notes)."""
    if launch.restart == 0 or launch.identity is None:
        return config
    mode, error = "", None
    if launch.rank == 0:
        try:
            mode = _restart_mode(config, launch.identity)
        except UsageError as exc:
            error = exc
            mode = "!" + str(exc)
    if group is not None:
        mode = _broadcast_text(group, mode)
    if error is not None:
        raise error
    if mode.startswith("!"):
        raise _echo(mode[1:])
    if mode == "resume":
        return dataclasses.replace(config, resume=True, overwrite=False)
    if mode == "overwrite":
        return dataclasses.replace(config, resume=False, overwrite=True)
    return config


def train_gloo(config: TrainConfig, launch: Launch, stream=None) -> RunSummary | None:
    """This process's system of a run under ``torchrun`` (gloo); the summary on system 0, None elsewhere.

    Every system prepares the run (checks, data, compilation, the checkpoint
    to resume) and the systems agree that all are ready before system 0
    writes anything; a problem on any system stops every system with that
    problem's message.
    """
    if launch.max_restarts > 0 and config.out is None:
        raise UsageError("--out is needed under torchrun --max-restarts: restarted systems continue the run "
                         "from its folder")
    config = dataclasses.replace(config, systems=launch.world)
    group = None
    if launch.world > 1:
        group = init_gloo(timeout=config.swarmx_timeout or DEFAULT_TIMEOUT,
                          join_timeout=config.swarmx_timeout or DEFAULT_JOIN_TIMEOUT)
    try:
        config = _restarted(config, launch, group)
        prepared, error, problem = None, None, None
        try:
            prepared = prepare(config)
        except UsageError as exc:
            error, problem = exc, str(exc)
        except Exception as exc:               # noqa: BLE001 - told to the others, then raised here
            error, problem = exc, f"{type(exc).__name__}: {exc}"
        if group is not None and _agree(group, problem) is not None and launch.rank != 0 \
                and isinstance(error, UsageError):
            error.echo = True                  # system 0 reports it
        if error is not None:
            raise error
        with optimizer_threads(1):
            return run_system(prepared, stream, group=group, transport="gloo", identity=launch.identity)
    finally:
        if group is not None:
            group.close()
