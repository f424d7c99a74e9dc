"""``python -m wse.host.swarmx`` (or ``torchrun ... -m wse.host.swarmx``): see :mod:`.selfcheck`."""

import sys

from .selfcheck import main

sys.exit(main())
