"""The device backends: the training firmware on a device of :mod:`wse.sim.devices`.

``golden`` runs every phase on the golden model, ``verilator`` on the
Verilator-compiled mesh (:class:`wse.sim.cosim.verilator.VerilatorFabric`, a
C++ clock loop) and ``icarus`` on the full mesh under cocotb in Icarus
Verilog (:class:`wse.sim.cosim.icarus.IcarusFabric`, slow: for
cross-checks). Every device implements the host API
(:class:`wse.sim.api.Device`), so the driver is
:class:`~.device.DeviceBackend`'s, and a step gives the golden model's bits
and cycle counts (``docs/cosim.md``). The backend of a device is made from
the registry by name (:func:`device_backend`), so a registered device is a
runtime backend too.
"""

from __future__ import annotations

from wse.config import UsageError
from wse.sim.devices import DEVICES, make_device

from .device import DeviceBackend

__all__ = ["RegisteredDeviceBackend", "device_backend", "VerilatorBackend", "IcarusBackend"]


class RegisteredDeviceBackend(DeviceBackend):
    """Every phase on the device of :data:`wse.sim.devices.DEVICES` that has
    the backend's :attr:`name`; cycles are that device's counts."""

    def make_device(self, config):
        """A fresh device of the backend's name, from the registry."""
        return make_device(self.name, config)


_BACKENDS: dict[str, type[RegisteredDeviceBackend]] = {}


def device_backend(name: str) -> type[RegisteredDeviceBackend]:
    """The runtime backend class on the registered device ``name`` (one class per name).

    Raises
    ------
    UsageError
        If no device of that name is registered.
    """
    backend = _BACKENDS.get(name)
    if backend is None:
        entry = DEVICES.get(name)
        if entry is None:
            raise UsageError(f"no device {name!r}; registered: {', '.join(DEVICES)}")
        backend = type(f"{name.capitalize()}Backend", (RegisteredDeviceBackend,),
                       {"name": name, "__module__": __name__,
                        "__doc__": f"Every phase on {entry.summary}; cycles are its counts."})
        _BACKENDS[name] = backend
    return backend


#: Every phase on the Verilator-compiled RTL mesh; cycles are the RTL's.
VerilatorBackend = device_backend("verilator")
#: Every phase on the RTL mesh in Icarus Verilog under cocotb; cycles are the RTL's.
IcarusBackend = device_backend("icarus")
