"""A RAM disk to stage data into: :func:`ramdisk` mounts a tmpfs (or falls back to ``/dev/shm``),
and :meth:`RamDisk.release` (or ``colabfast ramdisk --release``) gives its memory back."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any, Optional, Union

from colabfast.errors import NotEnoughSpace, StageRefused
from colabfast.where import env, mounttable
from colabfast.where._fileio import PathLike, human_bytes, locked, state_name

__all__ = ["RamDisk", "ramdisk", "release_ramdisk", "ramdisk_path", "default_path"]

SHM_FALLBACK = Path("/dev/shm/colabfast")
MOUNT_SOURCE = "colabfast-ramdisk"  # the source name of the tmpfs colabfast mounts (see /proc/mounts)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(size: Union[int, str]) -> int:
    """Bytes in ``size``: an int, or a string like ``"512M"``, ``"8G"``, ``"1.5g"`` (powers of 1024)."""
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)i?b?\s*", str(size).lower())
    if not m:
        raise StageRefused(f"cannot read {size!r} as a size: use bytes or a string like '8G' or '512M'")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def default_path() -> Path:
    """Where :func:`ramdisk` mounts by default: ``<work dir>/ramdisk`` (``/content/ramdisk`` in Colab)."""
    return env.work_dir() / "ramdisk"


def ramdisk_path() -> Optional[Path]:
    """The RAM disk colabfast mounted earlier (or its ``/dev/shm`` fallback), or None."""
    if env.is_ram(default_path()) and os.path.ismount(default_path()):
        return default_path()
    return SHM_FALLBACK if SHM_FALLBACK.is_dir() else None


class RamDisk(os.PathLike):
    """A RAM disk from :func:`ramdisk`: use it as a path (``rd / "data"``, ``os.fspath(rd)``,
    ``rd.path``), and :meth:`release` it when done. Also a context manager that releases on exit.

    Attributes:
        path: the mount point (or the ``/dev/shm/colabfast`` fallback folder).
    """

    def __init__(self, path: Path):
        self.path = Path(path)

    def __fspath__(self) -> str:
        return str(self.path)

    def __truediv__(self, other: PathLike) -> Path:
        return self.path / other

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"RamDisk({str(self.path)!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (str, os.PathLike)):
            return self.path == Path(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.path)

    def __enter__(self) -> RamDisk:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def release(self) -> None:
        """Delete everything on the RAM disk and give its memory back (unmount it). See
        :func:`release_ramdisk`."""
        release_ramdisk(self.path)


def release_ramdisk(path: Optional[PathLike] = None) -> bool:
    """Unmount the tmpfs colabfast mounted at ``path`` (default: :func:`default_path`) and remove its mount
    point, or delete the ``/dev/shm/colabfast`` fallback. Also ``colabfast ramdisk --release``.

    Returns:
        True if a RAM disk was released, False if there was none.

    Raises:
        ValueError: ``path`` is a tmpfs colabfast did not mount (it is left alone).
        OSError: ``errno.EBUSY`` while files on it are open (a DataLoader's workers, an open dataset).
    """
    target = Path(path) if path is not None else default_path()
    if os.path.ismount(target) and env.is_ram(target):
        m = mounttable.mount_of(target)
        if m is None or m.source != MOUNT_SOURCE:
            raise StageRefused(f"{target} is a RAM disk colabfast did not mount ({m.source if m else '?'}): "
                               f"left alone")
        done = subprocess.run(["umount", str(target)], capture_output=True, text=True)
        if done.returncode != 0:
            raise OSError(errno.EBUSY, f"cannot release the RAM disk at {target}: {done.stderr.strip()}. Close "
                                       f"what has files open there (a DataLoader's workers, a dataset) and retry.")
        with contextlib.suppress(OSError):
            target.rmdir()
        return True
    if target == SHM_FALLBACK or (path is None and SHM_FALLBACK.is_dir()):
        existed = SHM_FALLBACK.is_dir()
        shutil.rmtree(SHM_FALLBACK, ignore_errors=True)
        return existed
    return False


def ramdisk(size: Union[int, str, None] = None, path: Optional[PathLike] = None) -> RamDisk:
    """Mount a tmpfs RAM disk and return it; reuse (and grow) one already mounted there. Needs root
    (Colab runs as root); without it, ``/dev/shm/colabfast`` is used instead, with a warning. Processes
    asking at once (torchrun's ranks) take turns through a lock; it stays mounted until released
    (``with ramdisk("8G") as rd:`` releases it when the block ends).

    Args:
        size: the most it may hold, in bytes or as ``"8G"``/``"512M"``. Default: free RAM minus
            :func:`colabfast.where.env.ram_headroom` (max(2 GiB, 25% of RAM)).
        path: mount point, missing, empty or a tmpfs. Default: ``/content/ramdisk`` in Colab,
            ``<tempdir>/colabfast-data-<uid>/ramdisk`` elsewhere.

    Returns:
        The RAM disk: a path-like object (``rd / "name"`` is a :class:`pathlib.Path`, ``rd.path``
        the mount point) with a ``release()`` method.

    Raises:
        ValueError: ``size`` is more than the RAM colabfast may use (the message has the numbers), or
            ``path`` is a non-empty folder that is not a tmpfs.
        OSError: ``errno.ENOSPC`` when falling back to ``/dev/shm`` and it has less free space.
    """
    spare = env.ram_available() - env.ram_headroom()
    nbytes = spare if size is None else parse_size(size)
    if nbytes <= 0 or nbytes > spare:
        raise StageRefused(
            f"a {human_bytes(nbytes)} RAM disk would starve this machine: {human_bytes(env.ram_available())} "
            f"of RAM is free and colabfast keeps {human_bytes(env.ram_headroom())} of it for training, so "
            f"at most {human_bytes(max(spare, 0))} can go to a RAM disk. Ask for less, or stage to disk."
        )
    target = Path(path) if path is not None else default_path()
    # Processes mounting at one path at once (torchrun's ranks, each staging to="ram") would stack
    # tmpfs mounts there, each hiding what the one below holds: one at a time, the next finds it mounted.
    with locked(env.cache_dir() / "locks" / f"ramdisk-{state_name(target)}.lock", f"mounting a RAM disk at {target}"):
        return _mounted(target, nbytes, size)


def _mounted(target: Path, nbytes: int, size: Union[int, str, None]) -> RamDisk:
    """:func:`ramdisk`'s mount at ``target`` (or its growth, or the fallback), under its lock."""
    if env.is_ram(target) and os.path.ismount(target):
        st = os.statvfs(target)
        if st.f_blocks * st.f_frsize < nbytes:
            _mount_tmpfs(target, nbytes, remount=True)
        return RamDisk(target)
    if target.is_dir() and any(target.iterdir()):
        raise StageRefused(f"cannot mount a RAM disk at {target}: the folder is not empty. Pass another path.")
    try:
        if not env.can_mount():
            raise PermissionError("mounting a tmpfs needs root with CAP_SYS_ADMIN")
        target.mkdir(parents=True, exist_ok=True)
        _mount_tmpfs(target, nbytes)
        return RamDisk(target)
    except (OSError, subprocess.CalledProcessError) as exc:
        reason = exc.stderr.strip() if isinstance(exc, subprocess.CalledProcessError) else str(exc)
        return RamDisk(_shm_fallback(nbytes if size is not None else 0, reason))


def _mount_tmpfs(target: Path, nbytes: int, remount: bool = False) -> None:
    options = f"remount,size={nbytes}" if remount else f"size={nbytes},mode=0755"
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, MOUNT_SOURCE, str(target)],
                   check=True, capture_output=True, text=True)


def _shm_fallback(nbytes: int, reason: str) -> Path:
    """``/dev/shm/colabfast``; ``nbytes`` is the size asked for (0: none; stage checks its own need)."""
    free = env.disk_free("/dev/shm")
    if nbytes > free:
        raise NotEnoughSpace(errno.ENOSPC, f"cannot mount a tmpfs ({reason}), and /dev/shm, the fallback, has "
                                    f"{human_bytes(free)} free, less than the {human_bytes(nbytes)} asked for")
    warnings.warn(f"cannot mount a tmpfs ({reason}); using {SHM_FALLBACK} ({human_bytes(free)} free) instead",
                  stacklevel=3)
    SHM_FALLBACK.mkdir(parents=True, exist_ok=True)
    return SHM_FALLBACK
