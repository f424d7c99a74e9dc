"""The ``functional-torch`` backends: every operation of a weight-streaming step on torch
tensors equals the numba functional backend bit for bit (random, subnormal-producing,
NaN and infinite operands), training steps and SwarmX shards give the same weights,
losses and partials, and ``wse train --backend functional-torch-cpu`` trains to the
numba run's weights. The cases marked ``gpu`` run the same on CUDA (skipped without).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler import compile_model
from wse.host.memoryx import MemoryX
from wse.host.runtime import Runtime, kernels
from wse.host.runtime import torch_kernels as tk

from test_runtime import _random_setups        # the random setups of the golden/functional agreement

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device")])]
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"
BACKEND = {"cpu": "functional-torch-cpu", "cuda": "functional-torch-cuda"}


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def on(device, a):
    return torch.from_numpy(np.array(a, dtype=np.float32)).to(device)


def back(t):
    return t.detach().cpu().numpy()


def operands(rng, shape, kind):
    """float32 operands: ``normal``; ``tiny`` (products and sums reach subnormals, so the
    flushing variant runs); ``special`` (zeros of both signs, infinities, NaNs mixed in)."""
    a = rng.standard_normal(shape).astype(np.float32)
    if kind == "tiny":
        a *= np.float32(3e-20)
        a.reshape(-1)[::5] = np.float32(1e-3)
    elif kind == "special":
        flat = a.reshape(-1)
        picks = rng.integers(0, flat.size, size=max(1, flat.size // 6))
        flat[picks] = rng.choice(np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-30]), size=picks.size)
    return kernels.canonical_nan(np.asarray(tk.flushed(torch.from_numpy(a)).numpy()))


SHAPES = [(7, 13, 5, 4), (10, 22, 8, 1), (3, 9, 6, 3), (16, 16, 2, 5)]     # (O, K, tokens, height)


@pytest.fixture(params=["whole", "chunked"])
def chunks(request, monkeypatch):
    """``chunked``: blocks of a few dozen elements, so that outputs split into many chunks, the last one short."""
    if request.param == "chunked":
        monkeypatch.setattr(tk, "chunk_elements", lambda device: 50)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["normal", "tiny", "special"])
@pytest.mark.parametrize("shape", SHAPES)
def test_gemms_equal_the_numba_loops(device, kind, shape, chunks):
    n_out, n_in, tokens, height = shape
    rng = np.random.default_rng([len(kind), *shape])
    w, x = operands(rng, (n_out, n_in), kind), operands(rng, (n_in, tokens), kind)
    b, dy = operands(rng, (n_out,), kind), operands(rng, (n_out, tokens), kind)
    for bias in (b, None):
        want = kernels.sgemm(w, x, bias, height)
        got = back(tk.sgemm(on(device, w), on(device, x), None if bias is None else on(device, bias), height))
        assert same(want, got), (kind, bias is None)
    assert same(kernels.sgemm_transposed(w, dy, height), back(tk.sgemm_transposed(on(device, w), on(device, dy),
                                                                                  height)))
    keep = rng.random((n_out, n_in)) < 0.4
    nonzeros = np.flatnonzero(keep)
    for bias in (b, None):
        want = kernels.spgemm(w, x, bias, nonzeros, height)
        got = back(tk.spgemm(on(device, w), on(device, x), None if bias is None else on(device, bias), nonzeros,
                             height))
        assert same(want, got), (kind, "sparse", bias is None)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["normal", "tiny", "special"])
@pytest.mark.parametrize("counts", [[3, 3, 2], [1], [4, 1, 2, 2], [2, 2]])
def test_weight_gradients_equal_the_numba_loops(device, kind, counts, chunks):
    rng = np.random.default_rng(len(counts) * 7 + len(kind))
    tokens = sum(counts)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    counts = np.array(counts, dtype=np.int64)
    dy, x = operands(rng, (6, tokens), kind), operands(rng, (11, tokens), kind)
    want_w, want_b = kernels.wgrad(dy, x, starts, counts)
    got_w, got_b = tk.wgrad(on(device, dy), on(device, x), starts, counts)
    assert same(want_w, back(got_w)) and same(want_b, back(got_b))
    want_w, want_b = kernels.wgrad_partials(dy, x, starts, counts)
    got_w, got_b = tk.wgrad_partials(on(device, dy), on(device, x), starts, counts)
    assert same(want_w, back(got_w)) and same(want_b, back(got_b))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["normal", "tiny", "special", "huge"])
def test_softmax_relu_and_mask_equal_the_numba_loops(device, kind):
    rng = np.random.default_rng(5)
    z = operands(rng, (10, 9), "special" if kind == "huge" else kind)
    if kind == "huge":                      # exponents out of range: the scaling's field test and saturation
        z[:, :3] *= np.float32(1e30)
    onehot = np.zeros((10, 9), dtype=np.float32)
    onehot[rng.integers(0, 10, 9), np.arange(9)] = 1.0
    scale = np.full(9, np.float32(1.0) / np.float32(7), dtype=np.float32)
    scale[7:] = 0.0
    want = kernels.softmax_delta(z, onehot, scale)
    assert same(want, back(tk.softmax_delta(on(device, z), on(device, onehot), on(device, scale))))
    grad = operands(rng, (10, 9), kind if kind != "huge" else "special")
    assert same(kernels.relu(z), back(tk.relu(on(device, z))))
    assert same(kernels.relu_mask(z, grad), back(tk.relu_mask(on(device, z), on(device, grad))))


def mlp(*sizes, bias=True):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b, bias=bias)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


CASES = [((22, 13, 7), (4, 4), 8, True), ((22, 13, 7), (3, 2), 8, False), ((40, 31, 17, 10), (5, 1), 13, True),
         ((30, 24, 10), (1, 4), 6, True)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer,hyper", [("sgd", dict(lr=0.1, momentum=0.9)), ("adam", dict(lr=0.01))])
@pytest.mark.parametrize("case", CASES)
def test_training_steps_equal_the_numba_backend(device, optimizer, hyper, case):
    sizes, mesh, batch, bias = case
    torch.manual_seed(sum(sizes))
    model = mlp(*sizes, bias=bias)
    exe = compile_model(model, torch.randn(batch, sizes[0]), config=FabricConfig(width=mesh[0], height=mesh[1]),
                        batch=batch)
    rng = np.random.default_rng(3)
    data = [(rng.standard_normal((n, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], n))
            for n in (batch, batch, batch - 1)]      # the last batch padded
    runs = {}
    for backend in ("functional", BACKEND[device]):
        mx = MemoryX.from_state_dict(dict(model.named_parameters()), optimizer, **hyper)
        runtime = Runtime(exe, backend)
        history = []
        for x, y in data:
            result = runtime.train_step(x, y, {name: mx.weight(name) for name in mx.names()})
            mx.apply_gradients(result.grads)
            history.append(result)
        logits = runtime.forward(data[0][0], {name: mx.weight(name) for name in mx.names()})
        runs[backend] = (mx, history, logits)
    (mx_a, hist_a, fwd_a), (mx_b, hist_b, fwd_b) = runs.values()
    for name in mx_a.names():
        assert same(mx_a.weight(name), mx_b.weight(name)), name
    for a, b in zip(hist_a, hist_b):
        assert a.loss == b.loss and a.correct == b.correct and same(a.logits, b.logits)
        assert a.phases == b.phases and a.cycles == b.cycles and a.fmac_utilization == b.fmac_utilization
        assert all(same(a.grads[name], b.grads[name]) for name in a.grads)
    assert same(fwd_a, fwd_b)


@pytest.mark.parametrize("device", DEVICES)
def test_train_shards_equal_the_numba_backend(device):
    from wse.host.swarmx import column_shards, token_blocks
    torch.manual_seed(1)
    model = mlp(22, 13, 7)
    exe = compile_model(model, torch.randn(8, 22), config=FabricConfig(width=4, height=4), batch=8)
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((8, 22)).astype(np.float32), rng.integers(0, 7, 8)
    blocks = token_blocks(exe)
    numba, ours = Runtime(exe, "functional"), Runtime(exe, BACKEND[device])
    for columns in [*column_shards(len(blocks), 3), range(1, 1)]:
        if len(columns):
            tokens = range(blocks[columns.start].start, blocks[columns.stop - 1].stop)
        else:
            tokens = range(0, 0)
        args = (x[tokens.start:tokens.stop], y[tokens.start:tokens.stop], weights)
        a = numba.train_shard(*args, n=8, columns=columns)
        b = ours.train_shard(*args, n=8, columns=columns)
        assert same(a.logits, b.logits) and a.cycles == b.cycles
        for name, partial in a.grad_partials.items():
            assert same(partial, b.grad_partials[name]), (columns, name)


def test_backend_names_and_devices():
    from wse.host.runtime.functional_torch import torch_device
    torch.manual_seed(0)
    exe = compile_model(mlp(6, 3), torch.randn(4, 6), config=FabricConfig(width=2, height=2), batch=4)
    assert Runtime(exe, "functional-torch-cpu").backend.device == "cpu"
    assert Runtime(exe, "functional-torch").backend.device == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="backend functional-torch-cuda needs a CUDA device"):
            Runtime(exe, "functional-torch-cuda")
    else:
        assert torch_device("functional-torch-cuda") == "cuda"


@pytest.mark.parametrize("systems", [1, 2])
def test_wse_train_on_functional_torch_equals_the_numba_run(tmp_path, capsys, systems):
    """``wse train`` end to end, on one system and on two SwarmX systems (``train_shard``)."""
    from wse.host.appliance import checkpoint as ckpt
    from wse.host.appliance.cli import main

    weights = {}
    for backend in ("functional", "functional-torch-cpu"):
        out = tmp_path / backend
        code = main([str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--batch", "32", "--max-steps", "3",
                     "--out", str(out), "--progress", "none", "--backend", backend, "--no-train-eval",
                     "--systems", str(systems)])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        summary = json.loads((out / "summary.json").read_text())
        assert summary["steps"] == 3 and summary["backend"] == backend
        _, mx = ckpt.load_checkpoint(ckpt.latest_checkpoint(out))
        weights[backend] = ({name: mx.weight(name).copy() for name in mx.names()}, summary["test_loss"])
    (w_a, loss_a), (w_b, loss_b) = weights.values()
    assert loss_a == loss_b and all(same(w_a[name], w_b[name]) for name in w_a)


def test_auto_mode_streams_weights_and_the_pipelined_mode_is_refused(tmp_path, capsys):
    """FC-MNIST fits PE memory on 16x16 (``--mode auto`` would pick the layer-pipelined mode): on
    functional-torch auto picks weight streaming, and ``--mode pipelined`` is one usage line."""
    from wse.host.appliance.cli import main
    from wse.host.compiler.executable import Executable

    base = [str(EXAMPLE), "--dataset", "digits", "--mesh", "16x16", "--batch", "8", "--max-steps", "1",
            "--progress", "none", "--backend", "functional-torch-cpu", "--no-train-eval"]
    out = tmp_path / "refused"
    code = main([*base, "--out", str(out), "--mode", "pipelined"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--mode weight-streaming" in err and not out.exists()
    out = tmp_path / "auto"
    code = main([*base, "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    assert Executable.load(out / "executable.npz").mode == "weight_streaming"


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=_random_setups(), kind=st.sampled_from(["normal", "tiny"]))
def test_random_meshes_depths_and_models_equal_the_numba_backend(setup, kind):
    """``tests/test_runtime.py``'s random meshes, queue depths, models and batches; ``tiny``: the
    flushing variants (products and sums below 2^-126)."""
    config, batch, model, n, seed = setup
    linears = [m for m in model if isinstance(m, nn.Linear)]
    exe = compile_model(model, torch.randn(batch, linears[0].in_features), config=config, batch=batch)
    rng = np.random.default_rng(seed)
    x = operands(rng, (n, linears[0].in_features), kind)
    y = rng.integers(0, linears[-1].out_features, n)
    weights = {k: v.detach().numpy() * (np.float32(1e-19) if kind == "tiny" else 1) for k, v in
               model.named_parameters()}
    a = Runtime(exe, "functional").train_step(x, y, weights)
    b = Runtime(exe, "functional-torch-cpu").train_step(x, y, weights)
    assert same(a.logits, b.logits)
    assert a.loss == b.loss or (np.isnan(a.loss) and np.isnan(b.loss))
    for name in weights:
        assert same(a.grads[name], b.grads[name]), name
