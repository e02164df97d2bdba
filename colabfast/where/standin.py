"""colabfast's local stand-in for Google Drive: the folder that plays Drive outside Colab, and where it is shown.

:func:`colabfast.mount` exposes :func:`root` at a mountpoint as a bind mount, a folder of symlinks, or the
FUSE Drive simulator; this module owns the folder, the registry of mountpoints, and recognising each form
(:mod:`colabfast.drive.exposing` exposes it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from colabfast.where import mounttable
from colabfast.where._fileio import PathLike
from colabfast.where.mounttable import Mount

__all__ = ["DEFAULT_MOUNTPOINT", "SIM_VAR", "REGISTRY", "LINKS", "root", "prepare_root", "registered", "register",
           "unregister", "is_bind", "is_links", "form", "mountpoints"]

# Where notebooks written for Colab expect Drive; colabfast.mount() puts the stand-in there too.
DEFAULT_MOUNTPOINT = "/content/drive"
# Set (e.g. "open_ms=100,mbps=60"), colabfast.mount() serves the stand-in through the simulator.
SIM_VAR = "COLABFAST_DRIVE_SIM"
# In the stand-in root: the mountpoints where colabfast.mount() exposed it (a folder of symlinks does
# not show in the mount table).
REGISTRY = ".colabfast-mounts"
# name at the mountpoint -> name in the stand-in root. DriveFS shows "MyDrive" (it runs with
# virtual_folders_omit_spaces) and still resolves "My Drive".
LINKS = {"MyDrive": "MyDrive", "Shareddrives": "Shareddrives", "My Drive": "MyDrive"}


# --- the folder and its registry ----------------------------------------------------------------


def root() -> Path:
    """The folder that plays Google Drive outside Colab (see :func:`colabfast.mount`):
    ``$COLABFAST_DRIVE_ROOT``, else ``~/colabfast-drive``, holding ``MyDrive/`` and ``Shareddrives/``."""
    return Path(os.environ.get("COLABFAST_DRIVE_ROOT") or Path.home() / "colabfast-drive")


def prepare_root() -> Path:
    """Create :func:`root` with Drive's layout (``My Drive`` a relative symlink to ``MyDrive``, so it
    resolves through a bind mount too); returns it."""
    top = root()
    (top / "MyDrive").mkdir(parents=True, exist_ok=True)
    (top / "Shareddrives").mkdir(exist_ok=True)
    if not os.path.lexists(top / "My Drive"):
        os.symlink("MyDrive", top / "My Drive")
    return top


def registered() -> list[str]:
    """The mountpoints recorded by :func:`register`, whether or not they still expose the stand-in."""
    try:
        return [line for line in (root() / REGISTRY).read_text().splitlines() if line]
    except OSError:
        return []


def register(mountpoint: str) -> None:
    """Record that the stand-in is exposed at ``mountpoint`` (a folder of symlinks does not show in the
    mount table). The registry is rewritten whole, through a temporary file and a rename, so a reader
    never sees half of it."""
    known = registered()
    if mountpoint not in known:
        _write_registry([*known, mountpoint])


def unregister(mountpoint: str) -> None:
    """Forget ``mountpoint`` (see :func:`register`)."""
    known = registered()
    if mountpoint in known:
        _write_registry([mp for mp in known if mp != mountpoint])


def _write_registry(mountpoints: list[str]) -> None:
    path = root() / REGISTRY
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text("".join(f"{mp}\n" for mp in mountpoints))
    os.replace(tmp, path)


# --- recognising it -----------------------------------------------------------------------------


def is_bind(m: Mount) -> bool:
    """True if the mount ``m`` is a bind mount of the stand-in root (its top is the root's inode)."""
    if m.fstype == "fuse" or m.fstype.startswith("fuse."):
        return False  # never stat a FUSE mount here: a dead one hangs or fails
    try:
        top = os.stat(root())
        if m.device != f"{os.major(top.st_dev)}:{os.minor(top.st_dev)}":
            return False
        return os.path.samefile(m.mountpoint, root())
    except OSError:
        return False


def is_links(folder: PathLike) -> bool:
    """True if ``folder`` exposes the stand-in as a folder of symlinks (``folder/MyDrive`` links to it)."""
    link = os.path.join(folder, "MyDrive")
    return os.path.islink(link) and os.path.realpath(link) == os.path.realpath(root() / "MyDrive")


def form(mountpoint: PathLike) -> Optional[str]:
    """How ``mountpoint`` itself exposes Drive locally: ``"bind"``, ``"links"``, ``"drivesim"``, or None
    (nothing of colabfast's; a symlink ``mountpoint`` is never followed)."""
    if os.path.islink(mountpoint):
        return None
    real = os.path.realpath(mountpoint)
    m = mounttable.mount_of(real)
    if m is not None and m.mountpoint == real:
        if m.source == mounttable.DRIVESIM_SOURCE:
            return "drivesim"
        if is_bind(m):
            return "bind"
    return "links" if is_links(real) else None


def mountpoints() -> list[str]:
    """Mountpoints where :func:`colabfast.mount` exposed Drive and that still expose it (:func:`form`): the
    registry ``root()/.colabfast-mounts`` (:func:`register`), plus :data:`DEFAULT_MOUNTPOINT`."""
    candidates = [DEFAULT_MOUNTPOINT, *registered()]
    return [mp for mp in dict.fromkeys(c for c in candidates if c) if form(mp) is not None]

