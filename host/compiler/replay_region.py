"""The region replay: a fabric that repeats with a period but for a small region
costs the replay of that region.

The streamed GEMMs fill their pipeline with a disturbance that crosses the mesh
on one row while every other PE already repeats with a period ``D``
(``bench/region_shift.py``, ``docs/weight_streaming.md`` section 9): the
period search (:mod:`.replay_periods`) cannot skip it, since the whole state
never repeats, and the full replay of those cycles grows as ``n^4``. This
module replays one period of the whole fabric and keeps it (the *record*:
every cell's relative state at each of its ``D + 1`` cycles, what each
router granted, each cell moved and each edge port injected in each of its
``D`` cycles), then steps only the cells whose state or whose next cycle
may differ from the record's, with a margin, taking everyone else's state
from the record; and as it steps a period, it writes the stepped cells'
true states and moves over their entries, so that at the period's end the
record is the period just stepped, true for every cell, and serves the next
one (a disturbance that has moved on leaves no trace in it).

**Rule.** Write ``R(t)`` for the record's state at phase ``k = t - t0`` of
the current period ``t0 .. t0 + D``, each PE's op row moved on by its shift
over the recorded period (``base``). A cell's state at ``t + 1`` is a
function of its own state at ``t``, the queue counts of its neighbours (the
targets of its routes: room for its grants), the grants of its neighbours
into it (each a function of that neighbour's state and its targets'
counts), the op rows it reads, the rotation ``t mod colors`` and its edge
ports' colors left. So a cell whose state and whose neighbours' states at
``t`` equal ``R(t)`` takes the record's decisions in cycle ``t`` (and has
the state ``R(t + 1)`` at ``t + 1`` if its neighbours' grants into it are
the record's too), provided its own cycle is the record's: its op rows from its
``pc`` repeat the recorded ones (checked per cell at each period's start:
``forced``), its grants do not depend on the rotation (no conflict at its
router in the recorded cycle, or ``D`` a multiple of ``colors``), its edge
ports hold wavelets of the colors they held in the record, and at the
period's last phase its recorded period is *closed* (its state at ``t0 +
D`` is its state at ``t0`` with the shift; a cell whose period does not
close is stepped from the next period's start, given its true state, the
record's last row). A cell that breaks one of these is *deviant* at ``t``,
and so is a stepped cell whose state differs from ``R(t)``. The stepped
set ``A`` is recomputed each cycle as the cells within one hop
(:data:`MARGIN`) of the deviant ones (a cell joining it is given ``R(t)``,
its true state; a cell leaving it is not deviant, so its state is
``R(t)``). A cell outside ``A`` has no deviant neighbour, so its own cycle
is the record's: its grants, its PE's ops and its edge ports' injections.
The cells one hop outside ``A`` show it the recorded queue counts and send
it the recorded grants, the background's edge ports inject what they
injected in the record, and ``A`` steps with the replay's own functions.
What a cell outside ``A`` receives from ``A`` can still differ from the
record: a cell of ``A`` next to a deviant one may find room (or none) there
that the record did not, and a color that then takes its ramp port (or
leaves it free) changes its grant of another color that shares the port
into a cell outside ``A``. That cell's state at ``t + 1`` is then ``R(t +
1)`` with a wavelet more or less of each such color in its queues; it is
given that state and joins ``A`` (a *spill*, from each stepped cell's
grants against its recorded ones). So by induction over ``t`` every cell
outside ``A`` has the state ``R(t)``. (With two hops, the rule before, every
cell a deviant one can reach in a cycle is stepped and nothing spills; the
weight-streaming layouts route no color to two routers, and none of their
phases measured spilled: ``tests/test_replay_region.py`` builds a network
where spills happen.) At the period's end every cell's entries hold its true
states over the period (rewritten where it was stepped, the record's,
which were true, where it was not): a true trajectory of the whole fabric
over one period, which is all the rule asks of a record. The counters
follow: the background's moves (the last cycle with a move) and conflicts
are the record's minus those of the cells in ``A``. The region replay
ends, and the whole state is set from ``R(t)`` and ``A``'s, when ``A``
grows past :data:`MAX_SHARE` of the cells or when the background would not
move in a cycle (its edge ports' injections are not counted as its moves,
so a cycle in which it only injects ends it too: the engine's idle skip and
hang checks then decide), or at a period's end with no cell in ``A``
(:data:`SETTLE`: the whole state is then the record's, a period of the
whole fabric that the period search skips at a fraction of a stepped
cycle's cost); the replay goes on from there with the period search. The
reduced replay of the first columns (:mod:`.replay_columns`) does not offer
its stops to the region replay.

``tests/test_replay_region.py`` compares the state at the end of region
replays with the plain reference replay's at the same cycle, and the counts
and every PE's last cycle with the replay without regions.
"""

from __future__ import annotations

import time

import numpy as np

from .replay import _FIFOS, _NO_PROBE, _OUT_OF_TIME, _RUNNING, _STOPPED, _T, _TO_INJECT, _TX, _WRITE, _packed
from .replay_periods import queue_counts
from .replay_region_steps import (_REBASE, _RX_UNIT, _STILL, _TOO_BIG, MAX_DEPTH, Record, _cell_hashes, _materialize,
                                  _neighbour_table, _period_end, _record, _region, new_record, record_bytes)
from .replay_state import new_events

__all__ = ["RegionSearch", "REGION"]

#: Whether :func:`.replay_periods.run_with_periods` tries the region replay (the same counts either way).
REGION = True
#: The region replay ends when the stepped cells exceed this share of the mesh (a stepped PE costs about
#: four times a PE of the reference engine's cycle; 0.08 before: the round boundaries below reach 14%).
MAX_SHARE = 0.16
#: A stop proposes a period ``D`` when at most this share of the cells differ from a stop ``D`` cycles earlier.
PROPOSE_SHARE = 0.03
#: A period is proposed only after this many stops in a row at which the period search skipped nothing.
QUIET_STOPS = 4
#: The shortest period proposed. Shorter repeats are the period search's, but a round boundary that
#: crosses the column ring on the wafer's rows (the last layer's ``bwd-data``, 42-cycle steps, a band of
#: about 25 rows off the period for thousands of cycles) is a region of a 42-cycle background (measured
#: on 16x994: 24 against 36 CPU s for that phase with :data:`SETTLE` and in every round; 64x994: 116
#: against 150).
MIN_PERIOD = 32
#: Periods are proposed only while the watched PE is in its first round (True), or in any round
#: (False: the round boundaries above are in later rounds; the cost rule of :class:`RegionSearch` stops
#: the tries where they do not pay, as in the streamed GEMMs' later rounds).
FIRST_ROUND_ONLY = False
#: No try is made where the watched PE stands in its round once this many tries in a row there did
#: not pay: the wafer's streamed GEMM lost about 16 CPU s at each of its round boundaries (a record
#: of its 106-cycle period and a region that outgrew the cap), round after round, while the fill's
#: try, which paid, kept the tries' average below the plain replay's.
POINT_LOSSES = 2
#: Where the watched PE stands is told as which of this many equal parts of its round it is in (the
#: tries at the streamed GEMM's boundaries on 256x994 began at op rows 4,302 and 4,293 of rounds a
#: few stops apart).
POINTS = 16
#: The fewest PEs a mesh must have for a try: a smaller mesh's replay costs less than a record
#: (FC-MNIST's cycle model on 16x16 took 1.8 CPU s with tries, 0.43 without; the 1024-wide MLP's on
#: 32x32 1.17 against 1.06, the 2048-wide one's on 64x64 the same; the 4096-wide one's on 128x128
#: 35.2 against 37.3, one thread).
MIN_CELLS = 8192
#: End the region replay at a period's end where no PE is stepped (the whole state is then the record's,
#: and the period search skips what repeats).
SETTLE = True
#: The hops around the deviant cells that the region replay steps (module docstring): 1, the cells
#: further out into which a stepped cell grants other colors than the record's joining at the next
#: cycle (:func:`.replay_region_steps._spill`); 2 steps every cell whose state a deviant one can reach
#: in a cycle (the rule before; tests compare both).
MARGIN = 1
#: The cycles a record takes phase first before they are copied into it (:func:`.replay_region_steps._record`).
STAGE = 8
#: The most bytes a record may take: the wafer's streamed GEMM (750x994, a 106-cycle period whose fill a
#: disturbance of about 1,800 PEs crosses for 16,000 cycles) needs 3.1 GB at 39 bytes a PE and cycle.
RECORD_BYTES = 3 << 30


def _settle(queues, cores, events, ports, scalars, rec: Record, base, in_a, t0: int) -> None:
    """Set every cell outside ``in_a`` to the record's state at the start of cycle ``scalars[_T]``
    (phase ``scalars[_T] - t0``), the pending writes and the counters with them: the whole state
    the replay goes on from."""
    t = int(scalars[_T])
    k = t - t0
    bg = ~in_a
    queued = rec.queued[:, k][bg]
    queues.router_fifo[bg] = queued % _RX_UNIT
    queues.rx[bg] = queued // _RX_UNIT
    colors = queues.router_fifo.shape[1]
    queues.busy_fifos[:] = ((queues.router_fifo > 0).astype(np.int64) << np.arange(colors)).sum(axis=1)
    tx = rec.tx[:, k][bg]
    queues.tx_colors[bg] = np.maximum(tx, 0)
    queues.tx_head[bg] = 0
    queues.tx_count[bg] = (tx >= 0).sum(axis=1)
    flags = rec.flags[:, k]
    live = bg & (flags != 2)
    cores.done[bg] = flags[bg] == 2
    cores.pc[bg] = rec.pc[:, k][bg] + base[bg]
    cores.free_at[live] = t + rec.free[:, k][live]
    cores.vector_index[live] = rec.index[:, k][live]
    cores.written_at[live] = np.where(flags[live] == 1, t, -1)
    n = int(events.count[_WRITE])
    who, color = events.who[_WRITE, :n].copy(), events.color[_WRITE, :n].copy()
    keep = in_a[who]
    extra = np.flatnonzero(bg & (rec.write[:, k] >= 0))
    who = np.concatenate([who[keep], extra]).astype(events.who.dtype)
    color = np.concatenate([color[keep], rec.write[:, k][extra]]).astype(events.color.dtype)
    events.count[_WRITE] = who.shape[0]
    events.who[_WRITE, :who.shape[0]] = who
    events.color[_WRITE, :who.shape[0]] = color
    scalars[_RUNNING] = int((~cores.done).sum())
    scalars[_FIFOS] = int((queues.router_fifo > 0).sum())
    scalars[_TX] = int(queues.tx_count.astype(np.int64).sum())
    scalars[_TO_INJECT] = int(ports.left.sum())


def neighbours(routes) -> tuple[np.ndarray, np.ndarray]:
    """The routers each router sends to or takes from on some color (a router's PE taken with it), as
    ``(indptr, indices)`` (compiled: numpy's sort of every route's pair took 5.5 s on the wafer)."""
    return _neighbour_table(routes.n_targets, routes.target_kind, routes.target)


class RegionSearch:
    """The region replay at the period search's stops (:func:`.replay_periods.run_with_periods`).

    At each stop that skipped nothing (after :data:`QUIET_STOPS` of them in a
    row: where the period search skips or jumps, it does the work) it compares every cell's relative state
    (a 64-bit hash per cell) with the last stops'; where at most
    :data:`PROPOSE_SHARE` of the cells differ from a stop ``D`` cycles earlier,
    and at most as many of that stop's from one ``D`` cycles before it,
    it records the next ``D`` cycles of the whole fabric (the reference engine,
    a cycle at a time: the replay goes on meanwhile) and runs the region replay
    from there (module docstring). Whether to try is a choice of cost only
    (every count is the same): a try pays if it moved the clock on at fewer
    CPU seconds a cycle (its record included) than the replay did between
    the stops without it (skipped periods and jumps included: where the period
    search skips, a region replay that steps every cycle does not pay). A
    try that did not pay makes the next proposals wait 1, 4, 16, ... times;
    after three that did not pay, none is tried while the tries so far cost
    more a cycle than the replay without them; and none is tried again where
    the watched PE stands in its round (``where``) once :data:`POINT_LOSSES`
    tries in a row there did not pay (a round's boundary comes back every
    round, and a try that paid elsewhere, a fill's, does not make it pay).
    ``tried`` lists every try as ``(cycle, where, paid)``. ``runs`` lists each region
    replay as ``(first cycle, cycle it ended at, why)`` (why: ``"region"``, the
    stepped PEs grew too many; ``"still"``, the background stood still;
    ``"limit"``; ``"open"``, the record's period did not close for too many
    PEs and no region ran; ``"settled"``, no PE was stepped at a period's end, :data:`SETTLE`); ``rates``
    holds the CPU seconds and cycles of the tries and of the replay between stops (two stops with
    no skip or jump of the period search between them, :meth:`landed`)."""

    def __init__(self, routes, ports, ops, keep: int = 24):
        self.routes, self.ports, self.ops, self.keep = routes, ports, ops, keep
        self._nbr = None                # neighbours(routes), at the first try
        self.signatures: list = []
        self.wait, self.backoff, self.failed, self.quiet = 0, 1, 0, 0
        self.rates = np.zeros(4)        # CPU seconds and cycles: of the tries, of the replay between the stops
        self._since = None
        self.runs: list = []
        # Cycles the region replay stepped, cells it stepped, deviant cells, trace rows, cells spilled into.
        self.stats = np.zeros(5, np.int64)
        self.trace = np.zeros((0, 3), np.int64)     # room for (cycle, stepped, deviant) rows: see _region
        self.lost: dict = {}            # tries in a row that did not pay, by where the watched PE stood
        self.tried: list = []           # (cycle, where, paid) of every try

    @staticmethod
    def _signature(now: dict) -> np.ndarray:
        rel = now["rel"]
        fifo, rx = queue_counts(rel)
        return _cell_hashes(fifo, rx, rel["tx"], rel["done"], rel["free"].astype(np.int32),
                            rel["index"].astype(np.int32), rel["written"], rel["writes"])

    def stop(self, now: dict, queues, cores, events, scalars, limit: int, first_round: bool = True, where=None):
        """Try the region replay at this stop (``first_round``: the watched PE is in its first
        round; ``where``: which of :data:`POINTS` parts of its round it is in, the point a try is
        judged at, None for none): None if nothing ran (the state is as it was), else the replay's
        status from the state it left (:data:`.replay._STOPPED`: going on from a later cycle;
        :data:`.replay._FINISHED` or a hang: the run ended while the period was recorded)."""
        cells, colors = queues.router_fifo.shape
        if (FIRST_ROUND_ONLY and not first_round) or cells < MIN_CELLS or \
                max(self.routes.router_depth, self.routes.rx_depth) > MAX_DEPTH:
            return None
        t, sig = int(now["t"]), self._signature(now)
        if self._since is not None:
            self.rates[2:] += (time.thread_time() - self._since[0], t - self._since[1])
        result = self._offer(t, sig, cells, colors, queues, cores, events, scalars, limit, where)
        self._since = (time.thread_time(), int(scalars[_T]))
        return result

    def landed(self) -> None:
        """The period search skipped or jumped: the replay's rate between stops counts plain replay only."""
        self.quiet, self._since = 0, None

    def _offer(self, t, sig, cells, colors, queues, cores, events, scalars, limit, where):
        budget = RECORD_BYTES // max(1, record_bytes(1, cells, colors, self.routes.tx_depth) // 2)
        kept = dict(self.signatures)
        period = None
        for earlier, old in reversed(self.signatures):     # a period seen twice: t - 2D, t - D and t alike
            d = t - earlier
            if MIN_PERIOD <= d <= budget and earlier - d in kept and \
                    np.count_nonzero(sig != old) <= PROPOSE_SHARE * cells and \
                    np.count_nonzero(old != kept[earlier - d]) <= PROPOSE_SHARE * cells:
                period = d
                break
        self.signatures = (self.signatures + [(t, sig)])[-self.keep:]
        self.quiet += 1
        if period is None or self.quiet < QUIET_STOPS:
            return None
        tries, tried, normal, replayed = self.rates
        if self.wait > 0 or (self.failed >= 3 and tries * replayed >= normal * tried):
            self.wait = max(0, self.wait - 1)
            return None
        if where is not None and self.lost.get(where, 0) >= POINT_LOSSES:
            return None
        spent = time.thread_time()
        status = self._attempt(period, queues, cores, events, scalars, limit)
        if status is None:          # too close to the limit: nothing was tried
            return None
        spent, moved = time.thread_time() - spent, int(scalars[_T]) - t
        self.rates[:2] += (spent, moved)
        paid = bool(spent * replayed < normal * moved)
        self.tried.append((t, where, paid))
        if where is not None:
            self.lost[where] = 0 if paid else self.lost.get(where, 0) + 1
        if paid:
            self.backoff = 1
        else:
            self.failed += 1
            self.wait, self.backoff = self.backoff, 4 * self.backoff
        return status

    def _attempt(self, period: int, queues, cores, events, scalars, limit: int):
        routes, ports, ops = self.routes, self.ports, self.ops
        cells, colors = queues.router_fifo.shape
        t0 = int(scalars[_T])
        if t0 + 2 * period >= limit:
            return None
        if self._nbr is None:
            self._nbr = neighbours(routes)
        rec = new_record(period, cells, colors, routes.tx_depth, ports.left.shape[0])
        rows, index = _packed(routes)
        scratch = new_events(colors)
        # Kept up to date as the record is taken and rewritten (_capture_moves): the moving cells and
        # the conflicts of each phase, and the cells with conflicts at each phase (a list per phase; a
        # phase with more than it holds stops the try).
        act_total, conf_total = np.zeros(period, np.int64), np.zeros(period, np.int64)
        conf_count, conf_cells = np.zeros(period, np.int64), np.zeros((period, max(64, cells // 16)), np.int32)
        stage = new_record(min(STAGE, period), cells, colors, routes.tx_depth, ports.left.shape[0], phase_first=True)
        status = _record(routes, rows, index, _NO_PROBE, ports, ops, queues, cores, events, scalars, period, rec,
                         stage, scratch, act_total, conf_total, conf_count, conf_cells)
        if status != _OUT_OF_TIME:        # the run ended, or no period to keep: the run goes on from here
            return status
        began = t0 + period
        base = np.zeros(cells, np.int64)
        # Kept by _period_end from one period's end to the next: per cell its shift, where it stands and
        # whether its period closes, the cells whose entries the region replay rewrote, the op rows
        # proven to repeat; and the cells whose op rows do not repeat the period's.
        ends, touched, proven = np.zeros((cells, 3), np.int64), np.zeros(cells, np.bool_), np.zeros((cells, 3), np.int64)
        forced = np.empty(cells, np.int32)
        in_a = None
        while True:         # rec holds the period from t0; it becomes the record of the next one
            n = _period_end(ops, rec, period, base, ends, touched, in_a is None, forced, proven)
            shift, closed = ends[:, 0], ends[:, 2] == 1
            if in_a is None:
                in_a = ~closed
                if in_a.sum() > MAX_SHARE * cells:      # too many PEs whose recorded period does not close
                    self.runs.append((began, began, "open"))
                    return _STOPPED
            wrap = np.flatnonzero(~closed & ~in_a).astype(np.int32)
            if wrap.shape[0]:       # a background cell whose period does not close is stepped from here
                _materialize(queues, cores, events, int(scalars[_T]), period, rec, base, wrap, wrap.shape[0], in_a)
            base += shift
            t0 += period
            status = _region(routes, rows, index, ports, ops, queues, cores, events, scalars, limit, t0, period,
                             rec, base, forced[:n], np.flatnonzero(~closed).astype(np.int32),
                             conf_count, conf_cells, act_total, conf_total, *self._nbr, in_a,
                             int(MAX_SHARE * cells), self.stats, self.trace, touched, MARGIN)
            if status != _REBASE or (SETTLE and not in_a.any()):
                break
        _settle(queues, cores, events, ports, scalars, rec, base, in_a, t0)
        self.runs.append((began, int(scalars[_T]),
                          {_TOO_BIG: "region", _STILL: "still", _REBASE: "settled"}.get(status, "limit")))
        return _STOPPED
