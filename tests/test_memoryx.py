"""MemoryX: bit-exact equality with torch.optim, checkpoints, storage, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import UsageError
from wse.host.memoryx import (InMemoryStore, MemoryX, NonFiniteGradientError, OptimizerConfig, TensorStore,
                              checkpoint, state_slots)

TORCH_OPTIMIZERS = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}

CONFIGS = [
    ("sgd", {"lr": 0.1}),
    ("sgd", {"lr": 0.05, "momentum": 0.9, "dampening": 0.1, "weight_decay": 1e-3}),
    ("sgd", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-2}),
    ("adam", {"lr": 1e-2}),
    ("adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 1e-2, "amsgrad": True}),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}),
    ("adamw", {"lr": 3e-3, "amsgrad": True}),
]
CONFIG_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(CONFIGS)]
FIRST_LAYER = ("0.weight", "0.bias")


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def gradients(model: nn.Module, step: int, only=None) -> dict[str, torch.Tensor]:
    """Cross-entropy gradients of ``model`` on a batch that depends on ``step`` only."""
    gen = torch.Generator().manual_seed(1000 + step)
    x, target = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    model.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), target).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if only is None or n in only}


def subset(step: int):
    """Every third step updates the first layer only."""
    return FIRST_LAYER if step % 3 == 2 else None


def run_memoryx(mx: MemoryX, steps: range) -> None:
    """Closed loop: the gradient of each step is taken at MemoryX's own weights."""
    model = make_model()
    for step in steps:
        model.load_state_dict(mx.state_dict())
        assert mx.apply_gradients(gradients(model, step, subset(step)))


def bits(array) -> np.ndarray:
    return np.asarray(array, dtype=np.float32).view(np.uint32)


def assert_same_memoryx(a: MemoryX, b: MemoryX) -> None:
    assert a.names() == b.names() and a.step_count == b.step_count and a.config == b.config
    for name in a.names():
        assert np.array_equal(bits(a.weight(name)), bits(b.weight(name))), name
        sa, sb = a.optimizer_state(name), b.optimizer_state(name)
        assert sa.keys() == sb.keys()
        for slot in sa:
            assert np.array_equal(bits(sa[slot]), bits(sb[slot])), (name, slot)


@pytest.mark.parametrize("name,hyper", CONFIGS, ids=CONFIG_IDS)
def test_bit_exact_with_plain_torch_optim(name, hyper):
    reference = make_model()
    optimizer = TORCH_OPTIMIZERS[name](reference.parameters(), **hyper)   # PyTorch's defaults otherwise
    mx = MemoryX.from_state_dict(make_model().state_dict(), name, **hyper)
    run_memoryx(mx, range(7))
    for step in range(7):
        only = subset(step)
        gradients(reference, step)
        for n, p in reference.named_parameters():
            if only is not None and n not in only:
                p.grad = None
        optimizer.step()
    assert mx.step_count == 7
    changed = False
    for n, p in reference.named_parameters():
        assert np.array_equal(bits(mx.weight(n)), bits(p.detach().numpy())), n
        changed |= not np.array_equal(mx.weight(n), make_model().state_dict()[n].numpy())
        state = {k: v for k, v in optimizer.state[p].items() if v is not None}
        mine = mx.optimizer_state(n)
        assert set(mine) == set(state) == state_slots(mx.config)
        for slot, value in state.items():
            assert np.array_equal(bits(mine[slot]), bits(value.numpy())), (n, slot)
    assert changed
    if name != "sgd":   # per-tensor step counts: the first layer saw every step, the second skipped two
        assert float(mx.optimizer_state("0.weight")["step"]) == 7.0
        assert float(mx.optimizer_state("2.weight")["step"]) == 5.0


def test_state_dict_loads_into_the_model_and_is_a_copy():
    mx = MemoryX.from_state_dict(make_model(1).state_dict(), "sgd", lr=0.5)
    state = mx.state_dict()
    assert list(state) == mx.names() == ["0.weight", "0.bias", "2.weight", "2.bias"]
    model = make_model(2)
    model.load_state_dict(state)
    assert all(torch.equal(model.state_dict()[n], make_model(1).state_dict()[n]) for n in state)
    state["0.bias"].add_(1.0)
    assert not np.array_equal(mx.weight("0.bias"), state["0.bias"].numpy())


def test_weight_is_a_read_only_live_view():
    mx = MemoryX.from_state_dict({"w": np.ones(3, np.float32)}, "sgd", lr=1.0)
    view = mx.weight("w")
    with pytest.raises(ValueError):
        view[0] = 5.0
    snapshot = view.copy()
    mx.apply_gradients({"w": np.full(3, 0.25, np.float32)})
    assert np.array_equal(view, [0.75, 0.75, 0.75]) and np.array_equal(snapshot, [1, 1, 1])


def test_gradients_are_not_aliased_or_modified():
    mx = MemoryX.from_state_dict({"w": np.ones(4, np.float32)}, "sgd", lr=0.1, momentum=0.9, weight_decay=0.5)
    grad = np.arange(4, dtype=np.float32)
    for _ in range(3):
        mx.apply_gradients({"w": grad})
    assert np.array_equal(grad, np.arange(4, dtype=np.float32))


@pytest.mark.parametrize("name,hyper", CONFIGS, ids=CONFIG_IDS)
def test_checkpoint_resume_equals_never_stopping(tmp_path, name, hyper):
    continuous = MemoryX.from_state_dict(make_model().state_dict(), name, **hyper)
    run_memoryx(continuous, range(8))
    first = MemoryX.from_state_dict(make_model().state_dict(), name, **hyper)
    run_memoryx(first, range(4))
    first.save(tmp_path / "ckpt")
    resumed = MemoryX.load(tmp_path / "ckpt")
    assert_same_memoryx(resumed, first)
    run_memoryx(resumed, range(4, 8))
    assert_same_memoryx(resumed, continuous)


def test_checkpoint_files_and_overwrite(tmp_path):
    mx = MemoryX.from_state_dict(make_model().state_dict(), "adam", lr=1e-2)
    mx.save(tmp_path)
    run_memoryx(mx, range(2))
    mx.save(tmp_path)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0] == "memoryx.json" and files[1].endswith(".safetensors")
    manifest = json.loads((tmp_path / "memoryx.json").read_text())
    assert manifest["optimizer"] == {"name": "adam", "hyper": {"lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-08,
                                                                "weight_decay": 0.0, "amsgrad": False}}
    assert manifest["step_count"] == 2 and manifest["order"] == mx.names()
    assert_same_memoryx(MemoryX.load(tmp_path), mx)


def test_interrupted_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    mx = MemoryX.from_state_dict(make_model().state_dict(), "sgd", lr=0.1, momentum=0.9)
    run_memoryx(mx, range(2))
    mx.save(tmp_path)
    saved = MemoryX.load(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    run_memoryx(mx, range(2, 4))

    def crash_in_manifest(path, manifest):
        path.write_text('{"format": "wse.mem')      # half written, then the process dies
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint, "_write_manifest", crash_in_manifest)
    with pytest.raises(KeyboardInterrupt):
        mx.save(tmp_path)
    monkeypatch.undo()

    def crash_in_tensors(tensors, filename, metadata=None):
        open(filename, "wb").write(b"\0" * 10)
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.safetensors.numpy, "save_file", crash_in_tensors)
    with pytest.raises(UsageError, match="cannot write a checkpoint to .*: disk full"):
        mx.save(tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    restored = MemoryX.load(tmp_path)
    assert_same_memoryx(restored, saved)
    assert restored.step_count == 2


def test_corrupt_or_missing_checkpoint_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        MemoryX.load(tmp_path / "nowhere")
    with pytest.raises(UsageError, match="no memoryx.json"):
        MemoryX.load(tmp_path)
    mx = MemoryX.from_state_dict({"w": np.ones((2, 2), np.float32)}, "sgd", lr=0.1)
    mx.save(tmp_path)
    tensors = next(tmp_path.glob("*.safetensors"))
    data = bytearray(tensors.read_bytes())
    data[-1] ^= 0xFF
    tensors.write_bytes(bytes(data))
    with pytest.raises(UsageError, match="corrupt"):
        MemoryX.load(tmp_path)
    (tmp_path / "memoryx.json").write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        MemoryX.load(tmp_path)
    with pytest.raises(UsageError, match="must be a folder"):
        mx.save(tensors)


def test_tampered_manifest_is_rejected(tmp_path):
    mx = MemoryX.from_state_dict({"w": np.ones(3, np.float32)}, "adam")
    mx.apply_gradients({"w": np.ones(3, np.float32)})
    mx.save(tmp_path)
    manifest = json.loads((tmp_path / "memoryx.json").read_text())
    manifest["slots"]["w"] = ["exp_avg"]
    (tmp_path / "memoryx.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="does not hold the tensors"):
        MemoryX.load(tmp_path)
    manifest["format"] = "something else"
    (tmp_path / "memoryx.json").write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="not a wse.memoryx"):
        MemoryX.load(tmp_path)


def test_zero_state_equals_a_fresh_optimizer():
    mx = MemoryX.from_state_dict(make_model().state_dict(), "adamw", lr=1e-2)
    run_memoryx(mx, range(3))
    mx.zero_state()
    assert mx.step_count == 0 and all(not mx.optimizer_state(n) for n in mx.names())
    assert not any("::" in key for key in mx.store.keys())
    fresh = MemoryX.from_state_dict(mx.state_dict(), "adamw", lr=1e-2)
    run_memoryx(mx, range(3, 6))
    run_memoryx(fresh, range(3, 6))
    assert_same_memoryx(mx, fresh)


def test_optimizer_state_lives_in_the_store():
    store = InMemoryStore()
    mx = MemoryX.from_state_dict({"w": np.ones(2, np.float32)}, "sgd", store=store, lr=0.1, momentum=0.5)
    mx.apply_gradients({"w": np.ones(2, np.float32)})
    assert list(store.keys()) == ["w", "w::momentum_buffer"]
    store.get("w::momentum_buffer")[...] = 10.0          # the optimizer reads the stored buffer
    mx.apply_gradients({"w": np.zeros(2, np.float32)})
    assert np.allclose(mx.weight("w"), 0.9 - 0.1 * 5.0)
    assert np.array_equal(mx.optimizer_state("w")["momentum_buffer"], [5.0, 5.0])


class MemmapStore(TensorStore):
    """A disk tier: every tensor is a memory-mapped file."""

    def __init__(self, folder):
        self.folder, self.arrays = folder, {}

    def create(self, key, shape, dtype=np.float32):
        if key in self.arrays:
            raise KeyError(key)
        path = self.folder / f"{len(list(self.folder.iterdir()))}.bin"
        self.arrays[key] = np.memmap(path, dtype=dtype, mode="w+", shape=tuple(shape))
        return self.arrays[key]

    def get(self, key):
        return self.arrays[key]

    def delete(self, key):
        del self.arrays[key]

    def keys(self):
        return iter(list(self.arrays))


def test_a_memory_mapped_store_plugs_in(tmp_path):
    in_memory = MemoryX.from_state_dict(make_model().state_dict(), "adam", lr=1e-2, amsgrad=True)
    on_disk = MemoryX.from_state_dict(make_model().state_dict(), "adam", store=MemmapStore(tmp_path),
                                      lr=1e-2, amsgrad=True)
    run_memoryx(in_memory, range(4))
    run_memoryx(on_disk, range(4))
    assert_same_memoryx(on_disk, in_memory)
    assert all(isinstance(on_disk.store.get(key), np.memmap) for key in on_disk.store.keys())
    assert len(list(tmp_path.iterdir())) == 4 * 5
    on_disk.save(tmp_path / "checkpoint")
    assert_same_memoryx(MemoryX.load(tmp_path / "checkpoint"), in_memory)


def test_shards_of_every_tensor_step_exactly_like_the_whole():
    """Elementwise optimizers: two MemoryX shards, each owning half of every flattened tensor, match one."""
    weights = {n: t.numpy() for n, t in make_model().state_dict().items()}
    whole = MemoryX.from_state_dict(weights, "adamw", lr=1e-2, weight_decay=0.05)
    halves = [{n: w.reshape(-1)[part::2].copy() for n, w in weights.items()} for part in (0, 1)]
    shards = [MemoryX.from_state_dict(h, "adamw", lr=1e-2, weight_decay=0.05) for h in halves]
    model = make_model()
    for step in range(4):
        model.load_state_dict(whole.state_dict())
        grads = {n: g.numpy() for n, g in gradients(model, step).items()}
        whole.apply_gradients(grads)
        for part, shard in enumerate(shards):
            shard.apply_gradients({n: g.reshape(-1)[part::2].copy() for n, g in grads.items()})
    for name in whole.names():
        merged = np.empty(whole.weight(name).size, np.float32)
        merged[0::2], merged[1::2] = shards[0].weight(name), shards[1].weight(name)
        assert np.array_equal(bits(merged), bits(whole.weight(name).reshape(-1)))


def test_streaming_order_and_reloading_weights():
    sd = make_model().state_dict()
    order = ["2.bias", "2.weight", "0.bias", "0.weight"]
    mx = MemoryX.from_state_dict(sd, "sgd", order=order, lr=0.1, momentum=0.9)
    assert mx.names() == order and list(mx.state_dict()) == order
    mx.apply_gradients({"2.bias": np.ones(3, np.float32)})
    buffer = mx.optimizer_state("2.bias")["momentum_buffer"].copy()
    mx.load_state_dict(make_model(5).state_dict())           # weights replaced, optimizer state kept
    assert torch.equal(mx.state_dict()["0.weight"], make_model(5).state_dict()["0.weight"])
    assert np.array_equal(mx.optimizer_state("2.bias")["momentum_buffer"], buffer)
    assert mx.names() == order
    with pytest.raises(UsageError, match="missing"):
        mx.load_state_dict({"0.weight": sd["0.weight"]})
    with pytest.raises(UsageError, match="shape"):
        mx.load_state_dict({**sd, "0.bias": torch.zeros(7)})
    with pytest.raises(UsageError, match="permutation"):
        MemoryX.from_state_dict(sd, order=["0.weight", "0.weight", "2.bias", "2.weight"])


def test_non_finite_policies():
    grad = {"w": np.array([1.0, np.nan], np.float32), "v": np.ones(1, np.float32)}
    weights = {"w": np.ones(2, np.float32), "v": np.ones(1, np.float32)}
    strict = MemoryX.from_state_dict(weights, "adam")
    with pytest.raises(NonFiniteGradientError, match="'w'"):
        strict.apply_gradients(grad)
    assert strict.step_count == 0 and np.array_equal(strict.weight("v"), [1.0])
    assert not strict.optimizer_state("v")
    skipping = MemoryX.from_state_dict(weights, "adam", nonfinite="skip")
    assert skipping.apply_gradients(grad) is False
    assert (skipping.step_count, skipping.skipped_steps) == (0, 1)
    assert np.array_equal(skipping.weight("w"), [1.0, 1.0])
    applying = MemoryX.from_state_dict(weights, "sgd", nonfinite="apply", lr=0.5)
    assert applying.apply_gradients(grad) is True
    assert applying.weight("w")[0] == 0.5 and np.isnan(applying.weight("w")[1])


def test_gradient_errors():
    mx = MemoryX.from_state_dict({"w": np.ones((2, 3), np.float32)}, "sgd")
    with pytest.raises(UsageError, match=r"unknown tensors \['x'\]"):
        mx.apply_gradients({"x": np.ones((2, 3), np.float32)})
    with pytest.raises(UsageError, match=r"has shape \(3, 2\), expected \(2, 3\)"):
        mx.apply_gradients({"w": np.ones((3, 2), np.float32)})
    with pytest.raises(UsageError, match="must be float32, not numpy float64"):
        mx.apply_gradients({"w": np.ones((2, 3))})
    with pytest.raises(UsageError, match="must be float32, not torch.float16"):
        mx.apply_gradients({"w": torch.ones(2, 3, dtype=torch.float16)})
    with pytest.raises(UsageError, match="non-empty mapping"):
        mx.apply_gradients({})
    with pytest.raises(UsageError, match="holds no tensor named 'y'"):
        mx.weight("y")
    with pytest.raises(UsageError, match="load_state_dict first"):
        MemoryX("adam").apply_gradients({"w": np.ones(1, np.float32)})
    with pytest.raises(UsageError, match="must be float32"):
        MemoryX.from_state_dict({"n": torch.zeros(2, dtype=torch.int64)})
    with pytest.raises(UsageError, match="without '::'"):
        MemoryX.from_state_dict({"a::b": np.zeros(1, np.float32)})


def test_optimizer_configuration_errors():
    with pytest.raises(UsageError, match="optimizer must be one of sgd, adam, adamw, not 'lamb'"):
        MemoryX("lamb")
    with pytest.raises(UsageError, match="sgd has no hyper-parameter betas; it accepts lr, momentum"):
        MemoryX("sgd", betas=(0.9, 0.99))
    with pytest.raises(UsageError, match="lr must be a finite real number >= 0.0, not -0.1"):
        MemoryX("adam", lr=-0.1)
    with pytest.raises(UsageError, match=r"betas\[0\] must be a finite real number in \[0.0, 1.0\), not 1.0"):
        MemoryX("adamw", betas=(1.0, 0.9))
    with pytest.raises(UsageError, match="betas must be a pair"):
        MemoryX("adam", betas=0.9)
    with pytest.raises(UsageError, match="amsgrad must be True or False, not 'yes'"):
        MemoryX("adam", amsgrad="yes")
    with pytest.raises(UsageError, match="nesterov=True needs momentum > 0"):
        MemoryX("sgd", nesterov=True)
    with pytest.raises(UsageError, match="eps must be"):
        MemoryX("adam", eps=float("nan"))
    with pytest.raises(UsageError, match="nonfinite must be one of raise, skip, apply"):
        MemoryX("sgd", nonfinite="ignore")


def test_optimizer_config_defaults_and_round_trip():
    config = OptimizerConfig("AdamW")
    assert config.name == "adamw"
    assert dict(config.hyper) == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2,
                                  "amsgrad": False}
    assert OptimizerConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    mx = MemoryX(config, lr=0.5)
    assert mx.hyper["lr"] == 0.5 and mx.hyper["weight_decay"] == 1e-2
    assert state_slots(OptimizerConfig("sgd")) == frozenset()
