"""`wse train` of a GPT job: the run folder, --resume and --systems N bit for bit, refused options."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from wse.host.appliance import TrainConfig, train
from wse.host.appliance.checkpoint import latest_checkpoint, load_checkpoint
from wse.host.appliance.cli import main as train_main

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "char_gpt.py"

JOB = f'''
import importlib.util
_spec = importlib.util.spec_from_file_location("_char_gpt", {str(EXAMPLE)!r})
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
DATASET = "pydoc"
CONTEXT = 8
BATCH = 6
OPTIMIZER = {{"name": "adam", "lr": 3e-3}}


def model(vocab, context):
    return _example.CharGPT(vocab, layers=1, d_model=16, heads=2, context=context)
'''


@pytest.fixture()
def job(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_gpt.py"
    path.write_text(JOB)
    return path


def _run(job: Path, out: Path, **options):
    options.setdefault("mesh", "4x4")
    return train(TrainConfig(str(job), out=str(out), progress="none", tensorboard=False, **options))


def _weights(out: Path) -> dict[str, np.ndarray]:
    _, memoryx = load_checkpoint(latest_checkpoint(out))
    return {name: memoryx.weight(name).view(np.uint32).copy() for name in memoryx.names()}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_gpt_run_folder_and_summary(job: Path, tmp_path: Path):
    summary = _run(job, tmp_path / "run", max_steps=3, log_every=2)
    data = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert data["kind"] == "gpt" and data["steps"] == 3 and summary.steps == 3
    assert data["layout"] == {"rows": 4, "columns": [2, 2, 1, 1]}
    assert len(data["validation_probe"]) == 2            # steps 2 and 3
    assert abs(data["unigram_entropy"] - 3.2528) < 1e-3
    assert np.isfinite(summary.validation_loss) and summary.validation_loss < 5.0
    assert (tmp_path / "run" / "fabric.txt").read_text().startswith("mode: weight streaming")
    assert "validation loss" in (tmp_path / "run" / "train.log").read_text()


def test_gpt_resume_is_bit_for_bit(job: Path, tmp_path: Path):
    whole = _run(job, tmp_path / "whole", max_steps=4)
    _run(job, tmp_path / "parts", max_steps=2)
    resumed = _run(job, tmp_path / "parts", max_steps=4, resume=True)
    assert _same(_weights(tmp_path / "whole"), _weights(tmp_path / "parts"))
    assert resumed.data["loss"]["curve"] == whole.data["loss"]["curve"]
    assert resumed.data["resumed_from"] == 2


@pytest.mark.parametrize("systems", [2, 3])
def test_gpt_systems_equal_one_system(job: Path, tmp_path: Path, systems: int):
    one = _run(job, tmp_path / "one", max_steps=2)
    many = _run(job, tmp_path / "many", max_steps=2, systems=systems)
    assert _same(_weights(tmp_path / "one"), _weights(tmp_path / "many"))
    assert many.data["loss"]["curve"] == one.data["loss"]["curve"]


def test_text_dataset_for_a_job_that_is_not_text(tmp_path: Path, capsys):
    """``--dataset pydoc`` on the MLP job names the mismatch, not a model error."""
    argv = ["examples/fc_mnist.py", "--dataset", "pydoc", "--out", str(tmp_path / "r"), "--max-steps", "1"]
    assert train_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a language model" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, expected", [
    (["--backend", "golden"], "use a --batch that is a multiple of 4, or --backend functional"),
    (["--backend", "verilator"], "--backend functional"),
    (["--backend", "functional-torch"], "or on a device that runs its fabric phases"),
    (["--backend", "golden", "--batch", "4", "--systems", "2"], "fabric step runs on one system"),
    (["--systems", "5"], "exceeds the 4 columns"),
    (["--sparsity", "0.5"], "--sparsity does not apply"),
    (["--dataset", "mnist"], "is a language model on the text data set pydoc"),
])
def test_gpt_refused_options(job: Path, tmp_path: Path, capsys, args, expected):
    out = tmp_path / "refused"
    assert train_main([str(job), "--out", str(out), "--mesh", "4x4", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_gpt_whose_step_does_not_fit_pe_memory_is_refused(job: Path, tmp_path: Path, capsys):
    """On one PE every phase fits its 8,192 words, but not the values kept between phases (and the moves'
    tables) beside them: the step's memory plan refuses it at compile time, in one line, exit 2, nothing written."""
    out = tmp_path / "refused"
    assert train_main([str(job), "--out", str(out), "--mesh", "1x1", "--batch", "1", "--backend", "golden"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("the GPT CharGPT (1 attention layer(s), d_model 16, 2 heads, context 8, vocabulary 103) with 1 "
            "sequences does not fit a 1x1 mesh: at phase '") in err
    assert "the step needs 9988 words per PE, sram_words is 8192" in err
    assert not out.exists()


BAD_JOB = '''
import torch
from torch import nn
DATASET = "pydoc"
CONTEXT = 8


class Bad(nn.Module):
    def __init__(self, vocab, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, 16)
        self.drop = nn.Dropout({p})
        self.mha = nn.MultiheadAttention(16, 2, batch_first=True)
        self.head = nn.Linear(16, vocab)

    def forward(self, idx):
        x = self.drop(self.tok(idx))
        y, _ = self.mha(x, x, x, need_weights={weights})
        return self.head(y)


def model(vocab, context):
    return Bad(vocab, context)
'''


@pytest.mark.parametrize("p, weights, expected", [
    (0.1, False, "dropout p=0.1 while training"),
    (0.0, True, "need_weights=True"),
])
def test_gpt_unsupported_model_is_refused(tmp_path: Path, capsys, p, weights, expected):
    job = tmp_path / "bad_gpt.py"
    job.write_text(BAD_JOB.format(p=p, weights=weights))
    out = tmp_path / "run"
    assert train_main([str(job), "--out", str(out), "--mesh", "4x4", "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("wse train: model Bad has") and expected in err and "Traceback" not in err
    assert not out.exists()


def test_gpt_one_step_on_the_golden_fabric_equals_the_functional_run(job: Path, tmp_path: Path):
    """``--backend golden`` runs the step as fabric phases (docs/transformer.md section 11): one step
    leaves MemoryX's weights bit for bit where the functional backend leaves them."""
    _run(job, tmp_path / "functional", max_steps=1, batch=4)
    summary = _run(job, tmp_path / "golden", max_steps=1, batch=4, backend="golden")
    assert summary.steps == 1
    assert _same(_weights(tmp_path / "golden"), _weights(tmp_path / "functional"))
    plan = (tmp_path / "golden" / "fabric.txt").read_text()
    assert "fabric phases" in plan and "cycles per step by the static cycle model" in plan
