"""The static cycle model's fast path: skipping proven periods of the replay
gives the same cycles as the full replay and as the golden model; a replay
that can never finish reports a hang at once, as the golden model does.
"""

import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wse.config import FabricConfig, Port
from wse.firmware.training.timing import END
from wse.host.compiler import compile_model, replay_periods, trace
from wse.host.compiler.cycles import Network, phase_ops, phase_injections, replay
from wse.host.compiler.weight_streaming import plan
from wse.host.runtime import Runtime
from wse.host.runtime.golden import GoldenBackend
from wse.sim.golden import Fabric, FabricHang
from mlps import mlp


def _full(network, ops, starts, ends, inject):
    """The reference: every cycle replayed by the reference engine."""
    return replay(network, ops, starts, ends, inject, periods=False, engine="reference")


@pytest.fixture
def skips(monkeypatch):
    """The periods the fast path skipped, as (period cycles, repeats)."""
    taken = []
    real = replay_periods._skip

    def spy(first, second, *args):
        m = real(first, second, *args)
        if m:
            taken.append((second["t"] - first["t"], m))
        return m
    monkeypatch.setattr(replay_periods, "_skip", spy)
    return taken


# mesh (W, H), layer sizes, batch: square and non-square meshes, one row, one
# column, uneven token blocks (7 tokens on 3 columns: 3, 2, 2), fewer tokens than columns.
MESHES = [
    ((2, 2), (6, 48, 40, 3), 8),
    ((3, 2), (5, 36, 30, 4), 7),
    ((2, 3), (7, 45, 39, 5), 6),
    ((4, 1), (5, 24, 20, 3), 9),
    ((1, 3), (4, 30, 33, 3), 5),
    ((5, 2), (6, 32, 26, 3), 3),
]


@pytest.mark.parametrize("mesh,sizes,batch", MESHES, ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in MESHES])
def test_fast_path_equals_the_full_replay(mesh, sizes, batch, skips):
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])),
                    FabricConfig(width=mesh[0], height=mesh[1]), batch)
    network = Network(exe_plan.config, exe_plan.routes)
    for name, phase in exe_plan.phases.items():
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        fast = replay(network, ops, starts, ends, inject)
        assert fast == _full(network, ops, starts, ends, inject), name
        assert fast == replay(network, ops, starts, ends, inject, engine="reference"), name
        assert fast == replay(network, ops, starts, ends, inject, periods=False), name
    assert skips, "no period was skipped: the fast path was not exercised"


def test_fast_path_equals_golden_cycles(skips):
    """A phase of many rounds: the skipped replay's cycles are the golden model's, phase by phase."""
    batch, mesh = 6, (3, 2)
    torch.manual_seed(0)
    model = mlp(5, 40, 4)
    exe = compile_model(model, torch.randn(batch, 5), batch=batch,
                        config=FabricConfig(width=mesh[0], height=mesh[1]))
    assert skips
    backend = GoldenBackend(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, 5)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, 4, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    for name in exe.sequences["train"]:
        assert backend.run_phase(name, weights, {}) == exe.phases[name].cycles, name


def test_the_rotation_phase_is_checked(monkeypatch):
    """With every grant counted as depending on the color rotation, only periods
    that are multiples of ``colors`` are skipped, and the counts stay exact."""
    periods = []
    real = replay_periods._skip

    def spy(first, second, *args):
        m = real(first, second, *args)
        if m:
            periods.append(second["t"] - first["t"])
        return m
    monkeypatch.setattr(replay_periods, "_skip", spy)
    monkeypatch.setattr(replay_periods, "_same", lambda a, b: all(
        np.array_equal(a["rel"][k], b["rel"][k]) for k in a["rel"]))
    torch.manual_seed(0)
    config = FabricConfig(width=2, height=2, colors=7)
    exe_plan = plan(trace(mlp(6, 60, 3), torch.randn(4, 6)), config, 4)
    network = Network(config, exe_plan.routes)
    for phase in exe_plan.phases.values():
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        assert replay(network, ops, starts, ends, inject) == _full(network, ops, starts, ends, inject)
    assert periods and all(p % 7 == 0 for p in periods)


# Hangs ---------------------------------------------------------------------------------

def _idle_ops(config):
    n = config.width * config.height
    return np.array([(END, 0, 0, 0, 0, 0)], dtype=np.int64), np.zeros(n, np.int64), np.ones(n, np.int64)


def _golden_hangs(config, routes, edge, index, color, n):
    fab = Fabric(config)
    fab.load_routes(routes)
    fab.stream_in(edge, index, color, np.arange(n, dtype=np.uint32))
    with pytest.raises(FabricHang):
        fab.run(max_cycles=10_000)


@pytest.mark.parametrize("periods", [True, False])
def test_wavelets_that_can_never_enter_the_fabric_are_a_hang(periods):
    """An edge port holding wavelets of a color no route takes from it: the
    golden model reports a hang, and so does the replay, at once (not after ``limit``)."""
    config = FabricConfig(width=2, height=2, colors=4)
    routes = [(0, 0, 2, Port.W, (Port.RAMP,))]           # color 2 is routed from W; color 1 is not
    _golden_hangs(config, routes, "W", 0, 1, 3)
    ops, starts, ends = _idle_ops(config)
    began = time.perf_counter()
    with pytest.raises(RuntimeError, match="hung"):
        replay(Network(config, routes), ops, starts, ends, {("W", 0): {1: 3}}, periods=periods)
    assert time.perf_counter() - began < 5


@pytest.mark.parametrize("engine", ["reference", "events", "adaptive"])
@pytest.mark.parametrize("periods", [True, False])
def test_wavelets_held_for_good_in_the_fabric_are_a_hang_at_once(engine, periods):
    """Wavelets delivered to a PE that never takes them back up into the router's FIFO
    and the edge port: nothing can move again (the golden model hangs). The replay reports
    the hang at once with its default limit (it used to step to ``limit``, 2**40 cycles)."""
    config = FabricConfig(width=2, height=1, colors=4, rx_depth=1, router_depth=1)
    routes = [(0, 0, 1, Port.W, (Port.RAMP,))]
    _golden_hangs(config, routes, "W", 0, 1, 6)
    ops, starts, ends = _idle_ops(config)
    began = time.perf_counter()
    with pytest.raises(RuntimeError, match="hung"):
        replay(Network(config, routes), ops, starts, ends, {("W", 0): {1: 6}}, periods=periods, engine=engine)
    assert time.perf_counter() - began < 30        # numba compiles included


@pytest.mark.parametrize("engine", ["reference", "events"])
def test_a_hang_after_a_pe_wakes_only_to_wait_is_reported_at_once(engine):
    """A wavelet held for good while a PE is in private cycles: the stretch is not a hang while
    that PE may still go on, and it is one once it woke and only waited (the check used to run
    once a stretch, and such a replay stepped to its limit: 2**40 cycles by default)."""
    from wse.firmware.training.timing import BUSY, RECV, VEC
    network = Network(FabricConfig(width=2, height=1), [])
    ops = np.array([[VEC, 1, -1, -1, 0, 0], [END, 0, 0, 0, 0, 0],       # PE 0: an element with no route
                    [BUSY, 5, 0, 0, 0, 0], [RECV, 0, 0, 0, 0, 0], [END, 0, 0, 0, 0, 0]],     # PE 1: waits
                   np.int32)
    began = time.perf_counter()
    with pytest.raises(RuntimeError, match="hung"):
        replay(network, ops, np.array([0, 2]), np.array([2, 5]), {}, limit=10**8, periods=False, engine=engine)
    assert time.perf_counter() - began < 30        # numba compiles included; 10**8 cycles take minutes


def test_wavelets_left_in_an_input_queue_are_a_hang():
    """Wavelets delivered to a PE that never takes them: the golden model hangs, so does the replay."""
    config = FabricConfig(width=2, height=1, colors=4, rx_depth=4)
    routes = [(0, 0, 1, Port.W, (Port.RAMP,))]
    _golden_hangs(config, routes, "W", 0, 1, 2)
    ops, starts, ends = _idle_ops(config)
    with pytest.raises(RuntimeError, match="hung"):
        replay(Network(config, routes), ops, starts, ends, {("W", 0): {1: 2}})


# Cycles on demand ----------------------------------------------------------------------

def test_a_compile_without_cycles_gets_them_later_from_the_executable():
    from wse.host.compiler.codegen import generate
    from wse.host.compiler.cycles import executable_cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(5, 24, 20, 3), torch.randn(7, 5)), FabricConfig(width=3, height=2), 7)
    full = generate(exe_plan)
    bare = generate(exe_plan, cycles=False)
    assert all(phase.cycles == 0 for phase in bare.phases.values())
    assert executable_cycles(bare) == {name: phase.cycles for name, phase in full.phases.items()}
    assert all(full.phases[name].cycles > 0 for name in full.phases)


def test_progress_is_quiet_when_quick_and_writes_lines_off_a_terminal():
    import io

    from wse.host.compiler.progress import Progress
    quiet = io.StringIO()
    with Progress("cycle model", 3, stream=quiet) as bar:
        for name in "abc":
            bar.step(name)
    assert quiet.getvalue() == ""
    log = io.StringIO()
    with Progress("cycle model", 3, after=0, every=0, stream=log) as bar:
        for name in ("fwd fc1", "loss", "bwd fc1"):
            bar.step(name)
    assert log.getvalue().splitlines()[0].startswith("cycle model: 1/3 fwd fc1 (")
    assert len(log.getvalue().splitlines()) == 3


# Reuse of equal phases, inner rounds, cycles=False --------------------------------------

def test_phases_of_equal_inputs_are_replayed_once_with_the_same_counts():
    """The hidden layers of equal widths share their replays; every count equals the full replay's."""
    from wse.host.compiler.cycles import ReplayMemo, phase_cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(6, 24, 24, 24, 3), torch.randn(5, 6)), FabricConfig(width=3, height=2), 5)
    memo = ReplayMemo()
    network = Network(exe_plan.config, exe_plan.routes)
    counts = {}
    for name, phase in exe_plan.phases.items():
        ops, starts, ends = phase_ops(exe_plan, phase)
        counts[name] = memo.cycles(network, ops, starts, ends, phase_injections(phase))
    assert memo.hits >= 3                       # fwd, bwd-data and bwd-weight of the equal hidden layers
    assert counts == phase_cycles(exe_plan, periods=False, reuse=False, progress=False, engine="reference")
    # a phase whose inputs differ in one op row is not taken from the memo
    name, phase = next(iter(exe_plan.phases.items()))
    ops, starts, ends = phase_ops(exe_plan, phase)
    changed = ops.copy()
    busy = int(np.flatnonzero(changed[:, 0] != END)[0])         # the first op row that is not an END
    changed[busy, 1] += 50
    hits = memo.hits
    memo.cycles(network, changed, starts, ends, phase_injections(phase))
    assert memo.hits == hits


def test_weight_gradient_phases_skip_repeats_inside_a_rotation_step(skips):
    """The weight gradients' rounds are the rotation steps; the repeats inside one are skipped, exactly."""
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(8, 96, 4), torch.randn(6, 8)), FabricConfig(width=3, height=3), 6)
    network = Network(exe_plan.config, exe_plan.routes)
    for name in [n for n in exe_plan.phases if n.startswith("bwd-weight")]:
        phase = exe_plan.phases[name]
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        assert replay(network, ops, starts, ends, inject) == _full(network, ops, starts, ends, inject), name
    assert skips, "no repeat inside a weight-gradient rotation step was skipped"


def test_compile_model_without_cycles():
    from wse.host.compiler.cycles import executable_cycles
    torch.manual_seed(0)
    model, example = mlp(5, 24, 3), torch.randn(4, 5)
    config = FabricConfig(width=2, height=2)
    bare = compile_model(model, example, config=config, batch=4, cycles=False)
    full = compile_model(model, example, config=config, batch=4)
    assert all(phase.cycles == 0 for phase in bare.phases.values())
    assert executable_cycles(bare, reuse=False) == {name: phase.cycles for name, phase in full.phases.items()}
    assert [r for r in bare.routes] == [r for r in full.routes]


# The fast engine (replay_events) against the reference engine -------------------------

def _fresh(network, ops, starts, inject, watch):
    """A fresh replay's arguments: ``routes, ports, ops, queues, cores, events, scalars``."""
    from wse.host.compiler import replay as engine
    routes = network.routes()
    ports = engine._edge_ports(network, inject)
    starts, ops = starts.astype(np.int64), np.ascontiguousarray(ops, dtype=np.int64)
    queues, cores, events = engine._new_state(routes, ports, starts)
    return routes, ports, ops, queues, cores, events, engine._new_scalars(starts, ports, watch)


def _taken(status, ports, queues, cores, events, scalars):
    """A stop's status and a copy of the whole replay state (pending writes sorted)."""
    from wse.host.compiler import replay as engine
    n = events.count[engine._WRITE]
    writes = sorted(zip(events.who[engine._WRITE, :n].tolist(), events.color[engine._WRITE, :n].tolist()))
    return status, [a.copy() for a in (*queues, *cores, ports.left, scalars)], writes


def _stops(network, ops, starts, ends, inject, run):
    """The whole replay state at every op row of the PE with the longest list, until the end
    (``run`` may be a list of engines: the ``k``-th stretch then runs on ``run[k % len(run)]``)."""
    from wse.host.compiler import replay as engine
    watch = int(np.argmax(ends - starts))
    routes, ports, ops, queues, cores, events, scalars = _fresh(network, ops, starts, inject, watch)
    out = []
    while True:
        step = run[len(out) % len(run)] if isinstance(run, list) else run
        status = step(routes, ports, ops, queues, cores, events, scalars, 1 << 40, watch)
        out.append(_taken(status, ports, queues, cores, events, scalars))
        if status != engine._STOPPED:
            return out
        scalars[engine._SEEN_PC] = cores.pc[watch] + 1


def _same_states(a, b) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and x[2] == y[2] and all(np.array_equal(u, v) for u, v in
                                                                          zip(x[1], y[1])) for x, y in zip(a, b))


# mesh, sizes, batch, queue depths and colors: the meshes above, shallow queues, 7 colors
ENGINE_CASES = MESHES[:5] + [((3, 2), (5, 20, 3), 6, {"router_depth": 1, "rx_depth": 1, "tx_depth": 2}),
                             ((2, 2), (6, 30, 3), 4, {"colors": 7})]


@pytest.mark.parametrize("case", ENGINE_CASES, ids=[f"{c[0][0]}x{c[0][1]}-b{c[2]}" + ("-d" if len(c) > 3 else "")
                                                    for c in ENGINE_CASES])
def test_the_fast_engine_leaves_the_reference_state_at_every_op_row(case):
    """Both engines, stopped at every op row of one PE of every phase: the same
    queues, cores, edge ports, counters (conflicts too) and pending writes."""
    from wse.host.compiler import replay as engine
    from wse.host.compiler.replay_events import run_events
    mesh, sizes, batch, depths = (*case, {})[:4]
    torch.manual_seed(0)
    config = FabricConfig(width=mesh[0], height=mesh[1], **depths)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])), config, batch)
    network = Network(config, exe_plan.routes)
    fast = run_events(network)
    stops = 0
    for name, phase in exe_plan.phases.items():
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        reference = _stops(network, ops, starts, ends, inject, engine._run)
        assert _same_states(reference, _stops(network, ops, starts, ends, inject, fast)), name
        assert replay(network, ops, starts, ends, inject) == _full(network, ops, starts, ends, inject), name
        stops += len(reference)
    assert stops > 10 * len(exe_plan.phases)


def _limits(network, ops, starts, inject, run, step):
    """The whole replay state each time a run with the cycle limit raised by ``step`` stops, to the end."""
    from wse.host.compiler import replay as engine
    routes, ports, ops, queues, cores, events, scalars = _fresh(network, ops, starts, inject, -1)
    out = []
    while True:
        status = run(routes, ports, ops, queues, cores, events, scalars, int(scalars[engine._T]) + step, -1)
        out.append(_taken(status, ports, queues, cores, events, scalars))
        if status != engine._OUT_OF_TIME:
            return out


@pytest.mark.parametrize("step", [1, 7, 100])
def test_the_fast_engine_stops_at_a_cycle_limit_as_the_reference(step):
    """Both engines run to a cycle limit again and again: the same status, queues, cores, edge
    ports, counters and pending writes at every stop, idle skips past the limit included. (The fast engine used to report a hang where the next
    PE to go on was past the limit, and to leave its counters unwritten at the limit.)"""
    from wse.host.compiler import replay as engine
    from wse.host.compiler.replay_events import run_events
    torch.manual_seed(0)
    config = FabricConfig(width=4, height=3)
    exe_plan = plan(trace(mlp(5, 24, 3), torch.randn(6, 5)), config, 6)
    network = Network(config, exe_plan.routes)
    fast = run_events(network)
    for name, phase in exe_plan.phases.items():
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        reference = _limits(network, ops, starts, inject, engine._run, step)
        assert reference[-1][0] == engine._FINISHED and len(reference) >= 2, name
        assert _same_states(reference, _limits(network, ops, starts, inject, fast, step)), (name, step)


def test_the_fast_engine_counts_the_sparse_gemm_and_the_layer_pipeline_as_the_reference(monkeypatch):
    """The other users of the replay: the sparse GEMM's timing and the layer-pipelined phases."""
    from wse.firmware.kernels import get_kernel
    from wse.firmware.kernels.spgemm import sparse_mask
    from wse.firmware.kernels.spgemm_timing import timing_ops
    from wse.host.compiler import pipelined, pipelined_cycles
    from wse.host.compiler import replay as engine
    config = FabricConfig(width=4, height=3)
    kernel = get_kernel("spgemm")
    sparse = kernel.plan(config, kernel.resolve(config, {"rows": 24, "cols": 24, "n": 8, "sparsity": 0.7}))
    routes, ops, starts, ends, inject = timing_ops(sparse, sparse_mask(24, 24, 0.7, np.random.default_rng(0)))
    network = Network(config, routes)
    fast = replay(network, ops, starts, ends, inject)
    assert fast == _full(network, ops, starts, ends, inject) > 0
    torch.manual_seed(0)
    layered = pipelined.plan(trace(mlp(20, 12, 9, 7), torch.zeros(1, 20)), FabricConfig(width=5, height=4), 5)
    counts = pipelined_cycles.phase_cycles(layered)
    monkeypatch.setattr(engine, "DEFAULT_ENGINE", "reference")
    assert counts == pipelined_cycles.phase_cycles(layered)


# Closing private cycles (cycles.closing_cycles): phases equal but for them share one replay -----

@pytest.mark.parametrize("mesh,sizes,batch", MESHES, ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in MESHES])
def test_a_count_from_the_replay_without_closing_cycles_equals_the_full_replay(mesh, sizes, batch):
    """Every phase's count from the replay of its inputs without the closing private cycles
    (and each PE's last cycle there) equals the full replay of the phase as it is."""
    from wse.host.compiler.cycles import ReplayMemo, closing_cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])),
                    FabricConfig(width=mesh[0], height=mesh[1]), batch)
    network = Network(exe_plan.config, exe_plan.routes)
    memo, closed = ReplayMemo(), 0
    for name, phase in exe_plan.phases.items():
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        open_ops, closing = closing_cycles(ops, starts, ends)
        closed += int((closing > 0).sum())
        assert (open_ops[:, 0] == ops[:, 0]).all() and int((ops[:, 1] - open_ops[:, 1]).sum()) >= closing.max()
        assert memo.cycles(network, ops, starts, ends, inject) == _full(network, ops, starts, ends, inject), name
    assert closed > 0


def test_the_forward_and_input_gradient_gemms_of_a_square_layer_share_one_replay():
    """``fwd`` and ``bwd-data`` of a square hidden layer differ only in what follows the GEMM
    (relu and transpose, or mask): one replay, and each count is the full replay's."""
    from wse.host.compiler.cycles import ReplayMemo
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(5, 30, 30, 3), torch.randn(6, 5)), FabricConfig(width=3, height=2), 6)
    network = Network(exe_plan.config, exe_plan.routes)
    memo, counts = ReplayMemo(), {}
    for name in ("fwd 2", "bwd-data 2"):
        phase = exe_plan.phases[name]
        ops, starts, ends = phase_ops(exe_plan, phase)
        counts[name] = memo.cycles(network, ops, starts, ends, phase_injections(phase))
        assert counts[name] == _full(network, ops, starts, ends, phase_injections(phase)), name
    assert memo.hits == 1 and counts["fwd 2"] != counts["bwd-data 2"]


def test_the_route_tables_are_hashed_once_per_network(monkeypatch):
    """The memo's key takes the route tables' digest once per network (they are most of a big mesh's
    inputs): later phases hash only their own inputs; another network with the same tables keys
    alike, one whose tables differ does not, and a changed table of the same network is hashed again."""
    from wse.host.compiler import cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(5, 30, 30, 3), torch.randn(6, 5)), FabricConfig(width=3, height=2), 6)
    network = Network(exe_plan.config, exe_plan.routes)
    hashed = []
    real = cycles._digest_array
    monkeypatch.setattr(cycles, "_digest_array", lambda digest, a: (hashed.append(a), real(digest, a)))
    keys = {name: cycles.MEMO.key(network, *phase_ops(exe_plan, phase), phase_injections(phase))[0]
            for name, phase in exe_plan.phases.items()}
    tables = [a for a in hashed if a is network.target]
    assert len(tables) == 1 and len(set(keys.values())) > 1
    fwd = exe_plan.phases["fwd 0"]
    twin = Network(exe_plan.config, exe_plan.routes)
    assert cycles.MEMO.key(twin, *phase_ops(exe_plan, fwd), phase_injections(fwd))[0] == keys["fwd 0"]
    other = Network(exe_plan.config, exe_plan.routes[:-1])
    assert cycles.MEMO.key(other, *phase_ops(exe_plan, fwd), phase_injections(fwd))[0] != keys["fwd 0"]
    twin.target = twin.target.copy()
    twin.target[0, 0, 0] += 1
    assert cycles.MEMO.key(twin, *phase_ops(exe_plan, fwd), phase_injections(fwd))[0] != keys["fwd 0"]


def test_a_pe_done_before_a_skipped_period_keeps_its_exit():
    """A long closing BUSY on a PE that finishes early (a column without tokens) must not be
    moved on by the periods skipped after it finished: memo count = full replay."""
    from wse.host.compiler.cycles import ReplayMemo
    from wse.firmware.training.timing import BUSY
    mesh, sizes, batch = MESHES[5]
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])),
                    FabricConfig(width=mesh[0], height=mesh[1]), batch)
    network = Network(exe_plan.config, exe_plan.routes)
    for name in [n for n in exe_plan.phases if n.startswith(("fwd", "bwd-data"))]:
        phase = exe_plan.phases[name]
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        memo = ReplayMemo()
        memo.cycles(network, ops, starts, ends, inject)
        changed = ops.copy()
        shortest = int(np.argmin(ends - starts))        # a PE that finishes first
        k = ends[shortest] - 2
        if k < starts[shortest] or changed[k, 0] != BUSY:
            continue
        changed[k, 1] += 300
        assert memo.cycles(network, changed, starts, ends, inject) == _full(network, changed, starts, ends, inject), name


def _with_closing(ops, starts, ends, rng):
    """The op rows with every distinct op list's closing BUSY cycles changed at random (some to 0)."""
    from wse.host.compiler.cycles import closing_cycles
    from wse.firmware.training.timing import BUSY
    changed = ops.copy()
    for start, end in set(zip(starts.tolist(), ends.tolist())):
        k = end - 2
        while k >= start and changed[k, 0] == BUSY:
            changed[k, 1] = int(rng.integers(0, 3)) * int(rng.integers(0, 400))
            k -= 1
    assert not np.array_equal(closing_cycles(changed, starts, ends)[1], closing_cycles(ops, starts, ends)[1])
    return changed


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 4), st.integers(0, 2**31))
def test_closing_cycles_of_any_length_give_the_full_replay_count(case, seed):
    """Phases whose closing cycles differ at random share the memo's one replay, and each count
    equals the full replay of that phase (the rule of closing_cycles, checked, not assumed).
    MESHES[5] has columns without tokens: PEs done before a skipped period keep their exits."""
    from wse.host.compiler.cycles import ReplayMemo
    mesh, sizes, batch = [MESHES[1], MESHES[3], MESHES[4], ((3, 3), (7, 27, 11, 4), 8), MESHES[5]][case]
    rng = np.random.default_rng(seed)
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])),
                    FabricConfig(width=mesh[0], height=mesh[1]), batch)
    network = Network(exe_plan.config, exe_plan.routes)
    memo = ReplayMemo()
    for name in [n for n in exe_plan.phases if n.startswith(("fwd", "bwd-data"))][:2]:
        phase = exe_plan.phases[name]
        ops, starts, ends = phase_ops(exe_plan, phase)
        inject = phase_injections(phase)
        memo.cycles(network, ops, starts, ends, inject)
        hits = memo.hits
        changed = _with_closing(ops, starts, ends, rng)
        assert memo.cycles(network, changed, starts, ends, inject) == _full(network, changed, starts, ends, inject)
        assert memo.hits == hits + 1, name


def test_replays_start_as_their_tables_come_then_longest_first_with_the_same_counts(monkeypatch):
    """A replay starts as soon as its op table is built, while the next tables are built; a free
    thread then takes the longest replay whose table is ready (replay volume: PEs times the longest
    PE's own cycles); the counts are those of one thread, two threads and the reference."""
    import threading

    from wse.host.compiler import cycles
    torch.manual_seed(0)
    exe_plan = plan(trace(mlp(6, 24, 24, 3), torch.randn(5, 6)), FabricConfig(width=3, height=2), 5)
    ops = np.array([[0, 5, 0, 0, 0, 0], [2, 7, 1, -1, -1, 0], [1, 0, 0, 0, 0, 0], [3, 0, 0, 0, 0, 0]])
    assert cycles.replay_volume(ops, np.array([0, 2, 3]), np.array([4, 4, 4])) == 3 * 12
    network = cycles.Network(exe_plan.config, exe_plan.routes)
    started, real = [], cycles._replay_exits
    first_started, all_built = threading.Event(), threading.Event()

    def tables():
        for k, (name, phase) in enumerate(exe_plan.phases.items()):
            yield name, cycles.phase_ops(exe_plan, phase), cycles.phase_injections(phase)
            if k == 0:
                assert first_started.wait(60)       # the first replay runs before the second table is built
        all_built.set()         # after the loop took the last table: every replay is queued

    def spy(network, ops, starts, ends, inject, **kwargs):
        started.append((cycles.replay_volume(ops, starts, ends), all_built.is_set()))
        first_started.set()
        assert all_built.wait(60)
        return real(network, ops, starts, ends, inject, **kwargs)
    monkeypatch.setattr(cycles, "_replay_exits", spy)
    monkeypatch.setattr(cycles, "MEMO", cycles.ReplayMemo())
    one = cycles._replay_phases(network, tables(), len(exe_plan.phases), periods=True, reuse=True, engine=None,
                                progress=False, workers=1)
    volumes = [volume for volume, _ in started]
    assert len(started) >= 4 and not started[0][1] and all(built for _, built in started[1:])
    assert volumes[1:] == sorted(volumes[1:], reverse=True) and volumes[0] < max(volumes)
    monkeypatch.setattr(cycles, "_replay_exits", real)
    monkeypatch.setattr(cycles, "MEMO", cycles.ReplayMemo())
    assert one == cycles.phase_cycles(exe_plan, progress=False, workers=2) == \
        cycles.phase_cycles(exe_plan, periods=False, reuse=False, progress=False, engine="reference")


@pytest.mark.parametrize("mesh,sizes,batch", [((10, 1), (6, 20, 16, 3), 30), ((1, 12), (4, 24, 24, 3), 5),
                                              ((12, 3), (8, 48, 36, 3), 24), ((20, 2), (5, 48, 40, 3), 43),
                                              ((4, 4), (40, 64, 64, 10), 16)])
def test_op_lists_built_from_one_round_equal_every_round_built(mesh, sizes, batch, monkeypatch):
    """``timing._repeat`` builds a streamed GEMM's round once and repeats its rows, ``timing._memo``
    a weight gradient's rotation step once per kind, and ``phase_ops`` takes a PE's list by its
    records' identity: every PE's op list of every phase equals the one built round by round and
    step by step from every PE's own words (one-row and one-column meshes, uneven token blocks)."""
    from wse.firmware.training import timing
    from wse.host.compiler.cycles import op_table, with_end
    torch.manual_seed(0)
    cfg = FabricConfig(width=mesh[0], height=mesh[1])
    the_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])), cfg, batch)
    built = {True: {name: phase_ops(the_plan, phase) for name, phase in the_plan.phases.items()}}
    monkeypatch.setattr(timing, "REPEAT_ROUNDS", False)
    built[False] = {name: op_table(cfg, lambda i, j, phase=phase: with_end(phase.records[i][j]), timing.pe_ops)
                    for name, phase in the_plan.phases.items()}
    for name, arrays in built[True].items():
        assert all(np.array_equal(a, b) for a, b in zip(arrays, built[False][name])), name
