"""The cycle model's fast paths against the reference replay (every cycle,
every router and PE visited): skipped periods over random shapes; a repeat
taken the moment its state comes back (the kept states of
:class:`~wse.host.compiler.replay_periods._History`); a state seen before
jumping to the state that followed it (:class:`~wse.host.compiler.replay_periods._Transitions`);
runs that change engine at any stop (:mod:`~wse.host.compiler.replay_adaptive`);
phases replayed on several threads. The same counts every time.
"""

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compile_speed import _same_states, _stops
from test_compile_speed import mlp as _mlp

from wse.config import FabricConfig
from wse.host.compiler import replay_periods, trace
from wse.host.compiler.cycles import Network, phase_injections, phase_ops, replay
from wse.host.compiler.weight_streaming import plan


def _phases(mesh, sizes, batch, **config):
    torch.manual_seed(0)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **config)
    exe_plan = plan(trace(_mlp(*sizes), torch.randn(batch, sizes[0])), cfg, batch)
    network = Network(cfg, exe_plan.routes)
    for name, phase in exe_plan.phases.items():
        yield name, network, (*phase_ops(exe_plan, phase), phase_injections(phase))


def _spy(monkeypatch, name: str) -> list:
    """Replace ``replay_periods.<name>`` by itself, noting each result in the returned list."""
    real, results = getattr(replay_periods, name), []

    def spy(*args):
        result = real(*args)
        results.append(result)
        return result
    monkeypatch.setattr(replay_periods, name, spy)
    return results


@st.composite
def _shapes(draw):
    width, height = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    hidden = draw(st.integers(2, 12)) * height          # several rounds per streamed GEMM
    sizes = (draw(st.integers(2, 9)), hidden, draw(st.integers(2, 5)))
    batch = draw(st.integers(1, 4 * width))              # uneven token blocks too
    depths = draw(st.sampled_from([{}, {"router_depth": 1, "rx_depth": 1, "tx_depth": 2}, {"colors": 7}]))
    return (width, height), sizes, batch, depths


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes())
def test_skipped_periods_equal_the_reference_replay_on_random_shapes(shape):
    mesh, sizes, batch, depths = shape
    for name, network, inputs in _phases(mesh, sizes, batch, **depths):
        fast = replay(network, *inputs)
        assert fast == replay(network, *inputs, periods=False, engine="reference"), (shape, name)


def test_a_repeat_is_skipped_when_its_state_comes_back(monkeypatch):
    """The kept states let a repeat be skipped at the stop where its hash returns; with only
    the latest state kept (older repeats take the check one period later) the counts are
    the same."""
    taken = _spy(monkeypatch, "_look_back")
    phases = list(_phases((3, 2), (5, 60, 4), 6))
    counts = [replay(network, *inputs) for _, network, inputs in phases]
    assert any(taken), "no repeat was skipped on its state's return"
    monkeypatch.setattr(replay_periods, "_SNAPSHOT_BYTES", 0)      # only the latest state kept
    assert counts == [replay(network, *inputs) for _, network, inputs in phases]
    assert counts == [replay(network, *inputs, periods=False, engine="reference") for _, network, inputs in phases]


def test_kept_states_stay_within_their_budget():
    history = replay_periods._History(budget=1000)
    snap = {"rel": {"fifo": np.zeros(100, dtype=np.int32)}, "pc": np.zeros(10, dtype=np.int64),
            "left": np.zeros(5, dtype=np.int64), "free_all": np.zeros(10, dtype=np.int64)}
    for t in range(10):
        history.add(t % 3, dict(snap, t=t))
    kept = [entry for entries in history.by_key.values() for entry in entries if entry[1] is not None]
    assert history.bytes <= 1000 and len(kept) == 1 and kept[0][0] == 9
    assert [entry[0] for entry in history.earlier(0)] == [0, 3, 6, 9]


def test_a_run_may_change_engine_at_every_stop():
    """The adaptive engine's premise: stretches run by either engine, in any order, leave the
    reference's state at every stop (queues, cores, ports, counters, pending writes)."""
    from wse.host.compiler import replay as engine
    from wse.host.compiler.replay_events import run_events
    for mesh, sizes, batch, depths in [((3, 2), (5, 30, 4), 5, {}), ((1, 3), (4, 30, 3), 4, {}),
                                       ((2, 2), (6, 20, 3), 4, {"router_depth": 1, "rx_depth": 1, "tx_depth": 2})]:
        for name, network, inputs in _phases(mesh, sizes, batch, **depths):
            fast = run_events(network)
            reference = _stops(network, *inputs, engine._run)
            for runs in ([fast, engine._run], [engine._run, fast]):
                assert _same_states(reference, _stops(network, *inputs, runs)), (mesh, name)


def test_the_adaptive_engine_counts_as_the_reference_and_runs_both(instances):
    """The default engine runs stretches on both engines, with the reference's counts."""
    from wse.host.compiler import replay_adaptive
    made = instances(replay_adaptive, "AdaptiveRun")
    for name, network, inputs in _phases((3, 2), (5, 60, 4), 6):
        assert replay(network, *inputs) == replay(network, *inputs, periods=False, engine="reference"), name
    assert made and any(all(n > 0 for n in run.used) for run in made)


def test_the_adaptive_engine_starts_a_new_row_on_the_cheaper_engine():
    """From an op row no engine has run from, the engine cheapest on its latest stretch anywhere runs:
    the slower engine runs once in the first stretches, not once from every new row (a fill that
    passes many rows paid the slow engine's first stretch from each); a row's refresh turns still
    give it the slower engine."""
    import time
    from types import SimpleNamespace

    from wse.host.compiler import replay as engine
    from wse.host.compiler.replay_adaptive import AdaptiveRun

    def engine_costing(seconds):
        def run(routes, ports, ops, queues, cores, events, scalars, limit, watch):
            end = time.thread_time() + seconds
            while time.thread_time() < end:
                pass
            scalars[engine._T] += 10
            return engine._STOPPED
        return run

    ops = np.arange(40, dtype=np.int32).reshape(20, 2)
    cores, scalars = SimpleNamespace(pc=np.zeros(1, np.int64)), np.zeros(64, np.int64)
    run = AdaptiveRun([engine_costing(0.02), engine_costing(0.001)], explore=4)
    for row in range(12):                       # twelve new rows: the slow engine only in the first stretch
        cores.pc[0] = row
        run(None, None, ops, None, cores, None, scalars, 1 << 40, 0)
    assert run.used == [1, 11], run.used
    cores.pc[0] = 5
    for _ in range(4):                          # row 5's 2nd to 5th stretches: the 5th, after 4, refreshes
        run(None, None, ops, None, cores, None, scalars, 1 << 40, 0)
    assert run.used == [2, 14], run.used


def test_phases_replayed_on_threads_count_as_one_at_a_time():
    """The distinct replays of a compile on several threads: the counts of one thread, and of the reference."""
    from wse.host.compiler import cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(_mlp(6, 24, 24, 24, 3), torch.randn(5, 6)), FabricConfig(width=3, height=2), 5)
    threaded = cycles.phase_cycles(exe_plan, progress=False, reuse=False, workers=3)
    assert threaded == cycles.phase_cycles(exe_plan, progress=False, reuse=False, workers=1)
    assert threaded == cycles.phase_cycles(exe_plan, progress=False, reuse=False, periods=False, engine="reference")
    assert list(threaded) == list(exe_plan.phases)


def test_a_state_seen_before_jumps_to_the_state_that_followed_it(monkeypatch):
    """Transitions (a stop's state to the next stop's): a state equal to an earlier one goes on
    at once the way it went, on square, one-row and one-column meshes and uneven token blocks,
    with the reference's counts; and every jump is checked (a replay without them counts the same)."""
    jumped = _spy(monkeypatch, "_jump")
    cases = [((3, 2), (5, 60, 4), 6), ((4, 1), (5, 48, 3), 9), ((1, 3), (4, 45, 3), 5), ((3, 3), (6, 63, 63, 4), 7)]
    counts = {}
    for mesh, sizes, batch in cases:
        for name, network, inputs in _phases(mesh, sizes, batch):
            counts[mesh, name] = replay(network, *inputs)
            assert counts[mesh, name] == replay(network, *inputs, periods=False, engine="reference"), (mesh, name)
    assert any(jumped), "no state jumped to its successor"
    monkeypatch.setattr(replay_periods, "_jump", lambda *args: False)
    assert counts == {(mesh, name): replay(network, *inputs) for mesh, sizes, batch in cases
                      for name, network, inputs in _phases(mesh, sizes, batch)}


def test_kept_transitions_stay_within_their_budget():
    transitions = replay_periods._Transitions(budget=1500)
    snaps = [{"rel": {"fifo": np.zeros(100, dtype=np.int32)}, "pc": np.zeros(10, dtype=np.int64),
              "left": np.zeros(5, dtype=np.int64), "free_all": np.zeros(10, dtype=np.int64), "t": t}
             for t in range(6)]
    for t in range(5):
        transitions.add(t % 2, snaps[t], snaps[t + 1])
    assert transitions.bytes <= 1500 and len(transitions.order) == 2
    assert [a["t"] for a, _ in transitions.earlier(0)] == [4] and [a["t"] for a, _ in transitions.earlier(1)] == [3]


def test_kept_transitions_keep_the_latest_few_whatever_their_bytes():
    transitions = replay_periods._Transitions(budget=0, least=3)
    snaps = [{"rel": {"fifo": np.zeros(100, dtype=np.int32)}, "pc": np.zeros(10, dtype=np.int64),
              "left": np.zeros(5, dtype=np.int64), "free_all": np.zeros(10, dtype=np.int64), "t": t}
             for t in range(8)]
    for t in range(7):
        transitions.add(t % 2, snaps[t], snaps[t + 1])
    assert len(transitions.order) == 3
    assert [a["t"] for a, _ in transitions.earlier(0)] == [6, 4] and [a["t"] for a, _ in transitions.earlier(1)] == [5]


def test_jumps_far_back_are_kept_by_count_when_states_outgrow_the_bytes(monkeypatch):
    """With no bytes for transitions, the latest ``_TRANSITION_STATES`` are kept all the same (a big
    mesh's states outgrow the bytes: the streamed GEMM's last round on 994 rows): the jumps that one
    transition misses come back, with the same counts."""
    jumped = _spy(monkeypatch, "_jump")
    monkeypatch.setattr(replay_periods, "_TRANSITION_BYTES", 0)
    cases = [((3, 2), (5, 60, 4), 6), ((3, 3), (6, 63, 63, 4), 7)]
    found = {}
    for states in (1, 64):
        monkeypatch.setattr(replay_periods, "_TRANSITION_STATES", states)
        jumped.clear()
        counts = [replay(network, *inputs) for mesh, sizes, batch in cases
                  for _, network, inputs in _phases(mesh, sizes, batch)]
        found[states] = (sum(jumped), counts)
    assert found[1][0] == 0 < found[64][0], found
    assert found[1][1] == found[64][1]


def test_a_kept_state_holds_its_counts_in_the_fewest_bytes():
    """Kept states hold values in the smallest integer type that holds them and both queue counts
    of a color in a byte when they fit; a state kept the other way never equals one kept so."""
    small = replay_periods._small
    assert [small(np.array(v, np.int64)).dtype for v in ([0, 127], [-129, 3], [1 << 20], [1 << 40], [])] == \
        [np.int8, np.int16, np.int32, np.int64, np.int8]
    assert np.array_equal(small(np.array([5, -3])), [5, -3])
    rng = np.random.default_rng(0)
    fifo, rx = rng.integers(0, 16, (50, 7)).astype(np.int8), rng.integers(0, 16, (50, 7)).astype(np.int8)
    packed = replay_periods._packed_queues(fifo, rx)
    assert list(packed) == ["queued"] and packed["queued"].nbytes == fifo.nbytes
    assert all(np.array_equal(x, y) for x, y in zip(replay_periods.queue_counts(packed), (fifo, rx)))
    deep = fifo.copy()
    deep[3, 2] = 16             # a FIFO deeper than a nibble: both kept as they are
    apart = replay_periods._packed_queues(deep, rx)
    assert sorted(apart) == ["fifo", "rx"]
    assert all(np.array_equal(x, y) for x, y in zip(replay_periods.queue_counts(apart), (deep, rx)))
    assert sorted(replay_periods._packed_queues(fifo.astype(np.int32), rx.astype(np.int32))) == ["fifo", "rx"]
    deep[3, 2] = fifo[3, 2]
    a, b = {"rel": packed}, {"rel": replay_periods._packed_queues(deep.astype(np.int32), rx.astype(np.int32))}
    assert not replay_periods._same_rel(a, b, list(packed)) and replay_periods._same_rel(a, a, list(packed))


@st.composite
def _deeper_shapes(draw):
    width, height = draw(st.integers(2, 6)), draw(st.integers(2, 6))
    hidden = draw(st.integers(8, 24)) * height           # many rounds: skips, then transitions
    sizes = (draw(st.integers(2, 12)), hidden, hidden, draw(st.integers(2, 12)))
    batch = draw(st.integers(1, 8 * width))
    depths = draw(st.sampled_from([{}, {"router_depth": 1, "rx_depth": 1, "tx_depth": 2}, {"colors": 7},
                                   {"colors": 9}]))
    return (width, height), sizes, batch, depths


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_deeper_shapes())
def test_skips_and_jumps_equal_the_reference_replay_on_random_deeper_shapes(shape):
    """Two hidden layers of many rounds on meshes up to 6x6, other queue depths and color
    counts: skips and transitions (a jump is taken at about one stop in fifteen) give the
    reference replay's count in every phase."""
    mesh, sizes, batch, depths = shape
    for name, network, inputs in _phases(mesh, sizes, batch, **depths):
        assert replay(network, *inputs) == replay(network, *inputs, periods=False, engine="reference"), (shape, name)


def test_a_run_stopped_at_its_cycle_limit_goes_on_to_the_same_count():
    """The reference engine keeps its counters when it reaches its cycle limit (the idle skip
    included), so a run stepped in strides of a few cycles (``bench/column_shift.py`` steps
    one) ends with the count and the state of one run; square, one-row and one-column
    meshes, uneven token blocks."""
    from wse.host.compiler.replay import (_FINISHED, _LAST, _OUT_OF_TIME, _T, _edge_ports, _new_scalars,
                                          _new_state, _run)
    stops = 0
    for mesh, sizes, batch in (((2, 2), (6, 24, 3), 5), ((3, 1), (5, 12, 3), 7), ((1, 3), (4, 15, 3), 4)):
        for name, network, (ops, starts, ends, inject) in _phases(mesh, sizes, batch):
            routes, ports = network.routes(), _edge_ports(network, inject)
            starts = starts.astype(np.int64)
            ops32 = np.ascontiguousarray(ops, dtype=np.int32)
            one, stepped = _new_state(routes, ports, starts), _new_state(routes, ports, starts)
            whole = _new_scalars(starts, ports, -1)
            assert _run(routes, ports, ops32, *one, whole, 1 << 40, -1) == _FINISHED
            ports = _edge_ports(network, inject)           # the run took the wavelets out of the first
            scalars = _new_scalars(starts, ports, -1)
            while True:
                status = _run(routes, ports, ops32, *stepped, scalars, int(scalars[_T]) + 3, -1)
                if status != _OUT_OF_TIME:
                    break
                stops += 1
            assert status == _FINISHED, name
            assert scalars[_LAST] == whole[_LAST] and scalars[_LAST] + 1 == replay(network, ops, starts, ends, inject)
            for a, b in zip(one[:2], stepped[:2]):
                assert all(np.array_equal(x, y) for x, y in zip(a, b)), name
    assert stops > 100
