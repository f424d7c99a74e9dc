"""The weight-streaming compiler: layout and stream orders, the firmware's
exp / reciprocal / softmax numerics, the static cycle model against the golden
model, fit errors, the executable file and the FC-MNIST utilization figure.
"""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.firmware.training import numerics as fw, records, timing, training_program
from wse.host.compiler import (Executable, FitError, Relu, ReluMask, Sgemm, SgemmTransposed, SoftmaxDelta,
                               WeightGradient, WeightStreamingLayout, compile_model, trace)
from wse.host.compiler.executable import VERSION
from wse.host.compiler.cycles import phase_cycles
from wse.host.compiler.weight_streaming import plan, ring_capacity
from wse.host.compiler.ws_phases import sgemm_steps
from wse.host.runtime import Runtime, kernels
from wse.host.runtime.golden import GoldenBackend


def mlp(*sizes, bias=True, relu_last=False):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b, bias=bias))
        if i < len(sizes) - 2 or relu_last:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def compile_for(model, batch, mesh, **config):
    torch.manual_seed(0)
    features = next(m for m in model if isinstance(m, nn.Linear)).in_features
    return compile_model(model, torch.randn(batch, features), batch=batch,
                         config=FabricConfig(width=mesh[0], height=mesh[1], **config))


# Layout and stream orders ------------------------------------------------------------

@pytest.mark.parametrize("height,outputs", [(1, 5), (2, 3), (4, 7), (4, 16), (5, 2)])
def test_every_output_rings_once_through_every_row(height, outputs):
    starts, ends = {}, {}
    for row in range(height):
        o, p = sgemm_steps(row, height, outputs)
        assert sorted(o.tolist()) == list(range(outputs))         # each output once per row
        for out, pos in zip(o.tolist(), p.tolist()):
            assert pos == (row - out % height - 1) % height          # ring position of this row
            if pos == 0:
                starts[out] = row
            if pos == height - 1:
                ends[out] = row
    for out in range(outputs):
        assert ends[out] == out % height                               # lands where the features live
        assert starts[out] == (out % height + 1) % height


def test_streams_cover_every_weight_once_and_gradients_every_element():
    exe = compile_for(mlp(22, 13, 7), 8, (4, 4))
    fwd = exe.phases["fwd 0"]
    gathered = np.concatenate([s.gather[s.ctrl == 0] for s in fwd.streams_in])
    assert np.array_equal(np.sort(gathered), np.arange(13 * 22))      # every weight streams once
    ctrl = np.concatenate([s.gather[s.ctrl == 1] for s in fwd.streams_in])
    assert np.array_equal(np.sort(ctrl), 13 * 22 + np.arange(13))     # and every bias, as control wavelets
    back = exe.phases["bwd-data 2"]
    gathered = np.concatenate([s.gather[s.ctrl == 0] for s in back.streams_in])
    assert np.array_equal(np.sort(gathered), np.arange(7 * 13))       # W again, transposed order
    shapes = exe.parameters()
    for name, tensors in (("bwd-weight 0", ("0.weight", "0.bias")), ("bwd-weight 2", ("2.weight", "2.bias"))):
        streams = exe.phases[name].streams_out
        assert all(s.tensors == tensors for s in streams)
        scatter = np.concatenate([s.scatter for s in streams])
        size = sum(int(np.prod(shapes[t])) for t in tensors)
        assert np.array_equal(np.sort(scatter), np.arange(size))      # every gradient element once


def test_ring_routes_give_each_router_color_one_input():
    exe = compile_for(mlp(22, 13, 7), 8, (3, 5))
    seen = {}
    for x, y, color, inp, outs in exe.routes:
        assert (x, y, color) not in seen, f"color {color} routed twice at ({x}, {y})"
        seen[(x, y, color)] = inp


def test_records_round_trip_and_defines():
    words = records.encode("relu", {"data": records.dsd_mem(100, 7, 2)})
    kind, fields, table = records.decode(words)
    assert kind == "relu" and fields["data"][1:] == (100, 7, 2) and table == []
    defines = records.assembler_defines()
    assert defines["K_SGEMM"] == records.KINDS["sgemm"] and defines["RL_DATA"] == records.HEADER_WORDS
    with pytest.raises(ValueError, match="missing fields"):
        records.encode("relu", {})


# Firmware numerics ------------------------------------------------------------------

def _ulps(got, want):
    return np.abs(got.view(np.int32).astype(np.int64) - want.view(np.int32).astype(np.int64))


def test_exp_is_within_one_ulp():
    x = np.linspace(-87.0, 0.0, 400_001, dtype=np.float32)
    got = fw.exp(x.view(np.uint32)).view(np.float32)
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    ulps = _ulps(got, want)
    print(f"exp: max {ulps.max()} ulp, {np.mean(ulps > 0):.4f} of values not correctly rounded")
    assert ulps.max() <= 1
    assert fw.exp(np.float32([-200.0, -np.inf]).view(np.uint32)).tolist() == [0, 0]   # below 2^-126: flushed


def test_reciprocal_is_within_one_ulp():
    s = np.linspace(1.0, 5000.0, 400_001, dtype=np.float32)
    got = fw.reciprocal(s.view(np.uint32)).view(np.float32)
    ulps = _ulps(got, (1.0 / s.astype(np.float64)).astype(np.float32))
    print(f"reciprocal: max {ulps.max()} ulp, {np.mean(ulps > 0):.4f} of values not correctly rounded")
    assert ulps.max() <= 1


def test_softmax_delta_matches_pytorch_and_the_compiled_loop():
    rng = np.random.default_rng(0)
    z = (rng.standard_normal((10, 16)) * 4).astype(np.float32)
    labels = rng.integers(0, 10, 16)
    onehot = np.zeros((10, 16), np.float32)
    onehot[labels, np.arange(16)] = 1
    scale = np.full(16, np.float32(1 / 16), np.float32)
    delta = fw.softmax_delta(z.view(np.uint32), onehot.view(np.uint32), scale.view(np.uint32)).view(np.float32)
    logits = torch.tensor(z.T, requires_grad=True)
    nn.functional.cross_entropy(logits, torch.tensor(labels)).backward()
    np.testing.assert_allclose(delta.T, logits.grad.numpy(), rtol=1e-5, atol=1e-7)
    special = np.float32([0.0, -0.0, 1e-38, -1e-45, np.inf, -np.inf, np.nan, 88.0, -100.0, 3.0])
    for trial in range(40):
        c, b = int(rng.integers(1, 12)), int(rng.integers(1, 6))
        z = rng.choice(special, (c, b)) if trial % 2 else (rng.standard_normal((c, b)) * 30).astype(np.float32)
        onehot = np.zeros((c, b), np.float32)
        onehot[rng.integers(0, c, b), np.arange(b)] = 1
        scale = np.full(b, np.float32(1 / b), np.float32)
        want = fw.softmax_delta(z.view(np.uint32), onehot.view(np.uint32), scale.view(np.uint32))
        assert np.array_equal(kernels.softmax_delta(z, onehot, scale).view(np.uint32), want), (z, trial)


# The static cycle model ------------------------------------------------------------------

CASES = [
    (mlp(22, 13, 7), 8, (4, 4), {}),
    (mlp(22, 13, 7, bias=False), 7, (3, 2), {}),
    (mlp(5, 9, 3, relu_last=True), 6, (2, 5), {}),
    (mlp(3, 17, 2, 11, 5), 9, (3, 3), {}),
    (mlp(22, 13, 7), 8, (1, 1), {}),
    (mlp(22, 13, 7), 8, (5, 1), {}),
    (mlp(22, 13, 7), 8, (1, 4), {}),
    (mlp(30, 4), 32, (4, 4), {}),                                     # 8 tokens per PE: the ring's limit
    (mlp(22, 13, 7), 8, (4, 4), dict(router_depth=1, rx_depth=3, tx_depth=2)),
    (mlp(22, 13, 7), 3, (4, 4), dict(colors=7)),                      # fewer tokens than columns
]


@pytest.mark.parametrize("model,batch,mesh,extra", CASES,
                         ids=[f"{c[2][0]}x{c[2][1]}-b{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_cycle_model_equals_the_golden_model(model, batch, mesh, extra):
    exe = compile_for(model, batch, mesh, **extra)
    backend = GoldenBackend(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, runtime._classes, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    images = {addr: image for addr, image in exe.static}
    for name in exe.sequences["train"]:
        backend.device.reset_counters()
        cycles = backend.run_phase(name, weights, {})
        assert cycles == exe.phases[name].cycles, name
        counters = backend.device.counters()["pe"]
        assert counters["fmac"].sum() == exe.phases[name].fmacs, name
        image = images[exe.phases[name].ops_addr]
        for y in range(mesh[1]):
            for x_ in range(mesh[0]):       # the mirror's stall-free cycles, PE by PE
                ops = timing.pe_ops(image[y, x_])
                pure = sum(a if op == timing.BUSY else 1 if op == timing.RECV else a + 1
                           for op, a, *_ in ops if op != timing.END)
                assert pure == counters["busy"][y, x_] - counters["stall"][y, x_], (name, x_, y)


def test_cycle_model_fails_on_a_wrong_mirror(monkeypatch):
    exe_plan = plan(trace(mlp(22, 13, 7), torch.randn(8, 22)), FabricConfig(), 8)
    right = phase_cycles(exe_plan, training_program(FabricConfig()))
    real = timing._OP_DONE
    monkeypatch.setattr(timing, "_OP_DONE", real + 1)
    wrong = phase_cycles(exe_plan, training_program(FabricConfig()))
    assert all(wrong[name] > right[name] for name in right)


# Fit errors and arguments ------------------------------------------------------------------

def test_memory_fit_error_states_need_and_availability():
    with pytest.raises(FitError, match=r"needs \d+ words per PE on a 4x4 mesh .* but sram_words is 2048"):
        compile_for(mlp(784, 256, 10), 16, (4, 4), sram_words=2048)


def test_batch_and_colors_and_imem_fit_errors():
    capacity = ring_capacity(FabricConfig())      # 16 tokens per PE run as token passes (test_token_passes.py)
    wide = plan(trace(mlp(22, 7), torch.randn(64, 22)), FabricConfig(width=4, height=4), 64)
    assert [len(p) for p in wide.passes] == [-(-16 // (capacity - 1))] * 4
    with pytest.raises(FitError, match="needs 6 colors but the configuration has colors=4"):
        compile_for(mlp(22, 7), 8, (4, 4), colors=4)
    with pytest.raises(FitError, match="needs \\d+ instruction words but imem_words is 256"):
        compile_for(mlp(22, 7), 8, (4, 4), imem_words=256)


def test_bad_arguments_are_usage_errors():
    with pytest.raises(UsageError, match="mode must be one of pipelined, weight_streaming or 'auto', not 'bogus'"):
        compile_model(mlp(4, 2), torch.randn(2, 4), config=FabricConfig(), batch=2, mode="bogus")
    with pytest.raises(UsageError, match="batch must be a positive integer"):
        compile_model(mlp(4, 2), torch.randn(2, 4), config=FabricConfig(), batch=0)
    with pytest.raises(UsageError, match="has no loss"):
        compile_model(mlp(4, 2), torch.randn(2, 4), config=FabricConfig(), batch=2, loss=None)
    with pytest.raises(UsageError, match="reduction 'sum'"):
        compile_model(mlp(4, 2), torch.randn(2, 4), config=FabricConfig(), batch=2,
                      loss=nn.CrossEntropyLoss(reduction="sum"))


# The executable file ------------------------------------------------------------------------

def test_executable_runs_after_reload_without_the_model(tmp_path):
    exe = compile_for(mlp(22, 13, 7), 8, (4, 4))
    path = tmp_path / "mlp.wse"
    exe.save(path)
    rng = np.random.default_rng(2)
    weights = {name: rng.standard_normal(shape).astype(np.float32) * 0.3 for name, shape in exe.parameters().items()}
    x = rng.standard_normal((8, 22)).astype(np.float32)
    y = rng.integers(0, 7, 8)
    np.savez(tmp_path / "data.npz", x=x, y=y, **weights)
    expected = Runtime(exe, "functional").train_step(x, y, weights)
    script = textwrap.dedent(f"""
        import sys, numpy as np
        from wse.host.compiler.executable import Executable
        from wse.host.runtime import Runtime
        exe = Executable.load({str(path)!r})
        data = np.load({str(tmp_path / "data.npz")!r})
        weights = {{k: data[k] for k in data.files if k not in ("x", "y")}}
        r = Runtime(exe, "golden").train_step(data["x"], data["y"], weights)
        np.savez({str(tmp_path / "out.npz")!r}, logits=r.logits, cycles=r.cycles, **r.grads)
        assert "torch" not in sys.modules, "running an executable must not need PyTorch"
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    out = np.load(tmp_path / "out.npz")
    assert np.array_equal(out["logits"].view(np.uint32), expected.logits.view(np.uint32))
    for name in exe.parameters():
        assert np.array_equal(out[name].view(np.uint32), expected.grads[name].view(np.uint32))
    assert int(out["cycles"]) == expected.cycles
    again = Executable.load(path)
    assert again.graph == exe.graph and again.phases.keys() == exe.phases.keys()
    assert again.summary() == exe.summary()


def test_executable_file_round_trips_its_typed_contents(tmp_path):
    exe = compile_for(mlp(5, 9, 3, relu_last=True), 6, (2, 5))
    path = tmp_path / "mlp.wse"
    exe.save(path)
    again = Executable.load(path)
    assert again.phases == exe.phases and list(again.phases) == list(exe.phases)   # streams, math, cycles
    assert again.layout == exe.layout and isinstance(again.layout, WeightStreamingLayout)
    assert again.sequences == exe.sequences and again.regions == exe.regions and again.routes == exe.routes
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(again.static, exe.static))
    assert all(np.array_equal(again.transfers[k][1], v[1]) for k, v in exe.transfers.items())
    kinds = {type(op) for phase in again.phases.values() for op in phase.math}
    assert kinds == {Sgemm, SgemmTransposed, Relu, ReluMask, SoftmaxDelta, WeightGradient}
    again.save(tmp_path / "again.wse")                                  # the same manifest, written again
    manifests = [np.load(p)["manifest"].tobytes() for p in (path, tmp_path / "again.wse")]
    assert manifests[0] == manifests[1]


def _load_main(argv: list) -> int:
    """A ``wse`` subcommand body that loads the executable named by its argument."""
    Executable.load(argv[0])
    return 0


def _rewrite_manifest(src, dst, **changes):
    with np.load(src) as data:
        arrays = {key: data[key] for key in data.files}
    manifest = json.loads(arrays["manifest"].tobytes().decode("utf-8"))
    manifest.update(changes)
    arrays["manifest"] = np.frombuffer(json.dumps(manifest).encode("utf-8"), dtype=np.uint8)
    with open(dst, "wb") as out:
        np.savez(out, **arrays)


def test_executable_of_another_version_is_a_usage_error_naming_both_versions(tmp_path, monkeypatch, capsys):
    from wse import cli
    exe = compile_for(mlp(4, 3), 2, (2, 2))
    exe.save(tmp_path / "current.wse")
    for version in (0, VERSION + 1, None):
        _rewrite_manifest(tmp_path / "current.wse", tmp_path / "other.wse", version=version)
        with pytest.raises(UsageError, match=f"format version {version!r}, but this version of wse reads "
                                             f"format version {VERSION}"):
            Executable.load(tmp_path / "other.wse")
    _rewrite_manifest(tmp_path / "current.wse", tmp_path / "mode.wse", mode="teleport")
    with pytest.raises(UsageError, match="execution mode must be one of pipelined, weight_streaming, not 'teleport'"):
        Executable.load(tmp_path / "mode.wse")
    # Through the command line (a subcommand that loads an executable): one line on stderr, exit code 2.
    monkeypatch.setitem(cli.COMMANDS, "load", (__name__, "_load_main", "load an executable"))
    assert cli.main(["load", str(tmp_path / "other.wse")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"this version of wse reads format version {VERSION}" in err[0]


def test_damaged_executable_files_are_usage_errors(tmp_path):
    bad = tmp_path / "bad.wse"
    bad.write_bytes(b"not an executable")
    with pytest.raises(UsageError, match="is not a waferscale executable"):
        Executable.load(bad)
    with pytest.raises(UsageError, match="no such file"):
        Executable.load(tmp_path / "missing.wse")


# FC-MNIST ----------------------------------------------------------------------------------------

def test_fc_mnist_streamed_gemm_utilization():
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    exe = compile_model(model, torch.randn(64, 1, 28, 28), config=FabricConfig(width=16, height=16), batch=64)
    print(exe.summary())
    streamed = [n for n in exe.sequences["train"] if exe.phases[n].group in ("forward", "backward-data")]
    cycles = sum(exe.phases[n].cycles for n in streamed)
    fmacs = sum(exe.phases[n].fmacs for n in streamed)
    util = fmacs / (256 * cycles)
    total = sum(exe.phases[n].fmacs for n in exe.sequences["train"]) / (256 * exe.cycles("train"))
    print(f"FC-MNIST 16x16 batch 64: streamed-GEMM FMAC utilization {util:.4f}, whole step {total:.4f}, "
          f"{exe.cycles('train')} cycles per step")
    assert util >= 0.85
    assert fmacs == 64 * (784 * 256 + 256 * 256 + 256 * 10 + 10 * 256 + 256 * 256)
