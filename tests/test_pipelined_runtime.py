"""The layer-pipelined mode through the compiler, the runtime and ``wse train``:
a saved and loaded executable, the runtime on the functional and golden
backends (the same bits, PyTorch's losses), ``--mode`` and its errors,
checkpoints and ``--resume`` bit for bit, the plan and the placement picture."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.appliance.cli import main
from wse.host.compiler import Executable, PipelinedLayout, compile_model, trace
from wse.host.compiler.mapper import choose_mode
from wse.host.memoryx import OptimizerConfig
from wse.host.runtime import Runtime

OPT = OptimizerConfig("sgd", lr=0.1, momentum=0.9, nesterov=True)


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 9), nn.ReLU(), nn.Linear(9, 7), nn.ReLU(), nn.Linear(7, 5))


def _data(n=10, seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 5, n).astype(np.int64)


def test_executable_saves_loads_and_runs_bit_exact_on_functional_and_golden(tmp_path):
    model = _model()
    exe = compile_model(model, torch.zeros(2, 12), config=FabricConfig(width=5, height=5), batch=10,
                        mode="pipelined", optimizer=OPT)
    assert isinstance(exe.layout, PipelinedLayout) and exe.layout.resident
    exe.save(tmp_path / "e.npz")
    loaded = Executable.load(tmp_path / "e.npz")
    assert loaded.layout == exe.layout and loaded.sequences == exe.sequences
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    x, y = _data()
    fun, gold = Runtime(loaded, "functional"), Runtime(exe, "golden")
    fun.write_state(weights)
    gold.write_state(weights)
    reference = _model()
    sgd = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    for step in range(3):
        a, b = fun.train_step(x[:8 + step], y[:8 + step]), gold.train_step(x[:8 + step], y[:8 + step])
        assert a.logits.tobytes() == b.logits.tobytes() and a.loss == b.loss and a.grads == {} == b.grads
        assert a.phases == b.phases and a.cycles == b.cycles          # static cycle model = golden
        sgd.zero_grad()
        loss = nn.functional.cross_entropy(reference(torch.from_numpy(x[:8 + step])), torch.from_numpy(y[:8 + step]))
        loss.backward()
        sgd.step()
        assert abs(a.loss - loss.item()) <= 1e-6 * abs(loss.item())
    (pf, mf), (pg, mg) = fun.read_state(), gold.read_state()
    assert set(pf) == set(weights) and set(mf) == set(weights)
    assert all(pf[k].tobytes() == pg[k].tobytes() and mf[k].tobytes() == mg[k].tobytes() for k in pf)
    assert fun.forward(x).tobytes() == gold.forward(x).tobytes()
    # a runtime written the read-back state continues bit for bit
    again = Runtime(loaded, "functional")
    again.write_state(pf, mf, steps=3)
    assert again.train_step(x, y).loss == fun.train_step(x, y).loss
    with pytest.raises(UsageError, match="train_shard splits a weight-streaming step"):
        fun.train_shard(x, y, weights, n=10, columns=range(1))
    assert not fun.supports_shards


def test_auto_mode_picks_pipelined_when_it_fits_and_says_why():
    fc = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                       nn.Linear(256, 10))
    graph = trace(fc, torch.zeros(2, 784))
    opt = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    mode, why = choose_mode(graph, FabricConfig(width=16, height=16), 64, opt)
    assert mode == "pipelined" and "fit PE memory" in why
    mode, why = choose_mode(graph, FabricConfig(width=8, height=8), 64, opt)
    assert mode == "weight_streaming" and "needs" in why and "sram_words is 8192" in why
    mode, why = choose_mode(graph, FabricConfig(width=16, height=16), 64, OptimizerConfig("adam"))
    assert mode == "weight_streaming" and "runs sgd" in why


def test_auto_mode_keeps_why_it_fell_back_to_weight_streaming(tmp_path):
    # the reason travels in the executable (and its file) into the plan a person reads
    fc = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                       nn.Linear(256, 10))
    opt = OptimizerConfig("sgd", lr=0.05, momentum=0.9)
    config = FabricConfig(width=8, height=8)
    _, why = choose_mode(trace(fc, torch.zeros(2, 784)), config, 64, opt)
    exe = compile_model(fc, torch.zeros(2, 784), config=config, batch=64, mode="auto", optimizer=opt, cycles=False)
    assert exe.mode == "weight_streaming" and exe.layout.reason == why
    assert f"  why: {why}" in exe.summary().splitlines()
    exe.save(tmp_path / "exe.npz")
    assert Executable.load(tmp_path / "exe.npz").layout.reason == why
    forced = compile_model(fc, torch.zeros(2, 784), config=config, batch=64, mode="weight_streaming",
                           cycles=False)
    assert forced.layout.reason == "weight_streaming was asked for"


def test_runtime_errors_for_resident_layouts():
    exe = compile_model(_model(), torch.zeros(2, 12), config=FabricConfig(width=5, height=5), batch=4,
                        mode="pipelined")          # no optimizer: evaluates only
    rt = Runtime(exe, "functional")
    x, y = _data(4)
    with pytest.raises(UsageError, match="holds no weights yet"):
        rt.forward(x)
    rt.write_state({k: v.detach().numpy() for k, v in _model().state_dict().items()})
    assert rt.forward(x).shape == (4, 5)
    with pytest.raises(UsageError, match="compiled without an optimizer"):
        rt.train_step(x, y)
    with pytest.raises(UsageError, match="runs sgd"):
        compile_model(_model(), torch.zeros(2, 12), config=FabricConfig(width=5, height=5), batch=4,
                      mode="pipelined", optimizer=OptimizerConfig("adam"))


JOB = """
from torch import nn
DATASET = "digits"
OPTIMIZER = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
BATCH = 32
EPOCHS = 1

def model(in_features, classes):
    return nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Linear(32, classes))
"""


@pytest.fixture
def job(tmp_path):
    path = tmp_path / "small.py"
    path.write_text(textwrap.dedent(JOB))
    return path


def _tensors(out, step):
    from safetensors.numpy import load_file
    [path] = (out / "checkpoints" / f"step-{step:08d}" / "memoryx").glob("*.safetensors")
    return {k: v.tobytes() for k, v in load_file(path).items()}


def test_wse_train_pipelined_resumes_bit_for_bit_and_writes_the_plan(job, tmp_path, capsys):
    common = [str(job), "--mesh", "8x8", "--progress", "none", "--no-train-eval", "--no-tensorboard"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(common + ["--out", str(a), "--max-steps", "6"]) == 0
    printed = capsys.readouterr().out
    assert "mode: pipelined" in printed and "why: the weights, the optimizer state" in printed
    assert (a / "placement.png").read_bytes()[:4] == b"\x89PNG" and "regions" not in (a / "plan.txt").read_text()[:0]
    assert json.loads((a / "checkpoints" / "step-00000006" / "trainer.json").read_text())["settings"]["mode"] \
        == "pipelined"
    assert main(common + ["--out", str(b), "--mode", "pipelined", "--max-steps", "3"]) == 0
    assert main(common + ["--out", str(b), "--resume", "--max-steps", "6"]) == 0
    tensors = _tensors(a, 6)
    assert any("momentum_buffer" in k for k in tensors) and tensors == _tensors(b, 6)
    capsys.readouterr()
    assert main(common + ["--out", str(b), "--resume", "--mode", "weight-streaming"]) == 2
    assert "--mode 'weight-streaming' differs from the run being resumed ('pipelined')" in capsys.readouterr().err


@pytest.mark.parametrize("args, expected", [
    (["--mode", "bogus"], "--mode must be one of auto, pipelined, weight-streaming, not 'bogus'"),
    (["--mode", "pipelined", "--mesh", "2x2", "--dataset", "mnist"],
     "needs .* words per PE in the layer-pipelined mode on a 2x2 mesh"),
    (["--mode", "pipelined", "--systems", "2"], "--systems 2 with --mode pipelined"),
    (["--mode", "pipelined", "--optimizer", "adam"], "runs sgd .* not adam"),
    (["--mode", "pipelined", "--mesh", "1x1"], "2 Linear layers but a 1x1 mesh has 1 PEs"),
])
def test_bad_mode_input_exits_2_with_one_line_and_writes_nothing(job, tmp_path, capsys, args, expected):
    import re
    out = tmp_path / "run"
    assert main([str(job), "--out", str(out), "--progress", "none"] + args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(expected, err), err
    assert not out.exists()


def test_step_utilization_counts_every_run_of_a_phase():
    from wse.host.appliance.loop import step_utilization
    torch.manual_seed(0)
    fc = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    exe = compile_model(fc, torch.zeros(1, 784), config=FabricConfig(width=16, height=16), batch=64,
                        mode="pipelined", optimizer=OptimizerConfig("sgd", lr=0.05, momentum=0.9))
    seq = exe.sequences["train"]
    assert seq.count("forward") == 3           # passes of 22, 22 and 20 samples
    rt = Runtime(exe, "functional")
    rt.write_state({k: v.detach().numpy() for k, v in fc.state_dict().items()})
    rng = np.random.default_rng(0)
    x, y = rng.random((64, 784)).astype(np.float32), rng.integers(0, 10, 64)
    for step, update in enumerate(("update_first", "update")):
        result = rt.train_step(x, y)
        names = [update if name == "update" else name for name in seq]
        fmacs = sum(exe.phases[name].fmacs for name in names)
        cycles = sum(exe.phases[name].cycles for name in names)
        assert result.cycles == cycles
        util = step_utilization(exe, result.phases, result.cycles)
        assert util == fmacs / (exe.config.num_pes * cycles) and 0.55 < util < 0.65, step
