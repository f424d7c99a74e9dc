"""The reduced replay: a phase whose columns run as time-shifted copies of each
other (the weight gradients) replayed on its first columns only, every check
of the rule made as it runs, and the full replay wherever one fails.

**Preconditions** (checked on the whole mesh before anything runs,
:func:`column_shape`): no edge port injects; for the colors some PE sends (no
wavelet of another color exists) no route takes a wavelet from the east (no
wavelet goes west) and every route's neighbour accepts what it is sent;
from a column ``a >= 1`` on, the op lists of columns ``j`` and ``j + P`` are
equal on every row and so are their route entries (input port, output ports),
so the routes are the same translated by ``P`` columns (the last column's
east leads off the mesh). ``K = a + 2P`` columns, at most half the mesh.

**Rule.** Write ``S_j(t)`` for column ``j``'s relative state at the start of
cycle ``t`` (per PE: its op row within its list, cycles until free, element
index, an element entering its output queue, done, pending writes; per
router: FIFO and input-queue counts, output queue from its head). A column's
cycle is a function of ``S_j(t)``, of the wavelets column ``j - 1`` sends it,
of whether column ``j + 1``'s FIFOs it sends to have room, and of the color
rotation ``t mod colors``. If those FIFOs are never full and no grant
depends on the rotation (a router with no conflict grants every ready color
whatever the order, and that is a fact of its state alone), the cycle is a
function of the state and the input stream. So if at a cycle ``T``

1. ``S_j(T) = S_{j-P}(T - Delta)`` for every column ``j >= a + P`` (checked
   exactly on the full replay, run up to ``T``),
2. in ``[T - Delta, T)`` no grant depended on the rotation and no FIFO fed
   from the west in a column ``>= a`` was full (checked on the full replay),
3. from ``T`` on, column ``a + P - 1`` sends east at every cycle ``t`` what
   column ``a - 1`` sent at ``t - Delta``, no FIFO fed from the west in
   columns ``a .. K - 1`` is full at the start of a cycle, and no grant in
   columns ``a .. K - 1`` depends on the rotation (all checked on the reduced
   replay, the first to the end: the delay line must be empty when it
   finishes, every send of column ``a - 1`` echoed; columns ``0 .. a - 1`` are
   replayed at the full replay's own cycles, so their grants may depend on the
   rotation: nothing copies them),

then by induction over ``t`` (all columns at once) the reduced replay of
columns ``0 .. K - 1`` from the full replay's state at ``T``, column
``K - 1``'s east made an edge, is the full replay on those columns (column
``K``'s FIFOs fed from column ``K - 1`` are column ``K - P``'s ``Delta``
cycles earlier, never full, as an edge is never full), and every column
``j >= a + P`` is column ``j - P`` ``Delta`` cycles later: its inputs are
column ``j - 1``'s sends, equal to column ``j - 1 - P``'s ``Delta`` earlier by
the same induction, down to column ``a + P``, whose input is the checked
stream. So column ``c + mP``'s last grant is column ``c``'s (at or after ``T``,
checked) plus ``m * Delta``, and a PE not done at ``T`` there ends ``Delta``
after the PE ``P`` columns west; a PE done before ``T`` keeps its own last
cycle, and the count is the largest of all these.

**Checks at every cycle, across skips.** The reduced replay runs the
reference engine with a :class:`~.replay_state.ColumnProbe`: a delay line of
column ``a - 1``'s sends over the last ``Delta`` cycles, compared with column
``a + P - 1``'s sends at every cycle, and the FIFOs fed from the west checked
after every push. The delay line is part of the state the period search
compares (:mod:`.replay_periods`, ``extra``), so a skipped period or a jumped
transition repeats cycles whose checks passed (the same state and delay line
give the same sends and the same comparisons), and its conflict counter
covers the skipped cycles as it does in the full replay. A rotation-dependent
grant fails the check on the router where it happens (``_CHECKED`` routers,
:func:`.replay._grant_routers`).

**Tries from further east.** Conditions 1 and 2 at ``T`` hold for every
``a' >= a`` too, so a try whose check failed at column ``c`` (the copy
column for a send, else the column of the full FIFO or of the
rotation-dependent grant) is made again from the same ``T`` with ``a' =
max(2a, c + 1)``, while the mesh is at least ``_RETRY_RATIO`` times wider
than ``a' + 2P``: a transient of the west columns that the east ones do not
share (on 64x994 the weight gradients' grants at the wrap row depend on the
rotation in columns 1 to 5 only, for a while) is then replayed exactly
instead of copied. Where no ``T`` shows the shift, or every try fails, the
full replay goes on from the state it had reached at ``T`` (kept apart from
the reduced ones'), with the period search: the count is the full replay's.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from wse.config import Port
from wse.firmware.training.timing import VEC

from .network import TO_EDGE, TO_ROUTER, Network
from .replay import (_CONFLICTS, _FINISHED, _FIFOS, _GRANT, _LAST, _OUT_OF_TIME, _RUNNING, _T, _TO_INJECT, _TX,
                     _WRITE, _NEVER, _edge_ports, _new_scalars, _new_state, _packed, _run)
from .replay_state import _CHECKED, _COPY, _SOURCE, _WEST_FED, ColumnProbe, Cores, Queues

__all__ = ["reduced_replay", "column_shape", "WINDOW", "MIN_RATIO"]

#: The most cycles ``Delta`` a column may lag the one ``P`` west of it (the full replay's window before ``T``).
WINDOW = 32
#: Bytes of the full replay's states kept in that window (a huge mesh looks for a smaller ``Delta``).
_WINDOW_BYTES = 1 << 30
#: The mesh must be at least this many times wider than the reduced one (``K`` columns) for the reduced replay.
MIN_RATIO = 2
#: ... and this many times wider for a try from further east after a failed check (the first try and the
#: later ones together cost at most about one full replay up to their failures).
_RETRY_RATIO = 4
#: The cycles ``T`` tried for the start of the shift (the full replay runs up to the first that passes).
_STARTS = tuple(256 << k for k in range(8))
_EAST = 1 << int(Port.E)


def _list_ids(ops, starts, ends) -> np.ndarray:
    """An id per PE, equal where the op lists are equal (by content)."""
    by_range, by_rows = {}, {}
    ids = np.zeros(starts.shape[0], dtype=np.int64)
    for p, (s, e) in enumerate(zip(starts.tolist(), ends.tolist())):
        if (s, e) not in by_range:
            by_range[s, e] = by_rows.setdefault(ops[s:e].tobytes(), len(by_rows))
        ids[p] = by_range[s, e]
    return ids


def column_shape(network: Network, ops, starts, ends, inject: dict) -> tuple[int, int] | None:
    """``(a, P)`` of the preconditions (module docstring) with the fewest columns ``a + 2P``, or None.
    Only the colors some PE sends are compared (no wavelet of another color exists)."""
    cfg = network.config
    W, H = cfg.width, cfg.height
    if inject or W < 4:
        return None
    ops = np.asarray(ops)
    live = np.unique(ops[(ops[:, 0] == VEC) & (ops[:, 4] >= 0), 4])       # no other wavelets exist
    rows, index = _packed(network.routes())
    table = rows[index[:, live]]
    used = np.arange(table.shape[2] // 2 - 2)[None, None, :] < table[:, :, :1]
    if (network.input_port[:, live] == int(Port.E)).any() or (used & (table[:, :, 4::2] == _NEVER)).any():
        return None
    ids = _list_ids(ops, np.asarray(starts), np.asarray(ends)).reshape(H, W)
    entry = np.concatenate([network.input_port[:, live], network.output_mask[:, live]], axis=1)
    entry = entry.reshape(H, W, 2 * live.shape[0])
    best = None
    for period in range(1, W // (2 * MIN_RATIO) + 1):
        same = (ids[:, :-period] == ids[:, period:]).all(axis=0) & \
            (entry[:, :-period] == entry[:, period:]).all(axis=(0, 2))          # column j against j + P
        bad = np.flatnonzero(~same)
        a = max(1, int(bad[-1]) + 1 if bad.size else 1)
        if MIN_RATIO * (a + 2 * period) <= W and (best is None or a + 2 * period < sum(best) + best[1]):
            best = (a, period)
    return best


def _columns(network: Network, K: int) -> Network:
    """The network of the first ``K`` columns; routes leading east of column ``K - 1`` lead off the mesh."""
    cfg = network.config
    W, H = cfg.width, cfg.height
    net = object.__new__(Network)
    net.config = dataclasses.replace(cfg, width=K)
    cut = lambda a: a.reshape(H, W, *a.shape[1:])[:, :K].reshape(H * K, *a.shape[1:]).copy()  # noqa: E731 (a copy)
    net.input_port, net.output_mask, net.n_targets = cut(network.input_port), cut(network.output_mask), \
        cut(network.n_targets)
    kind, target, net.target_port = cut(network.target_kind), cut(network.target), cut(network.target_port)
    x, y = target % W, target // W
    east = (kind == TO_ROUTER) & (x >= K)
    kind[east] = TO_EDGE
    target = np.where(east, 0, y * K + np.minimum(x, K - 1))
    net.target_kind, net.target = kind, target
    return net


def _features(queues, cores, writes, starts, t: int) -> np.ndarray:
    """Every PE's relative state at the start of cycle ``t``, ``int32 [PEs, F]`` (module docstring;
    ``writes``: the PEs and colors of the pending writes)."""
    pes, colors = queues.rx.shape
    depth = queues.tx_colors.shape[1]
    k = np.arange(depth)
    slots = (queues.tx_head[:, None] + k[None, :]) % depth
    tx = np.where(k[None, :] < queues.tx_count[:, None], np.take_along_axis(queues.tx_colors, slots, 1), -1)
    pending = np.zeros((pes, colors), dtype=np.int64)
    np.add.at(pending, writes, 1)
    live = ~cores.done
    core = np.stack([cores.pc - starts, np.where(live, np.maximum(cores.free_at - t, 0), 0),
                     np.where(live, cores.vector_index, 0), live & (cores.written_at == t), cores.done], axis=1)
    return np.concatenate([core, queues.router_fifo, queues.rx, tx, pending], axis=1).astype(np.int32)


class _Window:
    """The full replay stepped a cycle at a time before a candidate ``T``: each visited
    cycle's features, conflict count, west-fed FIFOs full or not, and every column's
    sends east (a cycle the idle skip passed sends nothing)."""

    def __init__(self, network, a: int, length: int, starts):
        cfg = network.config
        W, H = cfg.width, cfg.height
        self.W, self.length, self.starts = W, length, starts
        column = np.arange(W * H) % W
        self.west_fed = (network.input_port == int(Port.W)) & (column >= a)[:, None]
        self.east = (network.output_mask & _EAST) != 0
        self.bits = np.int32 if cfg.colors < 32 else np.int64
        self.cycles: dict[int, tuple] = {}

    def record(self, t, queues, cores, events, scalars, depth) -> None:
        """Keep the state at the start of cycle ``t`` (its features are computed when compared)."""
        full = bool((queues.router_fifo[self.west_fed] >= depth).any())
        n = int(events.count[_WRITE])
        state = (Queues(*[a.copy() for a in queues]), Cores(*[a.copy() for a in cores]),
                 (events.who[_WRITE, :n].copy(), events.color[_WRITE, :n].copy()))
        self.cycles[t] = [state, int(scalars[_CONFLICTS]), full]

    def features(self, t: int) -> np.ndarray:
        """The features (:func:`_features`) of the state kept at ``t``, computed once."""
        entry = self.cycles[t]
        if not isinstance(entry[0], np.ndarray):
            entry[0] = _features(*entry[0], self.starts, t)
        return entry[0]

    def sends(self, t, events) -> np.ndarray:
        """Every column's sends east in cycle ``t`` (just run), colors as bits, ``[rows, columns]`` (a
        later try with another ``a`` takes its column ``a - 1`` from them)."""
        n = int(events.count[_GRANT])
        who, color = events.who[_GRANT, :n], events.color[_GRANT, :n]
        east = self.east[who, color]
        out = np.zeros(self.east.shape[0], dtype=self.bits)
        np.bitwise_or.at(out, who[east], np.left_shift(self.bits(1), color[east].astype(self.bits)))  # not int8
        return out.reshape(-1, self.W)

    def shift(self, T: int, a: int, P: int) -> int | None:
        """The ``Delta`` for which preconditions 1 and 2 hold at ``T``, or None."""
        W = self.W
        pc = self.cycles[T][0][1].pc - self.starts
        H = pc.shape[0] // W
        now = None
        for delta in range(1, self.length + 1):
            before = self.cycles.get(T - delta)
            if before is None:
                continue
            if not isinstance(before[0], np.ndarray):       # op rows first: most deltas fail there
                old = before[0][1].pc - self.starts
                if not np.array_equal(old.reshape(H, W)[:, a:W - P], pc.reshape(H, W)[:, a + P:]):
                    continue
            now = self.features(T).reshape(H, W, -1)[:, a + P:] if now is None else now
            if not np.array_equal(self.features(T - delta).reshape(H, W, -1)[:, a:W - P], now):
                continue
            span = [self.cycles[s] for s in self.cycles if T - delta <= s <= T]
            if before[1] == self.cycles[T][1] and not any(c[2] for c in span):
                return delta
        return None


def _prerun(network, ops, starts, inject, a: int, P: int, limit: int):
    """Run the full replay until a ``T`` passing preconditions 1 and 2: ``(state, (T, Delta,
    every column's sends in [T - Delta, T), [rows, columns] each), None)``; ``(state, None, None)`` if none does
    (the run goes on from its state), ``(state, None, status)`` if it ended (``_FINISHED``)
    or hung."""
    routes = network.routes()
    ports = _edge_ports(network, inject)
    queues, cores, events = _new_state(routes, ports, starts)
    scalars = _new_scalars(starts, ports, -1)
    kept = sum(x.nbytes for x in (*queues, *cores))
    length = max(2, min(WINDOW, _WINDOW_BYTES // max(kept, 1)))
    window = _Window(network, a, length, starts)
    for T in _STARTS:
        status = _run(routes, ports, ops, queues, cores, events, scalars, min(T - length, limit), -1)
        sends = {}
        while status == _OUT_OF_TIME and scalars[_T] <= T and scalars[_T] < limit:
            t = int(scalars[_T])
            window.record(t, queues, cores, events, scalars, routes.router_depth)
            if t == T:
                break
            status = _run(routes, ports, ops, queues, cores, events, scalars, t + 1, -1)
            sends[t] = window.sends(t, events)
        state = (routes, ports, queues, cores, events, scalars)
        if status != _OUT_OF_TIME or scalars[_T] >= limit:
            return state, None, status
        if T in window.cycles:
            delta = window.shift(T, a, P)
            if delta is not None:
                zero = np.zeros((network.config.height, network.config.width), dtype=window.bits)
                return state, (T, delta, [sends.get(s, zero) for s in range(T - delta, T)]), None
        window.cycles.clear()
    return state, None, None


class _Extra:
    """The probe's state for the period search (:func:`.replay_periods.run_with_periods`'s
    ``extra``): the delay line, from cycle ``t - Delta`` to ``t - 1``, is compared and kept with
    the fabric's state; a skip moves it with the clock and shifts each column's last grant
    that lay in the repeated period, a jump sets both as the transition's end had them."""

    def __init__(self, probe: ColumnProbe):
        self.probe = probe
        self.delta = int(probe.info[1])

    def _slots(self, t: int) -> np.ndarray:
        return (t + np.arange(self.delta)) % self.delta

    def keep(self, snap: dict, t: int) -> None:
        snap["rel"]["line"] = self.probe.line[self._slots(t)]
        snap["col_last"] = self.probe.col_last.copy()

    def key(self, t: int) -> int:
        return hash(self.probe.line[self._slots(t)].tobytes())

    def skipped(self, first: int, now: int, span: int) -> None:
        line, last = self.probe.line, self.probe.col_last
        line[self._slots(now + span)] = line[self._slots(now)]
        last[last >= first] += span

    def restored(self, b: dict, now: dict, a: dict) -> None:
        self.probe.line[self._slots(now["t"] + b["t"] - a["t"])] = b["rel"]["line"]
        last, moved = self.probe.col_last, b["col_last"] >= a["t"]
        last[moved] = np.maximum(last[moved], b["col_last"][moved] + now["t"] - a["t"])


def _probe(network: Network, a: int, P: int, T: int, delta: int, line) -> ColumnProbe:
    """The checks of the reduced network (columns ``0 .. K - 1``, :func:`_columns`) from cycle
    ``T``, the delay line filled with ``line`` (column ``a - 1``'s sends in ``[T - delta, T)``)."""
    K = network.config.width
    H = network.config.height
    column = (np.arange(H * K) % K)[:, None]
    east = (network.output_mask & _EAST) != 0
    role = np.where(east & (column == a - 1), _SOURCE, 0) | np.where(east & (column == a + P - 1), _COPY, 0) | \
        np.where(east & (column >= a - 1) & (column <= K - 2), _WEST_FED, 0) | np.where(column >= a, _CHECKED, 0)
    ring = np.zeros((delta, H), dtype=np.int64)
    for s, sent in enumerate(line):
        ring[(T - delta + s) % delta] = sent
    return ColumnProbe(role.astype(np.int64), ring, np.zeros((2, H), dtype=np.int64), np.full(K, -1, dtype=np.int64),
                       np.zeros(2, dtype=np.int64), np.array([K, delta, H, a + P - 1], dtype=np.int64))


def _cut_state(full, small: Network, small_routes, W: int, K: int, starts):
    """The full replay's state at ``T`` on the first ``K`` columns (``small``, :func:`_columns`; a fresh run's
    arrays, filled; no edge port injects, a precondition)."""
    routes, _, queues, cores, events, scalars = full
    H = queues.rx.shape[0] // W
    keep = ((np.arange(W * H) % W) < K)
    index = np.cumsum(keep) - 1
    ports = _edge_ports(small, {})
    q, c, e = _new_state(small_routes, ports, starts[keep])
    for mine, theirs in zip(q + c, queues + cores):
        mine[:] = theirs[keep]
    n = int(events.count[_WRITE])
    who, color = events.who[_WRITE, :n], events.color[_WRITE, :n]
    inside = keep[who]
    e.count[_WRITE] = int(inside.sum())
    e.who[_WRITE, :e.count[_WRITE]] = index[who[inside]]
    e.color[_WRITE, :e.count[_WRITE]] = color[inside]
    s = scalars.copy()
    s[_RUNNING], s[_FIFOS], s[_TX] = int((~c.done).sum()), int((q.router_fifo > 0).sum()), int(q.tx_count.sum())
    s[_TO_INJECT], s[_LAST], s[_CONFLICTS] = 0, -1, 0
    return ports, q, c, e, s, keep


def _go_on(state, ops, ends, limit: int, run):
    """The full replay's result from ``state`` on, with the period search
    (:func:`.replay_periods.run_with_periods`): ``(cycles or a negative hang code, last cycles)``."""
    from .replay_periods import run_with_periods

    routes, ports, queues, cores, events, scalars = state
    watch = int(np.argmax(np.where(cores.done, -1, ends - cores.pc)))
    result = run_with_periods(routes, ports, ops, queues, cores, events, limit, watch, int(ends[watch]), run,
                              scalars)
    return int(result), cores.free_at - 1


def reduced_replay(network: Network, ops, starts, ends, inject: dict, limit: int = 1 << 40,
                   info: dict | None = None, run=_run):
    """``(cycles, every PE's last cycle)`` of the full replay (cycles < 0: it hangs, as
    :func:`.replay.run_replay`'s codes), from the reduced replay of the first columns (module
    docstring) where the preconditions and checks hold, else from the full replay, which
    goes on from where the reduced one began (``run``: its engine); None where the
    preconditions fail (nothing has run). ``ops`` as :func:`.replay.run_replay` passes them.
    ``info``, if given, is filled with what happened (``"path"``: ``"no shape"``,
    ``"no shift"``, ``"ended before T"``, ``"check failed"`` or ``"reduced"``; ``a``, ``P``,
    ``T``, ``delta``, the reduced replay's columns ``K``; ``"tries"``: ``(a, column)`` of each
    try whose check failed, ``column`` as :func:`_reduced` returns it)."""
    info = {} if info is None else info
    info["path"] = "no shape"
    shape = column_shape(network, ops, starts, ends, inject)
    if shape is None:
        return None
    a, P = shape
    info.update(a=a, P=P, K=a + 2 * P, path="no shift")
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    full, found, ended = _prerun(network, ops, starts, inject, a, P, limit)
    if ended is not None:                     # the full replay ended (or hung) before any T
        info["path"] = "ended before T"
        scalars = full[5]
        return (int(scalars[_LAST]) + 1 if ended == _FINISHED else int(ended)), full[3].free_at - 1
    if found is None:
        return _go_on(full, ops, ends, limit, run)
    T, delta, sends = found
    info.update(T=T, delta=delta, path="check failed", tries=[])
    while True:
        K = a + 2 * P
        result = _reduced(network, full, ops, starts, ends, limit, a, P, T, delta, [s[:, a - 1] for s in sends])
        if isinstance(result, tuple):
            info.update(a=a, K=K, path="reduced")
            return result
        if result is None:                      # the reduced replay hung with every check held: so does the full one
            return _go_on(full, ops, ends, limit, run)
        info["tries"].append((a, result))
        # The check failed at column `result`: the columns west of it may be a transient the columns east of it
        # do not share (the weight gradients' wrap row on tall meshes), so the copies are tried again from
        # further east, from the same T (conditions 1 and 2 hold there for every a' >= a).
        a = max(2 * a, result + 1)
        if _RETRY_RATIO * (a + 2 * P) > network.config.width:
            return _go_on(full, ops, ends, limit, run)


def _reduced(network: Network, full, ops, starts, ends, limit: int, a: int, P: int, T: int, delta: int, line):
    """The reduced replay of columns ``0 .. a + 2P - 1`` from the full replay's state ``full`` at ``T``
    (kept as it is), column ``a - 1``'s sends in ``[T - delta, T)`` in ``line``: ``(cycles, every PE's last
    cycle)`` of the full replay if every check held; else the column to try again east of: the one where the
    first failed check was seen (in a cycle, routers in order, grants before FIFOs and sends), the copy column
    ``a + P - 1`` if a send of column ``a - 1`` was left unechoed, ``K - P`` if a column copied had no grant
    from ``T`` on; None if the reduced replay hung (it is the full replay on its columns, so the full one
    hangs too: no try from further east can count it)."""
    from .replay_periods import run_with_periods

    W, H = network.config.width, network.config.height
    K = a + 2 * P
    small = _columns(network, K)
    small_routes = small.routes()
    ports, queues, cores, events, scalars, keep = _cut_state(full, small, small_routes, W, K, starts)
    probe = _probe(small, a, P, T, delta, line)
    small_ends = ends[keep]
    watch = int(np.argmax(small_ends - cores.pc))

    def checked(routes, ports, ops, queues, cores, events, scalars, limit, watch):
        return _run(routes, ports, ops, queues, cores, events, scalars, limit, watch, probe)

    result = run_with_periods(small_routes, ports, ops, queues, cores, events, limit, watch,
                              int(small_ends[watch]), checked, scalars, _Extra(probe))
    if probe.flag[0]:
        return int(probe.flag[1])
    if result < 0:
        return None
    # Condition 3 holds to the end only if every send of column a-1 still in the delay line when the reduced
    # replay finishes has had its echo: a send left in the line was never compared.
    if probe.line.any():
        return a + P - 1
    exits = np.full((H, W), -1, dtype=np.int64)
    exits[:, :K] = (cores.free_at - 1).reshape(H, K)
    # A copy column's last grant is its model's shifted only if that grant is at or after T; a PE that finished
    # before T keeps its own exit (taken per PE below), so exits of done PEs do not enter the shifted count.
    last = probe.col_last[K - P:]
    if (last < T).any():
        return K - P
    done_at_T = full[3].done.reshape(H, W)
    exit_at_T = (full[3].free_at - 1).reshape(H, W)
    for j in range(K, W):
        exits[:, j] = np.where(done_at_T[:, j], exit_at_T[:, j], exits[:, j - P] + delta)
    copies = (W - 1 - np.arange(K - P, K)) // P
    count = max(int(full[5][_LAST]), int(scalars[_LAST]), int((last + copies * delta).max()), int(exits.max())) + 1
    return count, exits.reshape(-1)
