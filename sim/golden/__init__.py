"""The golden fabric model: every router and PE, wavelet by wavelet, in numpy.

:class:`Fabric` is the reference that the RTL must equal bit for bit and the
host API that every backend implements (``docs/architecture.md`` section 5).
Its parts: :mod:`.router` (the routers and edge ports of section 3, also the
reference of the RTL router's testbenches), :mod:`.pe` (one PE, section 4),
:mod:`.decode` (instruction words to the PE's executable form) and
:mod:`.hostargs` (the host API's argument checks, shared with the RTL devices).
"""

from .errors import FabricHang, ProgramFault
from .fabric import Fabric

__all__ = ["Fabric", "FabricHang", "ProgramFault"]
