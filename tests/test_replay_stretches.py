"""``bench/replay_stretches.py``: its ranges' stretches add up to no more than the phase's cycles,
which are the cycle model's count; a mesh big enough for region tries reports their runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))

import replay_stretches  # noqa: E402
from compile_speed import phase_arguments, planned_phase  # noqa: E402


def _lines(capsys, argv):
    assert replay_stretches.main(argv) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("phase", ["fwd 0", "bwd-data 4"])
def test_the_ranges_add_up_to_the_phase_and_the_count_is_the_cycle_models(capsys, phase):
    """An 8x8 mesh, the 128-wide MLP: four ranges and a total; the stretches' cycles are at most the
    phase's (the period search skips the rest), some replayed in full in the first range, and the
    phase's cycles are the cycle model's count of that phase."""
    argv = ["--mesh", "8", "8", "--sizes", "100", "128", "128", "10", "--batch", "32", "--phase", phase,
            "--bins", "500", "2000", "4000"]
    *ranges, total = _lines(capsys, argv)
    assert [r["from"] for r in ranges] == [0, 500, 2000, 4000] and ranges[-1]["to"] is None
    assert 0 < sum(r["cycles_replayed_in_full"] for r in ranges) <= total["cycles"]
    assert ranges[0]["cycles_replayed_in_full"] > 0
    for r in ranges:        # the engine's cost a PE and cycle (64 PEs), where the range replayed any cycle in full
        assert (r["ns_per_pe_cycle"] is None) == (r["cycles_replayed_in_full"] == 0)
        if r["ns_per_pe_cycle"] is not None:
            assert r["ns_per_pe_cycle"] > 0
            assert abs(r["ns_per_pe_cycle"] * r["cycles_replayed_in_full"] * 64e-9 - r["stretch_cpu_s"]) <= 0.051
    import argparse

    from wse.host.compiler import cycles
    parser = argparse.ArgumentParser()
    phase_arguments(parser, (8, 8), 32, None)
    _, plan, _ = planned_phase(parser.parse_args(argv[:-4]))
    assert total["cycles"] == cycles.phase_cycles(plan, progress=False)[phase]
