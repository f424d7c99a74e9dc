"""The sparse streamed GEMM kernel (``spgemm``/``spmv``): bit exact against its
reference on the golden model, static cycle model equal to golden cycles,
only non-zeros on the wire, load-balanced deal, clear errors."""

from __future__ import annotations

import numpy as np
import pytest

from wse.config import FabricConfig, UsageError
from wse.firmware import deadlock
from wse.firmware.kernels import get_kernel
from wse.firmware.kernels.spgemm import END, deal_features, plan_streams, row_imbalance, sparse_mask
from wse.firmware.kernels.spgemm_timing import BUSY, RECV, STOP, VEC, timing_ops
from wse.firmware.training import timing
from wse.host.compiler.replay import Network, replay
from wse.sim.golden import Fabric
from wse.sim.runner import main as kernel_main, run_kernel


def _model_cycles(cfg, sizes, seed):
    kernel = get_kernel("spgemm")
    plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
    mask = kernel.inputs(plan, np.random.default_rng(seed))["mask"]
    routes, ops, starts, ends, inject = timing_ops(plan, mask)
    return replay(Network(cfg, routes), ops, starts, ends, inject, periods=False)


CASES = [
    # width, height, rows, cols, tokens, sparsity, mask kind, extra config
    (1, 1, 5, 6, 1, 0.5, "random", {}),
    (2, 1, 8, 8, 4, 0.0, "random", {}),
    (1, 2, 8, 8, 2, 0.3, "random", {}),
    (3, 3, 10, 12, 7, 0.7, "random", {}),
    (4, 4, 33, 40, 32, 0.9, "power", {}),
    (2, 5, 20, 9, 3, 0.99, "random", {}),
    (3, 2, 12, 16, 6, 0.6, "random", {"router_depth": 3, "rx_depth": 3}),
]


@pytest.mark.parametrize("width,height,rows,cols,tokens,sparsity,kind,extra", CASES)
def test_bit_exact_and_cycle_model_equals_golden(width, height, rows, cols, tokens, sparsity, kind, extra):
    cfg = FabricConfig(width=width, height=height, **extra)
    sizes = dict(rows=rows, cols=cols, n=tokens, sparsity=sparsity, variant=kind)
    report = run_kernel("spgemm", cfg, seed=3, **sizes)
    assert report["bit_exact"], report["mismatches"]
    assert report["cycles"] == _model_cycles(cfg, sizes, 3)


def test_spmv_is_one_token():
    report = run_kernel("spmv", FabricConfig(width=3, height=4), seed=1, rows=16, cols=24, sparsity=0.8)
    assert report["bit_exact"] and report["sizes"]["n"] == 1


def test_only_nonzeros_stream_and_carriage_returns_end_features():
    cfg = FabricConfig(width=2, height=3)
    kernel = get_kernel("spgemm")
    plan = kernel.plan(cfg, kernel.resolve(cfg, dict(rows=9, cols=12, n=4, sparsity=0.75)))
    inputs = kernel.inputs(plan, np.random.default_rng(0))
    streams = plan_streams(plan, inputs["w"], inputs["mask"])
    words = sum(len(w) for w, _ in streams)
    nnz = int(inputs["mask"].sum())
    assert nnz == round(0.25 * 9 * 12)
    # two wavelets per non-zero, one carriage return per output and row, one END per row
    assert words == 2 * nnz + 9 * 3 + 3
    for words, flags in streams:
        assert flags.sum() == 9 + 1 and words[-1] == END
        assert np.all(words[flags].view(np.int32) < 0) and np.all(words[~flags].view(np.int32)[0::2] >= 0)


def test_reference_matches_float64_and_skips_zero_weights():
    cfg = FabricConfig(width=2, height=2)
    kernel = get_kernel("spgemm")
    plan = kernel.plan(cfg, kernel.resolve(cfg, dict(rows=6, cols=6, n=2, sparsity=0.5)))
    inputs = kernel.inputs(plan, np.random.default_rng(0))
    inputs["x"][0, 0] = np.inf          # a zero weight times inf would be NaN; skipped weights never meet it
    with np.errstate(invalid="ignore"):             # float64 0 * inf in the exact product
        bits, exact = kernel.reference(plan, inputs)
    y = bits.view(np.float32)
    hit = inputs["mask"][:, 0]
    assert np.all(np.isinf(y[hit, 0])) and np.all(np.isfinite(y[~hit, 0]))
    finite = np.isfinite(exact)
    assert np.allclose(y[finite], exact[finite], rtol=1e-5, atol=1e-5)


def test_deal_balances_a_power_law_mask():
    mask = sparse_mask(1024, 1024, 0.9, np.random.default_rng(0), "power")
    counts = mask.sum(axis=0)
    assert mask.sum() == round(0.1 * 1024 * 1024)
    assert counts.max() > 20 * np.median(counts)          # really skewed
    loads = row_imbalance(counts, 16)
    assert loads["max_over_mean"] <= 1.05 < loads["block_max_over_mean"]
    dealt = deal_features(counts, 16)
    assert sorted(np.concatenate(dealt).tolist()) == list(range(1024)) and max(map(len, dealt)) == 1024 // 16


def test_sparsity_cuts_cycles():
    cfg = FabricConfig(width=4, height=4)
    cycles = {s: _model_cycles(cfg, dict(rows=128, cols=128, n=32, sparsity=s, variant="random"), 0)
              for s in (0.0, 0.9)}
    assert cycles[0.9] < 0.25 * cycles[0.0]


def test_a_later_non_zero_costs_one_index_cycle_beyond_its_fmacs():
    """``fmacx`` takes a feature's later non-zeros: each adds ``T + 1`` stall-free cycles
    (the index, then ``T`` FMACs, the first popping the value), against ``T + 4`` with
    ``recv``, ``blt``, ``setb``, ``fmacw`` per non-zero."""
    from wse.firmware.kernels.spgemm_timing import row_ops

    cfg = FabricConfig(width=2, height=3)
    kernel = get_kernel("spgemm")
    plan = kernel.plan(cfg, kernel.resolve(cfg, dict(rows=6, cols=12, n=8, sparsity=0.5)))

    def free(counts, T):
        ops = row_ops(plan, np.ones(len(counts), dtype=np.int64), np.array(counts), T, 1, 2)
        return int(sum(a if op == BUSY else 1 if op == RECV else a + 1 for op, a, *_ in ops if op != STOP))
    for T in (1, 4, 8):
        assert [free([n + 1], T) - free([n], T) for n in range(1, 6)] == [T + 1] * 5
        # the first: setb, recv of the value, fmacs (T + 1), the fmacx's carriage return, one branch fewer
        assert free([1], T) - free([0], T) == T + 3


def test_timing_codes_are_the_training_models():
    assert (BUSY, RECV, VEC, STOP) == (timing.BUSY, timing.RECV, timing.VEC, timing.END)


def test_bad_sparsity_is_a_usage_error(capsys):
    cfg = FabricConfig(width=2, height=2)
    for bad in (1.0, -0.1, 1.5, "0.5", True):
        with pytest.raises(UsageError, match="sparsity must be a number in \\[0, 1\\)"):
            run_kernel("spgemm", cfg, sparsity=bad)
    with pytest.raises(UsageError, match="variant"):
        run_kernel("spgemm", cfg, variant="banded")
    with pytest.raises(UsageError, match="takes"):
        kernel_main(["gemv", "--sparsity", "0.5"])
    assert kernel_main(["spmv", "--mesh", "2x2", "--rows", "8", "--cols", "8", "--sparsity", "0.5"]) == 0
    assert "bit exact" in capsys.readouterr().out


def test_deadlock_check_proves_the_ring(monkeypatch):
    cfg = FabricConfig(width=2, height=3)
    kernel = get_kernel("spgemm")
    sizes = kernel.resolve(cfg, dict(rows=6, cols=6, n=4, sparsity=0.5))
    plan = kernel.plan(cfg, sizes)
    fabric = Fabric(cfg)
    proved = []
    real_check = deadlock.check_routes

    def spy(*args, **kwargs):
        report = real_check(*args, **kwargs)
        proved.append(report)
        return report
    monkeypatch.setattr(deadlock, "check_routes", spy)
    kernel.execute(fabric, plan, kernel.inputs(plan, np.random.default_rng(0)))   # routes loaded only when proved
    assert len(proved) == 1 and proved[0].what == "kernel spgemm"
    assert len(proved[0].rings) == cfg.width            # one partial-sum ring per column, each discharged
    too_many = FabricConfig(width=1, height=3, tx_depth=1, router_depth=1, rx_depth=1)
    with pytest.raises(UsageError, match="ring carries at most 3"):
        kernel.plan(too_many, kernel.resolve(too_many, dict(rows=6, cols=6, n=4, sparsity=0.5)))
