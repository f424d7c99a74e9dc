"""MemoryX tiers: the RAM/disk tiered store and MemoryX sharded over SwarmX systems."""

from __future__ import annotations

import json

import numpy as np
import pytest
from wse.config import UsageError
from wse.host.memoryx import MemoryX, NonFiniteGradientError, ShardedMemoryX, ShardMap, TieredStore, parse_size
from wse.host.data import Batches
from wse.host.swarmx import DataParallel, ReferenceSystem, run_inprocess
from wse.host.swarmx.selfcheck import reference_data

CONFIGS = [
    ("sgd", {"lr": 0.05, "momentum": 0.8, "nesterov": True, "weight_decay": 1e-2}),
    ("adam", {"lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 1e-2, "amsgrad": True}),
    ("adamw", {"lr": 1e-2, "weight_decay": 0.1}),
]
IDS = [name for name, _ in CONFIGS]


def bits(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def same_bits(a, b) -> bool:
    return np.asarray(a).shape == np.asarray(b).shape and np.array_equal(bits(a), bits(b))


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """Tensors of awkward sizes: a matrix, vectors, a scalar and one element (fewer than the shards).

    A local numpy generator, never torch's global one: in-process systems call this from their threads.
    """
    rng = np.random.default_rng(seed)
    shapes = {"0.weight": (5, 7), "0.bias": (5,), "2.weight": (2, 5), "2.bias": (2,), "scale": (), "one": (1,)}
    return {n: np.asarray(rng.uniform(-0.5, 0.5, s), np.float32) for n, s in shapes.items()}


def grads_for(step: int, weights: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return {n: np.asarray(rng.standard_normal(w.shape) * 10.0 ** rng.uniform(-6, 2, w.shape), np.float32)
            for n, w in weights.items()}


def assert_same_memoryx(a: MemoryX, b: MemoryX) -> None:
    assert a.names() == b.names() and a.step_count == b.step_count and a.skipped_steps == b.skipped_steps
    for name in a.names():
        assert same_bits(a.weight(name), b.weight(name)), name
        sa, sb = a.optimizer_state(name), b.optimizer_state(name)
        assert sa.keys() == sb.keys()
        assert all(same_bits(sa[k], sb[k]) for k in sa), name


# ------------------------------------------------------------------------------------------ sizes

def test_parse_size():
    assert parse_size("4096") == 4096 and parse_size(0) == 0 and parse_size("12B") == 12
    assert parse_size("64k") == parse_size("64KiB") == 65536 and parse_size("2KB") == 2000
    assert parse_size("1.5MiB") == 1572864 and parse_size(" 3 gb ") == 3 * 10 ** 9 and parse_size("1T") == 1 << 40
    for bad in ("", "12 parsecs", "-5", "MiB", "1e3", None, True):
        with pytest.raises(UsageError, match="size must be"):
            parse_size(bad)
    with pytest.raises(UsageError, match="at least 0 bytes"):
        parse_size(-1)


# ------------------------------------------------------------------------------------ tiered store

def test_tiered_store_places_by_creation_order_within_the_budget(tmp_path):
    store = TieredStore("100", tmp_path / "tier")
    a = store.create("a", (10,))          # 40 bytes: RAM
    b = store.create("b", (20,))          # 80 more would pass 100: disk
    c = store.create("c", (15,))          # 60: fits what is left (40 + 60 = 100)
    d = store.create("d::step", ())       # 4: over budget now: a 0-d memmap
    e = store.create("e", (0, 3))         # empty: RAM, always
    assert [store.tier(k) for k in ("a", "b", "c", "d::step", "e")] == ["memory", "disk", "memory", "disk", "memory"]
    assert store.resident_bytes == 100 and store.disk_bytes == 84
    assert isinstance(b, np.memmap) and isinstance(d, np.memmap) and not isinstance(a, np.memmap)
    assert list(store.keys()) == ["a", "b", "c", "d::step", "e"] and "b" in store and len(store) == 5
    assert sorted(p.name for p in (tmp_path / "tier").iterdir()) == ["0.bin", "1.bin"]
    b[...] = np.arange(20)
    d[...] = 7
    store.prefetch(store.keys())
    store.release(store.keys())                 # written back, pages dropped, values intact
    assert np.array_equal(np.fromfile(tmp_path / "tier" / "0.bin", np.float32), np.arange(20))
    assert np.array_equal(store.get("b"), np.arange(20)) and float(store.get("d::step")) == 7.0
    assert c.shape == (15,) and e.shape == (0, 3)
    store.delete("b")
    store.delete("a")
    assert not (tmp_path / "tier" / "0.bin").exists() and store.resident_bytes == 60
    with pytest.raises(KeyError):
        store.create("c", (1,))
    with pytest.raises(KeyError):
        store.tier("b")
    store.close()
    assert len(store) == 0 and not any((tmp_path / "tier").iterdir())


def test_tiered_store_folders(tmp_path):
    store = TieredStore("1KiB")
    folder = store.folder
    store.create("big", (1000,))
    assert folder.is_dir() and store.tier("big") == "disk"
    store.close()
    assert not folder.exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(UsageError, match="must be an empty folder"):
        TieredStore(0, tmp_path / "full")
    with pytest.raises(UsageError, match="size must be"):
        TieredStore("lots")


@pytest.mark.parametrize("name,hyper", CONFIGS, ids=IDS)
def test_memoryx_over_budget_matches_the_in_memory_run(tmp_path, name, hyper):
    weights = make_weights()
    total = sum(w.nbytes for w in weights.values())
    store = TieredStore(total // 3, tmp_path / "tier")          # the state is several times the budget
    in_memory = MemoryX.from_state_dict(weights, name, **hyper)
    tiered = MemoryX.from_state_dict(weights, name, store=store, **hyper)
    for step in range(4):
        g = grads_for(step, weights)
        in_memory.apply_gradients(g)
        tiered.apply_gradients(g)
        store.release(store.keys())
    assert_same_memoryx(tiered, in_memory)
    assert store.resident_bytes <= store.budget < store.disk_bytes
    assert any(store.tier(k) == "disk" for k in store.keys() if "::" not in k)    # weights too
    tiered.save(tmp_path / "ckpt")
    assert_same_memoryx(MemoryX.load(tmp_path / "ckpt", store=TieredStore(64)), in_memory)


# ---------------------------------------------------------------------------------------- shard map

def test_shard_map_covers_every_element_once():
    shapes = {"w": (5, 7), "b": (5,), "s": (), "e": (0, 4)}
    smap = ShardMap(shapes, 3)
    assert smap.names() == ["w", "b", "s", "e"] and smap.shards == 3
    assert [(r.start, r.stop) for r in smap.ranges("w")] == [(0, 12), (12, 24), (24, 35)]
    assert [len(r) for r in smap.ranges("b")] == [2, 2, 1]
    assert [len(r) for r in smap.ranges("s")] == [1, 0, 0] and [len(r) for r in smap.ranges("e")] == [0, 0, 0]
    assert smap.range("w", 1) == range(12, 24)
    assert json.loads(json.dumps(smap.to_dict()))["tensors"]["b"] == {"shape": [5], "ranges": [[0, 2], [2, 4], [4, 5]]}
    with pytest.raises(UsageError, match="shards must be a positive integer"):
        ShardMap(shapes, 0)


# -------------------------------------------------------------------------------------- sharded MemoryX

def sharded_run(group, name, hyper, steps, budget=None):
    weights = make_weights()
    store = TieredStore(budget) if budget is not None else None
    mx = ShardedMemoryX.from_state_dict(group, weights, name, store=store, **hyper)
    for step in steps:
        g = grads_for(step, weights)
        mx.apply_gradients({n: g[n].reshape(-1)[mx.local_range(n).start:mx.local_range(n).stop] for n in g})
    return mx


@pytest.mark.parametrize("name,hyper", CONFIGS, ids=IDS)
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_step_exactly_like_one_memoryx_and_save_one_checkpoint(tmp_path, name, hyper, shards):
    whole = MemoryX.from_state_dict(make_weights(), name, **hyper)
    for step in range(3):
        whole.apply_gradients(grads_for(step, make_weights()))

    def body(group):
        mx = sharded_run(group, name, hyper, range(3))
        full = mx.state_dict()
        only0 = mx.state_dict(dst=0)
        mx.save(tmp_path / "ckpt")
        return full, only0, mx.local.names(), [len(mx.local_range(n)) for n in mx.names()]

    results = run_inprocess(body, shards)
    for rank, (full, only0, names, sizes) in enumerate(results):
        assert all(same_bits(full[n].numpy(), whole.weight(n)) for n in whole.names())
        assert (only0 is None) == (rank != 0)
        assert sizes == [len(ShardMap({n: whole.shape(n) for n in whole.names()}, shards).range(n, rank))
                         for n in whole.names()]
    assert_same_memoryx(MemoryX.load(tmp_path / "ckpt"), whole)


def test_a_checkpoint_resumes_on_any_number_of_shards_and_in_a_disk_tier(tmp_path):
    name, hyper = CONFIGS[1]
    whole = MemoryX.from_state_dict(make_weights(), name, **hyper)
    for step in range(5):
        whole.apply_gradients(grads_for(step, make_weights()))
    run_inprocess(lambda g: sharded_run(g, name, hyper, range(2)).save(tmp_path / "ckpt"), 2)

    def resume(group):
        mx = ShardedMemoryX.load(group, tmp_path / "ckpt", store=TieredStore(16))
        weights = make_weights()
        for step in range(2, 5):
            g = grads_for(step, weights)
            mx.apply_gradients({n: g[n].reshape(-1)[mx.local_range(n).start:mx.local_range(n).stop] for n in g})
        mx.save(tmp_path / "again")
        return mx.local.store.disk_bytes

    assert all(disk > 0 for disk in run_inprocess(resume, 3))
    assert_same_memoryx(MemoryX.load(tmp_path / "again"), whole)


def test_shards_agree_on_non_finite_gradients():
    weights = {"w": np.ones(6, np.float32), "v": np.ones(2, np.float32)}

    def body(group, policy):
        mx = ShardedMemoryX.from_state_dict(group, weights, "adam", nonfinite=policy)
        g = {"w": np.ones(3, np.float32), "v": np.ones(1, np.float32)}
        if group.rank == 1:
            g["w"][2] = np.nan                # only system 1 sees the bad value
        outcome = "applied"
        try:
            if not mx.apply_gradients(g):
                outcome = "skipped"
        except NonFiniteGradientError as exc:
            outcome = str(exc)
        return outcome, mx.step_count, mx.skipped_steps, mx.local.weight("v").copy()

    for rank_result in run_inprocess(body, 2, "raise"):
        assert rank_result[0] == "gradients for ['w'] hold NaN or infinity; no tensor was updated"
        assert rank_result[1:3] == (0, 0) and np.array_equal(rank_result[3], [1.0])
    for rank_result in run_inprocess(body, 2, "skip"):
        assert rank_result[:3] == ("skipped", 0, 1) and np.array_equal(rank_result[3], [1.0])
    applied = run_inprocess(body, 2, "apply")
    assert all(r[:3] == ("applied", 1, 0) for r in applied) and applied[0][3][0] < 1.0


def test_sharded_errors():
    def body(group):
        mx = ShardedMemoryX.from_state_dict(group, {"w": np.ones(5, np.float32)}, "sgd")
        expected = [r"\(5,\), expected \(3,\) \(elements 0\.\.3 ", r"\(5,\), expected \(2,\) \(elements 3\.\.5 "]
        with pytest.raises(UsageError, match=r"gradient slice for 'w' has shape " + expected[group.rank]):
            mx.apply_gradients({"w": np.ones(5, np.float32)})
        with pytest.raises(UsageError, match="holds no tensor named 'x'"):
            mx.apply_gradients({"x": np.ones(3, np.float32)})
        with pytest.raises(UsageError, match="permutation"):
            ShardedMemoryX.from_state_dict(group, {"w": np.ones(2, np.float32)}, order=["w", "w"])
        with pytest.raises(UsageError, match="non-empty mapping"):
            ShardedMemoryX.from_state_dict(group, {})
        return repr(mx)

    assert run_inprocess(body, 2)[1] == "ShardedMemoryX(OptimizerConfig('sgd', lr=0.001, momentum=0.0, " \
                                        "dampening=0.0, nesterov=False, weight_decay=0.0), shard=1 of 2, " \
                                        "tensors=1, step_count=0)"


def test_data_parallel_training_with_a_disk_tier_matches_the_in_memory_run():
    """A 16-12-4 MLP: weights and Adam state of about 1.5 KiB per shard against a 256-byte budget."""
    system = ReferenceSystem((16, 12, 4), batch=12, columns=4)
    x, y = reference_data(system.sizes, 30, 0)

    def body(group, budget):
        store = TieredStore(budget) if budget is not None else None
        mx = ShardedMemoryX.from_state_dict(group, system.init_weights(0), "adam", store=store, lr=0.02)
        trainer = DataParallel(group, system, mx, system.blocks)
        batches = Batches(x, y, system.batch, seed=0)
        losses = [trainer.step(*batches.next_batch()).loss for _ in range(3)]
        tiers = (store.resident_bytes, store.disk_bytes, [store.tier(n) for n in mx.names()]) if store else None
        return {n: t.numpy() for n, t in mx.state_dict().items()}, losses, tiers

    in_memory = run_inprocess(body, 2, None)
    tiered = run_inprocess(body, 2, "256B")
    for (ram_state, ram_losses, _), (disk_state, disk_losses, tiers) in zip(in_memory, tiered):
        assert disk_losses == ram_losses
        assert all(same_bits(disk_state[n], ram_state[n]) for n in ram_state)
        resident, on_disk, weight_tiers = tiers        # the first weight (384 bytes) is on disk, its bias in RAM
        assert resident <= 256 and on_disk > 5 * 256 and weight_tiers[:2] == ["disk", "memory"]
