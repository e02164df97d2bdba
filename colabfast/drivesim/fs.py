"""The Drive simulator's file system: its parameters (:class:`DriveSimParams`) and the FUSE server that
mirrors a local folder with Drive's latency, bandwidth and faults (:func:`serve`). :mod:`colabfast.drivesim.simulator`
starts it in a child process.
"""

from __future__ import annotations

import argparse
import ctypes.util
import dataclasses
import errno
import importlib.util
import json
import os
import random
import shutil
import stat
import subprocess
import sys
import threading
import time
from typing import Any, Callable, ClassVar, Iterator, Optional, Union

from colabfast.errors import DriveSimError
from colabfast.where import mounttable
from colabfast.where._fileio import PathLike

__all__ = ["DriveSimParams", "available", "serve"]

FSNAME = mounttable.DRIVESIM_SOURCE  # the mount source, by which colabfast.where.env.drive_kind knows the simulator
SUBTYPE = "drivesim"  # the mount type becomes fuse.drivesim
MB = 1e6  # bytes; `mbps` is in megabytes (not mebibytes) per second

# libfuse3 runs at most 10 worker threads unless told otherwise (see the module docstring).
MAX_THREADS = 512

STATS = ("opens", "opendirs", "reads", "bytes_read", "writes", "bytes_written", "eio", "enotconn", "enoent")
FRESH_S = 1.0  # seconds after a write during which an open may not find the file (enoent_fresh)

# utimensat(2) special values, which libfuse passes in tv_nsec with tv_sec = 0.
UTIME_NOW = (1 << 30) - 1
UTIME_OMIT = (1 << 30) - 2

START_TIMEOUT = 30.0  # seconds to wait for the server to mount (a loaded 2-core VM is slow)
REPLY_TIMEOUT = 30.0  # seconds to wait for an answer on the control channel
PARENT_POLL = 0.2  # seconds between checks that the parent process is alive
ORPHAN_GRACE = 2.0  # seconds a server left alone waits for open files to close before it quits


def _param(default: Any, text: str, metavar: Optional[str] = None, *, kind: Callable[[str], Any] = float,
           **meta: Any) -> Any:
    """A :class:`DriveSimParams` field: its default, and its command-line option's help text, metavar and
    argparse ``type``."""
    return dataclasses.field(default=default, metadata={"help": text, "metavar": metavar, "type": kind, **meta})


@dataclasses.dataclass(frozen=True)
class DriveSimParams:
    """How the simulated Drive behaves: latencies, bandwidth, faults. The one list of the simulator's
    parameters: :class:`DriveSim` takes them, :meth:`argv` and :meth:`add_arguments` /
    :meth:`from_args` carry them over the server's command line.

    The defaults are Drive as measured from Colab: about 100 ms per file open, a few ms per read
    request, tens of MB/s.

    Attributes:
        open_ms: latency of each open, opendir and create, in milliseconds.
        read_ms: latency of each read request (the kernel sends at most 128 KiB per request), in
            milliseconds.
        mbps: bandwidth shared by all readers, in megabytes (1e6 bytes) per second; None for no cap
            (0 on the command line). Writes are never capped.
        eio_open: probability that opening a file fails with EIO (after the open latency).
        eio_read: probability that a read request fails with EIO.
        enoent_fresh: probability that opening a file written in the last second fails with ENOENT,
            though the file is there (``stat`` finds it): DriveFS shows what was just written with a
            lag ("Sometimes Drive takes a few minutes to recognize changes", googlecolab/colabtools#4506),
            and the first pack onto Drive in Colab hit it now and then.
        enotconn_after: seconds after mounting when an ENOTCONN window starts; None for none.
        enotconn_for: length of that window in seconds.
        readonly: refuse every change with EROFS.
        seed: seed of the random faults.

    Raises:
        ValueError: a value out of range.
    """

    open_ms: float = _param(100.0, "latency of each open, opendir and create in ms", "MS")
    read_ms: float = _param(2.0, "latency of each read request in ms", "MS")
    mbps: Optional[float] = _param(60.0, "bandwidth shared by all readers in MB/s, 0 for no cap", "MB_S",
                                   zero_is_none=True)
    eio_open: float = _param(0.0, "probability that a file open fails with EIO", "P")
    eio_read: float = _param(0.0, "probability that a read request fails with EIO", "P")
    enoent_fresh: float = _param(0.0, "probability that opening a file written in the last second fails with ENOENT",
                                 "P")
    enotconn_after: Optional[float] = _param(
        None, "seconds after mounting when every request starts failing with ENOTCONN", "S"
    )
    enotconn_for: float = _param(0.0, "how many seconds the ENOTCONN window lasts", "S")
    readonly: bool = _param(False, "refuse every change with EROFS", kind=bool)
    seed: int = _param(0, "seed of the random faults", "N", kind=int)

    # What DriveSim.set() may change while mounted.
    LIVE: ClassVar[tuple[str, ...]] = ("open_ms", "read_ms", "mbps", "eio_open", "eio_read", "enoent_fresh")

    def __post_init__(self) -> None:
        if self.mbps is not None and not self.mbps > 0:
            raise ValueError(f"mbps must be > 0 MB/s, or None for no cap; got {self.mbps!r}")
        for name in ("eio_open", "eio_read", "enoent_fresh"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} is a probability in [0, 1]; got {getattr(self, name)!r}")
        for name in ("open_ms", "read_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 ms; got {getattr(self, name)!r}")
        after, length = self.enotconn_after, self.enotconn_for
        if (after is not None and not after >= 0) or not length >= 0:
            raise ValueError(f"enotconn_after and enotconn_for are >= 0 s; got {after}, {length}")

    def live(self) -> dict[str, Any]:
        """The parameters :meth:`DriveSim.set` may change, by name."""
        return {name: getattr(self, name) for name in self.LIVE}

    def with_live(self, **changes: Any) -> DriveSimParams:
        """A copy with some live parameters changed.

        Raises:
            ValueError: a name that is not live, or a value out of range.
        """
        for name in changes:
            if name not in self.LIVE:
                raise ValueError(f"unknown DriveSim parameter {name!r}; live parameters: {', '.join(self.LIVE)}")
        return dataclasses.replace(self, **changes)

    def argv(self) -> list[str]:
        """These parameters as options of ``python -m colabfast.drivesim`` (see :meth:`from_args`)."""
        args = []
        for field in dataclasses.fields(self):
            value, flag = getattr(self, field.name), "--" + field.name.replace("_", "-")
            if field.metadata["type"] is bool:
                args += [flag] if value else []
            elif value is None and field.metadata.get("zero_is_none"):
                args += [flag, "0"]
            elif value is not None:
                args += [flag, repr(value)]
        return args

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        """Add one option per parameter to ``parser``, named as the field with dashes (``--open-ms``)."""
        for field in dataclasses.fields(cls):
            flag, help = "--" + field.name.replace("_", "-"), field.metadata["help"]
            if field.metadata["type"] is bool:
                parser.add_argument(flag, action="store_true", help=help)
            else:
                suffix = "" if field.default is None else " (default: %(default)s)"
                parser.add_argument(flag, type=field.metadata["type"], default=field.default,
                                    metavar=field.metadata["metavar"], help=help + suffix)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> DriveSimParams:
        """The parameters in ``args``, parsed by a parser given :meth:`add_arguments`.

        Raises:
            ValueError: a value out of range.
        """
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            value = getattr(args, field.name)
            values[field.name] = None if value == 0 and field.metadata.get("zero_is_none") else value
        return cls(**values)


def available() -> tuple[bool, str]:
    """Whether this machine can run the simulator, checked cheaply without mounting.

    Returns:
        ``(True, "")``, or ``(False, reason)`` naming what is missing and how to get it.
    """
    if not sys.platform.startswith("linux"):
        return False, f"the Drive simulator needs Linux FUSE; this is {sys.platform}"
    if not os.path.exists("/dev/fuse"):
        return False, "/dev/fuse is missing (load the fuse module, or give the container --device /dev/fuse)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return False, f"cannot open /dev/fuse: {e.strerror} (run as root or fix its permissions)"
    if shutil.which("fusermount3") is None:
        return False, "fusermount3 is missing (apt-get install fuse3)"
    if ctypes.util.find_library("fuse3") is None:
        return False, "libfuse3 is missing (apt-get install fuse3)"
    if importlib.util.find_spec("mfusepy") is None:
        return False, "mfusepy is missing (pip install mfusepy)"
    return True, ""


def _unmount(mountpoint: PathLike, lazy: bool = False) -> bool:
    """``fusermount3 -u`` (``-uz`` when ``lazy``) ``mountpoint``; True when it succeeded."""
    flags = "-uz" if lazy else "-u"
    done = subprocess.run(["fusermount3", flags, os.fspath(mountpoint)], capture_output=True)
    return done.returncode == 0


def _is_mounted(mountpoint: PathLike) -> bool:
    """True when ``mountpoint`` carries a simulator mount (read from the mount table, no FUSE call)."""
    target = os.path.realpath(mountpoint)
    return any(m.mountpoint == target and m.source == FSNAME for m in mounttable.mounts())


class _Fault(OSError):
    """An error the simulated Drive returns; mfusepy answers the request with its errno."""

    def __init__(self, code: int) -> None:
        super().__init__(code, os.strerror(code))


class _Link:
    """One FIFO link of fixed bandwidth shared by all readers.

    A transfer of n bytes occupies the link for n / bandwidth seconds, starting when both it has
    arrived and the previous transfer has finished; so parallel readers queue, and the total never
    exceeds the bandwidth.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._free_at = 0.0  # time.monotonic() when the last reserved transfer ends

    def finish(self, nbytes: int, bytes_per_s: float, arrival: float) -> float:
        """Reserve the link for ``nbytes`` arriving at ``arrival``; return when they are through."""
        with self._lock:
            self._free_at = max(arrival, self._free_at) + nbytes / bytes_per_s
            return self._free_at


def _attrs(st: os.stat_result) -> dict[str, int]:
    """``st`` as mfusepy's attribute dict (times in nanoseconds: ``_DriveFS.use_ns``)."""
    return {
        "st_mode": st.st_mode,
        "st_nlink": st.st_nlink,
        "st_size": st.st_size,
        "st_uid": st.st_uid,
        "st_gid": st.st_gid,
        "st_blocks": st.st_blocks,
        "st_blksize": st.st_blksize,
        "st_atime": st.st_atime_ns,
        "st_mtime": st.st_mtime_ns,
        "st_ctime": st.st_ctime_ns,
    }


def _plus_fuse(mfusepy):
    """``mfusepy.FUSE`` answering READDIRPLUS: a listing carries every entry's attributes.

    The real Drive client answers a ``stat`` from its local metadata; through plain mfusepy each one
    is a kernel round trip into Python (~0.15 ms, GIL-bound), which made a scan of 10k files cost the
    simulator, not Drive, over a second. mfusepy leaves READDIRPLUS as a TODO (it always fills
    directory entries with flags 0); libfuse3's high-level API takes the attributes when the filler
    gets ``FUSE_FILL_DIR_PLUS`` and the kernel then caches them for ``entry_timeout``.
    """
    readdir_plus, fill_dir_plus = 1, 2  # FUSE_READDIR_PLUS, FUSE_FILL_DIR_PLUS (fuse.h)

    class PlusFUSE(mfusepy.FUSE):
        def readdir_fuse_3(self, path, buf, filler, offset, fip, flags):
            if not flags & readdir_plus or path is None:
                return super().readdir_fuse_3(path, buf, filler, offset, fip, flags)
            # libfuse keeps the attributes only for entries filled with offsets (its "offset mode"):
            # entry i gets offset i + 1, and a call resumes after ``offset`` when the buffer was full.
            st = mfusepy.c_stat()
            decoded = path.decode(self.encoding, self.errors)
            for i, (name, attrs) in enumerate(self.operations._readdir_plus(decoded, offset), start=offset + 1):
                if attrs is None:  # . and ..: no lookups for these
                    full = filler(buf, name.encode(), None, i, 0)
                else:
                    ctypes.memset(ctypes.byref(st), 0, ctypes.sizeof(st))
                    mfusepy.set_st_attrs(st, attrs, use_ns=self.use_ns)
                    full = filler(buf, name.encode(self.encoding, self.errors), st, i, fill_dir_plus)
                if full:
                    break
            return 0

    return PlusFUSE


class _DriveFS:
    """Passthrough of ``source`` with Drive's latencies, shared bandwidth and faults: the operations
    object handed to ``mfusepy.FUSE``, which calls its methods from libfuse's worker threads.

    mfusepy registers every attribute named like a FUSE operation (``lock``, ``link``, ...), so state
    and helpers here start with an underscore.
    """

    use_ns = True  # times as integer nanoseconds, as os.stat gives them

    def __init__(self, source: PathLike, params: DriveSimParams, on_mount=None) -> None:
        self._source = os.path.realpath(source)
        self._params = params  # replaced whole by configure(): a request reads one consistent set
        self._readonly = params.readonly
        self._rng = random.Random(params.seed)
        self._link = _Link()
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STATS, 0)
        self._down = (0.0, 0.0)  # [from, until) in time.monotonic(), when every request fails
        self._failing = 0  # requests still to fail with ENOTCONN (a disconnect counted in requests)
        self._on_mount = on_mount

    # -- the simulated Drive ------------------------------------------------------------------

    def init(self, path: str) -> None:
        if self._params.enotconn_after is not None:
            start = time.monotonic() + self._params.enotconn_after
            self._down = (start, start + self._params.enotconn_for)
        if self._on_mount is not None:
            self._on_mount()

    def configure(self, params: dict[str, Any]) -> None:
        self._params = self._params.with_live(**params)

    def disconnect(self, seconds: float, requests: int = 0) -> None:
        now = time.monotonic()
        self._down = (now, now + seconds)
        with self._lock:
            self._failing = requests

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] += n

    def stats(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def reset_stats(self) -> None:
        with self._lock:
            self._counts = dict.fromkeys(STATS, 0)

    def _gate(self) -> None:
        """Fail with ENOTCONN inside the disconnect window; every operation starts here."""
        start, until = self._down
        counted = False
        if self._failing:
            with self._lock:
                counted, self._failing = self._failing > 0, max(0, self._failing - 1)
        if counted or start <= time.monotonic() < until:
            self._count("enotconn")
            raise _Fault(errno.ENOTCONN)

    def _maybe_eio(self, probability: float) -> None:
        if probability > 0 and self._rng.random() < probability:
            self._count("eio")
            raise _Fault(errno.EIO)

    def _maybe_lag(self, path: str) -> None:
        """ENOENT for a file written in the last second, with probability ``enoent_fresh``."""
        probability = self._params.enoent_fresh
        if probability > 0 and time.time() - os.stat(self._real(path)).st_mtime < FRESH_S and \
                self._rng.random() < probability:
            self._count("enoent")
            raise _Fault(errno.ENOENT)

    def _writable(self) -> None:
        self._gate()
        if self._readonly:
            raise _Fault(errno.EROFS)

    def _open_latency(self) -> None:
        if self._params.open_ms > 0:
            time.sleep(self._params.open_ms / 1000)

    def _real(self, path: str) -> str:
        return os.path.join(self._source, path.lstrip("/"))

    # -- opening and reading: where Drive's costs are --------------------------------------------

    def open(self, path: str, flags: int) -> int:
        self._gate()
        self._count("opens")
        if self._readonly and (flags & os.O_ACCMODE != os.O_RDONLY or flags & os.O_TRUNC):
            raise _Fault(errno.EROFS)
        self._open_latency()
        self._maybe_eio(self._params.eio_open)
        self._maybe_lag(path)
        # O_DIRECT is the kernel's business on the FUSE side; the source may not support it.
        return os.open(self._real(path), flags & ~os.O_DIRECT)

    def create(self, path: str, mode: int, flags: int) -> int:
        self._writable()
        self._count("opens")
        self._open_latency()
        return os.open(self._real(path), (flags | os.O_CREAT) & ~os.O_DIRECT, mode)

    def opendir(self, path: str) -> int:
        self._gate()
        self._count("opendirs")
        self._open_latency()
        if not os.path.isdir(self._real(path)):
            raise _Fault(errno.ENOTDIR)
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._gate()
        params = self._params
        arrival = time.monotonic() + params.read_ms / 1000
        self._count("reads")
        self._maybe_eio(params.eio_read)
        data = os.pread(fh, size, offset)
        mbps = params.mbps
        done = self._link.finish(len(data), mbps * MB, arrival) if mbps else arrival
        self._count("bytes_read", len(data))
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return data

    def readdir(self, path: str, fh: int) -> Iterator[Union[str, tuple[str, dict[str, int], int]]]:
        self._gate()
        yield "."
        yield ".."
        with os.scandir(self._real(path)) as entries:
            for e in entries:  # the type from d_type, without a stat per entry
                kind = stat.S_IFLNK if e.is_symlink() else stat.S_IFDIR if e.is_dir() else stat.S_IFREG
                yield e.name, {"st_mode": kind}, 0

    def _readdir_plus(self, path: str, offset: int) -> Iterator[tuple[str, Optional[dict[str, int]]]]:
        """The entries of ``path`` from index ``offset`` on, each with its attributes (None for ``.``
        and ``..``), in readdir's order: for READDIRPLUS (see :func:`_plus_fuse`)."""
        self._gate()
        with os.scandir(self._real(path)) as it:
            entries = [(".", None), ("..", None), *((e.name, e) for e in it)]
        for name, entry in entries[offset:]:  # stat only what the kernel's buffer takes
            yield name, entry and _attrs(entry.stat(follow_symlinks=False))

    def getattr(self, path: str, fh: Optional[int] = None) -> dict[str, int]:
        self._gate()
        return _attrs(os.lstat(self._real(path)))  # by path: directory handles are all 0, not descriptors

    def readlink(self, path: str) -> str:
        self._gate()
        return os.readlink(self._real(path))

    def access(self, path: str, amode: int) -> int:
        self._gate()
        if amode & os.W_OK and self._readonly:
            raise _Fault(errno.EROFS)
        if not os.access(self._real(path), amode, follow_symlinks=False):
            raise _Fault(errno.EACCES)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        self._gate()
        sv = os.statvfs(self._real(path))
        keys = (
            "f_bavail",
            "f_bfree",
            "f_blocks",
            "f_bsize",
            "f_favail",
            "f_ffree",
            "f_files",
            "f_flag",
            "f_frsize",
            "f_namemax",
        )
        return {k: getattr(sv, k) for k in keys}

    def release(self, path: str, fh: int) -> int:
        os.close(fh)  # even while disconnected: the kernel never retries a release
        return 0

    def releasedir(self, path: str, fh: int) -> int:
        return 0

    # -- writing: straight through to the source, uncapped ---------------------------------------

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._writable()
        n = os.pwrite(fh, data, offset)
        self._count("writes")
        self._count("bytes_written", n)
        return n

    def truncate(self, path: str, length: int, fh: Optional[int] = None) -> int:
        self._writable()
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        return 0

    def flush(self, path: str, fh: int) -> int:
        self._gate()  # writes went to the source with pwrite: nothing is buffered here
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self._gate()
        (os.fdatasync if datasync else os.fsync)(fh)
        return 0

    def unlink(self, path: str) -> int:
        self._writable()
        os.unlink(self._real(path))
        return 0

    def rename(self, old: str, new: str) -> int:
        self._writable()
        os.rename(self._real(old), self._real(new))
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        self._writable()
        os.mkdir(self._real(path), mode)
        return 0

    def rmdir(self, path: str) -> int:
        self._writable()
        os.rmdir(self._real(path))
        return 0

    def symlink(self, target: str, source: str) -> int:
        # mfusepy's naming: `target` is the new link's path, `source` what it points to.
        self._writable()
        os.symlink(source, self._real(target))
        return 0

    def chmod(self, path: str, mode: int) -> int:
        self._writable()
        os.chmod(self._real(path), mode)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        self._writable()
        os.lchown(self._real(path), uid, gid)
        return 0

    def utimens(self, path: str, times: Optional[tuple[int, int]] = None) -> int:
        self._writable()
        real = self._real(path)
        if times is None:
            os.utime(real, follow_symlinks=False)
            return 0
        st, now = os.lstat(real), time.time_ns()
        old = (st.st_atime_ns, st.st_mtime_ns)
        atime, mtime = (now if t == UTIME_NOW else was if t == UTIME_OMIT else t for t, was in zip(times, old))
        os.utime(real, ns=(atime, mtime), follow_symlinks=False)
        return 0


def serve(
    source: PathLike, mountpoint: PathLike, params: Optional[DriveSimParams] = None, *, parent: Optional[int] = None
) -> int:
    """Mount the simulator and serve requests in this thread until it is unmounted or signalled.

    Most callers want :class:`DriveSim`, which runs this in a child process. SIGINT, SIGTERM and
    SIGHUP end the loop and unmount (libfuse's own handlers).

    Args:
        source: the folder to mirror.
        mountpoint: an existing empty directory.
        params: how the simulated Drive behaves (default: :class:`DriveSimParams`'s defaults).
        parent: when given, the pid of the controlling :class:`DriveSim`: commands come as JSON lines
            on stdin and answers go to stdout; the server unmounts and exits when stdin closes or
            that process dies.

    Returns:
        0 once the mount ends after it succeeded (unmounted or signalled), else libfuse's error code.

    Raises:
        DriveSimError: mfusepy is not installed.
    """
    # mfusepy prefers libfuse2 when both are installed; the thread options need libfuse3.
    os.environ.setdefault("FUSE_LIBRARY_PATH", ctypes.util.find_library("fuse3") or "libfuse3.so.3")
    try:
        import mfusepy
    except ImportError as e:  # available() says so before a mount is tried; serve() called directly too
        raise DriveSimError("the Drive simulator needs mfusepy: pip install 'colabfast[fuse]'") from e

    mountpoint = os.path.realpath(mountpoint)
    params = params or DriveSimParams()

    channel = None
    if parent is not None:
        # Answers get a private copy of stdout; fd 1 itself goes to stderr, so stray prints from
        # libraries cannot corrupt the control channel.
        channel = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)

    mounted = threading.Event()

    def on_mount() -> None:
        mounted.set()
        if channel is not None:
            _send(channel, {"ready": True, "pid": os.getpid()})
        else:
            print(
                f"drivesim: {source} mounted at {mountpoint} (open {params.open_ms:g} ms, read "
                f"{params.read_ms:g} ms, {'uncapped' if not params.mbps else f'{params.mbps:g} MB/s'}); "
                "Ctrl-C or SIGTERM unmounts",
                file=sys.stderr,
                flush=True,
            )

    ops = _DriveFS(source, params, on_mount)
    if parent is not None:
        threading.Thread(target=_control, args=(ops, channel, mountpoint), daemon=True).start()
        threading.Thread(target=_watch_parent, args=(parent, mountpoint), daemon=True).start()
    try:
        _plus_fuse(mfusepy)(
            ops,
            mountpoint,
            foreground=True,
            fsname=FSNAME,
            subtype=SUBTYPE,
            max_threads=MAX_THREADS,
            max_idle_threads=MAX_THREADS,
        )
    except RuntimeError as e:
        # mfusepy raises RuntimeError(code) when libfuse returns non-zero, which it also does when a
        # signal ended the loop (code 8). After a successful mount that is the normal way out.
        if not mounted.is_set():
            return e.args[0] if e.args and isinstance(e.args[0], int) else 1
    return 0


def _send(channel, message: dict) -> None:
    channel.write(json.dumps(message) + "\n")
    channel.flush()


def _orphaned(mountpoint: str) -> None:
    """The controller stopped us or died: detach the mount (a no-op after DriveSim.stop unmounted
    it), let the FUSE loop end, which ends the process, and quit regardless after a grace time."""
    _unmount(mountpoint, lazy=True)
    time.sleep(ORPHAN_GRACE)  # the FUSE loop normally ends (and the process exits) before this
    os._exit(0)


def _control(ops, channel, mountpoint: str) -> None:
    """Answer JSON-line commands from the parent until it closes stdin."""
    for line in sys.stdin:
        try:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "set":
                ops.configure(cmd["params"])
                reply: dict = {"ok": True}
            elif op == "disconnect":
                ops.disconnect(float(cmd["seconds"]), int(cmd.get("requests", 0)))
                reply = {"ok": True}
            elif op == "stats":
                reply = {"ok": True, "stats": ops.stats()}
            elif op == "reset_stats":
                ops.reset_stats()
                reply = {"ok": True}
            else:
                reply = {"ok": False, "error": f"unknown command {op!r}"}
        except (ValueError, KeyError, TypeError) as e:
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        try:
            _send(channel, reply)
        except OSError:  # the parent is gone
            break
    _orphaned(mountpoint)


def _watch_parent(parent: int, mountpoint: str) -> None:
    # A dead parent's children are handed to init (or a subreaper), which changes our ppid.
    while os.getppid() == parent:
        time.sleep(PARENT_POLL)
    _orphaned(mountpoint)


