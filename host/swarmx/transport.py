"""Point-to-point transports under SwarmX's collectives.

A transport moves whole numpy arrays between the systems of one group, in
order, one pair of systems at a time: :meth:`Transport.send` and
:meth:`Transport.recv`. Every collective of :class:`~wse.host.swarmx.Group`
(broadcast, reduce, gather) is built from these two calls by code that is the
same for every transport, so the arithmetic (the order of the additions of a
reduction) never depends on the transport.

- :class:`InProcessTransport`: N systems as N threads of one process (tests,
  laptops); started by :func:`~wse.host.swarmx.run_inprocess`.
- :class:`GlooTransport`: one process per system, ``torch.distributed`` with
  the gloo backend (CPU, TCP); started by :func:`~wse.host.swarmx.init_gloo`
  under ``torchrun``.

Faults are bounded in time: a peer that does not answer within the group's
timeout, that stopped with an error or whose connection was lost is reported
as :class:`PeerError`, one sentence naming the system.
"""

from __future__ import annotations

import abc
import datetime
import os
import queue
import re
import socket
import threading
import time

import numpy as np

from wse.config import UsageError

__all__ = ["PeerError", "Transport", "InProcessHub", "InProcessTransport", "GlooTransport",
           "DEFAULT_TIMEOUT", "DEFAULT_JOIN_TIMEOUT"]

#: Seconds a system waits for a peer inside one collective before giving up.
DEFAULT_TIMEOUT = 600.0
#: Seconds :func:`~wse.host.swarmx.init_gloo` waits for every system to join.
DEFAULT_JOIN_TIMEOUT = 120.0

_POLL = 0.05    # seconds between checks for a failed peer while waiting in-process


class PeerError(UsageError):
    """A peer system is missing, stopped, unreachable or did not answer in time.

    Members
    -------
    peers : tuple of int
        The ranks of the systems concerned.
    """

    def __init__(self, message: str, peers=()):
        super().__init__(message)
        self.peers = tuple(peers)


class Transport(abc.ABC):
    """Ordered, blocking transfer of whole arrays between the systems of one group.

    Members
    -------
    rank : int
        This system's index, ``0 .. size-1``.
    size : int
        Systems in the group.
    timeout : float
        Seconds a :meth:`recv` (or a :meth:`send` that needs its receiver)
        waits before raising :class:`PeerError`.

    Messages between one pair of systems arrive in the order they were sent.
    Both sides know every message's shape and dtype in advance.
    """

    name = ""

    def __init__(self, rank: int, size: int, timeout: float):
        self.rank, self.size, self.timeout = rank, size, float(timeout)

    def peer(self, rank: int) -> str:
        """How error messages name system ``rank``."""
        return f"SwarmX system {rank}"

    @abc.abstractmethod
    def send(self, array: np.ndarray, dst: int, during: str) -> None:
        """Send the C-contiguous ``array`` to system ``dst`` (``during``: the collective, for errors)."""

    @abc.abstractmethod
    def recv(self, array: np.ndarray, src: int, during: str) -> None:
        """Fill the C-contiguous ``array`` with the next message from system ``src``."""

    def close(self) -> None:
        """Leave the group; this system sends and receives nothing more."""


# ---------------------------------------------------------------------------- in-process

class InProcessHub:
    """The shared mailboxes of N in-process systems (one FIFO per ordered pair).

    A system that stops with an error or leaves is recorded here, so peers
    waiting for it fail at once with :class:`PeerError` instead of waiting
    for the timeout.
    """

    def __init__(self, size: int):
        if not isinstance(size, int) or isinstance(size, bool) or size < 1:
            raise UsageError(f"systems must be a positive integer, not {size!r}")
        self.size = size
        self._boxes = {(s, d): queue.SimpleQueue() for s in range(size) for d in range(size) if s != d}
        self._lock = threading.Lock()
        self._failed: dict[int, BaseException] = {}
        self._left: set[int] = set()

    def fail(self, rank: int, error: BaseException) -> None:
        """Record that system ``rank`` stopped with ``error``."""
        with self._lock:
            self._failed.setdefault(rank, error)

    def leave(self, rank: int) -> None:
        """Record that system ``rank`` left the group."""
        with self._lock:
            self._left.add(rank)

    def _status(self, rank: int) -> tuple[BaseException | None, bool]:
        with self._lock:
            return self._failed.get(rank), rank in self._left


class InProcessTransport(Transport):
    """System ``rank`` of an :class:`InProcessHub`; arrays are copied through FIFOs."""

    name = "inprocess"

    def __init__(self, hub: InProcessHub, rank: int, timeout: float = DEFAULT_TIMEOUT):
        super().__init__(rank, hub.size, timeout)
        self.hub = hub

    def send(self, array: np.ndarray, dst: int, during: str) -> None:
        self.hub._boxes[(self.rank, dst)].put(np.array(array, copy=True))

    def recv(self, array: np.ndarray, src: int, during: str) -> None:
        box = self.hub._boxes[(src, self.rank)]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                message = box.get(timeout=_POLL)
                break
            except queue.Empty:
                pass
            error, left = self.hub._status(src)
            if error is not None or left:
                try:                       # it may have sent this message just before stopping
                    message = box.get_nowait()
                    break
                except queue.Empty:
                    pass
            if error is not None:
                raise PeerError(f"{self.peer(src)} stopped with an error during {during} "
                                f"({type(error).__name__}: {error})", [src])
            if left:
                raise PeerError(f"{self.peer(src)} left the group before sending what {during} needs "
                                "from it (its collectives differ from this system's)", [src])
            if time.monotonic() > deadline:
                raise PeerError(f"{self.peer(src)} did not answer within {self.timeout:g} s during {during}",
                                [src])
        if message.shape != array.shape or message.dtype != array.dtype:
            raise RuntimeError(f"{during}: {self.peer(src)} sent {message.dtype} {message.shape}, "
                               f"expected {array.dtype} {array.shape}")
        array[...] = message

    def close(self) -> None:
        self.hub.leave(self.rank)


# ---------------------------------------------------------------------------- gloo

_ENV_NEEDED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise UsageError(f"environment variable {name} must be an integer, not {value!r}") from None


def _gloo_reason(text: str) -> str:
    """The cause in a gloo error, without its source location and advice:
    ``[.../pair.cc:537] Read error [127.0.0.1]:53662: Connection reset by peer. This is ...``
    gives ``Read error [127.0.0.1]:53662: Connection reset by peer``."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    first = re.sub(r"^\[[^\]]*:\d+\]\s*", "", first)
    return first.split(". ", 1)[0].rstrip(".")


class GlooTransport(Transport):
    """One process per system: ``torch.distributed`` point-to-point calls on the gloo backend.

    Parameters
    ----------
    timeout : float
        Seconds a transfer waits for its peer (the process group's timeout).
    join_timeout : float
        Seconds to wait for every system to join before naming the missing ones.

    Raises
    ------
    UsageError
        If the ``torchrun`` environment (``RANK``, ``WORLD_SIZE``,
        ``MASTER_ADDR``, ``MASTER_PORT``) is missing or malformed, or a
        default process group already exists.
    PeerError
        If some systems do not join within ``join_timeout`` (named with their ranks).

    Notes
    -----
    Joining goes through the rendezvous store that ``torchrun`` provides
    (``TORCHELASTIC_USE_AGENT_STORE``), or otherwise one that rank 0 hosts at
    ``MASTER_ADDR:MASTER_PORT``. Each system writes ``host:pid`` under a key
    of its rank (prefixed by the restart count, so a restarted job never sees
    the keys of an earlier attempt); error messages quote it.
    """

    name = "gloo"

    def __init__(self, timeout: float = DEFAULT_TIMEOUT, join_timeout: float = DEFAULT_JOIN_TIMEOUT):
        missing = [name for name in _ENV_NEEDED if name not in os.environ]
        if missing:
            raise UsageError("SwarmX's gloo transport runs one process per system under torchrun, which sets "
                             f"{', '.join(_ENV_NEEDED)}; {', '.join(missing)} not set")
        import torch.distributed as dist
        if dist.is_initialized():
            raise UsageError("a torch.distributed process group already exists in this process; "
                             "SwarmX creates its own")
        rank, size = _env_int("RANK"), _env_int("WORLD_SIZE")
        if not 0 <= rank < size:
            raise UsageError(f"RANK must be in 0..WORLD_SIZE-1, not {rank} (WORLD_SIZE {size})")
        super().__init__(rank, size, timeout)
        self._dist = dist
        host, port = os.environ["MASTER_ADDR"], _env_int("MASTER_PORT")
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        prefix = f"swarmx/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        join = datetime.timedelta(seconds=join_timeout)
        try:
            store = dist.TCPStore(host, port, size, is_master=(rank == 0 and not agent), timeout=join,
                                  wait_for_workers=False)
        except Exception as exc:     # noqa: BLE001 - torch raises several store error types
            owner = "torchrun's rendezvous store" if agent else "SwarmX system 0, which hosts the rendezvous store,"
            raise PeerError(f"{owner} at {host}:{port} cannot be reached from system {rank} within "
                            f"{join_timeout:g} s ({type(exc).__name__}: {str(exc).splitlines()[0]})",
                            [] if agent else [0]) from None
        keys = [f"{prefix}/join/{r}" for r in range(size)]
        store.set(keys[rank], f"{socket.gethostname()}:{os.getpid()}")
        deadline = time.monotonic() + join_timeout
        while not store.check(keys):       # polled: a blocking wait would log its timeout from C++
            if time.monotonic() > deadline:
                absent = [r for r, key in enumerate(keys) if not store.check([key])]
                if absent:
                    names = ", ".join(str(r) for r in absent)
                    raise PeerError(f"SwarmX system{'s' if len(absent) > 1 else ''} {names} of {size} did not "
                                    f"join within {join_timeout:g} s (seen from system {rank})", absent)
            time.sleep(_POLL)
        self._where = {r: store.get(keys[r]).decode() for r in range(size)}
        pg_store = dist.PrefixStore(f"{prefix}/pg", store)
        try:
            dist.init_process_group("gloo", store=pg_store, rank=rank, world_size=size,
                                    timeout=datetime.timedelta(seconds=timeout))
        except Exception as exc:     # noqa: BLE001
            raise PeerError(f"SwarmX system {rank} could not connect to its peers "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0]})", range(size)) from None
        self._store = store

    def peer(self, rank: int) -> str:
        return f"SwarmX system {rank} ({self._where.get(rank, '?')})"

    def _fail(self, exc: Exception, peer: int, during: str) -> PeerError:
        text = str(exc)
        if "Timed out" in text or "timed out" in text:
            return PeerError(f"{self.peer(peer)} did not answer within {self.timeout:g} s during {during}", [peer])
        return PeerError(f"{self.peer(peer)} is unreachable: the connection failed during {during} "
                         f"({_gloo_reason(text) or type(exc).__name__})", [peer])

    @staticmethod
    def _bytes(array: np.ndarray):
        """A uint8 tensor sharing the array's memory (gloo moves bytes of any dtype this way)."""
        import torch
        return torch.from_numpy(array.reshape(-1).view(np.uint8))

    def send(self, array: np.ndarray, dst: int, during: str) -> None:
        if not array.flags.writeable:     # torch.from_numpy wants writable memory
            array = array.copy()
        try:
            self._dist.send(self._bytes(array), dst)
        except RuntimeError as exc:
            raise self._fail(exc, dst, during) from None

    def recv(self, array: np.ndarray, src: int, during: str) -> None:
        try:
            self._dist.recv(self._bytes(array), src)
        except RuntimeError as exc:
            raise self._fail(exc, src, during) from None

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
