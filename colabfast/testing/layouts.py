"""Realistic detection and segmentation datasets made on the spot, in the layouts people export them
in: a COCO folder (Roboflow's export by default), Ultralytics' YOLO folders, and image/mask pairs.

The benchmarks, notebooks and tests use these instead of downloads. Images are photo-like JPEGs
(:func:`colabfast.testing.data.photo`), so sizes and decode costs resemble photos; every object lies
inside its image; the same arguments give the same bytes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from PIL import Image, ImageDraw

from colabfast.testing.data import _size, encode, photo
from colabfast.where._fileio import PathLike

__all__ = ["make_coco", "make_yolo", "make_segmentation", "with_orientation", "CATEGORIES"]

# A few of COCO's own categories, with COCO's ids (not contiguous, as in instances_*.json).
CATEGORIES = ((1, "person", "person"), (2, "bicycle", "vehicle"), (3, "car", "vehicle"),
              (17, "cat", "animal"), (18, "dog", "animal"), (44, "bottle", "kitchen"))  # fmt: skip
MAX_OBJECTS = 8  # objects per image: 0 to this many


def _polygon(rng: np.random.Generator, width: int, height: int) -> list[float]:
    """A convex-ish polygon of 4 to 8 points inside a ``width`` x ``height`` image, flattened
    ``[x1, y1, x2, y2, ...]`` (COCO's ``segmentation`` polygon), rounded to 2 decimals."""
    w = float(rng.uniform(0.1, 0.6)) * width
    h = float(rng.uniform(0.1, 0.6)) * height
    cx = float(rng.uniform(w / 2, width - w / 2))
    cy = float(rng.uniform(h / 2, height - h / 2))
    angles = np.sort(rng.uniform(0, 2 * np.pi, int(rng.integers(4, 9))))
    radius = rng.uniform(0.6, 1.0, len(angles))
    xs = np.clip(cx + radius * np.cos(angles) * w / 2, 0, width - 1)
    ys = np.clip(cy + radius * np.sin(angles) * h / 2, 0, height - 1)
    return [round(float(v), 2) for xy in zip(xs, ys) for v in xy]


def _polygon_area(points: Sequence[float]) -> float:
    xs, ys = np.asarray(points[0::2]), np.asarray(points[1::2])
    return float(abs(np.dot(xs, np.roll(ys, 1)) - np.dot(ys, np.roll(xs, 1))) / 2)


def _box(points: Sequence[float]) -> list[float]:
    """The polygon's extent as COCO's ``[x, y, w, h]``."""
    xs, ys = points[0::2], points[1::2]
    return [min(xs), min(ys), round(max(xs) - min(xs), 2), round(max(ys) - min(ys), 2)]


def make_coco(
    root: PathLike,
    n: int,
    *,
    size: tuple[int, int] = (500, 375),
    vary: float = 0.2,
    quality: int = 90,
    seed: int = 0,
    ann_file: Optional[PathLike] = None,
) -> Path:
    """Write ``n`` photo-like JPEGs into ``root`` and their COCO instances JSON.

    Image ``k`` is ``root/{id:012d}.jpg`` (COCO's naming) with image id ``id = k + 1``; each has 0 to
    ``MAX_OBJECTS`` annotations of :data:`CATEGORIES` with a polygon ``segmentation`` inside the
    image, its ``bbox`` ``[x, y, w, h]`` (the polygon's extent, pixels), ``area`` (the polygon's) and
    ``iscrowd`` 0; the JSON has ``info``, ``licenses``, ``images``, ``annotations`` and
    ``categories``, as COCO's and Roboflow's exports do.

    Args:
        root: the images folder to create (may exist; files of the same names are overwritten).
        n: number of images.
        size: (width, height) in pixels; COCO's images are about 640x480, ImageNet's 500x375.
        vary: relative jitter of each side (0.2: within +-20%).
        quality: JPEG quality.
        seed: random seed; the same arguments give the same bytes.
        ann_file: where to write the JSON; None: Roboflow's ``root/_annotations.coco.json``, which
            ``colabfast.pack(root, layout="coco")`` finds without ``labels=``.

    Returns:
        The path of the annotation JSON (``CocoDetection``'s ``annFile``).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    for k in range(n):
        image_id = k + 1
        w, h = _size(size, vary, rng)
        name = f"{image_id:012d}.jpg"
        (root / name).write_bytes(encode(photo(w, h, rng), quality=quality))
        images.append({"id": image_id, "license": 1, "file_name": name, "height": h, "width": w,
                       "date_captured": "2024-01-01T00:00:00+00:00"})
        for _ in range(int(rng.integers(0, MAX_OBJECTS + 1))):
            points = _polygon(rng, w, h)
            category = CATEGORIES[int(rng.integers(len(CATEGORIES)))][0]
            annotations.append({"id": len(annotations) + 1, "image_id": image_id, "category_id": category,
                                "bbox": _box(points), "area": round(_polygon_area(points), 2),
                                "segmentation": [points], "iscrowd": 0})
    dataset = {
        "info": {"description": "colabfast.testing.layouts.make_coco", "version": "1.0", "year": 2024},
        "licenses": [{"id": 1, "name": "CC BY 4.0", "url": "https://creativecommons.org/licenses/by/4.0/"}],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i, "name": name, "supercategory": sup} for i, name, sup in CATEGORIES],
    }
    path = Path(ann_file) if ann_file is not None else root / "_annotations.coco.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataset), encoding="utf-8")
    return path


def make_yolo(
    root: PathLike,
    n: int,
    *,
    size: tuple[int, int] = (640, 480),
    vary: float = 0.2,
    classes: Sequence[str] = ("person", "car", "dog"),
    split: str = "train",
    quality: int = 90,
    seed: int = 0,
    segments: bool = False,
    orientation: int = 1,
) -> Path:
    """Write an Ultralytics YOLO dataset: ``root/images/<split>/{k:06d}.jpg``,
    ``root/labels/<split>/{k:06d}.txt`` and ``root/data.yaml``.

    Each label line is ``class cx cy w h``, normalised to 0..1 with 6 decimals, 0 to ``MAX_OBJECTS``
    lines per image; a few images are backgrounds: every fifth without a label file, others with an
    empty one (both are allowed by the format).

    Args:
        root: the dataset folder to create.
        n: number of images.
        size, vary, quality, seed: as :func:`make_coco`'s.
        classes: the class names (``names`` in ``data.yaml``).
        split: the split's folder name.
        segments: write Ultralytics' segment format instead: each line ``class x1 y1 x2 y2 ...``, a
            polygon of 4 to 8 points (normalised, 6 decimals).
        orientation: the EXIF orientation (1 to 8) every second image (``k`` odd) carries, as phone
            photos do; its labels are in the upright frame, as Ultralytics reads them. 1: none.

    Returns:
        ``Path(root)``.
    """
    root = Path(root)
    rng = np.random.default_rng(seed)
    images, labels = root / "images" / split, root / "labels" / split
    images.mkdir(parents=True, exist_ok=True)
    labels.mkdir(parents=True, exist_ok=True)
    if not 1 <= orientation <= 8:
        raise ValueError(f"orientation is an EXIF orientation, 1 to 8, not {orientation}")
    for k in range(n):
        w, h = _size(size, vary, rng)
        data = encode(photo(w, h, rng), quality=quality)
        if k % 2 and orientation != 1:
            data = with_orientation(data, orientation)
        (images / f"{k:06d}.jpg").write_bytes(data)
        lines = []
        for _ in range(int(rng.integers(0, MAX_OBJECTS + 1))):
            if segments:
                points = np.array(_polygon(rng, 1000, 1000)) / 1000
                lines.append(f"{int(rng.integers(len(classes)))} " + " ".join(f"{v:.6f}" for v in points) + "\n")
                continue
            bw, bh = rng.uniform(0.05, 0.6, 2)
            cx, cy = rng.uniform(bw / 2, 1 - bw / 2), rng.uniform(bh / 2, 1 - bh / 2)
            lines.append(f"{int(rng.integers(len(classes)))} {cx:.6f} {cy:.6f} {bw:.6f} {bh:.6f}\n")
        if k % 5 != 4:  # every fifth image has no label file
            (labels / f"{k:06d}.txt").write_text("".join(lines), encoding="utf-8")
    names = ", ".join(json.dumps(c) for c in classes)
    (root / "data.yaml").write_text(f"path: .\n{split}: images/{split}\nnc: {len(classes)}\nnames: [{names}]\n",
                                    encoding="utf-8")
    return root


def with_orientation(jpeg: bytes, orientation: int) -> bytes:
    """The JPEG ``jpeg`` with an EXIF block saying ``orientation`` (1 to 8) inserted after its start
    marker: the same compressed pixels, stored sideways or mirrored as a camera writes them."""
    exif = Image.Exif()
    exif[274] = orientation
    block = exif.tobytes()  # b"Exif\0\0" and the TIFF structure: an APP1 segment's payload
    return jpeg[:2] + b"\xff\xe1" + (len(block) + 2).to_bytes(2, "big") + block + jpeg[2:]


def make_segmentation(
    root: PathLike,
    n: int,
    *,
    size: tuple[int, int] = (500, 375),
    vary: float = 0.2,
    classes: int = 5,
    quality: int = 90,
    seed: int = 0,
) -> Path:
    """Write image/mask pairs: ``root/images/{k:06d}.jpg`` and ``root/masks/{k:06d}.png``.

    Each mask is a palette (``"P"``) PNG of the image's size: class 0 background, up to 6 filled
    shapes of classes ``1..classes-1``, a 255 border around each (VOC's "ignore" value), and a
    palette giving each class a colour.

    Args:
        root: the dataset folder to create.
        n: number of pairs.
        size, vary, quality, seed: as :func:`make_coco`'s.
        classes: number of classes including the background (at most 255).

    Returns:
        ``Path(root)``.
    """
    if not 2 <= classes <= 255:
        raise ValueError(f"classes must be 2 to 255 (background included), not {classes}")
    root = Path(root)
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    palette = [0, 0, 0] + rng.integers(0, 256, 3 * (classes - 1)).tolist()
    palette += [0] * (3 * 255 - len(palette)) + [224, 224, 192]  # 255: VOC's border colour
    for k in range(n):
        w, h = _size(size, vary, rng)
        (root / "images" / f"{k:06d}.jpg").write_bytes(encode(photo(w, h, rng), quality=quality))
        mask = Image.new("P", (w, h), 0)
        draw = ImageDraw.Draw(mask)
        for _ in range(int(rng.integers(0, 7))):
            x0, x1 = sorted(rng.integers(0, w, 2).tolist())
            y0, y1 = sorted(rng.integers(0, h, 2).tolist())
            shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
            shape((x0, y0, x1, y1), fill=int(rng.integers(1, classes)), outline=255, width=2)
        mask.putpalette(palette)
        mask.save(root / "masks" / f"{k:06d}.png")
    return root
