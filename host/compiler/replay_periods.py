"""Periods of the replay: skipping the repeats of a proven period of the
fabric's whole state, so that a phase of many identical rounds costs the
replay of a few.

The replay (:mod:`.replay`) is deterministic, and what it does from the start
of cycle ``t`` on depends only on

* the *relative state* at ``t``: every router FIFO's and input queue's
  occupancy, every output queue's colors from its head, each PE's
  ``free_at - t`` (0 when it is due), its element index in a vector
  instruction, whether its last fabric-bound element enters the output queue
  at ``t``, whether it reached ``END``, the elements issued in ``t - 1``
  still to enter the output queues, ``t mod colors`` (the rotating color
  priority), and for every edge port and color whether wavelets are left;
* and the op rows each PE reads from its ``pc`` on.

So if the relative states at ``t2`` and ``t3 = t2 + D`` are equal, every PE
``p`` moved ``d_p`` op rows on, and the rows a PE reads in the next periods
repeat with period ``d_p`` (``ops[y] == ops[y - d_p]`` for ``y`` in
``pc_p .. pc_p + m*d_p``), and every edge port keeps wavelets of a color for
as long as it did (``left >= 1`` after ``m`` more periods), then the next
``m`` periods repeat the one from ``t2`` to ``t3`` exactly: each PE moves
``m*d_p`` rows on, each port injects ``m`` times what it did, the clock moves
``m*D`` cycles on, and the state at the end is the state at ``t3`` with those
shifts. :func:`run_with_periods` applies that skip and replays on.

Finding candidates is cheap and needs no proof: the replay stops whenever
one PE (the one with the longest op list) stands at a new op row, a hash of
the relative state (and each PE's current op row) is looked up among the
earlier stops, and on a repeat the earlier stop's kept state
(:class:`_History`) is compared with the current one exactly, as above, at
once; where that state is no longer kept, a repeat (with ``D`` or a multiple
of it that is a multiple of ``colors``) is checked by replaying one more
period and comparing the two states then. A skip is taken only on an exact
check. When the watched PE's op list has
an inner loop inside its rounds, both levels are watched: inner skips stop
short of the watched PE's next round, so every round is entered in the true
state, and repeats of whole rounds (periods that are multiples of
``colors``) are skipped too (:func:`run_with_periods`). Inner stops are
counted from the first row of the watched PE's round, and inner skips land
at one rotation phase where they can (:data:`ROUND_ALIGNED`), so that rounds
alike pass states alike (choices of where to look and how far to skip: any
skip is taken on the exact check alone).
A state that comes back without a period to skip (the rounds left after a
phase's last skip, a weight-gradient step that meets a state of an earlier
one) goes on at once the way it went before: consecutive stops are kept as
transitions (:class:`_Transitions`), and a state equal to a transition's
first one, under the same conditions on op rows, edge ports and the
rotation, takes its second one (:func:`_jump`).
``tests/test_compile_speed.py`` and ``tests/test_replay_periods.py``
check that the counts equal the replay without skips and the golden model.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .replay import (_CONFLICTS, _FIFOS, _FINISHED, _LAST, _RUNNING, _SEEN_PC, _STOPPED, _T, _TO_INJECT, _TX, _WRITE,
                     _new_scalars, _run)

__all__ = ["run_with_periods"]

#: Repeats of a hashed state awaiting their exact check at once (each holds a copy of the state).
_MAX_CANDIDATES = 4
#: Bytes of kept states per level of stops (:class:`_History`).
_SNAPSHOT_BYTES = 128 << 20
#: Bytes of kept transitions (:class:`_Transitions`): the states of half a weight-gradient phase's steps on 128x128.
_TRANSITION_BYTES = 512 << 20
#: The fewest transitions kept, whatever their bytes: the streamed GEMM's last round on 994 rows follows
#: the stops of 6,719 cycles (47 stops) before it for 3,557 cycles, which 512 MiB held on 128 columns
#: (10 MB a state) and not from 256 on (docs/weight_streaming.md section 9, item 3).
_TRANSITION_STATES = 64
#: Inner stops counted from the start of the watched PE's round and inner skips landing at an aligned
#: rotation phase (:func:`run_with_periods`); False: the stops and skips of before (the same counts).
ROUND_ALIGNED = True

@njit(cache=True, nogil=True)
def _state_hash(queues, cores, events, left, ops, t):
    """A 64-bit hash of the relative state at the start of cycle ``t`` and each PE's current op row."""
    h = np.uint64(1469598103934665603)
    mix = np.uint64(0x9E3779B97F4A7C15)

    def add(h, v):
        return (h ^ np.uint64(v & 0xFFFFFFFFFFFF)) * mix + np.uint64(7)

    fifo, rx = queues.router_fifo, queues.rx
    depth = queues.tx_colors.shape[1]
    for r in range(fifo.shape[0]):
        for c in range(fifo.shape[1]):
            h = add(h, fifo[r, c] * 64 + rx[r, c])
        n = queues.tx_count[r]
        h = add(h, n)
        for k in range(n):
            h = add(h, queues.tx_colors[r, (queues.tx_head[r] + k) % depth])
        if cores.done[r]:
            h = add(h, -1)
            continue
        free = cores.free_at[r] - t
        h = add(h, free if free > 0 else 0)
        h = add(h, cores.vector_index[r] * 2 + (1 if cores.written_at[r] == t else 0))
        row = cores.pc[r]
        for f in range(ops.shape[1]):
            h = add(h, ops[row, f])
    writes = np.uint64(0)          # in any order: the engines record them in different orders
    for g in range(events.count[_WRITE]):
        writes += add(np.uint64(0), events.who[_WRITE, g] * 64 + events.color[_WRITE, g])
    h = add(h, writes)
    for p in range(left.shape[0]):
        for c in range(left.shape[1]):
            h = add(h, 1 if left[p, c] > 0 else 0)
    return h


def _small(a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` in the smallest of int8, int16 and int32 that holds its values (the value, not
    the type, is what states are compared by): queue counts and colors take a byte, the cycles a PE
    has left a byte or two, op rows four bytes, against eight."""
    if a.size == 0:
        return a.astype(np.int8)
    low, high = a.min(), a.max()
    for kind in (np.int8, np.int16, np.int32):
        if np.iinfo(kind).min <= low and high <= np.iinfo(kind).max:
            return a.astype(kind)
    return a.copy()


#: A kept state (and the region replay's record) holds a color's router FIFO and input queue counts in
#: one byte, the FIFO's plus this times the queue's, when both are below it (a kept state's
#: ``"queued"``; else both as they are, ``"fifo"`` and ``"rx"``).
_RX_UNIT = 16


def _packed_queues(fifo: np.ndarray, rx: np.ndarray) -> dict:
    """The kept state's queue counts (:data:`_RX_UNIT`): half the bytes of both arrays when they fit."""
    both = fifo | rx
    if fifo.dtype.itemsize == 1 and (both.size == 0 or (both.min() >= 0 and both.max() < _RX_UNIT)):
        return {"queued": fifo.view(np.uint8) + rx.view(np.uint8) * np.uint8(_RX_UNIT)}
    return {"fifo": _small(fifo), "rx": _small(rx)}


def queue_counts(rel: dict) -> tuple[np.ndarray, np.ndarray]:
    """The router FIFO and input queue counts of a kept state's ``rel`` (:func:`_packed_queues`)."""
    if "queued" in rel:
        return rel["queued"] % np.uint8(_RX_UNIT), rel["queued"] // np.uint8(_RX_UNIT)
    return rel["fifo"], rel["rx"]


def _same_rel(a: dict, b: dict, keys) -> bool:
    """The kept states' ``rel`` entries ``keys`` are equal (and both hold the same entries)."""
    return a["rel"].keys() == b["rel"].keys() and all(np.array_equal(a["rel"][k], b["rel"][k]) for k in keys)


def _snapshot(queues, cores, events, ports, t: int, colors: int, scalars, extra=None) -> dict:
    """The relative state at the start of cycle ``t`` (``pc`` and ``left`` kept apart: they may differ);
    an ``extra`` state (a reduced replay's checks, :mod:`.replay_columns`) adds its own."""
    depth = queues.tx_colors.shape[1]
    n = queues.tx_count.shape[0]
    order = (queues.tx_head[:, None] + np.arange(depth)[None, :]) % depth
    tx = np.take_along_axis(queues.tx_colors, order, axis=1)
    tx[np.arange(depth)[None, :] >= queues.tx_count[:, None]] = -1
    active = ~cores.done
    writes = np.full(n, -1, dtype=np.int8)       # a PE issues one element a cycle: its pending write's color
    writes[events.who[_WRITE, :events.count[_WRITE]]] = events.color[_WRITE, :events.count[_WRITE]]
    snap = {
        "rel": dict(**_packed_queues(queues.router_fifo, queues.rx), tx=_small(tx), done=cores.done.copy(),
                    free=_small(np.where(active, np.maximum(cores.free_at - t, 0), 0)),
                    index=_small(np.where(active, cores.vector_index, 0)),
                    written=active & (cores.written_at == t),
                    writes=writes,
                    has_left=ports.left > 0, phase=np.array([t % colors]), n=np.array([n])),
        "pc": _small(cores.pc), "left": ports.left.copy(), "t": t, "conflicts": int(scalars[_CONFLICTS]),
        "free_all": _small(cores.free_at - t), "last": int(scalars[_LAST])}
    if extra:
        extra.keep(snap, t)
    return snap


def _same(a: dict, b: dict) -> bool:
    """The relative states are equal; the color rotation's phase only matters
    if a grant depended on it between them (a conflict)."""
    return _same_rel(a, b, [k for k in a["rel"] if k != "phase" or b["conflicts"] != a["conflicts"]])


@njit(cache=True, nogil=True)
def _repeats(ops, pcs, shifts, most):
    """The most periods ``m <= most`` such that, for every ``(pc, d)``, ``ops[y] == ops[y - d]``
    for ``y`` in ``pc .. pc + m*d``."""
    rows, fields = ops.shape
    for i in range(pcs.shape[0]):
        pc, d = pcs[i], shifts[i]
        y = pc
        stop = pc + most * d
        while y <= stop:
            if y >= rows:
                break
            same = True
            for f in range(fields):
                if ops[y, f] != ops[y - d, f]:
                    same = False
                    break
            if not same:
                break
            y += 1
        # rows pc .. y-1 repeat: m*d <= y - 1 - pc
        m = (y - 1 - pc) // d
        if m < most:
            most = m
            if most <= 0:
                return 0
    return most


def _skip(first: dict, second: dict, ops, cores, ports, scalars, limit: int, cap=None, extra=None) -> int:
    """Skip the most repeats (at most ``cap``, if given) of the period from ``first`` to
    ``second`` (the current state) that are proven to repeat; returns how many (0: none).
    ``cap`` may be ``(most, colors)``: then the skip lands, where it can, at the rotation
    phase ``t mod gcd(period, colors)`` (fewer repeats), so that skips of rounds alike land
    in states alike, whose transitions a later round can take (:func:`_jump`)."""
    cap, align = cap if isinstance(cap, tuple) else (cap, 0)
    period = second["t"] - first["t"]
    shift = second["pc"].astype(np.int64) - first["pc"]
    if period <= 0 or (shift < 0).any():
        return 0
    most = (limit - 1 - second["t"]) // period
    if cap is not None:
        most = min(most, cap)
    injected = first["left"] - second["left"]
    if (injected < 0).any():
        return 0
    feeding = injected > 0
    if feeding.any():
        most = min(most, int(((second["left"][feeding] - 1) // injected[feeding]).min()))
    moving = (shift > 0) & ~cores.done
    if moving.any() and most > 0:
        pairs = np.unique(np.stack([second["pc"][moving], shift[moving]], axis=1), axis=0)     # int64, as shift
        most = _repeats(ops, np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]), most)
    if align and most > 0:      # a choice of how many to skip: any number up to ``most`` is proven
        wanted = second["t"] % math.gcd(period, align)
        most = next((m for m in range(most, max(most - align, 0), -1)
                     if (second["t"] + m * period) % align == wanted), most)
    if most <= 0:
        return 0
    span = most * period
    cores.pc[:] += most * shift
    live = ~cores.done          # a PE done before the period keeps its exit (a repeat cannot end a PE)
    cores.free_at[live] += span
    cores.written_at[live] += span
    cores.waited_at[live] += span
    ports.left[:] -= most * injected
    ports.left_total[:] = ports.left.sum(axis=1)
    scalars[_TO_INJECT] -= most * int(injected.sum())
    scalars[_T] += span
    if scalars[_LAST] >= first["t"]:
        scalars[_LAST] += span
    if extra:
        extra.skipped(first["t"], second["t"], span)
    return most


def _row_period(rows: np.ndarray) -> int:
    """The smallest period of the middle half of an op list (0 if it has none
    shorter than a quarter of the list): the length of a round of its loop."""
    n = rows.shape[0]
    window = rows[n // 4: n - n // 4]
    if window.shape[0] < 8:
        return 0
    ids = np.unique(window, axis=0, return_inverse=True)[1].ravel()
    fail = _prefix_function(ids.astype(np.int64))
    period = window.shape[0] - fail[-1]
    return int(period) if 0 < period <= window.shape[0] // 2 else 0


def _stride(rows: np.ndarray) -> int:
    """The op rows between two stops of the watched PE: a round of its loop
    (:func:`_row_period`), or, when the middle of a round (of the list, if it
    has no rounds) repeats a loop 16 or more times shorter (the weight
    gradients' per-value transfers and outputs), that loop, so that a repeat
    inside a round is found too (0: no loop at all). Any
    choice gives the same counts (a skip is taken only on the exact check);
    it only decides where repeats are looked for."""
    stride = _row_period(rows)
    middle = (rows.shape[0] // stride // 2) * stride + stride // 2 if stride else rows.shape[0] // 2
    inner = _row_period(rows[max(middle - 32, 0):middle + 32])
    return inner if 0 < inner and (stride == 0 or 16 * inner <= stride) else stride


@njit(cache=True)
def _prefix_function(seq):
    """Knuth-Morris-Pratt: ``fail[i]``, the longest proper border of ``seq[:i + 1]``."""
    fail = np.zeros(seq.shape[0], dtype=np.int64)
    k = 0
    for i in range(1, seq.shape[0]):
        while k > 0 and seq[i] != seq[k]:
            k = fail[k - 1]
        if seq[i] == seq[k]:
            k += 1
        fail[i] = k
    return fail


def _check(candidates: list, t: int, state, ops, cores, ports, scalars, limit: int, cap) -> bool:
    """Check the candidates due at ``t`` (dropping those due before); skip on the
    first exact repeat (at most ``cap(first, second)`` periods). True if skipped."""
    queues, events, colors, extra = state
    due = [c for c in candidates if c[0]["t"] + c[1] <= t]
    candidates[:] = [c for c in candidates if c[0]["t"] + c[1] > t]
    second = None
    for first, period in due:
        if first["t"] + period != t:
            continue
        second = second or _snapshot(queues, cores, events, ports, t, colors, scalars, extra)
        if _same(first, second) and _skip(first, second, ops, cores, ports, scalars, limit, cap(first, second),
                                          extra):
            if second["conflicts"] != first["conflicts"]:
                # the skipped cycles had rotation-dependent grants too: a longer
                # window around them must not count as free of them
                scalars[_CONFLICTS] += 1
            return True
    return False


class _History:
    """The stops of one level: per state hash, the cycles it was seen at and, for
    the latest stops (at most ``budget`` bytes of them), the state itself, so a
    repeat is checked the moment its hash comes back (no period replayed to
    check it), at every earlier stop of that hash, latest first, which also
    finds a period that must be a multiple of ``colors``."""

    def __init__(self, budget: int):
        self.budget = budget
        self.by_key: dict[int, list] = {}
        self.kept: list = []          # entries holding a snapshot, oldest first
        self.bytes = 0

    def clear(self) -> None:
        self.by_key.clear()
        self.kept.clear()
        self.bytes = 0

    def earlier(self, key: int) -> list:
        """``[t, snapshot or None]`` entries of ``key``, oldest first."""
        return self.by_key.get(key, [])

    def add(self, key: int, snap: dict) -> None:
        entry = [snap["t"], snap]
        self.by_key.setdefault(key, []).append(entry)
        size = _snapshot_bytes(snap)
        self.kept.append((entry, size))
        self.bytes += size
        while self.bytes > self.budget and len(self.kept) > 1:
            old, old_size = self.kept.pop(0)
            old[1] = None
            self.bytes -= old_size


def _snapshot_bytes(snap: dict) -> int:
    return sum(a.nbytes for a in snap["rel"].values()) + snap["pc"].nbytes + snap["left"].nbytes + \
        snap["free_all"].nbytes


class _Transitions:
    """Pairs of consecutive stops with nothing skipped between them, ``(a, b)``, by the
    hash of ``a``'s state, the latest ones (at most ``budget`` bytes of ``b`` states, or
    the latest ``least`` whatever their bytes): a state equal to ``a`` later goes on to
    ``b``'s state (:func:`_jump`). Unlike the histories they are kept across skips, so
    the rounds after a phase's last skip can follow the rounds before it."""

    def __init__(self, budget: int, least: int = 1):
        self.budget, self.least = budget, max(1, least)
        self.by_key: dict[int, list] = {}
        self.order: list = []
        self.bytes = 0

    def add(self, key: int, a: dict, b: dict) -> None:
        pairs = self.by_key.setdefault(key, [])
        pairs.append((a, b))
        size = _snapshot_bytes(b)
        self.order.append((key, size))
        self.bytes += size
        while self.bytes > self.budget and len(self.order) > self.least:
            old, old_size = self.order.pop(0)
            self.by_key[old].pop(0)
            self.bytes -= old_size

    def earlier(self, key: int) -> list:
        """The pairs whose first state had hash ``key``, latest first."""
        return self.by_key.get(key, [])[::-1]


@njit(cache=True, nogil=True)
def _same_rows(ops, here, there, lengths):
    """For every ``i``: rows ``here[i] .. here[i] + lengths[i]`` of ``ops`` equal rows
    ``there[i] ..`` (inside ``ops``)."""
    rows, fields = ops.shape
    for i in range(here.shape[0]):
        if there[i] + lengths[i] >= rows or here[i] + lengths[i] >= rows:
            return False
        for k in range(lengths[i] + 1):
            for f in range(fields):
                if ops[here[i] + k, f] != ops[there[i] + k, f]:
                    return False
    return True


def _jump(transitions: _Transitions, key: int, now: dict, ops, state, cores, ports, scalars, limit: int) -> bool:
    """Go on from ``now`` the way an earlier equal state went on to its next stop, at once.

    **Rule.** If the relative state now equals the state ``a`` of an earlier stop
    (the rotation's phase too unless no grant from ``a`` to its next stop ``b``
    depended on it), every PE's op rows from here repeat the rows it ran
    from ``a`` to ``b`` (the row it stood at in ``b`` included), and every edge port
    keeps each color's wavelets through the same cycles (it had some left at ``b``
    and still has after injecting as many, or it holds exactly what it held at
    ``a``), then the deterministic replay takes the same decisions from here as from
    ``a``, cycle for cycle, and reaches ``b``'s state ``b.t - a.t`` cycles later, each
    PE ``pc_b - pc_a`` rows on, each port's counts down by what it injected: that
    state is set (``b``'s queues, cores and pending writes; PEs done before keep
    their exit cycle). True if it jumped."""
    queues, events, colors, extra = state
    usable = [(a, b) for a, b in transitions.earlier(key)      # the rotation's phase first: same hash, any phase
              if not (now["t"] - a["t"]) % colors or b["conflicts"] == a["conflicts"]]
    for a, b in usable[:_MAX_CANDIDATES]:
        if a["t"] >= now["t"] or not _same_rel(a, now, [k for k in a["rel"] if k != "phase"]):
            continue
        span = b["t"] - a["t"]
        if now["t"] + span >= limit:
            continue
        moved = b["pc"].astype(np.int64) - a["pc"]
        active = ~a["rel"]["done"]
        if (moved < 0).any() or not _same_rows(ops, now["pc"][active].astype(np.int64),
                                              a["pc"][active].astype(np.int64), moved[active]):
            continue
        injected = a["left"] - b["left"]
        left = now["left"] - injected
        if (injected < 0).any() or not np.where(b["left"] > 0, left > 0, now["left"] == a["left"]).all():
            continue
        _restore(b, now, a, left, queues, cores, events, ports, scalars)
        if extra:
            extra.restored(b, now, a)
        return True
    return False


def _restore(b: dict, now: dict, a: dict, left, queues, cores, events, ports, scalars) -> None:
    """Set the state ``b`` (of a stop after ``a``) as reached from ``now`` (:func:`_jump`)."""
    t = now["t"] + b["t"] - a["t"]
    rel = b["rel"]
    fifo, rx = queue_counts(rel)
    queues.router_fifo[:] = fifo
    colors = fifo.shape[1]
    queues.busy_fifos[:] = ((fifo > 0).astype(np.int64) << np.arange(colors, dtype=np.int64)).sum(axis=1)
    queues.rx[:] = rx
    queues.tx_count[:] = (rel["tx"] >= 0).sum(axis=1)
    queues.tx_head[:] = 0
    queues.tx_colors[:] = np.maximum(rel["tx"], 0)
    done_before = now["rel"]["done"]
    cores.pc[:] = b["pc"].astype(np.int64) + (now["pc"] - a["pc"])
    cores.free_at[:] = np.where(done_before, cores.free_at, b["free_all"].astype(np.int64) + t)
    cores.vector_index[:] = rel["index"]
    cores.written_at[:] = np.where(rel["written"], t, -1)
    cores.done[:] = rel["done"]
    who = np.flatnonzero(rel["writes"] >= 0)
    events.count[_WRITE] = who.shape[0]
    events.who[_WRITE, :who.shape[0]] = who
    events.color[_WRITE, :who.shape[0]] = rel["writes"][who]
    ports.left[:] = left
    ports.left_total[:] = left.sum(axis=1)
    scalars[_T] = t
    scalars[_RUNNING] = int((~cores.done).sum())
    scalars[_FIFOS] = int((fifo > 0).sum())
    scalars[_TX] = int(queues.tx_count.sum())
    scalars[_TO_INJECT] = int(left.sum())
    if b["last"] >= a["t"]:
        scalars[_LAST] = max(int(scalars[_LAST]), b["last"] + now["t"] - a["t"])
    scalars[_CONFLICTS] += b["conflicts"] - a["conflicts"]


def _look_back(history: _History, key: int, now: dict, ops, cores, ports, scalars, limit: int, cap,
               extra=None) -> bool:
    """Skip on the latest earlier stop of hash ``key`` whose kept state equals ``now`` (an exact repeat:
    :func:`_same`, then :func:`_skip`); True if skipped."""
    for t_before, first in reversed(history.earlier(key)):
        if first is None or t_before >= now["t"] or not _same(first, now):
            continue
        if _skip(first, now, ops, cores, ports, scalars, limit, cap(first, now), extra):
            if now["conflicts"] != first["conflicts"]:
                scalars[_CONFLICTS] += 1       # as in _check: the skipped cycles had rotation-dependent grants
            return True
    return False


def _propose(candidates: list, history: _History, key: int, now: dict, spans) -> None:
    """Keep the state ``now`` under its hash ``key``; on a repeat whose earlier state is no longer kept,
    queue its periods (``spans(period)``) to be checked against ``now`` when they are due."""
    earlier = history.earlier(key)
    before = earlier[-1] if earlier else None
    history.add(key, now)
    if before is None or before[1] is not None:
        return
    for span in spans(now["t"] - before[0]):
        if len(candidates) < _MAX_CANDIDATES and all(span != c[1] for c in candidates):
            candidates.append((now, span))


def _result(status: int, scalars) -> int:
    """A run's result from the status it ended with: its cycles when it finished, else the negative code."""
    return int(scalars[_LAST] + 1) if status == _FINISHED else int(status)


def run_with_periods(routes, ports, ops, queues, cores, events, limit: int, watch: int, end: int,
                     run=_run, scalars=None, extra=None, region=None) -> int:
    """The replay's result (cycles, or a negative hang code) from a fresh state,
    skipping the proven repeats of periods of the fabric's state (module docstring).
    ``run`` is the engine (:func:`.replay._run` or :func:`.replay_events.run_events`'s).

    Repeats are looked for on two levels of the watched PE's op list: its
    inner loop (:func:`_stride`) and its rounds (:func:`_row_period`). An
    inner skip never carries the watched PE into its next round, so every
    round's first cycle is replayed and the rounds' states are compared too:
    a phase of many rounds replays a few of them. The rotation rule is the
    same on both levels: a period that is not a multiple of ``colors`` is
    taken only if no grant in it depended on the rotation, counting the
    inner skips inside it (a skipped period that had such grants marks the
    conflict counter). A stop that skips nothing may still jump to a known
    successor of its state (:func:`_jump`); the state a skip or a jump lands
    in is taken as the next stop. ``scalars`` (a run's counters) go on from a
    state that is not fresh; an ``extra`` state (:mod:`.replay_columns`) is
    compared, kept, shifted by skips and set by jumps with the fabric's. A ``region``
    (:class:`.replay_region.RegionSearch`) is offered every stop that skipped nothing, told whether
    the watched PE is in its first round and where it stands in its round (which of
    :data:`.replay_region.POINTS` equal parts of it)."""
    from .replay_region import POINTS as region_points
    colors = routes.input_port.shape[1]
    scalars = _new_scalars(cores.pc, ports, watch) if scalars is None else scalars
    base = int(cores.pc[watch])
    stride = _stride(ops[base:end])
    if stride == 0:           # no rounds to repeat: the plain replay
        scalars[_SEEN_PC] = limit
        status = run(routes, ports, ops, queues, cores, events, scalars, limit, -1)
        return _result(status, scalars)
    outer = _row_period(ops[base:end])
    outer = outer if outer > stride else 0
    state = (queues, events, colors, extra)

    def following(level: int, pc: int, start: int = base) -> int:
        return start + ((pc - start) // level + 1) * level

    def next_stop() -> int:
        """The watched PE's next inner stop, counted from the start of its round (so every round
        stops at the same rows of it), or the next round's start."""
        pc = int(cores.pc[watch])
        if not outer or not ROUND_ALIGNED:
            return min(following(stride, pc), following(outer, pc)) if outer else following(stride, pc)
        return min(following(stride, pc, base + (pc - base) // outer * outer), following(outer, pc))

    def inner_cap(first, second):
        """Inner skips end before the watched PE's next round begins, at an aligned rotation phase."""
        moved = int(second["pc"][watch] - first["pc"][watch])
        if not outer or moved <= 0:
            return None
        most = (following(outer, int(second["pc"][watch])) - 1 - int(second["pc"][watch])) // moved
        return (most, colors) if ROUND_ALIGNED else most

    def spans(period: int) -> list:
        return sorted({period, period * colors // math.gcd(period, colors)})

    scalars[_SEEN_PC] = next_stop()
    seen, rounds_seen = _History(_SNAPSHOT_BYTES), _History(_SNAPSHOT_BYTES)
    transitions = _Transitions(min(_TRANSITION_BYTES, 4 * _SNAPSHOT_BYTES), _TRANSITION_STATES)
    previous = None                       # (hash, state) of the last stop, if nothing was skipped since
    landed = False                        # a skip or a jump landed: take its state as a stop without running
    candidates: list = []                 # (snapshot at t2, period D): checked at t2 + D
    round_candidates: list = []
    last_round = 0

    def round_skipped() -> None:
        nonlocal last_round
        last_round = (int(cores.pc[watch]) - base) // outer
        scalars[_SEEN_PC] = next_stop()
        seen.clear(), candidates.clear(), rounds_seen.clear(), round_candidates.clear()

    while True:
        if not landed:
            status = run(routes, ports, ops, queues, cores, events, scalars, limit, watch)
            if status != _STOPPED:
                return _result(status, scalars)
        elif region is not None:        # a skip or a jump landed: the period search is doing the work
            region.landed()
        landed = False
        t = int(scalars[_T])
        scalars[_SEEN_PC] = next_stop()
        at_round = outer and (int(cores.pc[watch]) - base) // outer != last_round
        if at_round:
            last_round = (int(cores.pc[watch]) - base) // outer
            if _check(round_candidates, t, state, ops, cores, ports, scalars, limit, lambda a, b: None):
                round_skipped()
                previous, landed = None, True
                continue
        if _check(candidates, t, state, ops, cores, ports, scalars, limit, inner_cap):
            scalars[_SEEN_PC] = next_stop()
            seen.clear(), candidates.clear()
            previous, landed = None, True
            continue
        key = int(_state_hash(queues, cores, events, ports.left, ops, t))
        key = hash((key, extra.key(t))) if extra else key
        now = _snapshot(queues, cores, events, ports, t, colors, scalars, extra)
        if previous is not None:
            transitions.add(*previous, now)
        previous = (key, now)
        if at_round and _look_back(rounds_seen, key, now, ops, cores, ports, scalars, limit, lambda a, b: None,
                                   extra):
            round_skipped()
            previous, landed = None, True
            continue
        if _look_back(seen, key, now, ops, cores, ports, scalars, limit, inner_cap, extra):
            scalars[_SEEN_PC] = next_stop()
            seen.clear(), candidates.clear()
            previous, landed = None, True
            continue
        _propose(candidates, seen, key, now, spans)
        if at_round:
            _propose(round_candidates, rounds_seen, key, now, spans)
        if _jump(transitions, key, now, ops, state, cores, ports, scalars, limit):
            previous = None
            landed = True
        elif region is not None and (moved := region.stop(
                now, queues, cores, events, scalars, limit, not outer or int(cores.pc[watch]) - base < outer,
                (int(cores.pc[watch]) - base) % outer * region_points // outer if outer else None)) is not None:
            if moved != _STOPPED:       # the run ended while the region replay recorded its period
                return _result(moved, scalars)
            scalars[_SEEN_PC] = next_stop()     # the state is the run's at a later cycle
            previous = None
            candidates.clear(), round_candidates.clear()
