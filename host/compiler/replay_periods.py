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
earlier stops, and a repeat with ``D`` a multiple of ``colors`` is checked by
replaying one more period and comparing the two states exactly, as above.
A skip is taken only on that exact check. ``tests/test_compile_speed.py``
checks that the counts equal the replay without skips and the golden model.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .replay import _CONFLICTS, _FINISHED, _LAST, _SEEN_PC, _STOPPED, _T, _TO_INJECT, _WRITE, _new_scalars, _run

__all__ = ["run_with_periods"]

#: Repeats of a hashed state awaiting their exact check at once (each holds a copy of the state).
_MAX_CANDIDATES = 4

@njit(cache=True)
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
    for g in range(events.count[_WRITE]):
        h = add(h, events.who[_WRITE, g] * 64 + events.color[_WRITE, g])
    for p in range(left.shape[0]):
        for c in range(left.shape[1]):
            h = add(h, 1 if left[p, c] > 0 else 0)
    return h


def _snapshot(queues, cores, events, ports, t: int, colors: int, scalars) -> dict:
    """The relative state at the start of cycle ``t`` (``pc`` and ``left`` kept apart: they may differ)."""
    depth = queues.tx_colors.shape[1]
    n = queues.tx_count.shape[0]
    order = (queues.tx_head[:, None] + np.arange(depth)[None, :]) % depth
    tx = np.take_along_axis(queues.tx_colors, order, axis=1)
    tx[np.arange(depth)[None, :] >= queues.tx_count[:, None]] = -1
    active = ~cores.done
    writes = events.count[_WRITE]
    return {
        "rel": dict(fifo=queues.router_fifo.copy(), rx=queues.rx.copy(), tx=tx, done=cores.done.copy(),
                    free=np.where(active, np.maximum(cores.free_at - t, 0), 0),
                    index=np.where(active, cores.vector_index, 0),
                    written=active & (cores.written_at == t),
                    writes=np.stack([events.who[_WRITE, :writes], events.color[_WRITE, :writes]]),
                    has_left=ports.left > 0, phase=np.array([t % colors]), n=np.array([n])),
        "pc": cores.pc.copy(), "left": ports.left.copy(), "t": t, "conflicts": int(scalars[_CONFLICTS])}


def _same(a: dict, b: dict) -> bool:
    """The relative states are equal; the color rotation's phase only matters
    if a grant depended on it between them (a conflict)."""
    keys = [k for k in a["rel"] if k != "phase" or b["conflicts"] != a["conflicts"]]
    return all(np.array_equal(a["rel"][k], b["rel"][k]) for k in keys)


@njit(cache=True)
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


def _skip(first: dict, second: dict, ops, cores, ports, scalars, limit: int) -> int:
    """Skip the most repeats of the period from ``first`` to ``second`` (the current state) that are
    proven to repeat; returns how many (0: none)."""
    period = second["t"] - first["t"]
    shift = second["pc"] - first["pc"]
    if period <= 0 or (shift < 0).any():
        return 0
    most = (limit - 1 - second["t"]) // period
    injected = first["left"] - second["left"]
    if (injected < 0).any():
        return 0
    feeding = injected > 0
    if feeding.any():
        most = min(most, int(((second["left"][feeding] - 1) // injected[feeding]).min()))
    moving = (shift > 0) & ~cores.done
    if moving.any() and most > 0:
        pairs = np.unique(np.stack([second["pc"][moving], shift[moving]], axis=1), axis=0)
        most = _repeats(ops, np.ascontiguousarray(pairs[:, 0]), np.ascontiguousarray(pairs[:, 1]), most)
    if most <= 0:
        return 0
    span = most * period
    cores.pc[:] += most * shift
    cores.free_at[:] += span
    cores.written_at[:] += span
    cores.waited_at[:] += span
    ports.left[:] -= most * injected
    ports.left_total[:] = ports.left.sum(axis=1)
    scalars[_TO_INJECT] -= most * int(injected.sum())
    scalars[_T] += span
    if scalars[_LAST] >= first["t"]:
        scalars[_LAST] += span
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


def run_with_periods(routes, ports, ops, queues, cores, events, limit: int, watch: int, end: int) -> int:
    """The replay's result (cycles, or a negative hang code) from a fresh state,
    skipping the proven repeats of periods of the fabric's state (module docstring)."""
    colors = routes.input_port.shape[1]
    scalars = _new_scalars(cores.pc, ports, watch)
    base = int(cores.pc[watch])
    stride = _stride(ops[base:end])
    if stride == 0:           # no rounds to repeat: the plain replay
        scalars[_SEEN_PC] = limit
        status = _run(routes, ports, ops, queues, cores, events, scalars, limit, -1)
        return int(scalars[_LAST] + 1) if status == _FINISHED else int(status)
    scalars[_SEEN_PC] = base + stride
    seen: dict[int, int] = {}
    candidates: list = []                 # (snapshot at t2, period D): checked at t2 + D
    while True:
        status = _run(routes, ports, ops, queues, cores, events, scalars, limit, watch)
        if status != _STOPPED:
            return int(scalars[_LAST] + 1) if status == _FINISHED else int(status)
        t = int(scalars[_T])
        # the next stop: when the watched PE enters its next round of ``stride`` rows
        scalars[_SEEN_PC] = base + ((int(cores.pc[watch]) - base) // stride + 1) * stride
        due = [c for c in candidates if c[0]["t"] + c[1] <= t]
        if due:
            candidates = [c for c in candidates if c[0]["t"] + c[1] > t]
            second = None
            for first, period in due:
                if first["t"] + period != t:
                    continue
                second = second or _snapshot(queues, cores, events, ports, t, colors, scalars)
                if _same(first, second) and _skip(first, second, ops, cores, ports, scalars, limit):
                    scalars[_SEEN_PC] = base + ((int(cores.pc[watch]) - base) // stride + 1) * stride
                    seen.clear()
                    candidates = []
                    break
            if scalars[_T] != t:
                continue
        key = int(_state_hash(queues, cores, events, ports.left, ops, t))
        before = seen.get(key)
        seen[key] = t
        if before is not None:
            period = t - before
            # A period over which no grant depended on the color rotation repeats
            # at any phase of it; else only a multiple of ``colors`` is proven.
            lcm = period * colors // math.gcd(period, colors)
            snap = None
            for span in sorted({period, lcm}):
                if len(candidates) < _MAX_CANDIDATES and all(span != c[1] for c in candidates):
                    snap = snap or _snapshot(queues, cores, events, ports, t, colors, scalars)
                    candidates.append((snap, span))
