"""The region replay (:mod:`wse.host.compiler.replay_region`) against the plain replay.

The direct proof: from a state at some cycle, a recorded period and the region
replay up to a limit leave the reference replay's whole state at the cycle
they stopped at (queues, cores, pending writes, edge ports, counters), cut by
the limit in mid-run or ended by the region replay itself. Then the counts and
every PE's last cycle with and without regions on square, non-square,
one-row and one-column meshes, uneven token blocks and two hidden layers, on
both engines and on random small shapes; the record's byte budget and the
region's size limit; and the golden model's cycles on a phase where a region ran.
"""

import functools

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlps import mlp

from wse.config import FabricConfig, Port
from wse.firmware.timing_ops import BUSY, END, RECV, VEC
from wse.host.compiler import replay_region, trace
from wse.host.compiler import replay as engine
from wse.host.compiler.cycles import Network, phase_injections, phase_ops
from wse.host.compiler.network import TO_PE, TO_ROUTER
from wse.host.compiler.replay_periods import _snapshot
from wse.host.compiler.replay_state import _edge_ports, _new_scalars, _new_state
from wse.host.compiler.weight_streaming import plan


@functools.lru_cache(maxsize=4)
def _plan(mesh, sizes, batch, depths=()):
    torch.manual_seed(0)
    config = FabricConfig(width=mesh[0], height=mesh[1], **dict(depths))
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])), config, batch)
    return exe_plan, Network(config, exe_plan.routes)


def _phases(mesh, sizes, batch, depths=()):
    """``(name, network, (ops, starts, ends, inject))`` of every phase of the MLP ``sizes`` on ``mesh``."""
    exe_plan, network = _plan(mesh, tuple(sizes), batch, tuple(sorted(dict(depths).items())))
    for name, phase in exe_plan.phases.items():
        yield name, network, (*phase_ops(exe_plan, phase), phase_injections(phase))


def _phase(mesh, sizes, batch, name):
    """``(network, (ops, starts, ends, inject))`` of the phase ``name``."""
    return next((network, inputs) for n, network, inputs in _phases(mesh, sizes, batch) if n == name)


@pytest.fixture
def searches(instances):
    """Every :class:`~wse.host.compiler.replay_region.RegionSearch` a replay makes, in order."""
    return instances(replay_region, "RegionSearch")


# The state at the end of a region replay ---------------------------------------------------

class _Run:
    """One replay of a phase stepped by hand: the replay's state, counters and edge ports."""

    def __init__(self, network, ops, starts, ends, inject):
        self.network, self.colors = network, network.config.colors
        self.routes = network.routes()
        self.ports = _edge_ports(network, inject)
        self.starts = starts.astype(np.int64)
        self.ops = np.ascontiguousarray(ops, dtype=np.int32)
        self.queues, self.cores, self.events = _new_state(self.routes, self.ports, self.starts)
        self.scalars = _new_scalars(self.starts, self.ports, -1)

    def run_to(self, cycle: int) -> int:
        """The reference engine to the start of ``cycle``."""
        return engine._run(self.routes, self.ports, self.ops, self.queues, self.cores, self.events, self.scalars,
                           cycle, -1)

    def state(self) -> dict:
        """The relative state (``replay_periods._snapshot``), the counters and every PE's ``free_at``."""
        snap = _snapshot(self.queues, self.cores, self.events, self.ports, int(self.scalars[engine._T]), self.colors,
                         self.scalars)
        snap["scalars"] = self.scalars.copy()
        snap["free_at"] = self.cores.free_at.copy()
        return snap


def _differences(a: dict, b: dict) -> list:
    """What differs between two states (:meth:`_Run.state`), by name, with the first cells that differ."""
    out = []
    for key in a["rel"]:
        x, y = np.asarray(a["rel"][key]), np.asarray(b["rel"][key])
        if x.shape != y.shape or not np.array_equal(x, y):
            cells = np.flatnonzero((x != y).reshape(x.shape[0], -1).any(axis=1))[:8] if x.shape == y.shape else []
            out.append((key, list(cells)))
    for key in ("pc", "left", "free_at", "scalars"):
        if not np.array_equal(a[key], b[key]):
            out.append((key, list(np.flatnonzero(a[key] != b[key])[:8])))
    for key in ("t", "conflicts", "last"):
        if a[key] != b[key]:
            out.append((key, a[key], b[key]))
    return out


def _attempt(mesh, sizes, batch, name, t0, period, limit):
    """The region replay of ``name`` from cycle ``t0`` with the period ``period``, up to ``limit``:
    ``(status, its RegionSearch, its state, the reference replay's state at the same cycle)``."""
    network, inputs = _phase(mesh, sizes, batch, name)
    run = _Run(network, *inputs)
    assert run.run_to(t0) == engine._OUT_OF_TIME and run.scalars[engine._T] == t0
    search = replay_region.RegionSearch(run.routes, run.ports, run.ops)
    status = search._attempt(period, run.queues, run.cores, run.events, run.scalars, limit)
    reached = run.state()
    reference = _Run(network, *inputs)
    assert reference.run_to(reached["t"]) == engine._OUT_OF_TIME
    return status, search, reached, reference.state()


# (mesh, sizes, batch, phase, first cycle, period, [(limit, why the region replay ended)]): limits in
# mid-run and none (the region replay ends by itself: grown too big, or a background that stands still,
# "ended"; or no PE stepped at a period's end, "settled");
# a limit at the end of the second period leaves no room for the record and a period after it: nothing
# runs (why None). The first cycles and periods are tries of the period search's stops.
_NONE = 1 << 40
MLP1024 = ((32, 32), (1024, 1024, 1024, 10), 256)
ATTEMPTS = [
    (*MLP1024, "bwd-data 4", 487, 42, [(571, None), (572, "limit"), (590, "limit"), (612, "limit"),
                                       (_NONE, "ended")]),
    ((10, 2), (8, 60, 60, 4), 23, "fwd 2", 437, 202, [(_NONE, "ended")]),
    ((8, 8), (100, 128, 128, 10), 32, "fwd 2", 1213, 590, [(_NONE, "ended")]),
    # the stepped set empties at a period's end: the region replay hands the record's state back
    ((8, 8), (100, 128, 128, 10), 32, "fwd 0", 3985, 494, [(_NONE, "settled")]),
]
LONG_ATTEMPTS = [
    ((64, 64), (2048, 2048, 2048, 10), 512, "fwd 0", 3728, 538, [(4900, "limit"), (8000, "limit")]),
    # settles at 6,322 (SETTLE): the disturbance has left the mesh
    (*MLP1024, "fwd 0", 4708, 538, [(6000, "limit"), (6322, "limit"), (_NONE, "settled")]),
    (*MLP1024, "bwd-data 4", 2773, 678, [(4500, "limit"), (6000, "limit"), (_NONE, "ended")]),
]
# The 32x32 ones in the default suite (a few seconds): they run periods long enough that a record
# row left stale where a cell deviated reaches a cell outside the region (the short ones do not).
LONG_ATTEMPTS = [pytest.param(case, id=f"{case[0][0]}x{case[0][1]}-{case[3]}-{case[4]}",
                              marks=[pytest.mark.slow] if case[0] == (64, 64) else [])
                 for case in LONG_ATTEMPTS]


def _check_attempts(case):
    mesh, sizes, batch, name, t0, period, limits = case
    stepped = 0
    for limit, why in limits:
        status, search, reached, reference = _attempt(mesh, sizes, batch, name, t0, period, limit)
        assert not _differences(reached, reference), (case, limit, search.runs, _differences(reached, reference))
        if why is None:
            assert status is None and not search.runs and reached["t"] == t0, (limit, status, search.runs)
            continue
        assert status == engine._STOPPED, (case, limit, status)
        assert len(search.runs) == 1, (limit, search.runs)
        first, end, ended = search.runs[0]
        assert first == t0 + period and end == reached["t"] and search.stats[0] == end - first > 0, \
            (limit, search.runs, search.stats)
        if why == "limit":
            assert end == limit and ended == "limit", (limit, search.runs)
        elif why == "settled":
            assert end < limit and ended == "settled" and (end - first) % period == 0, (limit, search.runs)
        else:
            assert end < limit and ended in ("region", "still"), (limit, search.runs)
        stepped += int(search.stats[1])
    return stepped


@pytest.mark.parametrize("case", ATTEMPTS, ids=[f"{c[0][0]}x{c[0][1]}-{c[3]}" for c in ATTEMPTS])
def test_a_region_replay_leaves_the_reference_state(case):
    """The whole state after ``_attempt`` equals the reference replay's at the same cycle, at
    limits inside the region replay and at its own end; the region replay stepped cycles (and,
    on the 32x32 mesh, cells around the disturbance, not only the record's background)."""
    stepped = _check_attempts(case)
    assert case[0] != MLP1024[0] or stepped > 0, "no cell was stepped: only the record's background ran"


@pytest.mark.parametrize("case", LONG_ATTEMPTS)
def test_a_long_region_replay_leaves_the_reference_state(case):
    """As above over thousands of cycles: the 2048-wide MLP's first forward phase on 64x64 (slow)
    and the 1024-wide one's on 32x32, cut in mid-run and at their own ends."""
    assert _check_attempts(case) > 0


# Counts and last cycles with and without regions ---------------------------------------------

def _counts(network, inputs, flag, monkeypatch, engine_name=None):
    """``(cycles, every PE's last cycle)`` of a replay with regions on or off (no reduced replay of columns)."""
    monkeypatch.setattr(replay_region, "REGION", flag)
    count, exits = engine.run_replay(network, *inputs, engine=engine_name, columns=False)
    return count, exits.copy()


def _same_with_and_without(cases, monkeypatch, searches, engines=(None,)):
    """Every phase of every case: the counts and exits with regions equal those without; the runs by case.
    The choices of when to try are made eager (every stop, any period, any round): they change costs
    only, and eager tries exercise the region replay in many more states."""
    for name, value in (("MIN_PERIOD", 2), ("QUIET_STOPS", 1), ("FIRST_ROUND_ONLY", False), ("MIN_CELLS", 1)):
        monkeypatch.setattr(replay_region, name, value)
    runs = {}
    for mesh, sizes, batch in cases:
        for name, network, inputs in _phases(mesh, sizes, batch):
            for engine_name in engines:
                off = _counts(network, inputs, False, monkeypatch, engine_name)
                searches.clear()
                on = _counts(network, inputs, True, monkeypatch, engine_name)
                assert on[0] == off[0] and np.array_equal(on[1], off[1]), (mesh, sizes, batch, name, engine_name)
                for search in searches:
                    cells = network.config.width * network.config.height
                    assert search.stats[1] <= search.stats[0] * replay_region.MAX_SHARE * cells, search.stats
                    runs.setdefault(mesh, []).extend(search.runs)
    return {mesh: found for mesh, found in runs.items() if found}


# square (two hidden layers), non-square, one row, one column, uneven token blocks (23 tokens on
# 10 columns, 43 on 20)
MESHES = [
    ((8, 8), (100, 128, 128, 10), 32),
    ((6, 4), (20, 96, 96, 5), 12),
    ((8, 1), (6, 64, 64, 3), 12),
    ((1, 8), (4, 128, 128, 3), 5),
    ((10, 2), (8, 60, 60, 4), 23),
    ((20, 4), (16, 80, 80, 6), 43),
]


def test_counts_and_last_cycles_are_the_same_without_regions(monkeypatch, searches):
    """Every phase, on both engines: the cycles and every PE's last cycle with and without
    regions; regions ran, some of them for several cycles."""
    runs = _same_with_and_without(MESHES, monkeypatch, searches, engines=("reference", None))
    assert any(end > first for found in runs.values() for first, end, _ in found), runs
    assert runs.get((20, 4)) and runs.get((8, 8)), runs
    assert any(why == "settled" for _, _, why in runs[(8, 8)]), runs


@pytest.mark.slow
def test_counts_are_the_same_without_regions_on_32x32(monkeypatch, searches):
    """The 1024-wide MLP on 32x32, where regions step thousands of cycles."""
    runs = _same_with_and_without([MLP1024], monkeypatch, searches)
    assert any(end - first > 1000 for first, end, _ in runs[MLP1024[0]]), runs


_EAGER = {"MIN_PERIOD": 2, "QUIET_STOPS": 1, "FIRST_ROUND_ONLY": False, "MIN_CELLS": 1, "PROPOSE_SHARE": 1.0}


@st.composite
def _shapes(draw):
    width, height = draw(st.integers(2, 8)), draw(st.integers(1, 6))
    hidden = draw(st.integers(8, 24)) * height          # many rounds per streamed GEMM
    sizes = (draw(st.integers(2, 12)), hidden, hidden, draw(st.integers(2, 6)))
    batch = draw(st.integers(1, 6 * width))              # uneven token blocks too
    depths = draw(st.sampled_from([{}, {"router_depth": 1, "rx_depth": 1, "tx_depth": 2}, {"colors": 7},
                                   {"colors": 9}]))
    share = draw(st.sampled_from([0.08, 0.3, 1.0]))
    return (width, height), sizes, batch, tuple(sorted(depths.items())), share


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes())
def test_counts_are_the_same_without_regions_on_random_shapes(shape):
    """Random small meshes, widths, batches, queue depths, color counts and room for the stepped
    PEs, tries made eager (every stop, any period, any round, any mesh): the same cycles and last
    cycles with and without regions, in every phase."""
    mesh, sizes, batch, depths, share = shape
    settings_now = {**_EAGER, "MAX_SHARE": share}
    saved = {name: getattr(replay_region, name) for name in [*settings_now, "REGION"]}
    try:
        for name, value in settings_now.items():
            setattr(replay_region, name, value)
        for name, network, inputs in _phases(mesh, sizes, batch, depths):
            replay_region.REGION = False
            off = engine.run_replay(network, *inputs, columns=False)
            replay_region.REGION = True
            on = engine.run_replay(network, *inputs, columns=False)
            assert on[0] == off[0] and np.array_equal(on[1], off[1]), (shape, name)
    finally:
        for name, value in saved.items():
            setattr(replay_region, name, value)


def test_a_port_unlike_the_record_keeps_its_router_stepped(monkeypatch, searches):
    """7x5, 9 colors, the last layer's input gradient, eager tries with room for every PE: a router
    leaving the stepped set while its edge port's colors left were not the record's took its
    injection from the record for a cycle, and the replay hung (1,680 cycles without regions)."""
    for name, value in {**_EAGER, "MAX_SHARE": 1.0}.items():
        monkeypatch.setattr(replay_region, name, value)
    for name, network, inputs in _phases((7, 5), (6, 70, 70, 4), 38, (("colors", 9),)):
        if name != "bwd-data 4":
            continue
        off = _counts(network, inputs, False, monkeypatch)
        searches.clear()
        on = _counts(network, inputs, True, monkeypatch)
        assert off[0] == 1680 and on[0] == off[0] and np.array_equal(on[1], off[1])
        assert any(end > first for search in searches for first, end, _ in search.runs)


# A stepped cell's grants unlike the record's, into a cell outside the stepped ones ---------------

def _crossing_streams(width, height, n, early, at, pace, last_pace):
    """A hand-made network where the region replay's spill happens (:func:`.replay_region_steps._spill`):
    color 0 streams from the west edge along every row to every PE, color 1 from the north edge down
    every column to every PE but the last column's, which only passes it south. A PE takes one
    wavelet of each in one vector element and then ``pace`` private cycles; the last column's take
    color 0 alone, then ``last_pace`` private cycles (the rows' bottleneck). PE ``early`` (in the
    last column) takes one wavelet early, at its iteration ``at``, and one fewer at the end: room in
    its router a cycle sooner lets its west neighbour's color 0 take the ramp port from its color 1,
    which then reaches the cell south of it later than the record says, two hops from the cell that
    deviates. Returns ``(network, (ops, starts, ends, inject))``."""
    routes = []
    for y in range(height):
        for x in range(width):
            last = x == width - 1
            routes.append((x, y, 0, Port.W, (Port.RAMP,) if last else (Port.RAMP, Port.E)))
            routes.append((x, y, 1, Port.N, (Port.S,) if last else (Port.RAMP, Port.S)))
    table, starts, ends = [], [], []
    for pe in range(width * height):
        starts.append(len(table))
        for i in range(n):
            if pe % width < width - 1:
                table += [(VEC, 1, 0, 1, -1, 0), (BUSY, pace, 0, 0, 0, 0)]
            elif not (pe == early and i == n - 1):
                table += [(RECV, 0, 0, 0, 0, 0), (BUSY, last_pace, 0, 0, 0, 0)]
            if pe == early and i == at:
                table.append((RECV, 0, 0, 0, 0, 0))
        table.append((END, 0, 0, 0, 0, 0))
        ends.append(len(table))
    inject = {**{("W", y): {0: n} for y in range(height)}, **{("N", x): {1: n} for x in range(width)}}
    network = Network(FabricConfig(width=width, height=height), routes)
    return network, (np.array(table, np.int32), np.array(starts), np.array(ends), inject)


# (width, height, early PE, pace, last pace, first cycle): 16-cycle periods, the early take at iteration 150
SPILLS = [(5, 7, 9, 0, 3, 580), (8, 8, 15, 1, 3, 599), (5, 7, 9, 1, 3, 589)]


@pytest.mark.parametrize("case", SPILLS)
def test_a_grant_unlike_the_record_outside_the_stepped_cells_spills_into_them(case, monkeypatch):
    """With a one-hop margin a stepped cell's grant can differ from the record's into a cell outside
    the margin: that cell joins with the record's next state and the difference (a spill), and the
    state where the region replay ends is the reference replay's (without the spill it is not: its
    queues, PEs and counters differ). With two hops nothing spills, and the state is the same too."""
    width, height, early, pace, last_pace, t0 = case
    network, inputs = _crossing_streams(width, height, 400, early, 150, pace, last_pace)
    monkeypatch.setattr(replay_region, "MAX_SHARE", 1.0)
    for margin in (1, 2):
        monkeypatch.setattr(replay_region, "MARGIN", margin)
        run = _Run(network, *inputs)
        assert run.run_to(t0) == engine._OUT_OF_TIME
        search = replay_region.RegionSearch(run.routes, run.ports, run.ops)
        assert search._attempt(16, run.queues, run.cores, run.events, run.scalars, 1 << 40) == engine._STOPPED
        reached = run.state()
        reference = _Run(network, *inputs)
        assert reference.run_to(reached["t"]) == engine._OUT_OF_TIME
        assert not _differences(reached, reference.state()), (margin, _differences(reached, reference.state()))
        (first, end, why), = search.runs
        assert end - first > 8 and search.stats[2] > 0, search.runs
        assert (search.stats[4] > 0) == (margin == 1), search.stats


def test_counts_are_the_same_with_spills(monkeypatch, searches):
    """The hand-made network of the spills, every try eager: the same cycles and last cycles with and
    without regions, and the region replays spilled."""
    for name, value in {**_EAGER, "MAX_SHARE": 1.0}.items():
        monkeypatch.setattr(replay_region, name, value)
    network, inputs = _crossing_streams(8, 8, 200, 15, 100, 1, 3)
    off = _counts(network, inputs, False, monkeypatch)
    searches.clear()
    on = _counts(network, inputs, True, monkeypatch)
    assert on[0] == off[0] and np.array_equal(on[1], off[1])
    assert sum(int(search.stats[4]) for search in searches) > 0, [search.stats for search in searches]


def test_the_neighbour_table_is_every_router_sent_to_or_taken_from():
    """The compiled neighbour table equals the pairs read off the route tables in plain Python, on
    meshes with the column ring's long link and on the hand-made network."""
    networks = [_plan((8, 8), (100, 128, 128, 10), 32)[1], _plan((10, 2), (8, 60, 60, 4), 23)[1],
                _plan((1, 8), (4, 128, 128, 3), 5)[1], _crossing_streams(5, 7, 4, 9, 1, 0, 3)[0]]
    for network in networks:
        routes = network.routes()
        cells = routes.target.shape[0]
        pairs = set()
        for r in range(cells):
            for c in range(routes.target.shape[1]):
                for k in range(routes.n_targets[r, c]):
                    to = int(routes.target[r, c, k])
                    if routes.target_kind[r, c, k] in (TO_ROUTER, TO_PE) and to != r:
                        pairs |= {(r, to), (to, r)}
        indptr, indices = replay_region.neighbours(routes)
        got = {(r, int(s)) for r in range(cells) for s in indices[indptr[r]:indptr[r + 1]]}
        assert got == pairs and len(got) == indices.shape[0]
        assert all(np.all(np.diff(indices[indptr[r]:indptr[r + 1]]) > 0) for r in range(cells))


# Budgets and limits --------------------------------------------------------------------------

def test_no_region_runs_without_room_for_a_record(monkeypatch, searches):
    """A record budget of one byte: no period is proposed, no region runs, the same counts."""
    monkeypatch.setattr(replay_region, "RECORD_BYTES", 1)
    runs = _same_with_and_without([((10, 2), (8, 60, 60, 4), 23), ((20, 4), (16, 80, 80, 6), 43)],
                                  monkeypatch, searches)
    assert not runs, runs


def test_a_region_with_no_room_ends_at_once(monkeypatch, searches):
    """``MAX_SHARE = 0``: no cell is ever stepped (a try whose first stepped set is not empty
    ends where it began, with "region"), the same counts."""
    monkeypatch.setattr(replay_region, "MAX_SHARE", 0)
    runs = _same_with_and_without([((20, 4), (16, 80, 80, 6), 43), ((10, 2), (8, 60, 60, 4), 23)],
                                  monkeypatch, searches)
    assert runs, "no region replay was tried"
    assert all(search.stats[1] == 0 for search in searches)


@pytest.mark.parametrize("depth", [replay_region.MAX_DEPTH, replay_region.MAX_DEPTH + 1])
def test_queues_as_deep_as_a_record_holds(depth, monkeypatch, searches):
    """A record packs a color's FIFO and input-queue counts in a byte, four bits each: with queues
    :data:`~wse.host.compiler.replay_region_steps.MAX_DEPTH` deep the region replay runs and counts
    as the plain replay does; one deeper, none is tried (the same counts)."""
    for name, value in {**_EAGER, "MAX_SHARE": 1.0}.items():
        monkeypatch.setattr(replay_region, name, value)
    depths = (("router_depth", depth), ("rx_depth", depth))
    runs = []
    for name, network, inputs in _phases((6, 4), (20, 96, 96, 5), 12, depths):
        off = _counts(network, inputs, False, monkeypatch)
        searches.clear()
        on = _counts(network, inputs, True, monkeypatch)
        assert on[0] == off[0] and np.array_equal(on[1], off[1]), (depth, name)
        runs += [run for search in searches for run in search.runs]
    assert bool(runs) == (depth <= replay_region.MAX_DEPTH), runs


# The golden model ----------------------------------------------------------------------------

def test_a_phase_with_a_region_counts_the_golden_models_cycles(searches, monkeypatch):
    """The second forward phase of a 10x2 mesh with uneven token blocks, replayed with regions
    (the replay of the compiled executable's op images; tries on a mesh this small): the golden
    fabric's cycles."""
    monkeypatch.setattr(replay_region, "MIN_CELLS", 1)
    from wse.host.compiler import compile_model
    from wse.host.compiler.cycles import executable_phase_ops
    from wse.host.runtime import Runtime
    from wse.host.runtime.golden import GoldenBackend
    (width, height), sizes, batch = (10, 2), (8, 60, 60, 4), 23
    torch.manual_seed(0)
    exe = compile_model(mlp(*sizes), torch.randn(batch, sizes[0]), batch=batch,
                        config=FabricConfig(width=width, height=height), cycles=False)
    name = "fwd 2"
    phase = exe.phases[name]
    images = {addr: image for addr, image in exe.static}
    network = Network(exe.config, exe.routes)
    assert replay_region.REGION
    count, _ = engine.run_replay(network, *executable_phase_ops(exe, images[phase.ops_addr]),
                                 phase_injections(phase), columns=False)
    assert any(end > first for search in searches for first, end, _ in search.runs), "no region ran"
    backend = GoldenBackend(exe)
    backend.load()
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    backend._copy_in(Runtime(exe, "functional")._host(x, rng.integers(0, sizes[-1], batch)))
    weights = {key: rng.standard_normal(shape).astype(np.float32) for key, shape in exe.parameters().items()}
    assert backend.run_phase(name, weights, {}) == count


def test_the_replays_rate_counts_plain_replay_only(monkeypatch):
    """The rate a try must beat is the replay's between two stops with nothing skipped between them:
    a stretch in which the period search skipped or jumped (``landed``) is not counted, so its free
    cycles do not make every try look dear."""
    monkeypatch.setattr(replay_region, "MIN_CELLS", 1)
    network, inputs = _phase((8, 8), (100, 128, 128, 10), 32, "fwd 0")
    run = _Run(network, *inputs)
    search = replay_region.RegionSearch(run.routes, run.ports, run.ops)

    def stop_at(cycle):
        assert run.run_to(cycle) == engine._OUT_OF_TIME
        now = run.state()
        assert search.stop(now, run.queues, run.cores, run.events, run.scalars, 1 << 40) is None

    stop_at(100)
    stop_at(300)
    assert search.rates[3] == 200
    search.landed()                 # the period search skipped from here: the next stretch is not counted
    stop_at(700)
    assert search.rates[3] == 200 and search.quiet == 1
    stop_at(750)
    assert search.rates[3] == 250


def test_no_try_where_tries_in_a_row_did_not_pay(monkeypatch):
    """Tries are judged where the watched PE stands in its round: once ``POINT_LOSSES`` tries in a
    row did not pay at one point (a round's boundary), none is made there again, while tries
    elsewhere that pay (a fill's) go on and do not make the losing point's tries look cheap."""
    from types import SimpleNamespace
    clock = [0.0]
    monkeypatch.setattr(replay_region.time, "thread_time", lambda: clock[0])
    monkeypatch.setattr(replay_region, "MIN_CELLS", 1)
    monkeypatch.setattr(replay_region.RegionSearch, "_signature", staticmethod(lambda now: np.zeros(4, np.int64)))
    scalars = np.zeros(8, np.int64)
    attempts, point = [], [None]      # point: where the watched PE stands at the stop being offered

    def attempt(self, period, queues, cores, events, scalars_, limit):
        where = point[0]
        attempts.append(where)
        scalars_[engine._T] += 400
        clock[0] += 40.0 if where == 1 else 4000.0       # a plain cycle costs 1 s: point 1 pays, point 0 not
        return engine._STOPPED

    monkeypatch.setattr(replay_region.RegionSearch, "_attempt", attempt)
    routes = SimpleNamespace(router_depth=2, rx_depth=2, tx_depth=4)
    search = replay_region.RegionSearch(routes, None, None)
    queues = SimpleNamespace(router_fifo=np.zeros((4, 16), np.int8))
    for k in range(200):
        scalars[engine._T] += 100           # a stretch of plain replay: 100 cycles, 100 s
        clock[0] += 100.0
        point[0] = k % 2
        search.stop({"t": int(scalars[engine._T])}, queues, None, None, scalars, 1 << 40, True, point[0])
    losses = [where for _, where, paid in search.tried if not paid]
    assert losses == [0] * replay_region.POINT_LOSSES and attempts.count(0) == replay_region.POINT_LOSSES
    assert all(paid for _, where, paid in search.tried if where == 1) and attempts.count(1) > 10
    assert search.tried[-1][1] == 1 and search.tried[-1][0] > 10_000


def _period_end_read_in_full(ops, rec, period, base):
    """:func:`~wse.host.compiler.replay_region_steps._period_end`'s answers from every cell's record
    and op rows: shifts, closing, and the moving cells whose rows do not repeat one more period."""
    from wse.host.compiler.replay_periods import _repeats
    shift = rec.pc[:, period].astype(np.int64) - rec.pc[:, 0]
    closed = (shift >= 0) & (rec.free[:, period] == rec.free[:, 0]) & (rec.index[:, period] == rec.index[:, 0]) & \
        (rec.flags[:, period] == rec.flags[:, 0]) & (rec.write[:, period] == rec.write[:, 0]) & \
        (rec.queued[:, period] == rec.queued[:, 0]).all(axis=1) & (rec.tx[:, period] == rec.tx[:, 0]).all(axis=1)
    ends = rec.pc[:, period] + base
    forced = [r for r in np.flatnonzero(shift > 0)
              if _repeats(ops, ends[r:r + 1], shift[r:r + 1], 1) < 1]
    return shift, closed, forced


@pytest.mark.parametrize("seed", range(4))
def test_the_period_end_reads_only_what_changed(seed):
    """``_period_end`` reads from the record only the cells whose first or last phase was rewritten
    since its last call and proves op rows many periods ahead: its shifts, closings and forced
    cells equal a full read's at every period's end, over periods in which random cells' phases
    are rewritten (their shifts, states and op rows with them), op rows stop repeating here and
    there, and cells left untouched move on past the span their rows were proven for."""
    from wse.host.compiler.replay_region_steps import _period_end, new_record
    rng = np.random.default_rng(seed)
    cells, colors, depth, period = 60, 3, 2, 5
    pattern = rng.integers(0, 3, (7, 6))
    ops = np.tile(pattern, (400, 1)).astype(np.int32)
    ops[rng.integers(20, ops.shape[0], 6)] = 9            # rows where a repeat breaks
    rec = new_record(period, cells, colors, depth, 1)

    def rewrite(who):
        start = rng.integers(0, 200, who.shape[0])
        rec.pc[who, 0] = start
        rec.pc[who, period] = start + rng.choice([-1, 0, 7, 7, 14, 3], who.shape[0])
        for field in (rec.queued, rec.tx, rec.free, rec.index, rec.flags, rec.write):
            field[who, period] = field[who, 0]
            odd = who[rng.random(who.shape[0]) < 0.3]
            field[odd, period] = field[odd, 0] + 1

    rewrite(np.arange(cells))
    base = np.zeros(cells, np.int64)
    ends, touched, proven = np.zeros((cells, 3), np.int64), np.zeros(cells, np.bool_), np.zeros((cells, 3), np.int64)
    forced = np.empty(cells, np.int32)
    for call in range(100):
        n = _period_end(ops, rec, period, base, ends, touched, call == 0, forced, proven)
        shift, closed, expected = _period_end_read_in_full(ops, rec, period, base)
        assert (ends[:, 0] == shift).all() and ((ends[:, 2] == 1) == closed).all(), call
        assert sorted(forced[:n]) == expected, call
        assert not touched.any()
        base += ends[:, 0]
        who = np.flatnonzero(rng.random(cells // 2) < 0.3)       # the other half moves on untouched
        rewrite(who)
        touched[who] = True
