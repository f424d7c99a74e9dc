"""The compiled steps of the region replay (:mod:`.replay_region`, whose docstring states the
rule): the record of one period of the whole fabric (:class:`Record`), taken a cycle at a time
(:func:`_take`), and the cycle loop that steps only the cells that may differ from it
(:func:`_region`), rewriting their entries as it goes."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import literal_unroll, njit

from .network import TO_PE, TO_ROUTER
from .replay import (_CONFLICTS, _GRANT, _INJECT, _LAST, _N, _OUT_OF_TIME, _POP, _RUNNING, _STOPPED, _T, _TARGETS,
                     _TX_MOVE, _WRITE, _apply_grants, _apply_injections, _apply_pe_queues, _apply_tx_moves,
                     _grant_injections, _grant_router, _grant_tx_move, _push_fifo, _run_packed, _step_pes)
from .replay_periods import _RX_UNIT, _repeats  # a record keeps both queue counts in a byte as a kept state does

__all__ = ["Record", "new_record", "record_bytes"]

#: Bytes of a record per cell and cycle, beside the queue counts (a byte per color) and the output queue.
_CELL_BYTES = 4 + 4 + 1 + 1 + 4 + 4 + 1 + 1
#: The deepest router FIFO or input queue a record holds (four bits each).
MAX_DEPTH = _RX_UNIT - 1
# Why a region replay ended (beside the replay's own results).
_TOO_BIG, _STILL, _REBASE = 2, 3, 4


class Record(NamedTuple):
    """One period of the whole fabric from ``t0``: for ``k`` in ``0 .. D`` the relative state at the
    start of cycle ``t0 + k`` (``queued``: per color the router FIFO's count plus :data:`_RX_UNIT`
    times the input queue's, both at most :data:`MAX_DEPTH`, so that a record of the wafer's GEMM
    period fits; ``tx``: the output queue's colors from its head, -1 past its count; ``free``:
    ``max(free_at - t, 0)`` of a live PE; ``index``: its element index; ``flags``: 1 its last
    element enters the output queue at ``t``, 2 done; ``write``: the
    color of its element issued at ``t - 1``, -1 none; ``pc``), and for ``k`` in ``0 .. D - 1`` what
    cycle ``t0 + k`` did (``grant``: the colors each router granted, as bits; ``act``: the cell
    granted, moved its output queue's head, popped or wrote; ``conf``: its router's conflicts);
    per edge port, ``has[p, k, c]``: it had wavelets of color ``c`` left at ``t0 + k``, and
    ``inject[p, k]``: the color it injected in cycle ``t0 + k``, -1 none. Every array is cell (or
    port) first: :func:`new_record`."""

    queued: np.ndarray
    tx: np.ndarray
    free: np.ndarray
    index: np.ndarray
    flags: np.ndarray
    write: np.ndarray
    pc: np.ndarray
    grant: np.ndarray
    act: np.ndarray
    conf: np.ndarray
    has: np.ndarray
    inject: np.ndarray


def new_record(period: int, cells: int, colors: int, depth: int, ports: int, phase_first: bool = False) -> Record:
    """An empty record of ``period`` cycles, indexed cell (or port) first, ``[cell, k, ...]``, and laid
    out so in memory: a stepped cell reads its own rows at consecutive phases, cycle after cycle, so
    they share cache lines (phase first, every cycle's reads of a cell missed the cache). With
    ``phase_first`` the same indexing over memory laid out phase first (:func:`_record`'s stage,
    where every cell's row of one phase is written in one pass)."""
    def zeros(shape, dtype, fill=0):
        laid = shape if not phase_first else (shape[1], shape[0], *shape[2:])
        array = np.zeros(laid, dtype) if fill == 0 else np.full(laid, fill, dtype)
        return array if not phase_first else np.swapaxes(array, 0, 1)

    states, cycles = (cells, period + 1), (cells, period)
    return Record(zeros((*states, colors), np.uint8),
                  zeros((*states, depth), np.int8), zeros(states, np.int32), zeros(states, np.int32),
                  zeros(states, np.int8), zeros(states, np.int8), zeros(states, np.int32),
                  zeros(cycles, np.uint32), zeros(cycles, np.int8), zeros(cycles, np.int8),
                  zeros((ports, period + 1, colors), np.bool_), zeros((ports, period), np.int8, -1))


def record_bytes(period: int, cells: int, colors: int, depth: int) -> int:
    """The bytes of a :class:`Record` of ``period`` cycles."""
    return (period + 1) * cells * (colors + depth + _CELL_BYTES)


@njit(cache=True, nogil=True)
def _router_conflicts(rows, index, queues, router_depth, rx_depth, first_color, scratch, out):
    """Each router's conflicts at this start-of-cycle state into ``out`` (its grants taken into
    ``scratch``, not recorded)."""
    cells, colors = queues.router_fifo.shape
    for r in range(cells):
        out[r] = 0
        if queues.busy_fifos[r] != 0:
            scratch.count[_GRANT] = 0
            out[r] = _grant_router(rows, index, queues.router_fifo, queues.busy_fifos[r], queues.rx, router_depth,
                                   rx_depth, scratch, r, first_color, colors)


@njit(cache=True, nogil=True)
def _port_conflicts(routes, queues, ports, first_color, only, out):
    """Add to ``out[r]`` the conflicts of router ``r``'s edge ports (:func:`.replay._grant_injections`:
    a port where a second color could go after the first), for the routers ``only`` marks (all if
    it is empty): a port's choice depends on the rotation as a router's grants do."""
    input_port, router_fifo = routes.input_port, queues.router_fifo
    colors = input_port.shape[1]
    for p in range(ports.router.shape[0]):
        r = ports.router[p]
        if ports.left_total[p] == 0 or (only.shape[0] > 0 and not only[r]):
            continue
        ready = 0
        for q in range(colors):
            c = (first_color + q) % colors
            if ports.left[p, c] > 0 and input_port[r, c] == ports.code[p] and router_fifo[r, c] < routes.router_depth:
                ready += 1
        if ready > 1:
            out[r] += 1


@njit(cache=True, nogil=True)
def _phases_in(dst, src, k0, n):
    """``dst[:, k0:k0 + n] = src[:, :n]`` for ``[cell, phase]`` arrays, a cell at a time: each cell's
    rows are written side by side, and the phase-first ``src`` is read as a few sequential streams
    (numba's slice copy of these strided arrays took 1.4 times as long)."""
    for r in range(dst.shape[0]):
        for j in range(n):
            dst[r, k0 + j] = src[r, j]


@njit(cache=True, nogil=True)
def _phases_in_3d(dst, src, k0, n):
    """:func:`_phases_in` for ``[cell, phase, entry]`` arrays (a row copied as a slice took three
    times as long)."""
    for r in range(dst.shape[0]):
        for j in range(n):
            for e in range(dst.shape[2]):
                dst[r, k0 + j, e] = src[r, j, e]


@njit(cache=True, nogil=True)
def _flush(stage, rec, k0, states, moves):
    """Copy the stage's first ``states`` state rows and ``moves`` rows of moves into ``rec`` from phase
    ``k0`` on (loops unrolled over the fields, of several types)."""
    for pair in literal_unroll(((rec.queued, stage.queued), (rec.tx, stage.tx), (rec.has, stage.has))):
        _phases_in_3d(pair[0], pair[1], k0, states)
    for pair in literal_unroll(((rec.free, stage.free), (rec.index, stage.index), (rec.flags, stage.flags),
                                (rec.write, stage.write), (rec.pc, stage.pc))):
        _phases_in(pair[0], pair[1], k0, states)
    for pair in literal_unroll(((rec.grant, stage.grant), (rec.act, stage.act), (rec.conf, stage.conf),
                                (rec.inject, stage.inject))):
        _phases_in(pair[0], pair[1], k0, moves)


@njit(cache=True, nogil=True)
def _record(routes, rows, index, probe, ports, ops, queues, cores, events, scalars, period, rec, stage, scratch,
            act_total, conf_total, conf_count, conf_cells):
    """Run ``period`` cycles from the start of cycle ``scalars[_T]`` on the reference engine, a cycle
    at a time, taking each into the empty record ``rec`` (:func:`_capture`, :func:`_capture_moves`
    for every cell: the totals and conflict lists with it) and the state after them as its last row;
    returns ``_OUT_OF_TIME`` when all were taken, ``_STOPPED`` if the idle skip jumped (no period to
    keep; the run goes on from there) or a phase's conflict list overflowed, or the run's end
    (finished or hung) as the engine gave it. The cycles are taken into ``stage`` first, a record
    of a few cycles laid out phase first (:func:`new_record`), and copied into ``rec`` a stage at a
    time (:func:`_flush`): taken straight into the cell-first ``rec``, every cell's entry of a cycle
    fell in a cache line of its own, and a record cost seven plain cycles a cycle."""
    cells, colors = queues.router_fifo.shape
    t0 = scalars[_T]
    every = np.arange(cells).astype(np.int32)
    stepped = np.ones(cells, np.bool_)
    base = np.zeros(cells, np.int64)
    pending = np.full(cells, -1, np.int8)
    conf_now = np.zeros(cells, np.int64)
    old_grant = np.zeros(cells, np.uint32)
    size = stage.act.shape[1]
    k0 = 0
    for k in range(period):
        j = k - k0
        if j == 0:      # the moves of a stage's phases are taken as changes to zero rows
            stage.act[:] = 0
            stage.conf[:] = 0
        _capture(queues, cores, events, ports, t0 + k, j, stage, base, every, cells, stepped, pending)
        _router_conflicts(rows, index, queues, routes.router_depth, routes.rx_depth, (t0 + k) % colors, scratch,
                          conf_now)
        _port_conflicts(routes, queues, ports, (t0 + k) % colors, np.zeros(0, np.bool_), conf_now)
        status = _run_packed(routes, ports, ops, queues, cores, events, scalars, t0 + k + 1, -1, rows, index,
                             probe)
        if status != _OUT_OF_TIME:
            return status
        if scalars[_T] != t0 + k + 1:
            return _STOPPED
        if not _capture_moves(events, ports, j, stage, every, cells, stepped, conf_now, act_total[k0:],
                              conf_total[k0:], conf_count[k0:], conf_cells[k0:], old_grant):
            return _STOPPED
        if j == size - 1:
            _flush(stage, rec, k0, size, size)
            k0 += size
    _capture(queues, cores, events, ports, t0 + period, period - k0, stage, base, every, cells, stepped, pending)
    _flush(stage, rec, k0, period - k0 + 1, period - k0)
    return _OUT_OF_TIME


# Speed: every helper below loops over cells itself. A per-cell helper taking the named tuples
# (even inline, with one return) made numba count references at every call: 120 ns a cell.

@njit(cache=True, nogil=True)
def _deviants(queues, cores, events, ports, t, k, rec, base, a_list, a_count, forced, in_a, pending, dev):
    """The stepped cells that are not forced and whose state at the start of cycle ``t`` is not the
    record's at phase ``k`` (op rows ``base`` on), and the routers of the edge ports whose colors left
    are not the record's, into ``dev``; returns how many."""
    colors = queues.router_fifo.shape[1]
    depth = queues.tx_colors.shape[1]
    count = events.count
    for g in range(count[_WRITE]):
        pending[events.who[_WRITE, g]] = events.color[_WRITE, g]
    nd = 0
    for i in range(a_count):
        r = a_list[i]
        if forced[r]:
            continue
        same = pending[r] == rec.write[r, k] and cores.pc[r] == rec.pc[r, k] + base[r]
        c = 0
        while same and c < colors:
            same = queues.router_fifo[r, c] + _RX_UNIT * queues.rx[r, c] == rec.queued[r, k, c]
            c += 1
        n = queues.tx_count[r]
        if same and n < depth:
            same = rec.tx[r, k, n] == -1
        j = 0
        at = queues.tx_head[r]
        while same and j < n:           # the output queue from its head
            same = rec.tx[r, k, j] == queues.tx_colors[r, at]
            j += 1
            at = at + 1 if at + 1 < depth else 0
        if same and cores.done[r]:
            same = rec.flags[r, k] == 2
        elif same:
            free = cores.free_at[r] - t
            same = rec.flags[r, k] == (1 if cores.written_at[r] == t else 0) and \
                rec.free[r, k] == (free if free > 0 else 0) and rec.index[r, k] == cores.vector_index[r]
        if not same:
            dev[nd] = r
            nd += 1
    for g in range(count[_WRITE]):
        pending[events.who[_WRITE, g]] = -1
    for p in range(ports.left.shape[0]):           # a port's colors left are part of its router's state
        r = ports.router[p]
        for c in range(colors):
            if (ports.left[p, c] > 0) != rec.has[p, k, c]:
                dev[nd] = r
                nd += 1
                break
    return nd


@njit(cache=True, nogil=True)
def _neighbourhood(dev, nd, t, mark, new_a, nbr_ptr, nbr, hops):
    """Every cell within ``hops`` hops of ``dev[:nd]`` into ``new_a`` (each once: ``mark`` holds ``t``);
    returns how many."""
    na = 0
    for i in range(nd):
        if mark[dev[i]] != t:
            mark[dev[i]] = t
            new_a[na] = dev[i]
            na += 1
    first = 0
    for _ in range(hops):           # a hop out from the cells found so far
        last = na
        for i in range(first, last):
            r = new_a[i]
            for j in range(nbr_ptr[r], nbr_ptr[r + 1]):
                if mark[nbr[j]] != t:
                    mark[nbr[j]] = t
                    new_a[na] = nbr[j]
                    na += 1
        first = last
    return na


@njit(cache=True, nogil=True)
def _materialize(queues, cores, events, t, k, rec, base, joiners, n, in_a):
    """Give the cells ``joiners[:n]`` the record's state at phase ``k`` (op rows ``base`` on), their
    recorded pending writes appended, and mark them stepped."""
    colors = queues.router_fifo.shape[1]
    depth = queues.tx_colors.shape[1]
    count, who, color = events.count, events.who, events.color
    kept = count[_WRITE]
    for i in range(n):
        r = joiners[i]
        in_a[r] = True
        busy = 0
        for c in range(colors):
            queues.router_fifo[r, c] = rec.queued[r, k, c] % _RX_UNIT
            queues.rx[r, c] = rec.queued[r, k, c] // _RX_UNIT
            if (rec.queued[r, k, c] % _RX_UNIT) > 0:
                busy |= 1 << c
        queues.busy_fifos[r] = busy
        m = 0
        for j in range(depth):
            if rec.tx[r, k, j] >= 0:
                queues.tx_colors[r, j] = rec.tx[r, k, j]
                m += 1
        queues.tx_head[r] = 0
        queues.tx_count[r] = m
        cores.pc[r] = rec.pc[r, k] + base[r]
        cores.done[r] = rec.flags[r, k] == 2
        if not cores.done[r]:            # a done PE keeps its exit: it was done before the record began
            cores.free_at[r] = t + rec.free[r, k]
            cores.vector_index[r] = rec.index[r, k]
            cores.written_at[r] = t if rec.flags[r, k] == 1 else -1
        if rec.write[r, k] >= 0:
            who[_WRITE, kept] = r
            color[_WRITE, kept] = rec.write[r, k]
            kept += 1
    count[_WRITE] = kept


@njit(cache=True, nogil=True)
def _join(queues, cores, events, t, k, rec, base, a_list, a_count, new_a, na, mark, in_a, joiners):
    """Make ``new_a[:na]`` the stepped cells: the others leave (their state is the record's), the
    joiners get the record's state at phase ``k`` (:func:`_materialize`), and the pending writes
    are the stepped cells' own and the joiners' recorded ones."""
    for i in range(a_count):
        r = a_list[i]
        if mark[r] != t:
            in_a[r] = False
    count, who, color = events.count, events.who, events.color
    kept = 0
    for g in range(count[_WRITE]):
        if in_a[who[_WRITE, g]]:
            who[_WRITE, kept] = who[_WRITE, g]
            color[_WRITE, kept] = color[_WRITE, g]
            kept += 1
    count[_WRITE] = kept
    n = 0
    for i in range(na):
        r = new_a[i]
        a_list[i] = r
        if not in_a[r]:
            joiners[n] = r
            n += 1
    _materialize(queues, cores, events, t, k, rec, base, joiners, n, in_a)


@njit(cache=True, nogil=True)
def _capture(queues, cores, events, ports, t, k, rec, base, a_list, na, in_a, pending):
    """Row ``k`` of the record for the cells ``a_list[:na]`` and the edge ports of the stepped cells
    (``in_a``): their true state at the start of cycle ``t`` (the record becomes the period just
    stepped, :func:`_region`, which passes the deviant cells in mid-period and every stepped cell
    at its end)."""
    colors = queues.router_fifo.shape[1]
    depth = queues.tx_colors.shape[1]
    for g in range(events.count[_WRITE]):
        pending[events.who[_WRITE, g]] = events.color[_WRITE, g]
    for i in range(na):
        r = a_list[i]
        for c in range(colors):
            rec.queued[r, k, c] = queues.router_fifo[r, c] + _RX_UNIT * queues.rx[r, c]
        at = queues.tx_head[r]
        for j in range(depth):
            if j < queues.tx_count[r]:
                rec.tx[r, k, j] = queues.tx_colors[r, at]
                at = at + 1 if at + 1 < depth else 0
            else:
                rec.tx[r, k, j] = -1
        if cores.done[r]:
            rec.free[r, k], rec.index[r, k], rec.flags[r, k] = 0, 0, 2
        else:
            free = cores.free_at[r] - t
            rec.free[r, k] = free if free > 0 else 0
            rec.index[r, k] = cores.vector_index[r]
            rec.flags[r, k] = 1 if cores.written_at[r] == t else 0
        rec.write[r, k] = pending[r]
        rec.pc[r, k] = cores.pc[r] - base[r]
    for g in range(events.count[_WRITE]):
        pending[events.who[_WRITE, g]] = -1
    for p in range(ports.left.shape[0]):
        if in_a[ports.router[p]]:
            for c in range(colors):
                rec.has[p, k, c] = ports.left[p, c] > 0


@njit(cache=True, nogil=True)
def _capture_moves(events, ports, k, rec, a_list, na, in_a, conf_now, act_total, conf_total, conf_count,
                   conf_cells, old_grant):
    """What cycle ``t0 + k`` (just run) did, for the stepped cells and their edge ports (conflicts
    from ``conf_now``), the totals and lists of phase ``k`` kept up to date; their writes are the
    pending ones of row ``k``; each stepped cell's recorded grants before into ``old_grant`` (for
    :func:`_spill`). False if a phase's list of cells with conflicts is full."""
    for i in range(na):
        r = a_list[i]
        old_grant[r] = rec.grant[r, k]
        act_total[k] -= rec.act[r, k]
        rec.grant[r, k] = 0
        rec.act[r, k] = 1 if rec.write[r, k] >= 0 else 0
    for g in range(events.count[_GRANT]):
        r = events.who[_GRANT, g]
        rec.grant[r, k] |= 1 << events.color[_GRANT, g]
        rec.act[r, k] = 1
    for kind in (_TX_MOVE, _POP):
        for g in range(events.count[kind]):
            rec.act[events.who[kind, g], k] = 1
    room = True
    for i in range(na):
        r = a_list[i]
        act_total[k] += rec.act[r, k]
        old, new = rec.conf[r, k], conf_now[r]
        conf_total[k] += new - old
        rec.conf[r, k] = new
        if old > 0 and new == 0:
            for j in range(conf_count[k]):
                if conf_cells[k, j] == r:
                    conf_count[k] -= 1
                    conf_cells[k, j] = conf_cells[k, conf_count[k]]
                    break
        elif old == 0 and new > 0:
            if conf_count[k] == conf_cells.shape[1]:
                room = False
            else:
                conf_cells[k, conf_count[k]] = r
                conf_count[k] += 1
    for p in range(ports.left.shape[0]):
        if in_a[ports.router[p]]:
            rec.inject[p, k] = -1
    for g in range(events.count[_INJECT]):
        rec.inject[events.who[_INJECT, g], k] = events.color[_INJECT, g]
    return room


@njit(cache=True, nogil=True)
def _spill(rows, index, queues, cores, events, t, k, rec, base, a_list, na, in_a, mark, old_grant, joiners, diffs):
    """After cycle ``t`` (phase ``k``, just run and taken, :func:`_capture_moves`): the cells outside
    the stepped ones ``a_list[:na]`` (those ``mark`` does not hold at ``t``) into which a stepped
    cell granted other colors than it did in the record (``old_grant``) join them at ``t + 1``: each
    is given the record's state at phase ``k + 1`` (:func:`_materialize`: its own cycle was the
    record's) with the difference in what it received, a wavelet more or less of each such color.
    Returns the stepped cells' count with them (appended to ``a_list``)."""
    nd = 0
    n = 0
    for i in range(na):
        r = a_list[i]
        bits = old_grant[r] ^ rec.grant[r, k]
        if bits == 0:
            continue
        diffs[nd] = r
        nd += 1
        c = 0
        while bits != 0:
            if bits & 1:
                row = index[r, c]
                for q in range(rows[row, _N]):
                    kind = rows[row, _TARGETS + 2 * q]
                    to = r + rows[row, _TARGETS + 2 * q + 1]
                    if (kind == TO_ROUTER or kind == TO_PE) and not in_a[to]:
                        in_a[to] = True
                        joiners[n] = to
                        n += 1
            bits >>= 1
            c += 1
    if n == 0:
        return na
    _materialize(queues, cores, events, t + 1, k + 1, rec, base, joiners, n, in_a)
    for i in range(nd):
        r = diffs[i]
        bits = old_grant[r] ^ rec.grant[r, k]
        c = 0
        while bits != 0:
            if bits & 1:
                row = index[r, c]
                more = (rec.grant[r, k] >> c) & 1
                for q in range(rows[row, _N]):
                    kind = rows[row, _TARGETS + 2 * q]
                    to = r + rows[row, _TARGETS + 2 * q + 1]
                    if (kind != TO_ROUTER and kind != TO_PE) or mark[to] == t:  # stepped: took the true grants
                        continue
                    if kind == TO_ROUTER and more:
                        _push_fifo(queues, to, c)
                    elif kind == TO_ROUTER:
                        queues.router_fifo[to, c] -= 1
                        if queues.router_fifo[to, c] == 0:
                            queues.busy_fifos[to] &= ~(1 << c)
                    elif kind == TO_PE:
                        queues.rx[to, c] += 1 if more else -1
            bits >>= 1
            c += 1
    for i in range(n):
        a_list[na + i] = joiners[i]
    return na + n


@njit(cache=True, nogil=True)
def _ring(queues, k, rec, a_list, na, in_a, t, ring_mark, ring, nbr_ptr, nbr):
    """The cells one hop outside the stepped ones into ``ring``, their queue counts the record's
    (the room a stepped cell's grant needs); returns how many."""
    colors = queues.router_fifo.shape[1]
    nr = 0
    for i in range(na):
        r = a_list[i]
        for j in range(nbr_ptr[r], nbr_ptr[r + 1]):
            s = nbr[j]
            if not in_a[s] and ring_mark[s] != t:
                ring_mark[s] = t
                ring[nr] = s
                nr += 1
                for c in range(colors):
                    queues.router_fifo[s, c] = rec.queued[s, k, c] % _RX_UNIT
                    queues.rx[s, c] = rec.queued[s, k, c] // _RX_UNIT
    return nr


@njit(cache=True, nogil=True)
def _cycle(routes, rows, index, ports, ops, queues, cores, events, t, k, rec, a_list, na, in_a, ring, nr,
           conf_now):
    """Cycle ``t`` of the stepped cells (each router's conflicts, its edge ports' included, into
    ``conf_now``), the ring's recorded grants into them and the background's recorded injections;
    returns ``(moves, conflicts, PEs finished, last exit or -1)``."""
    colors = queues.router_fifo.shape[1]
    depth = routes.tx_depth
    first_color = t % colors
    count = events.count
    count[:_WRITE] = 0
    conflicts = 0
    for i in range(na):
        r = a_list[i]
        conf_now[r] = 0
        if queues.busy_fifos[r] != 0:
            conf_now[r] = _grant_router(rows, index, queues.router_fifo, queues.busy_fifos[r], queues.rx,
                                        routes.router_depth, routes.rx_depth, events, r, first_color, colors)
            conflicts += conf_now[r]
        if queues.tx_count[r] > 0:
            _grant_tx_move(rows, index, queues.router_fifo, routes.router_depth, queues.tx_colors,
                           queues.tx_head, events, r)
    _port_conflicts(routes, queues, ports, first_color, in_a, conf_now)
    conflicts += _grant_injections(routes, queues, ports, first_color, events, in_a)
    _, finished, last_exit = _step_pes(ops, cores, queues, depth, events, t, a_list, na)
    moves = count[_GRANT] + count[_INJECT] + count[_TX_MOVE] + count[_POP] + count[_WRITE]
    _apply_grants(rows, index, queues, events)
    _apply_injections(queues, ports, events)
    _apply_tx_moves(queues, depth, events)
    for i in range(nr):
        s = ring[i]
        bits = rec.grant[s, k]
        c = 0
        while bits != 0:
            if bits & 1:
                row = index[s, c]
                for q in range(rows[row, _N]):
                    to = s + rows[row, _TARGETS + 2 * q + 1]
                    if in_a[to] and rows[row, _TARGETS + 2 * q] == TO_ROUTER:
                        _push_fifo(queues, to, c)
                    elif in_a[to] and rows[row, _TARGETS + 2 * q] == TO_PE:
                        queues.rx[to, c] += 1
            bits >>= 1
            c += 1
    for p in range(ports.left.shape[0]):        # the background's ports inject as recorded
        c = rec.inject[p, k]
        if c >= 0 and not in_a[ports.router[p]]:
            ports.left[p, c] -= 1
            ports.left_total[p] -= 1
    _apply_pe_queues(queues, depth, events)
    return moves, conflicts, finished, last_exit


@njit(cache=True, nogil=True)
def _region(routes, rows, index, ports, ops, queues, cores, events, scalars, limit, t0, period, rec, base,
            forced, open_cells, conf_count, conf_cells, act_total, conf_total, nbr_ptr, nbr, in_a, max_active,
            stats, trace, touched, hops):
    """Step the cells that may differ from the record (module docstring) from the start of cycle
    ``scalars[_T]`` (in ``t0 .. t0 + period``) on, the others taken from ``rec`` (op rows ``base``
    on), writing the stepped cells' states and moves into ``rec`` as it goes; returns why it
    stopped: ``_REBASE`` at ``t0 + period`` (``rec`` then holds the period just stepped, true for
    every cell), ``_TOO_BIG``, ``_STILL`` or ``_OUT_OF_TIME``, with ``scalars`` holding the cycle,
    the last cycle with a move and the conflicts. ``in_a`` marks the stepped cells, whose state in
    ``queues`` and ``cores`` is true; ``forced`` lists the cells whose op rows do not repeat the
    record's, ``open_cells`` those whose record does not close, ``conf_cells[k, :conf_count[k]]``
    those with conflicts at phase ``k``, ``act_total[k]`` and ``conf_total[k]`` the record's moving
    cells and conflicts at phase ``k`` (all three kept up to date as the record is rewritten); ``stats`` gathers the cycles stepped, the cells
    stepped in them, the deviant cells, the rows of ``trace`` written (``(t, stepped, deviant)`` a
    cycle while it has room) and the cells that joined the stepped ones by a spill (:func:`_spill`;
    ``hops`` around the deviant cells are stepped, :data:`.replay_region.MARGIN`); ``touched`` marks the cells whose phase 0 or phase ``period`` it
    rewrites (:func:`_period_end`)."""
    cells, colors = queues.router_fifo.shape
    rotation_same = period % colors == 0
    t, last, conflicts = scalars[_T], scalars[_LAST], scalars[_CONFLICTS]
    running = scalars[_RUNNING]
    mark = np.full(cells, -1, np.int64)
    ring_mark = np.full(cells, -1, np.int64)
    pending = np.full(cells, -1, np.int8)
    a_list = np.zeros(cells, np.int32)
    a_count = 0
    for r in range(cells):
        if in_a[r]:
            a_list[a_count] = r
            a_count += 1
    # A stepped cell or an edge port's router each once, the forced, the open and a phase's conflicts.
    dev = np.empty(cells + ports.router.shape[0] + forced.shape[0] + open_cells.shape[0] + conf_cells.shape[1],
                   np.int32)
    conf_now = np.zeros(cells, np.int64)
    old_grant = np.zeros(cells, np.uint32)
    diffs = np.empty(cells, np.int32)
    is_forced = np.zeros(cells, np.bool_)
    is_forced[forced] = True
    new_a = np.empty(cells, np.int32)
    ring = np.empty(cells, np.int32)
    while True:
        if t >= limit:
            status = _OUT_OF_TIME
            break
        k = t - t0
        if k == period:
            status = _REBASE
            break
        nd = _deviants(queues, cores, events, ports, t, k, rec, base, a_list, a_count, is_forced, in_a, pending,
                       dev)
        for i in range(forced.shape[0]):
            dev[nd] = forced[i]
            nd += 1
        if k == period - 1:
            for i in range(open_cells.shape[0]):
                dev[nd] = open_cells[i]
                nd += 1
        if not rotation_same:
            for i in range(conf_count[k]):
                dev[nd] = conf_cells[k, i]
                nd += 1
        na = _neighbourhood(dev, nd, t, mark, new_a, nbr_ptr, nbr, hops)
        new_a[:na].sort()       # in memory order: neighbouring cells share cache lines (the events' order is free)
        bg_act, bg_conf = act_total[k], conf_total[k]
        for i in range(na):
            bg_act -= rec.act[new_a[i], k]
            bg_conf -= rec.conf[new_a[i], k]
        if na > max_active:
            status = _TOO_BIG
            break
        if bg_act <= 0:         # a cycle the background would not move in: the engine's checks decide it
            status = _STILL
            break
        _join(queues, cores, events, t, k, rec, base, a_list, a_count, new_a, na, mark, in_a, ring)
        a_count = na
        # Only the deviant cells' entries change: a stepped cell that is not deviant, and a joiner
        # (given the record's state), holds the record's state already (the fields _deviants compares).
        _capture(queues, cores, events, ports, t, k, rec, base, dev, nd, in_a, pending)
        if k == 0:
            for i in range(nd):
                touched[dev[i]] = True
        stats[0] += 1
        stats[1] += na
        stats[2] += nd
        if stats[3] < trace.shape[0]:       # a picture's data: the cycle, the stepped and the deviant PEs
            trace[stats[3], 0], trace[stats[3], 1], trace[stats[3], 2] = t, na, nd
            stats[3] += 1
        nr = _ring(queues, k, rec, a_list, na, in_a, t, ring_mark, ring, nbr_ptr, nbr)
        moves, cycle_conflicts, finished, last_exit = _cycle(routes, rows, index, ports, ops, queues, cores,
                                                             events, t, k, rec, a_list, na, in_a, ring, nr,
                                                             conf_now)
        room = _capture_moves(events, ports, k, rec, a_list, na, in_a, conf_now, act_total, conf_total,
                              conf_count, conf_cells, old_grant)
        a_count = _spill(rows, index, queues, cores, events, t, k, rec, base, a_list, na, in_a, mark, old_grant,
                         ring, diffs)
        stats[4] += a_count - na
        na = a_count
        running -= finished
        if last_exit > last:
            last = last_exit
        if (moves > 0 or bg_act > 0) and t > last:
            last = t
        conflicts += cycle_conflicts + bg_conf
        t += 1
        if not room:        # more cells with conflicts at a phase than its list holds: stop here
            status = _TOO_BIG
            break
        if t - t0 == period:        # the state at the end of the period, of the cells stepped last
            _capture(queues, cores, events, ports, t, period, rec, base, a_list, na, in_a, pending)
            for i in range(na):
                touched[a_list[i]] = True
    scalars[_T], scalars[_LAST], scalars[_CONFLICTS], scalars[_RUNNING] = t, last, conflicts, running
    return status


#: How many periods ahead :func:`_period_end` proves a cell's op rows repeat when it looks at them.
_PROVE_AHEAD = 64


@njit(cache=True, nogil=True)
def _period_end(ops, rec, period, base, ends, touched, first, forced, proven):
    """At the end of the recorded period, into ``ends[r]`` per cell: its shift (the op rows it moved
    over the period), where it stands now (``base`` on), and 1 if its period closes (its state at
    phase ``period`` is its state at phase 0 and its shift is not negative), else 0. Into
    ``forced`` go the moving cells whose op rows from where they stand do not repeat the period's
    for one more period (as :func:`.replay_periods._repeats`); returns how many.

    Only a cell whose phase 0 or phase ``period`` was rewritten since the last call (``touched``,
    cleared here; every cell when ``first``) is read from the record: another's entries are as
    they were, so its shift and closing are too, and it stands its shift further on (``base``
    moved on by it since). ``proven[r]`` is ``(d, first, last)``: rows ``first .. last`` of
    ``ops`` equal the rows ``d`` before them; a cell whose next period lies inside that span needs
    no look at its op rows, else they are compared from where it stands for up to
    :data:`_PROVE_AHEAD` periods (:func:`.replay_periods._repeats`) and the whole periods that
    repeat kept as the span (zeros at the first call). The same answers as
    reading every cell's record and op rows at every call, at a fraction of the memory traffic
    (that read a cache line per field and cell: 14 ms a period on 128x994)."""
    cells = rec.pc.shape[0]
    colors, depth = rec.queued.shape[2], rec.tx.shape[2]
    at, step = np.zeros(1, np.int64), np.zeros(1, np.int64)     # one cell's row and shift for _repeats
    n = 0
    for r in range(cells):
        if first or touched[r]:
            d = np.int64(rec.pc[r, period]) - rec.pc[r, 0]
            same = d >= 0 and rec.free[r, period] == rec.free[r, 0] and rec.index[r, period] == rec.index[r, 0] \
                and rec.flags[r, period] == rec.flags[r, 0] and rec.write[r, period] == rec.write[r, 0]
            c = 0
            while same and c < colors:
                same = rec.queued[r, period, c] == rec.queued[r, 0, c]
                c += 1
            j = 0
            while same and j < depth:
                same = rec.tx[r, period, j] == rec.tx[r, 0, j]
                j += 1
            ends[r, 0], ends[r, 1], ends[r, 2] = d, rec.pc[r, period] + base[r], 1 if same else 0
            touched[r] = False
        else:
            ends[r, 1] += ends[r, 0]
        d, end = ends[r, 0], ends[r, 1]
        if d <= 0:
            continue
        if not (proven[r, 0] == d and proven[r, 1] <= end and end + d <= proven[r, 2]):
            at[0], step[0] = end, d
            proven[r, 0], proven[r, 1], proven[r, 2] = d, end, end + _repeats(ops, at, step, _PROVE_AHEAD) * d
        if end + d > proven[r, 2]:
            forced[n] = r
            n += 1
    return n


@njit(cache=True, nogil=True)
def _neighbour_table(n_targets, target_kind, target):
    """The routers each router sends to or takes from on some color (its own PE left out) as
    ``(indptr, indices)``, each router's ascending (:func:`.replay_region.neighbours`)."""
    cells, colors, _ = target.shape
    room = 16
    found = np.full((cells, room), -1, np.int64)
    count = np.zeros(cells, np.int64)
    for r in range(cells):
        for c in range(colors):
            for k in range(n_targets[r, c]):
                kind = target_kind[r, c, k]
                to = target[r, c, k]
                if (kind != TO_ROUTER and kind != TO_PE) or to == r:
                    continue
                for a, b in ((r, to), (to, r)):
                    known = False
                    for j in range(count[a]):
                        known = known or found[a, j] == b
                    if not known:
                        if count[a] == room:
                            raise ValueError("a router with more than 16 neighbours")
                        found[a, count[a]] = b
                        count[a] += 1
    indptr = np.zeros(cells + 1, np.int64)
    for r in range(cells):
        indptr[r + 1] = indptr[r] + count[r]
    indices = np.empty(indptr[cells], np.int64)
    for r in range(cells):
        indices[indptr[r]:indptr[r + 1]] = np.sort(found[r, :count[r]])
    return indptr, indices


@njit(cache=True, nogil=True)
def _cell_hashes(fifo, rx, tx, done, free, index, written, writes):
    """A 64-bit hash of each cell's relative state (the period search's snapshot arrays): where a
    stop's cells differ from an earlier stop's (a proposal only: equal hashes prove nothing)."""
    cells = fifo.shape[0]
    out = np.empty(cells, np.uint64)
    mix = np.uint64(0x9E3779B97F4A7C15)
    for r in range(cells):
        h = np.uint64(1469598103934665603)
        for c in range(fifo.shape[1]):
            h = (h ^ np.uint64((fifo[r, c] & 0xFF) | ((rx[r, c] & 0xFF) << 8))) * mix
        for j in range(tx.shape[1]):
            h = (h ^ np.uint64(tx[r, j] & 0xFF)) * mix
        h = (h ^ np.uint64((free[r] & 0xFFFFFFFF) | ((index[r] & 0xFFFFFF) << 32))) * mix
        h = (h ^ np.uint64((writes[r] & 0xFF) | (2 if done[r] else 0) << 8 | (1 if written[r] else 0) << 10)) * mix
        out[r] = h
    return out
