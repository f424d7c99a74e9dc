"""SwarmX collectives: broadcast, reduce and gather among N systems, in a fixed order.

:class:`Group` follows the shape of ``torch.distributed`` (``broadcast(tensor,
src)``, ``reduce(tensor, dst)``, ``gather(tensor, gather_list, dst)``,
``all_reduce``, ``barrier``; ``async_op=True`` returns a :class:`Work` handle
with ``wait()``). The algorithms are written once, on top of a
:class:`~wse.host.swarmx.transport.Transport`'s ordered ``send``/``recv``, so
the in-process and gloo transports give the same bits.

Determinism rule (``docs/swarmx.md``): a reduction adds with the fabric's
binary32 add (:func:`wse.numerics.vadd`: round to nearest even,
subnormals flushed, canonical NaN) in an order fixed by the ranks alone, never
by arrival times.

- ``"chain"`` (the default): the left-deep tree. The sum is
  ``((+0 + p_0) + p_1) + ... + p_last`` over every contribution in rank order
  (and, within a rank, in the order of its partial sums, see
  :meth:`Group.reduce_partials`): exactly the fabric's own gradient row chain,
  which starts from ``+0`` and adds column after column. System ``r`` receives
  the running sum from ``r - 1``, adds its contributions and passes it to
  ``r + 1``; the last system hands the total to ``dst``.
- ``"tree"``: the balanced binary tree. Each system first folds its own
  contributions from ``+0``; then at level ``l = 0, 1, ...`` system ``r`` with
  ``r mod 2^(l+1) == 0`` adds the sum of system ``r + 2^l``: depth ``log2 N``
  instead of ``N``, reproducible run to run, but a different parenthesization
  than one system's row chain.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Sequence

import numpy as np
from numba import njit

from wse.config import UsageError
from wse import numerics

from .transport import (DEFAULT_JOIN_TIMEOUT, DEFAULT_TIMEOUT, GlooTransport, InProcessHub, InProcessTransport,
                        PeerError, Transport)

__all__ = ["Group", "Work", "REDUCE_ORDERS", "fold_partials", "run_inprocess", "init_gloo"]

#: The fixed reduction orders a :class:`Group` offers (see the module docstring).
REDUCE_ORDERS = ("chain", "tree")


_FLT_MIN = np.float32(2.0 ** -126)
_ZERO = np.float32(0.0)


@njit(inline="always")
def _flushed(value):
    """``value``, or a zero of its sign where it is subnormal (the fabric's operand and result flushing)."""
    if value != 0 and abs(value) < _FLT_MIN:
        return value * _ZERO
    return value


@njit(fastmath=False, cache=True)
def _fold_rows(acc, parts):
    """``acc[i] = (((acc[i] + parts[0, i]) + parts[1, i]) + ...)`` with flushed operands and results."""
    for i in range(acc.shape[0]):
        acc[i] = _flushed(acc[i])
    for j in range(parts.shape[0]):          # row by row: memory in order
        for i in range(acc.shape[0]):
            acc[i] = _flushed(acc[i] + _flushed(parts[j, i]))


def fold_partials(partials, acc=None) -> np.ndarray:
    """``acc + partials[0] + partials[1] + ...`` left to right with the fabric's binary32 add.

    The add is :func:`wse.numerics.vadd`'s: IEEE round to nearest
    even, subnormal operands and results flushed to zeros of their sign, NaN
    results canonical (a compiled loop that gives its bits; tested against it).

    Parameters
    ----------
    partials : float32 array ``[k, *shape]``
        Partial sums in order (``k`` may be 0).
    acc : float32 array ``shape``, optional
        The running sum to continue; ``+0.0`` everywhere when omitted.

    Returns
    -------
    numpy.ndarray
        float32 of ``shape`` (a new array; ``acc``'s bits unchanged when ``k`` is 0).
    """
    partials = np.asarray(partials)
    shape = partials.shape[1:]
    out = np.zeros(shape, np.float32) if acc is None else numerics.as_float(numerics.as_bits(acc).copy())
    out = out.reshape(shape)
    if len(partials):
        flat = out.reshape(-1)
        _fold_rows(flat, numerics.as_float(numerics.as_bits(partials)).reshape(len(partials), flat.size))
        nan = np.isnan(flat)
        if nan.any():
            flat.view(np.uint32)[nan] = numerics.CANONICAL_NAN
    return out


def _array(tensor: Any, what: str, *, writable: bool = True) -> np.ndarray:
    """A C-contiguous numpy view of a numpy array or CPU torch tensor."""
    if hasattr(tensor, "detach") and hasattr(tensor, "numpy"):
        tensor = tensor.detach().numpy()
    if not isinstance(tensor, np.ndarray):
        raise UsageError(f"{what} must be a numpy array or a CPU torch tensor, not {type(tensor).__name__}")
    if not tensor.flags.c_contiguous:
        raise UsageError(f"{what} must be C-contiguous")
    if writable and not tensor.flags.writeable:
        raise UsageError(f"{what} must be writable")
    return tensor


def _float32(tensor: Any, what: str, *, writable: bool = True) -> np.ndarray:
    array = _array(tensor, what, writable=writable)
    if array.dtype != np.float32:
        raise UsageError(f"{what} must be float32, not {array.dtype}")
    return array


class Work:
    """The handle of an asynchronous collective (``async_op=True``)."""

    def __init__(self, what: str):
        self.what = what
        self._done = threading.Event()
        self._error: BaseException | None = None

    def _finish(self, error: BaseException | None = None) -> None:
        self._error = error
        self._done.set()

    def is_completed(self) -> bool:
        """Whether the collective has finished (successfully or not)."""
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the collective has finished; re-raise its error, if any.

        ``timeout`` (seconds) bounds the wait itself; the collective's own
        peers are bounded by the group's timeout. Returns True.
        """
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.what} did not finish within {timeout:g} s")
        if self._error is not None:
            raise self._error
        return True


class Group:
    """The N systems of a SwarmX job, seen from one of them.

    Parameters
    ----------
    transport : Transport
        How arrays move (:class:`~wse.host.swarmx.transport.InProcessTransport`
        or :class:`~wse.host.swarmx.transport.GlooTransport`).
    reduce_order : {"chain", "tree"}
        The fixed reduction order (module docstring); ``"chain"`` equals one
        system's gradient row chain bit for bit.

    Members
    -------
    rank, size : int
        This system and the number of systems.

    Notes
    -----
    Every system must call the same collectives in the same order, with
    arrays of the same shapes and dtypes. Collectives run one after another
    on a worker thread in the order they were called, whether synchronous or
    not, so ``async_op=True`` overlaps a collective with the caller's work but
    never reorders collectives. A collective that fails (a peer error) breaks
    the group: later calls raise the same error. Tensors are numpy arrays or
    CPU torch tensors, C-contiguous; reductions take float32.
    """

    def __init__(self, transport: Transport, reduce_order: str = "chain"):
        if reduce_order not in REDUCE_ORDERS:
            raise UsageError(f"reduce_order must be one of {', '.join(REDUCE_ORDERS)}, not {reduce_order!r}")
        self.transport = transport
        self.rank, self.size = transport.rank, transport.size
        self.reduce_order = reduce_order
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._broken: BaseException | None = None
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name=f"swarmx-{self.rank}", daemon=True)
        self._worker.start()

    def __repr__(self) -> str:
        return (f"Group(rank={self.rank}, size={self.size}, transport={self.transport.name!r}, "
                f"reduce_order={self.reduce_order!r})")

    # -------------------------------------------------------------- machinery
    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            run, work = item
            if self._broken is not None:
                work._finish(self._broken)
                continue
            try:
                run()
            except BaseException as exc:     # noqa: BLE001 - handed to the waiter
                self._broken = exc
                work._finish(exc)
            else:
                work._finish()

    def _submit(self, what: str, run: Callable[[], None], async_op: bool) -> Work | None:
        if self._closed:
            raise UsageError(f"{what}: this SwarmX group is closed")
        work = Work(what)
        self._queue.put((run, work))
        if async_op:
            return work
        work.wait()
        return None

    def _check_rank(self, value: Any, name: str) -> int:
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not 0 <= value < self.size:
            raise UsageError(f"{name} must be a system rank in 0..{self.size - 1}, not {value!r}")
        return int(value)

    def _send(self, array: np.ndarray, dst: int, during: str) -> None:
        if array.size:
            self.transport.send(array if array.flags.c_contiguous else array.copy(order="C"), dst, during)

    def _recv(self, array: np.ndarray, src: int, during: str) -> np.ndarray:
        if array.size:
            self.transport.recv(array, src, during)
        return array

    # ------------------------------------------------------------ collectives
    def broadcast(self, tensor: Any, src: int, *, async_op: bool = False) -> Work | None:
        """Copy ``tensor`` of system ``src`` into ``tensor`` of every system (binomial tree from ``src``)."""
        array = _array(tensor, "broadcast tensor")
        src = self._check_rank(src, "src")
        return self._submit("broadcast", lambda: self._broadcast_now(array, src, "broadcast"), async_op)

    def _broadcast_now(self, array: np.ndarray, src: int, during: str) -> None:
        # Binomial tree over ranks relative to src: at step s, holders 0..s-1 send to holder + s.
        me = (self.rank - src) % self.size
        step = 1
        while step < self.size:
            if me < step and me + step < self.size:
                self._send(array, (self.rank + step) % self.size, during)
            elif step <= me < 2 * step:
                self._recv(array, (self.rank - step) % self.size, during)
            step *= 2

    def reduce(self, tensor: Any, dst: int, *, async_op: bool = False) -> Work | None:
        """Sum ``tensor`` over all systems into ``tensor`` of system ``dst``, in the fixed order.

        The same as :meth:`reduce_partials` with one partial sum per system
        (``tensor[None]``) and ``out=tensor``. Other systems' tensors are unchanged.
        """
        array = _float32(tensor, "reduce tensor")
        return self.reduce_partials(array[None], dst, out=array, async_op=async_op)

    def reduce_partials(self, partials: Any, dst: int, *, out: Any = None,
                        async_op: bool = False) -> Work | None:
        """Sum every system's partial sums into ``out`` of system ``dst``, in the fixed order.

        Parameters
        ----------
        partials : float32 ``[k, *shape]``
            This system's contributions in order; ``k`` may differ between
            systems and may be 0. ``shape`` must be the same everywhere.
        dst : int
            The system that receives the sum.
        out : float32 ``shape``
            Where the sum goes; needed on ``dst`` only.

        Notes
        -----
        With ``reduce_order="chain"`` the result is
        ``fold_partials(concatenate(partials of system 0, 1, ..., N-1))``: the
        partial sums of every system, in rank order, added one by one to a
        running sum that starts at ``+0``.
        """
        parts = _float32(partials, "reduce partials", writable=False)
        if parts.ndim < 1:
            raise UsageError("reduce partials must have a leading axis of partial sums")
        dst = self._check_rank(dst, "dst")
        shape = parts.shape[1:]
        target = None
        if self.rank == dst:
            if out is None:
                raise UsageError("reduce_partials needs out= on the destination system")
            target = _float32(out, "reduce out")
            if target.shape != shape:
                raise UsageError(f"reduce out has shape {target.shape}, expected {shape}")
        run = self._chain if self.reduce_order == "chain" else self._tree
        return self._submit("reduce", lambda: run(parts, target, dst, shape), async_op)

    def _chain(self, parts, target, dst, shape) -> None:
        last = self.size - 1
        acc = np.zeros(shape, np.float32)
        if self.rank > 0:
            self._recv(acc, self.rank - 1, "reduce")
        acc = fold_partials(parts, acc)
        if self.rank < last:
            self._send(acc, self.rank + 1, "reduce")
        elif dst != last:
            self._send(acc, dst, "reduce")
        if self.rank == dst:
            if dst != last:
                acc = self._recv(np.empty(shape, np.float32), last, "reduce")
            target[...] = acc

    def _tree(self, parts, target, dst, shape) -> None:
        acc = fold_partials(parts)
        step = 1
        while step < self.size:
            if self.rank % (2 * step) == step:
                self._send(acc, self.rank - step, "reduce")
                break
            if self.rank % (2 * step) == 0 and self.rank + step < self.size:
                other = self._recv(np.empty(shape, np.float32), self.rank + step, "reduce")
                acc = fold_partials(other[None], acc)
            step *= 2
        if self.rank == 0 and dst != 0:
            self._send(acc, dst, "reduce")
        if self.rank == dst:
            if dst != 0:
                acc = self._recv(np.empty(shape, np.float32), 0, "reduce")
            target[...] = acc

    def all_reduce(self, tensor: Any, *, async_op: bool = False) -> Work | None:
        """Sum ``tensor`` over all systems into every system's ``tensor`` (reduce to 0, then broadcast)."""
        array = _float32(tensor, "all_reduce tensor")

        def run():
            reduce = self._chain if self.reduce_order == "chain" else self._tree
            reduce(array[None].copy(), array, 0, array.shape)
            self._broadcast_now(array, 0, "all_reduce")
        return self._submit("all_reduce", run, async_op)

    def gather(self, tensor: Any, gather_list: Sequence[Any] | None = None, dst: int = 0, *,
               async_op: bool = False) -> Work | None:
        """Copy every system's ``tensor`` into ``gather_list[rank]`` on system ``dst``.

        ``gather_list`` (on ``dst`` only) holds one preallocated array per
        system with that system's shape and dtype; shapes may differ between
        systems.
        """
        array = _array(tensor, "gather tensor", writable=False)
        dst = self._check_rank(dst, "dst")
        slots: list[np.ndarray] = []
        if self.rank == dst:
            if gather_list is None or len(gather_list) != self.size:
                raise UsageError(f"gather needs a gather_list of {self.size} arrays on the destination system")
            slots = [_array(t, f"gather_list[{r}]") for r, t in enumerate(gather_list)]
            if slots[dst].shape != array.shape or slots[dst].dtype != array.dtype:
                raise UsageError(f"gather_list[{dst}] must match this system's tensor "
                                 f"({array.dtype} {array.shape}), not {slots[dst].dtype} {slots[dst].shape}")

        def run():
            if self.rank != dst:
                self._send(array, dst, "gather")
                return
            for r in range(self.size):
                if r == dst:
                    slots[r][...] = array
                else:
                    self._recv(slots[r], r, "gather")
        return self._submit("gather", run, async_op)

    def barrier(self) -> None:
        """Return once every system has called :meth:`barrier`."""
        self.all_reduce(np.zeros(1, np.float32))

    def close(self) -> None:
        """Finish queued collectives, stop the worker and leave the group (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._worker.join()
        self.transport.close()


# --------------------------------------------------------------------------- launching

def run_inprocess(fn: Callable[..., Any], systems: int, *args: Any, timeout: float = DEFAULT_TIMEOUT,
                  reduce_order: str = "chain", **kwargs: Any) -> list:
    """Run ``fn(group, *args, **kwargs)`` on ``systems`` in-process systems (threads); their results by rank.

    Raises
    ------
    Exception
        The first error of a system that failed on its own (by rank); a
        :class:`PeerError` only when every failure is one.
    KeyboardInterrupt
        Once every system has stopped at its next transfer (or finished).
    """
    hub = InProcessHub(systems)
    if reduce_order not in REDUCE_ORDERS:
        raise UsageError(f"reduce_order must be one of {', '.join(REDUCE_ORDERS)}, not {reduce_order!r}")
    results: list[Any] = [None] * systems
    errors: list[BaseException | None] = [None] * systems

    def system(rank: int) -> None:
        group = Group(InProcessTransport(hub, rank, timeout), reduce_order)
        try:
            results[rank] = fn(group, *args, **kwargs)
        except BaseException as exc:     # noqa: BLE001 - re-raised below
            errors[rank] = exc
            hub.fail(rank, exc)
        finally:
            group.close()

    threads = [threading.Thread(target=system, args=(r,), name=f"swarmx-system-{r}") for r in range(systems)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except KeyboardInterrupt:           # stop every system at its next transfer, then give up
        for rank in range(systems):
            hub.fail(rank, KeyboardInterrupt())
        for thread in threads:
            thread.join()
        raise
    failed = [e for e in errors if e is not None]
    if failed:
        own = [e for e in failed if not isinstance(e, PeerError)]
        raise (own or failed)[0]
    return results


def init_gloo(*, timeout: float = DEFAULT_TIMEOUT, join_timeout: float = DEFAULT_JOIN_TIMEOUT,
              reduce_order: str = "chain") -> Group:
    """This process's :class:`Group` when started by ``torchrun`` (gloo over TCP, one process per system).

    ``torchrun --nproc-per-node N -m module`` on one machine, or
    ``--nnodes M --nproc-per-node N --rdzv-endpoint HOST:PORT`` across
    machines. See :class:`~wse.host.swarmx.transport.GlooTransport` for the
    errors.
    """
    return Group(GlooTransport(timeout, join_timeout), reduce_order)
