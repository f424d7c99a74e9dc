"""Training with data-parallel replicas of the layer-pipelined mode: each copy's
gradients over its shards, summed on the fabric in copy order before the
update, every copy left with the same parameters (docs/layer_pipelined.md section 6b)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse import numerics
from wse.config import FabricConfig
from wse.host.compiler.frontend import trace
from wse.host.compiler.pipelined import plan
from wse.host.compiler.pipelined_cycles import phase_cycles
from wse.host.compiler.weight_streaming import FitError
from wse.host.memoryx.optim import OptimizerConfig
from wse.host.runtime.pipelined import (PipelinedDevice, PipelinedFunctional, functional_backward,
                                        functional_forward, functional_update, loss_delta, passes)


def _model(dims, seed):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*mods[:-1])
    return trace(model, torch.zeros(1, dims[0])), {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def _bits(a):
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _scalar_sum(parts):
    """``p_0 + p_1 + ...`` in order, one wse.numerics.add per element (not the vector path)."""
    flat = [_bits(p).ravel() for p in parts]
    out = np.array([int(v) for v in flat[0]], dtype=np.uint32)
    for p in flat[1:]:
        out = np.array([numerics.add(int(a), int(b)) for a, b in zip(out, p)], dtype=np.uint32)
    return out.view(np.float32).reshape(np.shape(parts[0]))


def _one_copy_step(one, shards, params, state, x, y, first):
    """The rule of section 6b on one copy: per pass, every shard from +0 (accumulating over
    the passes), then the shards' gradients summed in order, then the update."""
    grads = [None] * len(shards)
    for xb, yb, real, n in passes(one_batch(one, shards), x, y):
        for r, s in enumerate(shards):
            xs, ys = xb[s.start:s.stop], yb[s.start:s.stop]
            outs = functional_forward(one, params, xs)
            delta = loss_delta(one, outs[-1], ys, min(max(real - s.start, 0), len(s)), n)
            grads[r] = functional_backward(one, params, xs, outs, delta, grads[r])
    total = {name: _scalar_sum([g[name] for g in grads]) for name in grads[0]}
    functional_update(one, params, total, state, first)


def one_batch(one, shards):
    """A stand-in plan whose passes have the replicas' pass size (the shards' total)."""
    class _P:
        batch = shards[-1].stop
    return _P


@pytest.mark.parametrize("dims, strip, height, replicas, batch, n", [
    ((6, 5, 4, 3), 3, 3, 1, 5, 9), ((6, 5, 4, 3), 3, 3, 2, 5, 9), ((9, 7, 3), 2, 2, 4, 6, 11)])
def test_replicas_train_golden_equals_functional_and_one_copy(dims, strip, height, replicas, batch, n):
    """k copies: golden = functional bit for bit (losses, logits, every copy's parameters and
    momentum), = one copy running the same shards from +0 reduced in copy order; static
    cycles = golden cycles for every phase."""
    graph, weights = _model(dims, seed=replicas)
    opt = OptimizerConfig("sgd", lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    many = plan(graph, FabricConfig(width=strip * replicas, height=height), batch, optimizer=opt,
                replicas=replicas)
    shards = [s for _, s in many.copies()]
    one = plan(graph, FabricConfig(width=strip, height=height), len(shards[0]), optimizer=opt)
    assert ("reduce" in many.phases) == (replicas > 1)
    dev = PipelinedDevice(many, "golden")
    dev.write_weights(weights)
    fn = PipelinedFunctional(many, weights)
    ref = {k: v.copy() for k, v in fn.params.items()}
    ref_state: dict = {}
    static = phase_cycles(many)
    rng = np.random.default_rng(replicas)
    for step in range(2):
        x = rng.standard_normal((n, dims[0])).astype(np.float32)
        y = rng.integers(0, dims[-1], n)
        loss, logits, cycles = dev.train_step(x, y)
        f_loss, f_logits = fn.train_step(x, y)
        _one_copy_step(one, shards, ref, ref_state, x, y, step == 0)
        assert loss == f_loss and np.array_equal(_bits(logits), _bits(f_logits))
        passes_run = -(-n // batch)
        for name, c in cycles.items():
            runs = {"forward": passes_run, "backward": passes_run - 1}.get(name, 1)
            assert c == static[name] * runs, name
        for r in range(replicas):
            params, momentum = dev.read_state(r)
            for name in ref:
                assert np.array_equal(_bits(params[name]), _bits(fn.params[name])), (r, name)
                assert np.array_equal(_bits(fn.params[name]), _bits(ref[name])), name
                assert np.array_equal(_bits(momentum[name]), _bits(fn.state[name])), (r, name)
                assert np.array_equal(_bits(fn.state[name]), _bits(ref_state[name])), name


def test_replicas_train_needs_the_reduction_colors():
    graph, _ = _model((6, 5, 3), seed=0)
    with pytest.raises(FitError, match="needs 13 colors"):
        plan(graph, FabricConfig(width=4, height=3, colors=12, tasks=12), 4,
             optimizer=OptimizerConfig("sgd", lr=0.1), replicas=2)


def test_reduce_is_one_pvop_record_per_conveyor_and_pass_ons_merge():
    """Every PE's reduce list is at most one record per conveyor (east, then west); a run
    of streams crossing a PE is one fabric-to-fabric entry; entries round-trip."""
    from wse.firmware.isa import DsdKind
    from wse.firmware.training import pipe
    from wse.host.compiler.pipelined_reduce import EAST_COLORS, WEST_COLORS
    graph, _ = _model((9, 7, 3), seed=0)
    p = plan(graph, FabricConfig(width=8, height=2), 4, optimizer=OptimizerConfig("sgd", lr=0.1), replicas=2)
    crossing = 0
    for row in p.phases["reduce"][1]:
        for records in row:
            assert len(records) <= 2
            colors = []
            for words in records:
                kind, fields = pipe.decode(words)
                entries = pipe.pvop_entries(fields)
                assert kind == "pvop" and len(entries) == fields["n"] and len(words) == words[1]
                again = pipe.encode_pvop((e["op"], _raw(e["d"]), _raw(e["a"]), _raw(e["b"])) for e in entries)
                assert np.array_equal(again, words)
                colors.append({e[n][1] for e in entries for n in "dab" if e[n][0] in (DsdKind.FABIN, DsdKind.FABOUT)})
                crossing += sum(1 for e in entries if e["op"] == 0 and e["d"][0] == DsdKind.FABOUT
                                and e["a"][0] == DsdKind.FABIN)
            assert [c <= set(EAST_COLORS) for c in colors][:1] in ([], [True])      # east first
            assert all(c and (c <= set(EAST_COLORS) or c <= set(WEST_COLORS)) for c in colors)
    assert crossing > 0
    with pytest.raises(ValueError, match="at least one entry"):
        pipe.encode_pvop([])


def _raw(dsd):
    """A decoded descriptor ``(kind, base, length, stride)`` as its two words."""
    kind, base, length, stride = dsd
    return base | length << 16, int(kind) | (stride & 0xFFFF) << 16
