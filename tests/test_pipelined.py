"""The layer-pipelined mode: placement, the forward pass on the golden model
against the functional model (bit for bit) and PyTorch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_place import place, utilization_bounds
from wse.host.compiler.pipelined_bounds import COSTS, region_bounds
from wse.host.compiler.weight_streaming import FitError
from wse.host.runtime.pipelined import PipelinedDevice, functional_forward


def _mlp(dims, seed=0):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def test_placement_fc_mnist_regions_by_compute():
    regions = place([(784, 256), (256, 256), (256, 10)], FabricConfig(width=16, height=16))
    assert [r.layer for r in regions] == [0, 1, 2]
    # a staircase: layer 1 east of layer 0 on its rows, layer 2 south of layer 1 on its columns
    assert (regions[1].x0, regions[1].y0, regions[1].rows) == (regions[0].cols, 0, regions[0].rows)
    assert (regions[2].x0, regions[2].y0, regions[2].cols) == (regions[1].x0, regions[0].rows, regions[1].cols)
    assert regions[0].pes > regions[1].pes > regions[2].pes        # compute-heavy layers get more PEs
    assert max(r.tile for r in regions) <= 1200
    used = {(x, y) for r in regions for _, _, x, y in r.cells()}
    assert len(used) == sum(r.pes for r in regions)                 # no PE in two regions


def test_utilization_bounds_fc_mnist():
    # no staircase on 16x16 gets both passes to 0.8 even with no overhead (docs/layer_pipelined.md section 6)
    shapes = [(784, 256), (256, 256), (256, 10)]
    config = FabricConfig(width=16, height=16)
    bound = utilization_bounds(shapes, config)
    assert bound["both"] < 0.8 and bound["training"] < 0.8
    assert bound["sizes"] == [15, 10, 6, 1]
    # the chosen placement is one of the staircases, so its own zero-overhead figures are within the bounds
    tiles = [r.tile for r in place(shapes, config)]
    assert 268_800 / (256 * max(tiles)) <= bound["forward"]
    assert 336_896 / (256 * max(tiles[0], 2 * tiles[1], 2 * tiles[2])) <= bound["backward"]
    # one layer on one PE: every multiply-add on the only PE, both passes
    one = utilization_bounds([(5, 4)], FabricConfig(width=1, height=1))
    assert one["forward"] == one["backward"] == one["training"] == one["both"] == 1.0


def test_placement_refuses_too_many_layers():
    with pytest.raises(FitError, match="does not fit a 2x2 mesh"):
        place([(4, 4)] * 5, FabricConfig(width=2, height=2))


def test_plan_refuses_what_does_not_fit_memory():
    g = trace(_mlp((784, 256, 10)), torch.zeros(1, 784))
    with pytest.raises(FitError, match="sram_words is 8192"):
        plan(g, FabricConfig(width=2, height=2), 8)


@pytest.mark.parametrize("dims, mesh, batch", [((6, 5, 4, 3), (3, 3), 3), ((20, 12, 9, 7), (5, 4), 5),
                                               ((30, 16, 10), (6, 6), 4), ((9, 3), (1, 1), 2)])
def test_forward_golden_equals_functional_and_torch(dims, mesh, batch):
    model = _mlp(dims)
    cfg = FabricConfig(width=mesh[0], height=mesh[1])
    p = plan(trace(model, torch.zeros(1, dims[0])), cfg, batch)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    x = np.random.default_rng(1).standard_normal((batch, dims[0])).astype(np.float32)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(weights)
    logits, cycles = dev.forward(x)
    expected = functional_forward(p, weights, x)[-1]
    assert np.array_equal(logits.view(np.uint32), expected.view(np.uint32))
    assert cycles > 0
    np.testing.assert_allclose(logits, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dims, mesh, batch, depths", [
    ((6, 5, 4, 3), (3, 3), 3, {}), ((20, 12, 9, 7), (5, 4), 5, {}), ((30, 16, 10), (6, 6), 4, {}),
    ((9, 3), (1, 1), 2, {}), ((20, 12, 9, 7), (5, 4), 6, {"rx_depth": 1, "tx_depth": 1, "router_depth": 1}),
    ((17, 11, 13, 5, 4), (4, 4), 3, {})])
def test_static_cycles_equal_golden(dims, mesh, batch, depths):
    from wse.host.compiler.pipelined_cycles import phase_cycles
    model = _mlp(dims, seed=3)
    cfg = FabricConfig(width=mesh[0], height=mesh[1], **depths)
    p = plan(trace(model, torch.zeros(1, dims[0])), cfg, batch)
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    x = np.random.default_rng(2).standard_normal((batch, dims[0])).astype(np.float32)
    dev = PipelinedDevice(p, "golden")
    dev.write_weights(weights)
    logits, cycles = dev.forward(x)
    assert phase_cycles(p) == {"forward": cycles}
    assert np.array_equal(logits.view(np.uint32), functional_forward(p, weights, x)[-1].view(np.uint32))


def test_fc_mnist_largest_batch_and_the_error_past_it():
    g = trace(_mlp((784, 256, 256, 10)), torch.zeros(1, 784))
    cfg = FabricConfig(width=16, height=16)
    p = plan(g, cfg, 52)
    assert max(addr + words for addr, words in p.memory.values()) <= cfg.sram_words
    with pytest.raises(FitError, match=r"the inputs of 53 samples in flight 3498.*sram_words is 8192"):
        plan(g, cfg, 53)


def test_plan_describes_regions_and_memory():
    g = trace(_mlp((784, 256, 256, 10)), torch.zeros(1, 784))
    lines = plan(g, FabricConfig(width=16, height=16), 32).describe()
    assert lines[0] == "layer-pipelined on a 16x16 mesh, batch 32"
    assert "columns 0-11, rows 0-14 (180 PEs, inputs along columns), largest tile 1188" in lines[1]
    assert lines[-1].startswith("  memory per PE: ") and "of 8192 words" in lines[-1]


def _brute_region_bound(shapes, config, costs):
    """Every combination of every layer's grids: the best min(forward, backward), as an exact fraction."""
    import itertools
    from fractions import Fraction
    pes = config.width * config.height
    fwd = sum(k * o for k, o in shapes)
    bwd = 2 * fwd - shapes[0][0] * shapes[0][1]
    per_layer = []
    for layer, (k, o) in enumerate(shapes):
        grids = []
        for a in range(1, o + 1):
            for b in range(1, k + 1):
                kt, ot = -(-k // b), -(-o // a)
                f = kt * ot + (ot if costs != "none" else 0) + (kt if costs == "intake" else 0)
                g = kt * ot if layer == 0 else 2 * kt * ot + (kt if costs != "none" else 0)
                grids.append((a * b, f, g))
        per_layer.append(grids)
    best = Fraction(0)
    for combo in itertools.product(*per_layer):
        if sum(c[0] for c in combo) <= pes:
            best = max(best, min(Fraction(fwd, pes * max(c[1] for c in combo)),
                                 Fraction(bwd, pes * max(c[2] for c in combo))))
    return best


@pytest.mark.parametrize("costs", COSTS)
@pytest.mark.parametrize("shapes,mesh", [([(7, 5), (5, 3)], (3, 2)), ([(6, 4), (4, 4), (4, 2)], (2, 3)),
                                         ([(9, 2)], (2, 2))])
def test_region_bounds_equal_exhaustive_search(shapes, mesh, costs):
    config = FabricConfig(width=mesh[0], height=mesh[1])
    bound = region_bounds(shapes, config, costs)
    assert bound["both"] == float(_brute_region_bound(shapes, config, costs))
    assert sum(r[0] for r in bound["regions"]) <= config.width * config.height


def test_region_bounds_equal_exhaustive_search_on_random_layers():
    # seeded random small models and meshes, every cost model: the bisection's figure is the exhaustive search's,
    # bit for bit (ties such as [(7, 3), (3, 2)] on 1x2, where a rounded comparison loses the best partition)
    rng = np.random.default_rng(7)
    cases = [([(7, 3), (3, 2)], (1, 2), "none"), ([(5, 3), (3, 1)], (3, 1), "intake")]
    while len(cases) < 150:
        shapes = [(int(rng.integers(1, 8)), int(rng.integers(1, 8))) for _ in range(int(rng.integers(1, 4)))]
        shapes = [(k if i == 0 else shapes[i - 1][1], o) for i, (k, o) in enumerate(shapes)]
        if np.prod([k * o for k, o in shapes]) <= 4000:
            cases.append((shapes, (int(rng.integers(1, 4)), int(rng.integers(1, 4))), COSTS[len(cases) % 3]))
    for shapes, mesh, costs in cases:
        config = FabricConfig(width=mesh[0], height=mesh[1])
        bound = region_bounds(shapes, config, costs)
        assert bound["both"] == float(_brute_region_bound(shapes, config, costs)), (shapes, mesh, costs)
        if bound["regions"] is not None:
            assert sum(r[0] for r in bound["regions"]) <= config.width * config.height


def test_region_bounds_refuse_no_layers():
    with pytest.raises(UsageError, match="shapes must list at least one"):
        region_bounds([], FabricConfig(width=2, height=2))


def test_region_bounds_fc_mnist():
    # any partition into per-layer regions, adjacency ignored (docs/layer_pipelined.md section 6): the multiply-adds
    # alone allow 0.84 in both passes, but with each PE's inputs kept and its partial sums sent no partition reaches 0.8
    shapes = [(784, 256), (256, 256), (256, 10)]
    config = FabricConfig(width=16, height=16)
    figures = {costs: region_bounds(shapes, config, costs)["both"] for costs in COSTS}
    assert figures["none"] == pytest.approx(0.8413, abs=1e-4)
    assert figures["outputs"] == pytest.approx(0.8307, abs=1e-4)
    assert figures["intake"] == pytest.approx(0.7976, abs=1e-4) and figures["intake"] < 0.8
    # the staircase is one of these partitions
    assert utilization_bounds(shapes, config)["both"] <= figures["none"]
    with pytest.raises(UsageError, match="costs must be one of"):
        region_bounds(shapes, config, "some")
