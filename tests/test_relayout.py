"""The relayout kernel (``firmware/kernels/relayout.*``) and the side-by-side
attention instances it feeds (``host/compiler/gpt_tiles.py``,
``docs/transformer.md`` section 11): every word arrives unchanged at its
destination on the golden model, on 1x1 to 4x4 and non-square meshes, with
the static cycle model's count of every stage; several (sequence, head)
instances on disjoint tiles in one program give each instance the one-head
kernels' bits."""

from __future__ import annotations

import numpy as np
import pytest

from wse import numerics as fp
from wse.config import FabricConfig, UsageError
from wse.firmware.deadlock import load_checked
from wse.firmware.kernels import relayout_timing
from wse.firmware.kernels.attention import attention_operands, attention_products
from wse.firmware.kernels.common import write_params
from wse.firmware.kernels.relayout import plan_relayout
from wse.firmware.training import transformer as tf
from wse.host.compiler.gpt_tiles import (head_tiling, relayout_cycles, relayout_in, relayout_out, round_cycles,
                                         round_kernel)
from wse.host.compiler.replay import Network, replay
from wse.sim.devices import make_device


def _golden(config):
    return make_device("golden", config)


def _random_moves(width: int, height: int, n: int, seed: int):
    """``n`` words from random sources (some read twice) to distinct random destinations."""
    rng = np.random.default_rng(seed)
    src = np.stack([rng.integers(0, width, n), rng.integers(0, height, n), 100 + rng.integers(0, 40, n)], 1)
    cells = [(x, y, a) for x in range(width) for y in range(height) for a in range(200, 260)]
    dst = np.array([cells[i] for i in rng.permutation(len(cells))[:n]])
    words = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    first: dict = {}
    for i, key in enumerate(map(tuple, src.tolist())):        # one value per source word
        words[i] = first.setdefault(key, words[i])
    return src, dst, words


@pytest.mark.parametrize("width,height", [(1, 1), (2, 1), (1, 3), (2, 2), (3, 2), (2, 3), (4, 4)])
def test_relayout_moves_every_word_with_the_static_cycles(width, height):
    cfg = FabricConfig(width=width, height=height)
    src, dst, words = _random_moves(width, height, min(80, width * height * 40), width * 7 + height)
    plan = plan_relayout(cfg, src, dst, 300)
    got, cycles = plan.execute(_golden, words)
    assert np.array_equal(got, words)
    mirror = [int(replay(Network(cfg, s.routes()), *relayout_timing.timing_ops(s)[1:4], {}, periods=False))
              for s in plan.stages]
    assert cycles == mirror == relayout_cycles(plan)
    assert [s.name for s in plan.stages] == (["local"] if width * height == 1 else
                                             [n for n, size in (("rows", width), ("columns", height)) if size > 1])


def test_relayout_strided_runs_are_one_move_each():
    """A 4 x 8 block transposed into another PE: one piece per destination row (stride 8 at the source)."""
    cfg = FabricConfig(width=2, height=1)
    i, j = np.meshgrid(np.arange(4), np.arange(8), indexing="ij")
    src = np.stack([np.zeros(32, int), np.zeros(32, int), 100 + (i * 8 + j).ravel()], 1)
    dst = np.stack([np.ones(32, int), np.zeros(32, int), 200 + (j * 4 + i).ravel()], 1)
    plan = plan_relayout(cfg, src, dst, 300)
    (stage,) = plan.stages
    assert len(stage.entries(0, 0)) == 8 and len(stage.entries(1, 0)) == 8
    assert all(entry[0][1] >> 16 == 8 and entry[2] == 4 for entry in stage.entries(0, 0))
    words = np.arange(32, dtype=np.uint32) * 3
    assert np.array_equal(plan.execute(_golden, words)[0], words)


@pytest.mark.parametrize("width,height", [(4, 1), (1, 4), (3, 3)])
def test_relayout_passes_a_run_for_several_pes_on(width, height):
    """A run that every other PE needs at the same address leaves its source once per direction:
    each PE keeps it and sends its copy on; the copies for other rows are staged once per column
    (the source PE at the middle of the lines)."""
    cfg = FabricConfig(width=width, height=height)
    sx, sy, n = width // 2, height // 2, 12
    targets = [(x, y) for y in range(height) for x in range(width) if (x, y) != (sx, sy)]
    src = np.array([(sx, sy, 100 + i) for _ in targets for i in range(n)])
    dst = np.array([(x, y, 200 + i) for x, y in targets for i in range(n)])
    plan = plan_relayout(cfg, src, dst, 300)
    words = np.tile(np.arange(n, dtype=np.uint32) * 7 + 1, len(targets))
    got, cycles = plan.execute(_golden, words)
    assert np.array_equal(got, words) and cycles == relayout_cycles(plan)
    first = plan.stages[0]
    sends = [e for e in first.entries(sx, sy) if e[3] == -1 and e[4] != -1]
    sides = (sx > 0) + (sx < width - 1) if width > 1 else (sy > 0) + (sy < height - 1)
    # one run per side along a line; in two dimensions also one staged copy per side for the columns
    assert len(sends) == sides * (2 if width > 1 and height > 1 else 1)


def test_relayout_refuses_bad_addresses_and_clashes():
    cfg = FabricConfig(width=2, height=2)
    with pytest.raises(UsageError, match="destination address is outside"):
        plan_relayout(cfg, np.array([[0, 0, 100]]), np.array([[1, 1, 400]]), 300)
    with pytest.raises(UsageError, match="two words go to one destination"):
        plan_relayout(cfg, np.array([[0, 0, 100], [0, 0, 101]]), np.array([[1, 1, 200], [1, 1, 200]]), 300)
    with pytest.raises(UsageError, match="needs .* words per PE"):
        plan_relayout(cfg.replace(sram_words=320), np.array([[0, 0, 100]]), np.array([[1, 1, 200]]), 318)


@pytest.mark.parametrize("width,height,sequences,heads", [(4, 4, 2, 2), (3, 2, 3, 1), (4, 2, 1, 2)])
def test_instances_side_by_side_equal_one_head_kernels(width, height, sequences, heads):
    """q, k, v relaid from the streamed GEMM's layout into the tiles, scores, softmax and values on
    every tile at once, the output relaid back: each instance's output is the one-head reference's."""
    cfg = FabricConfig(width=width, height=height)
    t, dh, scale = 8, 4, 0.5
    rng = np.random.default_rng(width + 10 * height)
    q, k, v = (tf.bits(rng.standard_normal((sequences, heads, t, dh), dtype=np.float32)) for _ in range(3))
    tiling = head_tiling(cfg, sequences, heads, t, dh, scale)
    assert len(tiling.rounds) >= 1 and len(tiling.origins) >= 1
    out = np.zeros_like(q)
    for r, ids in enumerate(tiling.rounds):
        image = np.zeros((cfg.height, cfg.width, tiling.top - tiling.base), dtype=np.uint32)
        plan, index = relayout_in(tiling, r, ("q", "k", "v"))
        stacked = {0: q, 1: k, 2: v}
        values = np.array([stacked[m][b, h, i, d] for m, b, h, i, d in index.tolist()], dtype=np.uint32)
        words, cycles = plan.execute(_golden, values)
        assert cycles == relayout_cycles(plan)
        x, y, a = plan.dst.T
        image[y, x, a - tiling.base] = words
        for variant in ("scores", "sf", "values"):
            kernel = round_kernel(tiling, variant, scale, len(ids))
            device = _golden(cfg)
            device.load(kernel.program)
            load_checked(device, cfg, kernel.routes, f"attention {variant}", rings=kernel.rings)
            write_params(device, kernel.program, kernel.params)
            device.memcpy_h2d(tiling.base, image)
            device.launch(0)
            assert device.run() == round_cycles(tiling, variant, scale, len(ids))
            image = device.memcpy_d2h(tiling.base, image.shape[-1])
        plan, index = relayout_out(tiling, r, "values")
        x, y, a = plan.src.T
        words, cycles = plan.execute(_golden, image[y, x, a - tiling.base])
        assert cycles == relayout_cycles(plan)
        b, h, i, d = index.T
        out[b, h, i, d] = words
    for b in range(sequences):
        for h in range(heads):
            ops = attention_operands(*(fp.as_float(m[b, h]) for m in (q, k, v, v)), scale)
            assert np.array_equal(out[b, h], attention_products("values", ops, scale)), (b, h)
