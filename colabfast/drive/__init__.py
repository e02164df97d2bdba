"""Google Drive: mount it (or a local stand-in outside Colab), refresh its cache, push its writes
(:mod:`~colabfast.drive.mounting`); download what is shared by link (:mod:`~colabfast.staging.fetching`).
"""

from __future__ import annotations

from colabfast.drive.mounting import DriveReport, flush_and_unmount, flush_drive, mount, refresh_drive
from colabfast.errors import DriveError

__all__ = ["DriveError", "DriveReport", "mount", "refresh_drive", "flush_drive", "flush_and_unmount"]
