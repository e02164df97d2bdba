"""What the folder layouts share: listing the source folder, reading its files through Drive's
transient errors, an image's size from its header, and ``on_error``'s raise-or-skip rule."""

from __future__ import annotations

import io
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Optional, TypeVar

from PIL import Image

from colabfast.layouts._untrusted import Skipped, inside
from colabfast.layouts.base import LayoutError
from colabfast.where._fileio import FileEntry, read_regular, retry, scan_tree

T = TypeVar("T")
U = TypeVar("U")

ON_ERROR = ("raise", "skip")
WORKERS = 32  # parallel reads of annotation files: on Drive each file is a round trip


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")


def hidden(rel: str) -> bool:
    """A hidden file or one in a hidden folder (``._x.jpg``, ``.ipynb_checkpoints/``), left out as
    :func:`colabfast.layouts.images.is_image` leaves them out."""
    return any(part.startswith(".") for part in rel.split("/"))


def list_files(root: Path, retries: int) -> tuple[list[FileEntry], dict[str, str]]:
    """Every regular file under ``root`` but hidden ones, sorted (links followed, listed in parallel), and
    what a layout must refuse by path: ``"resolves outside ROOT"`` or ``"is not a regular file but a FIFO"``.
    """
    links: list[str] = []
    special: dict[str, str] = {}
    listed, _ = scan_tree(root, retries=retries, links=links, special=special)
    links = [rel for rel in links if not hidden(rel)]
    root_real = os.path.realpath(root)
    reals = parallel_map(lambda rel: retry(lambda: os.path.realpath(root / rel), retries), links)
    out = {rel for rel, real in zip(links, reals) if not inside(root_real, real)}

    def leaves(rel: str) -> bool:
        parts = rel.split("/")
        return any("/".join(parts[:k]) in out for k in range(1, len(parts) + 1))

    refused: dict[str, str] = {}
    files = []
    for rel, kind in special.items():
        if not hidden(rel):
            refused[rel] = f"resolves outside {root}" if out and leaves(rel) else f"is not a regular file but {kind}"
    for f in listed:
        if hidden(f.rel):
            continue
        if out and leaves(f.rel):
            refused[f.rel] = f"resolves outside {root}"
        else:
            files.append(f)
    return files, refused


def refuse(root: Path, rel: str, refused: dict[str, str]) -> LayoutError:
    """The error for reading ``rel``, a file :func:`list_files` refused."""
    return LayoutError(root / rel, refused[rel], fix='Replace it with a regular file inside the folder, or pass '
                       'on_error="skip" to leave it out')


def stem(rel: str) -> str:
    """``rel`` without its last extension (``a/b.c.png`` -> ``a/b.c``)."""
    root, ext = posixpath.splitext(rel)
    return root if ext else rel


def read_file(root: Path, rel: str, retries: int) -> bytes:
    """The bytes of ``root/rel``, a regular file, retrying Drive's transient errors."""
    return retry(lambda: read_regular(root / rel), retries)


def read_text(root: Path, entry: FileEntry, retries: int, limit: int, *, not_text: type[LayoutError] = LayoutError,
              fix: Optional[str] = None) -> str:
    """The UTF-8 text of an annotation file (a BOM dropped), refused over ``limit`` bytes before it is read.

    Raises:
        LayoutError: larger than ``limit`` bytes, or (``not_text``, with ``fix``) not UTF-8.
    """
    path = root / entry.rel
    if entry.size > limit:
        raise LayoutError(path, f"{entry.size} bytes, over the limit of {limit} for this kind of file",
                          fix="an annotation file this large is not one this layout reads")
    data = read_file(root, entry.rel, retries)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise not_text(path, f"not UTF-8 text (byte {exc.start})", data[: exc.start].count(b"\n") + 1,
                       fix=fix or "") from None


def image_size(data: bytes, path: Path) -> tuple[int, int]:
    """(width, height) in pixels of the encoded image ``data``, from its header (nothing decoded).

    Raises:
        LayoutError: ``data`` is not an image PIL reads, or one over PIL's decompression-bomb limit.
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            return img.size
    except (OSError, Image.DecompressionBombError, ValueError) as exc:
        raise LayoutError(path, f"not an image PIL can read ({exc})") from None


def parallel_map(fn: Callable[[T], U], items: Iterable[T]) -> list[U]:
    """``[fn(x) for x in items]``, in threads (reads from Drive overlap)."""
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="colabfast-layout") as pool:
        return list(pool.map(fn, items))


def reject(err: LayoutError, on_error: str, skipped: Skipped) -> None:
    """Raise ``err`` (``on_error="raise"``), or record it in ``skipped`` as ``(path, why)``."""
    if on_error == "raise":
        raise err
    skipped.add(err.path, err.why if err.line is None else f"line {err.line}: {err.why}")


def first_file(folder: Path, match: Callable[[str], bool]) -> Optional[str]:
    """The first non-hidden file name under ``folder`` (walked, links followed, each folder once) that
    ``match``es, or None; the walk stops there, so a hit costs a few listings."""
    stack, seen = [folder], set()
    while stack:
        try:
            top = stack.pop()
            st = top.stat()
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            with os.scandir(top) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        except OSError:
            continue
        for e in entries:
            if e.is_file() and match(e.name):
                return e.name
        stack.extend(Path(e.path) for e in reversed(entries) if e.is_dir())
    return None
