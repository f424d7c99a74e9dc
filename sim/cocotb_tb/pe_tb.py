"""PE testbench: directed and random programs on a 1x1 mesh (one PE and its
router), in lockstep with the golden model.

After each program the final data memory (every word), the registers,
every counter and every wavelet the PE emitted must equal the golden
model's, and so must the cycle count
(:class:`~wse.sim.cosim.lockstep.Lockstep`). Programs come from
:mod:`wse.sim.cosim.programs`.

Parameters (environment): ``WSE_COSIM_CONFIG`` (a 1x1 mesh),
``WSE_COSIM_PROGRAMS`` (random programs, default 8), ``WSE_COSIM_SEED``
(first seed), ``WSE_COSIM_LENGTH`` (instruction groups per program, default 60).
"""

from __future__ import annotations

import cocotb

from wse.sim.cosim.programs import directed_scenarios, random_scenario, run_scenario

from .common import config_from_env, env_int, in_thread, mesh_pair

_DIRECTED = [scenario.name for scenario in directed_scenarios()]


@cocotb.test()
@cocotb.parametrize(name=[cocotb.Param(name, name) for name in _DIRECTED])
async def directed_program(dut, name):
    """A directed program: each instruction group with chosen operands."""
    pair = await mesh_pair(dut)
    scenario = next(s for s in directed_scenarios(config_from_env()) if s.name == name)
    cycles = await in_thread(run_scenario, pair, scenario)
    dut._log.info("%s: %d cycles, compared %s", name, cycles, pair.compared)


@cocotb.test()
async def random_programs(dut):
    """Random programs that use every instruction group; each one in lockstep."""
    pair = await mesh_pair(dut)
    config = config_from_env()
    first, count, length = env_int("SEED", 0), env_int("PROGRAMS", 8), env_int("LENGTH", 60)
    total = 0
    for seed in range(first, first + count):
        scenario = random_scenario(seed, length, config)
        try:
            total += await in_thread(run_scenario, pair, scenario)
        except AssertionError as exc:
            raise AssertionError(f"random program {seed}:\n{exc}\n--- program ---\n{scenario.source}") from None
    dut._log.info("%d random programs, %d cycles", count, total)
