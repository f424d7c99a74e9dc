"""The appliance (`wse train`): run folder, checkpoints and bit-exact resume, errors, job files, progress.

These tests run the appliance against a small stand-in fabric defined here (PyTorch autograd behind the
runtime API), so they check the appliance's own logic quickly; tests/test_agreement.py runs the real
backends.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from wse.config import UsageError
from wse.host.appliance import TrainConfig, load_job, resolve_settings, run_reference, train
from wse.host.appliance import checkpoint as ckpt
from wse.host.appliance import loop, preparation
from wse.host.appliance.cli import main
from wse.host.compiler import trace
from wse.host.memoryx import MemoryX

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"


# ----------------------------------------------------------------------------- a stand-in fabric
@dataclasses.dataclass
class StandInResult:
    loss: float
    correct: int
    logits: np.ndarray
    grads: dict
    cycles: int
    fmac_utilization: float
    phases: dict


class StandInExecutable:
    """Compiles through the real front end (so unsupported models fail as they would), computes with torch."""

    def __init__(self, model, example_input, config, batch, mode="auto", optimizer=None):
        self.graph = trace(model, example_input)
        self.config, self.batch, self.mode = config, batch, "weight_streaming"
        self.model = copy.deepcopy(model)
        self._params = {name: tuple(shape) for layer in self.graph for name, shape in layer.parameters().items()}
        for layer in self.graph:
            words = math.ceil(batch * layer.output_size / config.num_pes)
            if words > config.sram_words:
                raise UsageError(f"layer {layer.name} needs {words} words per PE for its activations; "
                                 f"sram_words is {config.sram_words}")

    def parameters(self):
        return dict(self._params)

    def summary(self):
        return f"stand-in executable of {self.graph.name} on {self.config.mesh}"


class StandInRuntime:
    def __init__(self, executable, backend="functional"):
        if backend not in ("functional", "golden"):
            raise UsageError(f"backend must be functional or golden, not {backend!r}")
        self.executable = executable
        self.calls = 0

    def _load(self, weights):
        model = self.executable.model
        model.load_state_dict({name: torch.from_numpy(np.array(w)) for name, w in weights.items()}, strict=False)
        return model

    def train_step(self, x, y, weights):
        assert x.dtype == np.float32 and y.dtype == np.int64 and len(x) == self.executable.batch
        self.calls += 1
        model = self._load(weights)
        model.zero_grad(set_to_none=True)
        logits = model(torch.from_numpy(x))
        loss = F.cross_entropy(logits, torch.from_numpy(y))
        loss.backward()
        params = dict(model.named_parameters())
        grads = {name: params[name].grad.numpy().copy() for name in self.executable.parameters()}
        macs = sum(math.prod(s) for s in self.executable.parameters().values()) * len(x)
        cycles = 3 * macs // self.executable.config.num_pes + 100
        return StandInResult(float(loss.detach()), int((logits.argmax(1).numpy() == y).sum()), logits.detach().numpy(),
                             grads, cycles, 0.9, {"fwd": cycles // 3, "bwd": cycles - cycles // 3})

    def forward(self, x, weights):
        assert len(x) == self.executable.batch
        with torch.no_grad():
            return self._load(weights)(torch.from_numpy(x)).numpy()


@pytest.fixture
def fabric(monkeypatch):
    """Route the appliance's compile and runtime calls to the stand-in fabric; yields the runtimes opened."""
    runtimes = []

    def open_runtime(executable, backend):
        runtime = StandInRuntime(executable, backend)
        runtimes.append(runtime)
        return runtime

    monkeypatch.setattr(preparation, "_compile", StandInExecutable)
    monkeypatch.setattr(preparation, "_open_runtime", open_runtime)
    return runtimes


def digits(tmp_path, name="run", **changes):
    base = dict(example=EXAMPLE, out=tmp_path / name, dataset="digits", mesh="4x4", batch=128, epochs=1,
                progress="none")
    base.update(changes)
    return TrainConfig(**base)


def final_weights(run_dir):
    _, memoryx = ckpt.load_checkpoint(ckpt.latest_checkpoint(run_dir))
    return {name: memoryx.weight(name).copy() for name in memoryx.names()}, memoryx


# ----------------------------------------------------------------------------- a run and its folder
def test_run_folder_summary_tensorboard(fabric, tmp_path):
    summary = train(digits(tmp_path, epochs=2, tensorboard=True))
    out = tmp_path / "run"
    assert summary.out == out and summary.complete and summary.steps == summary.total_steps == 2 * (1438 // 128)
    data = json.loads((out / "summary.json").read_text())
    assert data == summary.data
    assert data["settings"]["mesh"] == "4x4" and data["backend"] == "functional" and data["mesh"] == "4x4"
    assert data["settings"]["optimizer"] == {"name": "sgd", "hyper": {"lr": 0.05, "momentum": 0.9, "dampening": 0.0,
                                                                     "nesterov": False, "weight_decay": 0.0}}
    assert [e["epoch"] for e in data["epochs"]] == [1, 2] and data["epochs"][1]["step"] == 22
    assert data["test_accuracy"] == data["epochs"][-1]["test_accuracy"] == summary.test_accuracy
    assert summary.test_accuracy > 0.5 and summary.train_accuracy > 0.5      # chance is 0.1
    assert data["loss"]["first"] > 2.0 > data["loss"]["last"] and len(data["loss"]["epoch_means"]) == 2
    assert data["fabric"]["cycles_per_step"] == summary.cycles_per_step > 0
    assert summary.fmac_utilization == pytest.approx(0.9)
    assert (out / "fabric.txt").read_text().startswith("stand-in executable of FCMNIST")
    assert "epoch 2: train loss" in (out / "train.log").read_text()
    assert ckpt.latest_checkpoint(out).name == "step-00000022"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["latest", "step-00000011", "step-00000022"]
    text = summary.describe()
    assert "22 steps" in text and "cycles/step" in text and str(out / "summary.json") in text

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    assert {"train/loss", "fabric/cycles_per_step", "fabric/fmac_utilization", "epoch/test_accuracy"} <= set(tags)
    assert [e.step for e in events.Scalars("train/loss")] == list(range(1, 23))
    assert [e.step for e in events.Scalars("epoch/test_accuracy")] == [11, 22]
    assert events.Scalars("epoch/test_accuracy")[-1].value == pytest.approx(summary.test_accuracy)


def test_stand_in_run_equals_the_pytorch_reference_bit_for_bit(fabric, tmp_path):
    """Same initial weights, data order and optimizer: with PyTorch arithmetic behind the runtime API the
    appliance must reproduce the reference trainer exactly (this checks the appliance's plumbing). The
    stand-in's autograd runs inside the appliance's one-thread block, and PyTorch's matrix products may split
    their sums differently with another thread count, so the reference runs with one thread too."""
    config = digits(tmp_path, optimizer="adam", lr=0.002, epochs=2, max_steps=15)
    summary = train(config)
    with loop.optimizer_threads(1):
        reference = run_reference(config)
    weights, _ = final_weights(tmp_path / "run")
    assert len(reference.losses) == summary.steps == 15
    assert summary.data["loss"]["first"] == reference.losses[0] and summary.data["loss"]["last"] == reference.losses[-1]
    for name, value in weights.items():
        assert np.array_equal(value, reference.weights[name]), name
    assert summary.test_accuracy == reference.test_accuracy


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resume_is_bit_exact(fabric, tmp_path, optimizer):
    """Stop at step 7 (mid-epoch), resume to 15 (across the epoch boundary at 11): equal to a straight run."""
    straight = train(digits(tmp_path, "straight", optimizer=optimizer, epochs=2, max_steps=15))
    first = train(digits(tmp_path, "split", optimizer=optimizer, epochs=2, max_steps=7))
    assert not first.complete and first.steps == 7
    assert ckpt.latest_checkpoint(tmp_path / "split").name == "step-00000007"
    resumed = train(digits(tmp_path, "split", resume=True, epochs=2, max_steps=15))
    assert resumed.steps == 15 and resumed.data["resumed_from"] == 7
    a, mx_a = final_weights(tmp_path / "straight")
    b, mx_b = final_weights(tmp_path / "split")
    for name in a:
        assert np.array_equal(a[name], b[name]), name
        for slot, value in mx_a.optimizer_state(name).items():
            assert np.array_equal(value, mx_b.optimizer_state(name)[slot])
    assert straight.data["loss"] == resumed.data["loss"]
    assert straight.test_accuracy == resumed.test_accuracy
    assert [e["test_accuracy"] for e in straight.data["epochs"]] == [e["test_accuracy"] for e in resumed.data["epochs"]]


def test_resume_extends_a_finished_run_and_purges_nothing_it_needs(fabric, tmp_path):
    train(digits(tmp_path, checkpoint_every=4))
    assert ckpt.latest_checkpoint(tmp_path / "run").name == "step-00000011"
    more = train(digits(tmp_path, resume=True, epochs=2))
    assert more.steps == 22 and [e["epoch"] for e in more.data["epochs"]] == [1, 2]
    again = train(digits(tmp_path, resume=True, epochs=2))       # nothing left to do
    assert again.steps == 22 and fabric[-1].calls == 0 and again.test_accuracy == more.test_accuracy


def test_an_interrupted_checkpoint_leaves_the_previous_one(fabric, tmp_path, monkeypatch):
    train(digits(tmp_path, max_steps=3))
    real_save = MemoryX.save

    def failing_save(self, folder):
        real_save(self, folder)
        raise OSError("disk full")

    monkeypatch.setattr(MemoryX, "save", failing_save)
    with pytest.raises(UsageError, match="disk full; the run stopped before step-00000005: checkpoint step-00000003"):
        train(digits(tmp_path, resume=True, max_steps=5))
    monkeypatch.setattr(MemoryX, "save", real_save)
    root = tmp_path / "run" / "checkpoints"
    assert ckpt.latest_checkpoint(tmp_path / "run").name == "step-00000003"
    trainer, _ = ckpt.load_checkpoint(root / "step-00000003")
    assert trainer["step"] == 3 and trainer["batches"]["position"] == 3
    resumed = train(digits(tmp_path, resume=True, max_steps=5))
    train(digits(tmp_path, "straight", max_steps=5))
    a, _ = final_weights(tmp_path / "run")
    b, _ = final_weights(tmp_path / "straight")
    assert resumed.steps == 5 and all(np.array_equal(a[n], b[n]) for n in a)
    # Steps 4 and 5 were logged twice; TensorBoard keeps the resumed run's.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5]


def test_resume_refuses_changed_settings(fabric, tmp_path):
    train(digits(tmp_path, max_steps=2))
    for change, option in ((dict(batch=64), "--batch 64"), (dict(seed=3), "--seed 3"), (dict(mesh="2x2"), "--mesh"),
                           (dict(lr=0.1), "--optimizer"), (dict(optimizer="adam"), "--optimizer")):
        with pytest.raises(UsageError, match=f"^{option}.* differs from the run being resumed"):
            train(digits(tmp_path, resume=True, **change))
    # What does not change the steps taken may change.
    assert train(digits(tmp_path, resume=True, max_steps=3, backend="golden")).steps == 3


def test_resume_from_a_damaged_checkpoint_is_a_usage_error(fabric, tmp_path, capsys):
    train(digits(tmp_path, max_steps=2))
    folder = ckpt.latest_checkpoint(tmp_path / "run")
    args = [str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--out", str(tmp_path / "run"), "--resume"]
    tensors = next((folder / "memoryx").glob("tensors-*.safetensors"))
    tensors.write_bytes(tensors.read_bytes()[:-8])
    assert main(args) == 2 and "is corrupt" in capsys.readouterr().err
    (folder / "trainer.json").write_text('{"format": "wse.appliance.checkpoint", "version": 1, "step": 2}')
    assert main(args) == 2 and "lacks the entries batches, epoch" in capsys.readouterr().err
    (folder / "trainer.json").write_text("{not json")
    assert main(args) == 2 and "has no readable trainer.json" in capsys.readouterr().err


def test_default_run_folder_and_overwrite(fabric, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = train(digits(tmp_path, out=None, max_steps=1))
    second = train(digits(tmp_path, out=None, max_steps=1))
    assert first.out == Path("runs/fc_mnist") and second.out == Path("runs/fc_mnist-2")
    stale = first.out / "checkpoints" / "step-00000001"
    replaced = train(digits(tmp_path, out="runs/fc_mnist", overwrite=True, max_steps=2))
    assert replaced.steps == 2 and not stale.exists()
    assert sorted(p.name for p in (first.out / "checkpoints").iterdir()) == ["latest", "step-00000002"]
    resumed = train(digits(tmp_path, out=None, resume=True, max_steps=3))
    assert resumed.out == Path("runs/fc_mnist") and resumed.steps == 3 and resumed.data["resumed_from"] == 2


def test_a_run_interrupted_before_its_first_checkpoint_can_be_started_again(fabric, tmp_path, capsys):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loop, "save_checkpoint", interrupt)
        with pytest.raises(KeyboardInterrupt):
            train(digits(tmp_path))
    out = tmp_path / "run"
    assert (out / "train.log").exists() and not (out / "summary.json").exists()
    args = [str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--batch", "128", "--out", str(out),
            "--progress", "none", "--max-steps", "2"]
    assert main([*args, "--resume"]) == 2
    assert "has no checkpoint to resume from; start the run again with --overwrite" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0 and json.loads((out / "summary.json").read_text())["steps"] == 2


def test_progress_lines_when_not_a_terminal(fabric, tmp_path):
    stream = io.StringIO()
    summary = train(digits(tmp_path, progress="auto", log_every=5, eval_train=False), stream=stream)
    assert summary.train_accuracy is None and summary.data["train_running_accuracy"] > 0.1
    assert "train (last epoch's batches)" in summary.describe()
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("training fc_mnist.py on digits: 4x4 mesh, functional backend")
    steps = [line for line in lines if line.startswith("step ")]
    assert [line.split()[1] for line in steps] == ["1/11", "5/11", "10/11", "11/11"]  # the first: warm-up
    assert "loss" in steps[0] and "cycles/step" in steps[0] and "FMAC util GEMMs 0.900" in steps[0]
    assert "with compile warm-up" in steps[0] and "steps/s" in steps[1]
    assert any(line.startswith("epoch 1: train loss") for line in lines)


def test_progress_bar_mode_and_loss_curve(tmp_path):
    from wse.host.appliance.report import Progress, loss_curve

    stream = io.StringIO()
    progress = Progress(4, 1, "bar", log_every=2, stream=stream, log_file=tmp_path / "log.txt")
    for step in (2, 3, 4):
        progress.step(step, step / 2, 1.0 / step, 0.5, 1000, 0.8)
    progress.message("epoch 2: done")
    progress.close()
    shown = stream.getvalue()
    assert "train:" in shown and "4/4" in shown and "epoch 2: done" in shown and "step 2/4" not in shown
    logged = (tmp_path / "log.txt").read_text().splitlines()
    assert [line.split()[1] for line in logged[:2]] == ["2/4", "4/4"] and logged[2] == "epoch 2: done"
    curve = loss_curve([4.0, 3.0, 2.0, 1.0, 2.0], steps_per_epoch=2, points=2)
    assert curve["first"] == 4.0 and curve["last"] == 2.0 and (curve["min"], curve["min_step"]) == (1.0, 4)
    assert curve["epoch_means"] == [3.5, 1.5, 2.0] and curve["curve"] == [[3, 3.0], [5, 1.5]]


def test_one_host_loss_for_steps_and_evaluation():
    """Evaluation and training steps share the runtime's cross-entropy, whose float64 rule is
    ``(log(sum(exp(z - top))) + top) - z[label]``: the histories and summaries hold that formula's bits."""
    from wse.host.appliance import evaluate
    from wse.host.runtime.loss import cross_entropy, mean_cross_entropy

    rng = np.random.default_rng(3)
    logits = (rng.standard_normal((37, 10)) * 4).astype(np.float32)
    labels = rng.integers(0, 10, 37)
    z = logits.astype(np.float64)
    top = z.max(axis=1)
    expected = (np.log(np.exp(z - top[:, None]).sum(axis=1)) + top) - z[np.arange(37), labels]
    assert np.array_equal(cross_entropy(logits, labels), expected)
    assert mean_cross_entropy(logits, labels) == float(np.mean(expected))

    class Fixed:                  # forward() hands out the rows of `logits` batch by batch (zero rows padded)
        def __init__(self):
            self.start = 0

        def forward(self, x, weights):
            rows = logits[self.start:self.start + len(x)]
            self.start += len(x)
            return np.concatenate([rows, np.zeros((len(x) - len(rows), 10), np.float32)])

    loss, accuracy = evaluate(Fixed(), {}, np.zeros((37, 3), np.float32), labels, 16)
    sums = [float(expected[i:i + 16].sum()) for i in range(0, 37, 16)]
    assert loss == (sums[0] + sums[1] + sums[2]) / 37
    assert accuracy == np.count_nonzero(logits.argmax(axis=1) == labels) / 37


# ----------------------------------------------------------------------------- job files and settings
def write(tmp_path, text, name="job.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_job_file_defaults_and_overrides(tmp_path):
    path = write(tmp_path, """
        from torch import nn
        DATASET = "digits"
        OPTIMIZER = {"name": "sgd", "lr": 0.2, "momentum": 0.5}
        BATCH = 16
        EPOCHS = 3
        def model(in_features, classes):
            return nn.Sequential(nn.Linear(in_features, classes))
    """)
    job = load_job(path)
    assert (job.dataset, job.batch, job.epochs) == ("digits", 16, 3)
    s = resolve_settings(TrainConfig(path), job)
    assert (s.dataset, s.batch, s.epochs, s.mesh, s.backend, s.seed) == ("digits", 16, 3, "16x16", "functional", 0)
    assert s.optimizer["hyper"]["lr"] == 0.2 and s.optimizer["hyper"]["momentum"] == 0.5
    s = resolve_settings(TrainConfig(path, lr=0.01, batch=8, mesh="2X3"), job)
    assert (s.optimizer["hyper"]["lr"], s.optimizer["hyper"]["momentum"], s.batch, s.mesh) == (0.01, 0.5, 8, "2x3")
    s = resolve_settings(TrainConfig(path, optimizer="adamw", weight_decay=0.1), job)
    assert s.optimizer["name"] == "adamw" and s.optimizer["hyper"]["lr"] == 0.001    # PyTorch's default
    with pytest.raises(UsageError, match="optimizer adam has no hyper-parameter momentum"):
        resolve_settings(TrainConfig(path, optimizer="adam", momentum=0.9), job)
    # The example file itself.
    example = load_job(EXAMPLE)
    assert (example.dataset, example.batch, example.optimizer["name"]) == ("mnist", 64, "sgd")
    torch_model = example.model(784, 10, seed=0)
    assert [tuple(p.shape) for p in torch_model.parameters()] == [(256, 784), (256,), (256, 256), (256,),
                                                                  (10, 256), (10,)]
    assert torch.equal(example.model(784, 10, seed=0).fc1.weight, torch_model.fc1.weight)
    assert not torch.equal(example.model(784, 10, seed=1).fc1.weight, torch_model.fc1.weight)


BAD_JOBS = {
    "syntax": ("def model(:\n", "has a syntax error at line 1"),
    "raises": ("import math\nx = 1 / 0\n", "failed to import: ZeroDivisionError: division by zero at line 2"),
    "no_model": ("DATASET = 'digits'\n", "must define a function model(in_features, classes)"),
    "bad_signature": ("def model():\n    pass\n", "model must take two arguments (in_features, classes)"),
    "bad_dataset": ("DATASET = 'cifar'\ndef model(a, b):\n    pass\n", "DATASET must be one of mnist, digits"),
    "bad_batch": ("BATCH = 0\ndef model(a, b):\n    pass\n", "BATCH must be a positive integer, not 0"),
    "bad_optimizer": ("OPTIMIZER = 'sgd'\ndef model(a, b):\n    pass\n", "OPTIMIZER must be a dict with a 'name'"),
    "returns_none": ("DATASET = 'digits'\ndef model(a, b):\n    return None\n",
                     "model() must return a torch.nn.Module, not NoneType"),
    "model_raises": ("DATASET = 'digits'\ndef model(a, b):\n    raise ValueError('no such width')\n",
                     "model(64, 10) raised ValueError: no such width at line 3"),
    "unsupported": ("""
        import torch
        from torch import nn
        DATASET = 'digits'
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(64, 10)
                self.norm = nn.LayerNorm(10)
            def forward(self, x):
                return torch.sigmoid(self.norm(self.fc(x)))
        def model(a, b):
            return Net()
    """, "model Net has 2 unsupported operations"),
    "too_big": ("from torch import nn\nDATASET = 'digits'\ndef model(a, b):\n"
                "    return nn.Sequential(nn.Linear(a, 100000))\n", "sram_words is"),
}


@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_bad_job_files_exit_2_with_one_message(fabric, tmp_path, capsys, case):
    text, expected = BAD_JOBS[case]
    path = write(tmp_path, text)
    out = tmp_path / "run"
    code = main([str(path), "--mesh", "1x1", "--out", str(out), "--progress", "none", "--batch", "64"])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.startswith("wse train: ") and expected in captured.err, captured.err
    assert "Traceback" not in captured.err and not out.exists()
    if case == "unsupported":
        assert "norm (torch.nn.LayerNorm)" in captured.err and "torch.sigmoid" in captured.err
    else:
        assert captured.err.count("\n") == 1


BAD_OPTIONS = [
    (["--systems", "0"], "--systems must be a positive integer, not 0"),
    (["--mesh", "0x3"], "mesh must have at least one column and one row, not '0x3'"),
    (["--mesh", "big"], "mesh must be WIDTHxHEIGHT such as 4x4, not 'big'"),
    (["--batch", "0"], "--batch must be a positive integer, not 0"),
    (["--batch", "ten"], "argument --batch: invalid int value: 'ten'"),
    (["--batch", "5000"], "--batch 5000 exceeds the 1438 training samples of digits"),
    (["--lr", "-1"], "--lr must be a finite non-negative number, not -1.0"),
    (["--dataset", "cifar"], "argument --dataset: invalid choice: 'cifar'"),
    (["--optimizer", "adam", "--momentum", "0.9"], "optimizer adam has no hyper-parameter momentum"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["--resume"], "--resume: run folder"),
    (["--resume", "--overwrite"], "--resume and --overwrite exclude each other"),
    (["--mnist-dir", "/nonexistent"], "--mnist-dir '/nonexistent' must be a folder of MNIST IDX files"),
    (["--dataset", "digits", "--mnist-dir", "."], "--mnist-dir applies to the mnist data set, not to digits"),
]


@pytest.mark.parametrize("args, expected", BAD_OPTIONS, ids=[" ".join(a) for a, _ in BAD_OPTIONS])
def test_bad_options_exit_2_with_one_message(fabric, tmp_path, capsys, args, expected):
    out = tmp_path / "run"
    code = main([str(EXAMPLE), "--dataset", "digits", "--out", str(out), "--progress", "none", *args])
    captured = capsys.readouterr()
    assert code == 2 and expected in captured.err, captured.err
    assert captured.err.startswith("wse train: ") and captured.err.count("\n") == 1 and not out.exists()


def test_missing_job_file_and_occupied_run_folder(fabric, tmp_path, capsys):
    assert main([str(tmp_path / "nope.py")]) == 2
    assert "job file" in capsys.readouterr().err
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert main([str(EXAMPLE), "--dataset", "digits", "--out", str(out)]) == 2
    assert "is not empty; pass --resume to continue its run, --overwrite" in capsys.readouterr().err
    assert main([str(EXAMPLE), "--dataset", "digits", "--out", str(out), "--overwrite"]) == 2
    assert "--overwrite refuses to clear" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


def test_cli_trains_and_prints_what_it_did(fabric, tmp_path, capsys):
    out = tmp_path / "run"
    code = main([str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--batch", "128", "--epochs", "1",
                 "--out", str(out), "--progress", "none", "--optimizer", "sgd", "--lr", "0.1", "--seed", "2"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads((out / "summary.json").read_text())
    assert data["settings"]["seed"] == 2 and data["settings"]["optimizer"]["hyper"]["lr"] == 0.1
    assert f"{100 * data['test_accuracy']:.2f}%" in captured.out and "11 steps" in captured.out
    assert main(["--help"]) == 0 and "model(in_features, classes)" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the real compiler and runtime
def test_real_fabric_errors_exit_2_before_writing(tmp_path, capsys):
    out = tmp_path / "run"
    base = [str(EXAMPLE), "--out", str(out), "--progress", "none"]
    assert main([*base, "--mesh", "1x1", "--batch", "64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wse train: ") and "use a smaller batch or a wider mesh" in err and err.count("\n") == 1
    assert main([*base, "--dataset", "digits", "--mesh", "4x4", "--batch", "32", "--backend", "fpga"]) == 2
    err = capsys.readouterr().err
    assert ("backend must be one of functional, functional-torch, functional-torch-cpu, functional-torch-cuda, "
            "golden, icarus, vector, vector-torch, vector-torch-cpu, vector-torch-cuda, verilator, not 'fpga'") in err and err.count("\n") == 1
    job = write(tmp_path, BAD_JOBS["unsupported"][0])
    assert main([str(job), "--out", str(out), "--mesh", "4x4", "--batch", "32"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wse train: model Net has 2 unsupported operations") and "Traceback" not in err
    assert "norm (torch.nn.LayerNorm)" in err and "sigmoid (torch.sigmoid)" in err and err.count("\n") == 3
    assert not out.exists()


def test_real_fabric_cli_run(tmp_path, capsys):
    from wse.host.compiler.executable import Executable

    out = tmp_path / "run"
    code = main([str(EXAMPLE), "--dataset", "digits", "--mesh", "4x4", "--batch", "32", "--max-steps", "5",
                 "--out", str(out), "--progress", "lines", "--log-every", "5", "--no-train-eval"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    data = json.loads((out / "summary.json").read_text())
    assert data["steps"] == 5 and not data["complete"] and data["backend"] == "functional"
    assert data["fabric"]["cycles_per_step"] == data["fabric"]["cycles_per_step_max"] > 0
    assert 0 < data["fabric"]["fmac_utilization"] <= 1 and sum(data["fabric"]["phases"].values()) == \
        data["fabric"]["cycles_per_step"]
    assert "step 5/5" in captured.out and "stopped at step 5 of 220 (--max-steps)" in captured.out
    assert "batch 32, sgd(lr=0.05, momentum=0.9))" in captured.out
    assert "schedule" in (out / "fabric.txt").read_text()
    executable = Executable.load(out / "executable.npz")
    assert executable.batch == 32 and list(executable.parameters()) == list(data["parameters"])
