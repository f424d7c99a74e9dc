"""The replay of the static cycle model: every PE's timing ops run, cycle by
cycle, against the routers, the edge ports and the PE queues.

The rules follow ``docs/architecture.md`` sections 3, 4 and 6 and the golden
model to the cycle. Every decision of a cycle is taken from the state at its
start and applied at its end, in this order:

1. router grants (:func:`_grant_router`): a router scans its colors in
   rotating priority (from ``t mod colors``) and forwards a color's head when
   none of its output ports is taken yet this cycle and every target has room
   (atomic multicast: a neighbour router whose route takes that color from
   this link and whose FIFO is not full, or the PE's input queue);
2. edge injections (:func:`_grant_injections`): an edge port with wavelets
   left sends one, of the first color in the same rotation that its boundary
   router routes from it and has room for;
3. output-queue moves (:func:`_grant_tx_move`, in step 1's pass over the
   routers, :func:`_grant_routers`): the head of a PE's output
   queue enters its router when the router routes that color from the ramp
   and has room;
4. the PEs' instruction streams (:func:`_step_pes`): a PE goes on through
   private cycles (``BUSY``) and issues at most one fabric op per cycle (a
   ``recv``, a vector element, or an ``fmacw`` chunk popping one weight),
   from start-of-cycle ready bits; a vector element bound for the fabric is
   written to the output queue one cycle after it issues;
5. the moves, pops and pushes of 1-4 (:func:`_apply_grants` and the next
   ones), then the idle skip: when nothing moved and nothing is in flight, the
   replay jumps to the next cycle at which a PE that was not waiting for the
   fabric goes on, or reports a hang if there is none (also when an edge
   port still holds wavelets, which then can never enter the fabric, when
   wavelets are left in an input queue at the end, when nothing moved with
   wavelets held in the fabric and no PE is in private cycles, and after
   ``limit`` cycles).

The replay is compiled (numba). This module's :func:`_run` is the reference
engine, which visits every router and PE every cycle; :mod:`.replay_events`
is the default engine, which visits only who can act and takes the same
decisions (:data:`ENGINES`). Its state is grouped in named tuples of
arrays: :class:`Routes` (read-only tables, :mod:`.network`, which both engines
read packed, :func:`pack_routes`), :class:`EdgePorts`, :class:`Queues`,
:class:`Cores` and :class:`Events` (one cycle's decisions; :mod:`.replay_state`).
A run can stop (when a watched PE reaches an op row) and go on, which
:mod:`.replay_periods` uses to skip proven repeats; steps 1 and 2 count the
grants that depended on the color rotation (conflicts).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from wse.config import Port
from wse.firmware.training.timing import BUSY, END, RECV

from .network import TO_EDGE, TO_PE, TO_ROUTER, Network, Routes
from .replay_routes import _MASK, _N, _NEVER, _RAMP_IN, _TARGETS, _UP, _UP_AT, pack_routes  # noqa: F401 (the engines')
from .replay_state import (  # noqa: F401 (the replay's state, known here by the engines and tests)
    _OUT_OF_TIME, _DEADLOCK, _GRANT, _INJECT, _TX_MOVE, _POP, _ISSUE, _WRITE, _EVENT_KINDS, EdgePorts, Queues,
    Cores, Events, _record, _new_state, _T, _RUNNING, _FIFOS, _TX, _TO_INJECT, _LAST, _SEEN_PC, _CONFLICTS,
    _FINISHED, _STOPPED, _new_scalars, _edge_ports, _BROKEN, ColumnProbe, no_probe, _probe_cycle, _probe_idle,
    _probe_fail, _CHECKED)

__all__ = ["Network", "Routes", "replay", "run_replay", "pack_routes", "ENGINES", "TO_ROUTER", "TO_PE", "TO_EDGE"]

_RAMP = int(Port.RAMP)


# ---------------------------------------------------------------- decisions (start-of-cycle state)
# Speed: numba passes the named tuples to these functions for free as long as
# a function's arrays need no reference counting, which holds for a loop over
# routers, PEs or events and for the tiny per-event helpers (_record,
# _push_fifo, _ready). A small function called per PE that returns
# from several places while it holds arrays (or calls min/max) makes numba
# count references on every call and the replay several times slower: the
# PE's instruction stream is therefore one loop, _step_pes (as an inline helper
# with one return, called from the routers' pass, it still made step 4 ten times
# slower; written out in that pass it saved nothing measurable). A router's
# grants (_grant_router) and its output queue's move (_grant_tx_move) are such
# helpers at no cost. Taking the grants without branches (every color's event
# written, the count moved on by the decision) was slower than the branches.

@njit(cache=True, inline="always")
def _ready(rows, row, router_fifo, rx, router_depth, rx_depth, r, c):
    """Every target of router ``r``'s route of color ``c`` (packed row ``row``) accepts a wavelet
    (atomic multicast)."""
    for k in range(rows[row, _N]):
        kind = rows[row, _TARGETS + 2 * k]
        to = r + rows[row, _TARGETS + 2 * k + 1]
        if kind == TO_ROUTER:
            if router_fifo[to, c] >= router_depth:
                return False
        elif kind == TO_PE:
            if rx[to, c] >= rx_depth:
                return False
        elif kind == _NEVER:
            return False
    return True


# The bit index of a power of two b < 2**32 (de Bruijn): _LOW_BIT[(b * _DE_BRUIJN >> 27) & 31].
_DE_BRUIJN = 0x077CB531
_LOW_BIT = np.zeros(32, dtype=np.int64)
_LOW_BIT[((1 << np.arange(32, dtype=np.int64)) * _DE_BRUIJN >> 27) & 31] = np.arange(32)


@njit(cache=True, inline="always")
def _rotated_colors(busy, first_color, colors):
    """The bit mask ``busy`` of colors rotated so that bit ``q`` is color ``(first_color + q) mod
    colors``: its set bits, lowest first (:func:`_low_color`), are its colors in rotating priority."""
    return (busy >> first_color) | ((busy & ((1 << first_color) - 1)) << (colors - first_color))


@njit(cache=True, inline="always")
def _low_color(rotated, first_color, colors):
    """The color of the lowest set bit of a :func:`_rotated_colors` mask."""
    c = first_color + _LOW_BIT[(((rotated & -rotated) * _DE_BRUIJN) >> 27) & 31]
    return c - colors if c >= colors else c


@njit(cache=True)
def _grant_routers(routes, rows, index, queues, first_color, events, probe):
    """Steps 1 and 3 in one pass over the routers (:func:`_grant_router`,
    :func:`_grant_tx_move`): both decide from the start-of-cycle queues, which
    neither changes, and each kind's events keep router order, so the events
    are those of two passes; a router's FIFOs, route rows and output queue are
    read together. Returns the conflicts of step 1; a conflict on a router a
    ``probe`` marks ``_CHECKED`` fails its check (:class:`ColumnProbe`)."""
    router_fifo, busy_fifos, rx = queues.router_fifo, queues.busy_fifos, queues.rx
    tx_colors, tx_head, tx_count = queues.tx_colors, queues.tx_head, queues.tx_count
    router_depth, rx_depth = routes.router_depth, routes.rx_depth
    routers, colors = router_fifo.shape
    conflicts = 0
    for r in range(routers):
        if busy_fifos[r] != 0:
            held = _grant_router(rows, index, router_fifo, busy_fifos[r], rx, router_depth, rx_depth, events,
                                 r, first_color, colors)
            if held > 0:
                conflicts += held
                if probe.role.shape[0] > 0 and probe.role[r, 0] & _CHECKED:
                    _probe_fail(probe, r % probe.info[0])
        if tx_count[r] > 0:
            _grant_tx_move(rows, index, router_fifo, router_depth, tx_colors, tx_head, events, r)
    return conflicts


@njit(cache=True, inline="always")
def _grant_router(rows, index, router_fifo, busy, rx, router_depth, rx_depth, events, r, first_color, colors):
    """Step 1 for router ``r`` with the non-empty FIFOs ``busy``: its grants, colors in rotating
    priority from ``first_color`` (``rows``, ``index``: :func:`pack_routes`).

    Returns the conflicts: colors that could go but were held back by a
    color granted before them on a shared port (with none, the grants do not
    depend on the rotation)."""
    conflicts = 0
    ports_used = 0
    rotated = _rotated_colors(busy, first_color, colors)
    while rotated != 0:
        c = _low_color(rotated, first_color, colors)
        rotated &= rotated - 1
        row = index[r, c]
        mask = rows[row, _MASK]
        if mask == 0:
            continue
        if (mask & ports_used) != 0:
            if _ready(rows, row, router_fifo, rx, router_depth, rx_depth, r, c):
                conflicts += 1
            continue
        if _ready(rows, row, router_fifo, rx, router_depth, rx_depth, r, c):
            ports_used |= mask
            _record(events, _GRANT, r, c)
    return conflicts


@njit(cache=True)
def _grant_injections(routes, queues, ports, first_color, events, only):
    """Step 2: each edge port injects a wavelet of the first color (rotating from
    ``first_color``) it has left that its router routes from it and has room for
    (only the ports of the routers ``only`` marks, unless it is empty: the
    simulated region of :mod:`.replay_region`).

    Returns the conflicts: ports where more than one color could go."""
    input_port, router_fifo = routes.input_port, queues.router_fifo
    router, code, left, left_total = ports.router, ports.code, ports.left, ports.left_total
    colors = input_port.shape[1]
    conflicts = 0
    for p in range(router.shape[0]):
        if left_total[p] == 0 or (only.shape[0] > 0 and not only[router[p]]):
            continue
        r = router[p]
        chosen = False
        for q in range(colors):
            c = (first_color + q) % colors
            if left[p, c] > 0 and input_port[r, c] == code[p] and router_fifo[r, c] < routes.router_depth:
                if chosen:
                    conflicts += 1
                    break
                _record(events, _INJECT, p, c)
                chosen = True
    return conflicts


@njit(cache=True, inline="always")
def _grant_tx_move(rows, index, router_fifo, router_depth, tx_colors, tx_head, events, pe):
    """Step 3 for PE ``pe``, whose output queue is not empty: its head enters the router if the
    router routes its color from the ramp (the packed row's ``_RAMP_IN``) and has room."""
    c = tx_colors[pe, tx_head[pe]]
    if rows[index[pe, c], _RAMP_IN] != 0 and router_fifo[pe, c] < router_depth:
        _record(events, _TX_MOVE, pe, c)


@njit(cache=True)
def _step_pes(ops, cores, queues, tx_depth, events, t, pes, n):
    """Step 4: the PEs' instruction streams in cycle ``t``: every PE when ``n < 0``, else the
    PEs ``pes[:n]`` (the simulated region of :mod:`.replay_region`).

    A PE that can go on runs its private cycles (``BUSY``) and then at most
    one fabric op: a ``recv``; an ``fmacw`` chunk, which pops one weight and
    runs up to ``period`` elements, one per cycle; or one element of a vector
    instruction with fabric operands, which issues when its fabric sources
    have data and the output queue has room (counting the element issued last
    cycle, not written yet). A PE whose fabric operands are not ready waits.

    Returns (PEs that made progress on a fabric op, PEs that reached ``END``,
    the last cycle of those, -1 if none).
    """
    pc, free_at, vector_index, written_at, done, waited_at = cores
    rx, tx_count = queues.rx, queues.tx_count
    progressed = 0
    finished = 0
    last_exit = -1
    for i in range(pc.shape[0] if n < 0 else n):
        pe = i if n < 0 else pes[i]
        if done[pe] or free_at[pe] > t:
            continue
        while True:
            row = pc[pe]
            op = ops[row, 0]
            if op == END:
                done[pe] = True
                finished += 1
                if free_at[pe] - 1 > last_exit:
                    last_exit = free_at[pe] - 1
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
                    _record(events, _POP, pe, color)
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
                        _record(events, _POP, pe, source_a)
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
                            _record(events, _POP, pe, source_a)
                        if source_b >= 0:
                            _record(events, _POP, pe, source_b)
                        if dest >= 0:
                            _record(events, _ISSUE, pe, dest)
                            written_at[pe] = t + 1
                        vector_index[pe] += 1
                        free_at[pe] = t + 1
                        if vector_index[pe] == length:
                            vector_index[pe] = 0
                            pc[pe] += 1
                            free_at[pe] = t + 2   # the last element is written in the next cycle
            if waits:
                free_at[pe] = t + 1
                waited_at[pe] = t
                break
            progressed += 1
            if pc[pe] == row:   # the instruction goes on next cycle; else on to the next op
                break
    return progressed, finished, last_exit


# ---------------------------------------------------------------- applying a cycle's events

@njit(cache=True)
def _push_fifo(queues, r, c):
    """One wavelet into router ``r``'s FIFO ``c``; 1 if the FIFO was empty."""
    was_empty = queues.router_fifo[r, c] == 0
    if was_empty:
        queues.busy_fifos[r] |= 1 << c
    queues.router_fifo[r, c] += 1
    return 1 if was_empty else 0


@njit(cache=True)
def _apply_grants(rows, index, queues, events):
    """Forward the granted wavelets (their targets from the packed routes ``rows``, ``index``, in
    the cache from the grant). Returns the change in non-empty FIFOs."""
    router_fifo, busy_fifos, rx = queues.router_fifo, queues.busy_fifos, queues.rx
    who, color = events.who, events.color
    change = 0
    for g in range(events.count[_GRANT]):
        r = who[_GRANT, g]
        c = color[_GRANT, g]
        router_fifo[r, c] -= 1
        if router_fifo[r, c] == 0:
            busy_fifos[r] &= ~(1 << c)
            change -= 1
        row = index[r, c]
        for k in range(rows[row, _N]):
            kind = rows[row, _TARGETS + 2 * k]
            to = r + rows[row, _TARGETS + 2 * k + 1]
            if kind == TO_ROUTER:
                change += _push_fifo(queues, to, c)
            elif kind == TO_PE:
                rx[to, c] += 1
    return change


@njit(cache=True)
def _apply_injections(queues, ports, events):
    """Inject the granted edge wavelets. Returns the change in non-empty FIFOs."""
    router, left, left_total = ports.router, ports.left, ports.left_total
    who, color = events.who, events.color
    change = 0
    for g in range(events.count[_INJECT]):
        p = who[_INJECT, g]
        c = color[_INJECT, g]
        left[p, c] -= 1
        left_total[p] -= 1
        change += _push_fifo(queues, router[p], c)
    return change


@njit(cache=True)
def _apply_tx_moves(queues, tx_depth, events):
    """Move output-queue heads into their routers. Returns the change in non-empty FIFOs."""
    tx_colors, tx_head, tx_count = queues.tx_colors, queues.tx_head, queues.tx_count
    who = events.who
    change = 0
    for g in range(events.count[_TX_MOVE]):
        pe = who[_TX_MOVE, g]
        c = tx_colors[pe, tx_head[pe]]
        tx_head[pe] = (tx_head[pe] + 1) % tx_depth
        tx_count[pe] -= 1
        change += _push_fifo(queues, pe, c)
    return change


@njit(cache=True)
def _apply_pe_queues(queues, tx_depth, events):
    """Pop the input queues, write last cycle's fabric-bound elements to the
    output queues, and carry this cycle's issues over to the next cycle."""
    rx, tx_colors, tx_head, tx_count = queues.rx, queues.tx_colors, queues.tx_head, queues.tx_count
    count, who, color = events.count, events.who, events.color
    for g in range(count[_POP]):
        rx[who[_POP, g], color[_POP, g]] -= 1
    for g in range(count[_WRITE]):
        pe = who[_WRITE, g]
        tx_colors[pe, (tx_head[pe] + tx_count[pe]) % tx_depth] = color[_WRITE, g]
        tx_count[pe] += 1
    issued = count[_ISSUE]
    for g in range(issued):
        who[_WRITE, g] = who[_ISSUE, g]
        color[_WRITE, g] = color[_ISSUE, g]
    count[_WRITE] = issued


@njit(cache=True)
def _next_wake(cores, t, limit):
    """After an idle cycle ``t``: the first cycle at which a PE that did not wait
    for the fabric goes on (PEs waiting for the fabric wait for good now), or
    ``limit`` if there is none."""
    done, waited_at, free_at = cores.done, cores.waited_at, cores.free_at
    wake = limit
    for pe in range(done.shape[0]):
        if not done[pe] and waited_at[pe] != t and free_at[pe] < wake:
            wake = free_at[pe]
    return wake


# ---------------------------------------------------------------- the cycle loop

# _next_wake's answer when no PE goes on by itself.
_NO_WAKE = 1 << 62

# Packed routes of recent runs (pack_routes), by the identity of their target table (kept alive here).
_PACKED: dict = {}


def _run(routes, ports, ops, queues, cores, events, scalars, limit, watch, probe=None):
    """Run cycles from the state until every PE reached ``END`` and the fabric
    is empty (``_FINISHED``; ``scalars[_LAST]`` is the last cycle with an
    event), or it hangs (``_DEADLOCK``), or it reaches the start of cycle
    ``limit`` (``_OUT_OF_TIME``, a hang to a caller that gave the run all the
    time it may take; the counters are kept, so a call with a later limit goes
    on: a run stepped a cycle at a time, e.g. ``bench/column_shift.py``), or,
    with ``watch >= 0``, until the start of a cycle at which PE ``watch`` stands
    at op row ``scalars[_SEEN_PC]`` or later (``_STOPPED``; calling again goes on).
    The reference engine: every router and PE visited every cycle. A ``probe``
    (:class:`ColumnProbe`, a reduced replay's checks) is run at every cycle; the
    run stops with ``_BROKEN`` when one fails."""
    probe = _NO_PROBE if probe is None else probe
    rows, index = _packed(routes)
    return _run_packed(routes, ports, ops, queues, cores, events, scalars, limit, watch, rows, index, probe)


def _packed(routes: Routes) -> tuple[np.ndarray, np.ndarray]:
    """:func:`pack_routes` of ``routes``, kept for the next runs over the same tables (not to be written)."""
    packed = _PACKED.get(id(routes.target))
    if packed is None or packed[0] is not routes.target:
        packed = (routes.target, pack_routes(routes))
        _PACKED[id(routes.target)] = packed
        while len(_PACKED) > 8:
            _PACKED.pop(next(iter(_PACKED)))
    return packed[1]


_NO_PROBE = no_probe()


@njit(cache=True, nogil=True)
def _run_packed(routes, ports, ops, queues, cores, events, scalars, limit, watch, rows, index, probe):
    """:func:`_run` over the packed routes ``rows``, ``index`` (:func:`pack_routes`)."""
    count = events.count
    colors = routes.input_port.shape[1]
    tx_depth = routes.tx_depth
    t, running, nonempty_fifos = scalars[_T], scalars[_RUNNING], scalars[_FIFOS]
    tx_wavelets, to_inject, last = scalars[_TX], scalars[_TO_INJECT], scalars[_LAST]
    status = _FINISHED
    frozen_until = -1           # in a stretch of cycles that moved nothing, the wake found (see below)
    every_pe = np.zeros(0, dtype=np.int32)
    every_router = np.zeros(0, dtype=np.bool_)
    while running > 0 or nonempty_fifos > 0 or tx_wavelets > 0 or to_inject > 0 or count[_WRITE] > 0:
        if t >= limit:          # the counters are kept: a run may go on with a later limit
            status = _OUT_OF_TIME
            break
        if watch >= 0 and cores.pc[watch] >= scalars[_SEEN_PC]:
            status = _STOPPED
            break
        first_color = t % colors
        count[:_WRITE] = 0
        scalars[_CONFLICTS] += _grant_routers(routes, rows, index, queues, first_color, events, probe) + \
            _grant_injections(routes, queues, ports, first_color, events, every_router)
        progressed, finished, last_exit = _step_pes(ops, cores, queues, tx_depth, events, t, every_pe, -1)
        running -= finished
        if last_exit > last:
            last = last_exit
        moves = count[_GRANT] + count[_INJECT] + count[_TX_MOVE] + count[_POP] + count[_WRITE]
        issued = count[_ISSUE]
        if moves > 0 and t > last:
            last = t
        nonempty_fifos += _apply_grants(rows, index, queues, events)
        nonempty_fifos += _apply_injections(queues, ports, events)
        to_inject -= count[_INJECT]
        nonempty_fifos += _apply_tx_moves(queues, tx_depth, events)
        tx_wavelets += count[_WRITE] - count[_TX_MOVE]
        _apply_pe_queues(queues, tx_depth, events)
        checked = probe.role.shape[0] > 0
        if checked and _probe_cycle(probe, events, queues.router_fifo, routes.router_depth, t):
            status = _BROKEN
            break
        if moves == 0 and issued == 0 and progressed == 0 and nonempty_fifos == 0 and tx_wavelets == 0:
            # Nothing moved and nothing is in flight: skip to the next PE that
            # goes on by itself. An edge port that injected nothing into empty
            # FIFOs has no route for its colors, and never will: a wavelet it
            # still holds is a hang once no PE is left to wake.
            wake = _next_wake(cores, t, _NO_WAKE)
            if wake < _NO_WAKE:      # at or after limit: stopped at the loop's top, the counters kept
                if checked and _probe_idle(probe, t + 1, wake):
                    status = _BROKEN
                    break
                t = wake
                continue
            if running > 0 or to_inject > 0:
                return _DEADLOCK
        elif moves == 0 and issued == 0 and progressed == 0:
            # Nothing moved, with wavelets held in FIFOs or output queues: no color could go
            # in this cycle's rotation, so none can in any (the rotation only orders colors
            # that can go), and the state stays as it is until a PE in private cycles goes
            # on. With none, it stays so for good: the fabric is deadlocked (checked when a
            # stretch of such cycles begins and again once the wake found then has passed: the
            # PE that woke may only have waited).
            if frozen_until < t:
                frozen_until = _next_wake(cores, t, _NO_WAKE)
                if frozen_until == _NO_WAKE:
                    return _DEADLOCK
        else:
            frozen_until = -1
        t += 1
    scalars[_T], scalars[_RUNNING], scalars[_FIFOS] = t, running, nonempty_fifos
    scalars[_TX], scalars[_TO_INJECT], scalars[_LAST] = tx_wavelets, to_inject, last
    if status == _FINISHED and queues.rx.sum() > 0:
        return _DEADLOCK          # wavelets left in input queues that no PE takes: the golden model hangs
    return status


#: The engines of :func:`replay`: ``"events"`` (:mod:`.replay_events`, visits only who can act),
#: ``"reference"`` (:func:`_run`, visits every router and PE every cycle) and ``"adaptive"``
#: (:mod:`.replay_adaptive`: each stretch between two stops on the one that is faster there); the same cycles.
ENGINES = ("adaptive", "events", "reference")
#: The engine :func:`replay` uses when none is named (tests set it to check whole compilers against the reference).
DEFAULT_ENGINE = "adaptive"
#: Whether :func:`run_replay` with periods tries the reduced replay of the first columns by default
#: (:mod:`.replay_columns`; the same counts; ``bench/compile_speed.py --columns`` compares both).
COLUMNS = True


def replay(network: Network, ops: np.ndarray, starts: np.ndarray, ends: np.ndarray, inject: dict,
           limit: int = 1 << 40, periods: bool = True, engine: str | None = None) -> int:
    """Cycles of one run: PE ``p`` executes ``ops[starts[p]:ends[p]]``, the
    edge ports inject ``inject[(edge, index)][color]`` wavelets.

    Each PE's ops end with ``END`` (as :func:`wse.firmware.training.timing.pe_ops`
    writes them), which ends its run. With ``periods`` (the default) the replay
    skips repeats of a proven period of the whole fabric's state
    (:mod:`.replay_periods`); the count is the same as without. ``engine``
    (:data:`ENGINES`, :data:`DEFAULT_ENGINE` if None) picks the cycle loop:
    by default each stretch between the period search's stops on the engine
    that is faster there (the fast one for a run without periods), the
    reference to check it against; the count is the same.

    Raises
    ------
    RuntimeError
        If the replay hangs (a schedule the golden model would report as a
        hang: a wait that never ends, wavelets that can never enter the fabric
        or that stay in an input queue, wavelets held in the fabric that can
        never move again, or more than ``limit`` cycles).
    """
    return run_replay(network, ops, starts, ends, inject, limit, periods, engine)[0]


def run_replay(network: Network, ops: np.ndarray, starts: np.ndarray, ends: np.ndarray, inject: dict,
               limit: int = 1 << 40, periods: bool = True, engine: str | None = None,
               columns: bool | None = None) -> tuple[int, np.ndarray]:
    """:func:`replay`'s cycles and every PE's last cycle (the cycle before its
    ``free_at`` when it reached ``END``); the same arguments and errors. With
    ``periods`` and ``columns`` (:data:`COLUMNS` if None) a phase whose columns
    are time-shifted copies is replayed on its first columns
    (:mod:`.replay_columns`; the same counts and last cycles), the full mesh
    wherever a check of that rule fails (going on from the cycle it began at)."""
    from .replay_adaptive import AdaptiveRun
    from .replay_columns import reduced_replay
    from .replay_events import run_events
    from . import replay_region
    from .replay_periods import run_with_periods
    from .replay_region import RegionSearch

    engine = DEFAULT_ENGINE if engine is None else engine
    if engine not in ENGINES:
        raise ValueError(f"replay engine {engine!r}: expected one of {', '.join(ENGINES)}")
    run = _run if engine == "reference" else run_events(network)
    if engine == "adaptive" and periods:         # a run without periods is one stretch: the fast engine
        run = AdaptiveRun([run, _run])
    routes = network.routes()
    ports = _edge_ports(network, inject)
    starts = starts.astype(np.int64)
    ops = np.ascontiguousarray(ops, dtype=np.int32)     # half the bytes of int64: the PEs read them every cycle
    reduced = None
    if periods and (COLUMNS if columns is None else columns) and starts.shape[0] > 0:
        reduced = reduced_replay(network, ops, starts, ends, inject, limit, run=run)
    if reduced is not None:         # the reduced replay's count, or the full replay's from where it began
        result, exits = reduced
        if result < 0:
            raise RuntimeError("the cycle model's replay hung: the schedule would not finish on the fabric")
        return result, exits
    queues, cores, events = _new_state(routes, ports, starts)
    if periods and starts.shape[0] > 0:
        watch = int(np.argmax(np.asarray(ends) - starts))     # the PE with the longest op list
        result = run_with_periods(routes, ports, ops, queues, cores, events, limit, watch, int(ends[watch]), run,
                                  region=RegionSearch(routes, ports, ops) if replay_region.REGION else None)
    else:
        scalars = _new_scalars(starts, ports, -1)
        result = run(routes, ports, ops, queues, cores, events, scalars, limit, -1)
        if result == _FINISHED:
            result = scalars[_LAST] + 1
    if result < 0:
        raise RuntimeError("the cycle model's replay hung: the schedule would not finish on the fabric")
    return int(result), cores.free_at - 1
