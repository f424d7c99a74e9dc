"""SwarmX: collectives, the fixed reduction order, data parallelism equal to one system, faults, links."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.host.memoryx import MemoryX, ShardedMemoryX, read_checkpoint
from wse.host.swarmx import (DataParallel, LinkModel, PeerError, ReferenceSystem, ShardResult, column_shards,
                             fold_partials, run_inprocess)
from wse.host.swarmx.selfcheck import reference_data, train_reference
from wse import numerics

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def bits(array) -> np.ndarray:
    return np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)


def same_bits(a, b) -> bool:
    return np.asarray(a).shape == np.asarray(b).shape and np.array_equal(bits(a), bits(b))


def partial_sums(rank: int, k: int, shape=(3, 5), seed: int = 0) -> np.ndarray:
    """Float32 partial sums of widely different magnitudes, so that the order of additions shows."""
    rng = np.random.default_rng([seed, rank])
    return (rng.standard_normal((k, *shape)) * 10.0 ** rng.integers(-4, 5, (k, *shape))).astype(np.float32)


# ------------------------------------------------------------------------------------- collectives

@pytest.mark.parametrize("systems", [1, 2, 3, 5])
def test_broadcast_from_every_source(systems):
    def body(group):
        got = []
        for src in range(group.size):
            a = np.full((2, 3), group.rank, np.float32)
            b = np.array(group.rank * 7, np.int64)          # 0-d, another dtype
            empty = np.zeros((0, 4), np.float32)
            group.broadcast(a, src)
            group.broadcast(b, src)
            group.broadcast(empty, src)
            got.append((a.copy(), int(b)))
        return got

    for per_rank in run_inprocess(body, systems):
        for src, (a, b) in enumerate(per_rank):
            assert np.array_equal(a, np.full((2, 3), src, np.float32)) and b == src * 7


@pytest.mark.parametrize("systems", [1, 2, 3, 4, 7])
def test_chain_reduce_is_the_fold_of_every_partial_sum_in_rank_order(systems):
    ks = [(2 * r + 1) % 3 for r in range(systems)]          # 1, 0, 2, 1, 0, ...: some systems add nothing
    everything = np.concatenate([partial_sums(r, k) for r, k in enumerate(ks)])

    def body(group, dst):
        out = np.full((3, 5), np.nan, np.float32)
        group.reduce_partials(partial_sums(group.rank, ks[group.rank]), dst, out=out)
        return out

    for dst in {0, systems - 1, systems // 2}:
        results = run_inprocess(body, systems, dst)
        assert same_bits(results[dst], fold_partials(everything))
        expected = np.zeros((3, 5), np.float32)                  # the left fold written out, from +0
        for part in everything:
            expected = numerics.as_float(numerics.vadd(bits(expected), bits(part))).reshape(3, 5)
        assert same_bits(results[dst], expected)
        assert all(np.isnan(r).all() for i, r in enumerate(results) if i != dst)


def test_tree_reduce_is_the_balanced_parenthesization_and_differs_from_the_chain():
    systems = 4
    parts = [partial_sums(r, 1, (64,), seed=3) for r in range(systems)]

    def body(group):
        out = np.zeros(64, np.float32)
        group.reduce_partials(parts[group.rank], 0, out=out)
        return out

    def add(a, b):
        return numerics.as_float(numerics.vadd(bits(a), bits(b)))

    tree = run_inprocess(body, systems, reduce_order="tree")[0]
    chain = run_inprocess(body, systems, reduce_order="chain")[0]
    local = [fold_partials(p) for p in parts]
    assert same_bits(tree, add(add(local[0], local[1]), add(local[2], local[3])))
    assert same_bits(chain, fold_partials(np.concatenate(parts)))
    assert not same_bits(tree, chain)            # the order is visible: the rule matters


def test_reductions_use_the_fabric_add():
    tiny = np.float32(2.0 ** -126)                            # the smallest normal number

    def body(group):
        values = {0: [-0.0, tiny * np.float32(1.5), tiny, np.inf, 1.0],
                  1: [-0.0, -tiny, -tiny * np.float32(0.5), -np.inf, np.nan]}[group.rank]
        t = np.array(values, np.float32)
        group.reduce(t, 0)
        return t

    total = bits(run_inprocess(body, 2)[0])
    assert total[0] == 0                                      # +0 + -0 + -0 = +0
    assert total[1] == 0                                      # 2^-127, a subnormal result: flushed
    assert total[2] == bits(tiny)                             # a subnormal operand counts as zero
    assert total[3] == total[4] == numerics.CANONICAL_NAN     # inf - inf, and NaN


def test_all_reduce_gather_barrier_and_torch_tensors():
    import torch

    def body(group):
        t = torch.full((3,), float(group.rank + 1))
        group.all_reduce(t)
        mine = np.arange(group.rank + 1, dtype=np.int64)          # shapes differ per system
        slots = [np.empty(r + 1, np.int64) for r in range(group.size)] if group.rank == 1 else None
        group.gather(mine, slots, 1)
        group.barrier()
        return t.numpy().copy(), slots

    results = run_inprocess(body, 3)
    for t, _ in results:
        assert np.array_equal(t, [6.0, 6.0, 6.0])
    assert [s.tolist() for s in results[1][1]] == [[0], [0, 1], [0, 1, 2]]


def test_async_handles_keep_the_call_order():
    def body(group):
        a = np.full(4, group.rank, np.float32)
        b = np.full(4, 10 + group.rank, np.float32)
        works = [group.broadcast(a, 1, async_op=True), group.reduce(b, 0, async_op=True)]
        a[...] += 0    # the caller may go on working
        for work in works:
            assert work.wait() is True and work.is_completed()
        return a.copy(), b.copy()

    results = run_inprocess(body, 2)
    assert np.array_equal(results[0][0], np.ones(4)) and np.array_equal(results[0][1], np.full(4, 21.0))


def test_collective_argument_errors():
    def body(group):
        errors = []
        for call in (lambda: group.broadcast(np.zeros(2, np.float32), 2),
                     lambda: group.reduce(np.zeros(2, np.float64), 0),
                     lambda: group.reduce_partials(np.zeros((1, 2), np.float32), 0),
                     lambda: group.broadcast([1.0, 2.0], 0),
                     lambda: group.gather(np.zeros(2, np.float32), [np.zeros(3, np.float32)] * 2, 0)):
            with pytest.raises(UsageError) as info:
                call()
            errors.append(str(info.value))
        return errors

    errors = run_inprocess(body, 2)[0]
    assert "src must be a system rank in 0..1, not 2" in errors[0]
    assert "must be float32, not float64" in errors[1]
    assert "needs out=" in errors[2]
    assert "numpy array or a CPU torch tensor, not list" in errors[3]
    assert "gather_list[0] must match" in errors[4]
    with pytest.raises(UsageError, match="reduce_order must be one of chain, tree"):
        run_inprocess(body, 2, reduce_order="ring")


# ------------------------------------------------------------------------------------------- faults

def test_a_failed_system_is_named_at_once():
    seen = {}

    def body(group):
        if group.rank == 1:
            raise ValueError("bad input on system 1")
        start = time.monotonic()
        try:
            group.broadcast(np.zeros(2, np.float32), 1)
        except PeerError as exc:
            seen["error"], seen["seconds"] = exc, time.monotonic() - start
            raise

    with pytest.raises(ValueError, match="bad input on system 1"):       # the cause, not the echo
        run_inprocess(body, 2, timeout=30)
    assert "SwarmX system 1 stopped with an error during broadcast (ValueError: bad input" in str(seen["error"])
    assert seen["error"].peers == (1,) and seen["seconds"] < 5


def test_a_silent_system_times_out_with_its_name():
    release = threading.Event()
    seen = {}

    def body(group):
        if group.rank == 2:
            release.wait(10)              # alive, but never joins the collective in time
            return None
        start = time.monotonic()
        try:
            group.reduce(np.ones(3, np.float32), 0)
        except PeerError as exc:
            seen.setdefault("error", exc)
            seen.setdefault("seconds", time.monotonic() - start)
            release.set()
            raise

    with pytest.raises(PeerError):
        run_inprocess(body, 3, timeout=0.5)
    assert "did not answer within 0.5 s during reduce" in str(seen["error"])
    assert 0.4 < seen["seconds"] < 5


def test_a_broken_group_refuses_further_collectives():
    def body(group):
        if group.rank == 1:
            return "left"
        with pytest.raises(PeerError, match="left the group"):
            group.broadcast(np.zeros(1, np.float32), 1)
        with pytest.raises(PeerError, match="left the group"):
            group.barrier()
        return "ok"

    assert run_inprocess(body, 2, timeout=30) == ["ok", "left"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_GLOO_FAULTS = """
import os, sys, time
import numpy as np
import torch.distributed
from wse.host.swarmx import PeerError, init_gloo
scenario, rank = sys.argv[1], int(os.environ["RANK"])
start = time.monotonic()
try:
    group = init_gloo(timeout=1.0, join_timeout=1.5)
    if rank == 1:                      # joins, then dies at once or stays silent past the timeout
        time.sleep(0 if scenario == "dies" else 4)
        os._exit(0)
    start = time.monotonic()
    group.reduce(np.ones(4, np.float32), 0)
    print("no error")
except PeerError as exc:
    print(f"{time.monotonic() - start:.1f} {exc}")
sys.stdout.flush()
os._exit(0)
"""

GLOO_FAULTS = {     # scenario: (ranks started together on one port, what system 0 must say)
    "missing": ([0], "SwarmX system 1 of 2 did not join within 1.5 s (seen from system 0)"),
    "dies": ([0, 1], "is unreachable: the connection failed during reduce"),
    "silent": ([0, 1], "did not answer within 1 s during reduce"),
}


def _spawn(script, scenario, rank, port):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([PYTHON, str(script), scenario], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _last_line(proc) -> tuple[float, str]:
    output = proc.communicate(timeout=120)[0]
    seconds, text = output.strip().splitlines()[-1].split(" ", 1)
    return float(seconds), text


@pytest.mark.parametrize("scenario", ["missing", "dies", pytest.param("silent", marks=pytest.mark.slow)])
def test_gloo_names_a_missing_dead_or_silent_peer(tmp_path, scenario):
    """Plain processes with the environment torchrun sets; system 0 must name system 1, quickly."""
    script = tmp_path / "faults.py"
    script.write_text(_GLOO_FAULTS)
    ranks, message = GLOO_FAULTS[scenario]
    port = _free_port()
    procs = [_spawn(script, scenario, rank, port) for rank in ranks]
    lonely = _spawn(script, scenario, 1, _free_port()) if scenario == "missing" else None   # no system 0 at all
    seconds, text = _last_line(procs[0])
    for proc in procs[1:]:
        proc.communicate(timeout=120)
    assert message in text and "SwarmX system 1" in text, text
    assert seconds < 20          # from joining to the error: bounded by the timeouts (1 s, 1.5 s), not a hang
    if lonely is not None:
        seconds, text = _last_line(lonely)
        assert "SwarmX system 0, which hosts the rendezvous store, at 127.0.0.1:" in text
        assert "cannot be reached from system 1 within 1.5 s" in text and seconds < 20


# ------------------------------------------------------------------------------- data parallelism

def single_system_run(system, steps, optimizer="adam", **hyper):
    """One system: ReferenceSystem.train_step + MemoryX, the baseline every N must reproduce."""
    x, y = reference_data(system.sizes, 30, 0)
    from wse.host.data import Batches
    batches = Batches(x, y, system.batch, seed=0)
    mx = MemoryX.from_state_dict(system.init_weights(0), optimizer, **hyper)
    losses = []
    for _ in range(steps):
        xb, yb = batches.next_batch()
        step = system.train_step(xb, yb, {n: mx.weight(n) for n in mx.names()})
        mx.apply_gradients(step.grads)
        losses.append((step.loss, step.correct))
    return mx, losses


def data_parallel_run(group, system, steps, optimizer="adam", **hyper):
    from wse.host.data import Batches
    x, y = reference_data(system.sizes, 30, 0)
    batches = Batches(x, y, system.batch, seed=0)
    mx = ShardedMemoryX.from_state_dict(group, system.init_weights(0), optimizer, **hyper)
    trainer = DataParallel(group, system, mx, system.blocks)
    losses = []
    for _ in range(steps):
        result = trainer.step(*batches.next_batch())
        losses.append((result.loss, result.correct))
    return mx.state_dict(), losses, trainer.columns


@pytest.mark.parametrize("systems", [1, 2, 3, 4, 6])
def test_n_systems_equal_one_system_bit_for_bit(systems):
    system = ReferenceSystem((8, 6, 5, 4), batch=12, columns=4)
    whole, losses = single_system_run(system, 5, "adam", lr=0.05)      # 5 steps: batches of 12, 12, 6, 12, 12
    results = run_inprocess(data_parallel_run, systems, system, 5, "adam", lr=0.05)
    for state, dp_losses, _ in results:
        assert dp_losses == losses
        for name in whole.names():
            assert same_bits(state[name].numpy(), whole.weight(name)), name
    assert [r[2] for r in results] == column_shards(4, systems)          # 6 systems: two of them idle
    assert not same_bits(results[0][0]["fc0.weight"].numpy(), system.init_weights(0)["fc0.weight"])


def test_a_different_reduction_order_breaks_equality():
    system = ReferenceSystem((8, 6, 4), batch=16, columns=4)
    whole, _ = single_system_run(system, 2, "sgd", lr=0.5)
    tree = run_inprocess(data_parallel_run, 4, system, 2, "sgd", lr=0.5, reduce_order="tree")[0][0]
    assert not all(same_bits(tree[n].numpy(), whole.weight(n)) for n in whole.names())


def test_the_reference_system_keeps_the_hook_contract():
    system = ReferenceSystem((5, 7, 3), batch=10, columns=4)
    rng = np.random.default_rng(4)
    weights = system.init_weights(1)
    x, y = rng.standard_normal((8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    step = system.train_step(x, y, weights)
    whole = system.train_shard(x, y, weights, n=8, columns=range(4))
    for name, grad in step.grads.items():
        assert whole.grad_partials[name].shape == (4, *grad.shape)
        assert same_bits(fold_partials(whole.grad_partials[name]), grad)
    assert same_bits(whole.logits, step.logits)
    # Tokens are independent: a shard's logits are the whole batch's rows, and its partials its columns'.
    blocks = system.blocks                                  # 3, 3, 2 and 2 tokens: the last column pads
    part = system.train_shard(x[blocks[1].start:blocks[2].stop], y[blocks[1].start:blocks[2].stop], weights, n=8,
                              columns=range(1, 3))
    assert same_bits(part.logits, step.logits[blocks[1].start:blocks[2].stop])
    for name in step.grads:
        assert same_bits(part.grad_partials[name], whole.grad_partials[name][1:3])
    tail = system.train_shard(x[0:0], y[0:0], weights, n=8, columns=range(3, 4))    # padding only
    assert tail.logits.shape == (0, 3) and all(not bits(p).any() for p in tail.grad_partials.values())
    with pytest.raises(UsageError, match="m in 3..3"):
        system.train_shard(x[:2], y[:2], weights, n=8, columns=range(0, 1))


def test_the_runtime_hook_when_the_runtime_provides_it():
    """The same equality with the real runtime (functional backend), once it implements ``train_shard``."""
    from wse.host.runtime import Runtime
    import torch
    from torch import nn

    from wse.host.compiler import compile_model
    from wse.host.swarmx import token_blocks
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(22, 13), nn.ReLU(), nn.Linear(13, 7))
    exe = compile_model(model, torch.randn(16, 22), config=FabricConfig(width=4, height=4), batch=16)
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal((k, 22)).astype(np.float32), rng.integers(0, 7, k)) for k in (16, 16, 9)]
    init = {k: v.detach().numpy().copy() for k, v in model.named_parameters()}
    whole = runtime.train_shard(*data[0], init, n=16, columns=range(len(token_blocks(exe))))
    step = runtime.train_step(*data[0], init)
    assert all(same_bits(fold_partials(whole.grad_partials[k]), step.grads[k]) for k in step.grads)
    assert same_bits(whole.logits, step.logits)
    mx = MemoryX.from_state_dict(init, "adam", lr=0.01)
    losses = []
    for x, y in data:
        result = runtime.train_step(x, y, {k: mx.weight(k) for k in mx.names()})
        losses.append(result.loss)
        mx.apply_gradients(result.grads)

    def body(group):
        sharded = ShardedMemoryX.from_state_dict(group, init, "adam", lr=0.01)
        trainer = DataParallel(group, runtime, sharded, token_blocks(exe))
        return [trainer.step(x, y).loss for x, y in data], sharded.state_dict()

    for systems in (2, 3):
        dp_losses, state = run_inprocess(body, systems)[0]
        assert dp_losses == losses and all(same_bits(state[k].numpy(), mx.weight(k)) for k in mx.names())


class _BrokenSystem(ReferenceSystem):
    def train_shard(self, x, y, weights, *, n, columns):
        result = super().train_shard(x, y, weights, n=n, columns=columns)
        return ShardResult(result.logits, {k: v[:, :1] for k, v in result.grad_partials.items()}, result.cycles)


def test_data_parallel_errors():
    system = ReferenceSystem((4, 3), batch=6, columns=2)

    def body(group, broken):
        mx = ShardedMemoryX.from_state_dict(group, system.init_weights(), "sgd")
        trainer = DataParallel(group, _BrokenSystem((4, 3), 6, 2) if broken else system, mx, system.blocks)
        with pytest.raises(UsageError, match="1 to 6 samples"):
            trainer.step(np.zeros((7, 4), np.float32), np.zeros(7, np.int64))
        trainer.step(np.zeros((6, 4), np.float32), np.zeros(6, np.int64))

    run_inprocess(body, 1, False)
    with pytest.raises(UsageError, match=r"partial sums of 'fc0.bias' must be float32 \[1, 3\], not float32 \[1, 1\]"):
        run_inprocess(body, 2, True)
    with pytest.raises(UsageError, match="follow each other from token 0"):
        run_inprocess(lambda g: DataParallel(g, system, ShardedMemoryX.from_state_dict(g, system.init_weights()),
                                             [range(1, 6)]), 1)


def test_restart_from_a_checkpoint_on_another_number_of_systems(tmp_path):
    run_inprocess(train_reference, 1, tmp_path / "straight", steps=4, optimizer="adamw", lr=0.02)
    run_inprocess(train_reference, 2, tmp_path / "split", steps=2, optimizer="adamw", lr=0.02)
    first = json.loads((tmp_path / "split" / "steps.json").read_text())
    run_inprocess(train_reference, 3, tmp_path / "split", steps=2, resume=True)
    second = json.loads((tmp_path / "split" / "steps.json").read_text())
    straight = json.loads((tmp_path / "straight" / "steps.json").read_text())
    assert [s["loss"] for s in first + second] == [s["loss"] for s in straight]
    a, b = read_checkpoint(tmp_path / "straight" / "memoryx"), read_checkpoint(tmp_path / "split" / "memoryx")
    assert a[0]["step_count"] == b[0]["step_count"] == 4
    assert a[1].keys() == b[1].keys() and all(a[1][k].tobytes() == b[1][k].tobytes() for k in a[1])


def test_torchrun_gloo_equals_in_process_bit_for_bit(tmp_path):
    """Two processes under torchrun (gloo on loopback) against two in-process systems and one system."""
    settings = dict(steps=3, optimizer="adam", lr=0.03, sizes=(8, 6, 4), batch=12)
    proc = subprocess.run([str(Path(PYTHON).with_name("torchrun")), "--standalone", "--nproc-per-node", "2",
                           "-m", "wse.host.swarmx", "--out", str(tmp_path / "gloo"), "--timeout", "60",
                           "--steps", "3", "--optimizer", "adam", "--lr", "0.03", "--sizes", "8,6,4", "--batch", "12"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 2: loss" in proc.stdout
    for systems in (1, 2):
        run_inprocess(train_reference, systems, tmp_path / f"in{systems}", **settings)
    gloo = read_checkpoint(tmp_path / "gloo" / "memoryx")[1]
    steps = json.loads((tmp_path / "gloo" / "steps.json").read_text())
    for systems in (1, 2):
        other = read_checkpoint(tmp_path / f"in{systems}" / "memoryx")[1]
        assert gloo.keys() == other.keys() and all(gloo[k].tobytes() == other[k].tobytes() for k in gloo)
        other_steps = json.loads((tmp_path / f"in{systems}" / "steps.json").read_text())
        assert [s["loss"] for s in steps] == [s["loss"] for s in other_steps]
    assert steps == json.loads((tmp_path / "in2" / "steps.json").read_text())      # cycles too


def test_selfcheck_reports_usage_errors_in_one_line(tmp_path, capsys):
    from wse.host.swarmx.selfcheck import main
    assert main(["--out", str(tmp_path), "--optimizer", "lamb"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: optimizer must be one of sgd, adam, adamw")


# ------------------------------------------------------------------------------------------- links

def test_link_model_cycles():
    model = LinkModel(wavelets_per_cycle=2.0, hop_latency=10)
    assert model.wavelets(0) == 0 and model.wavelets(1) == 1 and model.wavelets(8) == 2 and model.wavelets(9) == 3
    assert [model.links(n, "tree") for n in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 3, 3, 4, 4, 5]
    assert [model.links(n, "chain") for n in (1, 2, 5)] == [1, 2, 5]
    assert model.broadcast_cycles(4000, 1) == 10 + 500
    assert model.broadcast_cycles(4000, 8) == 40 + 500
    assert model.reduce_cycles(4000, 8) == 80 + 500 and model.reduce_cycles(4000, 8, "tree") == 40 + 500
    assert model.step_cycles([4000, 8], 2) == 2 * (20 + 500) + (20 + 500) + 2 * (20 + 1) + (20 + 1)
    assert LinkModel(fanout=4).links(16, "tree") == 3
    assert LinkModel.for_fabric(FabricConfig(width=8, height=6)).wavelets_per_cycle == 6.0
    for bad in (dict(wavelets_per_cycle=0), dict(hop_latency=-1), dict(fanout=1)):
        with pytest.raises(UsageError):
            LinkModel(**bad)
    with pytest.raises(UsageError, match="order must be 'chain' or 'tree'"):
        model.links(3, "ring")
