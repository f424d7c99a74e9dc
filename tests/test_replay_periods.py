"""The cycle model's fast paths against the reference replay (every cycle,
every router and PE visited): skipped periods over random shapes; a repeat
taken the moment its state comes back (the kept states of
:class:`~wse.host.compiler.replay_periods._History`); runs that change
engine at any stop (:mod:`~wse.host.compiler.replay_adaptive`); phases
replayed on several threads. The same counts every time.
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
    taken = []
    real = replay_periods._look_back

    def spy(*args):
        skipped = real(*args)
        taken.append(skipped)
        return skipped
    monkeypatch.setattr(replay_periods, "_look_back", spy)
    phases = list(_phases((3, 2), (5, 60, 4), 6))
    counts = [replay(network, *inputs) for _, network, inputs in phases]
    assert any(taken), "no repeat was skipped on its state's return"
    monkeypatch.setattr(replay_periods, "_SNAPSHOT_BYTES", 0)      # only the latest state kept
    assert counts == [replay(network, *inputs) for _, network, inputs in phases]
    assert counts == [replay(network, *inputs, periods=False, engine="reference") for _, network, inputs in phases]


def test_kept_states_stay_within_their_budget():
    history = replay_periods._History(budget=1000)
    snap = {"rel": {"fifo": np.zeros(100, dtype=np.int32)}, "pc": np.zeros(10, dtype=np.int64),
            "left": np.zeros(5, dtype=np.int64)}
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


def test_the_adaptive_engine_counts_as_the_reference_and_runs_both(monkeypatch):
    """The default engine runs stretches on both engines, with the reference's counts."""
    from wse.host.compiler import replay_adaptive
    made = []

    class Spy(replay_adaptive.AdaptiveRun):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)
    monkeypatch.setattr(replay_adaptive, "AdaptiveRun", Spy)
    for name, network, inputs in _phases((3, 2), (5, 60, 4), 6):
        assert replay(network, *inputs) == replay(network, *inputs, periods=False, engine="reference"), name
    assert made and any(all(n > 0 for n in run.used) for run in made)


def test_phases_replayed_on_threads_count_as_one_at_a_time():
    """The distinct replays of a compile on several threads: the counts of one thread, and of the reference."""
    from wse.host.compiler import cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(_mlp(6, 24, 24, 24, 3), torch.randn(5, 6)), FabricConfig(width=3, height=2), 5)
    threaded = cycles.phase_cycles(exe_plan, progress=False, reuse=False, workers=3)
    assert threaded == cycles.phase_cycles(exe_plan, progress=False, reuse=False, workers=1)
    assert threaded == cycles.phase_cycles(exe_plan, progress=False, reuse=False, periods=False, engine="reference")
    assert list(threaded) == list(exe_plan.phases)
