"""colabfast's local stand-in for Google Drive: one folder, shown where Colab mounts Drive.

Outside Colab, :func:`colabfast.mount` exposes a folder (:func:`root`: ``$COLABFAST_DRIVE_ROOT``,
default ``~/colabfast-drive``, holding ``MyDrive/`` and ``Shareddrives/`` as Drive does) at a
mountpoint in one of three forms: a bind mount of the folder, a folder of symlinks into it, or the FUSE
Drive simulator serving it. This module owns all of it: the folder, the registry of mountpoints where
it is exposed, recognising each form, exposing it and taking it down, and starting the simulator
(:mod:`colabfast.drivesim`, imported only when ``$COLABFAST_DRIVE_SIM`` asks for it).

It sits below :mod:`colabfast.env`, whose ``drive_kind``, ``drive_mounts`` and ``storage`` ask it
whether a mount or a folder is the stand-in; what is mounted where it reads from
:mod:`colabfast.mounttable`, as env does, and :func:`expose` is told whether this process may mount
(``env.can_mount()``).
:mod:`colabfast.drive` keeps Colab's side (``mount``, ``flush_and_unmount`` and their messages) and
calls this module for the local case.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Optional

from colabfast import mounttable
from colabfast._fileio import PathLike
from colabfast.errors import DriveError
from colabfast.mounttable import Mount

__all__ = ["DriveError", "DEFAULT_MOUNTPOINT", "SIM_VAR", "REGISTRY", "LINKS", "root",
           "prepare_root", "registered", "register", "unregister", "is_bind", "is_links", "form", "mountpoints",
           "expose", "unexpose", "run", "fusermount"]

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

# Drive simulators started by this process, by real mountpoint; each stops with the process.
_SIMS: dict = {}


# --- the folder and its registry ----------------------------------------------------------------


def root() -> Path:
    """The folder that plays Google Drive outside Colab (see :func:`colabfast.mount`).

    ``$COLABFAST_DRIVE_ROOT`` when set, else ``~/colabfast-drive``. It holds ``MyDrive/`` and
    ``Shareddrives/`` as Drive does.
    """
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
    """How ``mountpoint`` itself exposes Drive locally: ``"bind"`` (a bind mount of the stand-in root),
    ``"links"`` (a folder of symlinks into it), ``"drivesim"`` (the simulator is mounted there), or
    None (nothing of colabfast's; a symlink ``mountpoint`` is never followed).
    """
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
    """Mountpoints where :func:`colabfast.mount` exposed Drive locally and that still expose it.

    Read from the registry ``root()/.colabfast-mounts`` (:func:`register`), plus
    :data:`DEFAULT_MOUNTPOINT`; each is checked with :func:`form`.
    """
    candidates = [DEFAULT_MOUNTPOINT, *registered()]
    return [mp for mp in dict.fromkeys(c for c in candidates if c) if form(mp) is not None]


# --- exposing it and taking it down -------------------------------------------------------------


def expose(mountpoint: str, readonly: bool, *, may_mount: bool) -> str:
    """Show the stand-in root (created with :func:`prepare_root`) at ``mountpoint``, creating the
    mountpoint folder as Colab's Drive client does, and :func:`register` it.

    Through the simulator when ``$COLABFAST_DRIVE_SIM`` is set, else by a bind mount when
    ``may_mount`` (``env.can_mount()``) and the kernel agrees, else as a folder of symlinks (which
    cannot enforce ``readonly``: it warns). Returns the form, as :func:`form` names it.

    Raises:
        DriveError: the simulator did not start, or a mount command failed.
    """
    top = prepare_root()
    os.makedirs(mountpoint, exist_ok=True)
    sim = _sim_options()
    if sim is not None:
        shown = _start_sim(top, mountpoint, sim, readonly)
    elif may_mount and _bind(top, mountpoint, readonly):
        shown = "bind"
    else:
        for name, target in LINKS.items():
            os.symlink(top / target, os.path.join(mountpoint, name))
        shown = "links"
    register(mountpoint)
    if readonly and shown == "links":
        warnings.warn(
            f"readonly=True is not enforced at {mountpoint}: the stand-in is a folder of symlinks here; a "
            f"read-only bind mount needs root with CAP_SYS_ADMIN",
            stacklevel=3,
        )
    return shown


def unexpose(mountpoint: str) -> None:
    """Take down the stand-in at ``mountpoint``, if that is what is there (:func:`form`), and
    :func:`unregister` it. The files stay in :func:`root`.

    Raises:
        DriveError: an unmount command failed (with the next step).
    """
    shown = form(mountpoint)
    if shown == "drivesim":
        sim = _SIMS.pop(os.path.realpath(mountpoint), None)
        if sim is not None:
            sim.stop()
        else:
            run([fusermount(), "-u", mountpoint], f"stop the process serving the simulator at {mountpoint}")
    elif shown == "bind":
        run(["umount", mountpoint], f"close the files open under {mountpoint} and retry")
    elif shown == "links":
        top = os.path.realpath(root())
        for name in LINKS:
            link = os.path.join(mountpoint, name)
            if os.path.islink(link) and os.path.realpath(link).startswith(top + os.sep):
                os.unlink(link)
    unregister(mountpoint)


def _bind(top: Path, mountpoint: str, readonly: bool) -> bool:
    """Bind-mount ``top`` at ``mountpoint``; False if the kernel refuses (a locked-down container)."""
    try:
        subprocess.run(["mount", "--bind", str(top), mountpoint], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return False
    if readonly:
        try:
            run(["mount", "-o", "remount,bind,ro", mountpoint], "mount without readonly=True")
        except DriveError:
            run(["umount", mountpoint], f"umount {mountpoint} by hand")
            raise
    return True


# --- the Drive simulator behind it --------------------------------------------------------------


def _sim_options() -> Optional[dict]:
    """Keyword arguments for the simulator from ``$COLABFAST_DRIVE_SIM``, or None when it is unset."""
    spec = os.environ.get(SIM_VAR, "").strip()
    if not spec:
        return None
    options = {}
    for part in spec.split(","):
        key, eq, value = part.partition("=")
        if not eq:
            continue  # "1", "on": the simulator's defaults
        try:
            number = float(value)
        except ValueError:
            raise DriveError(
                f"{SIM_VAR}={spec!r}: {key.strip()} must be a number, e.g. {SIM_VAR}='open_ms=100,mbps=60'"
            ) from None
        options[key.strip()] = int(number) if number.is_integer() else number
    return options


def _start_sim(top: Path, mountpoint: str, options: dict, readonly: bool) -> str:
    # Imported only when asked for: importing the library loads none of the simulator.
    from colabfast.drivesim import DriveSim

    try:
        sim = DriveSim(top, mountpoint, readonly=readonly, **options).start()
    except (TypeError, ValueError, RuntimeError) as e:  # unknown or out-of-range option, FUSE unusable
        raise DriveError(f"{SIM_VAR}={os.environ[SIM_VAR]!r}: the Drive simulator did not start: {e}") from e
    _SIMS[os.path.realpath(mountpoint)] = sim
    return "drivesim"


# --- commands -----------------------------------------------------------------------------------


def run(argv: list, next_step: str) -> None:
    """Run ``argv`` with ``check=True``; a failure becomes a :class:`DriveError` with its stderr and
    ``next_step``. :mod:`colabfast.drive` runs its commands through it too."""
    try:
        subprocess.run(argv, check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise DriveError(f"`{argv[0]}` is not installed here; next: {next_step}") from e
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or e.stdout or "").strip()
        raise DriveError(
            f"`{shlex.join(argv)}` failed with exit status {e.returncode}"
            + (f": {detail}" if detail else "")
            + f"; next: {next_step}"
        ) from e


def fusermount() -> str:
    """The command that unmounts a FUSE file system: ``fusermount`` or ``fusermount3``."""
    return shutil.which("fusermount") or shutil.which("fusermount3") or "fusermount"
