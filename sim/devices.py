"""The registry of devices: one name per device, for every part that makes one.

``wse kernel --backend``, the kernel runner (:mod:`wse.sim.runner`), the
runtime's device backends (:mod:`wse.host.runtime`) and the co-simulation
all make their devices here, by name::

    from wse.sim.devices import make_device
    fabric = make_device("verilator", FabricConfig(width=4, height=4))

Each entry's factory imports its device on first use, so reading the
registry (the names and their descriptions) loads no simulator. A new
device is one :func:`register_device` call; it must implement the host API
of :class:`wse.sim.api.Device`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from wse.config import FabricConfig, UsageError

from .api import Device

__all__ = ["DeviceEntry", "DEVICES", "device_names", "make_device", "register_device"]


@dataclasses.dataclass(frozen=True)
class DeviceEntry:
    """One registered device.

    Members
    -------
    name:
        The name every command and API knows it by.
    summary:
        One line saying what it is.
    factory:
        ``config -> device``: a fresh device for a :class:`~wse.config.FabricConfig`.
    listed:
        Whether commands offer it by name (false for a device a run registers
        for itself, such as a mesh behind a defect map).
    """
    name: str
    summary: str
    factory: Callable[[FabricConfig], Device]
    listed: bool = True


def _golden(config: FabricConfig) -> Device:
    from wse.sim.golden import Fabric
    return Fabric(config)


def _vector(config: FabricConfig) -> Device:
    from wse.sim.vector import VectorFabric
    return VectorFabric(config)


def _vector_torch(device: str | None) -> Callable[[FabricConfig], Device]:
    def make(config: FabricConfig) -> Device:
        import torch

        from wse.sim.vector.torch_fabric import TorchFabric
        if device == "cuda" and not torch.cuda.is_available():
            raise UsageError("backend vector-torch-cuda needs a CUDA device; torch finds none here")
        return TorchFabric(config, device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return make


def _verilator(config: FabricConfig) -> Device:
    from wse.sim.cosim.verilator import VerilatorFabric
    return VerilatorFabric(config)


def _icarus(config: FabricConfig) -> Device:
    from wse.sim.cosim.icarus import IcarusFabric
    return IcarusFabric(config)


#: Device name -> entry, in the order commands list them.
DEVICES: dict[str, DeviceEntry] = {entry.name: entry for entry in (
    DeviceEntry("golden", "the golden model: every router and PE in numpy, wavelet by wavelet", _golden),
    DeviceEntry("vector", "the vectorized model: every router and PE as arrays, all stepped together", _vector),
    DeviceEntry("vector-torch", "the vectorized model stepped on torch tensors (CUDA where present, else the CPU)",
                _vector_torch(None)),
    DeviceEntry("vector-torch-cpu", "the vectorized model stepped on torch tensors on the CPU", _vector_torch("cpu")),
    DeviceEntry("vector-torch-cuda", "the vectorized model stepped on torch tensors on a CUDA device",
                _vector_torch("cuda")),
    DeviceEntry("verilator", "the RTL mesh compiled by Verilator, stepped in C++", _verilator),
    DeviceEntry("icarus", "the RTL mesh under cocotb in Icarus Verilog, in another process (slow)", _icarus),
)}


def device_names() -> tuple[str, ...]:
    """The listed device names (those commands offer), in registration order."""
    return tuple(name for name, entry in DEVICES.items() if entry.listed)


def register_device(name: str, factory: Callable[[FabricConfig], Device], summary: str = "",
                    listed: bool = True) -> None:
    """Make a device available by ``name`` everywhere devices are made (replacing one of that name);
    ``listed=False`` keeps it out of the names that commands offer."""
    DEVICES[name] = DeviceEntry(name, summary, factory, listed)


def make_device(name: str, config: FabricConfig | None = None) -> Device:
    """A fresh device ``name`` for ``config`` (default :meth:`FabricConfig.current`).

    Raises
    ------
    UsageError
        For a name that is not registered (the message lists the names).
    """
    entry = DEVICES.get(name) if isinstance(name, str) else None
    if entry is None:
        raise UsageError(f"backend must be one of {', '.join(sorted(device_names()))}, not {name!r}")
    return entry.factory(config if config is not None else FabricConfig.current())
