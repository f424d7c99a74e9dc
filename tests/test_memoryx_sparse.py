"""MemoryX with static sparsity masks: the optimizer keeps state for the kept weights only (compact),
updates only them with the bits of PyTorch's gradient masking on dense state, and checkpoints, copies
and disk tiers keep it so (``docs/weight_streaming.md`` section 13)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wse.config import UsageError
from wse.host.memoryx import MemoryX, ShardedMemoryX, TieredStore
from wse.host.memoryx.checkpoint import read_checkpoint, write_checkpoint

CONFIGS = [
    ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-2}),
    ("sgd", {"lr": 0.05, "momentum": 0.8, "dampening": 0.1}),
    ("adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 1e-2, "amsgrad": True}),
    ("adam", {"lr": 3e-3}),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}),
]
IDS = ["sgd-nesterov", "sgd-dampening", "adam-amsgrad", "adam", "adamw"]
SHAPES = {"a.weight": (37, 29), "a.bias": (37,), "b.weight": (3, 37), "c.weight": (4, 5), "d.weight": (2, 3)}
KEEP = {"a.weight": 0.1, "b.weight": 0.6, "c.weight": 0.0, "d.weight": 1.0}     # none kept, all kept too


def bits(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def weights_and_masks(seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    weights = {n: rng.uniform(-0.5, 0.5, s).astype(np.float32) for n, s in SHAPES.items()}
    masks = {n: rng.random(SHAPES[n]) < keep for n, keep in KEEP.items()}
    return weights, masks


def grads_for(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return {n: (rng.standard_normal(s) * 10.0 ** rng.uniform(-6, 2, s)).astype(np.float32)
            for n, s in SHAPES.items()}


def masked_memoryx(name: str, hyper: dict, store=None) -> MemoryX:
    weights, masks = weights_and_masks()
    mx = MemoryX.from_state_dict(weights, name, store=store, **hyper)
    mx.set_masks(masks)
    return mx


def assert_same(a: MemoryX, b: MemoryX) -> None:
    assert a.names() == b.names() and a.step_count == b.step_count
    assert a.masks.keys() == b.masks.keys() and all(np.array_equal(a.masks[n], b.masks[n]) for n in a.masks)
    for name in a.names():
        assert np.array_equal(bits(a.weight(name)), bits(b.weight(name))), name
        sa, sb = a.optimizer_state(name), b.optimizer_state(name)
        assert sa.keys() == sb.keys() and all(np.array_equal(bits(sa[k]), bits(sb[k])) for k in sa), name


@pytest.mark.parametrize("name,hyper", CONFIGS, ids=IDS)
def test_kept_weights_only_with_the_bits_of_torch_gradient_masking(name, hyper):
    """PyTorch with gradient masking on dense state (what MemoryX ran before its state was compact)."""
    weights, masks = weights_and_masks()
    mx = masked_memoryx(name, hyper)
    params = {n: torch.from_numpy(np.where(masks.get(n, True), w, 0).astype(np.float32)) for n, w in weights.items()}
    optimizer = MemoryX(name, **hyper).config.build(list(params.values()))
    for step in range(6):
        grads = grads_for(step)
        if step == 3:
            grads.pop("b.weight")               # a tensor absent from a step keeps its weights and state
        mx.apply_gradients(grads)
        for n, p in params.items():
            p.grad = torch.from_numpy(grads[n] * masks.get(n, True)) if n in grads else None
        optimizer.step()
    for n, p in params.items():
        state = {k: v.numpy() for k, v in optimizer.state[p].items() if v is not None}
        mine = mx.optimizer_state(n)
        assert mine.keys() == state.keys() and state
        if n not in masks:
            assert np.array_equal(bits(mx.weight(n)), bits(p.numpy())), n
            assert all(np.array_equal(bits(mine[k]), bits(state[k])) for k in state), n
            continue
        kept = masks[n]
        assert np.array_equal(bits(mx.weight(n)[kept]), bits(p.numpy()[kept])), n
        assert np.all(bits(mx.weight(n)[~kept]) == 0), n                           # pruned: exactly +0
        for slot, value in state.items():
            expected = value if slot == "step" else value[kept]          # kept flat indices, ascending
            assert mine[slot].shape == expected.shape and np.array_equal(bits(mine[slot]), bits(expected)), slot
            if slot != "step":
                assert np.all(value[~kept] == 0)            # the dense state of a pruned weight was all zero
    assert not np.array_equal(mx.weight("a.weight"), np.where(masks["a.weight"], weights["a.weight"], 0))


def test_state_bytes_count_the_kept_weights_only():
    mx = masked_memoryx("adam", {})
    kept = {n: int(m.sum()) for n, m in weights_and_masks()[1].items()}
    dense_elements = sum(int(np.prod(s)) for s in SHAPES.values())
    elements = SHAPES["a.bias"][0] + sum(kept.values())
    sizes = mx.state_bytes()
    assert sizes == {"state_bytes": 4 * (2 * elements + len(SHAPES)),
                     "dense_state_bytes": 4 * (2 * dense_elements + len(SHAPES))}
    mx.apply_gradients(grads_for(0))
    held = sum(mx.store.get(k).nbytes for k in mx.store.keys() if "::" in k)
    assert held == sizes["state_bytes"] < sizes["dense_state_bytes"]
    assert f"state_bytes={held} of {sizes['dense_state_bytes']} dense" in repr(mx)


@pytest.mark.parametrize("name,hyper", CONFIGS[::2], ids=IDS[::2])
def test_checkpoint_holds_the_compact_state_and_resumes_bit_for_bit(tmp_path, name, hyper):
    straight, stopped = masked_memoryx(name, hyper), masked_memoryx(name, hyper)
    for step in range(3):
        straight.apply_gradients(grads_for(step))
        stopped.apply_gradients(grads_for(step))
    stopped.save(tmp_path / "ckpt")
    manifest, tensors = read_checkpoint(tmp_path / "ckpt")
    assert manifest["version"] == 2
    masks = weights_and_masks()[1]
    for n, mask in masks.items():
        assert manifest["masks"][n] == np.flatnonzero(mask).tolist()                # the kept indices, once
        for slot in manifest["slots"][n]:
            assert tensors[f"{n}::{slot}"].shape == (() if slot == "step" else (int(mask.sum()),))
    resumed = MemoryX.load(tmp_path / "ckpt")
    assert_same(resumed, stopped)
    for step in range(3, 6):
        straight.apply_gradients(grads_for(step))
        resumed.apply_gradients(grads_for(step))
    assert_same(resumed, straight)
    assert_same(straight.copy(), straight)


@pytest.mark.parametrize("name,hyper", CONFIGS[::2], ids=IDS[::2])
def test_a_version_1_checkpoint_with_dense_state_still_loads(tmp_path, name, hyper):
    """The format before the state was compact: a masked weight's state dense, pruned entries zero."""
    mx = masked_memoryx(name, hyper)
    for step in range(3):
        mx.apply_gradients(grads_for(step))
    mx.save(tmp_path / "new")
    manifest, tensors = read_checkpoint(tmp_path / "new")
    for n, kept in manifest["masks"].items():
        for slot in manifest["slots"][n]:
            if slot != "step":
                dense = np.zeros(SHAPES[n], np.float32)
                dense.reshape(-1)[kept] = tensors[f"{n}::{slot}"]
                tensors[f"{n}::{slot}"] = dense
    manifest["version"] = 1
    del manifest["tensors"]
    write_checkpoint(tmp_path / "old", manifest, tensors)
    old = MemoryX.load(tmp_path / "old")
    assert_same(old, mx)
    for step in range(3, 5):
        mx.apply_gradients(grads_for(step))
        old.apply_gradients(grads_for(step))
    assert_same(old, mx)


def test_masked_memoryx_over_a_disk_tier_matches_the_in_memory_one(tmp_path):
    in_memory = masked_memoryx("adam", {"lr": 1e-2})
    store = TieredStore(0, tmp_path / "tier")               # every tensor on disk
    tiered = in_memory.copy(store=store)
    for step in range(4):
        in_memory.apply_gradients(grads_for(step))
        tiered.hint("prefetch", tiered.names())
        tiered.apply_gradients(grads_for(step))
        tiered.hint("release", tiered.names())
    assert_same(tiered, in_memory)
    assert store.resident_bytes == 0 and all(store.tier(k) == "disk" for k in store.keys() if store.get(k).size)
    assert store.get("a.weight::exp_avg").shape == (int(in_memory.masks["a.weight"].sum()),)
    tiered.save(tmp_path / "ckpt")
    assert_same(MemoryX.load(tmp_path / "ckpt", store=TieredStore(64)), in_memory)


def test_masks_set_after_steps_or_again_keep_the_state_of_the_kept_weights():
    weights, masks = weights_and_masks()
    mx = MemoryX.from_state_dict(weights, "sgd", lr=0.1, momentum=0.9)
    mx.apply_gradients(grads_for(0))
    dense = mx.optimizer_state("a.weight")["momentum_buffer"].copy()
    mx.set_masks({"a.weight": masks["a.weight"]})
    kept = masks["a.weight"]
    assert np.array_equal(bits(mx.optimizer_state("a.weight")["momentum_buffer"]), bits(dense[kept]))
    assert np.all(bits(mx.weight("a.weight")[~kept]) == 0)
    wider = kept | (np.arange(kept.size).reshape(kept.shape) % 3 == 0)
    mx.set_masks({"a.weight": wider})                       # newly kept weights start with zero state
    state = np.zeros(kept.shape, np.float32)
    state[wider] = mx.optimizer_state("a.weight")["momentum_buffer"]
    assert np.array_equal(bits(state[kept]), bits(dense[kept])) and np.all(state[wider & ~kept] == 0)
    mx.apply_gradients(grads_for(1))
    assert np.all(bits(mx.weight("a.weight")[~wider]) == 0)
    with pytest.raises(UsageError, match="has shape"):
        mx.set_optimizer_state("a.weight", "momentum_buffer", np.zeros(3, np.float32))
    mx.set_optimizer_state("a.weight", "momentum_buffer", np.ones(kept.shape, np.float32))  # dense: kept entries
    assert mx.optimizer_state("a.weight")["momentum_buffer"].shape == (int(wider.sum()),)


def test_masked_errors(tmp_path):
    mx = masked_memoryx("sgd", {"momentum": 0.9})
    with pytest.raises(UsageError, match="sparsity masks .* cannot be sharded"):
        ShardedMemoryX.from_memoryx(object(), mx)
    with pytest.raises(UsageError, match="must hold only 0 and 1"):
        mx.set_masks({"a.bias": np.full(SHAPES["a.bias"], 2)})
    mx.apply_gradients(grads_for(0))
    mx.save(tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "memoryx.json"
    manifest = json.loads(path.read_text())
    manifest["masks"]["a.weight"] = manifest["masks"]["a.weight"][::-1]
    path.write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="mask of 'a.weight' must hold ascending indices"):
        MemoryX.load(tmp_path / "ckpt")
    manifest["masks"]["a.weight"] = manifest["masks"]["a.weight"][::-1][1:]
    path.write_text(json.dumps(manifest))
    with pytest.raises(UsageError, match="the checkpoint's mask of a.weight keeps"):
        MemoryX.load(tmp_path / "ckpt")
