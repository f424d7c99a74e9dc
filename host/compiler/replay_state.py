"""The state of the static cycle model's replay (:mod:`.replay`): the edge ports, queues,
cores and one cycle's events as named tuples of arrays, a run's counters, and the fresh
state of a run. Both engines (:func:`.replay._run`, :mod:`.replay_events`) and the
period search (:mod:`.replay_periods`) work on it."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .network import Network

# Results of the jitted replay below 0: it hung.
_OUT_OF_TIME, _DEADLOCK = -1, -2

# Kinds of events, rows of Events.who / Events.color.
_GRANT = 0       # router ``who`` forwards the head of its FIFO ``color``
_INJECT = 1      # edge port ``who`` injects a wavelet of ``color``
_TX_MOVE = 2     # the head of PE ``who``'s output queue enters its router
_POP = 3         # PE ``who`` pops its input queue ``color``
_ISSUE = 4       # PE ``who`` issues a vector element for the fabric, of ``color``
_WRITE = 5       # ... issued last cycle: it enters the output queue this cycle
_EVENT_KINDS = 6


class EdgePorts(NamedTuple):
    """The edge ports that inject wavelets: port ``p`` enters boundary router
    ``router[p]`` through port ``code[p]`` and has ``left[p, c]`` wavelets of
    color ``c`` left to inject, ``left_total[p]`` in all."""

    router: np.ndarray
    code: np.ndarray
    left: np.ndarray
    left_total: np.ndarray


class Queues(NamedTuple):
    """Occupancy of the fabric's queues.

    ``router_fifo[r, c]``: wavelets in router ``r``'s FIFO of color ``c``;
    ``busy_fifos[r]``: the bit mask of its non-empty FIFOs (bit ``c`` for color
    ``c``; a router with none is skipped, and a router's grants visit only
    these colors, :func:`_rotated_colors`);
    ``rx[p, c]``: wavelets in PE ``p``'s input queue ``c``; the output queue
    of PE ``p`` is a ring of colors, ``tx_colors[p]``, holding
    ``tx_count[p]`` wavelets from index ``tx_head[p]``.
    """

    router_fifo: np.ndarray
    busy_fifos: np.ndarray
    rx: np.ndarray
    tx_colors: np.ndarray
    tx_head: np.ndarray
    tx_count: np.ndarray


class Cores(NamedTuple):
    """Each PE's progress through its timing ops.

    ``pc[p]``: the op row PE ``p`` is at; ``free_at[p]``: the first cycle it
    can go on; ``vector_index[p]``: the elements of its current vector
    instruction done; ``written_at[p]``: the cycle its last fabric-bound
    element enters the output queue; ``done[p]``: it reached ``END``;
    ``waited_at[p]``: the last cycle it waited for the fabric.
    """

    pc: np.ndarray
    free_at: np.ndarray
    vector_index: np.ndarray
    written_at: np.ndarray
    done: np.ndarray
    waited_at: np.ndarray


class Events(NamedTuple):
    """The decisions of one cycle, applied at its end: ``count[kind]`` events
    of each kind (``_GRANT`` ... ``_WRITE``), the ``i``-th on router, port or
    PE ``who[kind, i]`` and color ``color[kind, i]``."""

    count: np.ndarray
    who: np.ndarray
    color: np.ndarray


@njit(cache=True)
def _record(events, kind, who, color):
    """Append an event of ``kind``."""
    count, whos, colors = events.count, events.who, events.color
    i = count[kind]
    whos[kind, i] = who
    colors[kind, i] = color
    count[kind] = i + 1


#: The type of the replay's queue counts (``bench/compile_speed.py --columns`` sets int32, the type
#: before, for its comparison; the same counts).
QUEUE_COUNTS = np.int8


def _new_state(routes, ports, starts):
    """Empty queues, PEs at their first ops, no events."""
    routers, colors = routes.input_port.shape
    # Queue counts as int8 (FabricConfig keeps every depth in 1..64, and no queue holds more than its
    # depth): the replay's time goes to memory, and a router's FIFOs and input queues then take a
    # quarter of a cache line each (twice the speed of int32 on 128x128).
    # The rest as narrow as its values provably are, for the same reason: a color (< 32) and an
    # output queue's head and count (< tx_depth <= 64) in int8, the mask of non-empty FIFOs in
    # int32 while it has no sign bit to set (colors <= 31), an element index (< a vector's length,
    # an int32 op field) and an event's router, port or PE (< 2**31) in int32. Op rows and cycle
    # numbers (up to the 2**40 limit) stay int64.
    counts = np.zeros((routers, colors), dtype=QUEUE_COUNTS)
    queues = Queues(counts, np.zeros(routers, dtype=np.int32 if colors <= 31 else np.int64), counts.copy(),
                    np.zeros((routers, routes.tx_depth), dtype=np.int8), np.zeros(routers, dtype=QUEUE_COUNTS),
                    np.zeros(routers, dtype=QUEUE_COUNTS))
    cores = Cores(starts.copy(), np.zeros(routers, dtype=np.int64), np.zeros(routers, dtype=np.int32),
                  np.full(routers, -1, dtype=np.int64), np.zeros(routers, dtype=np.bool_),
                  np.full(routers, -1, dtype=np.int64))
    return queues, cores, new_events(max(routers * colors, 2 * routers, ports.router.shape[0]))


def new_events(capacity: int) -> Events:
    """Empty :class:`Events` with room for ``capacity`` of each kind (the PEs' and routers' int32, the
    colors int8)."""
    return Events(np.zeros(_EVENT_KINDS, dtype=np.int64), np.zeros((_EVENT_KINDS, capacity), dtype=np.int32),
                  np.zeros((_EVENT_KINDS, capacity), dtype=np.int8))


# Slots of a run's counters (an int64 array, so that a run can stop and go on).
_T, _RUNNING, _FIFOS, _TX, _TO_INJECT, _LAST, _SEEN_PC, _CONFLICTS = range(8)
# Results of _run at or above 0.
_FINISHED, _STOPPED = 0, 1


def _new_scalars(starts: np.ndarray, ports: EdgePorts, watch: int) -> np.ndarray:
    """The counters of a run at cycle 0."""
    scalars = np.zeros(8, dtype=np.int64)
    scalars[_RUNNING] = starts.shape[0]
    scalars[_TO_INJECT] = ports.left_total.sum()
    scalars[_LAST] = -1
    scalars[_SEEN_PC] = starts[watch] + 1 if watch >= 0 else -1
    return scalars


def _edge_ports(network: Network, inject: dict) -> EdgePorts:
    """The injecting edge ports of ``inject`` (``{(edge, index): {color: wavelets}}``), in key order."""
    cfg = network.config
    keys = sorted(inject)
    router = np.zeros(len(keys), dtype=np.int64)
    code = np.zeros(len(keys), dtype=np.int64)
    left = np.zeros((len(keys), cfg.colors), dtype=np.int64)
    for p, key in enumerate(keys):
        router[p], code[p] = network.port(*key)
        for color, count in inject[key].items():
            left[p, color] += count
    return EdgePorts(router, code, left, left.sum(axis=1))


# A reduced replay's check failed (:class:`ColumnProbe`): its count says nothing about the full mesh.
_BROKEN = -3

# Roles of a router's route of a color in a :class:`ColumnProbe` (bits of ``ColumnProbe.role``).
_SOURCE, _COPY, _WEST_FED, _CHECKED = 1, 2, 4, 8


def fresh_run(network: Network, ops: np.ndarray, starts: np.ndarray, inject: dict):
    """A run's inputs and fresh state for stepping the reference replay (``replay._run``) from cycle 0
    (the measurement scripts in ``bench/``): ``(routes, ports, ops, queues, cores, events, scalars)``,
    the op rows as the replay's int32, no PE watched."""
    routes = network.routes()
    ports = _edge_ports(network, inject)
    starts = np.asarray(starts, dtype=np.int64)
    queues, cores, events = _new_state(routes, ports, starts)
    return (routes, ports, np.ascontiguousarray(ops, dtype=np.int32), queues, cores, events,
            _new_scalars(starts, ports, -1))


class ColumnProbe(NamedTuple):
    """What a reduced replay of the first columns of a mesh checks at every cycle
    (:mod:`.replay_columns`), in the reference engine.

    ``role[r, c]`` marks router ``r``'s route of color ``c``: ``_SOURCE`` (column
    ``a - 1`` sends it east), ``_COPY`` (column ``a + P - 1`` sends it east),
    ``_WEST_FED`` (its east target is a FIFO fed from the west in a checked column),
    ``_CHECKED`` (on every color of a router in a column ``>= a``: its grants must
    not depend on the color rotation, :func:`.replay._grant_routers`).
    ``line[t mod delta, i]`` holds the colors column ``a - 1`` sent east on row
    ``i`` at cycle ``t - delta`` until cycle ``t`` overwrites it (a delay line), and
    column ``a + P - 1``'s sends at ``t`` must equal it; a FIFO fed from the west
    must never be full at the start of a cycle. ``flag[0]`` becomes 1 when
    any of these fails, and ``flag[1]`` is then the column where the first failure
    was seen (the copy column ``a + P - 1`` for a send, the column of the full FIFO
    or of the rotation-dependent grant). ``col_last[j]``: the last cycle a router
    of column ``j`` granted a wavelet (-1: none yet). ``info``: ``(columns, delta,
    rows, a + P - 1)``; ``cur`` is scratch. A probe with ``role`` of shape ``(0, 0)``
    checks nothing."""

    role: np.ndarray
    line: np.ndarray
    cur: np.ndarray
    col_last: np.ndarray
    flag: np.ndarray
    info: np.ndarray


def no_probe() -> ColumnProbe:
    """A :class:`ColumnProbe` that checks nothing (the replay of a whole mesh)."""
    empty = np.zeros((0, 0), dtype=np.int64)
    return ColumnProbe(empty, empty, empty, np.zeros(0, dtype=np.int64), np.zeros(2, dtype=np.int64),
                       np.zeros(4, dtype=np.int64))


@njit(cache=True, inline="always")
def _probe_fail(probe, column):
    """Mark a :class:`ColumnProbe`'s check failed at ``column`` (the first failure's column is kept)."""
    if probe.flag[0] == 0:
        probe.flag[1] = column
    probe.flag[0] = 1


@njit(cache=True, nogil=True)
def _probe_cycle(probe, events, router_fifo, router_depth, t):
    """Cycle ``t``'s checks of a :class:`ColumnProbe`, after its moves are applied
    (``router_fifo`` holds the start of cycle ``t + 1``); 1 if one failed."""
    columns, delta, rows = probe.info[0], probe.info[1], probe.info[2]
    cur, line, role = probe.cur, probe.line, probe.role
    cur[:, :] = 0
    for g in range(events.count[_GRANT]):
        r = events.who[_GRANT, g]
        c = events.color[_GRANT, g]
        probe.col_last[r % columns] = t
        kind = role[r, c]
        if kind & _SOURCE:
            cur[0, r // columns] |= 1 << c
        if kind & _COPY:
            cur[1, r // columns] |= 1 << c
        if kind & _WEST_FED and router_fifo[r + 1, c] >= router_depth:
            _probe_fail(probe, (r + 1) % columns)
    slot = t % delta
    for i in range(rows):
        if cur[1, i] != line[slot, i]:
            _probe_fail(probe, probe.info[3])
        line[slot, i] = cur[0, i]
    return probe.flag[0]


@njit(cache=True, nogil=True)
def _probe_idle(probe, first, stop):
    """Cycles ``first .. stop - 1`` moved nothing (the idle skip): no column sent, so the
    delay line must hold no sends for them; 1 if it held one."""
    delta, rows = probe.info[1], probe.info[2]
    for s in range(first, min(stop, first + delta)):
        for i in range(rows):
            if probe.line[s % delta, i] != 0:
                _probe_fail(probe, probe.info[3])
            probe.line[s % delta, i] = 0
    return probe.flag[0]
