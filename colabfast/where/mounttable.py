"""The mount table: what is mounted where, read from ``/proc/self/mountinfo``, for the whole package.

Reading it does no I/O on any mount, so a dead FUSE mount cannot hang a caller here.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Optional

from colabfast.where._fileio import PathLike

__all__ = ["Mount", "MOUNTINFO", "DRIVESIM_SOURCE", "mounts", "mount_of"]

MOUNTINFO = "/proc/self/mountinfo"
# The Drive simulator's mount source: colabfast.drivesim.fs mounts with it, env.drive_kind and
# colabfast.where.standin know the simulator by it.
DRIVESIM_SOURCE = "colabfast-drivesim"


@dataclasses.dataclass(frozen=True)
class Mount:
    """One entry of the mount table (``/proc/self/mountinfo``).

    Attributes:
        mountpoint: where it is mounted.
        fstype: kernel filesystem type, e.g. ``"ext4"``, ``"tmpfs"``, ``"fuse.drive"``.
        source: the mount source, e.g. ``"/dev/sda1"``, ``"drive"``, ``"colabfast-drivesim"``.
        device: the filesystem's device number ``"major:minor"`` (``st_dev`` of files on it), or ``""``.
    """

    mountpoint: str
    fstype: str
    source: str
    device: str = ""


def _unescape(field: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal (\040 ...).
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts() -> list[Mount]:
    """The mount table of this process, in mount order (later entries shadow earlier ones); empty
    where there is none to read (not Linux)."""
    table = []
    try:
        with open(MOUNTINFO, encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields, tail = left.split(), right.split()
                if len(fields) >= 5 and len(tail) >= 2:
                    table.append(Mount(_unescape(fields[4]), tail[0], _unescape(tail[1]), fields[2]))
    except OSError:  # not Linux: report every path as on one unknown filesystem
        pass
    return table


def mount_of(path: PathLike) -> Optional[Mount]:
    """The mount that holds ``path`` (the longest mountpoint prefix of its real path), or None."""
    real = os.path.realpath(path)
    best: Optional[Mount] = None
    for m in mounts():
        mp = m.mountpoint
        if real == mp or real.startswith(mp.rstrip("/") + "/"):
            if best is None or len(mp) >= len(best.mountpoint):
                best = m
    return best
