"""Showing the stand-in (:mod:`colabfast.where.standin`) at a mountpoint and taking it down: a bind
mount, a folder of symlinks, or the FUSE Drive simulator (``$COLABFAST_DRIVE_SIM``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Optional

from colabfast.errors import DriveError
from colabfast.where.standin import LINKS, SIM_VAR, form, prepare_root, register, root, unregister

__all__ = ["expose", "unexpose", "run", "fusermount"]

# Drive simulators started by this process, by real mountpoint; each stops with the process.
_SIMS: dict = {}


# --- exposing it and taking it down -------------------------------------------------------------


def expose(mountpoint: str, readonly: bool, *, may_mount: bool) -> str:
    """Show the stand-in root at ``mountpoint`` (the simulator, a bind mount where ``may_mount``, else
    symlinks, which cannot enforce ``readonly``) and :func:`register` it; returns :func:`form`'s name.

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
    """Take down the stand-in at ``mountpoint``, if that is what is there, and :func:`unregister` it.

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
    from colabfast.drivesim.simulator import DriveSim

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
