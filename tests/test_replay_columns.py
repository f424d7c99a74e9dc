"""The reduced replay of a phase's first columns (:mod:`~wse.host.compiler.replay_columns`)
against the full reference replay (every cycle, every router and PE, no skips) and the
golden model: the same count and the same last cycle of every PE, on square, non-square,
one-row and one-column meshes and uneven token blocks; a failed check is tried again from
further east, or falls back to the full replay, with the same count.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compile_speed import mlp

from wse.config import FabricConfig
from wse.firmware.training.timing import BUSY
from wse.host.compiler import compile_model, replay_columns, replay_periods, trace
from wse.host.compiler.cycles import Network, phase_injections, phase_ops
from wse.host.compiler.replay import _GRANT, run_replay
from wse.host.compiler.replay_state import new_events
from wse.host.compiler.weight_streaming import plan
from wse.host.runtime import Runtime
from wse.host.runtime.golden import GoldenBackend


@pytest.fixture
def paths(monkeypatch):
    """What each reduced replay did (``info["path"]``, :func:`~.replay_columns.reduced_replay`)."""
    seen = []
    real = replay_columns.reduced_replay

    def spy(*args, **kwargs):
        info = {}
        result = real(*args, info=info, **kwargs)
        seen.append(info)
        return result
    monkeypatch.setattr(replay_columns, "reduced_replay", spy)
    return seen


def _phases(mesh, sizes, batch, **config):
    torch.manual_seed(0)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **config)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])), cfg, batch)
    network = Network(cfg, exe_plan.routes)
    return network, {name: (*phase_ops(exe_plan, phase), phase_injections(phase))
                     for name, phase in exe_plan.phases.items()}


def _reference(network, ops, starts, ends, inject):
    return run_replay(network, ops, starts, ends, inject, periods=False, engine="reference", columns=False)


def _assert_same(network, inputs, name):
    count, exits = run_replay(network, *inputs)
    full, full_exits = _reference(network, *inputs)
    assert count == full, name
    assert np.array_equal(exits, full_exits), name


# mesh (W, H), layer sizes, batch: square and non-square, one row, one column, uneven token
# blocks (43 tokens on 20 columns: 3, 3, 3, 2, ...; 12 on 11: 2, 1, 1, ...).
MESHES = [
    ((12, 3), (8, 48, 36, 3), 24),
    ((10, 1), (5, 24, 20, 3), 20),
    ((20, 2), (5, 48, 40, 3), 43),
    ((11, 4), (7, 32, 28, 5), 12),
    ((1, 12), (4, 24, 24, 3), 5),
]


@pytest.mark.parametrize("mesh,sizes,batch", MESHES, ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in MESHES])
def test_the_reduced_replay_equals_the_full_replay(mesh, sizes, batch, paths):
    network, phases = _phases(mesh, sizes, batch)
    for name, inputs in phases.items():
        _assert_same(network, inputs, name)
    taken = [p["path"] for p in paths]
    if mesh[0] >= 10:
        assert "reduced" in taken, taken
    else:
        assert set(taken) == {"no shape"}


def test_the_reduced_replay_skips_and_jumps_with_its_delay_line(paths, monkeypatch):
    """Weight gradients whose reduced replay skips periods and jumps transitions (the delay
    line carried over both): the counts and last cycles are the full replay's."""
    taken = []
    real_skip, real_jump = replay_periods._skip, replay_periods._jump

    def skip(first, second, *args, **kwargs):
        m = real_skip(first, second, *args, **kwargs)
        if m and "line" in second["rel"]:
            taken.append("skip")
        return m

    def jump(transitions, key, now, *args):
        jumped = real_jump(transitions, key, now, *args)
        if jumped and "line" in now["rel"]:
            taken.append("jump")
        return jumped
    monkeypatch.setattr(replay_periods, "_skip", skip)
    monkeypatch.setattr(replay_periods, "_jump", jump)
    for mesh, sizes, batch, kind in (((10, 2), (4, 160, 160, 3), 10, "skip"), ((10, 16), (8, 128, 128, 3), 20, "jump")):
        taken.clear()
        network, phases = _phases(mesh, sizes, batch)
        _assert_same(network, phases["bwd-weight 2"], "bwd-weight 2")
        assert paths[-1]["path"] == "reduced" and kind in taken, (mesh, taken)


def _retimed(ops, starts, ends, width, column, cycles, at=0.75):
    """The phase with the op lists of ``column``'s PEs retimed ``at`` of the way through them
    (a copy; the other PEs unchanged): ``cycles > 0`` private cycles inserted there, or the
    next private cycles from there ``-cycles`` shorter (at least 0)."""
    ops, starts, ends = ops.copy(), starts.copy(), ends.copy()
    extra = []
    size = ops.shape[0]
    for p in range(column, starts.shape[0], width):
        rows = ops[starts[p]:ends[p]].copy()
        k = int((ends[p] - starts[p]) * at)
        if cycles > 0:
            busy = np.zeros((1, ops.shape[1]), dtype=ops.dtype)
            busy[0, 0], busy[0, 1] = BUSY, cycles
            rows = np.concatenate([rows[:k], busy, rows[k:]])
        else:
            later = np.flatnonzero(rows[k:, 0] == BUSY)
            if later.size:
                rows[k + later[0], 1] = max(0, rows[k + later[0], 1] + cycles)
        extra.append(rows)
        starts[p], ends[p] = size, size + rows.shape[0]
        size = ends[p]
    return np.concatenate([ops] + extra), starts, ends


def test_a_failed_check_falls_back_to_the_full_replay(paths):
    """Column 0 delayed late in the phase: the columns east of it follow it (their stream is
    its stream, delayed), so the rule still holds and the reduced replay counts it. Column 0
    made early instead (its private cycles cut) floods column 1 (a FIFO fed from the west
    fills): the check fails and the count is the full replay's."""
    network, phases = _phases((12, 2), (6, 48, 40, 3), 24)
    ops, starts, ends, inject = phases["bwd-weight 2"]
    plain = _reference(network, ops, starts, ends, inject)[0]
    for cycles, path in ((7, "reduced"), (-40, "check failed")):
        changed = _retimed(ops, starts, ends, 12, 0, cycles)
        _assert_same(network, (*changed, inject), cycles)
        assert paths[-1]["path"] == path, cycles
        if cycles > 0:      # the delay reaches the phase's end
            assert _reference(network, *changed, inject)[0] == plain + cycles


@pytest.mark.parametrize("height,colors", [(3, 16), (3, 7), (5, 16), (4, 7)])
def test_a_try_from_further_east_replays_the_west_columns_transient(height, colors, paths, monkeypatch):
    """Column 0 made early floods column 1: the first try's check fails there, and a try from
    column 2 on (the same ``T``) replays columns 0 and 1 exactly, rotation-dependent grants
    in them included (nothing copies those columns), and copies the rest: the count and
    last cycles are the full replay's."""
    conflicts = []
    real = replay_periods.run_with_periods

    def spy(*args, **kwargs):
        result = real(*args, **kwargs)
        conflicts.append(int(args[10][replay_periods._CONFLICTS]))
        return result
    monkeypatch.setattr(replay_periods, "run_with_periods", spy)
    network, phases = _phases((24, height), (6, 48, 40, 3), 48, colors=colors)
    ops, starts, ends, inject = phases["bwd-weight 2"]
    changed = _retimed(ops, starts, ends, 24, 0, -40)
    _assert_same(network, (*changed, inject), "bwd-weight 2")
    assert paths[-1]["path"] == "reduced" and paths[-1]["tries"] == [(1, 1)] and paths[-1]["a"] == 2, paths[-1]
    if height == 3:
        assert conflicts[-1] > 0, conflicts      # the accepted try had rotation-dependent grants, west of a
    with monkeypatch.context() as patch:         # on a mesh too narrow for a second try: the full replay's count
        patch.setattr(replay_columns, "_RETRY_RATIO", 5)
        _assert_same(network, (*changed, inject), "bwd-weight 2")
        assert paths[-1]["path"] == "check failed" and paths[-1]["tries"] == [(1, 1)], paths[-1]


@pytest.mark.slow
def test_a_tall_mesh_whose_wrap_rows_break_the_first_tries(paths):
    """32x400 (8 tokens a column and 4 or 5 features a row, as on the wafer): the weight
    gradients' grants at the rows the column ring's wrap crosses depend on the rotation for
    a while in the west columns only, so the first tries fail and one from further east
    counts the phase: the count and every PE's last cycle are the full replay's (with its
    period search, itself proven equal to the reference in ``test_replay_periods.py``)."""
    network, phases = _phases((32, 400), (1640, 1640, 1640, 10), 256)
    ops, starts, ends, inject = phases["bwd-weight 2"]
    count, exits = run_replay(network, ops, starts, ends, inject)
    assert paths[-1]["path"] == "reduced" and paths[-1]["a"] > 1 and paths[-1]["tries"], paths[-1]
    full, full_exits = run_replay(network, ops, starts, ends, inject, columns=False)
    assert count == full and np.array_equal(exits, full_exits)


@pytest.mark.parametrize("colors", [8, 16, 32])
def test_the_delay_line_keeps_every_color(colors):
    """The sends east kept for the delay line (``_Window.sends``) hold every color as its bit,
    up to the top one (the events hold colors as int8, where a shift loses color 7 and up)."""
    network, _ = _phases((12, 2), (6, 48, 40, 3), 24, colors=colors)
    window = replay_columns._Window(network, 1, 4, np.zeros(24, dtype=np.int64))
    window.east[:] = True                        # every route sends east: each grant is a send
    events = new_events(64)
    picked = [(r, c) for r, c in zip(range(0, 24, 3), range(colors - 1, -1, -1))]
    for r, c in picked:
        events.who[_GRANT, events.count[_GRANT]], events.color[_GRANT, events.count[_GRANT]] = r, c
        events.count[_GRANT] += 1
    sends = window.sends(0, events)
    expected = np.zeros((2, 12), dtype=np.int64)
    for r, c in picked:
        expected[r // 12, r % 12] |= 1 << c
    assert sends.shape == (2, 12) and np.array_equal(sends.astype(np.int64), expected)


@st.composite
def _shapes(draw):
    width, height = draw(st.integers(10, 14)), draw(st.integers(1, 3))
    hidden = draw(st.integers(4, 16)) * height
    sizes = (draw(st.integers(2, 9)), hidden, draw(st.integers(2, 5)))
    batch = draw(st.integers(width, 4 * width))                  # uneven token blocks too
    change = draw(st.sampled_from([None, (0, 3), (0, -30), (1, 5), (width - 1, 2)]))  # a column retimed, or none
    return (width, height), sizes, batch, change, draw(st.floats(0.1, 0.9))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shapes())
def test_the_reduced_replay_equals_the_full_replay_on_random_shapes(shape):
    """Random shapes, some with a column retimed; the shift is looked for from cycle 32 on
    (any ``T`` is a valid start: the rule checks it), so short phases take the reduced replay too."""
    mesh, sizes, batch, change, at = shape
    network, phases = _phases(mesh, sizes, batch)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay_columns, "_STARTS", tuple(32 << k for k in range(12)))
        patch.setattr(replay_columns, "_RETRY_RATIO", 2)          # tries from further east on these narrow meshes
        for name, (ops, starts, ends, inject) in phases.items():
            if change is not None and name.startswith("bwd-weight"):
                ops, starts, ends = _retimed(ops, starts, ends, mesh[0], change[0], change[1], at)
            _assert_same(network, (ops, starts, ends, inject), (shape, name))


def test_the_reduced_replay_equals_golden_cycles(paths):
    """A compile whose three weight-gradient phases take the reduced replay: their cycles are
    the golden model's (the fabric's timing does not depend on data, so the golden model runs
    those phases alone)."""
    batch, mesh = 24, (12, 4)
    torch.manual_seed(0)
    exe = compile_model(mlp(5, 96, 64, 3), torch.randn(batch, 5), batch=batch,
                        config=FabricConfig(width=mesh[0], height=mesh[1]))
    assert [p["path"] for p in paths].count("reduced") == 3, paths
    backend = GoldenBackend(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, 5)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, 3, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    for name in exe.sequences["train"]:
        if name.startswith("bwd-weight"):
            assert backend.run_phase(name, weights, {}) == exe.phases[name].cycles, name


def test_the_deepest_queues_count_in_int8():
    """The replay keeps queue counts in int8 (:func:`~.replay_state._new_state`); the deepest
    queues a ``FabricConfig`` allows (64) count as the full reference replay does."""
    torch.manual_seed(0)
    cfg = FabricConfig(width=3, height=2, rx_depth=64, router_depth=64, tx_depth=64)
    exe_plan = plan(trace(mlp(5, 24, 3), torch.randn(48, 5)), cfg, 48)
    network = Network(cfg, exe_plan.routes)
    for name, phase in exe_plan.phases.items():
        _assert_same(network, (*phase_ops(exe_plan, phase), phase_injections(phase)), name)
    with pytest.raises(Exception, match="rx_depth must be an integer in 1..64"):
        FabricConfig(rx_depth=65)


def test_no_shift_at_any_start_goes_on_with_the_full_replay(paths, monkeypatch):
    """Where no start ``T`` shows the shift (here only cycle 40 is tried, before the columns'
    skew has set in), the full replay goes on from there with the period search: the count
    and last cycles of the full replay from cycle 0."""
    monkeypatch.setattr(replay_columns, "_STARTS", (40,))
    network, phases = _phases((12, 2), (6, 48, 40, 3), 24)
    _assert_same(network, phases["bwd-weight 2"], "bwd-weight 2")
    assert paths[-1]["path"] == "no shift"


def test_two_hidden_layers_on_one_row_end_with_golden_cycles():
    """A plan once reported to hang (10x1, 6-20-16-3, batch 30: uneven token blocks of 3 on
    one row, two hidden layers): every phase ends, the default replay's count and last cycles
    equal the full reference replay's, and the compiled cycles equal the golden model's."""
    batch, sizes = 30, (6, 20, 16, 3)
    network, phases = _phases((10, 1), sizes, batch)
    for name, inputs in phases.items():
        _assert_same(network, inputs, name)
    torch.manual_seed(0)
    exe = compile_model(mlp(*sizes), torch.randn(batch, sizes[0]), batch=batch,
                        config=FabricConfig(width=10, height=1))
    backend = GoldenBackend(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, sizes[-1], batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    for name in exe.sequences["train"]:
        assert backend.run_phase(name, weights, {}) == exe.phases[name].cycles, name
