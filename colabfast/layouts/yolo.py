"""YOLO folders (Ultralytics' format, and Roboflow's YOLO export) read as a dataset, as Ultralytics reads them.

The rules followed are Ultralytics' own (``ultralytics`` 8.4.190, dataset cache version 1.0.12):

- images under ``images/<split>/`` (Roboflow's export: ``<split>/images/``), searched recursively,
  those of an extension in ``IMG_FORMATS`` (``ultralytics/data/utils.py``; ``YOLODataset.get_img_files``
  in ``ultralytics/data/base.py``): a ``.ppm`` or ``.pgm`` that torchvision's ImageFolder would read is
  ignored (listed), and one Ultralytics reads through OpenCV that colabfast cannot decode (``.heic``,
  ``.avif``, ``.jp2``, ``.dng``, ...) refused, as ``on_error`` says;
- each image's label file found by ``img2label_paths`` (``ultralytics/data/utils.py``): the last
  ``/images/`` of its path replaced by ``/labels/`` and the extension by ``.txt``
  (``images/train/a.jpg`` -> ``labels/train/a.txt``); a label file of no image is never read
  (Ultralytics only looks up the label files of its images);
- a label file read and checked by ``verify_image_label`` (``ultralytics/data/utils.py``): one object
  per line, ``class cx cy w h`` (box centre and size divided by the image's width and height), or, in
  a file with a line of more than 6 fields, a polygon ``class x1 y1 x2 y2 ...`` (normalised points;
  its box the polygon's extent, ``segments2boxes`` in ``ultralytics/utils/ops.py``); values down to
  -0.01 and up to 1.01 kept as written (not clipped); a file it cannot use (a malformed line, a class
  outside ``names``, ...) drops its image; duplicate rows removed;
- the image read upright: its EXIF orientation applied, as ``BaseDataset.load_image``
  (``ultralytics/data/base.py``) decodes it with OpenCV (``imread``, ``ultralytics/utils/patches.py``:
  ``cv2.imdecode(..., IMREAD_COLOR)``, a 16-bit image's high byte kept, a palette expanded), and its
  size the oriented one (``exif_size``), which the normalised labels refer to;
- polygons kept only where every object of the split has one: a split mixing boxes and polygons is
  read as boxes, as ``YOLODataset.verify_labels`` (``ultralytics/data/dataset.py``) does for detection;
- each image checked as ``check_image`` (``ultralytics/data/utils.py``, called by ``verify_image_label``)
  checks it, from its header: one PIL cannot open, one under 10 pixels on a side (upright), or one
  whose content is not of a format in ``IMG_FORMATS`` (a GIF or PPM named ``.jpg``) is dropped (its
  label file unread); a JPEG whose last two bytes are not the end marker ``FF D9`` (bytes after
  it, or a cut file) is read as Ultralytics restores it: decoded by PIL, its EXIF orientation
  applied, saved as JPEG quality 100 with no chroma subsampling, which is then the image (one PIL
  cannot decode is dropped). Ultralytics rewrites the file so; colabfast leaves it as it is and
  reads the restored bytes. ``check_image``'s ``im.verify()`` (a PNG's chunk checksums) needs the
  whole file: a file damaged past its header is found when it is read (``pack``'s ``on_error``);
- an image without a label file, or with an empty one, is a background image: no objects;
- class names in the dataset's YAML (``data.yaml``): ``names`` a list, or an ``{id: name}`` dict.
"""

from __future__ import annotations

import dataclasses
import io
import os
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
from PIL import Image, ImageOps

from colabfast.errors import excerpt
from colabfast.layouts._folder import (
    check_on_error,
    list_files,
    parallel_map,
    read_file,
    read_text,
    refuse,
    reject,
)
from colabfast.layouts._untrusted import MAX_YAML_BYTES, Skipped, load_yaml
from colabfast.layouts.base import ImageFile, Layout, LayoutError
from colabfast.layouts.images import SPLIT_FOLDERS, is_image
from colabfast.layouts.registry import register
from colabfast.layouts.tree import tree_of
from colabfast.mirror.encoding import oriented_size
from colabfast.where._fileio import FileEntry, PathLike, open_regular, retry

__all__ = ["Yolo", "label_path", "polygon_masks", "yolo_splits"]

MAX_LABEL_BYTES = 16_000_000  # one image's label file; a real one is a few kB
FORMAT = "lines 'class cx cy w h' or 'class x1 y1 x2 y2 x3 y3 ...' (Ultralytics' YOLO format)"
ULTRALYTICS = "as Ultralytics' verify_image_label does"
# IMG_FORMATS of ultralytics/data/utils.py (8.4.190): the extensions Ultralytics takes for images
IMG_FORMATS = frozenset({"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "jp2", "heif", "heic",
                         "avif"})


def label_path(image: str) -> str:
    """The label file of the image at the POSIX path ``image``, by Ultralytics' ``img2label_paths``:
    the last ``/images/`` replaced by ``/labels/``, the extension by ``.txt``."""
    path = "/labels/".join(("/" + image).rsplit("/images/", 1))
    return path.rsplit(".", 1)[0][1:] + ".txt"


@register
class Yolo(Layout):
    """An Ultralytics (or Roboflow YOLO export) detection or segmentation folder as a map-style
    dataset, read as Ultralytics 8.4.190 reads it (see the module's docstring for its functions).

    ``yolo[i]`` is ``(ImageFile, target)``, target ``{"boxes": float32 [M, 4], "labels": int64 [M]}``:
    the image file (read upright: ``ImageFile.orient``), and its ``M`` objects as torchvision's
    detection models take them: boxes ``x1, y1, x2, y2`` in pixels of the upright image (its EXIF
    orientation applied, as Ultralytics' ``exif_size`` and OpenCV's decoders do), class indices into
    ``info["classes"]``. Where every object of the split is a polygon (Ultralytics' segment
    format), the target also has ``"segments"``: per object, its polygon as ``[[x, y], ...]`` in
    pixels of the upright image (Ultralytics' ``segments``, denormalised); :func:`polygon_masks`
    makes them masks. A background image (no label file, or an empty one) has ``M = 0``. Samples are
    sorted by image path.

    Listing reads the start of each image (its header: 64 KiB, and a JPEG's last two bytes), as
    Ultralytics' own check of a dataset does, to drop the images it drops; nothing else of an image
    is read before ``yolo[i]``, except a JPEG without its end marker, decoded to know if PIL can.

    Packed into a mirror (``colabfast.pack``), an image with an EXIF orientation is stored as its
    upright pixels, lossless PNG (no JPEG decoder that reads mirrors applies the orientation: PIL's,
    libjpeg-turbo's, nvJPEG's), so every output (PIL, tensor, bytes decoded on the GPU) gives
    Ultralytics' pixels; an image without one keeps its file's bytes.

    What Ultralytics leaves out is left out and listed in ``skipped`` as ``(path, why)``, whatever
    ``on_error`` says: an image ``check_image`` refuses (PIL cannot open it, under 10 pixels on a
    side, content not of a format in ``IMG_FORMATS``, a JPEG without its end marker that PIL cannot
    decode), the image of a label file ``verify_image_label`` refuses (a line that is not 5
    numbers or a polygon, a box mixed into a polygon file, a value that is not a number, over 1.01 or
    under -0.01, a class that is not an integer of ``names``; with the line), a label file without an
    image (ignored), duplicate rows (removed; then the rows left are in ``np.unique``'s sorted order,
    as Ultralytics leaves them), and the polygons of a split that mixes polygons and boxes. A JPEG
    without its end marker that PIL decodes is kept, read as Ultralytics restores it (see the module's
    docstring), and listed too.

    Args:
        root: the dataset folder: it holds ``images/<split>/`` and ``labels/<split>/`` (or
            ``images/`` and ``labels/`` with no split, or Roboflow's ``<split>/images/`` and
            ``<split>/labels/``), and the YAML naming the classes (``data.yaml``, else the one
            ``*.yaml`` at ``root`` with ``names``).
        split: which split to read (``"train"``, ``"valid"``, ...); None: the only one there is.
        on_error: for what colabfast refuses to read: an image or label file that is not a regular
            file or that a symlink leads out of ``root``, an image that cannot be read when listed:
            ``"raise"`` a :class:`LayoutError`, or ``"skip"``: leave it out (its image too) and list
            it in ``skipped``.
        strict: True: a label file or image Ultralytics would drop the image for is an error handled
            by ``on_error`` (what colabfast did before it followed Ultralytics); False: the image is
            dropped and listed, as Ultralytics does.
        retries: retries of each file read on Drive's transient errors.

    Raises:
        LayoutError: no images folder, several splits and ``split=None``, an unknown split, no YAML
            with ``names`` or a malformed one, a label file over ``MAX_LABEL_BYTES``, with
            ``on_error="raise"`` an image or label file that is a FIFO, a device, or a symlink leading
            out of ``root`` (nothing outside it is read), and with ``strict=True`` (and
            ``on_error="raise"``) a label file Ultralytics refuses. Each names the file (and line).
        FileNotFoundError: ``root`` does not exist.
    """

    name = "yolo"
    packs_split = True  # the export's split packed

    def __init__(self, root: PathLike, split: Optional[str] = None, *, on_error: str = "raise",
                 strict: bool = False, retries: int = 5):
        check_on_error(on_error)
        self.root, self.on_error, self.strict, self.retries = Path(root), on_error, strict, retries
        self.skipped: Skipped = Skipped()
        files, refused = list_files(self.root, retries)
        self.split, prefix = _pick_split(self.root, files, split)
        yaml_file, classes = _read_classes(self.root, files, refused, retries)
        by_rel = {f.rel: f for f in files}
        images = [f for f in files if f.rel.startswith(prefix) and _image(f.rel, self.root, on_error, self.skipped)]
        checked = dict(zip((f.rel for f in images), parallel_map(lambda f: _check_image(self.root, f, retries),
                                                                 images)))
        self._restored = {rel for rel, got in checked.items() if got is RESTORE}
        for rel in sorted(refused):
            if rel.startswith(prefix) and is_image(rel):
                reject(refuse(self.root, rel, refused), on_error, self.skipped)
        wanted = {label_path(f.rel) for f in images} | {label_path(rel) for rel in refused if rel.startswith(prefix)}
        usable = {label_path(f.rel) for f in images if checked[f.rel] is None or checked[f.rel] is RESTORE}
        labels = sorted(by_rel[rel] for rel in wanted & usable if rel in by_rel)  # a dropped image's: unread

        def parse(entry: FileEntry) -> _Labels | LayoutError:
            try:
                return _parse(_read_label(self.root, entry, retries), self.root / entry.rel, len(classes))
            except LayoutError as exc:
                return exc

        parsed: dict[str, _Labels | LayoutError] = dict(zip((f.rel for f in labels), parallel_map(parse, labels)))
        parsed.update((rel, refuse(self.root, rel, refused)) for rel in wanted if rel in refused)
        folder = label_path(prefix + "x.jpg")[: -len("x.txt")]  # images/train/ -> labels/train/
        self._list_orphans(files, folder, wanted)

        self.paths, self.files = [], [yaml_file]
        kept: list[_Labels] = []
        for image in images:
            label = label_path(image.rel)
            bad = checked[image.rel]
            if isinstance(bad, LayoutError) and not isinstance(bad, _Drop):  # unreadable
                reject(bad, on_error, self.skipped)
                continue
            if isinstance(bad, _Drop):
                if strict:
                    reject(bad, on_error, self.skipped)
                else:
                    self.skipped.add(bad.path, f"{bad.why}: left out, {ULTRALYTICS}")
                continue
            if bad is RESTORE:
                self.skipped.add(str(self.root / image.rel), "a JPEG whose last bytes are not its end marker FF D9: "
                                 "read as Ultralytics restores it (PIL's pixels, upright, saved as JPEG quality 100, "
                                 f"4:4:4; Ultralytics rewrites the file, colabfast leaves it as it is), {ULTRALYTICS}")
            got = parsed.get(label, NO_LABELS)
            if isinstance(got, _Drop) and not strict:
                where = f"line {got.line}: " if got.line is not None else ""
                self.skipped.add(got.path, f"{where}{got.why}: its image {image.rel} is left out, {ULTRALYTICS}")
                continue
            if isinstance(got, LayoutError):
                reject(got, on_error, self.skipped)
                continue
            if got.removed:
                self.skipped.add(str(self.root / label), f"line{'s' if len(got.removed) > 1 else ''} "
                                 f"{', '.join(map(str, got.removed))}: duplicate rows removed, {ULTRALYTICS}")
            self.paths.append(image.rel)
            self.files.append(image)
            if label in by_rel:
                self.files.append(by_rel[label])
            kept.append(got)
        self.files.sort()
        rows = np.concatenate([k.rows for k in kept]) if kept else NO_LABELS.rows
        self._offsets = np.cumsum([0] + [len(k.rows) for k in kept], dtype=np.int64)
        self._labels = rows[:, 0].astype(np.int64)
        self._boxes = np.concatenate([k.boxes() for k in kept]) if kept else np.zeros((0, 4))  # x1 y1 x2 y2, 0..1
        segments = [s for k in kept for s in k.segments]
        self._points: Optional[np.ndarray] = None  # float32 [P, 2] normalised, every polygon's points
        if segments and len(segments) == len(rows):
            self._points = np.concatenate(segments)
            self._point_offsets = np.cumsum([0] + [len(s) for s in segments], dtype=np.int64)
        elif segments:
            self.skipped.add(str(self.root / folder), f"{len(segments)} of the {len(rows)} objects are polygons, the "
                             "others boxes: the polygons are dropped and each object read as its box, as Ultralytics' "
                             "YOLODataset.verify_labels does for detection (its segment task refuses such a split)")
        self.info: dict[str, Any] = {"classes": classes}

    def _list_orphans(self, files: list[FileEntry], folder: str, wanted: set[str]) -> None:
        """List the label files of no image in ``skipped``: Ultralytics never reads them."""
        for f in files:
            # classes.txt: the class list LabelImg and some exporters write beside the labels
            if (f.rel.startswith(folder) and f.rel.endswith(".txt") and f.rel not in wanted
                    and f.rel != folder + "classes.txt"):
                self.skipped.add(str(self.root / f.rel), "a label file without an image: ignored, as Ultralytics "
                                 "ignores it")

    def __getitem__(self, index: int) -> tuple[ImageFile, dict[str, Any]]:
        """Sample ``index``: ``(ImageFile, {"boxes": float32 [M, 4] XYXY pixels, "labels": int64 [M]})``,
        and ``"segments"`` (per object ``[[x, y], ...]`` in pixels) in a segmentation dataset.

        Raises:
            LayoutError: the image's header cannot be read (the pixels need its size).
            OSError: the file cannot be read (after ``retries`` on transient errors).
        """
        rel = self.paths[index]
        data = read_file(self.root, rel, self.retries)
        if rel in self._restored:
            try:
                data = restore_jpeg(data)
            except Exception as exc:  # the file changed since it was listed
                raise LayoutError(self.root / rel, f"a JPEG without its end marker that PIL cannot decode ({exc})",
                                  fix="replace the file") from None
        width, height = _upright_size(data, self.root / rel)
        a, b = self._offsets[index], self._offsets[index + 1]
        boxes = (self._boxes[a:b] * np.array([width, height, width, height])).astype(np.float32)
        target: dict[str, Any] = {"boxes": boxes, "labels": self._labels[a:b].copy()}
        if self._points is not None:
            ends = self._point_offsets[a : b + 1]
            size = np.array([width, height], np.float32)  # float32, as Ultralytics' Instances.denormalize
            target["segments"] = [(self._points[p:q] * size).tolist() for p, q in zip(ends[:-1], ends[1:])]
        return ImageFile(data, rel, orient=True), target

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the folder holds ``images/`` beside a ``labels/`` with ``.txt`` files, or Roboflow's
        ``<split>/images/`` beside ``<split>/labels/`` with ``.txt`` files."""
        tree = tree_of(tree)

        def has_labels(folder: str) -> bool:
            return tree.is_dir(f"{folder}images") and tree.first_file(f"{folder}labels", _is_txt) is not None

        top = tree.entries()
        if not any(top.get(name) for name in ("images", *SPLIT_FOLDERS)):
            return False
        return has_labels("") or any(is_dir and has_labels(f"{name}/") for name, is_dir in sorted(top.items()))

    def describe(self) -> str:
        split = f" (split {self.split})" if self.split else ""
        kind = "polygons" if self._points is not None else "objects"
        return f"yolo layout{split}, {len(self)} images, {len(self._labels)} {kind}"



def _image(rel: str, root: Path, on_error: str, skipped: Skipped) -> bool:
    """Whether the file ``rel`` is one of the split's images as Ultralytics lists them (an extension in
    ``IMG_FORMATS``, not hidden) that colabfast decodes. An image torchvision reads and Ultralytics
    does not (``.ppm``, ``.pgm``) is listed in ``skipped``; one Ultralytics reads and colabfast cannot
    decode is refused as ``on_error`` says."""
    name = rel.rsplit("/", 1)[-1]
    extension = name.rpartition(".")[2].lower()
    if "." not in name or any(part.startswith(".") for part in rel.split("/")):
        return False
    if extension not in IMG_FORMATS:
        if is_image(rel):
            skipped.add(str(root / rel), f"a .{extension} image, not one of Ultralytics' IMG_FORMATS: ignored, as "
                        "Ultralytics ignores it")
        return False
    if not is_image(rel):
        reject(LayoutError(root / rel, f"a .{extension} image, which Ultralytics reads through OpenCV and colabfast "
                           "cannot decode", fix="convert it to JPEG or PNG"), on_error, skipped)
        return False
    return True


HEAD_BYTES = 1 << 16  # the start of an image file read to check it: its header (a JPEG's EXIF fits in 64 KiB)
EOI = b"\xff\xd9"  # a JPEG's end marker
RESTORE = "restore"  # _check_image's verdict on a JPEG without its end marker that PIL decodes


def restore_jpeg(data: bytes) -> bytes:
    """The JPEG Ultralytics' ``check_image`` writes in place of the JPEG ``data`` whose last two bytes
    are not its end marker: PIL's decode, its EXIF orientation applied (``ImageOps.exif_transpose``),
    saved as JPEG with ``subsampling=0, quality=100`` (``_exif_jpeg`` in ``ultralytics/data/utils.py``).

    Raises:
        Exception: what PIL raises for a file it cannot decode (a cut one: "image file is truncated").
    """
    with Image.open(io.BytesIO(data)) as img:
        upright = ImageOps.exif_transpose(img)
    out = io.BytesIO()
    upright.save(out, "JPEG", subsampling=0, quality=100)
    return out.getvalue()


def _check_image(root: Path, entry: FileEntry, retries: int) -> Optional[str | LayoutError]:
    """Ultralytics' ``check_image`` on the image ``entry``, from its first :data:`HEAD_BYTES` (all of
    it where PIL needs more) and, for a JPEG, its last two bytes: None where it keeps the file,
    :data:`RESTORE` where it restores it (a JPEG without its end marker that PIL decodes, read in
    full to know), or the :class:`_Drop` that says why it drops the image; in its order: PIL cannot
    open it, under 10 pixels on a side once upright (``exif_size``), a format not in ``IMG_FORMATS``.
    ``im.verify()`` is not run: it needs the whole file (``pack`` decodes it, and reports it as
    ``on_error`` says). A file that cannot be read (after ``retries``) is a :class:`LayoutError`
    for ``on_error``."""
    path = root / entry.rel
    try:
        return _check_read(root, entry, retries)
    except OSError as exc:
        return LayoutError(path, f"cannot be read ({exc.strerror or exc})")


def _check_read(root: Path, entry: FileEntry, retries: int) -> Optional[str | LayoutError]:
    """:func:`_check_image`, raising OSError where the file cannot be read."""
    path = root / entry.rel

    def head() -> tuple[bytes, bytes]:
        with open_regular(path) as f:
            first = f.read(HEAD_BYTES) or b""
            if len(first) < entry.size and entry.size >= 2:
                f.seek(-2, os.SEEK_END)
                return first, f.read(2) or b""
            return first, first[-2:]

    first, last = retry(head, retries)
    try:
        try:
            width, height, fmt = _header(first, path)
        except LayoutError:
            if len(first) >= entry.size:
                raise
            first = read_file(root, entry.rel, retries)
            width, height, fmt = _header(first, path)
    except LayoutError as exc:
        return _Drop(path, exc.why)
    if not (height > 9 and width > 9):
        return _Drop(path, f"an image of {width}x{height} pixels, under 10 on a side")
    if fmt.lower() not in IMG_FORMATS | {"jpeg2000"}:
        return _Drop(path, f"a {fmt} image, not of a format in Ultralytics' IMG_FORMATS")
    if fmt == "JPEG" and last != EOI:
        try:
            restore_jpeg(read_file(root, entry.rel, retries))
        except Exception as exc:  # as check_image, which drops the image for any
            return _Drop(path, f"a JPEG without its end marker that PIL cannot decode ({exc})")
        return RESTORE
    return None


def polygon_masks(segments: Sequence[Any], height: int, width: int) -> np.ndarray:
    """The masks of ``segments`` (a target's ``"segments"``: per object ``[[x, y], ...]`` in pixels)
    on a ``height`` x ``width`` image: uint8 ``[M, height, width]``, 1 inside object ``m``'s polygon.

    Drawn as Ultralytics' segment task draws them, ``polygons2masks(..., color=1, downsample_ratio=1)``
    (``ultralytics/data/utils.py``): the points cut to int32, then ``cv2.fillPoly``, so it needs OpenCV
    (as Ultralytics does; Colab has it). Its training draws them after its resizing and augmentation,
    each polygon resampled to 1000 points (``resample_segments``), at 1/4 of the size (``mask_ratio``):
    apply those to the segments first to get its exact training masks.

    Raises:
        ImportError: OpenCV (``cv2``) is not installed.
    """
    try:
        import cv2
    except ImportError:
        raise ImportError("polygon_masks draws polygons with OpenCV, as Ultralytics does: pip install "
                          "opencv-python-headless") from None
    masks = np.zeros((len(segments), height, width), np.uint8)
    for mask, polygon in zip(masks, segments):
        points = np.asarray(polygon, np.float64).reshape(-1, 2).astype(np.int32)  # truncated, as np.int32 casts
        cv2.fillPoly(mask, [points], color=1)
    return masks


def _is_txt(name: str) -> bool:
    return name.lower().endswith(".txt")


def yolo_splits(paths: list[str]) -> dict[str, str]:
    """The splits of a YOLO folder holding the files at ``paths`` (POSIX, relative to it): split name ->
    its images' path prefix: ``""`` -> ``images/`` (no split), ``images/<split>/`` (Ultralytics),
    ``<split>/images/`` (Roboflow)."""
    found: dict[str, str] = {}
    images = [rel.split("/") for rel in paths if is_image(rel)]
    if any(parts[0] == "images" and len(parts) == 2 for parts in images):
        found[""] = "images/"  # no split: all of images/
    else:
        for parts in images:
            if parts[0] == "images":
                found.setdefault(parts[1], f"images/{parts[1]}/")
    for parts in images:
        if len(parts) >= 3 and parts[1] == "images" and parts[0] != "images":
            found.setdefault(parts[0], f"{parts[0]}/images/")
    return found


def _pick_split(root: Path, files: list[FileEntry], split: Optional[str]) -> tuple[str, str]:
    """(split name, the images' path prefix): ``images/`` alone, ``images/<split>/``, ``<split>/images/``."""
    found = yolo_splits([f.rel for f in files])
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
        doc = load_yaml(read_text(root, entry, retries, MAX_YAML_BYTES), root / entry.rel)
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
            raise LayoutError(path, f"names' ids are {excerpt(list(names))}, not 0..{len(names) - 1}",
                              fix="number the classes 0, 1, 2, ... as Ultralytics does")
        names = [names[i] for i in range(len(names))]
    if not isinstance(names, list) or not all(isinstance(n, (str, int, float, bool)) for n in names):
        raise LayoutError(path, "names is not a list of class names nor a dict {id: name}")
    if "nc" in doc and doc["nc"] != len(names):
        raise LayoutError(path, f"nc is {excerpt(doc['nc'])} but names lists {len(names)} classes")
    return [str(n) for n in names]  # Ultralytics' check_class_names makes them strings too



class _Drop(LayoutError):
    """A label file Ultralytics' ``verify_image_label`` counts as corrupt: it drops the image (with a
    warning) and keeps the rest of the dataset."""


@dataclasses.dataclass
class _Labels:
    """One label file as Ultralytics reads it: ``rows`` float32 [M, 5] ``class, cx, cy, w, h`` (a
    polygon's box from ``segments2boxes``), ``segments`` (one float32 [K, 2] polygon per row, or none
    in a box file), and the lines of the duplicate rows it removed."""

    rows: np.ndarray
    segments: list[np.ndarray]
    removed: list[int]

    def boxes(self) -> np.ndarray:
        """float64 [M, 4] ``x1 y1 x2 y2`` divided by the image's width and height: a box row's corners,
        a polygon's extent exactly (``segments2boxes`` before its rounding through float32 ``xywh``)."""
        if self.segments:
            return np.array([[*s.min(0), *s.max(0)] for s in self.segments], np.float64)
        cx, cy, w, h = self.rows[:, 1:].astype(np.float64).T
        return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], 1)


NO_LABELS = _Labels(np.zeros((0, 5), np.float32), [], [])
DROP_FIX = "fix or delete the line (Ultralytics drops this image and trains on the rest)"


def _read_label(root: Path, entry: FileEntry, retries: int) -> str:
    """The text of a label file as Ultralytics opens it (``encoding="utf-8-sig"``).

    Raises:
        LayoutError: it has more than ``MAX_LABEL_BYTES`` (refused unread).
        _Drop: it is not UTF-8 (Ultralytics' read fails, and it drops the image).
    """
    return read_text(root, entry, retries, MAX_LABEL_BYTES, not_text=_Drop,
                     fix="save it as UTF-8 (Ultralytics drops this image)")


def _parse(text: str, path: Path, classes: int) -> _Labels:
    """One label file, by the rules of Ultralytics' ``verify_image_label`` (8.4.190), step for step.

    Lines are ``text.splitlines()``, blank ones skipped, fields split on whitespace. A file with a line
    of more than 6 fields is a segment file: each line ``class x1 y1 x2 y2 ...`` (at least one point),
    its box the polygon's extent (``segments2boxes``); otherwise each line is ``class cx cy w h``. In
    float32, as Ultralytics parses them, the checks are: every box value (``cx cy w h``) at most 1.01;
    no value below 0, or none below -0.01 and no negative width or height; integer classes below
    ``classes``. Duplicate rows (``np.unique(rows, axis=0)``; in a segment file, class and polygon
    both equal) are removed, the rows left in ``np.unique``'s sorted order, as Ultralytics leaves them.

    Raises:
        _Drop: the file breaks one of these rules (Ultralytics drops its image); names the line.
    """
    lines = [(n, line.split()) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        return NO_LABELS
    segments: list[np.ndarray] = []
    if any(len(fields) > 6 for _, fields in lines):
        for n, fields in lines:
            if len(fields) == 5:
                raise _Drop(path, "a box line (5 fields) in a file of polygons: Ultralytics refuses a file that "
                            "mixes them", n, fix=DROP_FIX)
            points = _numbers(fields[1:], path, n)
            if not len(points) or len(points) % 2:
                raise _Drop(path, f"{len(fields)} fields; a polygon is a class then x y pairs", n, fix=DROP_FIX)
            segments.append(points.reshape(-1, 2))
        cls = np.concatenate([_numbers(fields[:1], path, n) for n, fields in lines])
        lo = np.array([s.min(0) for s in segments], np.float32)  # segments2boxes: x1 y1, x2 y2, then xywh
        hi = np.array([s.max(0) for s in segments], np.float32)
        rows = np.concatenate([cls[:, None], (lo + hi) / 2, hi - lo], 1)
    else:
        for n, fields in lines:
            if len(fields) != 5:
                raise _Drop(path, f"{len(fields)} fields; expected {FORMAT}", n, fix=DROP_FIX)
        try:  # the whole file in one call; line by line only to name a bad field
            rows = np.array([fields for _, fields in lines], dtype=np.float32)
        except ValueError:
            rows = np.stack([_numbers(fields, path, n) for n, fields in lines])
    _check(rows, [n for n, _ in lines], path, classes, bool(segments))
    _, keep = np.unique(rows, axis=0, return_index=True)
    if len(keep) < len(rows) and segments:  # distinct polygons may share a class and a box
        keys = np.array([c.tobytes() + s.tobytes() for c, s in zip(rows[:, 0], segments)], dtype=object)
        _, keep = np.unique(keys, return_index=True)
    if len(keep) == len(rows):
        return _Labels(rows, segments, [])
    removed = sorted(set(range(len(rows))) - set(keep.tolist()))
    return _Labels(rows[keep], [segments[k] for k in keep] if segments else [], [lines[k][0] for k in removed])


def _numbers(fields: list[str], path: Path, line: int) -> np.ndarray:
    """``fields`` as float32, parsed as Ultralytics parses them (``np.array(fields, dtype=np.float32)``)."""
    try:
        return np.array(fields, dtype=np.float32)
    except ValueError:
        for field in fields:
            try:
                np.array(field, dtype=np.float32)
            except ValueError:
                raise _Drop(path, f"{field!r} is not a number; expected {FORMAT}", line, fix=DROP_FIX) from None
        raise  # every field parses alone: not reached


def _check(rows: np.ndarray, lines: list[int], path: Path, classes: int, polygons: bool) -> None:
    """Ultralytics' checks of a file's rows (``verify_image_label``), in its order; the error names the
    first line that fails the first check the file fails."""
    what = "its box (cx cy w h of the polygon's extent)" if polygons else "a coordinate"
    values = rows[:, 1:]
    if not values.max() <= 1.01:  # NaN fails here too
        r = int(np.flatnonzero(~(values <= 1.01).all(1))[0])
        bad = values[r][~(values[r] <= 1.01)][0]
        why = "not a number" if np.isnan(bad) else "over 1.01 (YOLO's are divided by the image's width and height; " \
            "Ultralytics allows 1% past the edge)"
        raise _Drop(path, f"{what} is {bad:g}, {why}", lines[r], fix=DROP_FIX)
    low = rows.min()
    if not (low >= 0 or low >= -0.01 and rows[:, 3:5].min() >= 0):
        if not rows[:, 0].min() >= 0:
            r = int(np.flatnonzero(~(rows[:, 0] >= 0))[0])
            raise _Drop(path, f"class id {rows[r, 0]:g} is {'negative' if rows[r, 0] < 0 else 'not a number'}",
                        lines[r], fix=DROP_FIX)
        if not low >= -0.01:
            r = int(np.flatnonzero(~(rows >= -0.01).all(1))[0])
            raise _Drop(path, f"{what} is {rows[r][~(rows[r] >= -0.01)][0]:g}, below -0.01 (Ultralytics allows "
                        "1% past the edge)", lines[r], fix=DROP_FIX)
        r = int(np.flatnonzero((rows[:, 3:5] < 0).any(1))[0])
        raise _Drop(path, "a negative width or height, where some value is negative too (Ultralytics allows "
                    "values down to -0.01 only with no negative width or height)", lines[r], fix=DROP_FIX)
    if not (rows[:, 0] % 1 == 0).all():
        r = int(np.flatnonzero(rows[:, 0] % 1 != 0)[0])
        raise _Drop(path, f"class id {rows[r, 0]:g} is not an integer", lines[r], fix=DROP_FIX)
    if not rows[:, 0].max() < classes:
        r = int(np.flatnonzero(rows[:, 0] >= classes)[0])
        raise _Drop(path, f"class id {rows[r, 0]:g} is not one of the {classes} classes of the YAML's names "
                    f"(0..{classes - 1})", lines[r], fix=DROP_FIX)


def _upright_size(data: bytes, path: Path) -> tuple[int, int]:
    """(width, height) of the image ``data`` once its EXIF orientation is applied (Ultralytics'
    ``exif_size``), from its header.

    Raises:
        LayoutError: ``data`` is not an image PIL reads, or one over PIL's decompression-bomb limit.
    """
    return _header(data, path)[:2]


def _header(data: bytes, path: Path) -> tuple[int, int, str]:
    """(width, height, PIL's format) of the image ``data`` (or its start), its size once its EXIF
    orientation is applied (Ultralytics' ``exif_size``), from its header.

    Raises:
        LayoutError: ``data`` is not an image PIL reads, or one over PIL's decompression-bomb limit.
    """
    try:
        with Image.open(io.BytesIO(data)) as img:
            fmt = img.format or ""
            if fmt == "PNG" and b"eXIf" not in data:  # no EXIF: spare getexif's decode of the PNG
                return (*img.size, fmt)
            return (*oriented_size(img), fmt)
    except (OSError, Image.DecompressionBombError, ValueError, SyntaxError) as exc:
        raise LayoutError(path, f"not an image PIL can read ({exc})") from None
