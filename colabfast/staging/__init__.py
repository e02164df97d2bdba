"""Copy a dataset from a slow mount (Google Drive) to fast local storage: :func:`stage`.

Drive is a FUSE filesystem where every open and every read request is a network round trip, so
``cp -r`` of many small files crawls. ``stage`` overlaps the round trips with threads (the latency
is in the mount, not the CPU), splits large files into ranges read in parallel, extracts archives
while reading them, and makes the result trustworthy: each file is written under a temporary name
and renamed once its size (and, on request, its hash) is confirmed, a source that changes during
its copy is copied again, re-runs skip what is already there, and transient mount errors are
retried per read request."""

from __future__ import annotations

from colabfast.errors import StageError, StageRefused
from colabfast.staging.destination import Destination, check_space, default_destination
from colabfast.staging.pipeline import stage

__all__ = ["stage", "StageError", "StageRefused", "check_space", "default_destination", "Destination"]
