"""What the testbenches share: parameters from the environment, the device
under test with its golden twin, and a report of simulated cycles."""

from __future__ import annotations

import json
import os

import cocotb
from cocotb.task import bridge

from wse.config import FabricConfig
from wse.sim.cosim.cocotb_device import CocotbFabric
from wse.sim.cosim.lockstep import Lockstep
from wse.sim.golden import Fabric

__all__ = ["config_from_env", "env_int", "mesh_pair", "in_thread"]


def config_from_env() -> FabricConfig:
    """The configuration the design was built for (``WSE_COSIM_CONFIG``, JSON)."""
    return FabricConfig.from_dict(json.loads(os.environ["WSE_COSIM_CONFIG"]))


def env_int(name: str, default: int) -> int:
    """An integer parameter ``WSE_COSIM_<name>``."""
    return int(os.environ.get(f"WSE_COSIM_{name}", default))


async def mesh_pair(dut, *, check_memory: bool = True, check_emits: bool = True) -> Lockstep:
    """The mesh under test (set up and reset) in lockstep with a traced golden model."""
    config = config_from_env()
    device = CocotbFabric(dut, config)
    await device.setup()
    return Lockstep(Fabric(config, trace=check_emits), device, check_memory=check_memory,
                    check_emits=check_emits)


async def in_thread(function, *args, **kwargs):
    """Run a blocking host-API ``function`` from the test (cocotb's bridge thread)."""
    result = await bridge(function)(*args, **kwargs)
    cocotb.log.debug("done: %s", getattr(function, "__name__", function))
    return result
