"""Co-simulation of the fabric RTL against the golden model.

* :mod:`.rtl` writes the Verilog the simulators compile: one shared tile
  module (with read-only probes) and the mesh top of :class:`wse.hdl.fabric.Fabric`.
* :mod:`.build` compiles it with Verilator (the C++ harness of ``harness/``)
  or Icarus, cached under ``build/cosim/<hash>``.
* :mod:`.verilator` is the ``verilator`` backend: the host API of
  :class:`wse.sim.golden.Fabric` on the Verilator-compiled mesh, stepped in C++.
* :mod:`.cocotb_device` drives the same API through cocotb (inside a
  simulator) and :mod:`.icarus` reaches it from outside (the ``icarus`` backend).
* :mod:`.lockstep` runs any program on two devices and reports the first
  divergence; :mod:`.regress` is ``make sim``.
"""

from __future__ import annotations

__all__ = ["make_rtl_device", "RTL_BACKENDS"]

#: The RTL backends of the host API, by name.
RTL_BACKENDS = ("verilator", "icarus")


def make_rtl_device(name: str, config):
    """A fresh RTL device ``name`` (``"verilator"`` or ``"icarus"``) for ``config``.

    Raises
    ------
    UsageError
        For an unknown name.
    """
    from wse.config import UsageError

    if name == "verilator":
        from .verilator import VerilatorFabric
        return VerilatorFabric(config)
    if name == "icarus":
        from .icarus import IcarusFabric
        return IcarusFabric(config)
    raise UsageError(f"RTL backend must be one of {', '.join(RTL_BACKENDS)}, not {name!r}")
