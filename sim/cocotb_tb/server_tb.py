"""Serves the host API of the simulated mesh to another process.

The ``icarus`` backend (:class:`wse.sim.cosim.icarus.CocotbProxyFabric`)
starts the simulator with this module. The test connects back to the address
in ``WSE_COSIM_ADDRESS`` (``host:port``, key ``WSE_COSIM_AUTHKEY`` in hex),
then answers calls ``(method, args, kwargs)`` on a
:class:`~wse.sim.cosim.cocotb_device.CocotbFabric` until it receives
``("close",)``. Answers are ``("ok", result)``, or ``("hang", message,
report, cycle)`` for a :class:`~wse.sim.golden.FabricHang`, or ``("error",
class name, message)``.
"""

from __future__ import annotations

import os
import traceback
from multiprocessing.connection import Client

import cocotb

from wse.config import UsageError
from wse.sim.api import RTL_CALLS
from wse.sim.cosim.cocotb_device import CocotbFabric
from wse.sim.golden import FabricHang

from .common import config_from_env, in_thread

#: Methods a client may call: the calls of an RTL device (:class:`wse.sim.api.RtlDevice`).
ALLOWED = frozenset(RTL_CALLS)


def _serve(device: CocotbFabric, connection) -> None:
    while True:
        message = connection.recv()
        if message[0] == "close":
            connection.send(("ok", None))
            return
        name, args, kwargs = message
        try:
            if name not in ALLOWED:
                raise UsageError(f"the simulated mesh has no method {name!r}")
            connection.send(("ok", getattr(device, name)(*args, **kwargs)))
        except FabricHang as exc:
            connection.send(("hang", str(exc).split("\n")[0], exc.report, exc.cycle))
        except UsageError as exc:
            connection.send(("error", type(exc).__name__, str(exc)))
        except Exception:  # reported to the client, which raises it there
            connection.send(("error", "RuntimeError", traceback.format_exc()))


@cocotb.test()
async def serve(dut):
    """Answer host-API calls until the client closes the connection."""
    device = CocotbFabric(dut, config_from_env())
    await device.setup()
    host, port = os.environ["WSE_COSIM_ADDRESS"].rsplit(":", 1)
    connection = Client((host, int(port)), authkey=bytes.fromhex(os.environ["WSE_COSIM_AUTHKEY"]))
    try:
        await in_thread(_serve, device, connection)
    finally:
        connection.close()
