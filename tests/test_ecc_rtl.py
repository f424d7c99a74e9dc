"""Memory ECC and fault injection in the RTL (``hdl/pe_ecc.py``) against the
golden model: the same injected flips give the same bits, cycles and ECC
counters on the golden model and the Verilator-compiled mesh, in lockstep,
over library kernels and weight-streaming training phases; an uncorrectable
word stops both runs with the same report."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from wse.config import FabricConfig, UsageError
from wse.host.compiler import compile_model
from wse.host.runtime import Runtime
from wse.host.runtime.device import DeviceBackend
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.golden import Fabric, ecc
from wse.sim.runner import run_kernel

MESH = FabricConfig(width=2, height=2)


@pytest.fixture(scope="module")
def verilator_fabric():
    from wse.sim.cosim.verilator import VerilatorFabric
    return VerilatorFabric


def _faulty_lockstep(factory, record: dict, per_pe: int, flips: int = 1, seed: int = 5):
    """A device maker: golden and RTL in lockstep, with random flips injected
    before the first run."""

    class Faulty(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                record["words"] = self.inject_random(np.random.default_rng(seed), per_pe, flips)
            return super().run(max_cycles)

    return lambda cfg: Faulty(Fabric(cfg, trace=True), factory(cfg), check_emits=True)


@pytest.mark.parametrize("kernel,sizes", [("gemv", dict(rows=12, cols=10)), ("axpy", dict(n=24))])
def test_random_single_flips_in_a_kernel_match_golden(verilator_fabric, kernel, sizes):
    clean = run_kernel(kernel, MESH, 3, **sizes)
    record: dict = {}
    report = run_kernel(kernel, MESH, 3, device=_faulty_lockstep(verilator_fabric, record, per_pe=6), **sizes)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    pair = record["pair"]
    counts = pair.ecc_counters()        # compared: golden and RTL count the same, PE by PE
    # Every flipped word was read once (by the kernel or by the lockstep's memory check) and scrubbed.
    assert int(counts["corrected"].sum()) == record["words"] and not counts["detected"].any()
    assert pair.compared["counters"] > 0


def test_a_double_flip_stops_both_runs_with_the_same_report(verilator_fabric):
    record: dict = {}

    class Faulty(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                pe = self.reference.pe(1, 1)
                record["addr"] = int(np.flatnonzero(pe.mem.view(np.ndarray))[-1])   # a weight gemv reads
                self.inject(1, 1, record["addr"], [4, 20])
            return super().run(max_cycles)

    with pytest.raises(ecc.EccError) as err:       # raised only when both runs stop with the same report
        run_kernel("gemv", MESH, 3, device=lambda cfg: Faulty(Fabric(cfg), verilator_fabric(cfg)), rows=8, cols=8)
    message = str(err.value)
    assert message.startswith("PE (1, 1) task ") and f"address {record['addr']}:" in message and "\n" not in message
    assert record["pair"].ecc_counters()["detected"].tolist() == [[0, 0], [0, 1]]


def test_host_reads_correct_scrub_and_report_like_golden(verilator_fabric):
    pair = Lockstep(Fabric(MESH), verilator_fabric(MESH))
    pair.memcpy_h2d(0, np.arange(1, 17, dtype=np.uint32) * 0x01010101)
    pair.inject(1, 0, 3, [5])            # a data bit
    pair.inject(1, 0, 4, [36])           # a check bit
    pair.inject(0, 1, 5, [38])           # the overall parity bit
    pair.inject(1, 1, 6, [0, 1])         # two flips, overwritten before any read: never seen
    pair.memcpy_h2d(6, np.full((2, 2, 1), 7, dtype=np.uint32))
    pair.memcpy_d2h(0, 16)
    pair.memcpy_d2h(0, 16)               # scrubbed: nothing counts twice
    assert pair.ecc_counters()["corrected"].tolist() == [[0, 2], [1, 0]]
    pair.inject(0, 1, 9, [3, 33])
    with pytest.raises(ecc.EccError) as golden:
        pair.reference.memcpy_d2h(0, 16)
    with pytest.raises(ecc.EccError) as rtl:
        pair.device.memcpy_d2h(0, 16)
    assert str(rtl.value) == str(golden.value) and "PE (0, 1): " in str(rtl.value) and "address 9:" in str(rtl.value)
    assert pair.ecc_counters()["detected"].tolist() == [[0, 0], [1, 0]]
    pair.reset_counters()
    assert not pair.ecc_counters()["corrected"].any()


def test_inject_rejects_bad_input_like_golden(verilator_fabric):
    rtl, golden = verilator_fabric(MESH), Fabric(MESH)
    for args in [(2, 0, 0, [1]), (0, 0, -1, [1]), (0, 0, 0, [39]), (0, 0, 0, [1, 1]), (0, 0, 0, [])]:
        messages = []
        for device in (golden, rtl):
            with pytest.raises(UsageError) as err:
                device.inject(*args)
            messages.append(str(err.value))
        assert messages[0] == messages[1]


class _FaultyTraining(DeviceBackend):
    """Every phase on golden and Verilator in lockstep, with random single
    flips injected into both before each phase."""

    factory = None
    rng = None
    words = 0

    def make_device(self, config):
        return Lockstep(Fabric(config), self.factory(config))

    def run_phase(self, name, weights, grads):
        _FaultyTraining.words += self.device.inject_random(self.rng, 8)
        return super().run_phase(name, weights, grads)


def training_step_in_lockstep(backend_class) -> Lockstep:
    """Every phase of a weight-streaming training step of a 10-6-3 MLP on the
    2x2 mesh through ``backend_class`` (a :class:`DeviceBackend` whose device
    is a :class:`Lockstep`), each phase's cycles equal to the compiler's
    static model; returns the lockstep pair."""
    torch.manual_seed(0)
    batch = 4
    model = nn.Sequential(nn.Linear(10, 6), nn.ReLU(), nn.Linear(6, 3))
    exe = compile_model(model, torch.randn(batch, 10), batch=batch, config=MESH)
    backend = backend_class(exe)
    backend.load()
    runtime = Runtime(exe, "functional")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, runtime._features)).astype(np.float32)
    backend._copy_in(runtime._host(x, rng.integers(0, runtime._classes, batch)))
    weights = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in exe.parameters().items()}
    for name in exe.sequences["train"]:
        cycles = backend.run_phase(name, weights, {})   # lockstep: bits, cycles, counters, ECC counts compared
        assert cycles == exe.phases[name].cycles, name
    return backend.device


def test_random_single_flips_over_training_phases_match_golden(verilator_fabric):
    _FaultyTraining.factory, _FaultyTraining.rng = verilator_fabric, np.random.default_rng(11)
    pair = training_step_in_lockstep(_FaultyTraining)
    counts = pair.ecc_counters()
    # Flips in words a phase rewrote before reading (streamed weights) are never seen, as in hardware.
    assert 0 < int(counts["corrected"].sum()) <= _FaultyTraining.words and not counts["detected"].any()


@pytest.mark.parametrize("kernel,sizes,seed", [("gemv", dict(rows=12, cols=10), 4), ("axpy", dict(n=24), 5)])
def test_memory_flips_armed_at_cycles_match_golden(verilator_fabric, kernel, sizes, seed):
    clean = run_kernel(kernel, MESH, 3, **sizes)
    record: dict = {}

    class Armed(Lockstep):
        def run(self, max_cycles=None):
            if "pair" not in record:
                record["pair"] = self
                record["armed"] = self.inject_random_timed(np.random.default_rng(seed), clean["cycles"] + 8)
            return super().run(max_cycles)

    report = run_kernel(kernel, MESH, 3, device=lambda cfg: Armed(Fabric(cfg, trace=True), verilator_fabric(cfg),
                                                                    check_emits=True), **sizes)
    assert report["bit_exact"] and report["cycles"] == clean["cycles"]
    pair = record["pair"]
    # A flip armed past the run's last cycle is still armed on both (memory and counters were compared).
    landed = record["armed"] - sum(pe.timed_flip is not None for pe in pair.reference.pes)
    assert landed > 0 and int(pair.ecc_counters()["corrected"].sum()) == landed


class _TimedTraining(DeviceBackend):
    """Every phase on golden and Verilator in lockstep, one memory flip per
    PE armed on both before each phase at a random cycle of the phase."""

    factory = None
    rng = None

    def make_device(self, config):
        return Lockstep(Fabric(config), self.factory(config))

    def run_phase(self, name, weights, grads):
        self.device.inject_random_timed(self.rng, max(self.executable.phases[name].cycles, 1))
        return super().run_phase(name, weights, grads)


def test_memory_flips_armed_at_cycles_over_training_phases_match_golden(verilator_fabric):
    _TimedTraining.factory, _TimedTraining.rng = verilator_fabric, np.random.default_rng(13)
    pair = training_step_in_lockstep(_TimedTraining)
    counts = pair.ecc_counters()
    assert int(counts["corrected"].sum()) > 0 and not counts["detected"].any()
