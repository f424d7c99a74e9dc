"""The attention products on the PEs (the ``attention`` library kernel): bit
exact against ``firmware/training/transformer.py``'s ``attention`` and
``attention_backward`` on the golden model (1x1 up to 4x4 and non-square
meshes, PEs with no queries or no keys), the static cycle mirror equal to
golden cycles, the softmax's layout (scores -> softmax -> values compose to
the reference attention), the other backends and the command line."""

from __future__ import annotations

import numpy as np
import pytest

from wse import numerics as fp
from wse.config import FabricConfig, UsageError
from wse.firmware import deadlock
from wse.firmware.kernels import KERNELS, attention_timing, get_kernel
from wse.firmware.kernels.attention import VARIANTS, attention_operands
from wse.firmware.training import transformer as tf
from wse.host.compiler.replay import Network, replay
from wse.sim.devices import make_device
from wse.sim.runner import main as kernel_main, run_kernel


def _mirror(cfg: FabricConfig, **sizes) -> int:
    kernel = get_kernel("attention")
    plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
    routes, ops, starts, ends, inject = attention_timing.timing_ops(plan)
    return replay(Network(cfg, routes), ops, starts, ends, inject, periods=False)


CASES = [
    # width, height, T, Dh: one PE, one row or column, square, non-square, empty key blocks, rows without queries
    (1, 1, 5, 3), (2, 1, 5, 4), (1, 2, 6, 4), (2, 2, 9, 5), (3, 2, 10, 4), (4, 4, 16, 16), (4, 3, 3, 2),
    (2, 4, 11, 3), (3, 5, 4, 2),
]


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("width,height,context,dh", CASES)
def test_attention_bit_exact_and_cycle_mirror_equals_golden(width, height, context, dh, variant):
    cfg = FabricConfig(width=width, height=height)
    sizes = dict(n=context, cols=dh, variant=variant)
    report = run_kernel("attention", cfg, seed=3, **sizes)
    assert report["bit_exact"], report["mismatches"]
    assert report["max_abs_err_vs_float64"] < 1e-5
    assert report["cycles"] == _mirror(cfg, **sizes)
    assert report["fmac_utilization"] > 0


def test_references_are_the_attentions():
    """Each variant's reference is the reference attention's own value: the scores'
    causal softmax is ``attention``'s ``p``, ``values`` its output, and the three
    backward products ``attention_backward``'s gradients; the scores above the
    diagonal are +0 (never computed)."""
    rng = np.random.default_rng(4)
    t, dh = 7, 4
    q, k, v, dout = (rng.standard_normal((t, dh), dtype=np.float32) for _ in range(4))
    kernel, cfg = get_kernel("attention"), FabricConfig(width=2, height=2)
    ops = attention_operands(q, k, v, dout, 0.5)
    inputs = {name: fp.as_float(bits).copy() for name, bits in ops.items()}
    ref = {}
    for variant in VARIANTS:
        plan = kernel.plan(cfg, kernel.resolve(cfg, dict(n=t, cols=dh, variant=variant)))
        ref[variant] = kernel.reference(plan, inputs)[0]
    out, saved = tf.attention(ops["q"][None], ops["k"][None], ops["v"][None], 0.5)
    assert np.array_equal(tf.causal_softmax(ref["scores"][None])[0], saved["p"][0])
    assert np.array_equal(ref["values"], out[0])
    assert np.all(ref["scores"][np.triu_indices(t, 1)] == 0)
    dq, dk, dv = tf.attention_backward(ops["dout"][None], ops["q"][None], ops["k"][None], ops["v"][None], saved, 0.5)
    for name, grad in (("backward-dq", dq), ("backward-dk", dk), ("backward-dv", dv)):
        assert np.array_equal(ref[name], grad[0]), name
    assert np.array_equal(tf.causal_softmax_backward(saved["p"], ref["backward-dp"][None], 0.5)[0], ops["ds"])


def test_scores_softmax_values_compose_to_the_reference_attention():
    """The three kernels share one block layout: the scores the PEs produce, put
    through the softmax kernel and then the values kernel, give the reference
    attention's output bit for bit (each kernel on its own golden device)."""
    cfg = FabricConfig(width=3, height=2)
    t, dh = 9, 4
    rng = np.random.default_rng(8)
    q, k, v = (rng.standard_normal((t, dh), dtype=np.float32) for _ in range(3))
    att, soft = get_kernel("attention"), get_kernel("softmax")

    def run(kernel, sizes, inputs):
        plan = kernel.plan(cfg, kernel.resolve(cfg, sizes))
        return kernel.execute(make_device("golden", cfg), plan, inputs)[0]

    inputs = {"q": q, "k": k, "v": v}
    scores = run(att, dict(n=t, cols=dh, variant="scores"), inputs)
    p = run(soft, dict(n=t, variant="forward"), {"scores": fp.as_float(scores).copy()})
    out = run(att, dict(n=t, cols=dh, variant="values"), {**inputs, "p": fp.as_float(p).copy()})
    expected, _ = tf.attention(tf.bits(q)[None], tf.bits(k)[None], tf.bits(v)[None], 0.5)
    assert np.array_equal(out, expected[0])


def test_routes_are_acyclic_multicasts_and_chains():
    """The multicasts and the one-way chains need no ring proof."""
    kernel = get_kernel("attention")
    cfg = FabricConfig(width=3, height=3)
    for variant in VARIANTS:
        plan = kernel.plan(cfg, kernel.resolve(cfg, dict(n=7, cols=2, variant=variant)))
        deadlock.check_routes(cfg, plan.routes(), what=variant)


@pytest.mark.parametrize("backend", ["vector", "verilator"])
def test_other_backends_give_the_same_bits_and_cycles(backend):
    cfg = FabricConfig(width=2, height=2)
    for variant in ("scores", "values", "backward-dv"):
        sizes = dict(n=5, cols=3, variant=variant)
        report = run_kernel("attention", cfg, seed=4, backend=backend, **sizes)
        golden = run_kernel("attention", cfg, seed=4, **sizes)
        assert report["bit_exact"] and report["cycles"] == golden["cycles"], (variant, sizes)


def test_listed_and_run_from_the_command_line(capsys):
    assert "attention" in KERNELS
    assert kernel_main(["attention", "--mesh", "2x3", "--n", "7", "--cols", "4", "--variant", "backward-dk"]) == 0
    out = capsys.readouterr().out
    assert "attention T=7, Dh=4, backward-dk on a 2x3 mesh" in out and "bit exact" in out


@pytest.mark.parametrize("argv,message", [
    (["attention", "--variant", "sideways"], "attention variant must be one of scores, values, backward-dp, "
     "backward-dv, backward-dq, backward-dk, not 'sideways'"),
    (["attention", "--rows", "3"], "attention takes --n, --cols, --variant, not --rows"),
    (["attention", "--n", "0"], "attention n must be a positive integer, not 0"),
    (["attention", "--n", "400", "--cols", "64", "--mesh", "1x1"], "attention of T=400, Dh=64 on a 1x1 mesh needs"),
])
def test_usage_errors(argv, message):
    with pytest.raises(UsageError, match=message):
        kernel_main(argv)


@pytest.mark.slow
def test_icarus_gives_the_same_bits_and_cycles():
    cfg = FabricConfig(width=2, height=2)
    for name, sizes in (("attention", dict(n=3, cols=2, variant="values")),
                        ("attention", dict(n=3, cols=2, variant="backward-dk")),
                        ("layernorm_bwd", dict(rows=2, cols=3))):
        report = run_kernel(name, cfg, seed=4, backend="icarus", **sizes)
        golden = run_kernel(name, cfg, seed=4, **sizes)
        assert report["bit_exact"] and report["cycles"] == golden["cycles"], (name, sizes)
