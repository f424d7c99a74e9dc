"""``wse train --systems N``: SwarmX data-parallel training through the appliance, on both transports.

A tiny job (digits, 64 -> 24 -> 10, Adam) on a 4x4 mesh with a batch of 16: four token columns of four
tokens, so 1, 2 or 4 systems. Every variant must end with the checkpoint of the single-system run, byte
for byte: N in-process systems, N gloo processes under torchrun, a MemoryX over its RAM budget, a run
resumed on another number of systems, and a torchrun job whose worker was killed and restarted.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from wse.config import FabricConfig, UsageError
from wse.host.appliance import TrainConfig, train
from wse.host.appliance import checkpoint as ckpt
from wse.host.appliance import systems as launch_mod
from wse.host.appliance.cli import main
from wse.host.memoryx import read_checkpoint
from wse.host.swarmx import LinkModel, PhaseTraffic, phase_traffic

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
STEPS = 5

JOB = """
from torch import nn
DATASET = "digits"
OPTIMIZER = {"name": "adam", "lr": 0.01}
BATCH = 16
def model(in_features, classes):
    return nn.Sequential(nn.Linear(in_features, 24), nn.ReLU(), nn.Linear(24, classes))
"""


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("job") / "tiny.py"
    path.write_text(textwrap.dedent(JOB))
    return path


def config(job, out, **changes) -> TrainConfig:
    base = dict(example=job, out=out, mesh="4x4", max_steps=STEPS, progress="none", eval_train=False,
                tensorboard=False, checkpoint_every=2)
    base.update(changes)
    return TrainConfig(**base)


def args(job, out, *extra) -> list[str]:
    return [str(job), "--mesh", "4x4", "--max-steps", str(STEPS), "--out", str(out), "--progress", "lines",
            "--no-train-eval", "--no-tensorboard", "--checkpoint-every", "2", *extra]


def final_state(run_dir) -> tuple[dict, dict[str, bytes]]:
    """The latest checkpoint's MemoryX manifest and every tensor's bytes (weights and optimizer state)."""
    manifest, tensors = read_checkpoint(ckpt.latest_checkpoint(run_dir) / "memoryx")
    return manifest, {name: value.tobytes() for name, value in tensors.items()}


def assert_same_run(a, b) -> None:
    (ma, ta), (mb, tb) = final_state(a), final_state(b)
    assert ta.keys() == tb.keys() and all(ta[k] == tb[k] for k in ta), "final weights or optimizer state differ"
    assert ma["tensors"]["sha256"] == mb["tensors"]["sha256"] and ma["step_count"] == mb["step_count"]
    la = json.loads((Path(a) / "summary.json").read_text())["loss"]
    lb = json.loads((Path(b) / "summary.json").read_text())["loss"]
    assert la == lb


@pytest.fixture(scope="module")
def single(job, tmp_path_factory) -> Path:
    """The single-system run every variant must reproduce."""
    out = tmp_path_factory.mktemp("single") / "run"
    summary = train(config(job, out, systems=1))
    assert summary.steps == STEPS and summary.data["systems"]["count"] == 1
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------------------ in-process

@pytest.mark.parametrize("systems", [2, 4])
def test_in_process_systems_train_like_one_system_bit_for_bit(job, single, tmp_path, capsys, systems):
    out = tmp_path / "run"
    assert main(args(job, out, "--systems", str(systems))) == 0
    shown = capsys.readouterr().out
    assert_same_run(single, out)
    data = json.loads((out / "summary.json").read_text())
    assert data["settings"]["systems"] == systems
    report = data["systems"]
    assert report["count"] == systems and report["transport"] == "inprocess" and report["memoryx"] is None
    # The SwarmX figures are the link model's over the executable's phases; the fabric's are one system's.
    from wse.host.compiler.executable import Executable
    exe = Executable.load(out / "executable.npz")
    step = LinkModel.for_fabric(FabricConfig(width=4, height=4)).streamed_step(phase_traffic(exe), systems)
    assert report["swarmx"]["broadcast"] == step.broadcast and report["swarmx"]["reduce"] == step.reduce
    assert report["swarmx"]["overlapped"] == step.overlapped and report["swarmx"]["link"]["wavelets_per_cycle"] == 4
    assert data["fabric"]["cycles_per_step"] == exe.cycles("train") == step.compute
    one = json.loads((single / "summary.json").read_text())["systems"]["swarmx"]
    assert one["systems"] == 1 and step.overlapped > one["overlapped"] and step.reduce > one["reduce"]
    assert f"{systems} systems (in-process)" in shown and f"SwarmX broadcast {step.broadcast:,}" in shown
    assert f"systems     : {systems} (in-process), each {step.compute:,} fabric cycles/step" in shown


def test_a_run_resumes_on_another_number_of_systems(job, single, tmp_path):
    out = tmp_path / "run"
    first = train(config(job, out, systems=2, max_steps=3))
    assert first.steps == 3 and ckpt.latest_checkpoint(out).name == "step-00000003"
    resumed = train(config(job, out, systems=4, resume=True))
    assert resumed.steps == STEPS and resumed.data["resumed_from"] == 3
    assert resumed.data["settings"]["systems"] == 4
    again = train(config(job, out, resume=True, max_steps=STEPS + 1))      # keeps the recorded 4 systems
    assert again.data["settings"]["systems"] == 4 and again.steps == STEPS + 1
    straight = train(config(job, tmp_path / "straight", systems=1, max_steps=STEPS + 1))
    assert_same_run(tmp_path / "straight", out) and straight.steps == STEPS + 1


@pytest.mark.parametrize("systems", [1, 2])
def test_memoryx_over_its_budget_trains_like_the_in_memory_run(job, single, tmp_path, systems):
    """Weights plus Adam state are 3 x 1,810 floats (21,720 bytes): a 2K budget puts most of them on disk."""
    out = tmp_path / "run"
    summary = train(config(job, out, systems=systems, memoryx_budget="2K"))
    assert_same_run(single, out)
    tiers = summary.data["systems"]["memoryx"]
    assert tiers["budget_bytes"] == 2048 and 0 < tiers["resident_bytes"] <= 2048
    assert tiers["disk_bytes"] > 21720 // systems - 2048
    assert not (out / "memoryx-disk").exists()            # scratch space, removed at the end
    assert "budget 2,048 bytes per system" in summary.describe()


BAD = [
    (["--systems", "5"], "--systems 5 exceeds the 4 token columns of a batch of 16 on the 4x4 mesh"),
    (["--systems", "2", "--backend", "golden"], "--systems 2 needs a backend that runs part of a step"),
    (["--memoryx-budget", "12Q"], "--memoryx-budget must be a size in bytes with an optional unit such as 64K"),
    (["--memoryx-budget", "-1"], "--memoryx-budget must be a size"),
    (["--swarmx-timeout", "0"], "--swarmx-timeout must be a positive number of seconds, not 0.0"),
    (["--systems", "0"], "--systems must be a positive integer, not 0"),
]


@pytest.mark.parametrize("extra, expected", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_options_exit_2_with_one_line(job, tmp_path, capsys, extra, expected):
    out = tmp_path / "run"
    assert main(args(job, out, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("wse train: ") and expected in err and err.count("\n") == 1, err
    assert not out.exists()


def test_under_torchrun_systems_must_match_the_processes(job, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(args(job, tmp_path / "run", "--systems", "3")) == 2
    err = capsys.readouterr().err
    assert "--systems 3 differs from the 2 processes torchrun started (WORLD_SIZE)" in err and err.count("\n") == 1
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "1")
    assert main([str(job), "--mesh", "4x4"]) == 2
    assert "--out is needed under torchrun --max-restarts" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_launch_detection_and_restart_decisions(job, tmp_path):
    plain = launch_mod.detect_launch(TrainConfig(job), {})
    assert plain.transport == "inprocess" and plain.identity is None
    env = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_MAX_RESTARTS": "3",
           "TORCHELASTIC_RUN_ID": "job-a"}
    launch = launch_mod.detect_launch(TrainConfig(job), env)
    assert (launch.transport, launch.rank, launch.world, launch.restart, launch.max_restarts) == ("gloo", 1, 2, 1, 3)
    assert launch.identity["run_id"] == "job-a"
    with pytest.raises(UsageError, match="environment variable WORLD_SIZE must be an integer"):
        launch_mod.detect_launch(TrainConfig(job), {"RANK": "0", "WORLD_SIZE": "two"})
    # A restarted worker group resumes only the run folder its own job started.
    out = tmp_path / "run"
    train(config(job, out, max_steps=2))
    mine = {"run_id": "job-a", "agent": "host:1"}
    decide = launch_mod._restart_mode
    assert decide(config(job, out), mine) == "as-given"                  # no record: another job's folder
    (out / "elastic.json").write_text(json.dumps({"run_id": "job-b", "agent": "host:1"}))
    assert decide(config(job, out), mine) == "as-given"
    (out / "elastic.json").write_text(json.dumps(mine))
    assert decide(config(job, out), mine) == "resume"
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / "elastic.json").write_text(json.dumps(mine))
    assert decide(config(job, tmp_path / "fresh"), mine) == "overwrite"  # died before its first checkpoint


def test_streamed_step_cycles():
    links = LinkModel(wavelets_per_cycle=2.0, hop_latency=10)
    phases = [PhaseTraffic("fwd a", 100, broadcast_bytes=800), PhaseTraffic("loss", 7),
              PhaseTraffic("bwd-weight a", 30, reduce_bytes=800), PhaseTraffic("tail", 15)]
    one, four = links.streamed_step(phases, 1), links.streamed_step(phases, 4)
    # 800 bytes = 200 wavelets = 100 cycles at 2 per cycle. Broadcasts: 1 link (one system), 3 links (4 systems).
    assert (one.compute, one.broadcast, one.reduce) == (152, 10 + 100, 10 + 100)
    assert one.serial == 152 + 220 and one.overlapped == (100 + 10) + 7 + 100 + 15
    assert (four.broadcast, four.reduce) == (30 + 100, 40 + 100)       # chain reduction: 4 links
    assert four.overlapped == (100 + 30) + 7 + 100 + 15 + (40 - 15)    # the last reduction's latency shows
    assert four.exposed == four.overlapped - 152 and four.to_dict()["exposed"] == four.exposed


def test_the_compiled_fold_is_the_fabric_add():
    """fold_partials (a compiled loop) against wse.numerics.vadd, one partial sum after another."""
    import numpy as np

    from wse.host.swarmx import fold_partials
    from wse import numerics

    specials = np.array([0x0, 0x80000000, 0x1, 0x80000001, 0x007FFFFF, 0x00800000, 0x80800000, 0x7F800000,
                         0xFF800000, 0x7FC00000, 0x7F800001, 0xFFC12345, 0x7F7FFFFF, 0xFF7FFFFF, 0x3F800000,
                         0x00400000, 0x00800001, 0x80FFFFFF], np.uint32)
    rng = np.random.default_rng(7)
    for trial in range(200):
        k, shape = int(rng.integers(0, 6)), (int(rng.integers(1, 30)), int(rng.integers(1, 3)))
        parts = rng.integers(0, 2 ** 32, (k, *shape), dtype=np.uint64).astype(np.uint32)
        pick = rng.random(parts.shape) < 0.3
        parts[pick] = rng.choice(specials, int(pick.sum()))
        tiny = rng.random(parts.shape) < 0.3                  # near the normal range: subnormal sums arise
        parts[tiny] = (rng.standard_normal(int(tiny.sum())) * 2.0 ** -125).astype(np.float32).view(np.uint32)
        acc = None if trial % 3 == 0 else rng.choice(specials, shape)
        expected = np.zeros(shape, np.uint32) if acc is None else acc.copy()
        for part in parts:
            expected = numerics.vadd(expected, part)
        got = fold_partials(parts.view(np.float32), None if acc is None else acc.view(np.float32))
        assert got.shape == shape and np.array_equal(got.view(np.uint32), expected), trial


# ------------------------------------------------------------------------------------ processes

def _torchrun(*extra) -> list[str]:
    return [PYTHON, "-m", "torch.distributed.run", "--standalone", *extra, "-m", "wse.cli", "train"]


@pytest.mark.parametrize("systems, budget", [(4, "1K"), pytest.param(2, None, marks=pytest.mark.slow)])
def test_gloo_processes_train_like_one_system_bit_for_bit(job, single, tmp_path, systems, budget):
    """torchrun, one process per system (the killed-system test below also checks two gloo systems' steps)."""
    out = tmp_path / "run"
    extra = ("--memoryx-budget", budget) if budget else ()
    proc = subprocess.run([*_torchrun("--nproc-per-node", str(systems)), *args(job, out, *extra)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_run(single, out)
    assert proc.stdout.count(f"{systems} systems (gloo)") == 1 and proc.stdout.count("trained Sequential") == 1
    data = json.loads((out / "summary.json").read_text())
    assert data["systems"]["count"] == systems and data["systems"]["transport"] == "gloo"
    assert json.loads((out / "elastic.json").read_text())["run_id"] and not (out / "memoryx-disk").exists()
    if budget:
        assert data["systems"]["memoryx"]["disk_bytes"] > 0


def _system(job, out, rank, port, *extra, world=2):
    env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return subprocess.Popen([PYTHON, "-m", "wse.cli", "train", *args(job, out, *extra)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_missing_system_is_named_within_the_timeout(job, tmp_path):
    start = time.monotonic()
    lonely = _system(job, tmp_path / "run", 0, _free_port(), "--swarmx-timeout", "1")
    stdout, stderr = lonely.communicate(timeout=120)
    assert lonely.returncode == 2, stdout + stderr
    assert stderr == "wse train: SwarmX system 1 of 2 did not join within 1 s (seen from system 0)\n"
    assert time.monotonic() - start < 30 and not (tmp_path / "run").exists()


def test_a_killed_system_stops_the_others_with_its_name(job, single, tmp_path):
    out = tmp_path / "run"
    port = _free_port()
    procs = [_system(job, out, rank, port, "--max-steps", "2000", "--checkpoint-every", "1") for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "latest").exists():
            assert time.monotonic() < deadline and procs[0].poll() is None, procs[0].communicate()
            time.sleep(0.01)
        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = procs[0].communicate(timeout=60)
    finally:
        for proc in procs:
            proc.kill()
            proc.communicate()
    assert procs[0].returncode == 2 and time.monotonic() - killed < 30, stdout + stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith(f"wse train: SwarmX system 1 ({socket.gethostname()}:{procs[1].pid}) is unreachable: "
                           "the connection failed during "), stderr
    # The run folder keeps its last complete checkpoint: one system continues the run.
    step = int(ckpt.latest_checkpoint(out).name.split("-")[1])
    assert 1 <= step < 2000
    resumed = train(config(job, out, resume=True, systems=1, max_steps=step + 2))
    straight = train(config(job, tmp_path / "straight", max_steps=step + 2))
    assert resumed.data["resumed_from"] == step and straight.steps == step + 2
    assert_same_run(tmp_path / "straight", out)


def _children(pid: int) -> list[int]:
    kids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                kids.append(int(entry.name))
    return kids


def _rank(pid: int) -> int | None:
    try:
        env = (Path("/proc") / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    return next((int(item[5:]) for item in env if item.startswith(b"RANK=")), None)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds torchrun's workers through /proc")
def test_a_killed_worker_restarts_from_the_last_checkpoint_under_torchrun(job, tmp_path):
    """torchrun --max-restarts 1: SIGKILL system 1 once a checkpoint exists; the restarted workers resume it
    and end with the weights of an uninterrupted single-system run."""
    out, steps = tmp_path / "run", 40
    command = [*_torchrun("--nproc-per-node", "2", "--max-restarts", "1"),
               *args(job, out, "--max-steps", str(steps), "--checkpoint-every", "1", "--log-every", "10")]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed = None
    try:
        deadline = time.monotonic() + 300
        while killed is None and proc.poll() is None and time.monotonic() < deadline:
            latest = out / "checkpoints" / "latest"
            if latest.exists() and latest.read_text().strip() >= "step-00000003":
                for kid in _children(proc.pid):
                    if _rank(kid) == 1:
                        os.kill(kid, signal.SIGKILL)
                        killed = latest.read_text().strip()
            time.sleep(0.005)
        output = proc.communicate(timeout=300)[0]
    finally:
        proc.kill()
    assert killed is not None and proc.returncode == 0, output
    resumed = [line for line in output.splitlines() if "resumed at step" in line]
    assert len(resumed) == 1, output
    resumed_from = int(resumed[0].rsplit("resumed at step ", 1)[1])
    assert 3 <= resumed_from < steps
    data = json.loads((out / "summary.json").read_text())
    assert data["steps"] == steps and data["resumed_from"] == resumed_from
    train(config(job, tmp_path / "straight", systems=1, max_steps=steps))
    assert_same_run(tmp_path / "straight", out)
