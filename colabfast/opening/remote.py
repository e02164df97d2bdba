"""Opening a mirror at an fsspec URL (a bucket: ``gs://``, ``s3://``, ``https://``; or ``file://``) by
streaming it: ``open_dataset("gs://bucket/imagenet.h5", to="stream")``.

The mirror is never copied whole. A **shell** of it is written to local disk first: a file of the
mirror's size holding all of its bytes but the image data, which is left a hole (a sparse file takes no
disk for it). The drop-in dataset opens the shell as it would open the mirror (its index, labels,
columns), and reads the image data through a stream cache
(:mod:`colabfast.datasets.stream`) that fetches it from the URL
(:class:`~colabfast.datasets.streamsource.RemoteSource`), ahead of the loop and within ``cache_limit``.

The URL's HDF5 metadata comes from a stranger as much as a downloaded mirror does: it is read by a
child process (libhdf5 crashes on some corrupt files, :func:`colabfast.mirror.safety.vet`), which
writes the shell under a temporary name, and the shell is vetted before this process opens it. The
child reaches the URL itself, so the filesystem must be one another process can reach (a bucket, a
web server, local files; not fsspec's per-process ``memory://``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path
from typing import Any, Callable, Optional

from colabfast.errors import MirrorError, NothingToOpen, StageRefused
from colabfast.where._fileio import human_bytes, python_child

__all__ = ["is_url", "open_remote"]

SHELL_TIMEOUT = 600.0  # seconds the child has to read the metadata and write the shell
PIECE = 8 << 20  # bytes per read of the metadata's ranges


def is_url(path: Any) -> bool:
    """Whether ``path`` is a URL with a scheme (``gs://...``), which fsspec opens, rather than a path."""
    return isinstance(path, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def open_remote(url: str, split: Optional[str], *, transform: Optional[Callable], target_transform: Optional[Callable],
                output: str, to: str, cache_limit: Optional[int]) -> Any:
    """The drop-in dataset of the mirror at ``url``, streamed (see the module's docstring); its
    ``account`` says what was done.

    Raises:
        StageRefused: ``to`` other than ``"stream"`` or ``"auto"``.
        ImportError: fsspec is missing (``pip install fsspec``; ``gcsfs`` for ``gs://``, ``s3fs`` for ``s3://``).
        NothingToOpen: (a ``FileNotFoundError``) nothing at ``url``.
        MirrorError: not a mirror, or one whose metadata libhdf5 cannot read safely.
        CacheLimitError: as :func:`colabfast.open_dataset` with ``to="stream"``.
    """
    from colabfast.datasets.streamsource import RemoteSource
    from colabfast.loading.streaming import cache_folder, discard, limit_for, stream
    from colabfast.mirror.safety import vet
    from colabfast.opening.mirrors import drop_in

    if to not in ("auto", "stream"):
        raise StageRefused(f"{url} is a URL: its mirror is streamed (to='stream' or 'auto'), not staged to={to!r}. "
                           "To stage it, copy it to local disk first (fsspec's fs.get) and open the copy.")
    try:
        source = RemoteSource(url)  # ImportError without fsspec, saying what to install
    except FileNotFoundError:
        raise NothingToOpen(f"nothing to open: {url}: no such file (fsspec finds nothing there)") from None
    name = url.rstrip("/").rsplit("/", 1)[-1] or "mirror.h5"
    directory = cache_folder(Path(name).stem)
    try:
        shell = directory / name
        holes = _shell(url, shell)
        vet(shell)
        dataset = drop_in(shell, split, transform=transform, target_transform=target_transform, output=output)
        cache_limit, how = limit_for(directory, cache_limit)
        caches = stream(dataset, cache_limit, directory / "cache", source=source)
        weakref.finalize(dataset, discard, directory, os.getpid())  # the shell too, once the dataset goes
    except BaseException:
        discard(directory, os.getpid())
        raise
    image_bytes = sum(n for _, n in holes)
    blocks = sum(len(c.sizes) for c in caches)
    dataset.account = "\n".join([
        f"{url} is a mirror ({human_bytes(source.size)}): its metadata ({human_bytes(source.size - image_bytes)}) "
        f"copied to {shell}, the image data left out (a sparse file)",
        f"streamed from {url} through a local cache of at most {human_bytes(cache_limit)} ({how}) at {directory}: "
        f"{blocks:,} blocks, fetched ahead along each epoch's order by colabfast.DataLoader",
        f"opened as {type(dataset).__name__}: {len(dataset):,} samples"
        + (f" in {len(dataset.classes)} classes" if getattr(dataset, "classes", None) else "")])
    return dataset


def _shell(url: str, shell: Path) -> list[tuple[int, int]]:
    """Write ``shell`` from the mirror at ``url`` in a child process; the image data's ``(offset, size)``
    ranges it left out."""
    child = python_child("from colabfast.opening.remote import _shell_main; _shell_main(sys.argv[1], sys.argv[2])")
    try:
        done = subprocess.run([*child, url, str(shell)], capture_output=True, text=True, timeout=SHELL_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise MirrorError(f"{url}: reading its HDF5 metadata did not finish in {SHELL_TIMEOUT:g} s (a slow link, or "
                          "libhdf5 looping on a corrupt file)") from None
    if done.returncode == 3:
        raise MirrorError(done.stdout.strip())
    if done.returncode == 4:  # this process found it (RemoteSource): a filesystem of its own, as memory:// is
        raise StageRefused(f"{url}: the child process that reads its metadata finds no such file, although this "
                           "process does: fsspec's memory:// (or another filesystem of this process alone) cannot "
                           "be streamed. Write the file to local disk or a bucket and open that")
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise MirrorError(f"{url}: the child process reading its metadata failed (exit {done.returncode}: {tail})")
    return [(int(a), int(n)) for a, n in json.loads(done.stdout)]


def _shell_main(url: str, shell: str) -> None:
    """The child of :func:`_shell`: the mirror's image data ranges (every 1-D uint8 ``images`` dataset, its
    contiguous storage) found with h5py on the fsspec file, the other bytes copied into ``shell`` (a
    sparse file of the mirror's size, written as ``.<name>.part`` and renamed), the ranges printed as
    JSON; exit 3 with the reason for a file that is not a mirror, 4 for no file."""
    import h5py
    import numpy as np

    try:
        import fsspec
    except ImportError:
        print(f"reading {url} needs fsspec: pip install 'colabfast[bucket]'")
        sys.exit(3)

    fs, remote = fsspec.core.url_to_fs(url)
    try:
        size = int(fs.info(remote)["size"])
    except FileNotFoundError:
        print(f"{url}: no such file")
        sys.exit(4)
    holes: list[tuple[int, int]] = []
    try:
        with fs.open(remote, "rb") as f, h5py.File(f, "r", locking=False) as h5:  # what else: vet() and drop_in()

            def visit(name: str, obj: Any) -> None:
                if (isinstance(obj, h5py.Dataset) and name.rsplit("/", 1)[-1] == "images" and obj.ndim == 1
                        and obj.dtype == np.uint8 and obj.id.get_offset() is not None):
                    holes.append((int(obj.id.get_offset()), int(obj.id.get_storage_size())))

            h5.visititems(visit)
    except OSError as exc:
        print(f"{url}: HDF5 cannot read its metadata ({exc}): not a mirror, or a corrupt one")
        sys.exit(3)
    holes.sort()
    if any(a < 0 or a + n > size for a, n in holes):
        print(f"{url}: its image data lies outside the file: a corrupt mirror")
        sys.exit(3)
    part = Path(shell).with_name(f".{Path(shell).name}.part")
    with fs.open(remote, "rb") as f, open(part, "wb") as out:
        out.truncate(size)  # sparse: the holes take no disk
        at = 0
        for a, n in [*holes, (size, 0)]:
            while at < a:
                f.seek(at)
                data = f.read(min(PIECE, a - at))
                if not data:
                    print(f"{url} ended at byte {at}, before its declared {size}: truncated while read")
                    sys.exit(3)
                out.seek(at)
                out.write(data)
                at += len(data)
            at = max(at, a + n)
        out.flush()
        os.fsync(out.fileno())
    os.replace(part, shell)
    print(json.dumps(holes))
