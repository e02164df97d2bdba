"""The ``"coco"`` layout: images plus a COCO annotation JSON, as
``torchvision.datasets.CocoDetection(root, annFile)`` reads them, and Roboflow's COCO export
(``train/_annotations.coco.json`` beside the images).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional

from colabfast._fileio import FileEntry, PathLike, read_regular, retry
from colabfast.layouts._untrusted import (
    MAX_ANNOTATION_BYTES,
    MAX_DEPTH,
    MAX_ENTRY_VALUES,
    MIN_BYTES_PER_CONTAINER,
    Problems,
    json_shape,
    read_limited,
    safe_rel,
    stat_files,
)
from colabfast.layouts.base import ImageFile, Layout, LayoutError

__all__ = ["Coco", "ROBOFLOW_JSON"]

ROBOFLOW_JSON = "_annotations.coco.json"  # Roboflow's COCO export: one per split folder, beside the images
BOX_SLACK = 1.0  # pixels a box may pass its image's edge by (rounding in real exports, COCO's own included)


class Coco(Layout):
    """A COCO detection folder as a map-style dataset, in ``torchvision.datasets.CocoDetection``'s order.

    Args:
        root: the images folder; each image entry's ``file_name`` is relative to it.
        labels: the annotation JSON (``CocoDetection``'s ``annFile``, relative to the current
            folder or absolute). None: Roboflow's export, ``root/_annotations.coco.json``.
        on_error: ``"raise"`` a :class:`LayoutError` at the first problem, or ``"skip"``: leave out
            the image (or the stray annotation) and list it in ``skipped``.
        retries: retries of each file operation for Drive's transient errors.

    The JSON is read whole and checked before any image is: it may have at most
    ``MAX_ANNOTATION_BYTES`` (512 MiB), nest at most ``MAX_DEPTH`` (64) levels, hold at most one array
    or object per ``MIN_BYTES_PER_CONTAINER`` (12) bytes, and at most ``MAX_ENTRY_VALUES`` (1 Mi) values
    in one image or annotation (all refused before parsing: what parsing costs stays what a COCO file of
    that size costs). Each image entry needs an int ``id`` (unique), a ``file_name`` inside ``root`` (not
    absolute, no ``..``, not hidden, no symlink leading out) naming an existing file, and positive
    ``width`` and ``height``; each annotation an int ``id`` (unique), an ``image_id`` among the
    images, a ``category_id`` among the categories (where it has one) and a ``bbox`` (where it has
    one) of 4 finite numbers ``[x, y, w, h]`` inside its image (``BOX_SLACK`` pixels allowed).

    ``layout[i]`` is ``{"image": ImageFile, "id": int, "target": list of dict}``: the image file's
    bytes, the image id ``ids[i]`` (``sorted`` image ids, as ``CocoDetection.ids``), and the
    annotation dicts of that image as in the JSON, in its order (``CocoDetection(...)[i][1]``).

    Raises:
        LayoutError: the JSON is missing, too large, too deep, malformed, or (``on_error="raise"``)
            one of the checks above fails; the message names the file and the image or annotation.
    """

    name = "coco"

    def __init__(self, root: PathLike, labels: Optional[PathLike] = None, *, on_error: str = "raise",
                 retries: int = 5):
        self.root = Path(root)
        self.retries = retries
        problems = Problems(on_error)
        ann_path = Path(labels) if labels is not None else self.root / ROBOFLOW_JSON
        ann_rel = annotation_name(self.root, ann_path)
        data = read_limited(ann_path, MAX_ANNOTATION_BYTES, retries)
        dataset = parse_json(ann_path, data)

        by_id: dict[int, dict] = {}
        rels: dict[int, str] = {}  # image id -> its file, normalised ("./a.jpg" is "a.jpg")
        twice: set[int] = set()
        for img in entries(ann_path, dataset, "images", problems):
            rel = image_path(ann_path, img, problems)
            if rel is None:
                continue
            if img["id"] in by_id:
                problems.add(os.fspath(ann_path), f"image id {img['id']} appears twice in images (for "
                             f"{by_id[img['id']]['file_name']!r} and {img['file_name']!r})",
                             fix='Give each image its own id, or pass on_error="skip" to leave both out')
                twice.add(img["id"])
            by_id[img["id"]], rels[img["id"]] = img, rel
        for i in twice:  # which image its annotations belong to is unknown: neither is kept
            del by_id[i], rels[i]
        categories = dataset.get("categories", [])
        if not isinstance(categories, list):
            raise LayoutError(ann_path, f"'categories' is {type(categories).__name__}, not a list")
        cat_ids = {c["id"] for c in categories if isinstance(c, dict) and is_int(c.get("id"))}

        targets: dict[int, list[dict]] = {i: [] for i in by_id}
        bad_images: dict[int, str] = {}
        ann_ids: set[int] = set()
        for k, ann in enumerate(entries(ann_path, dataset, "annotations", problems)):
            where = f"annotations[{k}]" + (f" (id {ann['id']})" if isinstance(ann.get("id"), int) else "")
            why = check_annotation(ann, by_id, cat_ids, ann_ids)
            if why is None:
                ann_ids.add(ann["id"])
                targets[ann["image_id"]].append(ann)
            elif isinstance(ann.get("image_id"), int) and ann["image_id"] in by_id and not problems.raising:
                bad_images.setdefault(ann["image_id"], f"{where} in {ann_rel}: {why}")
            else:
                problems.add(os.fspath(ann_path), f"{where}: {why}")

        ids = sorted(by_id)
        found = stat_files(self.root, [rels[i] for i in ids], retries)
        self.ids: list[int] = []
        self.paths, self.targets, self.files = [], [], []
        for i in ids:
            rel = rels[i]
            entry = found[rel]
            if i in bad_images:
                problems.add(os.fspath(self.root / rel), bad_images[i])
            elif isinstance(entry, str):
                problems.add(os.fspath(self.root / rel), f"{entry} (image id {i} in {ann_rel})",
                             fix='Put the image there, or pass on_error="skip" to leave it out')
            else:
                self.ids.append(i)
                self.paths.append(rel)
                self.targets.append(targets[i])
                self.files.append(entry)
        # a file two image ids share is listed once
        st = retry(lambda: os.stat(ann_path), retries)
        self.files = [*dict.fromkeys(self.files), FileEntry(ann_rel, st.st_size, st.st_mtime_ns)]
        self.skipped = problems.skipped
        self.info = {"categories": categories, "annotation_file": ann_rel}

    def __getitem__(self, index: int) -> dict[str, Any]:
        rel = self.paths[index]
        data = retry(lambda: read_regular(self.root / rel), self.retries)
        return {"image": ImageFile(data, rel), "id": self.ids[index], "target": self.targets[index]}

    @staticmethod
    def detect(root: Path) -> bool:
        """True if ``root`` holds Roboflow's ``_annotations.coco.json`` (for another JSON, pass ``labels=``)."""
        return (root / ROBOFLOW_JSON).is_file()

    def describe(self) -> str:
        return f"coco layout ({self.info['annotation_file']}), {len(self)} images"


def annotation_name(root: Path, path: Path) -> str:
    """``path`` relative to ``root`` (POSIX) where it lies below it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return Path(rel).as_posix() if not rel.startswith("..") else os.path.abspath(path)


def parse_json(path: Path, data: bytes) -> dict:
    """The JSON object in ``data``, refused before parsing where parsing it would cost more than a
    COCO file of its size does: nested deeper than ``MAX_DEPTH``, with more arrays and objects than
    one per ``MIN_BYTES_PER_CONTAINER`` bytes, or an image or annotation of more than
    ``MAX_ENTRY_VALUES`` values.

    Raises:
        LayoutError: one of those, or ``data`` is not JSON, or not an object with an ``images`` list.
    """
    shape = json_shape(data)
    if shape.depth > MAX_DEPTH:
        raise LayoutError(path, f"nests {shape.depth} levels deep, more than colabfast parses ({MAX_DEPTH})",
                          fix="A COCO JSON nests 5 levels; check that it is the right file")
    if shape.containers > len(data) // MIN_BYTES_PER_CONTAINER + 4096:
        raise LayoutError(path, f"has {shape.containers} arrays and objects in {len(data)} bytes, more than one "
                          f"per {MIN_BYTES_PER_CONTAINER} bytes (each costs Python 60 bytes or more; a COCO file "
                          "has one per 30 to 100 bytes)",
                          fix="Check that it is the right file")
    if shape.largest_entry > MAX_ENTRY_VALUES:
        raise LayoutError(path, f"has an entry (an image or annotation) of {shape.largest_entry} values, more than "
                          f"colabfast reads in one ({MAX_ENTRY_VALUES}; a COCO annotation holds a few thousand "
                          "at most)", fix="Simplify its segmentation, or check that it is the right file")
    try:
        dataset = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, bad UTF-8, an integer too long to convert
        line = getattr(exc, "lineno", None)
        raise LayoutError(path, f"is not valid JSON: {getattr(exc, 'msg', exc)}", line,
                          fix="Export it again") from exc
    if not isinstance(dataset, dict) or not isinstance(dataset.get("images"), list):
        raise LayoutError(path, "is not a COCO annotation file: no 'images' list at its top",
                          fix="Pass the instances JSON (images, annotations, categories) as labels=")
    return dataset


def entries(path: Path, dataset: dict, key: str, problems: Problems) -> list[dict]:
    """The dicts of ``dataset[key]`` (absent: none); the other values in the list are one problem (a
    million of them cost one record, and one pass in C)."""
    items = dataset.get(key, [])
    if not isinstance(items, list):
        raise LayoutError(path, f"{key!r} is {type(items).__name__}, not a list")
    out = [item for item in items if type(item) is dict]
    if len(out) < len(items):
        k, item = next((k, item) for k, item in enumerate(items) if type(item) is not dict)
        more = len(items) - len(out) - 1
        problems.add(os.fspath(path), f"{key}[{k}] is {type(item).__name__}, not an object"
                     + (f" (and {more} more of its entries are not objects)" if more else ""))
    return out


def is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def image_path(path: Path, img: dict, problems: Problems) -> Optional[str]:
    """The image entry ``img``'s file as a safe POSIX path below the root, or None (its problem added)."""
    where = f"image {img.get('id')!r}" + (f" ({img['file_name']!r})" if "file_name" in img else "")
    rel = safe_rel(img.get("file_name"))
    if not is_int(img.get("id")):
        why = "has no int 'id'"
    elif rel is None:
        why = "has a 'file_name' that is not a path inside the images folder (absolute, with '..', empty or hidden)"
    elif not (is_number(img.get("width")) and is_number(img.get("height")) and img["width"] > 0
              and img["height"] > 0):
        why = "has no positive 'width' and 'height'"
    else:
        return rel
    problems.add(os.fspath(path), f"{where} {why}")
    return None


def check_annotation(ann: dict, images: dict[int, dict], cat_ids: set[int], ann_ids: set[int]) -> Optional[str]:
    """Why the annotation ``ann`` cannot be used, or None."""
    if not is_int(ann.get("id")):
        return "has no int 'id'"
    if ann["id"] in ann_ids:
        return f"annotation id {ann['id']} appears twice"
    image = images.get(ann["image_id"]) if is_int(ann.get("image_id")) else None
    if image is None:
        return f"its image_id {ann.get('image_id')!r} is not among the images"
    if "category_id" in ann and not (is_int(ann["category_id"]) and ann["category_id"] in cat_ids):
        return f"its category_id {ann['category_id']!r} is not among the categories"
    if "bbox" in ann:
        box = ann["bbox"]
        if not (isinstance(box, list) and len(box) == 4 and all(is_number(v) for v in box)):
            return f"its bbox {box!r} is not 4 finite numbers [x, y, w, h]"
        x, y, w, h = box
        W, H = image["width"], image["height"]
        if w < 0 or h < 0 or x < -BOX_SLACK or y < -BOX_SLACK or x + w > W + BOX_SLACK or y + h > H + BOX_SLACK:
            return f"its bbox {box!r} is not inside its image ({image['file_name']!r}, {W}x{H})"
    return None
