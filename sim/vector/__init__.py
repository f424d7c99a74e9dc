"""The vectorized fabric model: every router and PE stepped together as arrays (``docs/vector.md``).

:class:`VectorFabric` is the ``vector`` device of :mod:`wse.sim.devices`,
bit for bit and cycle for cycle equal to the golden model.
"""

from .fabric import VectorFabric

__all__ = ["VectorFabric"]
