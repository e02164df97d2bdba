"""Google Drive: mount it (or a local stand-in outside Colab), refresh its cache, push its writes.

Outside Colab a folder (:func:`colabfast.where.standin.root`) plays Drive with Colab's layout, messages
and errors. Every command runs with ``check=True``: a failure raises :class:`DriveError` naming the
command and the next step.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Optional

import psutil

from colabfast.drive import exposing
from colabfast.errors import DriveError
from colabfast.where import env, mounttable, standin
from colabfast.where._fileio import PathLike, human_bytes

__all__ = ["DriveReport", "mount", "refresh_drive", "flush_drive", "flush_and_unmount"]

DEFAULT_MOUNTPOINT = standin.DEFAULT_MOUNTPOINT
# Colab's drive.flush_and_unmount waits a day by default; flush_drive() and refresh_drive() wait this
# long (a multi-GB upload takes minutes), then say what happened instead of hanging a notebook.
FLUSH_TIMEOUT_MS = 30 * 60 * 1000
COLAB_FLUSH_TIMEOUT_MS = 24 * 60 * 60 * 1000  # Colab's own default, kept in the signatures that mirror it
# DriveFS's log, under its state folder: Colab's drive.py reads it to name failures
# (googlecolab/colabtools, google/colab/drive.py).
DRIVEFS_LOG = Path("Logs") / "drive_fs.txt"
OCAMLFUSE = "google-drive-ocamlfuse"

# Colab's own messages (google/colab/drive.py), printed verbatim: notebooks compare outputs.
MOUNTED = "Mounted at {mountpoint}"
ALREADY_MOUNTED = (
    "Drive already mounted at {mountpoint}; to attempt to forcibly remount, "
    'call drive.mount("{mountpoint}", force_remount=True).'
)
NO_PARENT = "Mountpoint must be in a directory that exists"
NOT_MOUNTED = "Drive not mounted, so nothing to flush and unmount."

@dataclasses.dataclass
class DriveReport:
    """What :func:`refresh_drive` or :func:`flush_drive` did.

    Attributes:
        mountpoint: the Drive mountpoint, e.g. ``"/content/drive"``.
        kind: ``"drivefs"``, ``"ocamlfuse"``, ``"drivesim"`` or ``"standin"``.
        actions: the steps taken, in order, in words.
        freed: bytes of disk freed by dropping the client's cache (0 when none was dropped).
    """

    mountpoint: str
    kind: str
    actions: list[str]
    freed: int = 0

    def __str__(self) -> str:
        return f"Drive ({self.kind}) at {self.mountpoint}: " + "; ".join(self.actions)


def mount(
    mountpoint: PathLike = DEFAULT_MOUNTPOINT,
    *,
    force_remount: bool = False,
    readonly: bool = False,
    timeout_ms: int = 120000,
) -> Path:
    """Mount Google Drive at ``mountpoint``, in Colab or (as a local stand-in) anywhere else.

    In Colab this is ``google.colab.drive.mount``. Elsewhere :func:`colabfast.where.standin.root`
    (``$COLABFAST_DRIVE_ROOT``, default ``~/colabfast-drive``) is exposed with Drive's layout (``MyDrive``,
    ``Shareddrives``) by a bind mount, a folder of symlinks, or the FUSE Drive simulator with
    ``$COLABFAST_DRIVE_SIM`` (``"open_ms=100,mbps=60"``), printing and raising what Colab does; a missing
    ``/content`` is created.

    Args:
        mountpoint: where Drive appears; Colab's convention is ``/content/drive``. ``~`` is expanded.
        force_remount: mount again even if Drive is already there.
        readonly: mount read-only (as a folder of symlinks the stand-in warns that it cannot).
        timeout_ms: Colab's mount timeout; the local stand-in does not wait for anything.

    Returns:
        ``mountpoint/MyDrive``, where your Drive files are.

    Raises:
        ValueError: the mountpoint contains a space, is a symlink, is a non-empty folder, is a file,
            or is in a folder that does not exist (Colab's errors, word for word).
        DriveError: a mount command failed, or ``/content`` could not be created.
    """
    mountpoint = os.fspath(mountpoint)
    if env.in_colab():
        _colab_drive().mount(mountpoint, force_remount=force_remount, timeout_ms=timeout_ms, readonly=readonly)
    elif env.in_kaggle():
        raise DriveError(
            "Google Drive cannot be mounted on Kaggle (google.colab.drive is Colab's), and colabfast's local "
            "stand-in would show an empty folder. On Kaggle: add your data as a Kaggle dataset (Add Input), "
            "or download a shared Drive file or folder with colabfast.fetch(link)."
        )
    else:
        try:
            mount_standin(mountpoint, force_remount=force_remount, timeout_ms=timeout_ms, readonly=readonly)
        except ValueError as e:
            if str(e) != NO_PARENT:
                raise
            parent = os.path.dirname(os.path.normpath(os.path.expanduser(mountpoint)))
            raise ValueError(f"{NO_PARENT}: {parent} does not exist; create it (mkdir -p {shlex.quote(parent)}) "
                             "or mount elsewhere") from None  # Colab's words, then (here) the folder
        print(f"colabfast: not in Colab: {mountpoint} shows the local stand-in folder {standin.root()} "
              "($COLABFAST_DRIVE_ROOT)", file=sys.stderr)
    # refresh_drive() and flush_drive() mount again with what the user chose, not Colab's defaults.
    _MOUNT_OPTIONS[os.path.realpath(os.path.expanduser(mountpoint))] = {"readonly": readonly, "timeout_ms": timeout_ms}
    return Path(os.path.expanduser(mountpoint)) / "MyDrive"


# realpath of a mountpoint -> the options mount() was given for it
_MOUNT_OPTIONS: dict[str, dict] = {}


def open_files_under(mountpoint: str) -> list[str]:
    """Files this process and its children (DataLoader workers) hold open under ``mountpoint``, as
    ``"path (pid N)"``; psutil's view of ``/proc/<pid>/fd``."""
    root = os.path.realpath(mountpoint).rstrip("/") + "/"
    found = []
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            for f in proc.open_files():
                if f.path.startswith(root):
                    found.append(f"{f.path} (pid {proc.pid}{'' if proc.pid == me.pid else ', a child process'})")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _refuse_if_in_use(mp: str, what: str) -> None:
    busy = open_files_under(mp)
    if busy:
        shown = "\n  ".join(busy[:10]) + (f"\n  ... and {len(busy) - 10} more" if len(busy) > 10 else "")
        raise DriveError(
            f"{what} would unmount Drive at {mp} while this notebook still has files open there:\n  {shown}\n"
            "A DataLoader's persistent workers reading from Drive would die with ENOTCONN. Finish or delete "
            "those loaders and datasets first (del loader; import gc; gc.collect()), or stage the data "
            "off Drive and read it from there."
        )


def flush_and_unmount(timeout_ms: int = COLAB_FLUSH_TIMEOUT_MS) -> None:
    """Push pending writes to Drive and unmount it: Colab's ``drive.flush_and_unmount`` in Colab,
    :func:`flush_and_unmount_standin` elsewhere."""
    if env.in_colab():
        _colab_drive().flush_and_unmount(timeout_ms)
    else:
        flush_and_unmount_standin(timeout_ms)


def mount_standin(
    mountpoint: str, force_remount: bool = False, timeout_ms: int = 120000, readonly: bool = False
) -> None:
    """Colab's ``drive.mount`` for the local stand-in: same signature, checks, messages and errors."""
    del timeout_ms  # the stand-in is local: nothing to wait for
    if " " in mountpoint:
        raise ValueError("Mountpoint must not contain a space.")
    mountpoint = os.path.expanduser(mountpoint)
    if not force_remount and os.path.isdir(os.path.join(mountpoint, "My Drive")):
        print(ALREADY_MOUNTED.format(mountpoint=mountpoint))
        return
    # Colab unmounts whatever is at the mountpoint before checking it; we take down only our own.
    exposing.unexpose(mountpoint)
    _check_mountpoint(mountpoint)
    exposing.expose(mountpoint, readonly, may_mount=env.can_mount())
    print(MOUNTED.format(mountpoint=mountpoint))


def flush_and_unmount_standin(timeout_ms: int = COLAB_FLUSH_TIMEOUT_MS) -> None:
    """Colab's ``drive.flush_and_unmount`` for the local stand-in: sync, then take down every mountpoint
    exposing it (:func:`colabfast.where.env.standin_mountpoints`).

    Raises:
        ValueError: ``'flush_and_unmount failed'`` (Colab's error), chained to the cause.
    """
    del timeout_ms
    mountpoints = env.standin_mountpoints()
    if not mountpoints:
        print(NOT_MOUNTED)
        return
    try:
        os.sync()
        for mp in mountpoints:
            exposing.unexpose(mp)
    except (OSError, DriveError) as e:
        raise ValueError("flush_and_unmount failed") from e


def refresh_drive(mountpoint: PathLike = DEFAULT_MOUNTPOINT, *, quiet: bool = False) -> DriveReport:
    """Make Drive show its current contents and free the disk its client's cache takes.

    Pending writes go up and the client unmounts before its cache (DriveFS's, or
    google-drive-ocamlfuse's via ``-cc``) is deleted, then Drive is mounted again; the stand-in keeps no
    cache. Steps per client: [Drive and staging](../drive-and-staging.md#how-it-works).

    Args:
        mountpoint: where Drive is mounted (a path inside it will do).
        quiet: do not print the report.

    Returns:
        A :class:`DriveReport` (what was done, bytes freed); printed unless ``quiet``.

    Raises:
        DriveError: no Drive at ``mountpoint``, or a step failed; the message says what was kept
            and what to try next.
    """
    kind, mp = _locate(mountpoint)
    if kind in ("drivefs", "ocamlfuse"):
        _refuse_if_in_use(mp, "refresh_drive()")
    if kind == "drivefs":
        report = _refresh_drivefs(mp)
    elif kind == "ocamlfuse":
        report = _refresh_ocamlfuse(mp)
    else:
        report = DriveReport(mp, kind, [f"nothing to do: the local stand-in shows {standin.root()} as it is"])
    if not quiet:
        print(report)
    return report


def flush_drive(mountpoint: PathLike = DEFAULT_MOUNTPOINT, *, quiet: bool = False) -> DriveReport:
    """Push pending writes (a freshly copied mirror, checkpoints) to Drive and wait until they are up: an
    unmount and mount again (Drive has no flush without one); the stand-in only syncs.

    Args:
        mountpoint: where Drive is mounted (a path inside it will do).
        quiet: do not print the report.

    Returns:
        A :class:`DriveReport`; printed unless ``quiet``.

    Raises:
        DriveError: no Drive at ``mountpoint``, or a step failed (with what to try next).
    """
    kind, mp = _locate(mountpoint)
    if kind in ("drivefs", "ocamlfuse"):
        _refuse_if_in_use(mp, "flush_drive()")
    if kind == "drivefs":
        colab = _colab_drive()
        _flush_drivefs(colab, mp)
        _mount_drivefs_again(colab, mp, "pending writes were pushed")
        report = DriveReport(mp, kind, ["pushed pending writes (flush_and_unmount)", "mounted again"])
    elif kind == "ocamlfuse":
        argv = _unmount_ocamlfuse(mp)
        exposing.run(argv, f"pending writes were pushed; mount again by hand: {shlex.join(argv)}")
        report = DriveReport(mp, kind, ["unmounted and waited for pending uploads", "mounted again"])
    else:
        os.sync()
        report = DriveReport(mp, kind, [f"nothing to push: the stand-in writes to {standin.root()}; synced"])
    if not quiet:
        print(report)
    return report


def _locate(mountpoint: PathLike) -> tuple[str, str]:
    """(kind, mountpoint) of the Drive holding ``mountpoint``: a path inside Drive finds its mount."""
    path = os.path.expanduser(os.fspath(mountpoint))
    kind = env.drive_kind(path)
    if kind is None:
        raise DriveError(f"no Google Drive is mounted at {path}; mount it first: colabfast.mount({path!r})")
    mount = mounttable.mount_of(path)
    if kind in ("drivefs", "ocamlfuse") and mount is not None:
        path = mount.mountpoint
    return kind, path


def failure_advice(path: PathLike, errors: list[BaseException]) -> Optional[str]:
    """What to do about reads from Drive that kept failing, or None: remount for ENOTCONN; for EIO on
    DriveFS, what its log says (``QUOTA_EXCEEDED``, ``QueryManager timed out``), as Colab's ``drive.py`` reads it.
    """
    codes = {getattr(e, "errno", None) for e in errors}
    if errno.ENOTCONN in codes:
        return ("Drive's connection dropped (ENOTCONN: its client stopped). Mount it again: "
                "colabfast.mount(force_remount=True), then run the same call again.")
    if errno.EIO not in codes and errno.ETIMEDOUT not in codes:
        return None
    if env.drive_kind(os.fspath(path)) != "drivefs":
        return None
    log = env.drivefs_dir() / DRIVEFS_LOG
    try:
        with open(log, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - (4 << 20)))  # the recent part is enough
            recent = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    if "QUOTA_EXCEEDED" in recent:
        return (f"Drive download quota exceeded (DriveFS's log {log} says QUOTA_EXCEEDED): Drive limits how often "
                "a file may be downloaded, and shared datasets hit it. Wait (the quota resets within a day), or "
                "copy the folder to your own Drive (Make a copy) and stage that copy.")
    if "QueryManager timed out" in recent:
        return (f"Drive timed out listing files (DriveFS's log {log} says 'QueryManager timed out'): a folder with "
                "very many files. Mount with a longer timeout: colabfast.mount(force_remount=True, "
                "timeout_ms=600000), or keep such data as one archive or mirror file.")
    return None


def _colab_drive():
    try:
        from google.colab import drive
    except ImportError as e:
        raise DriveError(f"google.colab.drive cannot be imported ({e}); this runtime is not Colab") from e
    return drive


def _du(path: Path) -> int:
    """Bytes of disk taken by the files under ``path`` (0 if it is missing); symlinks not followed."""
    total = 0
    for folder, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_blocks * 512
            except OSError:
                pass
    return total


# --- Colab's checks for the local stand-in -------------------------------------------------------


def _check_mountpoint(mountpoint: str) -> None:
    # Colab's checks and messages, in Colab's order.
    if os.path.islink(mountpoint):
        raise ValueError("Mountpoint must not be a symlink")
    if os.path.isdir(mountpoint) and os.listdir(mountpoint):
        raise ValueError("Mountpoint must not already contain files")
    if not os.path.isdir(mountpoint) and os.path.exists(mountpoint):
        raise ValueError("Mountpoint must either be a directory or not exist")
    normed = os.path.normpath(mountpoint)
    parent = os.path.dirname(normed)
    if "/" in normed and not os.path.exists(parent):
        if parent != env.COLAB_CONTENT:
            raise ValueError(NO_PARENT)
        try:
            os.mkdir(parent)
        except OSError as e:
            raise DriveError(
                f"cannot create {parent} (Colab's working folder) for the stand-in Drive at {mountpoint}: "
                f"{e.strerror}; create it once (sudo mkdir -m 1777 {parent}), or mount elsewhere: "
                f"colabfast.mount('~/drive')"
            ) from e


# --- DriveFS (Colab) ----------------------------------------------------------------------------


def _flush_drivefs(colab, mp: str) -> None:
    try:
        colab.flush_and_unmount(FLUSH_TIMEOUT_MS)
    except Exception as e:  # Colab raises ValueError('flush_and_unmount failed') or whatever broke first
        raise DriveError(
            f"flush_and_unmount() failed or did not finish within {FLUSH_TIMEOUT_MS // 60000} minutes ({e}): "
            f"writes under {mp} may not be on Drive yet and the DriveFS "
            f"cache {env.drivefs_dir()}, which holds them, was kept. Next: wait a few minutes and call "
            f"colabfast.flush_drive() again; do not restart or disconnect the runtime until it succeeds"
        ) from e


def _mount_drivefs_again(colab, mp: str, done: str) -> None:
    try:
        colab.mount(mp, force_remount=True, **_MOUNT_OPTIONS.get(os.path.realpath(mp), {}))
    except Exception as e:  # Colab raises ValueError('mount failed...') among others
        raise DriveError(
            f"{done}, but mounting Drive at {mp} again failed ({e}). Next: colabfast.mount({mp!r}, "
            f"force_remount=True); if that fails too, Runtime > Restart session and mount again"
        ) from e


def _refresh_drivefs(mp: str) -> DriveReport:
    colab = _colab_drive()
    cache = env.drivefs_dir()
    _flush_drivefs(colab, mp)
    if env.drive_kind(mp) == "drivefs":
        raise DriveError(
            f"Drive is still mounted at {mp} after flush_and_unmount(), so its cache {cache} was kept. "
            f"Next: call colabfast.refresh_drive() again"
        )
    freed = _du(cache)
    try:
        if cache.exists():
            shutil.rmtree(cache)
    except OSError as e:
        raise DriveError(
            f"Drive was flushed and unmounted, but removing its cache {cache} failed ({e}). Next: "
            f"rm -rf '{cache}', then colabfast.mount({mp!r})"
        ) from e
    _mount_drivefs_again(colab, mp, f"the DriveFS cache was removed ({human_bytes(freed)} freed)")
    actions = [
        "pushed pending writes (flush_and_unmount)",
        f"removed the DriveFS cache {cache} ({human_bytes(freed)})",
        "mounted again",
    ]
    return DriveReport(mp, "drivefs", actions, freed)


# --- google-drive-ocamlfuse ---------------------------------------------------------------------


def _ocamlfuse_process(mp: str) -> Optional[tuple]:
    """The running client serving ``mp`` and its command line from the executable on, or None."""
    real = os.path.realpath(mp)
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        for i, arg in enumerate(cmdline):
            if os.path.basename(arg) == OCAMLFUSE:
                if any(os.path.realpath(a) == real for a in cmdline[i + 1 :]):
                    return proc, cmdline[i:]
                break
    return None


def _label(argv: list) -> str:
    """The ``-label`` of a google-drive-ocamlfuse command line (``"default"`` without one)."""
    return argv[argv.index("-label") + 1] if "-label" in argv[:-1] else "default"


def _unmount_ocamlfuse(mp: str) -> list:
    """Unmount the client at ``mp`` and wait until it exits; returns the command line to mount again."""
    found = _ocamlfuse_process(mp)
    argv = found[1] if found else [OCAMLFUSE, mp]
    exposing.run([exposing.fusermount(), "-u", mp], f"close the files open under {mp} and retry")
    if found:
        try:
            found[0].wait(timeout=600)
        except psutil.TimeoutExpired:
            raise DriveError(
                f"{OCAMLFUSE} (pid {found[0].pid}) is still uploading 10 minutes after unmounting {mp}; "
                f"its cache was kept. Next: wait for it to exit, then mount again: {shlex.join(argv)}"
            ) from None
        except psutil.NoSuchProcess:
            pass
    if env.drive_kind(mp) == "ocamlfuse":
        raise DriveError(f"{mp} is still mounted after `fusermount -u`; its cache was kept. Next: retry")
    return argv


def _refresh_ocamlfuse(mp: str) -> DriveReport:
    argv = _unmount_ocamlfuse(mp)
    label = _label(argv)
    cache = Path.home() / ".gdfuse" / label / "cache"
    before = _du(cache)
    clear = [argv[0], "-cc"] + (["-label", label] if label != "default" else [])
    exposing.run(clear, f"Drive is unmounted; clear {cache} by hand and mount again: {shlex.join(argv)}")
    freed = max(0, before - _du(cache))
    exposing.run(argv, f"the cache was cleared ({human_bytes(freed)} freed); mount again by hand: {shlex.join(argv)}")
    actions = [
        "unmounted and waited for pending uploads",
        f"cleared the cache {cache} ({human_bytes(freed)}) with `{shlex.join(clear)}`",
        "mounted again",
    ]
    return DriveReport(mp, "ocamlfuse", actions, freed)
