"""Where a stream cache (:class:`colabfast.datasets.stream.StreamCache`) fetches a mirror's image
data from: the mirror's file on a mount (Drive), or a mirror at an fsspec URL (a bucket).
"""

from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any, Callable, TypeVar

from colabfast.datasets.mirrorreader import RETRIES, mount_failed
from colabfast.errors import MirrorError
from colabfast.where._fileio import file_version, is_transient, pread_retrying, retry

T = TypeVar("T")

__all__ = ["MountSource", "RemoteSource"]


class MountSource:
    """Where a stream cache fetches from: the mirror's file on a mount (Drive), read with ``pread``; a
    transient error is retried as :func:`colabfast.stage` retries it, then raised as one
    :class:`colabfast.errors.MountError` naming the file and the byte offset."""

    def __init__(self, path: Path, version: tuple) -> None:
        self.path, self.version, self.name = Path(path), version, str(path)

    def _retried(self, op: Callable[[], T], what: str) -> T:
        try:
            return retry(op, RETRIES)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise mount_failed(self.path, exc, what) from exc

    def open(self) -> int:
        what = "opening it to stream image data"
        fd = self._retried(lambda: os.open(self.path, os.O_RDONLY), what)
        try:
            version = file_version(self._retried(lambda: os.fstat(fd), what))
        except BaseException:
            os.close(fd)
            raise
        if version != self.version:
            os.close(fd)
            raise self.changed_error()
        return fd

    def read(self, fd: int, view: memoryview, offset: int) -> int:
        """Read into ``view`` from byte ``offset``: the bytes read, at least one."""
        handle = {"fd": fd}

        def reopen() -> None:
            with contextlib.suppress(OSError):
                handle["fd"] = os.open(self.path, os.O_RDONLY)

        try:
            n = pread_retrying(functools.partial(_preadv_into, handle, view), len(view), offset, RETRIES, reopen)
        except OSError as exc:
            if not is_transient(exc):
                raise
            raise mount_failed(self.path, exc, f"streaming image data at byte {offset}") from exc
        finally:
            if handle["fd"] != fd:
                with contextlib.suppress(OSError):
                    os.close(handle["fd"])
        if n == 0:
            raise MirrorError(f"{self.path} ended at byte {offset} while it was streamed: the file was truncated or "
                              "replaced. Open the dataset again once the file is final.")
        return n

    def forget(self, fd: int, offset: int, length: int) -> None:
        """Drop ``length`` bytes from ``offset`` on from the kernel's page cache: the stream cache holds
        what was read, and a handle kept open between epochs would otherwise keep them in memory (and
        serve the next epoch from there rather than from the mount, where the memory allows)."""
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: no posix_fadvise (macOS)
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)

    def close(self, fd: int) -> None:
        with contextlib.suppress(OSError):  # the mount may be gone (unmounted, disconnected)
            os.close(fd)

    def changed(self, offset: int = 0) -> bool:
        """Whether the file at the path is another version now (an open handle keeps the old file);
        ``offset``: the byte streamed up to, for the error where the mount keeps failing."""
        stat = self._retried(lambda: os.stat(self.path), f"checking it is unchanged after streaming to byte {offset}")
        return file_version(stat) != self.version

    def changed_error(self) -> MirrorError:
        return MirrorError(f"{self.path} changed on the mount while it was streamed (replaced or rewritten: a new run "
                           "of colabfast.pack?), so its index no longer describes the file. Open the dataset again "
                           "once the file is final.")


class RemoteSource:
    """Where a stream cache fetches from: a mirror at an fsspec URL (``gs://``, ``s3://``, ``https://``,
    ``memory://``; https://filesystem-spec.readthedocs.io), read with ``seek`` and ``read`` of the file
    fsspec opens. Its version is what ``fs.info`` says of it (size, and its modification time or ETag
    where the filesystem gives them).

    Raises:
        ImportError: fsspec is not installed (``pip install fsspec``, and ``gcsfs`` for ``gs://``).
        FileNotFoundError: nothing at ``url``.
    """

    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise ImportError(f"streaming {url} needs fsspec: pip install 'colabfast[bucket]' (and gcsfs for gs://, "
                              "s3fs for s3://)") from exc

        self.name = url
        self.fs, self.remote = fsspec.core.url_to_fs(url)
        self.version = self._version()

    def _version(self) -> tuple:
        info = self.fs.info(self.remote)
        keys = ("size", "mtime", "LastModified", "updated", "ETag", "etag", "created")
        return tuple(str(info.get(k)) for k in keys)

    @property
    def size(self) -> int:
        return int(self.version[0])

    def open(self) -> Any:
        if self._version() != self.version:
            raise self.changed_error()
        return self.fs.open(self.remote, "rb")

    def read(self, f: Any, view: memoryview, offset: int) -> int:
        f.seek(offset)
        data = f.read(len(view))
        if not data:
            raise MirrorError(f"{self.name} ended at byte {offset} while it was streamed: the file was truncated or "
                              "replaced. Open the dataset again once the file is final.")
        view[: len(data)] = data
        return len(data)

    def forget(self, f: Any, offset: int, length: int) -> None:
        """Nothing to drop: fsspec's read-ahead buffer holds one block at most."""

    def close(self, f: Any) -> None:
        with contextlib.suppress(Exception):
            f.close()

    def changed(self, offset: int = 0) -> bool:
        return self._version() != self.version

    def changed_error(self) -> MirrorError:
        return MirrorError(f"{self.name} changed while it was streamed (replaced or rewritten), so its index no longer "
                           "describes the file. Open the dataset again once the file is final.")


def _preadv_into(handle: dict, view: memoryview, n: int, offset: int) -> int:
    return os.preadv(handle["fd"], [view[:n]], offset)
