"""The replay's packed routes (``replay_routes.pack_routes``): distinct rows with targets
relative to the router and a row number per router and color. Decoded, every
route's row gives back the network's own tables (targets, ports, the ``_NEVER``
mark, the upstream), and the routers of one class share their rows.
"""

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, Port
from wse.host.compiler import trace
from wse.host.compiler.network import TO_PE, TO_ROUTER, Network, Routes
from wse.host.compiler.replay_routes import _MASK, _N, _NEVER, _RAMP_IN, _TARGETS, _UP, _UP_AT, pack_routes
from wse.host.compiler.weight_streaming import plan


def _network(width, height, sizes, batch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.ReLU(), nn.Linear(sizes[1], sizes[2]))
    exe_plan = plan(trace(model, torch.randn(batch, sizes[0])), FabricConfig(width=width, height=height), batch)
    return Network(exe_plan.config, exe_plan.routes)


def _check_decodes(routes, upstream):
    """Every route's packed row gives back its tables (with and without ``upstream``), the rows
    are distinct and every row is used."""
    rows, index = pack_routes(routes, upstream)
    bare_rows, bare_index = pack_routes(routes)
    assert index.dtype == (np.int8 if rows.shape[0] <= 128 else np.int16) and rows.dtype == np.int32
    for packed, number in ((rows, index), (bare_rows, bare_index)):
        assert len(np.unique(packed, axis=0)) == packed.shape[0] == len(np.unique(number))
    routers, colors = routes.input_port.shape
    for r in range(routers):
        for c in range(colors):
            row = rows[index[r, c]]
            bare = bare_rows[bare_index[r, c]]
            n = int(routes.n_targets[r, c])
            assert row[_N] == bare[_N] == n and row[_MASK] == bare[_MASK] == routes.output_mask[r, c]
            assert bare[_UP] == -2
            up = upstream[r, c]
            assert (row[_UP], r + row[_UP_AT] if row[_UP] == 0 else up) == ((0, up) if up >= 0 else (up, up))
            assert row[_RAMP_IN] == bare[_RAMP_IN] == (routes.input_port[r, c] == int(Port.RAMP))
            assert not row[_TARGETS + 2 * n:_RAMP_IN].any() and not bare[_TARGETS + 2 * n:_RAMP_IN].any()
            for k in range(n):
                kind, target = routes.target_kind[r, c, k], routes.target[r, c, k]
                got = row[_TARGETS + 2 * k]
                assert bare[_TARGETS + 2 * k] == got
                if kind == TO_ROUTER:
                    accepts = routes.input_port[target, c] == routes.target_port[r, c, k]
                    assert got == (TO_ROUTER if accepts else _NEVER)
                else:
                    assert got == kind
                if kind in (TO_ROUTER, TO_PE):
                    assert r + row[_TARGETS + 2 * k + 1] == target
                else:
                    assert row[_TARGETS + 2 * k + 1] == 0


@pytest.mark.parametrize("mesh", [(8, 8), (5, 3), (6, 1), (1, 4)], ids=lambda m: f"{m[0]}x{m[1]}")
def test_packed_rows_decode_to_the_network_routes(mesh):
    network = _network(*mesh, (12, 40, 5), 8)
    _check_decodes(network.routes(), network.upstream())


@pytest.mark.parametrize("seed", [0, 1])
def test_many_distinct_routes_pack_and_decode(seed):
    """Random tables (targets anywhere, ports that accept or not): hundreds of distinct rows, so the
    packer's table of rows grows and its hash slots are rebuilt, and every row still decodes."""
    rng = np.random.default_rng(seed)
    routers, colors, most = 60, 8, 5
    n_targets = rng.integers(0, most + 1, (routers, colors))
    kind = rng.integers(0, 3, (routers, colors, most))            # TO_ROUTER, TO_PE, TO_EDGE
    target = rng.integers(0, routers, (routers, colors, most))
    port = rng.integers(0, 5, (routers, colors, most))
    input_port = rng.integers(0, 6, (routers, colors))
    routes = Routes(input_port, rng.integers(0, 32, (routers, colors)), n_targets, kind, target, port, 2, 2, 4)
    upstream = np.where(rng.random((routers, colors)) < 0.5, rng.integers(0, routers, (routers, colors)),
                        rng.integers(-2, 0, (routers, colors)))
    rows, _ = pack_routes(routes, upstream)
    assert rows.shape[0] > 256
    _check_decodes(routes, upstream)


def test_routers_of_one_class_share_their_rows():
    network = _network(16, 16, (24, 64, 10), 32)
    rows, index = pack_routes(network.routes(), network.upstream())
    routers, colors = index.shape
    assert len(np.unique(index)) == rows.shape[0]          # every row is used
    assert rows.shape[0] * 8 <= routers * colors           # one row per router and color before
    assert len(np.unique(rows, axis=0)) == rows.shape[0]   # distinct


def _one_by_one(config, routes):
    """The route tables written entry by entry, in order (the last entry of a router and color holds)."""
    from wse.config import ROUTE_INPUT_NONE, route_outputs
    W, H, C = config.width, config.height, config.colors
    tables = {"input_port": np.full((W * H, C), ROUTE_INPUT_NONE, dtype=np.int64)}
    for name in ("output_mask", "n_targets"):
        tables[name] = np.zeros((W * H, C), dtype=np.int64)
    for name in ("target_kind", "target", "target_port"):
        tables[name] = np.zeros((W * H, C, 5), dtype=np.int64)
    for x, y, color, inp, outputs in routes:
        r = y * W + x
        tables["input_port"][r, color] = ROUTE_INPUT_NONE if inp is None else int(Port(inp))
        mask, outs = route_outputs(x, y, outputs, W, H)
        for k, (port, neighbour) in enumerate(outs):       # a field a kind does not use keeps its value
            if port is Port.RAMP:
                tables["target_kind"][r, color, k], tables["target"][r, color, k] = TO_PE, r
            elif neighbour is not None:
                tables["target_kind"][r, color, k], tables["target"][r, color, k] = TO_ROUTER, neighbour
                tables["target_port"][r, color, k] = int(port.opposite)
            else:
                tables["target_kind"][r, color, k] = 2
        tables["output_mask"][r, color] = mask
        tables["n_targets"][r, color] = len(outs)
    return tables


@pytest.mark.parametrize("mesh", [(8, 8), (5, 3), (6, 1), (1, 4), (1, 1)], ids=lambda m: f"{m[0]}x{m[1]}")
@pytest.mark.parametrize("repeat", [False, True])
def test_network_tables_written_by_kind_equal_entry_by_entry(mesh, repeat):
    """The network's tables, written for all entries alike but for where they are at once, equal the
    tables written entry by entry (edges, corners, one row, one column); with an entry repeated for
    a router and color (another input and outputs, then the first again) the last one holds."""
    torch.manual_seed(0)
    config = FabricConfig(width=mesh[0], height=mesh[1])
    exe_plan = plan(trace(nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 5)), torch.randn(8, 12)),
                    config, 8)
    routes = list(exe_plan.routes)
    if repeat:
        x, y, color, inp, outputs = routes[0]
        routes += [(x, y, color, Port.RAMP, (Port.N, Port.E, Port.S, Port.W, Port.RAMP)), routes[0],
                   (x, y, color, None, (Port.E,))]
    network = Network(config, routes)
    for name, table in _one_by_one(config, routes).items():
        assert np.array_equal(getattr(network, name), table), name
