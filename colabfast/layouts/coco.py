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
from colabfast.layouts.registry import register
from colabfast.layouts.tree import tree_of
from colabfast.where._fileio import FileEntry, PathLike, read_regular, retry

__all__ = ["Coco", "ROBOFLOW_JSON"]

ROBOFLOW_JSON = "_annotations.coco.json"  # Roboflow's COCO export: one per split folder, beside the images
BOX_SLACK = 1.0  # pixels a box may pass its image's edge by (rounding in real exports, COCO's own included)


@register
class Coco(Layout):
    """A COCO detection folder as a map-style dataset, in ``torchvision.datasets.CocoDetection``'s order.

    What pycocotools (``pycocotools/coco.py``, ``COCO.createIndex``) loads is loaded, each leniency listed
    in ``notes``; what it cannot load or loads wrongly is a problem (see ``on_error``); the rules and limits:
    [Layouts and mirrors](../layouts.md#how-layouts-read-a-strangers-files).

    Args:
        root: the images folder; each image entry's ``file_name`` is relative to it.
        labels: the annotation JSON (``annFile``); None: Roboflow's ``root/_annotations.coco.json``.
        on_error: ``"raise"`` a :class:`LayoutError` at the first problem, or ``"skip"``: leave out
            the image (or the stray annotation) and list it in ``skipped``.
        retries: retries of each file operation for Drive's transient errors.

    ``layout[i]`` is ``{"image": ImageFile, "id": int, "target": list of dict, "coco": {"image": dict}}``:
    the image's bytes, ``sorted`` image ids' ``i``-th, its annotation dicts in the JSON's order
    (``CocoDetection(...)[i][1]``), and its image entry with its and its annotations' places in the JSON
    (what ``H5CocoDetection.coco`` rebuilds pycocotools' ``COCO`` from; ``info``, ``licenses`` kept).

    Raises:
        LayoutFileNotFoundError: the JSON is missing (a ``FileNotFoundError``, as torchvision's).
        LayoutError: the JSON is too large, too deep, malformed, or (``on_error="raise"``) one of the
            problems above; the message names the file and the image or annotation.
    """

    name = "coco"
    labels_suffixes = (".json",)

    def __init__(self, root: PathLike, labels: Optional[PathLike] = None, *, on_error: str = "raise",
                 retries: int = 5):
        self.root = Path(root)
        self.retries = retries
        problems = Problems(on_error)
        notes = Notes()
        ann_path = Path(labels) if labels is not None else self.root / ROBOFLOW_JSON
        ann_rel = annotation_name(self.root, ann_path)
        data = read_limited(ann_path, MAX_ANNOTATION_BYTES, retries)
        dataset = parse_json(ann_path, data)

        by_id: dict[int, dict] = {}
        rels: dict[int, str] = {}  # image id -> its file, normalised ("./a.jpg" is "a.jpg")
        twice: set[int] = set()
        refused: set[int] = set()  # ids of image entries left out: their annotations go with them
        place: dict[int, int] = {}  # image id -> its place in the JSON's images (for .coco's order)
        for k, img in enumerate(entries(ann_path, dataset, "images", problems)):
            rel = image_path(ann_path, img, problems)
            if rel is None:
                if is_int(img.get("id")):
                    refused.add(img["id"])
                continue
            if img["id"] in by_id:
                problems.add(os.fspath(ann_path), f"image id {img['id']} appears twice in images (for "
                             f"{by_id[img['id']]['file_name']!r} and {img['file_name']!r})",
                             fix='Give each image its own id, or pass on_error="skip" to leave both out')
                twice.add(img["id"])
            by_id[img["id"]], rels[img["id"]], place[img["id"]] = img, rel, k
            if image_size(img) is None:
                notes.add("size", f"image {img['id']}")
        for i in twice:  # which image its annotations belong to is unknown: neither is kept
            del by_id[i], rels[i]
        refused |= twice
        if "categories" not in dataset:
            notes.add("categories", "")
        categories = dataset.get("categories", [])
        if not isinstance(categories, list):
            raise LayoutError(ann_path, f"'categories' is {type(categories).__name__}, not a list")
        cat_ids = {c["id"] for c in categories if isinstance(c, dict) and is_int(c.get("id"))}

        targets: dict[int, list[dict]] = {i: [] for i in by_id}
        ann_places: dict[int, list[int]] = {i: [] for i in by_id}  # each annotation's place in the JSON's
        bad_images: dict[int, str] = {}
        ann_ids: dict[int, int] = {}  # annotation id -> its index in annotations
        for k, ann in enumerate(entries(ann_path, dataset, "annotations", problems)):
            where = f"annotations[{k}]" + (f" (id {ann['id']})" if is_int(ann.get("id")) else "")
            why = check_annotation(ann, ann_ids)
            if why is None:
                ann_ids[ann["id"]] = k
                image_id = ann["image_id"]
                if image_id in refused:
                    why = f"its image (id {image_id}) is left out"
                elif image_id not in by_id:
                    notes.add("stray", f"{where}: image_id {image_id}")
                    continue
            if why is None:
                if "category_id" in ann and ann["category_id"] not in cat_ids:
                    notes.add("category", f"{where}: category_id {ann['category_id']}")
                if (edge := past_edge(ann, by_id[image_id])) is not None:
                    notes.add("edge", f"{where}: {edge}")
                targets[image_id].append(ann)
                ann_places[image_id].append(k)
            elif is_int(ann.get("image_id")) and ann["image_id"] in by_id and not problems.raising:
                bad_images.setdefault(ann["image_id"], f"{where} in {ann_rel}: {why}")
            else:
                problems.add(os.fspath(ann_path), f"{where}: {why}")

        ids = sorted(by_id)
        found = stat_files(self.root, [rels[i] for i in ids], retries)
        self.ids: list[int] = []
        self.paths, self.targets, self.files = [], [], []
        self.entries: list[dict] = []
        self.places: list[list] = []  # [the image's place in the JSON, its annotations' places]
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
                self.entries.append(by_id[i])
                self.places.append([place[i], ann_places[i]])
                self.files.append(entry)
        # a file two image ids share is listed once
        st = retry(lambda: os.stat(ann_path), retries)
        self.files = [*dict.fromkeys(self.files), FileEntry(ann_rel, st.st_size, st.st_mtime_ns)]
        self.skipped = problems.skipped
        self.notes = notes.records(os.fspath(ann_path))
        self.info = {"categories": categories, "annotation_file": ann_rel, "coco_keys": list(dataset),
                     "coco_other": {k: v for k, v in dataset.items() if k not in ("images", "annotations",
                                                                                  "categories")}}
        if self.notes:
            self.info["notes"] = [list(n) for n in self.notes]

    def __getitem__(self, index: int) -> dict[str, Any]:
        rel = self.paths[index]
        data = retry(lambda: read_regular(self.root / rel), self.retries)
        return {"image": ImageFile(data, rel), "id": self.ids[index], "target": self.targets[index],
                "coco": {"image": self.entries[index], "places": self.places[index]}}

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the folder holds Roboflow's ``_annotations.coco.json`` (for another JSON, pass ``labels=``)."""
        return tree_of(tree).is_file(ROBOFLOW_JSON)

    def describe(self) -> str:
        read = "; read as pycocotools reads it: " + "; ".join(what for _, what in self.notes) if self.notes else ""
        return f"coco layout ({self.info['annotation_file']}), {len(self)} images{read}"


def annotation_name(root: Path, path: Path) -> str:
    """``path`` relative to ``root`` (POSIX) where it lies below it, else absolute."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    return Path(rel).as_posix() if not rel.startswith("..") else os.path.abspath(path)


def parse_json(path: Path, data: bytes) -> dict:
    """The JSON object in ``data``, refused before parsing where it nests deeper than ``MAX_DEPTH``, holds
    more than one container per ``MIN_BYTES_PER_CONTAINER`` bytes, or an entry of over ``MAX_ENTRY_VALUES``.

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
    else:
        return rel
    problems.add(os.fspath(path), f"{where} {why}")
    return None


def image_size(img: dict) -> Optional[tuple[float, float]]:
    """The image entry's ``(width, height)`` where both are positive numbers, else None."""
    w, h = img.get("width"), img.get("height")
    if isinstance(w, (int, float)) and isinstance(h, (int, float)) and is_number(w) and is_number(h) and min(w, h) > 0:
        return w, h
    return None


def check_annotation(ann: dict, ann_ids: dict[int, int]) -> Optional[str]:
    """Why the annotation ``ann`` cannot be loaded as pycocotools loads it, or None."""
    if not is_int(ann.get("id")):
        return "has no int 'id'"
    if ann["id"] in ann_ids:
        return (f"annotation id {ann['id']} appears twice (also annotations[{ann_ids[ann['id']]}]): pycocotools "
                "keeps one annotation per id, so torchvision's CocoDetection would return the later one twice and "
                "lose the other. Give each annotation its own id")
    if not is_int(ann.get("image_id")):
        return f"its image_id {ann.get('image_id')!r} is not an int image id"
    if "category_id" in ann and not is_int(ann["category_id"]):
        return f"its category_id {ann['category_id']!r} is not an int category id"
    if "bbox" in ann:
        box = ann["bbox"]
        if not (isinstance(box, list) and len(box) == 4 and all(is_number(v) for v in box)):
            return f"its bbox {box!r} is not 4 finite numbers [x, y, w, h]"
        if box[2] < 0 or box[3] < 0:
            return f"its bbox {box!r} has a negative width or height"
    return None


def past_edge(ann: dict, image: dict) -> Optional[str]:
    """How ``ann``'s bbox passes its image's edge by more than ``BOX_SLACK`` pixels, or None (inside, no
    box, or an image without its size)."""
    size = image_size(image)
    if "bbox" not in ann or size is None:
        return None
    (x, y, w, h), (W, H) = ann["bbox"], size
    if x < -BOX_SLACK or y < -BOX_SLACK or x + w > W + BOX_SLACK or y + h > H + BOX_SLACK:
        return f"bbox {ann['bbox']!r} in image {image['id']} ({W}x{H})"
    return None


class Notes:
    """A COCO file's leniencies by kind: how many, the first example (a million of one kind cost one
    record)."""

    WHAT = {
        "size": ("image entries have no positive 'width' and 'height'",
                 "kept, as pycocotools reads neither; their boxes are not checked against the image's edges"),
        "categories": ("there is no 'categories' list",
                       "read as pycocotools reads it: no categories (COCOeval then evaluates none)"),
        "category": ("annotations have a category_id not among the categories",
                     "kept, as pycocotools keeps them (COCOeval evaluates only the listed categories)"),
        "edge": (f"boxes pass their image's edge by more than {BOX_SLACK:g} px",
                 "kept as they are, as pycocotools keeps them"),
        "stray": ("annotations name an image_id that is not among the images",
                  "left out, as torchvision's CocoDetection never returns them (its ids are the images')"),
    }

    def __init__(self) -> None:
        self.seen: dict[str, list] = {}  # kind -> [count, first example]

    def add(self, kind: str, example: str) -> None:
        if kind in self.seen:
            self.seen[kind][0] += 1
        else:
            self.seen[kind] = [1, example]

    def records(self, path: str) -> list[tuple[str, str]]:
        out = []
        for kind, (what, done) in self.WHAT.items():
            if kind in self.seen:
                n, example = self.seen[kind]
                out.append((path, f"{n} {what} (e.g. {example}): {done}" if example else f"{what}: {done}"))
        return out
