"""Sparse weight streaming in a training step (``docs/weight_streaming.md``
section 13): the compiler's sparse forward phases (``train.s``'s ``spgemm``
record, index/value streams with carriage returns), functional = golden bit
for bit on whole steps, the static cycle model = golden cycles, PE by PE."""

import shutil

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.firmware.training import timing
from wse.host.compiler import sparse
from wse.host.compiler.schedule import SgemmTransposed, SparseSgemm, SparseSgemmTransposed, SparseWeightGradient
from wse.host.compiler.weight_streaming import FitError
from wse.host.runtime import Runtime
from wse.host.runtime.golden import GoldenBackend


def mlp(*sizes, bias=True):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def sparse_setup(model, batch, mesh, sparsity, extra=None, seed=0):
    torch.manual_seed(seed)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    linear = {k: v for k, v in weights.items() if k.endswith("weight")}
    masks = sparse.layer_masks(linear, sparsity, "random", seed) if sparsity else \
        {k: np.ones(v.shape, bool) for k, v in linear.items()}
    first = next(iter(linear.values()))
    masks[next(iter(linear))][0] = False                     # an output without any non-zero
    exe = sparse.compile_sparse(model, torch.zeros(batch, first.shape[1]), batch=batch, masks=masks, choose=False,
                                config=FabricConfig(width=mesh[0], height=mesh[1], **(extra or {})))
    for k, m in masks.items():
        weights[k] = weights[k] * m
    return exe, masks, weights


CASES = [
    (mlp(13, 11, 5), 6, (3, 3), 0.6, {}),
    (mlp(13, 11, 5), 6, (3, 3), 0.0, {}),
    (mlp(13, 11, 5, bias=False), 4, (2, 4), 0.8, {}),
    (mlp(9, 7, 4), 4, (1, 1), 0.5, {}),
    (mlp(9, 7, 4), 4, (4, 1), 0.5, {}),
    (mlp(9, 17, 6), 16, (2, 2), 0.9, {}),                     # 8 tokens per PE: the ring's limit
    (mlp(9, 7, 4), 8, (4, 3), 0.5, dict(router_depth=1, rx_depth=3, tx_depth=2)),
]


@pytest.mark.parametrize("model,batch,mesh,s,extra", CASES,
                         ids=[f"{c[2][0]}x{c[2][1]}-b{c[1]}-s{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_sparse_step_functional_equals_golden_and_cycles(model, batch, mesh, s, extra):
    exe, masks, weights = sparse_setup(model, batch, mesh, s, extra)
    assert any(isinstance(op, SparseSgemm) for ph in exe.phases.values() for op in ph.math)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((batch, next(iter(masks.values())).shape[1])).astype(np.float32)
    y = rng.integers(0, 4, batch)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    backend = GoldenBackend(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    backend._copy_in(runtime._host(x, y))
    images = {addr: image for addr, image in exe.static}
    pools = {}
    for name in exe.sequences["train"]:
        backend.device.reset_counters()
        cycles = backend.run_phase(name, weights, pools)
        assert cycles == exe.phases[name].cycles, name
        counters = backend.device.counters()["pe"]
        assert counters["fmac"].sum() == exe.phases[name].fmacs, name
        image = images[exe.phases[name].ops_addr]
        for yy in range(mesh[1]):
            for xx in range(mesh[0]):
                ops = timing.pe_ops(image[yy, xx])
                pure = sum(a if op == timing.BUSY else 1 if op == timing.RECV else a + 1
                           for op, a, *_ in ops if op != timing.END)
                assert pure == counters["busy"][yy, xx] - counters["stall"][yy, xx], (name, xx, yy)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    assert np.array_equal(functional.logits.view(np.uint32), golden.logits.view(np.uint32))
    for k in functional.grads:
        assert np.array_equal(functional.grads[k].view(np.uint32), golden.grads[k].view(np.uint32)), k
    assert functional.cycles == golden.cycles


def test_sparse_forward_streams_only_kept_weights_and_equals_dense_on_masked_weights():
    model = mlp(13, 11, 5)
    exe, masks, weights = sparse_setup(model, 6, (3, 3), 0.7)
    streamed = 0
    for name, phase in exe.phases.items():
        if name.startswith("bwd-weight"):       # only the kept weights' gradients leave; the mask streams in
            layer = name.split()[1]
            out = np.concatenate([s.scatter for s in phase.streams_out])
            mask = masks[f"{layer}.weight"]
            assert sorted(out[out < mask.size].tolist()) == np.flatnonzero(mask).tolist()
            assert all(s.tensors == () for s in phase.streams_in) and phase.streams_in
            assert isinstance(phase.math[0], SparseWeightGradient)
        if not name.startswith(("fwd", "bwd-data")):
            continue
        layer = name.split()[1]
        values = [s.gather[s.gather < masks[f"{layer}.weight"].size] for s in phase.streams_in]
        assert sorted(np.concatenate(values).tolist()) == np.flatnonzero(masks[f"{layer}.weight"]).tolist()
        assert any(isinstance(op, (SparseSgemm, SparseSgemmTransposed)) for op in phase.math)
        streamed += 1
    assert streamed == 3                                    # fwd 0, fwd 2, bwd-data 2
    dense = sparse.compile_sparse(model, torch.zeros(6, 13), batch=6, masks={}, config=FabricConfig(width=3, height=3))
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((6, 13)).astype(np.float32), rng.integers(0, 5, 6)
    a = Runtime(exe, "functional").train_step(x, y, weights)
    b = Runtime(dense, "functional").train_step(x, y, weights)
    assert np.array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32))
    for k in a.grads:       # the kept weights' gradients are the dense ones' bits, the pruned ones +0
        kept = masks.get(k, np.ones(a.grads[k].shape, bool))
        assert np.array_equal(a.grads[k][kept].view(np.uint32), b.grads[k][kept].view(np.uint32)), k
        assert not a.grads[k][~kept].view(np.uint32).any(), k
    # at 2 tokens per PE and 1 to 2 non-zeros per step the per-step costs dominate; on a wider layer the
    # sparse forward is the cheaper one
    model = mlp(64, 48, 5)
    exe, _, _ = sparse_setup(model, 12, (3, 3), 0.9)
    dense = sparse.compile_sparse(model, torch.zeros(12, 64), batch=12, masks={}, config=FabricConfig(width=3, height=3))
    fwd = [name for name in exe.sequences["train"] if name.startswith("fwd")]
    assert sum(exe.phases[n].cycles for n in fwd) < 0.5 * sum(dense.phases[n].cycles for n in fwd)


def test_a_step_without_a_non_zero_on_a_row_sends_only_its_ring_kind():
    """Per row: a carriage return for each output with a kept weight among the row's features,
    one ring kind per output, ``-3`` and ``-6`` for the one block; nothing else is a control wavelet,
    and the data wavelets are the pairs and the FIRST/ONLY bias words."""
    model = mlp(40, 24, 5)
    exe, masks, _ = sparse_setup(model, 6, (3, 3), 0.95)
    H, checked = 3, 0
    for name in ("fwd 0", "bwd-data 2"):
        phase = exe.phases[name]
        grid = masks["0.weight"] if name == "fwd 0" else masks["2.weight"].T     # [outputs, features]
        outputs = grid.shape[0]
        x, y = ("act0", "act1") if name == "fwd 0" else ("grad2", "grad1")
        rows_in = exe.layout.slots(x, grid.shape[1]) % H                      # each feature's row
        rows_out = exe.layout.slots(y, outputs) % H
        for stream in phase.streams_in:
            i = stream.index
            busy = grid[:, rows_in == i].any(axis=1)
            assert not busy.all()                                               # some steps are empty here
            firsts = int((rows_out == (i - 1) % H).sum())                       # ring position 0: one a round
            assert int(stream.ctrl.sum()) == int(busy.sum()) + outputs + 2, (name, i)
            pairs = 2 * int(grid[:, rows_in == i].sum())
            assert len(stream.gather) - int(stream.ctrl.sum()) == pairs + firsts, (name, i)   # (-0.0 without bias)
            checked += 1
    assert checked == 2 * H


def test_sparse_mapping_errors():
    model = mlp(13, 11, 5)
    cfg = FabricConfig(width=4, height=3)
    with pytest.raises(FitError, match="same tokens on every column"):
        sparse.compile_sparse(model, torch.zeros(6, 13), batch=6, config=cfg,
                              masks={"0.weight": np.ones((11, 13), bool)})
    with pytest.raises(UsageError, match="mask of 0.weight has shape"):
        sparse.compile_sparse(model, torch.zeros(8, 13), batch=8, config=cfg, masks={"0.weight": np.ones((13, 11))})
    with pytest.raises(UsageError, match="no Linear weight"):
        sparse.compile_sparse(model, torch.zeros(8, 13), batch=8, config=cfg, masks={"0.bias": np.ones(11)})


icarus = pytest.mark.skipif(shutil.which("iverilog") is None, reason="iverilog is not installed")


@pytest.mark.parametrize("backend", ["verilator", "vector", pytest.param("vector-torch-cpu", marks=pytest.mark.slow),
                                     pytest.param("icarus", marks=[icarus, pytest.mark.slow])])
def test_sparse_step_on_the_rtl_and_vector_model_equals_functional_and_cycles(backend):
    """One sparse training step (sparse forward, input and weight gradients) on the
    Verilator RTL, on the vectorized fabric model (numba; slow: torch on the CPU) and (slow)
    on the Icarus RTL under cocotb."""
    setups = [(mlp(9, 7, 4), 4, (2, 2), 0.5)]
    if backend in ("verilator", "vector"):      # and every ring kind of a step without a non-zero on a row
        setups.append((mlp(13, 11, 5), 6, (3, 3), 0.9))
    for model, batch, mesh, s in setups:
        exe, masks, weights = sparse_setup(model, batch, mesh, s)
        rng = np.random.default_rng(2)
        x, y = rng.standard_normal((batch, model[0].in_features)).astype(np.float32), rng.integers(0, 4, batch)
        functional = Runtime(exe, "functional").train_step(x, y, weights)
        rtl = Runtime(exe, backend).train_step(x, y, weights)
        assert np.array_equal(functional.logits.view(np.uint32), rtl.logits.view(np.uint32))
        for k in functional.grads:
            assert np.array_equal(functional.grads[k].view(np.uint32), rtl.grads[k].view(np.uint32)), k
        assert rtl.cycles == functional.cycles == sum(exe.phases[n].cycles for n in exe.sequences["train"])


def test_compiler_keeps_a_phase_dense_where_the_sparse_one_is_slower():
    model = mlp(13, 11, 5)
    cfg = FabricConfig(width=3, height=3)
    full = {"0.weight": np.ones((11, 13), bool), "2.weight": np.ones((5, 11), bool)}
    sparse_every = sparse.compile_sparse(model, torch.zeros(6, 13), batch=6, masks=full, config=cfg, choose=False)
    dense = sparse.compile_sparse(model, torch.zeros(6, 13), batch=6, masks={}, config=cfg)
    chosen = sparse.compile_sparse(model, torch.zeros(6, 13), batch=6, masks=full, config=cfg)
    for name, phase in chosen.phases.items():     # every weight kept: each phase the cheaper of the two
        assert phase.cycles == min(sparse_every.phases[name].cycles, dense.phases[name].cycles), name
    assert sum(p.cycles for p in chosen.phases.values()) <= sum(p.cycles for p in dense.phases.values())
    assert not any(isinstance(op, SparseSgemm) for op in chosen.phases["fwd 0"].math)


def test_a_mixed_executable_runs_functional_equal_to_golden():
    """Masked layers with some phases sparse and some kept dense by the choice."""
    torch.manual_seed(0)
    model = mlp(40, 30, 5)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    masks = sparse.layer_masks({k: weights[k] for k in ("0.weight", "2.weight")}, 0.6, "random", 1)
    exe = sparse.compile_sparse(model, torch.zeros(8, 40), batch=8, masks=masks, config=FabricConfig(width=2, height=3))
    kinds = {type(op) for phase in exe.phases.values() for op in phase.math}
    assert SparseSgemm in kinds and SgemmTransposed in kinds     # both layers are masked: a mix
    for k, m in masks.items():
        weights[k] = weights[k] * m
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((8, 40)).astype(np.float32), rng.integers(0, 5, 8)
    a = Runtime(exe, "functional").train_step(x, y, weights)
    b = Runtime(exe, "golden").train_step(x, y, weights)
    assert a.cycles == b.cycles and np.array_equal(a.logits.view(np.uint32), b.logits.view(np.uint32))
    for k in a.grads:
        assert np.array_equal(a.grads[k].view(np.uint32), b.grads[k].view(np.uint32)), k
