"""Whole weight-streaming training phases on the vectorized model equal the golden model:
the same cycles, counters, hops and every word of every PE's memory after each phase."""

from pathlib import Path

import numpy as np
import pytest
import torch

from wse.config import FabricConfig
from wse.host.compiler import compile_model
from wse.host.runtime import BACKENDS, Runtime
from wse.host.runtime.golden import GoldenBackend
from wse.host.runtime.rtl import device_backend
from mlps import mlp as _mlp


def _phases(backend_class, exe, batch):
    backend = backend_class(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, runtime._classes, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    out = []
    for name in exe.sequences["train"]:
        backend.device.reset_counters()
        cycles = backend.run_phase(name, weights, {})
        counters = backend.device.counters()
        out.append((name, cycles, counters, backend.device.memcpy_d2h(0, exe.config.sram_words)))
    return out


@pytest.mark.parametrize("mesh,extra", [((4, 4), {}), ((5, 1), {}), ((2, 3), dict(router_depth=1, tx_depth=2))],
                         ids=["4x4", "5x1", "2x3-shallow"])
def test_training_phases_equal_golden(mesh, extra):
    torch.manual_seed(0)
    batch = 8
    exe = compile_model(_mlp(22, 13, 7), torch.randn(batch, 22), batch=batch,
                        config=FabricConfig(width=mesh[0], height=mesh[1], **extra))
    assert "vector" in BACKENDS
    want = _phases(GoldenBackend, exe, batch)
    got = _phases(device_backend("vector"), exe, batch)
    assert [w[0] for w in want] == [g[0] for g in got]
    for (name, cycles, counters, mem), (_, vcycles, vcounters, vmem) in zip(want, got):
        assert vcycles == cycles == exe.phases[name].cycles, name
        assert vcounters["wavelet_hops"] == counters["wavelet_hops"], name
        for key in counters["pe"]:
            np.testing.assert_array_equal(vcounters["pe"][key], counters["pe"][key], err_msg=f"{name} {key}")
        np.testing.assert_array_equal(vmem, mem, err_msg=name)


FC_MNIST = Path(__file__).resolve().parent.parent / "examples" / "fc_mnist.py"


@pytest.mark.slow
def test_fc_mnist_training_on_the_vector_backend_equals_functional(tmp_path):
    """A few FC-MNIST steps (784-256-256-10, batch 64, 16x16) on the cycle-level vectorized model and on the
    functional backend: the same losses, cycles and final weights, bit for bit (``bench/fabric_speed.py
    --whole-run`` times the whole 310-step run)."""
    from wse.host.appliance import TrainConfig, train
    from wse.host.appliance import checkpoint as ckpt

    base = dict(example=FC_MNIST, mesh="16x16", batch=64, max_steps=3, progress="none", tensorboard=False,
                eval_train=False)
    vector = train(TrainConfig(out=tmp_path / "vector", backend="vector", **base))
    functional = train(TrainConfig(out=tmp_path / "functional", backend="functional", **base))
    assert vector.steps == functional.steps == 3
    assert vector.cycles_per_step == functional.cycles_per_step > 0
    runs = [ckpt.load_checkpoint(ckpt.latest_checkpoint(tmp_path / name)) for name in ("vector", "functional")]
    assert runs[0][0]["history"]["loss"] == runs[1][0]["history"]["loss"]
    a, b = runs[0][1], runs[1][1]
    assert a.names() == b.names()
    for name in a.names():
        np.testing.assert_array_equal(a.weight(name).view(np.uint32), b.weight(name).view(np.uint32), err_msg=name)
