"""`wse generate RUN --prompt ...`: text from a GPT run's checkpoint, and one clear line for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from wse.cli import main as wse_main
from wse.host.appliance import TrainConfig, train
from wse.host.appliance.gpt_generate import Generator, generate

from test_gpt_appliance import JOB


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("gpt_generate")
    job = folder / "tiny_gpt.py"
    job.write_text(JOB)
    train(TrainConfig(str(job), out=str(folder / "run"), mesh="4x4", max_steps=2, progress="none",
                      tensorboard=False))
    return folder / "run"


def test_generate_is_reproducible_and_in_the_vocabulary(run: Path, capsys):
    text = generate(run, "The return statement", tokens=20, seed=3)
    assert len(text) == 20 and text == generate(run, "The return statement", tokens=20, seed=3)
    generator = Generator(run)
    assert set(text) <= set(generator.corpus.vocab) and generator.step == 2
    long_prompt = "x" * 50                       # longer than the context (8): its last 8 characters count
    assert generate(run, long_prompt, tokens=5, seed=1) == generate(run, "x" * 8, tokens=5, seed=1)
    assert wse_main(["generate", str(run), "--prompt", "def f", "--tokens", "7", "--seed", "3"]) == 0
    assert capsys.readouterr().out.startswith("def f")


@pytest.mark.parametrize("args, expected", [
    (["generate", "{tmp}/missing", "--prompt", "a"], "does not exist"),
    (["generate", "{tmp}", "--prompt", "a"], "has no checkpoint"),
    (["generate", "{run}", "--prompt", "caf\u00e9"], "not in the pydoc corpus"),
    (["generate", "{run}", "--prompt", ""], "at least one character"),
    (["generate", "{run}", "--prompt", "a", "--tokens", "0"], "--tokens must be a positive integer"),
    (["generate", "{run}"], "--prompt"),
    (["generate", "{run}", "--prompt", "a", "--seed", "-1"], "--seed must be a non-negative integer"),
])
def test_generate_bad_input_is_one_line(run: Path, tmp_path: Path, capsys, args, expected):
    argv = [a.format(tmp=tmp_path, run=run) for a in args]
    assert wse_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_checkpoint_by_name_inside_the_run(run: Path):
    """``--checkpoint NAME`` finds ``RUN/checkpoints/NAME`` as the help says."""
    name = Generator(run).checkpoint.name
    assert Generator(run, checkpoint=name).checkpoint == run / "checkpoints" / name
