"""An image dataset inside an archive, read as one sequential stream: :class:`ArchiveSource`.

Never extracted: the archive is read front to back (parallel readahead), inner per-class tars opened as met,
each image's bytes going straight to the packer; labels and order are torchvision's (``ImageNet``,
``ImageFolder``). Member names are checked (:func:`colabfast.staging.extract.safe_relpath`), tar headers bounded
(:func:`colabfast.staging.extract.open_tar`), links and special files never read, inner tars one level deep, and
no member over :data:`MAX_IMAGE` read into memory.
"""

from __future__ import annotations

import io
import os
import posixpath
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Collection, Iterator, NamedTuple, Optional, Union

import numpy as np

from colabfast.errors import ArchiveReadError, PackRefused, SourceNotFound
from colabfast.layouts.images import is_image
from colabfast.mirror.format import IMAGEFOLDER
from colabfast.staging.extract import archive_suffix, decompressed, open_tar, safe_relpath
from colabfast.where._fileio import ReadaheadFile, retry

__all__ = ["ArchiveReadError", "ArchiveSource", "Position"]

MAX_IMAGE = 256 << 20  # bytes: a bigger member is reported as unreadable, never read into memory


class Position(NamedTuple):
    """Where a stream resumes: the outer member (tar: its header's byte offset; zip: its index among
    the images) and how many images inside it are done (an inner tar's images; 1 for a plain image)."""

    member: int
    done: int


class ArchiveSource:
    """An image dataset inside an archive, read by the registered layout that streams it (its labels,
    folder and torchvision paths: `colabfast.layouts.ImageLayout`'s ``archive_*``).

    Args:
        path: the archive.
        layout: a registered layout that streams (``"imagefolder"``, ``"imagenet-train"``, ``"kaggle-val"``,
            ...), or ``"auto"``: the one `colabfast.layouts.detect_layout` sees in it.
        split: for ``"auto"``: Kaggle's zip's part (``"train"`` or ``"val"``).
        labels: ImageNet's devkit ``ILSVRC2012_devkit_t12.tar.gz`` (or its unpacked folder): the
            validation archive's labels; for the training archive, class names.
        retries: retries of each read for transient mount errors.
        prefix: the folder inside the archive that is read (a split's), ending in ``/``.

    Raises:
        FileNotFoundError: the archive or labels are missing, or the archive holds no images.
        colabfast.packing.PackRefused: (a ``ValueError``) a layout that does not fit the archive, or
            validation images without labels.
    """

    def __init__(self, path: Union[str, os.PathLike], layout: str = "auto", split: Optional[str] = None,
                 labels: Union[str, os.PathLike, None] = None, retries: int = 5, prefix: str = ""):
        from colabfast.layouts import ImageLayout, detect_layout, layout_class
        from colabfast.layouts.tree import tree_of

        self.path = Path(os.path.abspath(path))
        if not self.path.is_file():
            raise SourceNotFound(f"{self.path} is not a file")
        self.retries = retries
        self.is_zip = archive_suffix(self.path) == ".zip"
        kind = "zip" if self.is_zip else "tar"
        if layout == "auto":
            tree = tree_of(self.path, retries)
            if not tree.listed and tree.first is None:
                raise SourceNotFound(f"{self.path} holds no files")
            cls = detect_layout(tree, labels, split)
            if not (issubclass(cls, ImageLayout) and cls.streams and kind in cls.archive_kinds):
                cls = layout_class(IMAGEFOLDER)  # read as one stream, an archive of images is an ImageFolder tree
        else:
            cls = layout_class(layout)
        if not (issubclass(cls, ImageLayout) and cls.streams and kind in cls.archive_kinds):
            reads = " or ".join(getattr(cls, "archive_kinds", ())) or "no archive as one stream"
            raise PackRefused(f"layout {cls.name!r} reads {reads}, and {self.path} is a {kind}")
        if split is not None and not cls.packs_split:
            raise PackRefused(f"split={split!r} only applies to Kaggle's zip (its part) and to an archive of split "
                              f"folders; {self.path} is read whole as layout {cls.name!r}")
        self.kind, self.layout = cls, cls.name
        self._prefix = prefix + cls.archive_prefix
        self._zip_members: Optional[list[zipfile.ZipInfo]] = None
        if self.is_zip:
            with self._open_plain() as f:
                try:
                    zf = zipfile.ZipFile(f)
                except zipfile.BadZipFile as exc:
                    raise ArchiveReadError(self.path, "(the central directory at its end)", str(exc)) from exc
                with zf:
                    infos = zf.infolist()
                    for info in infos:
                        safe_relpath(self.path, info.filename)
                    self.labels = cls.archive_labels(self.path, zf.read, labels)
            self._zip_members = self._images_of(infos)
        else:
            self.labels = cls.archive_labels(self.path, _no_members, labels)

    # --- looking at the archive -----------------------------------------------------------------

    def _open(self) -> tuple[ReadaheadFile, io.BufferedReader]:
        raw = ReadaheadFile(self.path, retries=self.retries)
        return raw, io.BufferedReader(raw, 1 << 20)

    def _open_plain(self) -> io.BufferedReader:
        """For a look at the start or the end: no readahead (it would fetch 32 MB of what comes next)."""
        return retry(lambda: open(self.path, "rb"), self.retries)

    def _images_of(self, infos: list[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
        """A zip's images under the prefix, in file order (one forward pass), last copies only."""
        wanted = [i for i in infos if not i.is_dir() and i.filename.startswith(self._prefix) and is_image(i.filename)]
        wanted.sort(key=lambda i: i.header_offset)
        wanted = _last_copies(self.path, wanted)
        if not wanted:
            raise SourceNotFound(f"no images under {self._prefix or 'the top'} of {self.path}")
        return wanted

    def describe(self) -> str:
        what = self.kind.about_archive or f"a {self.layout} layout in an archive"
        return what + (f"; labels from {self.labels.origin}" if self.labels is not None else "")

    # --- the stream ------------------------------------------------------------------------------

    def images(self, start: Position = Position(0, 0),  # noqa: B008 (an immutable tuple)
               on_bytes: Optional[Callable[[int], None]] = None) -> Iterator[tuple[str, Union[bytes, str], Position]]:
        """Yield ``(name, bytes or error message, position after it)`` for each image, in archive order.

        Names are member paths (``n01440764/n01440764_10026.JPEG``); a member too large to be an
        image yields an error message instead of bytes.

        Raises:
            ArchiveReadError: the archive ends early or is corrupt; names the member.
            UnsafeArchiveError: a member name is absolute or climbs out with ``..``.
            OSError: reading failed after the retries.
        """
        raw, f = self._open()
        report = (lambda: on_bytes(raw.tell())) if on_bytes else (lambda: None)
        with raw, f:
            if self.is_zip:
                yield from self._zip_images(f, start, report)
            else:
                yield from self._tar_images(f, start, report)
            report()

    def _zip_images(self, f: io.BufferedReader, start: Position, report: Callable[[], None]):
        assert self._zip_members is not None
        with zipfile.ZipFile(f) as zf:
            for k in range(start.member, len(self._zip_members)):
                info = self._zip_members[k]
                name = info.filename[len(self._prefix):]
                if info.file_size > MAX_IMAGE:
                    data: Union[bytes, str] = f"{info.file_size} bytes: too large to be an image"
                else:
                    try:
                        data = zf.read(info)
                    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError) as exc:
                        raise ArchiveReadError(self.path, info.filename, f"{type(exc).__name__}: {exc}") from exc
                report()
                yield name, data, Position(k + 1, 0)

    def _tar_images(self, f: io.BufferedReader, start: Position, report: Callable[[], None]):
        compressed = archive_suffix(self.path) != ".tar"
        if start.member and not compressed:
            f.seek(start.member)  # tarfile starts at the current offset: resume without reading what is done
        current = "(the archive's start)"
        with decompressed(f) as stream:
            try:
                tar = open_tar(self.path, stream)
                for member in tar:
                    current = member.name
                    name = safe_relpath(self.path, member.name)
                    if member.offset < start.member or not member.isfile():
                        continue  # done before (compressed: passed over by reading), or a link, folder, device
                    skip = start.done if member.offset == start.member else 0
                    if self.kind.inner_tars and name.endswith(".tar"):
                        yield from self._inner_tar(tar, member, name, skip, report)
                    elif is_image(name) and name.startswith(self._prefix) and not skip:
                        yield name, self._read(tar, member), Position(member.offset, 1)
                    report()
                _check_end(tar, stream)
            except (tarfile.TarError, EOFError, zlib.error) as exc:
                raise ArchiveReadError(self.path, current, f"{type(exc).__name__}: {exc}") from exc

    def _inner_tar(self, tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, skip: int,
                   report: Callable[[], None]):
        wnid = posixpath.basename(name)[: -len(".tar")]
        inner_file = tar.extractfile(member)
        assert inner_file is not None
        current = name
        try:
            with open_tar(self.path, inner_file) as inner:
                done = 0
                for m in inner:
                    current = f"{name}/{m.name}"
                    inner_name = safe_relpath(self.path, current)[len(name) + 1:]
                    if not (m.isfile() and is_image(inner_name)):
                        continue  # never a nested tar: one level deep only
                    done += 1
                    if done <= skip:
                        continue
                    data = self._read(inner, m)
                    yield f"{wnid}/{posixpath.basename(inner_name)}", data, Position(member.offset, done)
                    report()
                _check_end(inner, inner_file)
        except (tarfile.TarError, EOFError) as exc:
            raise ArchiveReadError(self.path, current, f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> Union[bytes, str]:
        if member.size > MAX_IMAGE:
            return f"{member.size} bytes: too large to be an image"
        f = tar.extractfile(member)
        assert f is not None
        return f.read()

    # --- labels and order ---------------------------------------------------------------------------

    @staticmethod
    def superseded(names: list[str]) -> list[int]:
        """Indices into ``names`` (streamed, in archive order) of images whose name the archive repeats
        later: tar and unzip keep the last copy, so the mirror does too (a zip's earlier copies are
        never streamed)."""
        last = {name: j for j, name in enumerate(names)}
        return [j for j, name in enumerate(names) if last[name] != j]

    def samples(self, names: list[str],
                skip: Collection[int] = ()) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
        """torchvision's view of the images streamed as ``names`` (in archive order).

        Args:
            names: the streamed images' names.
            skip: indices into ``names`` of images left out of torchvision's view: the earlier
                copies of a repeated name (:meth:`superseded`).

        Returns:
            ``(paths, targets, classes, order)``: ``paths`` (``<class>/<file>``) and ``targets``
            (int64 [N], the images not skipped) in torchvision's order, ``classes`` the sorted class
            folders (ImageNet's ``wnids``), and ``order`` (int64 [len(names)]): each streamed image's
            torchvision index, -1 for a skipped one.

        Raises:
            FileNotFoundError: no images, or no class folders.
            ValueError: validation labels that do not cover the images.
        """
        skipped = set(skip)
        kept = [j for j in range(len(names)) if j not in skipped]
        paths, targets, classes, kept_order = self._samples([names[j] for j in kept])
        order = np.full(len(names), -1, dtype=np.int64)
        order[kept] = kept_order
        return paths, targets, classes, order

    def _samples(self, names: list[str]) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
        if not names:
            raise SourceNotFound(f"no images in {self.path}")
        rels = self.kind.archive_paths(names, self.labels, self.path)
        classes = sorted({r.split("/", 1)[0] for r in rels})
        index = {c: i for i, c in enumerate(classes)}
        keys = [(index[r.split("/", 1)[0]], *posixpath.split(r)) for r in rels]
        sorted_idx = sorted(range(len(rels)), key=lambda i: keys[i])  # ImageFolder: class, folder, file
        order = np.empty(len(rels), dtype=np.int64)
        order[sorted_idx] = np.arange(len(rels))
        paths = [rels[i] for i in sorted_idx]
        targets = np.array([keys[i][0] for i in sorted_idx], dtype=np.int64)
        return paths, targets, classes, order

    def class_names(self, classes: list[str]) -> Optional[list[tuple[str, ...]]]:
        """torchvision ImageNet's ``classes`` (a tuple of names per WordNet id), when labels are known."""
        names = getattr(self.labels, "class_names", None)
        if names is None:
            return None
        return [names.get(c, (c,)) for c in classes]


def _check_end(tar: tarfile.TarFile, stream) -> None:
    """tarfile takes a stream cut at a member boundary for a complete archive; a real one ends in a zero
    block, which tarfile has just read when it stopped (so the stream is a block past the last member)."""
    if stream.tell() < tar.offset + tarfile.BLOCKSIZE:
        members = tar.getmembers()  # all read by now: the iteration has ended
        last = members[-1].name if members else "(none)"
        raise tarfile.ReadError(f"the archive ends without its end-of-archive block, after {last!r}")


def _last_copies(archive: Path, infos: list[zipfile.ZipInfo]) -> list[zipfile.ZipInfo]:
    """``infos`` (in file order) without the earlier copies of a repeated name: unzip, like
    :func:`colabfast.staging.extract.extract`, leaves the last copy written."""
    key = [safe_relpath(archive, i.filename) for i in infos]  # "./a/x.jpg" is written as "a/x.jpg"
    last = {k: j for j, k in enumerate(key)}
    return [i for j, i in enumerate(infos) if last[key[j]] == j]


def _no_members(name: str) -> bytes:
    raise KeyError(name)  # a tar's members are met as it is read, not looked up
