"""Long work is never silent: golden-model runs, evaluations and co-simulation calls print
progress; `wse trace` records one phase of a step; `wse train --trace` writes the first step's timeline."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import numpy as np
import pytest

from wse.config import FabricConfig
from wse.sim.golden import Fabric
from wse.sim.golden.progress import CycleProgress, reporting
from wse.sim.runner import run_kernel


def test_fabric_progress_is_called_every_n_cycles_and_changes_nothing():
    config = FabricConfig(width=4, height=3)
    plain = run_kernel("gemv", config, seed=1, rows=45, cols=30)
    seen: list[int] = []
    fabric = Fabric(config)
    fabric.progress, fabric.progress_every = seen.append, 64
    timed = run_kernel("gemv", config, seed=1, device=lambda c: fabric, rows=45, cols=30)
    assert timed["cycles"] == plain["cycles"] and timed["mismatches"] == plain["mismatches"]
    assert seen and seen == sorted(seen) and all(t >= 64 and t < timed["cycles"] for t in seen)
    assert len(seen) >= timed["cycles"] // 64 - 2       # the clock may jump past a multiple of 64
    assert len({t // 64 for t in seen}) == len(seen)       # at most one call per 64 cycles


def test_cycle_progress_lines_say_where_the_run_is_and_what_is_left():
    config = FabricConfig(width=4, height=3)
    fabric = Fabric(config)
    out = io.StringIO()
    with reporting(fabric, "gemv", expected=1000, every=0.0, stream=out) as progress:
        fabric.progress_every = 128
        cycles = run_kernel("gemv", config, seed=1, device=lambda c: fabric, rows=45, cols=30)["cycles"]
    assert fabric.progress is None and progress.lines == len(out.getvalue().splitlines()) > 0
    first = out.getvalue().splitlines()[0]
    assert first.startswith("gemv: cycle 128 of about 1,000 (12 %),") and "s left" in first
    assert cycles > 128
    line = CycleProgress(fabric, "x", expected=None).line(5000, 12.4)
    assert line == "x: cycle 5,000, 12 s"
    with reporting(SimpleNamespace(), "rtl") as nothing:     # a device without the hook
        assert nothing is None


def test_evaluation_prints_progress_and_the_same_results():
    from wse.host.appliance.evaluation import evaluate

    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 6)).astype(np.float32)
    y = rng.integers(0, 3, 50)
    w = rng.standard_normal((6, 3)).astype(np.float32)
    runtime = SimpleNamespace(forward=lambda xb, weights: xb @ weights)
    quiet = io.StringIO()
    assert evaluate(runtime, w, x, y, 16, stream=quiet) == evaluate(runtime, w, x, y, 16, every=0.0,
                                                                    stream=(out := io.StringIO()))
    assert quiet.getvalue() == ""
    lines = out.getvalue().splitlines()
    assert lines == [f"evaluation: {n}/50 samples, 0 s, about 0 s left" for n in (16, 32, 48)]


def test_a_long_cosimulation_call_says_it_is_running(monkeypatch, capsys):
    from wse.sim.cosim import icarus

    class Connection:
        polls = 0

        def send(self, message):
            self.sent = message

        def poll(self, timeout):
            Connection.polls += 1
            return Connection.polls > 2

        def recv(self):
            return ("ok", 321)

    proxy = object.__new__(icarus.CocotbProxyFabric)
    proxy.backend, proxy.width, proxy.height, proxy._connection = "icarus", 2, 2, Connection()
    assert proxy._call("run") == 321
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and all(line.startswith("  ... icarus simulation (2x2 mesh): run: ") for line in err)
    proxy._connection = None


@pytest.mark.parametrize("argv,words", [
    (["--trace", "t.json"], "--trace needs --backend golden: the functional backend"),
    (["--trace", "t.json", "--backend", "verilator"], "the verilator backend records no per-PE events"),
    (["--trace", "no/such/t.json", "--backend", "golden"], "must be a file name in an existing folder"),
    (["--trace", "t.json", "--backend", "golden", "--resume"], "a resumed run has taken it already"),
])
def test_train_trace_on_a_backend_that_cannot_trace_is_one_line(argv, words, tmp_path, monkeypatch, capsys):
    from wse.cli import main

    monkeypatch.chdir(tmp_path)
    job = str(__import__("pathlib").Path(__file__).parents[1] / "examples" / "fc_mnist.py")
    assert main(["train", job, "--max-steps", "1", "--out", "run"] + argv) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_wse_trace_records_one_phase_of_a_step(tmp_path, capsys):
    from pathlib import Path

    from wse.cli import main
    from wse.host.runtime import Runtime

    job = str(Path(__file__).parents[1] / "examples" / "fc_mnist.py")
    common = [job, "--mode", "weight-streaming", "--mesh", "2x2", "--batch", "4", "--dataset", "digits"]
    assert main(["trace", *common, "--phase", "fwd fc9", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'fwd fc1', 'fwd fc2'" in err and not list(tmp_path.iterdir())
    trace = tmp_path / "t.json"
    assert main(["trace", *common, "--phase", "fwd fc1", "--out", str(tmp_path / "p"), "--prefix", "m_",
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["m_fwd_fc1_fmac.png", "m_fwd_fc1_links.png",
                                                                   "m_fwd_fc1_stalls.png"]
    data = json.loads(trace.read_text())
    cycles = data["otherData"]["cycles"]
    slices = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert slices and all(0 <= e["ts"] and e["ts"] + e["dur"] <= cycles for e in slices)
    assert [e["name"] for e in slices if e["cat"] == "phase"] == ["fwd fc1"]
    assert f"phase fwd fc1: {cycles:,} cycles" in out
    from wse.host.appliance.options import TrainConfig
    from wse.host.appliance.preparation import prepare

    prepared = prepare(TrainConfig(example=job, backend="functional", mode="weight-streaming", mesh="2x2",
                                   batch=4, dataset="digits"))
    assert isinstance(prepared.runtime, Runtime)
    assert prepared.executable.phases["fwd fc1"].cycles == cycles      # the static model's count


@pytest.mark.slow
def test_train_trace_writes_the_first_steps_timeline_where_asked(tmp_path, capsys):
    from pathlib import Path

    from wse.cli import main

    job = str(Path(__file__).parents[1] / "examples" / "fc_mnist.py")
    trace = tmp_path / "step1.json"
    assert main(["train", job, "--backend", "golden", "--mode", "weight-streaming", "--mesh", "2x2", "--batch", "4",
                 "--dataset", "digits", "--max-steps", "1", "--out", str(tmp_path / "run"), "--no-tensorboard",
                 "--progress", "lines", "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "evaluation: on the functional backend" in out and f"timeline {trace}" in out
    data = json.loads(trace.read_text())
    phases = [e for e in data["traceEvents"] if e.get("cat") == "phase"]
    assert phases[0]["name"] == "fwd fc1" and len(phases) == 9
    assert sum(e["dur"] for e in phases) == data["otherData"]["cycles"]
    assert not (tmp_path / "run" / "pictures" / "step1_trace.json").exists()
    assert (tmp_path / "run" / "pictures" / "fwd_fc1_fmac.png").is_file()


def test_train_trace_records_a_pipelined_step_on_the_golden_model(tmp_path, capsys):
    """A layer-pipelined run on the golden backend draws its first step too: the trace's phases are the
    executable's and add up to the step's cycles."""
    from wse.cli import main

    job = tmp_path / "digits_job.py"
    job.write_text("from torch import nn\nDATASET = 'digits'\n\n"
                   "def model(in_features, classes):\n"
                   "    return nn.Sequential(nn.Linear(in_features, 16), nn.ReLU(), nn.Linear(16, classes))\n")
    trace = tmp_path / "step1.json"
    assert main(["train", str(job), "--backend", "golden", "--mode", "pipelined", "--mesh", "4x4", "--batch", "4",
                 "--max-steps", "1", "--out", str(tmp_path / "run"), "--no-tensorboard", "--progress", "lines",
                 "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert f"timeline {trace}" in out and "none for the golden backend" not in out
    data = json.loads(trace.read_text())
    phases = [e for e in data["traceEvents"] if e.get("cat") == "phase"]
    assert phases and sum(e["dur"] for e in phases) == data["otherData"]["cycles"] > 0
    assert any(p.name.endswith("_fmac.png") for p in (tmp_path / "run" / "pictures").iterdir())
