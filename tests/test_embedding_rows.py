"""MemoryX's embedding rows as edge streams of a real program
(``firmware/kernels/embedding_rows.py``, ``docs/transformer.md`` section 11):
the words arrive unchanged (in: at their PEs; out: at the edges), and the
static cycle mirror equals the golden model's cycles, on square and
non-square meshes, with fewer tokens than columns and more features than rows."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.firmware.kernels import embedding_rows_timing
from wse.firmware.kernels.embedding_rows import plan_rows
from wse.host.compiler.replay import Network, replay
from wse.sim.devices import make_device


def _golden(config):
    return make_device("golden", config)


@pytest.mark.parametrize("width,height,tokens,features", [(4, 4, 16, 16), (3, 2, 7, 5), (1, 1, 3, 2),
                                                          (5, 3, 3, 4), (2, 4, 6, 3), (4, 2, 33, 6)])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_words_arrive_unchanged_and_the_mirror_counts_the_cycles(width, height, tokens, features, direction):
    cfg = FabricConfig(width=width, height=height)
    plan = plan_rows(cfg, tokens, features, direction)
    rng = np.random.default_rng(width * 100 + tokens)
    matrix = rng.integers(0, 2**32, (tokens, features), dtype=np.uint64).astype(np.uint32)
    got, cycles = plan.execute(_golden, matrix)
    assert np.array_equal(got, matrix)
    routes, ops, starts, ends, inject = embedding_rows_timing.timing_ops(plan)
    assert cycles == replay(Network(cfg, routes), ops, starts, ends, inject, periods=False)


def test_both_edges_share_a_row_and_cycles_follow_the_words():
    cfg = FabricConfig(width=8, height=2)
    plan = plan_rows(cfg, 64, 4, "in")
    assert [(s.edge, len(s.cells)) for s in plan.segments] == [("W", 4), ("E", 4)] * 2
    assert sum(plan.edge_words(s) for s in plan.segments) == 64 * 4
    _, cycles = plan.execute(_golden, np.zeros((64, 4), dtype=np.uint32))
    assert cycles == 118          # each edge port carries a quarter of the words (64), pinned


def test_refusals():
    with pytest.raises(UsageError, match="need .* words per PE but sram_words"):
        plan_rows(FabricConfig(width=1, height=1, sram_words=256), 300, 1, "in")
    with pytest.raises(UsageError, match="at least one token"):
        plan_rows(FabricConfig(width=2, height=2), 0, 4, "out")
    with pytest.raises(ValueError, match="direction"):
        plan_rows(FabricConfig(width=2, height=2), 4, 4, "sideways")
