"""The replay's fast engine: the same cycles as :func:`.replay._run`, with
work per cycle proportional to what moves rather than to the mesh.

:func:`.replay._run` (the reference engine) visits every router, output queue
and PE in every cycle. Most of them cannot do anything in most cycles: a
router whose every head waits for room downstream, a PE in the middle of its
private cycles or waiting for a wavelet. This engine runs the same cycle
(the same decisions from the start-of-cycle state, applied in the same
order; :mod:`.replay`'s docstring) but visits only

* the routers and output queues that were *woken*: a router whose own FIFOs
  changed, whose downstream FIFO or PE input queue on one of its routes lost
  a wavelet (the upstream of router ``x``'s color ``c`` is the neighbour its
  route takes ``c`` from, :meth:`.network.Network.upstream`), and an output
  queue that changed or whose router FIFO lost a wavelet;
* the PEs that are due: a PE in its private cycles sleeps on a timing wheel
  until ``free_at``; a PE that waited for the fabric sleeps until one of its
  queues changes.

**Rule.** A router, output queue or PE that did nothing in a cycle does
nothing in the next one unless something it reads changed at the end of the
cycle (its decision is a function of those queues and, for routers, the
color rotation, which only orders grants among colors that can go: with
none that can go, there is no grant in any order). Every change of a queue
wakes everyone that reads it, so the engine takes exactly the reference's
decisions. The state it leaves is the reference's, field by field (the PEs
asleep on the fabric get the ``free_at``/``waited_at`` their waits would have
written), so :mod:`.replay_periods` and a later call go on from it.
``tests/test_compile_speed.py`` checks the two engines' states equal at every
stop of a run and their counts equal on many schedules.

Most of a busy cycle's time goes to memory, so the routes are packed as
distinct rows with relative targets and a row number per router and color
(:func:`route_table`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from wse.firmware.timing_ops import BUSY, END, RECV

from .network import TO_PE, TO_ROUTER
from .replay import (_CONFLICTS, _DEADLOCK, _FIFOS, _FINISHED, _GRANT, _INJECT, _ISSUE, _LAST, _OUT_OF_TIME, _POP,
                     _N, _NO_WAKE, _RAMP_IN, _RUNNING, _SEEN_PC, _STOPPED, _T, _TARGETS, _TO_INJECT, _TX, _TX_MOVE, _UP, _UP_AT,
                     _WRITE, _grant_injections, _grant_router, pack_routes)

__all__ = ["run_events"]

#: Buckets of the PEs' timing wheel (a power of two): a PE free at cycle ``f`` waits in bucket ``f mod _WHEEL``.
_WHEEL = 1024
# Slots of Wakes.counts.
_ROUTERS_NOW, _ROUTERS_NEXT, _TX_NOW, _TX_NEXT = range(4)


class Wakes(NamedTuple):
    """Who is visited: routers and output queues woken for the next cycle
    (``*_next``, each once: ``*_flag``) and this one (``*_now``); the PEs'
    timing wheel (``head[bucket]``, ``link[pe]``: singly linked lists); PEs
    asleep on the fabric (``waiting``) and those whose ``free_at`` and
    ``waited_at`` their skipped waits would have moved (``stale``)."""

    router_now: np.ndarray
    router_next: np.ndarray
    router_flag: np.ndarray
    tx_now: np.ndarray
    tx_next: np.ndarray
    tx_flag: np.ndarray
    counts: np.ndarray
    head: np.ndarray
    link: np.ndarray
    waiting: np.ndarray
    stale: np.ndarray


# Speed: the helpers called per event take arrays, not the named tuples: a
# call (even inlined) that passes a named tuple of arrays makes numba count
# references on each of its arrays, which cost most of a cycle's time.

@njit(cache=True, inline="always")
def _wake(flag, stack, counts, slot, x):
    """Put ``x`` on the stack of the next cycle's visits (once)."""
    if not flag[x]:
        flag[x] = True
        stack[counts[slot]] = x
        counts[slot] += 1


@njit(cache=True, inline="always")
def _schedule(head, link, pe, at):
    """PE ``pe`` is next due at cycle ``at``: on the wheel."""
    b = at & (_WHEEL - 1)
    link[pe] = head[b]
    head[b] = pe


@njit(cache=True, inline="always")
def _wake_pe(waiting, head, link, pe, t):
    """PE ``pe``'s queues changed at the end of cycle ``t``: if it waits for the fabric, it tries again at ``t + 1``."""
    if waiting[pe]:
        waiting[pe] = False
        _schedule(head, link, pe, t + 1)


@njit(cache=True, inline="always")
def _rec(count, whos, colors, kind, who, color):
    """Append an event of ``kind`` (:func:`.replay._record`)."""
    i = count[kind]
    whos[kind, i] = who
    colors[kind, i] = color
    count[kind] = i + 1


@njit(cache=True, inline="always")
def _push(router_fifo, busy_fifos, r, c):
    """One wavelet into router ``r``'s FIFO ``c``; 1 if it was empty (:func:`.replay._push_fifo`)."""
    was_empty = router_fifo[r, c] == 0
    if was_empty:
        busy_fifos[r] |= 1 << c
    router_fifo[r, c] += 1
    return 1 if was_empty else 0


@njit(cache=True)
def _new_wakes(queues, cores, t):
    """Everyone awake at cycle ``t``: routers with wavelets, output queues with wavelets, every PE not done."""
    n = queues.busy_fifos.shape[0]
    # Router and PE numbers in int32 (< 2**31): the lists are read and written every cycle.
    wakes = Wakes(np.empty(n, np.int32), np.empty(n, np.int32), np.zeros(n, np.bool_), np.empty(n, np.int32),
                  np.empty(n, np.int32), np.zeros(n, np.bool_), np.zeros(4, np.int64), np.full(_WHEEL, -1, np.int32),
                  np.full(n, -1, np.int32), np.zeros(n, np.bool_), np.zeros(n, np.bool_))
    counts = wakes.counts
    for x in range(n):
        if queues.busy_fifos[x] > 0:
            _wake(wakes.router_flag, wakes.router_next, counts, _ROUTERS_NEXT, x)
        if queues.tx_count[x] > 0:
            _wake(wakes.tx_flag, wakes.tx_next, counts, _TX_NEXT, x)
        if not cores.done[x]:
            _schedule(wakes.head, wakes.link, x, max(cores.free_at[x], t))
    return wakes


@njit(cache=True)
def _turn(wakes):
    """The woken routers and output queues become this cycle's."""
    counts = wakes.counts
    for i in range(counts[_ROUTERS_NEXT]):
        r = wakes.router_next[i]
        wakes.router_now[i] = r
        wakes.router_flag[r] = False
    counts[_ROUTERS_NOW], counts[_ROUTERS_NEXT] = counts[_ROUTERS_NEXT], 0
    for i in range(counts[_TX_NEXT]):
        pe = wakes.tx_next[i]
        wakes.tx_now[i] = pe
        wakes.tx_flag[pe] = False
    counts[_TX_NOW], counts[_TX_NEXT] = counts[_TX_NEXT], 0


# ---------------------------------------------------------------- decisions (as replay.py's steps 1-4)

@njit(cache=True)
def _grant_woken(routes, rows, index, queues, wakes, first_color, events):
    """Step 1 for the woken routers (:func:`.replay._grant_router`); returns the conflicts."""
    router_fifo, busy_fifos, rx = queues.router_fifo, queues.busy_fifos, queues.rx
    router_depth, rx_depth = routes.router_depth, routes.rx_depth
    colors = router_fifo.shape[1]
    conflicts = 0
    for i in range(wakes.counts[_ROUTERS_NOW]):
        r = wakes.router_now[i]
        if busy_fifos[r] != 0:
            conflicts += _grant_router(rows, index, router_fifo, busy_fifos[r], rx, router_depth, rx_depth, events,
                                       r, first_color, colors)
    return conflicts


@njit(cache=True)
def _move_woken_tx(routes, rows, index, queues, wakes, events):
    """Step 3 for the woken output queues (:func:`.replay._grant_tx_move`'s rule, from the packed rows)."""
    router_fifo = queues.router_fifo
    tx_colors, tx_head, tx_count = queues.tx_colors, queues.tx_head, queues.tx_count
    for i in range(wakes.counts[_TX_NOW]):
        pe = wakes.tx_now[i]
        if tx_count[pe] > 0:
            c = tx_colors[pe, tx_head[pe]]
            if rows[index[pe, c], _RAMP_IN] != 0 and router_fifo[pe, c] < routes.router_depth:
                _rec(events.count, events.who, events.color, _TX_MOVE, pe, c)


@njit(cache=True)
def _step_due(ops, cores, queues, wakes, tx_depth, events, t):
    """Step 4 for the PEs due at ``t`` (bucket ``t mod _WHEEL``): :func:`.replay._step_pes`'s
    loop body (inline: a call per PE costs numba reference counts), then each PE
    goes back on the wheel at ``free_at``, or to sleep on the fabric if it waited.
    Returns (progressed, finished, last exit cycle or -1)."""
    pc, free_at, vector_index, written_at, done, waited_at = cores
    rx, tx_count = queues.rx, queues.tx_count
    head, link, waiting, stale = wakes.head, wakes.link, wakes.waiting, wakes.stale
    count, whos, cols = events.count, events.who, events.color
    b = t & (_WHEEL - 1)
    pe = head[b]
    head[b] = -1
    progressed, finished, last_exit = 0, 0, -1
    while pe >= 0:
        after = link[pe]
        if free_at[pe] > t:              # a later turn of the wheel
            _schedule(head, link, pe, free_at[pe])
        else:
            if stale[pe]:                # woken at the end of t - 1: it waited through t - 1
                waited_at[pe] = t - 1
            result = 0
            while True:
                row = pc[pe]
                op = ops[row, 0]
                if op == END:
                    done[pe] = True
                    result += 2
                    break
                if op == BUSY:
                    free_at[pe] += ops[row, 1]
                    pc[pe] += 1
                    continue
                if free_at[pe] > t:
                    break
                waits = False
                if op == RECV:
                    color = ops[row, 1]
                    waits = rx[pe, color] == 0
                    if not waits:
                        _rec(count, whos, cols, _POP, pe, color)
                        free_at[pe] = t + 1
                        pc[pe] += 1
                else:
                    length, source_a, source_b, dest, period = ops[row, 1], ops[row, 2], ops[row, 3], ops[row, 4], \
                        ops[row, 5]
                    if length == 0:
                        free_at[pe] = t + 1
                        pc[pe] += 1
                    elif period > 0:            # fmacw: source_a holds the weights
                        waits = rx[pe, source_a] == 0
                        if not waits:
                            _rec(count, whos, cols, _POP, pe, source_a)
                            chunk = length - vector_index[pe]
                            if chunk > period:
                                chunk = period
                            vector_index[pe] += chunk
                            free_at[pe] = t + chunk
                            if vector_index[pe] == length:
                                vector_index[pe] = 0
                                pc[pe] += 1
                                free_at[pe] = t + chunk + 1
                    else:
                        waits = (source_a >= 0 and rx[pe, source_a] == 0) or (source_b >= 0 and rx[pe, source_b] == 0) \
                            or (dest >= 0 and tx_count[pe] + (1 if written_at[pe] == t else 0) >= tx_depth)
                        if not waits:
                            if source_a >= 0:
                                _rec(count, whos, cols, _POP, pe, source_a)
                            if source_b >= 0:
                                _rec(count, whos, cols, _POP, pe, source_b)
                            if dest >= 0:
                                _rec(count, whos, cols, _ISSUE, pe, dest)
                                written_at[pe] = t + 1
                            vector_index[pe] += 1
                            free_at[pe] = t + 1
                            if vector_index[pe] == length:
                                vector_index[pe] = 0
                                pc[pe] += 1
                                free_at[pe] = t + 2
                if waits:
                    free_at[pe] = t + 1
                    waited_at[pe] = t
                    break
                result |= 1
                if pc[pe] == row:
                    break
            stale[pe] = False
            progressed += result & 1
            if result & 2:
                finished += 1
                if free_at[pe] - 1 > last_exit:
                    last_exit = free_at[pe] - 1
            elif waited_at[pe] == t:
                waiting[pe] = True
                stale[pe] = True
            else:
                _schedule(head, link, pe, free_at[pe])
        pe = after
    return progressed, finished, last_exit


# ---------------------------------------------------------------- applying a cycle's events, waking readers

@njit(cache=True)
def _apply_moves(rows, index, queues, ports, wakes, events, t):
    """Grants, injections and output-queue moves (:func:`.replay._apply_grants` and the next two),
    waking whoever reads a changed queue. Returns the change in non-empty FIFOs."""
    router_fifo, busy_fifos, rx = queues.router_fifo, queues.busy_fifos, queues.rx
    r_flag, r_next, t_flag, t_next, counts = wakes.router_flag, wakes.router_next, wakes.tx_flag, wakes.tx_next, \
        wakes.counts
    waiting, head, link = wakes.waiting, wakes.head, wakes.link
    who, color = events.who, events.color
    change = 0
    for g in range(events.count[_GRANT]):
        r, c = who[_GRANT, g], color[_GRANT, g]
        router_fifo[r, c] -= 1
        if router_fifo[r, c] == 0:
            busy_fifos[r] &= ~(1 << c)
            change -= 1
        _wake(r_flag, r_next, counts, _ROUTERS_NEXT, r)
        row = index[r, c]
        u = rows[row, _UP]
        if u == 0:
            _wake(r_flag, r_next, counts, _ROUTERS_NEXT, r + rows[row, _UP_AT])
        elif u == -1:
            _wake(t_flag, t_next, counts, _TX_NEXT, r)
        for k in range(rows[row, _N]):
            kind, to = rows[row, _TARGETS + 2 * k], r + rows[row, _TARGETS + 2 * k + 1]
            if kind == TO_ROUTER:
                change += _push(router_fifo, busy_fifos, to, c)
                _wake(r_flag, r_next, counts, _ROUTERS_NEXT, to)
            elif kind == TO_PE:
                rx[to, c] += 1
                _wake_pe(waiting, head, link, to, t)
    left, left_total, port_router = ports.left, ports.left_total, ports.router
    for g in range(events.count[_INJECT]):
        p, c = who[_INJECT, g], color[_INJECT, g]
        left[p, c] -= 1
        left_total[p] -= 1
        change += _push(router_fifo, busy_fifos, port_router[p], c)
        _wake(r_flag, r_next, counts, _ROUTERS_NEXT, port_router[p])
    tx_colors, tx_head, tx_count = queues.tx_colors, queues.tx_head, queues.tx_count
    depth = tx_colors.shape[1]
    for g in range(events.count[_TX_MOVE]):
        pe = who[_TX_MOVE, g]
        c = tx_colors[pe, tx_head[pe]]
        tx_head[pe] = (tx_head[pe] + 1) % depth
        tx_count[pe] -= 1
        change += _push(router_fifo, busy_fifos, pe, c)
        _wake(r_flag, r_next, counts, _ROUTERS_NEXT, pe)
        _wake(t_flag, t_next, counts, _TX_NEXT, pe)
        _wake_pe(waiting, head, link, pe, t)
    return change


@njit(cache=True)
def _apply_pe(queues, wakes, events, t):
    """Pops, writes of last cycle's issues and the carry (:func:`.replay._apply_pe_queues`), with wakes."""
    rx, tx_colors, tx_head, tx_count = queues.rx, queues.tx_colors, queues.tx_head, queues.tx_count
    r_flag, r_next, t_flag, t_next, counts = wakes.router_flag, wakes.router_next, wakes.tx_flag, wakes.tx_next, \
        wakes.counts
    waiting, head, link = wakes.waiting, wakes.head, wakes.link
    depth = tx_colors.shape[1]
    count, who, color = events.count, events.who, events.color
    for g in range(count[_POP]):
        pe = who[_POP, g]
        rx[pe, color[_POP, g]] -= 1
        _wake(r_flag, r_next, counts, _ROUTERS_NEXT, pe)
    for g in range(count[_WRITE]):
        pe = who[_WRITE, g]
        tx_colors[pe, (tx_head[pe] + tx_count[pe]) % depth] = color[_WRITE, g]
        tx_count[pe] += 1
        _wake(t_flag, t_next, counts, _TX_NEXT, pe)
        _wake_pe(waiting, head, link, pe, t)
    issued = count[_ISSUE]
    for g in range(issued):
        who[_WRITE, g] = who[_ISSUE, g]
        color[_WRITE, g] = color[_ISSUE, g]
    count[_WRITE] = issued


@njit(cache=True)
def _next_due(cores, wakes, limit):
    """After an idle cycle: the first cycle a PE not waiting for the fabric goes on (``limit``: none)."""
    wake = limit
    for pe in range(cores.done.shape[0]):
        if not cores.done[pe] and not wakes.waiting[pe] and cores.free_at[pe] < wake:
            wake = cores.free_at[pe]
    return wake


@njit(cache=True)
def _settle(cores, wakes, ran):
    """PEs asleep on the fabric since before cycle ``ran`` (the last one run) get what their waits wrote."""
    if ran < 0:
        return
    for pe in range(cores.done.shape[0]):
        if wakes.stale[pe]:
            cores.waited_at[pe] = ran
            cores.free_at[pe] = ran + 1


@njit(cache=True, nogil=True)
def _run_events(routes, ports, ops, queues, cores, events, scalars, limit, watch, rows, index):
    """:func:`.replay._run` (same arguments, results and final state), visiting only who can act."""
    count = events.count
    colors = routes.input_port.shape[1]
    tx_depth = routes.tx_depth
    t, running, nonempty_fifos = scalars[_T], scalars[_RUNNING], scalars[_FIFOS]
    tx_wavelets, to_inject, last = scalars[_TX], scalars[_TO_INJECT], scalars[_LAST]
    wakes = _new_wakes(queues, cores, t)
    ran = -1
    status = _FINISHED
    frozen_until = -1           # as in replay._run: in a stretch that moved nothing, the wake found
    every_router = np.zeros(0, dtype=np.bool_)
    while running > 0 or nonempty_fifos > 0 or tx_wavelets > 0 or to_inject > 0 or count[_WRITE] > 0:
        if t >= limit:          # as in replay._run: the counters are kept, a run may go on with a later limit
            status = _OUT_OF_TIME
            break
        if watch >= 0 and cores.pc[watch] >= scalars[_SEEN_PC]:
            status = _STOPPED
            break
        ran = t
        first_color = t % colors
        count[:_WRITE] = 0
        _turn(wakes)
        scalars[_CONFLICTS] += _grant_woken(routes, rows, index, queues, wakes, first_color, events) + \
            _grant_injections(routes, queues, ports, first_color, events, every_router)
        _move_woken_tx(routes, rows, index, queues, wakes, events)
        progressed, finished, last_exit = _step_due(ops, cores, queues, wakes, tx_depth, events, t)
        running -= finished
        if last_exit > last:
            last = last_exit
        moves = count[_GRANT] + count[_INJECT] + count[_TX_MOVE] + count[_POP] + count[_WRITE]
        issued = count[_ISSUE]
        if moves > 0 and t > last:
            last = t
        nonempty_fifos += _apply_moves(rows, index, queues, ports, wakes, events, t)
        to_inject -= count[_INJECT]
        tx_wavelets += count[_WRITE] - count[_TX_MOVE]
        _apply_pe(queues, wakes, events, t)
        if moves == 0 and issued == 0 and progressed == 0 and nonempty_fifos == 0 and tx_wavelets == 0:
            wake = _next_due(cores, wakes, _NO_WAKE)
            if wake < _NO_WAKE:      # at or after limit: stopped at the loop's top, as in replay._run
                t = wake
                continue
            if running > 0 or to_inject > 0:
                _settle(cores, wakes, ran)
                return _DEADLOCK
        elif moves == 0 and issued == 0 and progressed == 0:
            # Wavelets held and nothing moved: deadlocked unless a PE in private cycles goes on
            # (replay._run's rule, checked again once the wake found has passed).
            if frozen_until < t:
                frozen_until = _next_due(cores, wakes, _NO_WAKE)
                if frozen_until == _NO_WAKE:
                    _settle(cores, wakes, ran)
                    return _DEADLOCK
        else:
            frozen_until = -1
        t += 1
    _settle(cores, wakes, ran)
    scalars[_T], scalars[_RUNNING], scalars[_FIFOS] = t, running, nonempty_fifos
    scalars[_TX], scalars[_TO_INJECT], scalars[_LAST] = tx_wavelets, to_inject, last
    if status == _FINISHED and queues.rx.sum() > 0:
        return _DEADLOCK
    return status


def route_table(network) -> tuple[np.ndarray, np.ndarray]:
    """The routes of ``network`` packed for the fast engine (:func:`.replay.pack_routes`:
    ``(rows, index)``), with each route's upstream (:meth:`.network.Network.upstream`)."""
    return pack_routes(network.routes(), network.upstream())


def run_events(network):
    """A run function with :func:`.replay._run`'s signature: the fast engine over ``network``'s routes."""
    rows, index = route_table(network)

    def run(routes, ports, ops, queues, cores, events, scalars, limit, watch):
        return _run_events(routes, ports, ops, queues, cores, events, scalars, limit, watch, rows, index)
    return run
