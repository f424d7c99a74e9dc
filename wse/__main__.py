"""``python -m wse`` runs the ``wse`` command."""
import sys

from .cli import main

sys.exit(main())
