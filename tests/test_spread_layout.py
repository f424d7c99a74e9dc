"""The spread layout of weight streaming (``docs/weight_streaming.md`` section 3): a partial last
round of features spread evenly over the ring. The firmware's live-step counter finds exactly the
spread rows, every output still rings once through every row, the functional backends (numba and
torch) give the golden model's bits on whole steps, dense and sparse, and the static cycle model
its cycles; executables written before the choice existed load cyclic."""

import numpy as np
import pytest
import torch

from wse.config import FabricConfig, UsageError
from wse import numerics as fp
from wse.host.compiler import compile_model, sparse, weight_streaming
from wse.host.compiler.layouts import WeightStreamingLayout, feature_slots, last_round_counter, spreads
from wse.host.compiler.ws_phases import row_features, sgemm_steps
from wse.host.runtime import Runtime, kernels, torch_kernels
from wse.host.runtime.slots import GemmSlots

from mlps import mlp


# The map and the firmware's counter -----------------------------------------------------------

@pytest.mark.parametrize("height", [1, 2, 3, 4, 7, 16, 33])
def test_slots_spread_the_last_round_and_the_counter_finds_its_rows(height):
    for n in range(1, 4 * height + 3):
        slots = feature_slots(n, height, True)
        assert (np.diff(slots) > 0).all() and slots[0] == 0
        rounds, last = divmod(n, height)
        if not spreads(n, height, True):
            assert (slots == np.arange(n)).all()
            assert n <= height or last == 0
            continue
        assert (slots[:rounds * height] == np.arange(rounds * height)).all()
        homes = slots[rounds * height:] - rounds * height
        gaps = np.diff(np.concatenate([homes, [homes[0] + height]]))
        assert gaps.max() - gaps.min() <= 1                           # evenly spaced around the ring
        for row in range(height):
            e, step = last_round_counter(row, height, n, True)
            live = []
            for p in range(height):
                if e < last:
                    live.append((row - 1 - p) % height)
                e -= step
                e += height if e < 0 else 0
            assert sorted(live) == sorted(homes.tolist()), (n, row)
        assert last_round_counter(3 % height, height, n, False) == ((3 % height - 1) % height, 1)


@pytest.mark.parametrize("height,outputs", [(4, 7), (4, 22), (5, 13), (7, 9), (16, 37)])
def test_every_spread_output_rings_once_and_lands_on_its_slot_row(height, outputs):
    slots = feature_slots(outputs, height, True)
    ends = {}
    for row in range(height):
        o, p = sgemm_steps(row, height, outputs, spread=True)
        assert sorted(o.tolist()) == list(range(outputs))
        for out, pos in zip(o.tolist(), p.tolist()):
            assert pos == (row - slots[out] % height - 1) % height
            if pos == height - 1:
                ends.setdefault(out, []).append(row)
        local = row_features(outputs, height, True)[row]
        ending = [out for out, pos in zip(o.tolist(), p.tolist()) if pos == height - 1]
        assert ending == local.tolist()                               # stored in local order
    assert all(ends[out] == [int(slots[out] % height)] for out in range(outputs))


# The functional kernels in slots against a slow reference of the fabric's order ----------------

def _reference(w, x, bias, rows_in, row_out, height):
    """``y`` in the fabric's binary32 order with features on rows ``rows_in`` and each output
    ending on ``row_out[o]`` (fp: flushed operands and results)."""
    w, x = fp.as_bits(w), fp.as_bits(x)
    y = np.zeros((w.shape[0], x.shape[1]), dtype=np.uint32)
    for o in range(w.shape[0]):
        part = np.zeros((height, x.shape[1]), dtype=np.uint32)
        for k in range(w.shape[1]):
            part[rows_in[k]] = fp.vadd(part[rows_in[k]], fp.vmul(x[k], np.full(x.shape[1], w[o, k], np.uint32)))
        s = (row_out[o] + 1) % height
        acc = fp.vadd(part[s], np.full(x.shape[1], fp.as_bits(bias)[o], np.uint32))
        for q in range(1, height):
            acc = fp.vadd(acc, part[(s + q) % height])
        y[o] = acc
    return y.view(np.float32)


def _layout(height, n_layers=2):
    layers = tuple(weight_streaming.WSLayer(i, f"l{i}", f"l{i}.w", None, 1, 1, True) for i in range(n_layers))
    return WeightStreamingLayout(layers, False, height, 1, (1,), (0,), "", True)


@pytest.mark.parametrize("case", ["random", "tiny", "signed_zero"])
def test_sgemm_in_slots_is_the_fabric_order_with_spread_rows(case):
    height, n_in, n_out, tokens = 4, 10, 6, 5
    rng = np.random.default_rng(3)
    w = rng.standard_normal((n_out, n_in)).astype(np.float32)
    x = rng.standard_normal((n_in, tokens)).astype(np.float32)
    bias = rng.standard_normal(n_out).astype(np.float32)
    if case == "tiny":          # products and sums near the subnormal range: flushes
        w *= np.float32(2.0 ** -63)
        x *= np.float32(2.0 ** -62)
        bias[:] = -0.0
        w[:, ::3] = -w[:, ::3]
    if case == "signed_zero":   # every row's partial sum -0 (a flushed sum): a +0 phantom would show
        x[:] = 1.0
        w[:, :4] = np.float32(2.0 ** -120)
        w[:, 4:8] = -np.float32(2.0 ** -120 + 2.0 ** -130)
        w[:, 8:] = -0.0
        bias[:] = -0.0
    layout = _layout(height)
    slots = GemmSlots.of(layout, "act0", "act1", n_in, n_out)
    assert slots is not None
    rows_in = feature_slots(n_in, height, True) % height
    row_out = feature_slots(n_out, height, True) % height
    want = _reference(w, x, bias, rows_in, row_out, height)
    got = slots.result(kernels.sgemm(slots.weight(w), slots.activations(x), slots.bias(bias), height))
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    tw, tx, tb = (torch.from_numpy(a.copy()) for a in (w, x, bias))
    on_torch = slots.result(torch_kernels.sgemm(slots.weight(tw), slots.activations(tx), slots.bias(tb), height))
    assert np.array_equal(on_torch.numpy().view(np.uint32), want.view(np.uint32))
    if case == "signed_zero":
        assert (want.view(np.uint32) == 0x80000000).all()
    assert GemmSlots.of(layout, "act1", "act2", 8, 7) is None              # the logits stay cyclic


def test_layout_names_tensors_and_old_files_load_cyclic():
    layout = _layout(4)
    assert layout.spread_tensor("act0") and layout.spread_tensor("grad1") and layout.spread_tensor("act1tm")
    assert not layout.spread_tensor("act2") and not layout.spread_tensor("grad2")
    with pytest.raises(UsageError, match="tensor must be named act<l>, grad<l> or act<l>tm, not 'w'"):
        layout.slots("w", 3)
    data = layout.to_dict()
    assert WeightStreamingLayout.from_dict(data) == layout
    del data["spread"]
    old = WeightStreamingLayout.from_dict(data)
    assert not old.spread and (old.slots("act0", 10) == np.arange(10)).all()


# Whole steps: functional (numba, torch) = golden bits, static cycles = golden cycles -----------

def _step_agrees(exe, batch, weights, backends=("functional", "functional-torch-cpu")):
    rng = np.random.default_rng(1)
    features = exe.layout.layers[0].k
    x = rng.standard_normal((batch, features)).astype(np.float32)
    y = rng.integers(0, exe.layout.layers[-1].o, batch)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    for name in backends:
        got = Runtime(exe, name).train_step(x, y, weights)
        assert np.array_equal(got.logits.view(np.uint32), golden.logits.view(np.uint32)), name
        for key in golden.grads:
            assert np.array_equal(got.grads[key].view(np.uint32), golden.grads[key].view(np.uint32)), (name, key)
        assert got.phases == golden.phases, name
    return golden


@pytest.mark.parametrize("sizes,batch,mesh", [
    ((22, 14, 9), 8, (4, 4)),          # 22 and 14 on 4 rows: last rounds on rows 0, 2
    ((23, 19, 13, 5), 6, (3, 5)),      # non-square; 13 = 2*5 + 3 on rows 0, 1, 3
    ((9, 7, 4), 4, (4, 1)),            # one row: nothing to spread
])
def test_dense_step_spread_functional_equals_golden(sizes, batch, mesh):
    torch.manual_seed(0)
    model = mlp(*sizes)
    exe = compile_model(model, torch.randn(batch, sizes[0]), batch=batch,
                        config=FabricConfig(width=mesh[0], height=mesh[1]))
    assert exe.layout.spread
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    golden = _step_agrees(exe, batch, weights)
    for name, phase in exe.phases.items():
        assert golden.phases[name] == phase.cycles, name


def test_sparse_step_spread_functional_equals_golden():
    torch.manual_seed(2)
    model = mlp(22, 14, 6)
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    linear = {k: v for k, v in weights.items() if k.endswith("weight")}
    masks = sparse.layer_masks(linear, 0.6, "random", 4)
    exe = sparse.compile_sparse(model, torch.zeros(8, 22), batch=8, masks=masks, choose=False,
                                config=FabricConfig(width=4, height=4))
    assert exe.layout.spread
    for k, m in masks.items():
        weights[k] = weights[k] * m
    _step_agrees(exe, 8, weights, ("functional",))


def test_cyclic_plans_remain_and_agree(monkeypatch):
    monkeypatch.setattr(weight_streaming, "SPREAD", False)
    torch.manual_seed(0)
    model = mlp(22, 14, 9)
    exe = compile_model(model, torch.randn(8, 22), batch=8, config=FabricConfig(width=4, height=4))
    assert not exe.layout.spread
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    _step_agrees(exe, 8, weights, ("functional",))
