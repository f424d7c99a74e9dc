"""Mesh testbench: every library kernel on the full RTL mesh, in lockstep
with the golden model.

Each kernel runs (through the host API, :func:`wse.sim.runner.run_kernel`)
on a :class:`~wse.sim.cosim.lockstep.Lockstep` of the golden model and the
mesh under test, which compares the cycle count, every wavelet leaving the
mesh, every counter, every register, every emitted wavelet and every memory
word after the run; the kernel's result must also be bit exact against its
reference. The last test proves the checker can fail: it corrupts one
model value and one wavelet and expects a divergence report naming them.

Parameters (environment): ``WSE_COSIM_CONFIG`` (the mesh), ``WSE_COSIM_SIZE``
(problem size: rows and columns of gemv, vector length of the others;
default 24), ``WSE_COSIM_SEED``, ``WSE_COSIM_MEMORY`` (1: compare every
memory word after each run, the default; 0: skip it, for slow simulators on
large meshes, where it is one host-bus cycle per word).
"""

from __future__ import annotations

import numpy as np

import cocotb

from wse.firmware.kernels import KERNELS
from wse.sim.cosim.lockstep import Divergence
from wse.sim.runner import run_kernel

from .common import config_from_env, env_int, in_thread, mesh_pair

_CASES = [name if variant is None else f"{name}-{variant}"
          for name, kernel in KERNELS.items() for variant in (kernel.variants or (None,))]


def _sizes(case: str, size: int) -> tuple[str, dict]:
    name, _, variant = case.partition("-")
    kernel = KERNELS[name]
    sizes = {"rows": size, "cols": size} if "rows" in kernel.defaults else {"n": size}
    if variant:
        sizes["variant"] = variant
    return name, sizes


@cocotb.test()
@cocotb.parametrize(kernel=[cocotb.Param(case, case.replace("-", "_")) for case in _CASES])
async def kernel_in_lockstep(dut, kernel):
    """A library kernel: bit exact, and equal to the golden model cycle for cycle."""
    pair = await mesh_pair(dut, check_memory=bool(env_int("MEMORY", 1)))
    config = config_from_env()
    name, sizes = _sizes(kernel, env_int("SIZE", 24))
    report = await in_thread(run_kernel, name, config, env_int("SEED", 0), device=lambda cfg: pair, **sizes)
    assert report["bit_exact"], f"{kernel}: {report['mismatches']} of {report['words']} result words differ"
    dut._log.info("%s: %d cycles, compared %s", kernel, report["cycles"], pair.compared)


@cocotb.test()
async def checker_reports_injected_faults(dut):
    """A wrong model value and a flipped wavelet bit are both caught, and the
    report names the memory word and the wavelet (PE, color, index, cycle)."""
    pair = await mesh_pair(dut, check_emits=False)
    config = config_from_env()
    kernel = KERNELS["gemv"]
    plan = kernel.plan(config, kernel.resolve(config, {"rows": 8, "cols": 8}))
    inputs = kernel.inputs(plan, np.random.default_rng(1))

    # 1. A wrong model value: one accumulator word of the golden model, after the run.
    reference_run = pair.reference.run

    def corrupted_run(max_cycles=None):
        cycles = reference_run(max_cycles)
        pair.reference.pe(0, 0).mem[plan.heap] ^= 1 << 3
        return cycles

    pair.reference.run = corrupted_run
    try:
        await in_thread(kernel.execute, pair, plan, inputs)
    except Divergence as exc:
        assert exc.first["kind"] == "word" and exc.first["pe"] == (0, 0) and exc.first["addr"] == plan.heap, exc.first
        dut._log.info("caught: %s", exc.report[0])
    else:
        raise AssertionError("a corrupted model memory word was not reported")
    pair.reference.run = reference_run

    # 2. A flipped bit in a wavelet that left the RTL mesh.
    pair.check_memory = False
    await in_thread(pair.device.reset)
    pair.reference = type(pair.reference)(config)
    device_collect = pair.device._collect

    def flipped_collect():
        device_collect()
        for key, wavelets in sorted(pair.device.edge_out.items()):
            data, ctrl = wavelets[-1]
            wavelets[-1] = (data ^ 1 << 31, ctrl)
            return

    pair.device._collect = flipped_collect
    try:
        await in_thread(kernel.execute, pair, plan, inputs)
    except Divergence as exc:
        first = exc.first
        assert first["kind"] == "wavelet" and first["cycle"] is not None and first["index"] >= 0, first
        dut._log.info("caught: %s", exc.report[0])
    else:
        raise AssertionError("a flipped wavelet bit was not reported")
