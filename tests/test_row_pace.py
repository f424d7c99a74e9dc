"""``bench/row_pace.py``: run in strides, the phase ends at the cycle model's count, each row's
pace adds up to its op rows, rows with a feature more are the slow ones; bad input (a picture that
cannot be written too) is one line, exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from wse.config import FabricConfig
from wse.host.compiler import cycles, trace, weight_streaming
from wse.host.compiler.weight_streaming import plan

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

from compile_speed import _model  # noqa: E402
from row_pace import row_paces, summary  # noqa: E402


def test_strides_end_at_the_cycle_models_count_and_add_up_to_the_op_rows(monkeypatch):
    """A 2x12 mesh, 28 features on 12 rows, cyclic: rows 0 to 3 hold a third feature. Strides of 37
    cycles end the GEMM at the cycle model's count; every row's paces times the stride add up to its
    op list; over the middle stride the rows with three features are the slowest."""
    monkeypatch.setattr(weight_streaming, "SPREAD", False)
    torch.manual_seed(0)
    config = FabricConfig(width=2, height=12)
    the_plan = plan(trace(_model([28, 28, 28, 3]), torch.randn(2, 28)), config, 8)
    phase = the_plan.phases["fwd 0"]
    ops, starts, ends = cycles.phase_ops(the_plan, phase)
    network = cycles.Network(config, the_plan.routes)
    paces, count = row_paces(network, ops, starts, ends, cycles.phase_injections(phase), 37, None)
    assert count == cycles.phase_cycles(the_plan, progress=False, reuse=False)["fwd 0"]
    first = np.arange(12) * 2
    assert np.allclose(paces.sum(axis=0) * 37, (ends - starts)[first] - 1)       # all but END
    middle = paces[paces.shape[0] // 2]
    assert middle[:4].max() < middle[4:].max()
    record = summary(paces, 37)
    assert record["slow_pace"] > 0 and all(0 <= n <= 12 for _, n in record["rows_at_slow_pace"])


def test_a_stride_limit_stops_early():
    torch.manual_seed(0)
    config = FabricConfig(width=2, height=4)
    the_plan = plan(trace(_model([8, 36, 3]), torch.randn(2, 8)), config, 4)
    phase = the_plan.phases["fwd 0"]
    paces, count = row_paces(cycles.Network(config, the_plan.routes), *cycles.phase_ops(the_plan, phase),
                             cycles.phase_injections(phase), 10, 30)
    assert count is None and paces.shape == (3, 4)


def test_bad_arguments_are_one_line_exit_2(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    tiny = ["--mesh", "2", "4", "--sizes", "8", "36", "3", "--batch", "4", "--every", "50"]
    for args, shown in ((["--every", "0"], "--every 0"), (["--png", "x.jpg"], "--png"),
                        ([*tiny, "--png", str(blocked / "pace.png")], f"cannot write {str(blocked / 'pace.png')!r}")):
        run = subprocess.run([sys.executable, str(BENCH / "row_pace.py"), *args], capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 2 and run.stdout == "" and run.stderr.startswith(f"row_pace.py: {shown}")
        assert len(run.stderr.strip().splitlines()) == 1
