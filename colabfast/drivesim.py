"""``python -m colabfast.drivesim``: the Drive simulator's command, kept at its documented name.

The simulator is :mod:`colabfast.drive.simulator` (its file system :mod:`colabfast.drive.simfs`); this module
only runs its command, as ``colabfast drivesim`` does.
"""

from __future__ import annotations

import sys

from colabfast.drive.simulator import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
