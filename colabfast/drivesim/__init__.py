"""The Drive simulator: a FUSE file system that mirrors a local folder with Google Drive's latency,
bandwidth and faults (`colabfast.drivesim.fs`), run in a child process and controlled from this one
(`colabfast.drivesim.simulator.DriveSim`). Tests, benchmarks and ``colabfast demo`` play Drive with it
outside Colab; ``$COLABFAST_DRIVE_SIM`` makes `colabfast.mount` mount the stand-in through it.
``python -m colabfast.drivesim`` and ``colabfast drivesim`` run it from a terminal.
"""

from colabfast.drivesim.fs import DriveSimParams, available
from colabfast.drivesim.simulator import DriveSim

__all__ = ["DriveSim", "DriveSimParams", "available"]
