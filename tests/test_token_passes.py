"""Token passes of the streamed GEMM (``docs/weight_streaming.md`` section 5.1):
a column's tokens beyond what one message of the partial-sum ring carries run
in passes, the weights streaming once per pass. Whole training steps:
functional = golden bit for bit, every phase's static cycles = golden cycles,
PE by PE; a passes run against one pass of the same tokens."""

import numpy as np
import pytest
import torch
from torch import nn
from test_weight_streaming import compile_for, mlp

from wse.config import FabricConfig
from wse.firmware.training import records, timing
from wse.host.compiler import sparse, trace
from wse.host.compiler.weight_streaming import FitError, pass_limit, plan, token_passes
from wse.host.runtime import Runtime
from wse.host.runtime.golden import GoldenBackend


def data(exe, batch, seed=1):
    rng = np.random.default_rng(seed)
    runtime = Runtime(exe, "functional")
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    y = rng.integers(0, runtime._classes, batch)
    weights = {name: (rng.standard_normal(shape) * 0.5).astype(np.float32)
               for name, shape in exe.parameters().items()}
    return x, y, weights


def same_bits(a, b) -> bool:
    return np.array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


def golden_phases(exe, x, y, weights, mesh):
    """Every training phase on the golden model: its cycles equal the static model's, its FMAC
    count the phase's, and every PE's stall-free cycles the timing mirror's."""
    backend = GoldenBackend(exe)
    backend.load()
    backend._copy_in(Runtime(exe, "functional")._host(x, y))
    images = {addr: image for addr, image in exe.static}
    for name in exe.sequences["train"]:
        backend.device.reset_counters()
        assert backend.run_phase(name, weights, {}) == exe.phases[name].cycles, name
        counters = backend.device.counters()["pe"]
        assert counters["fmac"].sum() == exe.phases[name].fmacs, name
        image = images[exe.phases[name].ops_addr]
        for yy in range(mesh[1]):
            for xx in range(mesh[0]):
                pure = sum(a if op == timing.BUSY else 1 if op == timing.RECV else a + 1
                           for op, a, *_ in timing.pe_ops(image[yy, xx]) if op != timing.END)
                assert pure == counters["busy"][yy, xx] - counters["stall"][yy, xx], (name, xx, yy)


# model, batch, mesh, fabric settings, token passes
CASES = [
    (mlp(9, 7, 5), 40, (2, 2), {}, 3),                                 # 20 tokens per PE: passes of 7, 7, 6
    (mlp(9, 7, 5), 37, (2, 2), {}, 3),                                 # uneven blocks: 19 and 18 tokens
    (mlp(11, 13, 4, bias=False), 36, (3, 3), {}, 2),                   # 12 per PE, no bias
    (mlp(6, 5, 3, relu_last=True), 40, (4, 1), {}, 2),                 # one row: every step its own ring
    (mlp(9, 7, 5), 17, (1, 3), {}, 3),                                 # one column
    (mlp(5, 6, 4), 26, (2, 2), dict(router_depth=1, rx_depth=3, tx_depth=2), 3),   # 6 per pass
    (mlp(4, 6, 12), 40, (2, 2), {}, 3),               # only part of the loss buffers fits the input's words
    (nn.Sequential(nn.ReLU(), nn.Linear(7, 6)), 30, (2, 3), {}, 2),     # one layer, a ReLU on the input
]


@pytest.mark.parametrize("model,batch,mesh,extra,passes", CASES,
                         ids=[f"{c[2][0]}x{c[2][1]}-b{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_passes_step_functional_equals_golden_and_cycles(model, batch, mesh, extra, passes):
    exe = compile_for(model, batch, mesh, **extra)
    assert len(exe.phases[exe.sequences["train"][0]].streams_in[0].gather) % passes == 0
    features = next(m for m in model if isinstance(m, nn.Linear)).in_features
    p = plan(trace(model, torch.zeros(batch, features)), exe.config, batch)
    assert {len(col) for col in p.passes} == {passes}
    x, y, weights = data(exe, batch)
    golden_phases(exe, x, y, weights, mesh)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    assert same_bits(functional.logits, golden.logits)
    for k in functional.grads:
        assert same_bits(functional.grads[k], golden.grads[k]), k
    assert functional.cycles == golden.cycles == sum(exe.phases[n].cycles for n in exe.sequences["train"])


@pytest.mark.parametrize("backend", ["verilator", "vector"])
def test_passes_step_on_the_rtl_and_vector_model_equals_functional_and_cycles(backend):
    """20 tokens per PE in three passes on the Verilator RTL and on the vectorized fabric model."""
    model, batch, mesh = mlp(9, 7, 5), 40, (2, 2)
    exe = compile_for(model, batch, mesh)
    assert len(exe.phases["fwd 0"].streams_in[0].gather) % 3 == 0       # passes of 7, 7, 6
    x, y, weights = data(exe, batch)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    rtl = Runtime(exe, backend).train_step(x, y, weights)
    assert same_bits(functional.logits, rtl.logits)
    assert all(same_bits(functional.grads[k], rtl.grads[k]) for k in functional.grads)
    assert rtl.cycles == functional.cycles == sum(exe.phases[n].cycles for n in exe.sequences["train"])


def test_passes_equal_one_pass_of_the_same_tokens():
    """The same 2x2 mesh with queues deep enough for one pass of 20 tokens: the same
    bits everywhere (each column sums its tokens' weight gradients in the same order);
    a mesh wide enough for one pass with the default queues: the same logits, loss and
    input gradients (a token's sums do not depend on the others), weight gradients
    within rounding only (their sum over tokens runs per column, and the columns differ)."""
    model, batch = mlp(9, 7, 5), 40
    passes = compile_for(model, batch, (2, 2))
    deep = compile_for(model, batch, (2, 2), rx_depth=16)
    wide = compile_for(model, batch, (5, 2))
    assert pass_limit(deep.config) >= 20 and len(deep.phases["fwd 0"].streams_in[0].gather) * 3 == \
        len(passes.phases["fwd 0"].streams_in[0].gather)
    x, y, weights = data(passes, batch)
    a = Runtime(passes, "golden").train_step(x, y, weights)
    b = Runtime(deep, "golden").train_step(x, y, weights)
    c = Runtime(wide, "functional").train_step(x, y, weights)
    assert same_bits(a.logits, b.logits) and same_bits(a.logits, c.logits) and a.loss == b.loss == c.loss
    for k in a.grads:
        assert same_bits(a.grads[k], b.grads[k]), k
        np.testing.assert_allclose(a.grads[k], c.grads[k], rtol=1e-5, atol=1e-6)
    assert a.cycles > b.cycles        # the passes' cost: the weights stream three times


def test_token_passes_deal_every_token_once_west_columns_first():
    for tokens, limit in [([range(0, 20), range(20, 40)], 8), ([range(0, 19), range(19, 37)], 8),
                          ([range(0, 8)], 8), ([range(0, 33), range(33, 65)], 7)]:
        out = token_passes(tokens, limit)
        assert len({len(col) for col in out}) == 1 and len(out[0]) == -(-len(tokens[0]) // limit)
        for col, block in zip(out, tokens):
            assert [o for o, _ in col] == list(np.cumsum([0] + [n for _, n in col])[:-1])
            assert sum(n for _, n in col) == len(block) and max(n for _, n in col) <= limit
        for q in range(len(out[0])):
            assert [col[q][1] for col in out] == sorted((col[q][1] for col in out), reverse=True)


def test_each_pass_gathers_its_tokens_and_streams_the_weights_again():
    exe_plan = plan(trace(mlp(22, 13, 7), torch.randn(64, 22)), FabricConfig(width=4, height=4), 64)
    assert [len(col) for col in exe_plan.passes] == [2] * 4            # 16 tokens per PE, passes of 8
    fwd = exe_plan.phases["fwd 0"]
    kinds = [records.decode(words)[0] for words in fwd.records[1][0]]
    assert kinds == ["transpose", "sgemm", "transpose", "sgemm", "relu", "transpose"]
    for q, words in enumerate(fwd.records[1][0][1:4:2]):
        f = records.decode(words)[1]
        assert f["t"] == 16 and f["y"][2] == 8 and f["y"][1] == exe_plan.regions["act1"][0] + 8 * q
        assert f["x0"][1] == exe_plan.regions["tmp"][0]
    gathered = np.concatenate([s.gather[s.ctrl == 0] for s in fwd.streams_in])
    assert np.array_equal(np.bincount(gathered), np.full(13 * 22, 2))  # every weight streams once per pass
    assert [records.decode(w)[0] for w in exe_plan.phases["bwd-weight 0"].records[0][0]] == ["wgrad"]


def test_one_pass_is_the_record_of_before():
    exe_plan = plan(trace(mlp(22, 13, 7), torch.randn(32, 22)), FabricConfig(width=4, height=4), 32)
    assert exe_plan.passes == [[(0, 8)]] * 4
    kinds = [records.decode(words)[0] for words in exe_plan.phases["fwd 0"].records[0][0]]
    assert kinds == ["sgemm", "relu", "transpose"]
    f = records.decode(exe_plan.phases["fwd 0"].records[0][0][0])[1]
    assert f["t"] == 8 and f["x0"][1] == exe_plan.regions["act0"][0]


def test_memory_not_the_ring_is_the_limit_named():
    with pytest.raises(FitError, match=r"needs \d+ words per PE on a 1x1 mesh .*sram_words is 8192 \(token passes "
                                       r"bound the ring, not memory.*use a smaller batch or a wider mesh"):
        plan(trace(mlp(784, 256, 10), torch.randn(64, 784)), FabricConfig(width=1, height=1), 64)


def test_masked_layers_run_one_pass_only():
    model = mlp(9, 7, 5)
    masks = {"0.weight": np.ones((7, 9), bool)}
    with pytest.raises(FitError, match="sparse weight streaming holds at most 8 tokens per PE.*puts 20 on a PE"):
        sparse.compile_sparse(model, torch.zeros(40, 9), batch=40, masks=masks, choose=False,
                              config=FabricConfig(width=2, height=2))


@pytest.mark.slow
def test_four_passes_of_32_tokens_per_pe_on_golden():
    model, batch, mesh = mlp(20, 24, 10), 128, (4, 4)
    exe = compile_for(model, batch, mesh)
    assert len(exe.phases["fwd 0"].streams_in[0].gather) % 4 == 0
    x, y, weights = data(exe, batch)
    golden_phases(exe, x, y, weights, mesh)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    assert same_bits(functional.logits, golden.logits)
    assert all(same_bits(functional.grads[k], golden.grads[k]) for k in functional.grads)


def _inside(region, outer) -> bool:
    return outer[0] <= region[0] and region[0] + region[1] <= outer[0] + outer[1]


def test_memory_by_pass_and_the_input_words_reused():
    """``tmp``, ``acc`` and the softmax's buffers hold one pass; the activation gradients and
    the softmax's buffers take the model input's words (dead after the first forward phase),
    the last gradient apart from the softmax's buffers (the loss phase writes it); the loss
    runs per pass (gather, softmax, scatter) and the masks in chunks that ``tmp`` holds."""
    p = plan(trace(mlp(40, 12, 5), torch.randn(64, 40)), FabricConfig(width=2, height=2), 64)
    assert [n for _, n in p.passes[0]] == [8, 8, 8, 8]                 # 32 tokens per PE
    r = p.regions
    assert r["tmp"][1] == 20 * 8 and r["acc"][1] == 8 and r["zall"][1] == 5 * 8 and r["m"][1] == 8
    assert r["act0"][1] == 20 * 32 and r["grad1"][1] == 6 * 32 and r["onehot"][1] == 3 * 32
    loss = ("zall", "nb", "fb", "rb", "m", "s", "inv", "stmp")
    for name in ("grad1", "grad2") + loss:
        assert _inside(r[name], r["act0"]), name
    assert all(r[name][0] >= r["grad2"][0] + r["grad2"][1] for name in loss)
    others = sorted((a, a + w) for n, (a, w) in r.items() if n not in ("act0", "grad1", "grad2") + loss)
    assert all(hi <= lo for (_, hi), (lo, _) in zip(others, others[1:]))            # the rest apart
    kinds = [records.decode(w)[0] for w in p.phases["loss"].records[0][0]]
    assert kinds == ["transpose", "softmax", "transpose"] * 4
    kinds = [records.decode(w)[0] for w in p.phases["bwd-data 2"].records[0][0]]
    assert kinds == ["transpose", "sgemm"] * 4 + ["mask"] * 2                       # 6 x 32 words, tmp 160


def test_the_tightest_memory_runs_golden_equal_functional():
    """The smallest ``sram_words`` the plan fits, with the reused words: whole step bit for bit,
    cycles equal; one word less is the memory error."""
    model, batch, mesh = mlp(12, 10, 6), 40, (2, 2)
    words = max(a + w for a, w in plan(trace(model, torch.zeros(batch, 12)), FabricConfig(width=2, height=2),
                                       batch).regions.values())
    exe = compile_for(model, batch, mesh, sram_words=words)
    x, y, weights = data(exe, batch)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    assert same_bits(functional.logits, golden.logits) and functional.cycles == golden.cycles
    assert all(same_bits(functional.grads[k], golden.grads[k]) for k in functional.grads)
    with pytest.raises(FitError, match=f"needs {words} words per PE on a 2x2 mesh"):
        plan(trace(model, torch.zeros(batch, 12)), FabricConfig(width=2, height=2, sram_words=words - 1), batch)


def test_a_sparse_first_layer_weight_gradient_keeps_the_input():
    """``spwgrad`` reads the input feature-major at the end of the step: nothing shares its words."""
    graph = trace(mlp(9, 7, 5), torch.zeros(8, 9))
    masks = {"0.weight": np.ones((7, 9), bool)}
    for dense, shared in (((), False), (("bwd-weight 0",), True)):
        r = plan(graph, FabricConfig(width=2, height=2), 8, masks=masks, dense_phases=dense).regions
        assert _inside(r["grad2"], r["act0"]) == shared


@pytest.mark.parametrize("model,features", [
    (lambda: nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)), 784),
    (lambda: nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)), 64)], ids=["fc_mnist", "mlp_64_256_64"])
def test_512_tokens_fit_16x16_at_the_default_memory(model, features):
    """32 tokens per PE (four passes) on 16x16 within the default 8,192 words per PE."""
    config = FabricConfig(width=16, height=16)
    p = plan(trace(model(), torch.zeros(512, features)), config, 512)
    assert len(p.passes[0]) == 4 and max(a + w for a, w in p.regions.values()) <= config.sram_words == 8192
