"""Simulation: the devices the host drives, and what runs kernels on them.

* :mod:`.api`: the host API every device implements (:class:`~.api.Device`).
* :mod:`.golden`: the numpy golden fabric model, the reference.
* :mod:`.cosim`: the RTL devices (Verilator, cocotb on Icarus) and the
  co-simulation against the golden model; :mod:`.cocotb_tb`: its testbenches.
* :mod:`.devices`: the registry of devices by name.
* :mod:`.runner`: a library kernel on a device, checked bit for bit (``wse kernel``).
"""
