"""The runtime: training steps on the golden and functional backends, bit for
bit equal (weights after several steps with MemoryX's optimizers), close to
PyTorch in float32, with padded last batches, evaluation and clear errors.
"""

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler import compile_model
from wse.host.memoryx import MemoryX
from wse.host.runtime import BACKENDS, Runtime, StepResult


def mlp(*sizes, bias=True):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [nn.Linear(a, b, bias=bias)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def compiled(model, batch=8, mesh=(4, 4)):
    features = next(m for m in model if isinstance(m, nn.Linear)).in_features
    return compile_model(model, torch.randn(batch, features), config=FabricConfig(width=mesh[0], height=mesh[1]),
                         batch=batch)


def batches(seed, steps, batch, features, classes):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((batch, features)).astype(np.float32), rng.integers(0, classes, batch))
            for _ in range(steps)]


def bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


@pytest.fixture(scope="module")
def mlp_bias():
    torch.manual_seed(3)
    model = mlp(22, 13, 7)
    return model, compiled(model)


@pytest.fixture(scope="module")
def mlp_nobias():
    torch.manual_seed(4)
    model = mlp(22, 13, 7, bias=False)
    return model, compiled(model)


@pytest.mark.parametrize("optimizer,hyper", [("sgd", dict(lr=0.1, momentum=0.9)), ("adam", dict(lr=0.01))])
@pytest.mark.parametrize("which", ["mlp_bias", "mlp_nobias"])
def test_golden_and_functional_train_to_identical_weights(which, optimizer, hyper, request):
    model, exe = request.getfixturevalue(which)
    runs = {}
    for backend in ("golden", "functional"):
        mx = MemoryX.from_state_dict(dict(model.named_parameters()), optimizer, **hyper)
        runtime = Runtime(exe, backend)
        history = []
        for x, y in batches(5, 3, 8, 22, 7):
            result = runtime.train_step(x, y, {name: mx.weight(name) for name in mx.names()})
            mx.apply_gradients(result.grads)
            history.append(result)
        runs[backend] = (mx, history)
    (mx_g, hist_g), (mx_f, hist_f) = runs["golden"], runs["functional"]
    for name in mx_g.names():
        assert np.array_equal(bits(mx_g.weight(name)), bits(mx_f.weight(name))), name
    for g, f in zip(hist_g, hist_f):
        assert g.loss == f.loss and g.correct == f.correct
        assert np.array_equal(bits(g.logits), bits(f.logits))
        assert g.phases == f.phases and g.cycles == f.cycles == sum(g.phases.values())
        assert g.fmac_utilization == f.fmac_utilization and 0 < g.fmac_utilization < 1


def test_functional_matches_pytorch_in_float32(mlp_bias):
    model, exe = mlp_bias
    runtime = Runtime(exe, "functional")
    for x, y in batches(7, 2, 8, 22, 7):
        weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
        result = runtime.train_step(x, y, weights)
        model.zero_grad()
        logits = model(torch.from_numpy(x))
        loss = nn.functional.cross_entropy(logits, torch.from_numpy(y))
        loss.backward()
        assert isinstance(result, StepResult)
        assert result.loss == pytest.approx(loss.item(), rel=1e-5)
        np.testing.assert_allclose(result.logits, logits.detach().numpy(), rtol=1e-4, atol=1e-6)
        assert result.correct == int((logits.argmax(1) == torch.from_numpy(y)).sum())
        for name, param in model.named_parameters():
            np.testing.assert_allclose(result.grads[name], param.grad.numpy(), rtol=1e-4, atol=1e-7)
            assert result.grads[name].dtype == np.float32 and result.grads[name].shape == param.shape


def test_partial_batch_is_padded_and_left_out(mlp_bias):
    model, exe = mlp_bias
    (x, y), = batches(8, 1, 5, 22, 7)
    weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
    results = {b: Runtime(exe, b).train_step(x, y, weights) for b in ("golden", "functional")}
    model.zero_grad()
    loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    for result in results.values():
        assert result.logits.shape == (5, 7)
        assert result.loss == pytest.approx(loss.item(), rel=1e-5)
        for name, param in model.named_parameters():
            np.testing.assert_allclose(result.grads[name], param.grad.numpy(), rtol=1e-4, atol=1e-7)
    for name in results["golden"].grads:
        assert np.array_equal(bits(results["golden"].grads[name]), bits(results["functional"].grads[name]))


@pytest.mark.parametrize("case", ["subnormal", "nan"])
def test_flushing_and_nans_match_the_fabric(mlp_bias, case):
    model, exe = mlp_bias
    rng = np.random.default_rng(11)
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    x = rng.standard_normal((8, 22)).astype(np.float32)
    if case == "subnormal":     # products and partial sums below 2^-126: the fabric flushes them
        weights["0.weight"] *= np.float32(1e-19)
        weights["0.bias"][:] = 0.0
        x *= np.float32(1e-19)
        weights["2.bias"][:3] = np.float32([1e-39, -3e-40, 1.2e-38])
    else:                       # a NaN weight: the fabric's NaNs are all 0x7fc00000
        weights["2.weight"][1, 4] = np.nan
    y = rng.integers(0, 7, 8)
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    assert np.array_equal(bits(golden.logits), bits(functional.logits))
    for name in weights:
        assert np.array_equal(bits(golden.grads[name]), bits(functional.grads[name])), name
    if case == "nan":
        assert (bits(functional.logits)[:, 1] == 0x7FC00000).all()


def test_forward_gives_the_training_logits(mlp_nobias):
    model, exe = mlp_nobias
    (x, y), = batches(9, 1, 8, 22, 7)
    weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
    train = Runtime(exe, "functional").train_step(x, y, weights)
    for backend in ("functional", "golden"):
        logits = Runtime(exe, backend).forward(x[:6], weights)
        assert np.array_equal(bits(logits), bits(train.logits[:6]))
    np.testing.assert_allclose(train.logits, model(torch.from_numpy(x)).detach().numpy(), rtol=1e-4, atol=1e-6)


def test_fc_mnist_functional_matches_pytorch():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    exe = compile_model(model, torch.randn(64, 1, 28, 28), config=FabricConfig(width=16, height=16), batch=64)
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    result = Runtime(exe, "functional").train_step(x, y, {k: v.detach().numpy() for k, v in model.named_parameters()})
    loss = nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    assert result.loss == pytest.approx(loss.item(), rel=1e-5)
    for name, param in model.named_parameters():
        np.testing.assert_allclose(result.grads[name], param.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert result.cycles == exe.cycles("train") and result.fmac_utilization >= 0.85


def test_inputs_are_checked(mlp_bias):
    model, exe = mlp_bias
    runtime = Runtime(exe, "functional")
    weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
    x = np.zeros((8, 22), np.float32)
    y = np.zeros(8, np.int64)
    with pytest.raises(UsageError, match="x must be float32"):
        runtime.train_step(x.astype(np.float64), y, weights)
    with pytest.raises(UsageError, match=r"x must have shape \[n, 22\]"):
        runtime.train_step(np.zeros((8, 21), np.float32), y, weights)
    with pytest.raises(UsageError, match="x must hold 1 to 8 samples"):
        runtime.train_step(np.zeros((9, 22), np.float32), np.zeros(9, np.int64), weights)
    with pytest.raises(UsageError, match=r"y must be int64 of shape \[8\]"):
        runtime.train_step(x, y.astype(np.int32), weights)
    with pytest.raises(UsageError, match="labels y must be in 0..6"):
        runtime.train_step(x, np.full(8, 7, np.int64), weights)
    with pytest.raises(UsageError, match="weights lack 2.bias"):
        runtime.train_step(x, y, {k: v for k, v in weights.items() if k != "2.bias"})
    with pytest.raises(UsageError, match=r"weight '0.weight' must be float32 of shape \[13, 22\]"):
        runtime.train_step(x, y, {**weights, "0.weight": np.zeros((22, 13), np.float32)})
    with pytest.raises(UsageError, match="backend must be one of"):
        Runtime(exe, "verilator-someday")
    with pytest.raises(UsageError, match="executable must be an Executable"):
        Runtime("model.wse")
    assert set(BACKENDS) >= {"functional", "golden"}


@st.composite
def _random_setups(draw):
    width, height = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    depths = {name: draw(st.integers(1, 3)) for name in ("router_depth", "rx_depth", "tx_depth")}
    most = depths["tx_depth"] + 2 * depths["router_depth"] + depths["rx_depth"] - 1
    batch = draw(st.integers(1, width * most))
    sizes = draw(st.lists(st.integers(1, 24), min_size=2, max_size=4))
    layers = [nn.ReLU()] if draw(st.booleans()) else []
    for a, b in zip(sizes, sizes[1:]):
        layers.append(nn.Linear(a, b, bias=draw(st.booleans())))
        if draw(st.booleans()):
            layers.append(nn.ReLU())
    return FabricConfig(width=width, height=height, **depths), batch, nn.Sequential(*layers), \
        draw(st.integers(1, batch)), draw(st.integers(0, 2**32 - 1))


def _check_random_setup(setup):
    config, batch, model, n, seed = setup
    features = next(m for m in model if isinstance(m, nn.Linear)).in_features
    classes = [m for m in model if isinstance(m, nn.Linear)][-1].out_features
    exe = compile_model(model, torch.randn(batch, features), config=config, batch=batch)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    y = rng.integers(0, classes, n)
    weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    assert golden.phases == functional.phases            # the cycle model is the golden count
    assert np.array_equal(bits(golden.logits), bits(functional.logits))
    for name in weights:
        assert np.array_equal(bits(golden.grads[name]), bits(functional.grads[name])), name


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=_random_setups())
def test_random_meshes_depths_and_models_agree(setup):
    _check_random_setup(setup)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setup=_random_setups())
def test_many_random_meshes_depths_and_models_agree(setup):
    _check_random_setup(setup)


@pytest.mark.slow
def test_fc_mnist_golden_step_equals_functional():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    exe = compile_model(model, torch.randn(64, 1, 28, 28), config=FabricConfig(width=16, height=16), batch=64)
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 28, 28), dtype=np.float32)
    y = rng.integers(0, 10, 64)
    weights = {k: v.detach().numpy() for k, v in model.named_parameters()}
    golden = Runtime(exe, "golden").train_step(x, y, weights)
    functional = Runtime(exe, "functional").train_step(x, y, weights)
    assert golden.phases == functional.phases
    assert np.array_equal(bits(golden.logits), bits(functional.logits))
    for name in weights:
        assert np.array_equal(bits(golden.grads[name]), bits(functional.grads[name])), name


def test_train_shard_partials_are_the_row_chain_cut_anywhere(mlp_bias):
    """Per-column partial sums: folded, the step's gradients; any run of columns gives the same rows."""
    from wse.host.swarmx import column_shards, fold_partials, token_blocks
    model, exe = mlp_bias
    runtime = Runtime(exe, "functional")
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    blocks = token_blocks(exe)
    (x, y), = batches(11, 1, 8, 22, 7)
    for n in (8, 5):
        step = runtime.train_step(x[:n], y[:n], weights)
        whole = runtime.train_shard(x[:n], y[:n], weights, n=n, columns=range(len(blocks)))
        assert whole.cycles == step.cycles == exe.cycles("train")
        assert np.array_equal(bits(whole.logits), bits(step.logits))
        for name, grad in step.grads.items():
            assert whole.grad_partials[name].shape == (len(blocks), *grad.shape)
            assert np.array_equal(bits(fold_partials(whole.grad_partials[name])), bits(grad))
        for systems in (2, 3):
            logits, partials = [], {name: [] for name in step.grads}
            for columns in column_shards(len(blocks), systems):
                tokens = range(blocks[columns.start].start, min(blocks[columns.stop - 1].stop, n))
                part = runtime.train_shard(x[tokens.start:tokens.stop], y[tokens.start:tokens.stop], weights,
                                           n=n, columns=columns)
                logits.append(part.logits)
                for name in partials:
                    partials[name].append(part.grad_partials[name])
            assert np.array_equal(bits(np.concatenate(logits)), bits(step.logits))
            for name, stacks in partials.items():
                assert np.array_equal(bits(np.concatenate(stacks)), bits(whole.grad_partials[name]))
    # A column's partial really is its own tokens' sum: changing one sample changes only its column.
    other = x.copy()
    other[blocks[-1].start] += np.float32(1.0)
    a = runtime.train_shard(x, y, weights, n=8, columns=range(len(blocks)))
    b = runtime.train_shard(other, y, weights, n=8, columns=range(len(blocks)))
    changed = (bits(a.grad_partials["0.weight"]) != bits(b.grad_partials["0.weight"])).any(axis=(1, 2))
    assert changed.tolist() == [j == len(blocks) - 1 for j in range(len(blocks))]


def test_train_shard_inputs_and_backends_are_checked(mlp_bias):
    from wse.host.swarmx import token_blocks
    model, exe = mlp_bias
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    blocks = token_blocks(exe)
    runtime = Runtime(exe, "functional")
    x, y = np.zeros((8, 22), np.float32), np.zeros(8, np.int64)
    empty = runtime.train_shard(x[:0], y[:0], weights, n=3, columns=range(1, 1))
    assert empty.logits.shape == (0, 7) and empty.cycles == 0
    assert empty.grad_partials["0.weight"].shape == (0, 13, 22)
    tail = runtime.train_shard(x[:0], y[:0], weights, n=blocks[-1].start, columns=range(len(blocks) - 1, len(blocks)))
    assert tail.logits.shape == (0, 7) and not bits(tail.grad_partials["2.bias"]).any()
    first = len(blocks[0])
    with pytest.raises(UsageError, match=rf"x must be float32 of shape \[{first}, 22\]"):
        runtime.train_shard(x[:first - 1], y[:first - 1], weights, n=8, columns=range(0, 1))
    with pytest.raises(UsageError, match="columns must be a range"):
        runtime.train_shard(x, y, weights, n=8, columns=range(0, len(blocks) + 1))
    with pytest.raises(UsageError, match="n must be the global batch's sample count"):
        runtime.train_shard(x, y, weights, n=9, columns=range(len(blocks)))
    with pytest.raises(UsageError, match="labels y must be in 0..6"):
        runtime.train_shard(x, np.full(8, 7), weights, n=8, columns=range(len(blocks)))
    with pytest.raises(UsageError, match="train_shard is provided by the functional backend"):
        Runtime(exe, "golden").train_shard(x, y, weights, n=8, columns=range(len(blocks)))


def test_functional_backend_dispatches_on_operation_types(mlp_bias):
    """Each math op type has its own execution; an op type it does not know is named in the error."""
    import dataclasses

    from wse.host.compiler import MathOp
    from wse.host.runtime.functional import FunctionalBackend

    @dataclasses.dataclass(frozen=True)
    class Gelu(MathOp):
        op = "gelu"
        data: str

    model, exe = mlp_bias
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    x, y = np.zeros((8, 22), np.float32), np.zeros(8, np.int64)
    name = exe.sequences["train"][0]
    phase = exe.phases[name]
    exe.phases[name] = dataclasses.replace(phase, math=phase.math + (Gelu("act1"),))
    try:
        with pytest.raises(RuntimeError, match=f"phase {name}: no functional execution of Gelu"):
            Runtime(exe, "functional").train_step(x, y, weights)
    finally:
        exe.phases[name] = phase
    assert isinstance(Runtime(exe, "functional").backend, FunctionalBackend)


def test_begin_phases_sets_up_a_step_phase_by_phase_on_device_backends(mlp_bias):
    """The golden backend runs a step phase by phase from begin_phases with the step's cycles; the functional
    backend, which runs whole steps only, refuses with one clear error."""
    model, exe = mlp_bias
    weights = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    x, y = batches(1, 1, 8, 22, 7)[0]
    with pytest.raises(UsageError, match="runs whole steps only"):
        Runtime(exe, "functional").begin_phases(x, y, weights)
    runtime = Runtime(exe, "golden")
    with pytest.raises(UsageError, match="labels y must be in 0..6"):
        runtime.begin_phases(x, np.full(8, 9, dtype=np.int64), weights)
    checked = runtime.begin_phases(x, y, weights)
    cycles = {name: runtime.backend.run_phase(name, checked, {}) for name in exe.sequences["train"]}
    assert cycles == {name: exe.phases[name].cycles for name in exe.sequences["train"]}
