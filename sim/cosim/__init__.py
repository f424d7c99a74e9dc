"""Co-simulation of the fabric RTL against the golden model.

* :mod:`.rtl` writes the Verilog the simulators compile: one shared tile
  module (with read-only probes) and the mesh top of :class:`wse.hdl.fabric.Fabric`.
* :mod:`.build` compiles it with Verilator (the C++ harness of ``harness/``)
  or Icarus, cached under ``build/cosim/<hash>``.
* :mod:`.device` is the host API (:class:`wse.sim.api.RtlDevice`) on an RTL
  mesh, over a few primitives per simulator; :mod:`.verilator` is the
  ``verilator`` device: the mesh Verilator-compiled, stepped in C++.
* :mod:`.cocotb_device` drives the same API through cocotb (inside a
  simulator) and :mod:`.icarus` reaches it from outside (the ``icarus`` device).
* :mod:`.lockstep` runs any program on two devices and reports the first
  divergence; :mod:`.regress` is ``make sim``.

The devices are made by name from :mod:`wse.sim.devices`.
"""
