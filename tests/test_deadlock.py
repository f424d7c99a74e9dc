"""The static deadlock check (``docs/faults.md`` section 1): every route set the
compilers and the kernels emit is proved free of buffer cycles, and planted
cyclic route sets are caught with the cycle printed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from wse.config import FabricConfig, Port, UsageError
from wse.firmware import deadlock
from wse.firmware.deadlock import DeadlockError, Ring, check_routes
from wse.firmware.kernels import KERNELS
from wse.firmware.kernels.common import chain_routes, column_cells
from wse.host.compiler import codegen, pipelined, route_check, trace
from wse.host.compiler.pipelined_codegen import OnChipOptimizer
from wse.host.compiler.weight_streaming import plan as ws_plan
from wse.host.memoryx.optim import OptimizerConfig
from wse.sim.runner import run
from mlps import mlp

N, E, S, W, RAMP = Port.N, Port.E, Port.S, Port.W, Port.RAMP


# ------------------------------------------------------------------ planted cycles

def test_a_planted_loop_of_routers_is_caught_and_printed():
    cfg = FabricConfig(width=2, height=2)
    loop = [(0, 0, 5, S, (E,)), (1, 0, 5, W, (S,)), (1, 1, 5, N, (W,)), (0, 1, 5, E, (N,))]
    with pytest.raises(DeadlockError) as info:
        check_routes(cfg, loop, what="the planted loop")
    message = str(info.value)
    assert isinstance(info.value, UsageError) and "\n" not in message
    assert message.startswith("the routes of the planted loop can deadlock")
    assert ("router (0, 0) color 5 -> router (1, 0) color 5 -> router (1, 1) color 5 -> router (0, 1) color 5 "
            "-> router (0, 0) color 5") in message


def _pe_ring(height: int) -> tuple[list, list]:
    """A column of PEs each forwarding to the next on alternating colors, with a wrap (color 3) back north."""
    routes = chain_routes(column_cells(0, height), S, (1, 2), from_edge=False, to_edge=False)
    for y in range(1, height - 1):
        routes.append((0, y, 3, S, (N,)))
    routes += [(0, height - 1, 3, RAMP, (N,)), (0, 0, 3, S, (RAMP,))]
    members = [(0, y, 3 if y == 0 else (1, 2)[y % 2], 3 if y == height - 1 else (1, 2)[(y + 1) % 2])
               for y in range(height)]
    return routes, members


def test_a_ring_of_forwarding_pes_is_a_cycle_unless_its_rule_proves_it():
    cfg = FabricConfig(width=1, height=4)
    routes, members = _pe_ring(4)
    with pytest.raises(DeadlockError, match=r"PE \(0, 1\) input queue of color 2 -> PE \(0, 1\) output queue"):
        check_routes(cfg, routes, what="a ring")
    capacity = cfg.tx_depth + 2 * cfg.router_depth + cfg.rx_depth
    proof = check_routes(cfg, routes, what="a ring", rings=[Ring("column 0", tuple(members), message=capacity - 1)])
    assert proof.rings == (("column 0", f"forwarding, {capacity - 1} wavelet(s) per message", capacity),)
    with pytest.raises(DeadlockError, match=f"sends messages of {capacity} wavelets but its smallest link holds "
                                            f"{capacity}") as info:
        check_routes(cfg, routes, what="a ring", rings=[Ring("column 0", tuple(members), message=capacity)])
    assert "a cycle of channels" in str(info.value)


def test_a_rotation_needs_a_member_that_receives_first():
    cfg = FabricConfig(width=1, height=3)
    routes, members = _pe_ring(3)
    check_routes(cfg, routes, what="rotation", rings=[Ring("r", tuple(members), receive_first=(False, True, False))])
    with pytest.raises(DeadlockError, match="no member that receives first"):
        check_routes(cfg, routes, what="rotation", rings=[Ring("r", tuple(members), receive_first=(False,) * 3)])


def test_a_ring_that_the_routes_do_not_form_proves_nothing():
    cfg = FabricConfig(width=1, height=4)
    routes, members = _pe_ring(4)
    wrong = [members[0], members[2], members[1], members[3]]
    with pytest.raises(DeadlockError, match=r"does not reach PE"):
        check_routes(cfg, routes, what="a ring", rings=[Ring("wrong", tuple(wrong), message=1)])


def test_a_ring_is_no_blanket_exemption():
    """The ring drops only its members' waits on the ring colors: a second color
    held while sending still closes a cycle through the same PEs."""
    cfg = FabricConfig(width=1, height=4)
    routes, members = _pe_ring(4)
    routes += [(0, 0, 6, RAMP, (S,)), (0, 1, 6, N, (RAMP,))]
    routes += [(0, 1, 7, RAMP, (N,)), (0, 0, 7, S, (RAMP,))]
    with pytest.raises(DeadlockError, match="color 7"):
        check_routes(cfg, routes, what="two colors", rings=[Ring("column 0", tuple(members), message=2)])


def test_routes_that_lead_nowhere_are_errors():
    cfg = FabricConfig(width=2, height=1)
    with pytest.raises(DeadlockError, match=r"router \(1, 0\), which does not take color 0 from W"):
        check_routes(cfg, [(0, 0, 0, RAMP, (E,)), (1, 0, 0, N, (RAMP,))], what="x")
    with pytest.raises(DeadlockError, match="send it nowhere"):
        check_routes(cfg, [(0, 0, 0, W, ())], what="x")
    with pytest.raises(DeadlockError, match="outside the 2x1 mesh"):
        check_routes(cfg, [(2, 0, 0, W, (E,))], what="x")


# ------------------------------------------------------------------ every compiled route set

@pytest.mark.parametrize("dims, mesh, batch", [
    ((784, 256, 256, 10), (16, 16), 64), ((22, 13, 7), (4, 4), 8), ((5, 3), (1, 1), 2), ((6, 5, 4), (3, 2), 5),
    ((9, 4, 3), (2, 5), 10), ((9, 4, 3), (5, 3), 3)])
def test_weight_streaming_route_sets_pass(dims, mesh, batch):
    p = ws_plan(trace(mlp(*dims), torch.randn(batch, dims[0])), FabricConfig(width=mesh[0], height=mesh[1]), batch)
    proofs = route_check.check_weight_streaming(p)
    assert [proof.what for proof in proofs] == [f"weight-streaming phase {name!r}" for name in p.phases]
    if mesh[1] > 1:
        rings = {name for proof in proofs for name, _, _ in proof.rings}
        assert {f"column {j} partial sums" for j in range(p.columns)} <= rings
        assert {f"column {j} wgrad rotation" for j in range(p.columns)} <= rings
        with pytest.raises(DeadlockError, match="can deadlock"):     # the ring is a real cycle
            check_routes(p.config, p.routes, what="without its rings")


def test_the_compiler_refuses_a_plan_whose_ring_cannot_carry_its_messages():
    g = trace(mlp(6, 5, 4), torch.randn(16, 6))
    p = ws_plan(g, FabricConfig(width=4, height=3), 16)      # 4 tokens per PE; links of 9
    small = dataclasses.replace(p, config=p.config.replace(tx_depth=1, router_depth=1, rx_depth=1))
    with pytest.raises(DeadlockError, match="column 0 partial sums sends messages of 4 wavelets"):
        codegen.generate(small)


@pytest.mark.parametrize("dims, mesh, batch", [((784, 256, 256, 10), (16, 16), 8), ((22, 13, 7), (4, 4), 4),
                                               ((6, 5, 4), (3, 2), 2)])
@pytest.mark.parametrize("optimizer", [None, OptimizerConfig("sgd", lr=0.1, momentum=0.9)])
def test_pipelined_route_sets_pass(dims, mesh, batch, optimizer):
    g = trace(mlp(*dims), torch.randn(batch, dims[0]))
    p = pipelined.plan(g, FabricConfig(width=mesh[0], height=mesh[1]), batch, OnChipOptimizer.of(optimizer))
    proofs = route_check.check_pipelined(p)
    assert len(proofs) == len(p.phases) and all(proof.dependencies > 0 for proof in proofs)


@pytest.mark.parametrize("mesh", [(1, 1), (2, 3), (4, 4), (5, 2)])
@pytest.mark.parametrize("name, variant", [(name, v) for name in sorted(KERNELS)
                                           for v in KERNELS[name].variants or (None,)])
def test_every_kernel_route_set_is_checked_and_passes(name, variant, mesh, monkeypatch):
    checked = []
    original = deadlock.check_routes

    def spy(*args, **kwargs):
        checked.append(original(*args, **kwargs))
        return checked[-1]

    monkeypatch.setattr(deadlock, "check_routes", spy)
    kernel = KERNELS[name]
    sizes = {"rows": 8, "cols": 8} if "rows" in kernel.defaults else {"n": 24}
    if variant:
        sizes["variant"] = variant
    report = run(kernel, FabricConfig(width=mesh[0], height=mesh[1]), **sizes)
    assert report["bit_exact"]
    assert checked and all(proof.what == f"kernel {name}" for proof in checked)
