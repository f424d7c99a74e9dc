"""The replay's narrow state (``replay_state._new_state``): colors, output-queue heads and
counts in int8, the mask of non-empty FIFOs in int32 up to 31 colors (int64 with 32), event
PEs and element indices in int32, and the packed rows' ``_RAMP_IN`` read instead of the int64
input ports. The counts stay the golden model's with the highest colors (the mask's top bits)
on every engine, and ``_RAMP_IN`` decodes to the network's input ports.
"""

import numpy as np
import pytest

import tests.test_router_model as router_model
from wse.config import FabricConfig, Port
from wse.host.compiler.cycles import Network
from wse.host.compiler.replay import _edge_ports, _new_state
from wse.host.compiler.replay_routes import _RAMP_IN, pack_routes
from tests.test_replay_routes import _network


@pytest.mark.parametrize("mesh", [(8, 8), (5, 3), (1, 4)], ids=lambda m: f"{m[0]}x{m[1]}")
def test_ramp_in_decodes_to_the_input_ports(mesh):
    network = _network(*mesh, (12, 40, 5), 8)
    routes = network.routes()
    for upstream in (None, network.upstream()):
        rows, index = pack_routes(routes, upstream)
        assert np.array_equal(rows[index, _RAMP_IN] == 1, routes.input_port == int(Port.RAMP))
    assert (routes.input_port == int(Port.RAMP)).any()


@pytest.mark.parametrize("colors", [7, 31, 32])
def test_the_state_is_as_narrow_as_its_values(colors):
    config = FabricConfig(width=3, height=2, colors=colors)
    network = Network(config, [])
    routes = network.routes()
    queues, cores, events = _new_state(routes, _edge_ports(network, {}), np.zeros(6, dtype=np.int64))
    assert queues.router_fifo.dtype == queues.rx.dtype == queues.tx_head.dtype == queues.tx_count.dtype == np.int8
    assert queues.tx_colors.dtype == np.int8 and events.color.dtype == np.int8
    assert queues.busy_fifos.dtype == (np.int32 if colors <= 31 else np.int64)
    assert events.who.dtype == cores.vector_index.dtype == np.int32
    assert cores.free_at.dtype == cores.written_at.dtype == cores.waited_at.dtype == cores.pc.dtype == np.int64


def _high_color_case(seed, colors, monkeypatch):
    """``test_router_model``'s random case on a fabric of ``colors`` colors (its streams take any of them)."""
    monkeypatch.setattr(router_model, "FabricConfig", lambda **kw: FabricConfig(**{**kw, "colors": colors}))
    return router_model.random_case(seed)


@pytest.mark.parametrize("colors", [31, 32])
@pytest.mark.parametrize("seed", range(6))
def test_the_highest_colors_count_the_golden_cycles_on_every_engine(colors, seed, monkeypatch):
    """Random traffic of up to 32 colors (the mask's sign bit of int32 is never a color's:
    31 colors keep int32, 32 take int64): every engine counts the golden fabric's cycles."""
    config, routes, streams, programs = _high_color_case(seed, colors, monkeypatch)
    cycles, _ = router_model.golden_cycles(config, routes, streams, programs)
    for engine in ("reference", "events", "adaptive"):
        monkeypatch.setattr("wse.host.compiler.replay.DEFAULT_ENGINE", engine)
        assert router_model.replay_cycles(config, routes, streams, programs) == cycles, engine


def test_the_cases_use_the_top_colors(monkeypatch):
    """The cases above reach the top of the mask (else they would check nothing new)."""
    used = set()
    for seed in range(6):
        _, routes, _, _ = _high_color_case(seed, 32, monkeypatch)
        used |= {route[2] for route in routes}
    assert {30, 31} <= used


@pytest.mark.parametrize("colors", [31, 32])
def test_the_top_color_beside_idle_routes_counts_the_golden_cycles(colors, monkeypatch):
    """The top color streamed from the west edge through a row of routers to the east edge, every
    other color routed at every router to its PE and never sent: a router visits only the top
    color (the mask's top bit; a sign bit taken for a color would make it visit idle colors,
    whose routes could go, and forward wavelets that are not there into input queues that no PE
    empties: a hang), on every engine."""
    config = FabricConfig(width=3, height=1, colors=colors)
    top = colors - 1
    routes = [(x, 0, c, Port.W, (Port.E,) if c == top else (Port.RAMP,)) for x in range(3) for c in range(colors)]
    streams = [("W", 0, top, 9)]
    cycles, _ = router_model.golden_cycles(config, routes, streams, {})
    for engine in ("reference", "events", "adaptive"):
        monkeypatch.setattr("wse.host.compiler.replay.DEFAULT_ENGINE", engine)
        assert router_model.replay_cycles(config, routes, streams, {}) == cycles, engine
