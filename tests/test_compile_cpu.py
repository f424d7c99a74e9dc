"""The compile's work outside the cycle model, done once per distinct thing:
records built once per distinct key and shared by the PEs that hold them,
the route set's graph built once for every phase's deadlock proof, a weight
gradient step's outputs built once and repeated. Each gives the same words,
proofs, messages and op lists as the work done PE by PE.
"""

import numpy as np
import pytest
import torch

from wse.config import FabricConfig, Port
from wse.firmware import deadlock
from wse.firmware.deadlock import DeadlockError, check_routes, route_graph
from wse.firmware.kernels.spgemm import sparse_mask
from wse.firmware.training import records as rec
from wse.firmware.training import timing
from wse.host.compiler import codegen, route_check, trace, ws_phases
from wse.host.compiler.cycles import phase_ops
from wse.host.compiler.weight_streaming import plan
from mlps import mlp


# mesh (W, H), layer sizes, batch: non-square, one row, one column, uneven token blocks, fewer
# tokens than columns, and (4x4, batch 64) several token passes per GEMM.
CASES = [((3, 2), (5, 36, 30, 4), 7), ((4, 1), (5, 24, 20, 3), 9), ((1, 3), (4, 30, 33, 3), 5),
         ((5, 2), (6, 32, 26, 3), 3), ((4, 4), (22, 13, 7), 64)]


def _plan(mesh, sizes, batch, masks=None):
    torch.manual_seed(0)
    model = mlp(*sizes)
    graph = trace(model, torch.randn(batch, sizes[0]))
    return plan(graph, FabricConfig(width=mesh[0], height=mesh[1]), batch, masks=masks)


def _words(the_plan):
    return {name: [[[w.tobytes() for w in ops] if ops else None for ops in row] for row in phase.records]
            for name, phase in the_plan.phases.items()}


@pytest.mark.parametrize("mesh,sizes,batch", CASES, ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in CASES])
def test_shared_records_equal_records_built_pe_by_pe(mesh, sizes, batch, monkeypatch, tmp_path):
    """Every PE's records of every phase, and the executable's bytes, are the same whether
    equal records are built once and shared or built on every PE; and they are shared."""
    shared = _plan(mesh, sizes, batch)
    monkeypatch.setattr(ws_phases, "SHARE", False)
    own = _plan(mesh, sizes, batch)
    assert _words(shared) == _words(own)
    for the_plan, name in ((shared, "shared"), (own, "own")):
        codegen.generate(the_plan, cycles=False, progress=False).save(tmp_path / name)
    assert (tmp_path / "shared").read_bytes() == (tmp_path / "own").read_bytes()
    if mesh[0] > 2:     # columns with the same tokens hold the very same record arrays
        fwd = next(iter(shared.phases.values())).records
        assert any(a is b for row in fwd for a, b in zip(row[1] or [], row[2] or []))


@pytest.mark.parametrize("mesh,sizes,batch", CASES + [((2, 5), (7, 23, 17, 3), 6)],
                         ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in CASES] + ["2x5-b6"])
@pytest.mark.parametrize("spread", [True, False])
def test_weight_gradient_streams_are_the_step_by_step_scatter(mesh, sizes, batch, spread, monkeypatch):
    """Row ``i``'s weight-gradient stream, built from one slice of the rows' outputs laid out
    twice, is the rotation's scatter step by step: at step ``s`` the outputs of row ``(i - s) mod H``
    times the row's input features, step 0 with each output's bias."""
    made = []
    real = ws_phases.build
    monkeypatch.setattr(ws_phases, "build", lambda ctx: (made.append(ctx), real(ctx))[1])
    from wse.host.compiler import weight_streaming
    monkeypatch.setattr(weight_streaming, "SPREAD", spread)
    the_plan = _plan(mesh, sizes, batch)
    ctx = made[0]
    H = ctx.H
    for l, layer in enumerate(ctx.layers, start=1):
        rows_x, rows_dy = ctx.rows(l - 1, layer.k), ctx.rows(l, layer.o)
        expected = []
        for i in range(H):
            steps = []
            for step in range(H):
                outs = np.asarray(rows_dy[(i - step) % H], dtype=np.int64)
                part = outs[:, None] * layer.k + np.asarray(rows_x[i], dtype=np.int64)[None, :]
                if layer.bias is not None and step == 0:
                    part = np.concatenate([part, (layer.o * layer.k + outs)[:, None]], axis=1)
                steps.append(part.ravel())
            expected.append((i, np.concatenate(steps)))
        got = [(stream.index, stream.scatter) for stream in the_plan.phases[f"bwd-weight {layer.name}"].streams_out]
        expected = [(i, scatter) for i, scatter in expected if len(scatter)]
        assert [i for i, _ in got] == [i for i, _ in expected]
        assert all(a.dtype == np.int64 and np.array_equal(a, b) for (_, a), (_, b) in zip(got, expected))


@pytest.mark.parametrize("mesh,sizes,batch", CASES + [((10, 2), (8, 60, 60, 4), 23)],
                         ids=[f"{m[0]}x{m[1]}-b{b}" for m, _, b in CASES] + ["10x2-b23"])
def test_transfer_maps_built_by_column_blocks_equal_pe_by_pe(mesh, sizes, batch, monkeypatch):
    """The host's index maps, built for all columns of one token-block size and list of passes at
    once, equal the maps built PE by PE: the input feature-major and token-major, the one-hot pass
    by pass, the logits, and each column's tokens for the loss scale (uneven blocks, token passes,
    one row, one column)."""
    made = []
    real = ws_phases.build
    monkeypatch.setattr(ws_phases, "build", lambda ctx: (made.append(ctx), real(ctx))[1])
    maps = _plan(mesh, sizes, batch).transfers
    ctx = made[0]
    H, W, L = ctx.H, ctx.config.width, len(ctx.layers)
    K, C = ctx.layers[0].k, ctx.layers[-1].o
    for name, (region, l, features, width, major) in {
            "x": ("act0", 0, K, K, "feature"), "xtm": ("act0tm", 0, K, K, "token"),
            "onehot": ("onehot", L, C, C, "pass"), "scale": ("scale", L, 0, 0, "tokens"),
            "logits": (f"act{L}", L, C, C, "feature")}.items():
        addr, words = ctx.mem.regions[region]
        index = np.full((H, W, words), -1, dtype=np.int64)
        rows = ctx.rows(l, features)
        for i in range(H):
            for j in range(ctx.columns):
                toks = np.asarray(ctx.tokens[j], dtype=np.int64)
                grid = toks[None, :] * width + np.asarray(rows[i], dtype=np.int64)[:, None]   # [feature][token]
                flat = {"feature": grid.ravel(), "token": grid.T.ravel(), "tokens": toks,
                        "pass": np.concatenate([grid[:, off:off + t].ravel() for off, t in ctx.token_passes(j)]
                                               or [np.zeros(0, np.int64)])}[major]
                index[i, j, :flat.size] = flat
        assert maps[name][0] == addr and np.array_equal(maps[name][1], index), name


def test_shared_sparse_records_equal_records_built_pe_by_pe(monkeypatch):
    """The same for a masked layer's sparse GEMM and weight gradients."""
    torch.manual_seed(0)
    model = mlp(12, 24, 5)
    masks = {"0.weight": sparse_mask(24, 12, 0.6, np.random.default_rng(1))}
    graph = trace(model, torch.randn(6, 12))
    cfg = FabricConfig(width=3, height=3)
    shared = plan(graph, cfg, 6, masks=masks)
    assert any(k.startswith("fwd") and shared.phases[k].streams_in and shared.phases[k].streams_in[0].words
               is not None for k in shared.phases)
    monkeypatch.setattr(ws_phases, "SHARE", False)
    assert _words(shared) == _words(plan(graph, cfg, 6, masks=masks))


@pytest.mark.parametrize("mesh,sizes,batch", CASES[:3])
def test_weight_gradient_outputs_built_once_equal_every_output_built(mesh, sizes, batch, monkeypatch):
    """A weight-gradient rotation step's outputs are built once and repeated (``timing._repeat``):
    the same op lists as built output by output."""
    the_plan = _plan(mesh, sizes, batch)
    built = {}
    for flag in (True, False):
        monkeypatch.setattr(timing, "REPEAT_ROUNDS", flag)
        built[flag] = {n: phase_ops(the_plan, p) for n, p in the_plan.phases.items() if n.startswith("bwd-weight")}
    for name, arrays in built[True].items():
        assert all(np.array_equal(a, b) for a, b in zip(arrays, built[False][name])), name


def test_route_check_builds_the_route_graph_once_with_the_same_proofs(monkeypatch):
    """The weight-streaming route check builds the route set's graph once for all phases; each
    phase's proof equals a check of its own from scratch, and the traffic equals every PE decoded."""
    the_plan = _plan((3, 3), (6, 30, 24, 4), 9)
    built = []
    real = deadlock.route_graph

    def spy(*args, **kwargs):
        built.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(route_check, "route_graph", spy)
    proofs = route_check.check_weight_streaming(the_plan)
    assert len(built) == 1 and len(proofs) == len(the_plan.phases)
    for proof, (name, phase) in zip(proofs, the_plan.phases.items()):
        traffic, decoded = route_check.phase_traffic(phase.records, rec.decode)
        for (x, y), (receives, sends) in traffic.items():   # every PE decoded on its own
            kinds = [rec.decode(w) for w in phase.records[y][x]]
            assert decoded[(x, y)] == [(k, f) for k, f, _ in kinds]
            assert isinstance(receives, set) and isinstance(sends, set)
        own = check_routes(the_plan.config, the_plan.routes, what=proof.what, traffic=traffic,
                           rings=route_check.weight_streaming_rings(the_plan, decoded))
        assert own == proof, name


def test_a_prebuilt_route_graph_gives_the_same_proof_and_the_same_cycle():
    """``check_routes(..., graph=route_graph(...))`` proves what a check from scratch proves, names
    the same cycle when there is one, and leaves the prebuilt graph as it was for the next check."""
    cfg = FabricConfig(width=2, height=2)
    chain = [(0, 0, 2, Port.RAMP, (Port.E,)), (1, 0, 2, Port.W, (Port.RAMP,))]
    graph = route_graph(cfg, chain, what="a chain")
    before = {node: set(v) for node, v in graph.edges.items()}
    assert check_routes(cfg, chain, what="a chain", graph=graph) == check_routes(cfg, chain, what="a chain")
    assert graph.edges == before
    routes = [(0, 0, 5, Port.S, (Port.E,)), (1, 0, 5, Port.W, (Port.S,)), (1, 1, 5, Port.N, (Port.W,)),
              (0, 1, 5, Port.E, (Port.N,))]       # four routers passing color 5 round a square
    with pytest.raises(DeadlockError) as scratch:
        check_routes(cfg, routes, what="a loop")
    with pytest.raises(DeadlockError) as prebuilt:
        check_routes(cfg, routes, what="a loop", graph=route_graph(cfg, routes, what="a loop"))
    assert str(prebuilt.value) == str(scratch.value) and "can deadlock" in str(scratch.value)


def test_a_route_leading_nowhere_is_refused_when_the_graph_is_built():
    cfg = FabricConfig(width=2, height=2)
    with pytest.raises(DeadlockError, match="send it nowhere"):
        route_graph(cfg, [(0, 0, 2, Port.W, ())], what="a dead end")
