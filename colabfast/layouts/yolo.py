"""YOLO detection folders (Ultralytics' format, and Roboflow's YOLO export) read as a dataset.

The format, as Ultralytics documents and reads it (``ultralytics/data/utils.py``):

- images under ``images/<split>/`` (Roboflow's export: ``<split>/images/``), searched recursively;
- each image's label file found by ``img2label_paths``: the last ``/images/`` of its path replaced
  by ``/labels/`` and the extension by ``.txt`` (``images/train/a.jpg`` -> ``labels/train/a.txt``);
- one object per line: ``class cx cy w h`` (box centre and size divided by the image's width and
  height, so 0..1), or a polygon ``class x1 y1 x2 y2 x3 y3 ...`` (normalised points; its box is the
  polygon's extent, as Ultralytics' ``segments2boxes``);
- an image without a label file, or with an empty one, is a background image: no objects;
- class names in the dataset's YAML (``data.yaml``): ``names`` a list, or an ``{id: name}`` dict.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

import numpy as np
import yaml

from colabfast._fileio import FileEntry, PathLike
from colabfast.layouts._folder import (
    check_on_error,
    first_file,
    image_size,
    list_files,
    parallel_map,
    read_file,
    read_text,
    refuse,
    reject,
)
from colabfast.layouts._untrusted import Skipped
from colabfast.layouts.base import ImageFile, Layout, LayoutError
from colabfast.sources import is_image

__all__ = ["Yolo", "label_path"]

MAX_LABEL_BYTES = 16_000_000  # one image's label file; a real one is a few kB
MAX_YAML_BYTES = 1_000_000
FORMAT = "lines 'class cx cy w h' or 'class x1 y1 x2 y2 x3 y3 ...' (Ultralytics' YOLO format)"


def label_path(image: str) -> str:
    """The label file of the image at the POSIX path ``image``, by Ultralytics' ``img2label_paths``:
    the last ``/images/`` replaced by ``/labels/``, the extension by ``.txt``."""
    path = "/labels/".join(("/" + image).rsplit("/images/", 1))
    return path.rsplit(".", 1)[0][1:] + ".txt"


class Yolo(Layout):
    """An Ultralytics (or Roboflow YOLO export) detection folder as a map-style dataset.

    ``yolo[i]`` is ``(ImageFile, {"boxes": float32 [M, 4], "labels": int64 [M]})``: the image's bytes,
    and its ``M`` objects as torchvision's detection models take them: boxes ``x1, y1, x2, y2`` in
    pixels of the image as stored (its header's size, no EXIF rotation), class indices into
    ``info["classes"]``. A background image (no label file, or an empty one) has ``M = 0``. Samples
    are sorted by image path.

    Args:
        root: the dataset folder: it holds ``images/<split>/`` and ``labels/<split>/`` (or
            ``images/`` and ``labels/`` with no split, or Roboflow's ``<split>/images/`` and
            ``<split>/labels/``), and the YAML naming the classes (``data.yaml``, else the one
            ``*.yaml`` at ``root`` with ``names``).
        split: which split to read (``"train"``, ``"valid"``, ...); None: the only one there is.
        on_error: ``"raise"``: a malformed label file, a label file without an image, or an image or
            label file that is not a regular file or that a symlink leads out of ``root``, raises
            :class:`LayoutError`; ``"skip"``: it is left out (its image too) and listed in ``skipped``.
        retries: retries of each file read on Drive's transient errors.

    Raises:
        LayoutError: no images folder, several splits and ``split=None``, an unknown split, no YAML
            with ``names`` or a malformed one, or (with ``on_error="raise"``) a label line that is not
            5 numbers or a polygon, not finite, with coordinates outside 0..1 or a class id outside
            ``names``, a label file without an image, or an image or label file that is a FIFO, a
            device, or a symlink leading out of ``root`` (nothing outside it is read). Each names the
            file (and line).
        FileNotFoundError: ``root`` does not exist.
    """

    name = "yolo"

    def __init__(self, root: PathLike, split: Optional[str] = None, *, on_error: str = "raise",
                 retries: int = 5):
        check_on_error(on_error)
        self.root, self.on_error, self.retries = Path(root), on_error, retries
        self.skipped: Skipped = Skipped()
        files, refused = list_files(self.root, retries)
        self.split, prefix = _pick_split(self.root, files, split)
        yaml_file, classes = _read_classes(self.root, files, refused, retries)
        by_rel = {f.rel: f for f in files}
        images = [f for f in files if f.rel.startswith(prefix) and is_image(f.rel)]
        for rel in sorted(refused):
            if rel.startswith(prefix) and is_image(rel):
                reject(refuse(self.root, rel, refused), on_error, self.skipped)
        wanted = {label_path(f.rel) for f in images} | {label_path(rel) for rel in refused if rel.startswith(prefix)}
        labels = sorted(by_rel[rel] for rel in wanted if rel in by_rel)

        def parse(entry: FileEntry) -> np.ndarray | LayoutError:
            try:
                return _parse(read_text(self.root, entry, retries, MAX_LABEL_BYTES), self.root / entry.rel,
                              len(classes))
            except LayoutError as exc:
                return exc

        parsed: dict[str, np.ndarray | LayoutError] = dict(zip((f.rel for f in labels), parallel_map(parse, labels)))
        parsed.update((rel, refuse(self.root, rel, refused)) for rel in wanted if rel in refused)
        self._check_orphans(files, prefix, wanted)

        self.paths, self.files = [], [yaml_file]
        rows, offsets = [], [0]
        for image in images:
            label = label_path(image.rel)
            objects = parsed.get(label, np.zeros((0, 5)))
            if isinstance(objects, LayoutError):
                reject(objects, on_error, self.skipped)
                continue
            self.paths.append(image.rel)
            self.files.append(image)
            if label in by_rel:
                self.files.append(by_rel[label])
            rows.append(objects)
            offsets.append(offsets[-1] + len(objects))
        table = np.concatenate(rows) if rows else np.zeros((0, 5))
        self._labels = table[:, 0].astype(np.int64)
        self._boxes = table[:, 1:]  # float64 [total, 4]: x1, y1, x2, y2 divided by width, height
        self._offsets = np.array(offsets, dtype=np.int64)
        self.files.sort()
        self.info: dict[str, Any] = {"classes": classes}

    def _check_orphans(self, files: list[FileEntry], prefix: str, wanted: set[str]) -> None:
        folder = label_path(prefix + "x.jpg")[: -len("x.txt")]  # images/train/ -> labels/train/
        for f in files:
            # classes.txt: the class list LabelImg and some exporters write beside the labels
            if (f.rel.startswith(folder) and f.rel.endswith(".txt") and f.rel not in wanted
                    and f.rel != folder + "classes.txt"):
                reject(LayoutError(self.root / f.rel, "a label file without an image",
                                   fix=f"add its image under {prefix} or delete it"), self.on_error, self.skipped)

    def __getitem__(self, index: int) -> tuple[ImageFile, dict[str, np.ndarray]]:
        """Sample ``index``: ``(ImageFile, {"boxes": float32 [M, 4] XYXY pixels, "labels": int64 [M]})``.

        Raises:
            LayoutError: the image's header cannot be read (the pixels need its size).
            OSError: the file cannot be read (after ``retries`` on transient errors).
        """
        rel = self.paths[index]
        data = read_file(self.root, rel, self.retries)
        width, height = image_size(data, self.root / rel)
        a, b = self._offsets[index], self._offsets[index + 1]
        boxes = (self._boxes[a:b] * np.array([width, height, width, height])).astype(np.float32)
        return ImageFile(data, rel), {"boxes": boxes, "labels": self._labels[a:b].copy()}

    @staticmethod
    def detect(root: Path) -> bool:
        """True if ``root`` holds ``images/`` beside a ``labels/`` with ``.txt`` files, or Roboflow's
        ``<split>/images/`` beside ``<split>/labels/`` with ``.txt`` files."""
        def has_labels(folder: Path) -> bool:
            return (folder / "images").is_dir() and first_file(folder / "labels", _is_txt) is not None

        if has_labels(root):
            return True
        try:
            subdirs = [p for p in sorted(root.iterdir()) if not p.name.startswith(".") and p.is_dir()]
        except OSError:
            return False
        return any(has_labels(p) for p in subdirs)

    def describe(self) -> str:
        split = f" (split {self.split})" if self.split else ""
        return f"yolo layout{split}, {len(self)} images, {len(self._labels)} objects"


def _is_txt(name: str) -> bool:
    return name.lower().endswith(".txt")


def _pick_split(root: Path, files: list[FileEntry], split: Optional[str]) -> tuple[str, str]:
    """(split name, the images' path prefix): ``images/`` alone, ``images/<split>/``, ``<split>/images/``."""
    found: dict[str, str] = {}
    images = [f.rel.split("/") for f in files if is_image(f.rel)]
    if any(parts[0] == "images" and len(parts) == 2 for parts in images):
        found[""] = "images/"  # no split: all of images/
    else:
        for parts in images:
            if parts[0] == "images":
                found.setdefault(parts[1], f"images/{parts[1]}/")
    for parts in images:
        if len(parts) >= 3 and parts[1] == "images" and parts[0] != "images":
            found.setdefault(parts[0], f"{parts[0]}/images/")
    if not found:
        raise LayoutError(root, "no images in images/<split>/ (Ultralytics) nor <split>/images/ (Roboflow)",
                          fix="point to the dataset folder that holds them")
    listed = ", ".join(f"{name!r} ({prefix})" for name, prefix in sorted(found.items()))
    if split is None:
        if len(found) > 1:
            raise LayoutError(root, f"several splits: {listed}", fix="pass split= one of them")
        return next(iter(found.items()))
    if split not in found:
        raise LayoutError(root, f"no split {split!r}: there are {listed}", fix="pass split= one of them")
    return split, found[split]


def _read_classes(root: Path, files: list[FileEntry], refused: dict[str, str],
                  retries: int) -> tuple[FileEntry, list[str]]:
    """The YAML file naming the classes, and its names: ``data.yaml``, else the one ``*.yaml`` at
    ``root`` with a ``names`` key; one of those that ``refused`` names (a FIFO, a link out of ``root``)
    is a :class:`LayoutError`."""
    tops = [f for f in files if "/" not in f.rel and f.rel.lower().endswith((".yaml", ".yml"))]
    preferred = [f for f in tops if f.rel in ("data.yaml", "data.yml")]
    bad = sorted(rel for rel in refused if "/" not in rel and rel.lower().endswith((".yaml", ".yml")))
    bad_preferred = [rel for rel in bad if rel in ("data.yaml", "data.yml")]
    if bad_preferred or (bad and not preferred):
        raise refuse(root, (bad_preferred or bad)[0], refused)
    found = []
    for entry in preferred or tops:
        text = read_text(root, entry, retries, MAX_YAML_BYTES)
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise LayoutError(root / entry.rel, f"not valid YAML ({getattr(exc, 'problem', exc)})",
                              mark.line + 1 if mark is not None else None) from None
        if isinstance(doc, dict) and "names" in doc:
            found.append((entry, doc))
    if len(found) != 1:
        why = ("no data.yaml (or other .yaml) with the class names" if not found else
               f"several .yaml files with class names: {', '.join(e.rel for e, _ in found)}")
        raise LayoutError(root, why, fix="keep one data.yaml with names: [...] at the dataset's root "
                          "(Ultralytics' dataset YAML)")
    entry, doc = found[0]
    return entry, _names(doc, root / entry.rel)


def _names(doc: dict, path: Path) -> list[str]:
    """``names`` as a list: a list as it is, or an ``{id: name}`` dict with ids 0..n-1."""
    names = doc["names"]
    if isinstance(names, dict):
        if set(names) != set(range(len(names))) or not all(type(k) is int for k in names):
            raise LayoutError(path, f"names' ids are {list(names)}, not 0..{len(names) - 1}",
                              fix="number the classes 0, 1, 2, ... as Ultralytics does")
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not all(isinstance(n, (str, int, float, bool)) for n in names):
        raise LayoutError(path, "names is not a list of class names nor a dict {id: name}")
    if "nc" in doc and doc["nc"] != len(names):
        raise LayoutError(path, f"nc is {doc['nc']!r} but names lists {len(names)} classes")
    return [str(n) for n in names]  # Ultralytics' check_class_names makes them strings too


def _parse(text: str, path: Path, classes: int) -> np.ndarray:
    """The objects of one label file: float64 [M, 5], rows ``class, x1, y1, x2, y2`` (normalised).

    Raises:
        LayoutError: a line that is neither 5 numbers nor a polygon, a number that is not finite, a
            coordinate outside 0..1, or a class id that is not an integer in ``0..classes-1``.
    """
    rows = []
    for n, line in enumerate(text.split("\n"), 1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
            raise LayoutError(path, f"{len(fields)} fields; expected {FORMAT}", n)
        try:
            values = [float(x) for x in fields]
        except ValueError:
            bad = next(x for x in fields if not _is_number(x))
            raise LayoutError(path, f"{bad!r} is not a number; expected {FORMAT}", n) from None
        if not all(math.isfinite(v) for v in values):
            raise LayoutError(path, f"a value that is not finite ({line.strip()!r})", n)
        cls, coords = values[0], values[1:]
        if not cls.is_integer() or not 0 <= cls < classes:
            raise LayoutError(path, f"class id {fields[0]} is not one of the {classes} classes of the YAML's "
                              f"names (0..{classes - 1})", n)
        if not all(0 <= v <= 1 for v in coords):
            bad = next(x for x, v in zip(fields[1:], coords) if not 0 <= v <= 1)
            raise LayoutError(path, f"coordinate {bad} is outside 0..1 (YOLO's are divided by the image's "
                              "width and height)", n)
        if len(coords) == 4:
            cx, cy, w, h = coords
            rows.append((cls, cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
        else:
            xs, ys = coords[0::2], coords[1::2]
            rows.append((cls, min(xs), min(ys), max(xs), max(ys)))
    return np.array(rows, dtype=np.float64).reshape(len(rows), 5)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
