"""Two edges of the reduced column replay's proof (:mod:`~wse.host.compiler.replay_columns`):
the boundary stream must be checked to the end of the run (a send of column ``a - 1`` whose
echo was never compared forces the full replay), and a PE that finished before the shift began
keeps its own last cycle (its exit is not shifted into the count). Each is a phase built to
break the rule, checked against the full reference replay.
"""

import dataclasses

import numpy as np
import pytest
import torch
from test_compile_speed import mlp

from wse.config import FabricConfig, Port
from wse.firmware.timing_ops import BUSY, END, RECV, VEC
from wse.host.compiler import replay_columns, trace
from wse.host.compiler.cycles import Network, phase_injections, phase_ops
from wse.host.compiler.replay import run_replay
from wse.host.compiler.weight_streaming import plan


def _reference(network, ops, starts, ends, inject):
    return run_replay(network, ops, starts, ends, inject, periods=False, engine="reference", columns=False)


def _reduced(network, ops, starts, ends, inject):
    info = {}
    result = replay_columns.reduced_replay(network, np.ascontiguousarray(ops, dtype=np.int32),
                                           np.asarray(starts, np.int64), np.asarray(ends, np.int64), inject,
                                           info=info)
    return result, info


def _chain_and_pass_through(width: int, samples: int, passing: int):
    """Row 0: a two-colour chain (column 0 sends every 40 cycles, every later column receives,
    works 3 cycles and sends on), which shifts by a fixed delay from column to column. Row 1:
    column 0 sends ``passing`` wavelets of colour 2, one every 8 cycles, straight through every
    column to the east edge: sends of column ``a - 1`` that no PE of the reduced columns takes,
    so their echoes can fall after the reduced replay ends."""
    config = FabricConfig(width=width, height=2)
    routes, lists = [], {}
    for x in range(width):
        send = 1 if x % 2 == 0 else 0
        routes.append((x, 0, send, Port.RAMP, (Port.E,)))
        if x >= 1:
            routes.append((x, 0, 1 - send, Port.W, (Port.RAMP,)))
        routes.append((x, 1, 2, Port.RAMP if x == 0 else Port.W, (Port.E,)))
        rows = []
        for _ in range(samples):
            if x == 0:
                rows += [(BUSY, 40, 0, 0, 0, 0), (VEC, 1, -1, -1, send, 0)]
            else:
                rows += [(RECV, 1 - send, 0, 0, 0, 0), (BUSY, 3, 0, 0, 0, 0), (VEC, 1, -1, -1, send, 0)]
        lists[(x, 0)] = rows + [(END, 0, 0, 0, 0, 0)]
        rows = []
        if x == 0:
            for _ in range(passing):
                rows += [(VEC, 1, -1, -1, 2, 0), (BUSY, 6, 0, 0, 0, 0)]
        lists[(x, 1)] = rows + [(END, 0, 0, 0, 0, 0)]
    ops, starts, ends = [], [], []
    for y in range(2):
        for x in range(width):
            starts.append(len(ops))
            ops += lists[(x, y)]
            ends.append(len(ops))
    return Network(config, routes), (np.array(ops, dtype=np.int32), np.array(starts), np.array(ends), {})


@pytest.mark.parametrize("width,passing", [(12, 110), (12, 120), (12, 130), (10, 120), (11, 120)])
def test_sends_left_unechoed_at_the_end_force_the_full_replay(width, passing):
    network, inputs = _chain_and_pass_through(width, 20, passing)
    (count, exits), info = _reduced(network, *inputs)
    full, full_exits = _reference(network, *inputs)
    assert count == full and np.array_equal(exits, full_exits), info
    assert info["path"] != "no shape"          # the case is one the reduced replay is tried on


@pytest.mark.parametrize("busy", [300, 2000, 3000])
def test_a_pe_done_before_the_shift_keeps_its_own_last_cycle(busy):
    # the weight gradients of a 12x3 plan, with a fourth row whose PEs work `busy` cycles and end
    torch.manual_seed(0)
    sizes, batch = (8, 48, 36, 3), 24
    config = FabricConfig(width=12, height=3)
    exe_plan = plan(trace(mlp(*sizes), torch.randn(batch, sizes[0])), config, batch)
    W = config.width
    network = Network(dataclasses.replace(config, height=config.height + 1), exe_plan.routes)
    tried = 0
    for name, phase in exe_plan.phases.items():
        if not name.startswith("bwd-weight"):
            continue
        ops, starts, ends = phase_ops(exe_plan, phase)
        extra = np.zeros((2, ops.shape[1]), ops.dtype)
        extra[0, 0], extra[0, 1], extra[1, 0] = BUSY, busy, END
        inputs = (np.concatenate([ops, extra]), np.concatenate([starts, np.full(W, ops.shape[0])]),
                  np.concatenate([ends, np.full(W, ops.shape[0] + 2)]), phase_injections(phase))
        (count, exits), info = _reduced(network, *inputs)
        full, full_exits = _reference(network, *inputs)
        assert count == full and np.array_equal(exits, full_exits), (name, info)
        tried += info["path"] == "reduced"
    assert tried                               # at least one phase took the reduced path
