"""Whole weight-streaming training phases on the vectorized model equal the golden model:
the same cycles, counters, hops and every word of every PE's memory after each phase."""

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig
from wse.host.compiler import compile_model
from wse.host.runtime import BACKENDS, Runtime
from wse.host.runtime.golden import GoldenBackend
from wse.host.runtime.rtl import device_backend


def _mlp(*sizes):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


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
