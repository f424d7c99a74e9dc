"""Data-parallel replicas of the layer-pipelined mode inside one wafer: the
pipeline copied on adjacent strips of columns, each copy taking its shard of
every pass (docs/layer_pipelined.md section 6b)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import phase_cycles
from wse.host.compiler.pipelined_place import place_replicas
from wse.host.compiler.weight_streaming import FitError
from wse.host.runtime.pipelined import PipelinedDevice, functional_forward


def _mlp(dims, seed=0):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def test_replicas_are_copies_on_adjacent_strips():
    copies = place_replicas([(64, 32), (32, 10)], FabricConfig(width=16, height=16), 4)
    assert len(copies) == 4
    for r, regions in enumerate(copies):
        assert [(reg.x0 - 4 * r, reg.y0, reg.cols, reg.rows) for reg in regions] == \
            [(reg.x0, reg.y0, reg.cols, reg.rows) for reg in copies[0]]
        assert all(4 * r <= x < 4 * r + 4 for reg in regions for _, _, x, _ in reg.cells())
    cells = [(x, y) for regions in copies for reg in regions for _, _, x, y in reg.cells()]
    assert len(cells) == len(set(cells))                 # no PE in two regions


@pytest.mark.parametrize("dims, strip, height, replicas, batch", [
    ((6, 5, 4, 3), 3, 3, 2, 5), ((9, 7, 3), 2, 2, 3, 7), ((12, 8, 5), 2, 3, 4, 4)])
def test_replicas_forward_golden_equals_functional_and_one_replica(dims, strip, height, replicas, batch):
    """k copies on a mesh of k strips give every sample the bits one copy on one strip
    gives it (functional = golden), and the static cycle model equals golden cycles."""
    model = _mlp(dims, seed=replicas)
    graph = trace(model, torch.zeros(1, dims[0]))
    weights = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    x = np.random.default_rng(replicas).standard_normal((batch, dims[0])).astype(np.float32)
    many = plan(graph, FabricConfig(width=strip * replicas, height=height), batch, replicas=replicas)
    one = plan(graph, FabricConfig(width=strip, height=height), batch)
    assert many.replicas == replicas and [len(s) for s in many.shards] == \
        [len(s) for s in np.array_split(np.arange(batch), replicas)]
    dev = PipelinedDevice(many, "golden")
    dev.write_weights(weights)
    logits, cycles = dev.forward(x)
    expected = functional_forward(one, weights, x)[-1]
    assert np.array_equal(logits.view(np.uint32), expected.view(np.uint32))
    assert np.array_equal(functional_forward(many, weights, x)[-1].view(np.uint32), expected.view(np.uint32))
    assert phase_cycles(many)["forward"] == cycles
    solo = PipelinedDevice(one, "golden")
    solo.write_weights(weights)
    assert cycles < solo.forward(x)[1]                   # the shards run at once


def test_replicas_refused_clearly():
    graph = trace(_mlp((6, 5, 3)), torch.zeros(1, 6))
    cfg = FabricConfig(width=4, height=3)
    with pytest.raises(UsageError, match="smaller than the 4 replicas"):
        plan(graph, FabricConfig(width=8, height=3), 3, replicas=4)
    with pytest.raises(FitError, match="replicas must be an integer from 1 to the mesh's width 4"):
        plan(graph, cfg, 8, replicas=5)
    with pytest.raises(UsageError, match="harvesting runs with one replica"):
        plan(graph, cfg, 8, sparse=True, replicas=2)
    with pytest.raises(FitError, match="does not fit a 1x3 mesh"):
        plan(trace(_mlp((6, 5, 4, 3)), torch.zeros(1, 6)), cfg, 8, replicas=4)


def test_choose_replicas_takes_the_fewest_forward_cycles():
    from wse.host.compiler.pipelined_cycles import choose_replicas
    graph = trace(_mlp((16, 8, 4)), torch.zeros(1, 16))
    cfg = FabricConfig(width=8, height=4)
    chosen, tried = choose_replicas(graph, cfg, 16)
    assert set(tried) == {1, 2, 4}                       # 8 copies need 16 columns
    assert tried[chosen] == min(tried.values()) and tried[chosen] < tried[1]
    assert tried == {k: phase_cycles(plan(graph, cfg, 16, replicas=k))["forward"] for k in tried}
