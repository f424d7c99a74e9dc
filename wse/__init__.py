"""waferscale: an open wafer-scale engine.

The top-level package holds what every part shares: the fabric configuration
(:mod:`wse.config`). The parts live in sub-packages mapped from the top-level
folders: :mod:`wse.hdl`, :mod:`wse.firmware`, :mod:`wse.sim`, :mod:`wse.host`.
"""

from .config import FabricConfig, Port, UsageError

__all__ = ["FabricConfig", "Port", "UsageError"]
__version__ = "0.1.0"
