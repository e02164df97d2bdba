"""The image layouts packed into an image mirror (format version 2): ``"imagefolder"`` (torchvision's
``ImageFolder``), ``"kitti"`` (torchvision's ``Kitti``) and ``"files"`` (images without classes).

Order and class indices are torchvision's; folders are listed in parallel, links followed but never a
loop; hidden files and folders are left out, and reported.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

import numpy as np

from colabfast.errors import LayoutError, PackRefused, SourceNotAFolder, SourceNotFound
from colabfast.layouts.base import BaseLayout
from colabfast.layouts.registry import register
from colabfast.layouts.tree import SPLIT_FOLDERS, Tree, split_folders, tree_of
from colabfast.mirror.format import FILES, IMAGEFOLDER, KITTI, KITTI_CALIB_KEYS, KITTI_SPLITS
from colabfast.where._fileio import FileEntry, PathLike, read_regular, retry, scan_tree

__all__ = ["ImageLayout", "ImageFolderLayout", "FilesLayout", "KittiLayout", "ImageListing", "Split", "KittiObjects",
           "split_folders", "SPLIT_FOLDERS", "read_source", "is_image", "IMG_EXTENSIONS"]

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively as torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")



def is_image(rel: str) -> bool:
    """An image file as ImageFolder sees one (extension), minus hidden files and folders (``._x.jpg``)."""
    return rel.lower().endswith(IMG_EXTENSIONS) and not any(part.startswith(".") for part in rel.split("/"))


@dataclasses.dataclass
class KittiObjects:
    """Per-object label columns of one KITTI split (see :mod:`colabfast.mirror`)."""

    offsets: np.ndarray  # int64 [N + 1]
    type: list[str]
    truncated: np.ndarray  # float64 [M]
    occluded: np.ndarray  # int64 [M]
    alpha: np.ndarray  # float64 [M]
    bbox: np.ndarray  # float64 [M, 4]
    dimensions: np.ndarray  # float64 [M, 3]
    location: np.ndarray  # float64 [M, 3]
    rotation_y: np.ndarray  # float64 [M]


@dataclasses.dataclass
class Split:
    """The samples of one split, in the source's order."""

    name: str  # "" for imagefolder/files, "training"/"testing" for kitti
    root: Path  # the folder ``files`` are relative to
    files: list[FileEntry]
    targets: Optional[np.ndarray] = None  # int64 [N]
    objects: Optional[KittiObjects] = None
    calib: Optional[dict[str, np.ndarray]] = None  # key -> float64 [N, k]


@dataclasses.dataclass
class ImageListing:
    """The samples of an image layout's folder (or list of files), listed: what its mirror holds."""

    layout: str
    root: Path
    splits: list[Split]
    classes: Optional[list[str]] = None
    # (path, why) of what was left out: hidden files and folders that torchvision's ImageFolder
    # would read (see is_image), and sub-folders that cannot be listed (whose images are unknown)
    hidden: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    unreadable: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def describe(self) -> str:
        """E.g. ``"imagefolder layout, 1281167 images in 1000 classes"``."""
        n = sum(len(s.files) for s in self.splits)
        text = f"{self.layout} layout, {n} images"
        if self.classes is not None:
            text += f" in {len(self.classes)} classes"
        if self.layout == KITTI:
            text += " (" + ", ".join(f"{s.name} {len(s.files)}" for s in self.splits) + ")"
        return text


def _kitti_root(tree: Tree) -> Optional[str]:
    """Where in ``tree`` KITTI's split folders are: its root (the KITTI zips' layout) or
    ``Kitti/raw`` (torchvision's root); None for neither."""
    for candidate in ("", "Kitti/raw"):
        if any(tree.is_dir(f"{candidate}/{s}/image_2".lstrip("/")) for s in KITTI_SPLITS):
            return candidate
    return None


def read_source(
    src: Union[PathLike, Sequence[Union[PathLike, tuple[PathLike, Union[int, str]]]]],
    layout: str = "auto",
    workers: int = 32,
) -> ImageListing:
    """Read ``src`` as a dataset of the given layout (``"auto"`` detects it).

    Args:
        src: a folder, or for ``layout="files"`` a list of image paths or of ``(path, label)`` pairs
            (labels all ints, or all strings, which become sorted classes).
        layout: ``"imagefolder"``, ``"kitti"``, ``"files"`` or ``"auto"``.
        workers: threads listing folders and reading label files.

    Raises:
        FileNotFoundError: the folder is missing, or holds no images.
        NotADirectoryError: ``src`` is a file that is not an archive.
        ValueError: an unknown layout, or a KITTI label line that does not have 15 fields.
    """
    if not isinstance(src, (str, os.PathLike)):
        if layout not in ("auto", FILES):
            raise PackRefused(f"a list of files can only be packed with layout='files', not {layout!r}")
        return _files_from_list(list(src))
    root = Path(os.path.abspath(src))
    if not root.is_dir():
        if root.exists():
            raise SourceNotAFolder(f"{root} is a file, not a dataset folder or an archive: pack reads a folder, "
                                   f"a .zip, .tar, .tar.gz, .tgz, .tar.bz2 or .tar.xz archive, or a list of files")
        raise SourceNotFound(f"{root} does not exist: check the path (on Drive: /content/drive/MyDrive/...)")
    from colabfast.layouts.registry import REGISTRY, detect_layout

    cls = detect_layout(root) if layout == "auto" else REGISTRY.get(layout)
    if not (isinstance(cls, type) and issubclass(cls, ImageLayout)):
        names = ", ".join(repr(n) for n, c in REGISTRY.items() if issubclass(c, ImageLayout) and c.packed == "images")
        raise PackRefused(f"layout must be 'auto' or a layout of image folders ({names}), not {layout!r}")
    return cls.read(root, workers)


def _read_tree(root: Path, workers: int, layout: str) -> ImageListing:
    """An ImageFolder tree, or a folder of images (``files``), listed."""
    errors: dict[str, OSError] = {}
    files, dirs = scan_tree(root, workers, unreadable=errors, revisit=True)
    unreadable = {rel: exc for rel, exc in errors.items() if not _hidden_part(rel)}  # hidden: left out anyway
    if layout == ImageFolderLayout.name:
        source = _imagefolder(root, files, dirs, unreadable)
    else:
        images = [f for f in files if is_image(f.rel)]
        if not images:
            raise SourceNotFound(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {root}")
        source = ImageListing(layout, root, [Split("", root, images, targets=np.full(len(images), -1, np.int64))])
    source.hidden = _hidden(root, files, dirs, layout == ImageFolderLayout.name)
    source.unreadable = [(str(root / rel), f"folder cannot be listed ({exc.strerror or exc}): its images are unknown")
                         for rel, exc in sorted(unreadable.items())]
    return source


def _hidden_part(rel: str) -> Optional[int]:
    """The index of the first hidden component of ``rel`` (a POSIX relative path), or None."""
    return next((k for k, part in enumerate(rel.split("/")) if part.startswith(".")), None)


def _hidden(root: Path, files: list[FileEntry], dirs: list[str], classes: bool,
            reader: str = "torchvision's ImageFolder") -> list[tuple[str, str]]:
    """``(path, why)`` for each hidden file or folder torchvision would read and colabfast leaves out."""
    held: dict[str, int] = {}  # the topmost hidden entry -> image files it holds
    if classes:
        held.update((d, 0) for d in dirs if "/" not in d and d.startswith("."))
    for f in files:
        k = _hidden_part(f.rel)
        if k is None or not f.rel.lower().endswith(IMG_EXTENSIONS) or (classes and "/" not in f.rel):
            continue  # an image file beside the class folders is read by neither
        top = "/".join(f.rel.split("/")[: k + 1])
        held[top] = held.get(top, 0) + 1
    folders = set(dirs)
    left_out = []
    for rel, n in sorted(held.items()):
        if rel not in folders:
            why = f"hidden file, left out ({reader} reads it)"
        elif classes and "/" not in rel:
            held_images = f", with {_images(n)}" if n else ""
            why = f"hidden folder, not taken for a class ({reader} takes it for one{held_images})"
        else:
            why = f"hidden folder, its {_images(n)} left out ({reader} reads them)"
        left_out.append((str(root / rel), why))
    return left_out


def _images(n: int) -> str:
    return f"{n} image" + ("" if n == 1 else "s")


def _imagefolder(root: Path, files: list[FileEntry], dirs: list[str], unreadable: dict[str, OSError]) -> ImageListing:
    # torchvision.datasets.folder.find_classes + make_dataset: classes are the sorted sub-folders
    # (one that cannot be listed too); within a class, os.walk roots in sorted order, then sorted
    # file names.
    classes = sorted(d for d in [*dirs, *unreadable] if "/" not in d and not d.startswith("."))
    if not classes:
        raise SourceNotFound(f"no class folders in {root}: the imagefolder layout is root/<class>/<image>")
    index = {c: i for i, c in enumerate(classes)}
    keyed = []
    for f in files:
        cls = f.rel.split("/", 1)[0]
        if cls in index and is_image(f.rel):
            folder, name = posixpath.split(f.rel)
            keyed.append(((index[cls], folder, name), f))
    keyed.sort(key=lambda item: item[0])
    found = {key[0] for key, _ in keyed}
    empty = [c for c in classes if index[c] not in found and c not in unreadable]
    if empty:
        raise SourceNotFound(f"no images in the class folders {', '.join(empty)} under {root} "
                             f"(image extensions: {', '.join(IMG_EXTENSIONS)})")
    targets = np.array([key[0] for key, _ in keyed], dtype=np.int64)
    return ImageListing(IMAGEFOLDER, root, [Split("", root, [f for _, f in keyed], targets=targets)], classes)


def _files_from_list(items: list) -> ImageListing:
    if not items:
        raise SourceNotFound("pack() was given an empty list of files")
    pairs = [item if isinstance(item, tuple) else (item, None) for item in items]
    paths = [Path(os.path.abspath(p)) for p, _ in pairs]
    root = Path(os.path.commonpath([str(p.parent) for p in paths]))
    files = []
    for p in paths:
        st = p.stat()
        files.append(FileEntry(p.relative_to(root).as_posix(), st.st_size, st.st_mtime_ns))
    labels = [label for _, label in pairs]
    classes = None
    if all(label is None for label in labels):
        targets = np.full(len(files), -1, np.int64)
    elif all(isinstance(label, str) for label in labels):
        classes = sorted(set(labels))
        targets = np.array([classes.index(label) for label in labels], dtype=np.int64)
    elif all(isinstance(label, (int, np.integer)) for label in labels):
        targets = np.array(labels, dtype=np.int64)
    else:
        raise PackRefused("labels must be all ints, all strings, or absent")
    return ImageListing(FILES, root, [Split("", root, files, targets=targets)], classes)


def _kitti(root: Path, workers: int) -> ImageListing:
    where = _kitti_root(tree_of(root))
    base = root / where if where is not None else None
    if base is None:
        raise SourceNotFound(f"no KITTI layout under {root}: expected training/image_2 (and label_2) "
                             "or testing/image_2, as in data_object_image_2.zip")
    splits, hidden = [], []
    for name in KITTI_SPLITS:
        image_dir = base / name / "image_2"
        if not image_dir.is_dir():
            continue
        files, _ = scan_tree(image_dir, workers, unreadable={})  # only its own files count, not sub-folders'
        hidden += _hidden(image_dir, [f for f in files if "/" not in f.rel], [], False, "torchvision's Kitti")
        images = [FileEntry(f"{name}/image_2/{f.rel}", f.size, f.mtime_ns) for f in files
                  if "/" not in f.rel and is_image(f.rel)]
        stems = [posixpath.basename(f.rel).split(".")[0] for f in images]  # torchvision's stem rule
        split = Split(name, base, images)
        with ThreadPoolExecutor(workers) as pool:
            if name == "training":
                texts = _read_texts(pool, base / name / "label_2", stems)
                missing = [s for s, t in zip(stems, texts) if t is None]
                if missing:
                    raise SourceNotFound(f"{len(missing)} training images have no label file in "
                                         f"{base / name / 'label_2'}, e.g. {missing[0]}.txt")
                split.objects = _parse_labels(texts, stems, base / name / "label_2")
            calib_texts = _read_texts(pool, base / name / "calib", stems)
        if any(t is not None for t in calib_texts):
            split.calib = _parse_calib(calib_texts)
        splits.append(split)
    return ImageListing(KITTI, base, splits, hidden=hidden)


def _read_texts(pool: ThreadPoolExecutor, folder: Path, stems: list[str]) -> list[Optional[str]]:
    """The text of ``folder/<stem>.txt`` for each stem (None where missing), read in parallel."""

    def read(stem: str) -> Optional[str]:
        try:
            return retry(lambda: read_regular(folder / f"{stem}.txt"), 5).decode("utf-8")
        except FileNotFoundError:
            return None

    return list(pool.map(read, stems))


def _parse_labels(texts: list[Optional[str]], stems: list[str], folder: Path) -> KittiObjects:
    """Parse label_2 files exactly as torchvision.datasets.Kitti._parse_target does."""
    offsets, rows = [0], []
    for text, stem in zip(texts, stems):
        for line in csv.reader(io.StringIO(text or ""), delimiter=" "):
            if not line:
                continue  # torchvision would fail on a blank line; there is nothing in it to keep
            if len(line) < 15:
                raise LayoutError(folder / (stem + ".txt"), f"a KITTI label line has 15 fields, "
                                  f"this one has {len(line)}: {' '.join(line)!r}")
            rows.append(line)
        offsets.append(len(rows))

    def col(i: int, j: Optional[int] = None) -> np.ndarray:
        # Python's float(), as torchvision uses, so stored values are bit-identical to its parse.
        if j is None:
            return np.array([float(r[i]) for r in rows], dtype=np.float64)
        return np.array([[float(x) for x in r[i:j]] for r in rows], dtype=np.float64).reshape(len(rows), j - i)

    return KittiObjects(
        offsets=np.array(offsets, dtype=np.int64), type=[r[0] for r in rows], truncated=col(1),
        occluded=np.array([int(r[2]) for r in rows], dtype=np.int64), alpha=col(3), bbox=col(4, 8),
        dimensions=col(8, 11), location=col(11, 14), rotation_y=col(14),
    )


def _parse_calib(texts: list[Optional[str]]) -> dict[str, np.ndarray]:
    width = {k: (9 if k == "R0_rect" else 12) for k in KITTI_CALIB_KEYS}
    out = {k: np.full((len(texts), n), np.nan) for k, n in width.items()}
    for i, text in enumerate(texts):
        for line in (text or "").splitlines():
            key, _, values = line.partition(":")
            if key in out:
                numbers = [float(v) for v in values.split()]
                out[key][i, : len(numbers)] = numbers[: width[key]]
    return out


class ImageLayout(BaseLayout):
    """A layout packed into an image mirror (see the module's docstring): :meth:`read` lists its folder."""

    packed = "images"
    streams: ClassVar[bool] = False  # from an archive: read as one stream (else extracted, then read)
    # What a layout that streams says of an archive (colabfast.packing.archivesource.ArchiveSource reads it):
    archive_kinds: ClassVar[tuple[str, ...]] = ("tar", "zip")  # the archives it reads
    archive_prefix: ClassVar[str] = ""  # the folder inside the archive its images are in
    inner_tars: ClassVar[bool] = False  # a tar of per-class tars, each opened as it is met
    about_archive: ClassVar[str] = ""  # what the archive is, in words

    @classmethod
    def archive_labels(cls, path: Path, read: Callable[[str], bytes], labels: Optional[PathLike]) -> Any:
        """The labels of the archive at ``path``: None (its folders name the classes), or an object with
        ``origin`` and optionally ``class_names``.

        Raises:
            PackRefused: a ``labels=`` file, which this layout does not read.
        """
        if labels is not None:
            raise PackRefused(f"labels={os.fspath(labels)!r}: the {cls.name} layout takes its classes from the "
                              "archive's folders; labels= is ImageNet's devkit, for its validation tar")
        return None

    @classmethod
    def archive_paths(cls, names: list[str], labels: Any, path: Path) -> list[str]:
        """``<class>/<file>`` for each image streamed as ``names`` (in archive order)."""
        raise NotImplementedError

    catch_all: ClassVar[bool] = False  # reads what no other layout reads: asked after the others of its kind

    @classmethod
    def read(cls, root: Path, workers: int = 32) -> ImageListing:
        """The samples of the folder ``root``, listed (no image read), in the image mirror's ``layout``.

        Raises:
            FileNotFoundError: it holds no images (or, for KITTI, a training image without a label file).
            LayoutError: a malformed annotation (a KITTI label line that does not have 15 fields).
        """
        raise NotImplementedError


@register
class KittiLayout(ImageLayout):
    """KITTI object detection as torchvision's ``Kitti`` reads it: ``training/image_2`` + ``label_2``
    (+ ``calib``) and/or ``testing/image_2``; its mirror holds both splits."""

    name = KITTI

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if ``tree`` holds ``training/image_2`` or ``testing/image_2``, at its top or under
        ``Kitti/raw`` (torchvision's root)."""
        return _kitti_root(tree_of(tree)) is not None

    @classmethod
    def read(cls, root: Path, workers: int = 32) -> ImageListing:
        return _kitti(root, workers)

    @classmethod
    def split_args(cls, split: Optional[str]) -> dict:
        """``{"train": ...}`` for ``split`` ``"training"`` (or None) or ``"testing"``, as ``Kitti(train=)``.

        Raises:
            PackRefused: (a ``ValueError``) another ``split``.
        """
        if split not in (None, *KITTI_SPLITS):
            raise PackRefused(f"split={split!r}: a KITTI mirror holds {' and '.join(KITTI_SPLITS)} (default training)")
        return {"train": split != "testing"}


@register
class ImageFolderLayout(ImageLayout):
    """torchvision's ``ImageFolder``: one sub-folder per class (ImageNet's ``train/``)."""

    name = IMAGEFOLDER
    streams = True
    catch_all = True
    about_archive = "an ImageFolder tree in an archive"

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if ``tree`` holds a folder (hidden ones aside); an archive that cannot be listed (a
        tar) is read as an ImageFolder tree."""
        tree = tree_of(tree)
        return not tree.listed or any(tree.entries().values())

    @classmethod
    def read(cls, root: Path, workers: int = 32) -> ImageListing:
        return _read_tree(root, workers, cls.name)

    @classmethod
    def archive_paths(cls, names: list[str], labels: Any, path: Path) -> list[str]:
        """The names below the folders they all share, each in its class folder.

        Raises:
            FileNotFoundError: an image that is in no class folder."""
        parts = [n.split("/") for n in names]
        depth = 0
        while all(len(p) > depth + 2 for p in parts) and len({p[depth] for p in parts}) == 1:
            depth += 1
        rels = ["/".join(p[depth:]) for p in parts]
        bad = next((r for r in rels if "/" not in r), None)
        if bad is not None:
            raise SourceNotFound(f"{path}: {bad!r} is not in a class folder: an ImageFolder archive holds "
                                 "<class>/<image> (for ImageNet's validation tar pass labels=devkit)")
        return rels


@register
class FilesLayout(ImageLayout):
    """A folder (or list) of images without classes: an ``H5ImageFolder`` whose targets are -1 (or the
    labels given to pack), as no torchvision class reads a flat folder."""

    name = FILES
    catch_all = True

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True for any folder: what no other layout reads is its images."""
        return True

    @classmethod
    def read(cls, root: Path, workers: int = 32) -> ImageListing:
        return _read_tree(root, workers, cls.name)

