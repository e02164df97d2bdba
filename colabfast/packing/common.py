"""What every kind of source packs with: :class:`PackError`, the part size :data:`CHUNK`, the worker
processes (forked before any thread, stopped on Ctrl-C, ended with their parent), the lock and work
folder of a destination, the refusal to write over what is not a mirror of the same source, part
files, and sealing, verifying and publishing a built mirror atomically.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import ctypes.util
import dataclasses
import errno
import hashlib
import json
import multiprocessing
import os
import shutil
import signal
import stat
import sys
import warnings
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

import h5py
import numpy as np

from colabfast.errors import MirrorError, NotWritable, PackError, PackRefused, SplitRefused
from colabfast.mirror.format import Header, check, header, split_names
from colabfast.mirror.index import read_order, read_paths
from colabfast.mirror.safety import open_h5, read_h5, trust
from colabfast.where import env
from colabfast.where._fileio import FileEntry, partial_path, state_name
from colabfast.where.env import MIRRORS_FOLDER

__all__ = ["CHUNK", "PackError", "PackRefused", "SplitRefused", "Contents", "differs", "lock_path", "check_writable"]

CHUNK = 256  # samples per part file: the unit of parallel work and of resuming
COPY_CHUNK = 8 << 20  # bytes per write when copying a built mirror onto Drive
STOP_WAIT = 10.0  # seconds to wait for a stopped pool's manager thread
# True while packing straight to the destination (colabfast.packing.placed): the work folder is beside it
STRAIGHT: contextvars.ContextVar[bool] = contextvars.ContextVar("colabfast_pack_straight", default=False)


def mirror_options(store: str, image_size: Union[int, Sequence[int], None], quality: int) -> dict:
    """The options a mirror records and its fingerprint covers (``image_size`` as :func:`_check_size` returns it)."""
    return {"store": store, "image_size": image_size, "quality": quality if image_size else None}


def _check_size(image_size) -> Union[int, list[int], None]:
    if image_size is None:
        return None
    if isinstance(image_size, int) and image_size > 0:
        return image_size
    if (isinstance(image_size, (tuple, list)) and len(image_size) == 2
            and all(isinstance(v, int) and v > 0 for v in image_size)):
        return [int(image_size[0]), int(image_size[1])]
    raise PackRefused(f"image_size must be a positive int (short side) or (H, W), not {image_size!r}")


def package_version() -> str:
    from colabfast import __version__

    return __version__


def file_key(f: FileEntry) -> bytes:
    """What a fingerprint takes from one source file: its name's bytes (any, as the file system
    holds them: not UTF-8 is fine), size and time."""
    return os.fsencode(f.rel) + f"\0{f.size}\0{f.mtime_ns}\n".encode()


def printable(name: str) -> str:
    """``name`` as text that can be written as UTF-8 (the mirror's paths, messages): the bytes of a name
    that is not valid UTF-8 (which Python lists as lone surrogates) become ``\\xNN``."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def lock_path(dst: Path) -> Path:
    """The lock a running :func:`pack` into ``dst`` holds: in colabfast's cache folder, so nothing is
    left beside the user's mirror."""
    return env.cache_dir() / "locks" / f"pack-{state_name(dst)}.lock"


def pack_work_dir(dst: Path) -> Path:
    """Where parts and the build go: beside ``dst`` on a local disk (or packing straight to it,
    :mod:`~colabfast.packing.placed`), else in the local work folder."""
    if not env.is_fuse(dst.parent) or STRAIGHT.get():
        return dst.with_name(f".{dst.name}.colabfast-pack")
    tag = hashlib.sha1(os.fsencode(dst)).hexdigest()[:10]
    return env.work_dir() / "pack" / f"{dst.stem}-{tag}"


def build_path(dst: Path, work: Path) -> Path:
    """Where the mirror is built: under its temporary name beside ``dst`` where ``work`` is, else in ``work``."""
    return partial_path(dst) if work.parent == dst.parent else work / "mirror.h5"


def existing_mirror(dst: Path, overwrite: bool, name: str) -> Optional[str]:
    """The source of the mirror at ``dst``, or None when nothing is there (or ``overwrite``); refuses a
    folder, a special file, and (without ``overwrite``) a file that is not a colabfast mirror. Called
    before anything is read, so that a wrong ``dst`` costs nothing."""
    try:
        mode = os.stat(dst).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        raise PackRefused(f"{dst} is a folder: pack writes one mirror file. Pass a file name, e.g. "
                         f"{dst / (name + '.h5')}")
    if not stat.S_ISREG(mode):
        raise PackRefused(f"{dst} is not a regular file (a pipe or a device): pass a mirror file name as dst")
    if overwrite:
        return None
    try:
        with open_h5(dst) as f:
            return Header.read(f, dst, complete=False).source
    except (MirrorError, OSError):
        raise PackRefused(f"{dst} exists and is not a readable colabfast mirror: packing would replace it, so nothing "
                         "was read. Pass another dst, or overwrite=True to replace it.") from None


def check_same_source(dst: Path, packed_from: str, root: Path) -> None:
    """Refuse to replace a mirror of another source (see :func:`pack`'s ``overwrite``)."""
    if packed_from != printable(str(root)) and os.path.realpath(packed_from) != os.path.realpath(root):
        raise PackRefused(f"{dst} is a mirror of {packed_from}, not of {root}: packing would replace it, so "
                         "nothing was written. Pass another dst, or overwrite=True to replace it.")


@dataclasses.dataclass(frozen=True)
class Contents:
    """What the mirror of a source holds, as the source's listing says before any image is read:
    what :func:`differs` checks a mirror found by its fingerprint against (the fingerprint is a
    claim any file can copy; these are what it was computed from, as far as the mirror records
    them: not the files' sizes and times, nor KITTI's boxes)."""

    options: dict  # store, image_size, quality (see mirror_options)
    source: Optional[str] = None  # the source as a mirror records it, where its fingerprint covers that (an archive's)
    layout: Optional[str] = None  # None: known only once read (an archive's "auto")
    classes: Any = ...  # the classes a mirror records (None: none); ...: not known from the listing
    # split -> (the folder its paths are relative to, each sample's path in the source's order);
    # None where the listing does not name the samples (an archive read as a stream)
    samples: Optional[dict[str, tuple[str, list[str]]]] = None


def differs(path: Path, contents: Contents) -> Optional[str]:
    """Why the complete mirror at ``path`` does not hold what ``contents`` says, in words (``"it holds
    10 images where the source lists 60"``), or None where it does: its source, layout, options and
    classes, and per split the samples it holds (each one's source path and place in the source's
    order) with those it records as skipped.

    Raises:
        MirrorError: it is not a mirror this colabfast reads.
    """
    head = read_h5(path, lambda f: header(f, path))
    if contents.source is not None and head.source != contents.source \
            and os.path.realpath(head.source) != os.path.realpath(contents.source):
        return f"it records another source, {head.source}"
    if contents.layout is not None and head.layout != contents.layout:
        return f"it holds a {head.layout} layout, where the source is a {contents.layout} layout"
    packed = {"store": head.store, "image_size": head.image_size, "quality": head.quality}
    if packed != contents.options:
        return f"it was packed with {packed}, not {contents.options}"
    if contents.samples is None:
        return None
    splits = read_h5(path, split_names)
    if sorted(splits) != sorted(contents.samples):
        return f"it holds the splits {splits}, where the source has {sorted(contents.samples)}"
    skipped = {s["path"] for s in head.skipped}
    for split, (root, names) in contents.samples.items():
        where = f" in {split}" if split else ""
        order, paths = read_order(path, split), read_paths(path, split)
        n, held = len(names), len(order)
        if held > n or (held and (int(order.min()) < 0 or int(order.max()) >= n)) or np.unique(order).size != held:
            return f"it holds {held} images{where}, where the source lists {n}"
        for i, (k, rel) in enumerate(zip(order.tolist(), paths)):
            if rel != names[k]:
                return f"its image {i}{where} is {rel}, where the source's image {k} is {names[k]}"
        kept = set(order.tolist())
        missing = [name for k, name in enumerate(names) if k not in kept and name not in skipped
                   and printable(os.path.join(root, name)) not in skipped]
        if missing:
            return (f"it holds {held} images{where}, where the source lists {n}: {missing[0]}"
                    + (f" and {len(missing) - 1} more are" if len(missing) > 1 else " is")
                    + " neither in it nor among the files it records as skipped")
    if contents.classes is not ... and head.classes != contents.classes:
        mine, theirs = head.classes or [], contents.classes or []
        k = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        return f"its classes differ from the source's from class {k} on ({len(mine)} classes, the source has " \
               f"{len(theirs)})"
    return None


def is_complete(path: Path, fingerprint: str) -> bool:
    """True if ``path`` is a complete, verified mirror with this ``fingerprint``: the destination of an
    earlier run (nothing to do), or its local build left when it was killed while copying it onto
    Drive (published again instead of being rebuilt)."""
    if not path.is_file():
        return False
    try:
        with open_h5(path) as f:
            return Header.read(f, path).fingerprint == fingerprint
    except (MirrorError, OSError):
        return False


# --- worker processes -----------------------------------------------------------------------------


def process_pool(workers: int) -> Executor:
    """Worker processes, all started now, before this call starts any thread of its own.

    Fork, as torch's DataLoader uses on Linux: spawn would re-import the caller's ``__main__``, which
    breaks scripts without an ``if __name__ == "__main__"`` guard. Forking before our reader threads
    and tqdm's monitor exist keeps their locks out of the children; the workers only run PIL.
    """
    if workers <= 0:
        return _InlineExecutor()
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method), initializer=_worker_start,
                               initargs=(os.getpid(),))
    with warnings.catch_warnings():  # Python 3.12 warns about fork in any multi-threaded process
        warnings.simplefilter("ignore", DeprecationWarning)
        pool.submit(int).result()  # with fork, the first submit starts every worker
    return pool


@contextlib.contextmanager
def stopping(pool: Executor) -> Iterator[Executor]:
    """Shut ``pool`` down after the block; when the block fails (Ctrl-C), without starting the work
    still queued, and then waiting (up to ``STOP_WAIT``) for the pieces being decoded, which are
    thrown away, and for the pool's manager thread. Left running into the interpreter's exit, that
    thread could close its wake-up pipe while the exit writes to it, printing "Exception ignored in:
    <module 'threading'>" and a traceback after the one line a Ctrl-C prints (CPython before
    3.12.8 and 3.13.1, python/cpython#125451)."""
    try:
        yield pool
    except BaseException:
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(STOP_WAIT)
        raise
    pool.shutdown(wait=True)


def _worker_start(parent: int) -> None:
    """Worker start-up: leave Ctrl-C to the packing process, and end when that process dies.

    Ctrl-C in a terminal reaches every process of the group: each worker would print its own
    traceback (38 lines with 2 workers) before the packing process's one line; the packing process
    stops the pool instead (:func:`stopping`). Forked workers hold both ends of their work queue's
    pipe, so they never see it close when the packing process dies (a killed notebook kernel) and
    would wait forever; Linux can signal them instead (prctl PR_SET_PDEATHSIG).

    A forked worker runs torch ops on one core, as torch's DataLoader workers do
    (``torch.set_num_threads(1)`` in ``torch/utils/data/_utils/worker.py``), set here before any of its
    threads runs one: torch rebuilds its thread pool in a forked child on the first call that asks
    for it, unguarded, so reader threads racing to that first call once failed with ``pool INTERNAL
    ASSERT FAILED ... Invalid thread pool!`` (``caffe2/utils/threadpool/pthreadpool-cpp.cc``) where the
    packing process had set torch's thread count.
    """
    if "torch" in sys.modules:  # a pack of folders never needs it imported
        sys.modules["torch"].set_num_threads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):  # not Linux: no such call
        return
    if os.getppid() != parent:  # it died before the call above took effect
        os._exit(1)


class _InlineExecutor(Executor):
    """Runs work in this process (``workers=0``): for debugging, and where processes cannot start."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            fut.set_exception(exc)
        return fut


# --- part files, and publishing the mirror built from them ------------------------------------------


def load_part(path: Path) -> Optional[dict]:
    try:
        with np.load(path, allow_pickle=False) as z:
            return {"blob": z["blob"], "offsets": z["offsets"], "shapes": z["shapes"],
                    "errors": [tuple(e) for e in json.loads(str(z["errors"]))]}
    except (OSError, ValueError, KeyError):
        return None


def save_part(path: Path, result: dict) -> None:
    """Write a part under a temporary name, renamed once whole; a failed write (a full disk) deletes
    it, so that the space it took is free for the re-run."""
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f:
            np.savez(f, blob=np.frombuffer(result["blob"], np.uint8) if isinstance(result["blob"], bytes)
                     else result["blob"], offsets=result["offsets"], shapes=result["shapes"],
                     errors=np.array(json.dumps(result["errors"])))
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.replace(tmp, path)


def seal(build: Path) -> None:
    with h5py.File(build, "r+", locking=False) as f:
        f.attrs["complete"] = True
    with open(build, "rb+") as f:
        os.fsync(f.fileno())
    trust(build)


def publish(build: Path, dst: Path) -> None:
    """Move the verified build to ``dst`` atomically (copying it onto Drive first when needed)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if build != partial_path(dst):
        tmp = partial_path(dst)
        # Copied and flushed through one descriptor: Drive's client may not open a file it has just
        # written (colabfast.where._fileio.lagging), so nothing reopens it before the verification, which retries.
        with open(build, "rb") as source, open(tmp, "wb") as target:
            shutil.copyfileobj(source, target, COPY_CHUNK)
            target.flush()
            os.fsync(target.fileno())
        if tmp.stat().st_size != build.stat().st_size:
            raise OSError(errno.EIO, f"copying the mirror to {tmp} wrote {tmp.stat().st_size} bytes, expected "
                             f"{build.stat().st_size}; run pack() again")
        _verify_attrs(tmp)
        os.replace(tmp, dst)
        build.unlink()  # only now: a run killed during the copy publishes this verified build again
    else:
        os.replace(build, dst)
    with contextlib.suppress(OSError):  # not every filesystem (FUSE) can fsync a folder
        fd = os.open(dst.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _verify_attrs(path: Path) -> None:
    with open_h5(path) as f:
        check(f, path)


def check_writable(folder: Path, what: str = "mirrors=", name: str = MIRRORS_FOLDER) -> None:
    """Make ``folder`` and write a byte there, before a mirror is written into it.

    Raises:
        NotWritable: (an ``OSError``, the cause's errno) naming ``folder``, why, and what to pass as
            ``what`` instead (``name`` in ``/kaggle/working`` on Kaggle, else on local disk)."""
    probe = partial_path(folder / f".probe-{os.getpid()}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"\0")
        probe.unlink()
    except OSError as exc:
        on = "Drive" if env.drive_kind(folder) is not None else "it"
        why = {errno.EROFS: f"{on} is read-only", errno.ENOSPC: f"{on} is full", errno.EACCES: "it is not yours to "
               "write", errno.EDQUOT: f"{on} is over its storage quota"}.get(exc.errno or 0, exc.strerror or str(exc))
        if env.in_kaggle():
            fix = (f"{what}'{env.kaggle_working() / name}' (Kaggle's writable folder, kept as the notebook's output; "
                   "/kaggle/input is read-only)")
        else:
            fix = (f"another Drive folder with room, or {what}'{env.work_dir() / name}' (local disk: gone when the "
                   "runtime ends, so the next one packs again)")
        raise NotWritable(exc.errno, f"cannot write a mirror into {folder}: {why} ({exc.strerror or exc}). Nothing "
                          f"was written. Pass {what} a folder you may write, e.g. {fix}") from exc
