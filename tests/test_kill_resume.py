"""Kill and resume: ``wse train`` killed with SIGKILL at random points, restarted each time, ends bit for bit
where a run never killed ends.

Kills land in the three places a run can be: start-up (imports, compilation, the run folder's start),
training (between and within steps) and checkpointing (while a hidden ``.step-N.*.tmp`` folder exists).
After each kill the run continues with ``--resume`` from its latest checkpoint, or starts again
(``--overwrite``) when it wrote none. Every finished run's final weights, optimizer state and loss history
must equal an uninterrupted run's, and no temporary may be left. The default suite kills a few times; the
slow suite at least 100 times.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from wse.config import UsageError
from wse.host.appliance import checkpoint as ckpt
from wse.host.appliance.cli import main

JOB = textwrap.dedent("""\
    from torch import nn
    DATASET = "digits"
    OPTIMIZER = {"name": "adam", "lr": 0.01}
    BATCH = 32
    EPOCHS = 2
    def model(in_features, classes):
        return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, classes))
    """)
#: 88 steps (2 epochs of 44), a checkpoint every 3 steps, MemoryX partly on its disk tier.
OPTIONS = ["--mesh", "4x4", "--progress", "none", "--no-tensorboard", "--no-train-eval", "--checkpoint-every", "3",
           "--memoryx-budget", "2K"]
TOTAL = 88
PHASES = ("start-up", "training", "checkpointing")
ROOT = Path(__file__).resolve().parent.parent


def final_state(out: Path) -> dict:
    """Every tensor of the run's latest checkpoint (weights and optimizer state) as bits, and its history."""
    trainer, memoryx = ckpt.load_checkpoint(ckpt.latest_checkpoint(out))
    state = {"step": trainer["step"], "loss": trainer["history"]["loss"]}
    for name in memoryx.names():
        state[name] = memoryx.weight(name).view(np.uint32).tobytes()
        for slot, value in memoryx.optimizer_state(name).items():
            state[f"{name}::{slot}"] = np.ascontiguousarray(value).view(np.uint32).tobytes()
    return state


def leftovers(out: Path) -> list[str]:
    return [str(p.relative_to(out)) for p in out.rglob(".*") if p.name.endswith((".tmp", ".old"))] + \
        [p.name for p in out.glob("memoryx-disk*")]


def _mode(out: Path) -> str:
    try:
        return "--resume" if out.is_dir() and ckpt.latest_checkpoint(out) is not None else "--overwrite"
    except UsageError:
        return "--overwrite"


def _wait(process: subprocess.Popen, until, limit: float) -> bool:
    """Poll ``until()`` while the process lives; whether it came true within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while process.poll() is None and time.monotonic() < deadline:
        if until():
            return True
        time.sleep(0.0005)
    return False


def _in_checkpoint(out: Path) -> bool:
    try:
        return any(e.name.startswith(".step-") and e.name.endswith(".tmp") for e in os.scandir(out / "checkpoints"))
    except OSError:
        return False


def _log_size(out: Path) -> int:
    try:
        return (out / "train.log").stat().st_size
    except OSError:
        return 0


def launch_and_kill(job: Path, out: Path, phase: str, rng: random.Random) -> tuple[bool, str]:
    """Start the run (resume or start again) and SIGKILL it in ``phase``; (killed, what the process said)."""
    command = [sys.executable, "-m", "wse", "train", str(job), "--out", str(out), _mode(out), *OPTIONS]
    logged = _log_size(out)
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if phase == "start-up":
        _wait(process, lambda: False, rng.uniform(0.2, 3.0))
    elif phase == "training":
        if _wait(process, lambda: _log_size(out) > logged, 60):
            _wait(process, lambda: False, rng.uniform(0.0, 0.15))
    else:
        _wait(process, lambda: _in_checkpoint(out), 60)
    killed = process.poll() is None
    if killed:
        process.send_signal(signal.SIGKILL)
    _, err = process.communicate()
    if not killed:
        assert process.returncode == 0, err
    return killed, err


def kill_and_resume(tmp_path: Path, kills: int, seed: int) -> dict:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    assert main([str(job), "--out", str(tmp_path / "straight"), *OPTIONS]) == 0
    reference = final_state(tmp_path / "straight")
    assert reference["step"] == TOTAL
    rng, out = random.Random(seed), tmp_path / "killed"
    done, finished, runs = 0, 0, 0
    by_phase = dict.fromkeys(PHASES, 0)
    while done < kills:
        phase = PHASES[done % 3] if kills <= 3 else rng.choice(PHASES)
        killed, _ = launch_and_kill(job, out, phase, rng)
        runs += 1
        done += killed
        by_phase[phase] += killed
        if not killed:          # the run finished before its kill: check it, then start a new one
            assert final_state(out) == reference and leftovers(out) == []
            finished += 1
            out = tmp_path / f"killed-{finished}"
    if not (out / "summary.json").exists():
        assert main([str(job), "--out", str(out), _mode(out), *OPTIONS]) == 0
    assert final_state(out) == reference and leftovers(out) == []
    return {"kills": done, "runs": runs, "finished": finished + 1, "by_phase": by_phase}


def test_a_few_kills_resume_bit_for_bit(tmp_path):
    report = kill_and_resume(tmp_path, 3, seed=1)
    assert report["kills"] == 3 and all(report["by_phase"].values())


@pytest.mark.slow
def test_a_hundred_kills_resume_bit_for_bit(tmp_path):
    report = kill_and_resume(tmp_path, 100, seed=2024)
    print(report)
    assert report["kills"] >= 100 and min(report["by_phase"].values()) >= 20
