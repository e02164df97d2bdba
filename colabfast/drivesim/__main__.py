"""``python -m colabfast.drivesim``: the Drive simulator's command, as ``colabfast drivesim`` runs it."""

from __future__ import annotations

import sys

from colabfast.drivesim.simulator import main

if __name__ == "__main__":
    sys.exit(main())
