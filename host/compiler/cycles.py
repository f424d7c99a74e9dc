"""The static cycle model: the golden model's cycle count of every phase,
computed without computing any data.

The fabric's timing does not depend on data (``train.s`` branches only on
record fields and counters), so a phase's cycles are a function of the
compiled schedule alone. :func:`phase_cycles` gets each PE's instruction
stream from :func:`wse.firmware.training.timing.pe_ops` and replays it
(:func:`~wse.host.compiler.replay.replay`), cycle by cycle, against a model of
the routers, edge ports and PE queues that follows ``docs/architecture.md``
sections 3, 4 and 6 (and the golden model) to the cycle: rotating color
priority, atomic multicast, ready bits from start-of-cycle counts, vector
elements written to ``tx`` one cycle after they issue, ``fmacw`` popping a
weight per chunk. The replay is a compiled loop (numba) with two engines of
the same cycle: one visits only the routers, output queues and PEs that can
act in a cycle (:mod:`.replay_events`), the reference visits all of them;
by default each stretch of a run goes to the one that is cheaper there
(:mod:`.replay_adaptive`);
``tests/test_weight_streaming.py`` checks it against the golden model phase
by phase. Phases of many identical rounds skip the proven repeats of their
state (:mod:`.replay_periods`), with the same counts as the full replay.

The replay is a deterministic function of its inputs (route tables, queue
depths, every PE's op rows, the edge ports' injections), so a phase whose
inputs equal an earlier phase's, byte for byte, has its cycles: the hidden
layers of an MLP of equal widths share their ``fwd``, ``bwd-data`` and
``bwd-weight`` replays. Nor do a PE's closing private cycles (the ``BUSY``
rows between its last fabric op and ``END``: the ``relu`` and ``transpose``
after a forward GEMM, the ``mask`` after an input-gradient GEMM) change
anything on the fabric: only when that PE ends. So phases equal but for
them share one replay too (:func:`closing_cycles`): the replay of the
phase without them gives every PE's last cycle, and each phase's count
follows from those and its own closing cycles. :class:`ReplayMemo` keeps
those results (keyed by a digest of the inputs and compared in full on a
hit, so a digest collision cannot change a count); ``reuse=False`` replays
every phase as it is. With ``reuse`` the results also go to the cycle cache
on disk (:mod:`.cycle_cache`, keyed by a SHA-256 of the same inputs, the
configuration and the cycle model's source), so a later compile of the same
phases, in any process, reads them instead of replaying.
"""

from __future__ import annotations

import hashlib
import heapq
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor, as_completed

import numpy as np

from wse.firmware.image import Program
from wse.firmware.training import timing

from .replay import Network, replay, run_replay

__all__ = ["phase_cycles", "executable_cycles", "op_table", "with_end", "phase_ops", "executable_phase_ops",
           "phase_injections", "replay", "Network", "ReplayMemo", "MEMO", "closing_cycles", "replay_volume"]


def closing_cycles(ops: np.ndarray, starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """``(open_ops, closing)``: the op rows with every PE's closing private cycles
    taken out (the ``BUSY`` rows between its last fabric op and ``END`` set to 0
    cycles, in a copy) and those cycles per PE.

    **Rule.** A PE in its closing ``BUSY`` rows neither takes nor sends a
    wavelet: the replay marks it done when it reaches them (``BUSY`` only moves
    its ``free_at`` on, and ``END`` follows at once), so every other PE, queue
    and router, and the idle skip (which passes over done PEs), run the same
    with or without them; only that PE's last cycle moves, by its closing
    cycles. So if the replay of ``open_ops`` takes ``C0`` cycles and PE ``p``
    ran until ``x_p`` in it, the phase takes ``max(C0 - 1, max_p(x_p +
    closing_p)) + 1`` (:meth:`ReplayMemo.finish`; ``C0 - 1`` is the last cycle
    with a move or an exit). Where op ranges overlap (no :func:`op_table`
    does that) nothing is taken out."""
    ops = np.ascontiguousarray(ops, dtype=np.int32)     # the replay's type (no copy of an op table's rows)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    closing = np.zeros(starts.shape[0], dtype=np.int64)
    ranges = sorted(set(zip(starts.tolist(), ends.tolist())))
    if any(b[0] < a[1] for a, b in zip(ranges, ranges[1:])) or not ranges:
        return ops, closing
    open_ops, per_range = ops.copy(), {}
    for start, end in ranges:
        total, k = 0, end - 2
        if end - 1 >= start and ops[end - 1, 0] == timing.END:
            while k >= start and ops[k, 0] == timing.BUSY:
                total += int(ops[k, 1])
                open_ops[k, 1] = 0
                k -= 1
        per_range[start, end] = total
    for p, (start, end) in enumerate(zip(starts.tolist(), ends.tolist())):
        closing[p] = per_range[start, end]
    return open_ops, closing


def _replay_exits(network: Network, ops, starts, ends, inject, *, periods: bool, engine: str | None):
    """``(cycles, last cycle of each PE)`` of one replay (:func:`.replay.run_replay`)."""
    return run_replay(network, ops, starts, ends, inject, periods=periods, engine=engine)


class ReplayMemo:
    """Results of earlier replays, keyed by everything a replay reads.

    :meth:`cycles` returns the replay's count for ``(network, ops, starts,
    ends, inject)``: the stored one when the same inputs were replayed
    before (the last ``size`` distinct inputs are kept), else a new replay's.
    The inputs are taken without the PEs' closing private cycles
    (:func:`closing_cycles`): the stored result is the count and every PE's
    last cycle of that replay, and a phase's count follows from them and its
    own closing cycles (:meth:`finish`). The key is a digest of the route
    tables, queue depths, op rows, each PE's op range and the injections; a
    hit also compares the stored inputs in full, so two different phases
    never share a count.
    """

    def __init__(self, size: int = 32):
        self.size = size
        self.hits = 0
        self._store: OrderedDict = OrderedDict()

    @staticmethod
    def _inputs(network: Network, ops, starts, ends, inject) -> tuple:
        cfg = network.config
        tables = tuple(getattr(network, name) for name in _TABLE_FIELDS)
        depths = np.array([cfg.router_depth, cfg.rx_depth, cfg.tx_depth], dtype=np.int64)
        feed = np.array([(ord(edge), index, color, count) for (edge, index), colors in sorted(inject.items())
                         for color, count in sorted(colors.items())], dtype=np.int64).reshape(-1, 4)
        return (*tables, depths, np.ascontiguousarray(ops, dtype=np.int32), np.asarray(starts, dtype=np.int64),
                np.asarray(ends, dtype=np.int64), feed)

    def key(self, network: Network, ops, starts, ends, inject: dict) -> tuple:
        """``(digest, inputs, closing, open_ops)`` of a replay's inputs without the closing
        cycles (:func:`closing_cycles`): what :meth:`get`, :meth:`put` and :meth:`finish` take;
        ``open_ops`` are the op rows to replay."""
        open_ops, closing = closing_cycles(ops, starts, ends)
        inputs = self._inputs(network, open_ops, starts, ends, inject)
        digest = hashlib.blake2b(_tables_digest(network, inputs[:_TABLES]), digest_size=16)
        for a in inputs[_TABLES:]:
            _digest_array(digest, a)
        return digest.digest(), inputs, closing, open_ops

    @staticmethod
    def finish(result: tuple[int, np.ndarray], key: tuple) -> int:
        """The count of the phase of ``key`` from the replay ``result`` of its inputs without
        the closing cycles (``(cycles, every PE's last cycle)``; :func:`closing_cycles`)."""
        count, exits = result
        closing = key[2]
        if closing.shape[0] == 0:
            return int(count)
        return max(int(count) - 1, int((exits + closing).max())) + 1

    def get(self, key: tuple) -> int | None:
        """The count of these inputs from a stored replay (its inputs compared in full), or None."""
        digest, inputs = key[:2]
        stored = self._store.get(digest)
        if stored is not None and all(x is y or (x.shape == y.shape and np.array_equal(x, y))
                                      for x, y in zip(stored[0], inputs)):
            self._store.move_to_end(digest)
            self.hits += 1
            return self.finish(stored[1], key)
        return None

    def put(self, key: tuple, result: tuple[int, np.ndarray]) -> None:
        """Store the replay ``result`` (``(cycles, every PE's last cycle)``) of these inputs
        (the oldest of more than ``size`` goes)."""
        digest, inputs = key[:2]
        self._store[digest] = (inputs, result)
        while len(self._store) > self.size:
            self._store.popitem(last=False)

    def cycles(self, network: Network, ops, starts, ends, inject: dict, *, periods: bool = True,
               engine: str | None = None) -> int:
        """The replay's cycles of these inputs (:func:`~.replay.replay`), replayed once."""
        key = self.key(network, ops, starts, ends, inject)
        result = self.get(key)
        if result is None:
            stored = _replay_exits(network, key[3], starts, ends, inject, periods=periods, engine=engine)
            self.put(key, stored)
            result = self.finish(stored, key)
        return result


#: The compiler's memo: phases of equal inputs, within one compile and across compiles, are replayed once.
MEMO = ReplayMemo()

# The route tables lead ReplayMemo._inputs; their digest is taken once per network (the 750x994 mesh's
# take 1.7 GB, 3 s a phase to hash).
_TABLE_FIELDS = ("input_port", "output_mask", "n_targets", "target_kind", "target", "target_port")
_TABLES = len(_TABLE_FIELDS)


def _digest_array(digest, a: np.ndarray) -> None:
    """Feed ``a``'s shape and bytes to ``digest``."""
    digest.update(np.array(a.shape, dtype=np.int64).tobytes())
    digest.update(np.ascontiguousarray(a).data)


def _tables_digest(network: Network, tables: tuple) -> bytes:
    """The digest of ``network``'s route tables (``tables``), kept on the network for its next
    phases: a network's tables are not written once built (:class:`~.network.Network`; a stale
    digest could only make a memo miss, as a hit compares the inputs in full)."""
    kept = network.__dict__.get("_tables_digest")
    if kept is None or any(x is not y for x, y in zip(kept[0], tables)):
        digest = hashlib.blake2b(digest_size=16)
        for a in tables:
            _digest_array(digest, a)
        kept = network.__dict__["_tables_digest"] = (tables, digest.digest())
    return kept[1]


def _workers(jobs: int, workers: int | None) -> int:
    """Threads for ``jobs`` replays: ``workers``, or one per CPU this process may use."""
    if workers is None:
        workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(jobs, workers))


def replay_volume(ops, starts, ends) -> int:
    """A replay's size for ordering work: PEs times the longest PE's private and
    vector cycles (``BUSY`` cycles plus vector lengths; no stalls).

    The distinct replays of a compile start longest first on the threads
    (:func:`_replay_phases`), so a long one does not start last behind short
    ones (on two threads the 2048-wide MLP's cycle model then waits about its
    longest replay, not that one after two others); the order changes no count."""
    ops = np.asarray(ops)
    starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
    if starts.shape[0] == 0:
        return 0
    own = np.where((ops[:, 0] == timing.BUSY) | (ops[:, 0] == timing.VEC), ops[:, 1], 0).astype(np.int64)
    total = np.concatenate([[0], np.cumsum(own)])
    return int((total[ends] - total[starts]).max()) * int(starts.shape[0])


def _replay_phases(network: Network, phases, count: int, *, periods: bool, reuse: bool, engine: str | None,
                   progress: bool, workers: int | None) -> dict[str, int]:
    """Cycles of ``phases`` (``(name, (ops, starts, ends), inject)``, ``count`` of them), each
    distinct replay once.

    ``phases`` may be a generator: each phase's op table is taken one at a time and
    kept only while a replay needs it (a phase whose count is known already is
    dropped at once), so a big mesh holds the distinct tables only, not every
    phase's (the 750x994 mesh's nine tables take 7 GB as int64 rows, its distinct
    ones half of that). Phases whose inputs equal an earlier one's (in this call or, with ``reuse``,
    in :data:`MEMO`) share its count; the distinct replays run on ``workers``
    threads (the compiled loops release the GIL; every replay has its own state,
    and a replay's count does not depend on which thread runs it). A replay starts as soon as its
    table is built and a thread is free, while the next tables are built (on the 750x994 mesh the
    nine tables took 208 s on one thread before any replay began); a free thread takes the longest
    replay whose table is ready (:func:`replay_volume`)."""
    from . import cycle_cache
    from .progress import Progress

    out, todo, names, results, order_of = {}, {}, {}, {}, []
    disk = cycle_cache.open_cache(network) if reuse else None      # replays kept across processes
    tally = cycle_cache.TALLY
    ready: list = []                # (-volume, order, digest) of the replays whose tables are built
    lock = threading.Lock()

    def replay_next():
        with lock:
            digest = heapq.heappop(ready)[2]
        began = time.thread_time()
        result = _replay_exits(*todo[digest][1], periods=periods, engine=engine)
        return digest, result, time.thread_time() - began

    def finished(digest, result, cpu) -> None:
        first = names[digest][0][0]
        tally.replay_cpu_s[first] = tally.replay_cpu_s.get(first, 0.0) + cpu
        if reuse:
            MEMO.put(todo[digest][0], result)
            tally.replayed += 1
            tally.stored += disk is not None and disk.put(todo[digest][0], result)
        results[digest] = result
        for name, key in names.pop(digest):
            out[name] = MEMO.finish(result, key) if reuse else int(result[0])
            bar.step(name)
        del todo[digest]            # its tables go with it

    with Progress("cycle model", count, enabled=progress) as bar, \
            ThreadPoolExecutor(_workers(count, workers)) as pool:
        running = set()
        try:
            for name, (ops, starts, ends), inject in phases:
                order_of.append(name)
                if reuse:           # the inputs without the closing cycles (closing_cycles), shared where equal
                    key = MEMO.key(network, ops, starts, ends, inject)
                    digest, replayed = key[0], key[3]
                else:               # every phase replayed as it is
                    key, digest, replayed = None, name, ops
                if digest in results:           # its inputs' replay ran in this call
                    out[name] = MEMO.finish(results[digest], key) if reuse else int(results[digest][0])
                    bar.step(name)
                    continue
                if reuse and digest not in todo:
                    hit = MEMO.get(key)
                    if hit is None and disk is not None and (stored := disk.get(key)) is not None:
                        MEMO.put(key, stored)
                        tally.cached += 1
                        hit = MEMO.finish(stored, key)
                    elif hit is not None:
                        tally.shared += 1
                    if hit is not None:
                        out[name] = hit
                        bar.step(name)
                        continue
                if digest not in todo:
                    todo[digest] = (key, (network, replayed, starts, ends, inject))
                    with lock:
                        heapq.heappush(ready, (-replay_volume(replayed, starts, ends), len(order_of), digest))
                    running.add(pool.submit(replay_next))
                # Only the replay's own key keeps its tables; a phase of the same inputs keeps its closing
                # cycles (all MEMO.finish reads), so a table no replay needs goes now, not after the loop.
                names.setdefault(digest, []).append((name, key if key is None or todo[digest][0] is key
                                                     else (digest, None, key[2], None)))
                del ops, replayed, key
                for done in [f for f in running if f.done()]:
                    running.discard(done)
                    finished(*done.result())
            for done in as_completed(running):
                finished(*done.result())
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if disk is not None and disk.wrote:
        disk.trim()
    return {name: out[name] for name in order_of}


def op_table(config, pe_words, pe_ops, pe_key=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every PE's timing ops as ``(ops, starts, ends)`` for the replay: PE ``p``
    (row-major) runs ``ops[starts[p]:ends[p]]``. ``pe_words(y, x)`` is the
    PE's record words (its end record included) and ``pe_ops(words)`` the
    interpreter's timing mirror; PEs with identical words share one op list.
    ``pe_key(y, x)``, if given, is a key that PEs with the same words may share
    (never two PEs with different words): a PE whose key was seen takes that
    PE's list without its words being built (the wafer's 745,500 PEs hold
    994 to 2,982 distinct lists a phase)."""
    table, starts, ends, seen, by_key = [], [], [], {}, {}
    at = 0
    for i in range(config.height):
        for j in range(config.width):
            key = pe_key(i, j) if pe_key is not None else None
            span = by_key.get(key) if key is not None else None
            if span is None:
                words = pe_words(i, j)
                content = words.tobytes()
                if content not in seen:
                    ops = pe_ops(words)
                    seen[content] = (at, at + len(ops))
                    table.append(ops)
                    at += len(ops)
                span = seen[content]
                if key is not None:
                    by_key[key] = span
            starts.append(span[0])
            ends.append(span[1])
    rows = np.concatenate(table)
    if rows.size and (rows.min() < np.iinfo(np.int32).min or rows.max() > np.iinfo(np.int32).max):
        raise ValueError("a timing op's field does not fit the replay's int32 op rows")
    # int32, the replay's type: half the bytes (the 750x994 mesh's distinct tables take 1.7 GB, not 3.5)
    return rows.astype(np.int32), np.array(starts), np.array(ends)


def with_end(records) -> np.ndarray:
    """A PE's list of record word arrays as one array, the two-word end record appended."""
    return np.concatenate(list(records) + [np.zeros(2, dtype=np.uint32)])


def phase_ops(plan, phase) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All PEs' timing ops of a weight-streaming ``phase`` (:func:`op_table`)."""
    records = phase.records          # PEs with equal records share the arrays (ws_phases.SHARE): keyed by them
    return op_table(plan.config, lambda i, j: with_end(records[i][j]), timing.pe_ops,
                    lambda i, j: tuple(map(id, records[i][j])))


def executable_phase_ops(exe, image: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All PEs' timing ops of a phase of a weight-streaming executable from its op
    image ``[height, width, words]`` (:func:`op_table`)."""
    return op_table(exe.config, lambda i, j: image[i, j], timing.pe_ops)


def phase_injections(phase) -> dict:
    """The wavelets the edge ports inject in ``phase``: ``{(edge, index): {color: count}}``."""
    inject: dict = {}
    for stream in phase.streams_in:
        per_color = inject.setdefault((stream.edge, stream.index), {})
        per_color[stream.color] = per_color.get(stream.color, 0) + len(stream.gather)
    return inject


def phase_cycles(plan, program: Program | None = None, *, periods: bool = True,
                 progress: bool = True, reuse: bool = True, engine: str | None = None,
                 workers: int | None = None) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming plan, as the golden model counts them.

    ``periods`` lets the replay skip proven repeats (:mod:`.replay_periods`;
    the counts are the same either way); ``reuse`` takes the count of a phase
    whose replay inputs equal an earlier one's, but for the PEs' closing
    private cycles (:func:`closing_cycles`), from :data:`MEMO` or the cycle
    cache on disk (:mod:`.cycle_cache`; same counts;
    ``False`` replays every phase as it is: the reference path with
    ``periods=False`` and ``engine="reference"``); ``engine`` picks the replay's cycle loop
    (:data:`~.replay.ENGINES`; the same counts); the distinct replays run on
    ``workers`` threads (one per CPU by default; the same counts);
    ``progress`` reports the phases on stderr when the model takes more than a
    few seconds (:mod:`.progress`).
    ``program`` is not needed (the timing ops follow ``train.s``); it is
    accepted for callers that pass it.
    """
    network = Network(plan.config, plan.routes)
    phases = ((name, phase_ops(plan, phase), phase_injections(phase)) for name, phase in plan.phases.items())
    return _replay_phases(network, phases, len(plan.phases), periods=periods, reuse=reuse, engine=engine,
                          progress=progress, workers=workers)


def executable_cycles(exe, *, periods: bool = True, progress: bool = True, reuse: bool = True,
                      engine: str | None = None, workers: int | None = None) -> dict[str, int]:
    """Cycles of every phase of a weight-streaming executable, from what it
    holds (op images, routes, weight streams): the counts
    :func:`phase_cycles` gives at compile time, for an executable compiled
    without them (``generate(plan, cycles=False)``); ``periods``, ``progress``,
    ``reuse``, ``engine`` and ``workers`` as for :func:`phase_cycles`."""
    if exe.mode != "weight_streaming":
        raise ValueError(f"executable_cycles models weight-streaming executables, not mode {exe.mode!r}")
    images = {addr: image for addr, image in exe.static}
    network = Network(exe.config, exe.routes)
    phases = ((name, executable_phase_ops(exe, images[phase.ops_addr]), phase_injections(phase))
              for name, phase in exe.phases.items())
    return _replay_phases(network, phases, len(exe.phases), periods=periods, reuse=reuse, engine=engine,
                          progress=progress, workers=workers)
