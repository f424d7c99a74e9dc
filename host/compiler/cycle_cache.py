"""The cycle cache: the static cycle model's replay results kept on disk, so
that compiling the same model on the same mesh again (a second ``wse train``,
a ``--resume``, an evaluation, a benchmark run again) skips the replays.

**What is stored.** :func:`~.cycles._replay_phases` replays a phase's inputs
without the PEs' closing private cycles (:func:`~.cycles.closing_cycles`) and
keeps the replay's count and every PE's last cycle; a phase's count follows
from those and its own closing cycles (:meth:`~.cycles.ReplayMemo.finish`:
``max(count - 1, max_p(last_p + closing_p)) + 1``). A PE's closing cycles
depend only on its op range (``starts[p], ends[p]``: PEs of one range run the
same op list), so the count needs, of the last cycles, only their maximum
over each distinct range. An entry holds the count and those maxima (a few
bytes per distinct op list, whatever the mesh); :meth:`CycleCache.get` gives
back every PE the maximum of its range, which :meth:`~.cycles.ReplayMemo.finish`
turns into the same count as the replay's own last cycles.

**Key.** A SHA-256 over everything the replay's result depends on: every
field of the :class:`~wse.config.FabricConfig` (the mesh, colors and queue
depths the replay reads, and the rest, so a field it comes to read later
cannot be missed), the in-process memo's 128-bit BLAKE2b digest of the
replay's input arrays (:meth:`~.cycles.ReplayMemo.key`: the route tables of
the :class:`~.network.Network`, which the packed routes the replay runs on
are a function of, the queue depths, the op rows, every PE's op range and
the edge ports' injections, each with its shape), and :data:`VERSION`: a digest of
the cycle model's source text (``cycles.py``, ``network.py``, ``replay*.py``,
this module and ``firmware/training/timing.py``), read once at import, so
that any change to that code misses every older entry. The replay's options
(``periods``, ``engine``, the reduced replay of the first columns, threads)
are not in the key: each gives the same count and last cycles
(``tests/test_cycle_cache.py`` checks the stored values agree); nor is the
replay's cycle limit, which the compiler never changes.

**Where.** ``$WSE_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/wse/cycles``,
else ``~/.cache/wse/cycles``; ``WSE_CYCLE_CACHE=0`` (or ``off``, ``no``,
``false``) turns it off. One file per key (``<sha256>.cyc``), written
atomically (a temporary file renamed over it), with a SHA-256 of the key and
its contents at its end: a truncated, corrupt or misnamed entry reads as a
miss and is replayed and written again. A cache that cannot be written (a
read-only folder, a full disk) never fails a compile: one line on stderr says
so, once per process and folder, and the compile goes on without storing; a
folder that cannot be named (``~user`` unknown, no home folder) turns the
cache off. A temporary file a killed writer left goes after an hour.
Entries are tiny (under a kilobyte for the models of ``bench/compile_speed.py``),
but the folder is still bounded: past :data:`MAX_BYTES` on disk the least
recently used entries go (a hit refreshes an entry's time).

:data:`TALLY` counts, for this process, the distinct replays the compiles
needed and where each came from; :func:`report_line` is the line ``wse
train`` prints about it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np

from wse.atomic import atomic_open

__all__ = ["VERSION", "MAX_BYTES", "CycleCache", "Tally", "TALLY", "cache_dir", "enabled", "open_cache",
           "report_line", "take_report_line", "source_files",
           "source_version"]

#: Disk space the cache may take (by allocated blocks) before its least recently used entries go.
MAX_BYTES = 64 << 20
_MAGIC = b"WSECYC1\n"
_SUFFIX = ".cyc"
_OFF = ("0", "off", "no", "false")
#: Age (seconds) past which a temporary file in the folder is a dead writer's and goes.
_STALE_S = 3600
# Where a memo key's inputs (ReplayMemo._inputs: tables, depths, ops, starts, ends, feed) hold the op ranges.
_STARTS, _ENDS = -3, -2


def source_files() -> list[Path]:
    """The cycle model's source files, in a fixed order: ``cycles.py``, ``network.py``, every
    ``replay*.py`` and this module of the compiler, and the training firmware's timing mirror
    (``firmware/training/timing.py``)."""
    from wse.firmware.training import timing

    here = Path(__file__).resolve().parent
    return [here / "cycles.py", here / "network.py", *sorted(here.glob("replay*.py")), Path(__file__).resolve(),
            Path(timing.__file__).resolve()]


def source_version(files: list[Path] | None = None) -> str:
    """The SHA-256 (hex) of the names and bytes of ``files`` (:func:`source_files` by default)."""
    digest = hashlib.sha256()
    for path in source_files() if files is None else files:
        data = Path(path).read_bytes()
        digest.update(f"{Path(path).name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


#: The cycle model's code version (:func:`source_version`), computed once at import.
VERSION = source_version()


def enabled() -> bool:
    """Whether the cycle cache is on (``WSE_CYCLE_CACHE`` is not ``0``, ``off``, ``no`` or ``false``)."""
    return os.environ.get("WSE_CYCLE_CACHE", "1").strip().lower() not in _OFF


def cache_dir() -> Path:
    """The cache folder: ``$WSE_CACHE_DIR``, else ``$XDG_CACHE_HOME/wse/cycles``, else ``~/.cache/wse/cycles``."""
    if os.environ.get("WSE_CACHE_DIR"):
        return Path(os.environ["WSE_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "wse" / "cycles"


@dataclasses.dataclass
class Tally:
    """Where this process's distinct replays came from: read from the cache (``cached``),
    replayed (``replayed``), of which ``stored`` written to it; ``shared`` phases took the count
    of an earlier replay of this process (:data:`~.cycles.MEMO`). ``folder`` is the cache's
    folder, ``off`` says why no cache was used, ``failed`` why entries could not be written.
    ``replay_cpu_s`` holds the CPU seconds (of its thread) of each replay run, by the name of the
    first phase that needed it (``bench/compile_speed.py`` prints them)."""

    cached: int = 0
    replayed: int = 0
    stored: int = 0
    shared: int = 0
    folder: str | None = None
    off: str | None = None
    failed: str | None = None
    replay_cpu_s: dict = dataclasses.field(default_factory=dict)

    def reset(self) -> None:
        """Back to no compile counted."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, field.default_factory() if field.default is dataclasses.MISSING
                    else field.default)


#: The tally of this process's compiles (:func:`report_line`).
TALLY = Tally()


def report_line(tally: Tally | None = None) -> str | None:
    """One line on where the cycle counts of this process's compiles came from (None if no
    weight-streaming cycle model ran): all from the cycle cache, some, or replayed."""
    t = TALLY if tally is None else tally
    if t.cached + t.replayed + t.shared == 0:
        return None
    if t.off is not None:
        return f"cycle counts: replayed ({t.replayed} replays; the cycle cache is off: {t.off})"
    where = f"the cycle cache {t.folder}"
    if t.replayed == 0 and t.cached == 0:
        return f"cycle counts: from this process's earlier replays ({t.shared} phases)"
    if t.replayed == 0:
        return f"cycle counts: from {where} ({t.cached} replays skipped)"
    kept = f", not stored: {t.failed}" if t.failed else ""
    return f"cycle counts: {t.replayed} replays run, {t.cached} from {where}{kept}"


def take_report_line() -> str | None:
    """:func:`report_line` of this process's compiles so far, then the tally starts again (``wse train``
    prints it once after the plan)."""
    line = report_line()
    TALLY.reset()
    return line


class CycleCache:
    """The cycle cache of one fabric configuration in folder ``folder``.

    :meth:`get` and :meth:`put` take a :meth:`~.cycles.ReplayMemo.key` (its inputs: the
    network's route tables, the queue depths, the op rows, every PE's op range and the
    injections) and a replay result ``(count, every PE's last cycle)``. Neither raises for a
    problem of the folder or its files: a bad entry is a miss, a failed write a warning."""

    _warned: set = set()

    def __init__(self, folder: Path, config):
        self.folder = Path(folder)
        self.wrote = False
        self._base = hashlib.sha256(f"wse cycle cache\0{VERSION}\0".encode())
        self._base.update(repr(sorted(dataclasses.asdict(config).items())).encode())

    def digest(self, key: tuple) -> str:
        """The SHA-256 (hex) naming the entry of a memo ``key``: :data:`VERSION`, every
        configuration field and the memo's own digest of the key's input arrays (their shapes
        and bytes, :meth:`~.cycles.ReplayMemo.key`), so no array is hashed twice."""
        digest = self._base.copy()
        digest.update(key[0])
        return digest.hexdigest()

    @staticmethod
    def _ranges(key: tuple) -> tuple[np.ndarray, int]:
        """``(range index of every PE, number of distinct op ranges)`` of a memo key's op ranges."""
        starts, ends = key[1][_STARTS], key[1][_ENDS]
        if starts.shape[0] == 0:
            return np.zeros(0, dtype=np.int64), 0
        joined = starts.astype(np.int64) * (int(ends.max()) + 1) + ends.astype(np.int64)
        distinct, index = np.unique(joined, return_inverse=True)
        return index.reshape(-1), int(distinct.shape[0])

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}{_SUFFIX}"

    def get(self, key: tuple) -> tuple[int, np.ndarray] | None:
        """The stored result of ``key``'s replay, ``(count, last cycles)`` with every PE's last
        cycle the maximum of its op range's, or None (no entry, or one that does not check)."""
        name = self.digest(key)
        path = self._path(name)
        try:
            data = path.read_bytes()
        except OSError:
            return None
        index, ranges = self._ranges(key)
        body, check = data[:-32], data[-32:]
        if (len(data) != len(_MAGIC) + 8 * (2 + ranges) + 32 or not body.startswith(_MAGIC)
                or hashlib.sha256(name.encode() + body).digest() != check):
            return None
        values = np.frombuffer(body, dtype="<i8", offset=len(_MAGIC))
        if int(values[1]) != ranges:
            return None
        try:
            os.utime(path)          # recently used: the last to go (_trim)
        except OSError:
            pass
        return int(values[0]), values[2:][index].astype(np.int64)

    def put(self, key: tuple, result: tuple[int, np.ndarray]) -> bool:
        """Store ``result`` (a replay's ``(count, every PE's last cycle)``) for ``key``; False
        when the folder cannot be written (one warning line on stderr per process and folder)."""
        name = self.digest(key)
        count, exits = result
        index, ranges = self._ranges(key)
        maxima = np.full(ranges, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(maxima, index, np.asarray(exits, dtype=np.int64))
        body = _MAGIC + np.array([count, ranges, *maxima], dtype="<i8").tobytes()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with atomic_open(self._path(name), "wb") as out:
                out.write(body + hashlib.sha256(name.encode() + body).digest())
        except OSError as error:
            reason = error.strerror or str(error)
            TALLY.failed = reason
            if str(self.folder) not in CycleCache._warned:
                CycleCache._warned.add(str(self.folder))
                print(f"wse: cycle cache {self.folder} cannot be written ({reason}); compiling without storing "
                      f"cycle counts", file=sys.stderr)
            return False
        self.wrote = True
        return True

    def trim(self, limit: int | None = None) -> None:
        """Remove the least recently used entries while the folder's entries take more than
        ``limit`` bytes of disk (:data:`MAX_BYTES` by default), down to three quarters of it, and
        temporary files older than an hour (a writer killed before its rename leaves one)."""
        limit = MAX_BYTES if limit is None else limit
        try:
            entries = []
            with os.scandir(self.folder) as listing:
                for entry in listing:
                    if entry.name.endswith(".tmp") and entry.is_file(follow_symlinks=False):
                        if entry.stat(follow_symlinks=False).st_mtime < time.time() - _STALE_S:
                            os.unlink(entry.path)       # left by a writer that was killed mid-write
                        continue
                    if entry.name.endswith(_SUFFIX) and entry.is_file(follow_symlinks=False):
                        stat = entry.stat(follow_symlinks=False)
                        size = getattr(stat, "st_blocks", 0) * 512 or stat.st_size
                        entries.append((stat.st_mtime, size, entry.path))
            total = sum(size for _, size, _ in entries)
            if total <= limit:
                return
            for _, size, path in sorted(entries):
                if total <= limit * 3 // 4:
                    break
                os.unlink(path)
                total -= size
        except OSError:
            pass


def open_cache(network) -> CycleCache | None:
    """The cycle cache of ``network`` in :func:`cache_dir`, or None when it is off
    (:func:`enabled`); records the folder, or why it is off, in :data:`TALLY`."""
    if not enabled():
        TALLY.off = f"WSE_CYCLE_CACHE={os.environ.get('WSE_CYCLE_CACHE', '')}"
        return None
    try:
        folder = cache_dir()
    except (RuntimeError, KeyError, OSError) as error:     # no home folder to put it in ("~user" unknown, no HOME)
        TALLY.off = f"no cache folder ({error}); set WSE_CACHE_DIR"
        return None
    TALLY.off, TALLY.folder = None, str(folder)
    return CycleCache(folder, network.config)
