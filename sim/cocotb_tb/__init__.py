"""cocotb testbenches of the fabric RTL (run by ``tests/test_cosim.py`` and
``python -m wse.sim.cosim.regress``, never collected by pytest directly).

* :mod:`.router_tb`: one router under random multi-color multicast traffic
  with random backpressure, against a cycle-level reference.
* :mod:`.pe_tb`: directed and random PE programs on a 1x1 mesh, in lockstep
  with the golden model.
* :mod:`.mesh_tb`: every library kernel on a mesh, in lockstep with the
  golden model, and the checker's own failure test.
* :mod:`.server_tb`: serves the host API to another process (the ``icarus``
  backend).

Each module reads its parameters from environment variables (``WSE_COSIM_*``,
see :mod:`wse.sim.cosim.regress`).
"""
