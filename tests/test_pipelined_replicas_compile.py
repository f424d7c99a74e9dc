"""Data-parallel copies of the layer-pipelined pipeline in the compiler and ``wse train``:
the number of copies chosen for a training step (``choose_step_replicas``), carried in
the executable's layout (saved, loaded, old files as one copy), run by the runtime on
the functional and golden backends with the same bits, and ``--resume`` bit for bit
(``docs/layer_pipelined.md`` sections 6b and 7)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.appliance.cli import main
from wse.host.compiler import Executable, PipelinedLayout, compile_model, trace
from wse.host.compiler.mapper import MAPPERS
from wse.host.compiler.pipelined_codegen import choose_step_replicas, plan_of, samples_in_flight
from wse.host.memoryx import OptimizerConfig
from wse.host.runtime import Runtime

OPT = OptimizerConfig("sgd", lr=0.1, momentum=0.9)


def _mlp(dims, seed=0):
    torch.manual_seed(seed)
    mods = []
    for a, b in zip(dims, dims[1:]):
        mods += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*mods[:-1])


def test_the_compiler_picks_the_copies_that_train_most_samples_per_cycle():
    graph = trace(_mlp([64, 32, 10]), torch.zeros(1, 64))
    config = FabricConfig(width=16, height=16)
    k, cycles, why = choose_step_replicas(graph, config, 32, OPT)
    assert set(cycles) == {1, 2, 4, 8} and k == min(cycles, key=lambda n: (cycles[n], n)) == 4
    assert cycles[4] < cycles[1] and "16 copies do not fit" in why and f"4 copies {cycles[4]:,}" in why
    exe = MAPPERS["pipelined"].compile(graph, config, 32, OPT)
    assert exe.layout.replicas == 4 and exe.cycles("train") == cycles[4]
    assert "reduce" in exe.sequences["train"] and exe.layout.in_flight == 32
    text = exe.summary()
    assert "replicas: 4 copies of the pipeline" in text and "why 4 copies: the most samples per cycle" in text
    assert samples_in_flight(graph, config, 4, OPT, replicas=4) == 4        # one sample per copy
    with pytest.raises(UsageError, match="batch 2 is smaller than the 4 replicas"):
        samples_in_flight(graph, config, 2, OPT, replicas=4)


def test_fc_mnist_stays_at_one_copy_on_16x16():
    graph = trace(_mlp([784, 256, 256, 10]), torch.zeros(1, 784))
    k, cycles, why = choose_step_replicas(graph, FabricConfig(width=16, height=16), 64,
                                          OptimizerConfig("sgd", lr=0.05, momentum=0.9))
    assert k == 1 and list(cycles) == [1] and cycles[1] == 267_043
    assert "2, 4, 8, 16 copies do not fit (with 2: model" in why and "sram_words is 8192" in why


def test_replicas_are_saved_loaded_and_run_alike_on_functional_and_golden(tmp_path):
    model = _mlp([12, 9, 7, 5])
    exe = compile_model(model, torch.zeros(2, 12), config=FabricConfig(width=8, height=4), batch=7,
                        mode="pipelined", optimizer=OptimizerConfig("sgd", lr=0.1, momentum=0.9, nesterov=True))
    exe = MAPPERS["pipelined"].compile(exe.graph, exe.config, 7, OptimizerConfig("sgd", lr=0.1, momentum=0.9,
                                                                                  nesterov=True), replicas=2)
    assert exe.layout.replicas == 2 and plan_of(exe).replicas == 2 and "2 copies were asked for" in exe.summary()
    exe.save(tmp_path / "e.npz")
    loaded = Executable.load(tmp_path / "e.npz")
    assert loaded.layout == exe.layout and loaded.sequences == exe.sequences
    # a layout written before the field existed loads as one copy
    old = {key: value for key, value in exe.layout.to_dict().items() if not key.startswith("replicas")}
    assert PipelinedLayout.from_dict(old).replicas == 1
    weights = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((7, 12)).astype(np.float32), rng.integers(0, 5, 7)
    fun, gold = Runtime(loaded, "functional"), Runtime(exe, "golden")
    fun.write_state(weights)
    gold.write_state(weights)
    for n in (7, 5):
        a, b = fun.train_step(x[:n], y[:n]), gold.train_step(x[:n], y[:n])
        assert a.logits.tobytes() == b.logits.tobytes() and a.loss == b.loss and a.cycles == b.cycles
        assert "reduce" in a.phases
    (pf, mf), (pg, mg) = fun.read_state(), gold.read_state()
    assert all(pf[k].tobytes() == pg[k].tobytes() and mf[k].tobytes() == mg[k].tobytes() for k in pf)
    assert fun.forward(x).tobytes() == gold.forward(x).tobytes()


JOB = """
from torch import nn
DATASET = "digits"
OPTIMIZER = {"name": "sgd", "lr": 0.1, "momentum": 0.9}
BATCH = 32
EPOCHS = 1

def model(in_features, classes):
    return nn.Sequential(nn.Linear(in_features, 32), nn.ReLU(), nn.Linear(32, classes))
"""


def _tensors(out, step):
    from safetensors.numpy import load_file
    [path] = (out / "checkpoints" / f"step-{step:08d}" / "memoryx").glob("*.safetensors")
    return {k: v.tobytes() for k, v in load_file(path).items()}


def test_wse_train_digits_with_the_chosen_copies_resumes_bit_for_bit(tmp_path, capsys):
    job = tmp_path / "digits.py"
    job.write_text(textwrap.dedent(JOB))
    common = [str(job), "--mesh", "16x16", "--progress", "none", "--no-train-eval", "--no-tensorboard"]
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(common + ["--out", str(a), "--max-steps", "4"]) == 0
    printed = capsys.readouterr().out
    assert "mode: pipelined" in printed and "replicas: 4 copies of the pipeline" in printed
    assert "why 4 copies" in (a / "plan.txt").read_text()
    assert (a / "placement.png").read_bytes()[:4] == b"\x89PNG"
    assert Executable.load(a / "executable.npz").layout.replicas == 4
    assert main(common + ["--out", str(b), "--max-steps", "2"]) == 0
    assert main(common + ["--out", str(b), "--resume", "--max-steps", "4"]) == 0
    tensors = _tensors(a, 4)
    assert any("momentum_buffer" in k for k in tensors) and tensors == _tensors(b, 4)
