"""The RTL backends: the training firmware on the fabric's Verilog.

``verilator`` runs every phase on the Verilator-compiled mesh
(:class:`wse.sim.cosim.verilator.VerilatorFabric`, a C++ clock loop) and
``icarus`` on the full mesh under cocotb in Icarus Verilog
(:class:`wse.sim.cosim.icarus.IcarusFabric`, slow: for cross-checks). Both
implement the golden model's host API, so the driver is
:class:`~.device.DeviceBackend`'s, and a step gives the golden model's bits
and cycle counts (``docs/cosim.md``).
"""

from __future__ import annotations

from .device import DeviceBackend

__all__ = ["VerilatorBackend", "IcarusBackend"]


class VerilatorBackend(DeviceBackend):
    """Every phase on the Verilator-compiled RTL mesh; cycles are the RTL's."""

    name = "verilator"

    def make_device(self, config):
        from wse.sim.cosim.verilator import VerilatorFabric
        return VerilatorFabric(config)


class IcarusBackend(DeviceBackend):
    """Every phase on the RTL mesh in Icarus Verilog under cocotb; cycles are the RTL's."""

    name = "icarus"

    def make_device(self, config):
        from wse.sim.cosim.icarus import IcarusFabric
        return IcarusFabric(config)
