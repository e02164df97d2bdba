"""Copy a dataset from a slow mount (Google Drive) to fast local storage: :func:`stage`.

Round trips overlapped with threads, large files as parallel ranges, archives extracted while read;
each file renamed into place once verified. How it works: [Drive and staging](../drive-and-staging.md#how-it-works).
"""

from __future__ import annotations

from colabfast.errors import StageError, StageRefused
from colabfast.staging.destination import Destination, check_space, default_destination
from colabfast.staging.pipeline import stage

__all__ = ["stage", "StageError", "StageRefused", "check_space", "default_destination", "Destination"]
