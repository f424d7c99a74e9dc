"""The golden fabric model: every router and PE, wavelet by wavelet, in numpy.

:class:`Fabric` is the reference that the RTL must equal bit for bit and the
host API that every backend implements (``docs/architecture.md`` section 5).
"""

from .errors import FabricHang, ProgramFault
from .fabric import Fabric

__all__ = ["Fabric", "FabricHang", "ProgramFault"]
