"""The replay's packed routes (``replay_routes.pack_routes``): distinct rows with targets
relative to the router and a row number per router and color. Decoded, every
route's row gives back the network's own tables (targets, ports, the ``_NEVER``
mark, the upstream), and the routers of one class share their rows.
"""

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig
from wse.host.compiler import trace
from wse.host.compiler.network import TO_PE, TO_ROUTER, Network
from wse.host.compiler.replay_routes import _MASK, _N, _NEVER, _TARGETS, _UP, _UP_AT, pack_routes
from wse.host.compiler.weight_streaming import plan


def _network(width, height, sizes, batch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(sizes[0], sizes[1]), nn.ReLU(), nn.Linear(sizes[1], sizes[2]))
    exe_plan = plan(trace(model, torch.randn(batch, sizes[0])), FabricConfig(width=width, height=height), batch)
    return Network(exe_plan.config, exe_plan.routes)


@pytest.mark.parametrize("mesh", [(8, 8), (5, 3), (6, 1), (1, 4)], ids=lambda m: f"{m[0]}x{m[1]}")
def test_packed_rows_decode_to_the_network_routes(mesh):
    network = _network(*mesh, (12, 40, 5), 8)
    routes = network.routes()
    upstream = network.upstream()
    rows, index = pack_routes(routes, upstream)
    bare_rows, bare_index = pack_routes(routes)
    assert index.dtype == np.int16 and rows.dtype == np.int32
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


def test_routers_of_one_class_share_their_rows():
    network = _network(16, 16, (24, 64, 10), 32)
    rows, index = pack_routes(network.routes(), network.upstream())
    routers, colors = index.shape
    assert len(np.unique(index)) == rows.shape[0]          # every row is used
    assert rows.shape[0] * 8 <= routers * colors           # one row per router and color before
    assert len(np.unique(rows, axis=0)) == rows.shape[0]   # distinct
