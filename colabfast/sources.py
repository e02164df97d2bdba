"""Reading a dataset's source layout (ImageFolder, KITTI, plain files) into a list of samples.

The sample order and class indices are torchvision's, so a mirror can stand in for
``torchvision.datasets.ImageFolder``. The folders are listed in parallel (one round trip per folder
on Drive) by :func:`colabfast._fileio.scan_tree`.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import posixpath
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from colabfast._fileio import FileEntry, PathLike, read_regular, retry, scan_tree
from colabfast.mirror import KITTI_CALIB_KEYS, KITTI_SPLITS

__all__ = ["Source", "Split", "KittiObjects", "detect_layout", "read_source", "is_image"]

# torchvision.datasets.folder.IMG_EXTENSIONS, matched case-insensitively as torchvision does.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")



def is_image(rel: str) -> bool:
    """An image file as ImageFolder sees one (extension), minus hidden files and folders.

    torchvision keeps a hidden name with an image extension (macOS ``._x.jpg`` AppleDouble files,
    ``.ipynb_checkpoints/``), then fails to decode it or takes it for a class; colabfast skips them.
    """
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
class Source:
    layout: str
    root: Path
    splits: list[Split]
    classes: Optional[list[str]] = None

    def describe(self) -> str:
        """E.g. ``"imagefolder layout, 1281167 images in 1000 classes"``."""
        n = sum(len(s.files) for s in self.splits)
        text = f"{self.layout} layout, {n} images"
        if self.classes is not None:
            text += f" in {len(self.classes)} classes"
        if self.layout == "kitti":
            text += " (" + ", ".join(f"{s.name} {len(s.files)}" for s in self.splits) + ")"
        return text


def _kitti_root(root: Path) -> Optional[Path]:
    for candidate in (root, root / "Kitti" / "raw"):  # the KITTI zips' layout, or torchvision's root
        if any((candidate / s / "image_2").is_dir() for s in KITTI_SPLITS):
            return candidate
    return None


def detect_layout(root: Path) -> str:
    """``"kitti"``, ``"imagefolder"`` (class sub-folders) or ``"files"`` (images, no class folders)."""
    if _kitti_root(root) is not None:
        return "kitti"
    if any(e.is_dir() and not e.name.startswith(".") for e in os.scandir(root)):
        return "imagefolder"
    return "files"


def read_source(
    src: Union[PathLike, Sequence[Union[PathLike, tuple[PathLike, Union[int, str]]]]],
    layout: str = "auto",
    workers: int = 32,
) -> Source:
    """Read ``src`` as a dataset of the given layout (``"auto"`` detects it).

    Args:
        src: a folder, or for ``layout="files"`` a list of image paths or of ``(path, label)`` pairs
            (labels all ints, or all strings, which become sorted classes).
        layout: ``"imagefolder"``, ``"kitti"``, ``"files"`` or ``"auto"``.
        workers: threads listing folders and reading label files.

    Raises:
        FileNotFoundError: the folder is missing, or holds no images.
        ValueError: an unknown layout, or a KITTI label line that does not have 15 fields.
    """
    if not isinstance(src, (str, os.PathLike)):
        if layout not in ("auto", "files"):
            raise ValueError(f"a list of files can only be packed with layout='files', not {layout!r}")
        return _files_from_list(list(src))
    root = Path(os.path.abspath(src))
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder: pack() reads a dataset folder (or a list of files)")
    if layout == "auto":
        layout = detect_layout(root)
    if layout == "kitti":
        return _kitti(root, workers)
    files, dirs = scan_tree(root, workers)
    if layout == "imagefolder":
        return _imagefolder(root, files, dirs)
    if layout == "files":
        images = [f for f in files if is_image(f.rel)]
        if not images:
            raise FileNotFoundError(f"no image files ({', '.join(IMG_EXTENSIONS)}) under {root}")
        return Source("files", root, [Split("", root, images, targets=np.full(len(images), -1, np.int64))])
    raise ValueError(f"layout must be 'auto', 'imagefolder', 'kitti' or 'files', not {layout!r}")


def _imagefolder(root: Path, files: list[FileEntry], dirs: list[str]) -> Source:
    # torchvision.datasets.folder.find_classes + make_dataset: classes are the sorted sub-folders;
    # within a class, os.walk roots in sorted order, then sorted file names.
    classes = sorted(d for d in dirs if "/" not in d and not d.startswith("."))
    if not classes:
        raise FileNotFoundError(f"no class folders in {root}: the imagefolder layout is root/<class>/<image>")
    index = {c: i for i, c in enumerate(classes)}
    keyed = []
    for f in files:
        cls = f.rel.split("/", 1)[0]
        if cls in index and is_image(f.rel):
            folder, name = posixpath.split(f.rel)
            keyed.append(((index[cls], folder, name), f))
    keyed.sort(key=lambda item: item[0])
    found = {key[0] for key, _ in keyed}
    empty = [c for c in classes if index[c] not in found]
    if empty:
        raise FileNotFoundError(f"no images in the class folders {', '.join(empty)} under {root} "
                                f"(image extensions: {', '.join(IMG_EXTENSIONS)})")
    targets = np.array([key[0] for key, _ in keyed], dtype=np.int64)
    return Source("imagefolder", root, [Split("", root, [f for _, f in keyed], targets=targets)], classes)


def _files_from_list(items: list) -> Source:
    if not items:
        raise FileNotFoundError("pack() was given an empty list of files")
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
        raise ValueError("labels must be all ints, all strings, or absent")
    return Source("files", root, [Split("", root, files, targets=targets)], classes)


def _kitti(root: Path, workers: int) -> Source:
    base = _kitti_root(root)
    if base is None:
        raise FileNotFoundError(f"no KITTI layout under {root}: expected training/image_2 (and label_2) "
                                "or testing/image_2, as in data_object_image_2.zip")
    splits = []
    for name in KITTI_SPLITS:
        image_dir = base / name / "image_2"
        if not image_dir.is_dir():
            continue
        files, _ = scan_tree(image_dir, workers)
        images = [FileEntry(f"{name}/image_2/{f.rel}", f.size, f.mtime_ns) for f in files
                  if "/" not in f.rel and is_image(f.rel)]
        stems = [posixpath.basename(f.rel).split(".")[0] for f in images]  # torchvision's stem rule
        split = Split(name, base, images)
        with ThreadPoolExecutor(workers) as pool:
            if name == "training":
                texts = _read_texts(pool, base / name / "label_2", stems)
                missing = [s for s, t in zip(stems, texts) if t is None]
                if missing:
                    raise FileNotFoundError(f"{len(missing)} training images have no label file in "
                                            f"{base / name / 'label_2'}, e.g. {missing[0]}.txt")
                split.objects = _parse_labels(texts, stems, base / name / "label_2")
            calib_texts = _read_texts(pool, base / name / "calib", stems)
        if any(t is not None for t in calib_texts):
            split.calib = _parse_calib(calib_texts)
        splits.append(split)
    return Source("kitti", base, splits)


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
                raise ValueError(f"{folder / (stem + '.txt')}: a KITTI label line has 15 fields, "
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
