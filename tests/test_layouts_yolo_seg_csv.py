"""colabfast.layouts.yolo, .segmentation and .table: small real folders made here. YOLO against the
format's definition (boxes computed by hand, in pixels), masks byte-exact in their own mode and
palette, CSV class indices as ImageFolder numbers folders of those names; every hostile input an
error naming the file and line, or a listed skip."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.datasets.folder import find_classes

import colabfast as cf
from colabfast.images.decode import decode_cpu
from colabfast.layouts import ImageFile, LayoutError
from colabfast.layouts import table as table_module
from colabfast.layouts import yolo as yolo_module
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.table import Csv
from colabfast.layouts.yolo import Yolo, label_path, polygon_masks
from colabfast.testing.data import encode, photo
from colabfast.testing.layouts import with_orientation

RNG = np.random.default_rng(0)


def write_image(path: Path, width: int, height: int, fmt: str = "JPEG") -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = encode(photo(width, height, RNG), fmt)
    path.write_bytes(data)
    return data


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# --- YOLO -------------------------------------------------------------------------------------------


MIXED = ("1 of the 3 objects are polygons, the others boxes: the polygons are dropped and each object read as its "
         "box, as Ultralytics' YOLODataset.verify_labels does for detection (its segment task refuses such a split)")


@pytest.fixture
def yolo(tmp_path) -> Path:
    """Ultralytics' layout, train and val: a labelled box image, a polygon, a background image with no
    label file and one with an empty label file, and a hidden macOS file that is no image."""
    root = tmp_path / "ds"
    write_image(root / "images/train/a.jpg", 200, 100)
    write(root / "labels/train/a.txt", "1 0.5 0.5 0.2 0.4\n0 0.25 0.75 0.5 0.5\n")
    write_image(root / "images/train/b.png", 64, 48, "PNG")  # no label file: background
    write_image(root / "images/train/c.jpg", 32, 32)
    write(root / "labels/train/c.txt", "")  # empty: background
    write_image(root / "images/train/sub/d.jpg", 100, 50)
    write(root / "labels/train/sub/d.txt", "2 0.1 0.2 0.5 0.1 0.3 0.9\r\n")  # a polygon, CRLF
    (root / "images/train/._a.jpg").write_bytes(b"\0\5\26\7 AppleDouble")
    write_image(root / "images/val/v.jpg", 40, 40)
    write(root / "labels/val/v.txt", "0 0.5 0.5 1 1\n")
    write(root / "data.yaml", "path: .\ntrain: images/train\nval: images/val\nnames: [cat, dog, bird]\n")
    return root


def test_yolo_boxes_are_the_formats_definition_in_pixels(yolo):
    ds = Yolo(yolo, "train")
    assert ds.name == "yolo" and ds.split == "train" and ds.info == {"classes": ["cat", "dog", "bird"]}
    assert ds.paths == ["images/train/a.jpg", "images/train/b.png", "images/train/c.jpg", "images/train/sub/d.jpg"]
    # d.txt's polygon among a.txt's boxes: read as boxes, the polygon listed as dropped (Ultralytics' verify_labels)
    assert ds.skipped == [(str(yolo / "labels/train"), MIXED)] and len(ds) == 4
    image, target = ds[0]
    assert image == ImageFile((yolo / "images/train/a.jpg").read_bytes(), "images/train/a.jpg", "image", orient=True)
    assert list(target) == ["boxes", "labels"]
    # 200x100: cx 100, cy 50, w 40, h 40 -> 80..120, 30..70; cx 50, cy 75, w 100, h 50 -> 0..100, 50..100
    assert target["boxes"].dtype == np.float32 and target["labels"].dtype == np.int64
    np.testing.assert_array_equal(target["boxes"], [[80, 30, 120, 70], [0, 50, 100, 100]])
    np.testing.assert_array_equal(target["labels"], [1, 0])
    for k in (1, 2):  # no label file, an empty one: background images
        _, target = ds[k]
        assert target["boxes"].shape == (0, 4) and target["boxes"].dtype == np.float32
        assert target["labels"].shape == (0,) and target["labels"].dtype == np.int64
    _, target = ds[3]  # 100x50 polygon: x .1 .5 .3 -> 10..50, y .2 .1 .9 -> 5..45
    np.testing.assert_array_equal(target["boxes"], [[10, 5, 50, 45]])
    np.testing.assert_array_equal(target["labels"], [2])
    assert [f.rel for f in ds.files] == ["data.yaml", "images/train/a.jpg", "images/train/b.png",
                                        "images/train/c.jpg", "images/train/sub/d.jpg", "labels/train/a.txt",
                                        "labels/train/c.txt", "labels/train/sub/d.txt"]
    assert all(f.size == (yolo / f.rel).stat().st_size for f in ds.files)
    val = Yolo(yolo, "val")
    np.testing.assert_array_equal(val[0][1]["boxes"], [[0, 0, 40, 40]])


def test_yolo_split_folder_with_a_dot(tmp_path):
    root = tmp_path / "v1.0"
    write_image(root / "v1.0/images/a.jpg", 10, 10)
    write(root / "v1.0/labels/a.txt", "0 0.5 0.5 1 1\n")
    write(root / "data.yaml", "names: [x]\n")
    write(root / "v1.0/README.txt", "not a label file: outside v1.0/labels/\n")
    ds = Yolo(root)
    assert ds.split == "v1.0" and ds.skipped == [] and ds[0][1]["labels"].tolist() == [0]
    write(root / "v1.0/labels/b.txt", "0 0.5 0.5 1 1\n")
    assert Yolo(root).skipped == [(str(root / "v1.0/labels/b.txt"), ORPHAN)]


def test_yolo_label_path_is_ultralytics_rule():
    assert label_path("images/train/a.jpg") == "labels/train/a.txt"
    assert label_path("x/images/y/images/b.c.PNG") == "x/images/y/labels/b.c.txt"  # the last /images/ only
    assert label_path("train/images/a.jpeg") == "train/labels/a.txt"


def test_yolo_split_must_be_named_when_there_are_several(yolo):
    with pytest.raises(LayoutError, match=r"several splits: 'train' \(images/train/\), 'val' \(images/val/\)"):
        Yolo(yolo)
    with pytest.raises(LayoutError, match="no split 'test'"):
        Yolo(yolo, "test")


def test_yolo_roboflow_export_and_names_dict(tmp_path):
    root = tmp_path / "rf"
    write_image(root / "train/images/x_jpg.rf.1.jpg", 80, 60)
    write(root / "train/labels/x_jpg.rf.1.txt", "1 0.5 0.5 0.5 0.5\n")
    write_image(root / "valid/images/y.jpg", 10, 10)
    write(root / "data.yaml", "train: ../train/images\nval: ../valid/images\nnc: 2\nnames: {0: ripe, 1: raw}\n")
    ds = Yolo(root, "train")
    assert ds.paths == ["train/images/x_jpg.rf.1.jpg"] and ds.info["classes"] == ["ripe", "raw"]
    np.testing.assert_array_equal(ds[0][1]["boxes"], [[20, 15, 60, 45]])
    assert Yolo.detect(root) and not Segmentation.detect(root)
    assert Yolo(root, "valid")[0][1]["labels"].shape == (0,)


def test_yolo_flat_images_folder_and_yaml_of_another_name(tmp_path):
    root = tmp_path / "flat"
    write_image(root / "images/a.jpg", 10, 20)
    write(root / "labels/a.txt", "0 0.5 0.5 1 1\n")
    write(root / "labels/classes.txt", "only\n")  # LabelImg's class list: no label file
    write(root / "mine.yaml", "names: [only]\n")
    ds = Yolo(root)
    assert ds.split == "" and ds.paths == ["images/a.jpg"] and ds.info == {"classes": ["only"]}
    np.testing.assert_array_equal(ds[0][1]["boxes"], [[0, 0, 10, 20]])
    assert Yolo.detect(root)


BAD_LINES = {  # each a file Ultralytics' verify_image_label refuses: it drops the image
    "field_count": ("0 0.5 0.5 0.2\n", "4 fields"),
    "even_polygon": ("0 0.1 0.1 0.2 0.2 0.3\n", "6 fields"),  # not over 6 fields: no polygon, a box of 6
    "not_a_number": ("0 0.5 half 0.2 0.2\n", "'half' is not a number"),
    "nan": ("0 nan 0.5 0.2 0.2\n", "a coordinate is nan, not a number"),
    "inf": ("0 0.5 0.5 inf 0.2\n", "a coordinate is inf, over 1.01"),
    "outside_0_1": ("0 0.5 0.5 1.2 0.2\n", "a coordinate is 1.2, over 1.01"),
    "just_over_1.01": ("0 0.5 0.5 1.0101 0.2\n", "a coordinate is 1.0101, over 1.01"),
    "negative": ("0 -0.1 0.5 0.2 0.2\n", "a coordinate is -0.1, below -0.01"),
    "just_under_-0.01": ("0 -0.0101 0.5 0.2 0.2\n", "a coordinate is -0.0101, below -0.01"),
    "negative_width": ("0 0.5 0.5 -0.005 0.2\n", "a negative width or height"),
    "class_out_of_range": ("3 0.5 0.5 0.2 0.2\n", "class id 3 is not one of the 3 classes"),
    "class_negative": ("-1 0.5 0.5 0.2 0.2\n", "class id -1 is negative"),
    "class_not_integer": ("1.5 0.5 0.5 0.2 0.2\n", "class id 1.5 is not an integer"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_yolo_malformed_line_drops_the_image_as_ultralytics_or_raises_when_strict(yolo, case):
    text, why = BAD_LINES[case]
    bad = write(yolo / "labels/train/a.txt", "1 0.5 0.5 0.2 0.4\n\n" + text)  # line 3 (a blank line between)
    ds = Yolo(yolo, "train")  # the default: Ultralytics' rule, the image left out and listed with the reason
    assert "images/train/a.jpg" not in ds.paths and len(ds) == 3
    assert all(f.rel != "labels/train/a.txt" for f in ds.files)
    (path, reason), = [(p, w) for p, w in ds.skipped if p == str(bad)]
    assert reason.startswith(f"line 3: {why}") and "its image images/train/a.jpg is left out" in reason, reason
    with pytest.raises(LayoutError, match=why) as err:
        Yolo(yolo, "train", strict=True)
    assert err.value.path == str(bad) and err.value.line == 3 and f"{bad}, line 3: " in str(err.value)
    assert "Ultralytics drops this image" in str(err.value)
    ds = Yolo(yolo, "train", strict=True, on_error="skip")
    assert "images/train/a.jpg" not in ds.paths and ds.skipped[0][0] == str(bad)


BAD_POLYGONS = {
    "box_among_polygons": ("0 0.1 0.1 0.2 0.2 0.3 0.1\n0 0.5 0.5 0.2 0.2\n", 2, "a box line (5 fields) in a file of"),
    "odd_coordinates": ("0 0.1 0.1 0.2 0.2 0.3 0.1 0.4\n", 1, "8 fields; a polygon is a class then x y pairs"),
    "class_only": ("0 0.1 0.1 0.2 0.2 0.3 0.1\n1\n", 2, "1 fields; a polygon"),
    "box_over_1.01": ("0 0.5 0.5 1.6 0.5 0.5 0.9\n", 1, "its box (cx cy w h of the polygon's extent) is 1.05"),
}


@pytest.mark.parametrize("case", sorted(BAD_POLYGONS))
def test_yolo_malformed_polygon_file_drops_the_image(yolo, case):
    text, line, why = BAD_POLYGONS[case]
    bad = write(yolo / "labels/train/sub/d.txt", text)
    ds = Yolo(yolo, "train")
    assert "images/train/sub/d.jpg" not in ds.paths
    assert [w for p, w in ds.skipped if p == str(bad)][0].startswith(f"line {line}: {why}")


def test_yolo_polygon_checked_on_its_box_as_ultralytics(tmp_path):
    """Ultralytics checks a polygon's box (cx cy w h), not its points: x from 0.5 to 1.5 is cx 1.0 and
    w 1.0, kept; the box runs past the image, as Ultralytics keeps it (not clipped)."""
    root = tmp_path / "ds"
    write_image(root / "images/a.jpg", 100, 50)
    write(root / "labels/a.txt", "0 0.5 0.2 1.5 0.2 1.0 0.8\n")
    write(root / "data.yaml", "names: [x]\n")
    ds = Yolo(root)
    assert ds.skipped == [] and ds.paths == ["images/a.jpg"]
    target = ds[0][1]
    np.testing.assert_allclose(target["boxes"], [[50, 10, 150, 40]], rtol=1e-6)
    np.testing.assert_allclose(target["segments"], [[[50, 10], [150, 10], [100, 40]]], rtol=1e-6)


def test_yolo_coordinates_within_1_percent_of_the_edge_are_kept_unclipped(tmp_path):
    """Ultralytics keeps values from -0.01 (with no negative width or height) to 1.01, as written."""
    root = tmp_path / "ds"
    write_image(root / "images/a.jpg", 200, 100)
    write(root / "labels/a.txt", "0 -0.01 0.5 0.2 0.2\n1 0.5 1.01 0.5 0.02\n")
    write(root / "data.yaml", "names: [x, y]\n")
    ds = Yolo(root)
    assert ds.skipped == [] and len(ds) == 1
    # cx -0.01*200 = -2, w 40 -> -22..18; cy 1.01*100 = 101, h 2 -> 100..102
    np.testing.assert_allclose(ds[0][1]["boxes"], [[-22, 40, 18, 60], [50, 100, 150, 102]], rtol=1e-6)


ORPHAN = "a label file without an image: ignored, as Ultralytics ignores it"


def test_yolo_label_without_image_is_ignored_and_listed(yolo, tmp_path):
    orphan = write(yolo / "labels/train/gone.txt", "0 0.5 0.5 0.2 0.2\n")
    for on_error in ("raise", "skip"):
        ds = Yolo(yolo, "train", on_error=on_error)
        assert len(ds) == 4 and ds.skipped == [(str(orphan), ORPHAN), (str(yolo / "labels/train"), MIXED)]
        assert "labels/train/gone.txt" not in [f.rel for f in ds.files]
    m = cf.pack(yolo, tmp_path / "y.h5", split="train", progress=False)  # listed in the pack's report
    assert {"path": str(orphan), "error": ORPHAN} in cf.info(m).skipped


def test_yolo_images_are_the_extensions_ultralytics_lists(yolo, tmp_path):
    """Ultralytics lists a split's images by IMG_FORMATS: a .ppm that ImageFolder reads is not one (its
    label file is then an orphan), a .heic is one that colabfast cannot decode (refused, not dropped)."""
    from ultralytics.data.utils import IMG_FORMATS  # the oracle: Ultralytics' own list

    assert yolo_module.IMG_FORMATS == set(IMG_FORMATS)
    ppm = yolo / "images/train/e.ppm"
    photo(30, 20, RNG).save(ppm)
    write(yolo / "labels/train/e.txt", "0 0.5 0.5 0.2 0.2\n")
    ds = Yolo(yolo, "train")
    assert "images/train/e.ppm" not in ds.paths and len(ds) == 4
    assert (str(ppm), "a .ppm image, not one of Ultralytics' IMG_FORMATS: ignored, as Ultralytics ignores it") \
        in ds.skipped and (str(yolo / "labels/train/e.txt"), ORPHAN) in ds.skipped
    heic = yolo / "images/train/f.heic"
    heic.write_bytes(b"\0\0\0\x18ftypheic")
    with pytest.raises(LayoutError, match=r"f\.heic: a \.heic image, which Ultralytics reads through OpenCV and "
                       r"colabfast cannot decode\. convert it to JPEG or PNG"):
        Yolo(yolo, "train")
    skipping = Yolo(yolo, "train", on_error="skip")
    assert len(skipping) == 4 and any(path == str(heic) for path, _ in skipping.skipped)
    m = cf.pack(yolo, tmp_path / "y.h5", split="train", on_error="skip", progress=False)
    assert len(cf.H5Dataset(m)) == 4 and any(s["path"] == str(heic) for s in cf.info(m).skipped)


def test_yolo_duplicate_rows_removed_as_ultralytics(tmp_path):
    """np.unique(rows, axis=0, return_index=True), then rows[index]: the duplicates go, and the rows
    left come in np.unique's sorted order (class 0 before class 1), as Ultralytics leaves them."""
    root = tmp_path / "ds"
    write_image(root / "images/a.jpg", 100, 100)
    write(root / "labels/a.txt", "1 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.4 0.4\n1 0.5 0.5 0.2 0.2\n1 0.5 0.5 0.2 0.2\n")
    write(root / "data.yaml", "names: [x, y]\n")
    ds = Yolo(root)
    assert ds.skipped == [(str(root / "labels/a.txt"), "lines 3, 4: duplicate rows removed, as Ultralytics' "
                           "verify_image_label does")]
    np.testing.assert_array_equal(ds[0][1]["labels"], [0, 1])
    np.testing.assert_allclose(ds[0][1]["boxes"], [[30, 30, 70, 70], [40, 40, 60, 60]], rtol=1e-6)
    # two polygons sharing a class and a box are both kept; a polygon written twice is one
    write(root / "labels/a.txt", "0 0.1 0.1 0.9 0.1 0.9 0.9\n0 0.1 0.1 0.9 0.9 0.9 0.1\n0 0.1 0.1 0.9 0.1 0.9 0.9\n")
    ds = Yolo(root)
    assert ds.skipped == [(str(root / "labels/a.txt"), "line 3: duplicate rows removed, as Ultralytics' "
                           "verify_image_label does")]
    # in np.unique's order of the rows' bytes: line 2 first (float32 0.9 is 66 66 66 3f, 0.1 cd cc cc 3d)
    assert ds[0][1]["segments"] == [[[10, 10], [90, 90], [90, 10]], [[10, 10], [90, 10], [90, 90]]]


def test_yolo_label_file_not_utf8_drops_the_image(yolo):
    bad = yolo / "labels/train/a.txt"
    bad.write_bytes(b"0 0.5 0.5 0.2 0.2\n\xff\xfe\n")
    ds = Yolo(yolo, "train")  # Ultralytics' open(encoding="utf-8-sig") fails: it drops the image
    assert "images/train/a.jpg" not in ds.paths
    assert [w for p, w in ds.skipped if p == str(bad)] == [
        "line 2: not UTF-8 text (byte 18): its image images/train/a.jpg is left out, as Ultralytics' "
        "verify_image_label does"]
    with pytest.raises(LayoutError, match="not UTF-8") as err:
        Yolo(yolo, "train", strict=True)
    assert err.value.line == 2


def test_yolo_label_file_over_the_limit_is_refused_unread(yolo, monkeypatch):
    monkeypatch.setattr(yolo_module, "MAX_LABEL_BYTES", 10)
    with pytest.raises(LayoutError, match="over the limit of 10"):
        Yolo(yolo, "train")


def test_yolo_needs_class_names(yolo):
    (yolo / "data.yaml").unlink()
    with pytest.raises(LayoutError, match="no data.yaml"):
        Yolo(yolo, "train")


@pytest.mark.parametrize("text, why, line", [
    ("names: [a, b\n", "not valid YAML", 2),
    ("names: {0: a, 2: b}\n", "ids are", None),
    ("names: [a, [b]]\n", "not a list of class names", None),
    ("nc: 3\nnames: [a, b]\n", "nc is 3", None),
    ("a: &a [x, x]\nb: &b [*a, *a]\nnames: [*b, *b]\n", "not a list of class names", None),  # aliases
])
def test_yolo_malformed_yaml(yolo, text, why, line):
    write(yolo / "data.yaml", text)
    with pytest.raises(LayoutError, match=why) as err:
        Yolo(yolo, "train")
    assert err.value.path == str(yolo / "data.yaml") and err.value.line == line


def test_yolo_unreadable_image_header_at_index(yolo):
    ds = Yolo(yolo, "train")
    (yolo / "images/train/c.jpg").write_bytes(b"not a jpeg")  # changed after it was listed
    with pytest.raises(LayoutError, match="not an image PIL can read"):
        ds[2]
    ds = Yolo(yolo, "train")  # listed now: dropped, as Ultralytics' check_image drops it
    assert "images/train/c.jpg" not in ds.paths
    why = dict(ds.skipped)[str(yolo / "images/train/c.jpg")]
    assert why.startswith("not an image PIL can read") and why.endswith("left out, as Ultralytics' "
                                                                         "verify_image_label does"), why


# The upright frame of each EXIF orientation, by hand (numpy, not PIL): the stored [H, W, C] pixels turned.
UPRIGHT = {1: lambda a: a, 2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 4: lambda a: a[::-1],
           5: lambda a: a.transpose(1, 0, 2), 6: lambda a: np.rot90(a, -1),
           7: lambda a: a[::-1, ::-1].transpose(1, 0, 2), 8: lambda a: np.rot90(a, 1)}


def exif_tree(root: Path, orientation: int) -> np.ndarray:
    """A 60x30 JPEG stored with EXIF ``orientation`` and one box; its stored pixels (as PIL decodes them)."""
    data = encode(photo(60, 30, RNG))
    (root / "images").mkdir(parents=True)
    (root / "images/a.jpg").write_bytes(with_orientation(data, orientation))
    write(root / "labels/a.txt", "0 0.25 0.5 0.2 0.4\n")
    write(root / "data.yaml", "names: [x]\n")
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_yolo_exif_orientation_boxes_and_pixels_upright_as_ultralytics(tmp_path, orientation):
    """Ultralytics reads the image upright (OpenCV applies the EXIF orientation) and its size by
    ``exif_size``: stored 60x30 with orientation 6 (and 5, 7, 8) is 30x60, and the label's box
    (cx .25, cy .5, w .2, h .4) is x 7.5 +- 3, y 30 +- 12 there; 2 to 4 flip it but keep 60x30."""
    stored = exif_tree(tmp_path / "ds", orientation)
    ds = Yolo(tmp_path / "ds")
    image, target = ds[0]
    assert image.orient and image.data == (tmp_path / "ds/images/a.jpg").read_bytes()
    want = [[4.5, 18, 10.5, 42]] if orientation >= 5 else [[9, 9, 21, 21]]
    np.testing.assert_allclose(target["boxes"], want, rtol=1e-6)
    m = cf.pack(tmp_path / "ds", tmp_path / "y.h5", progress=False)
    upright = UPRIGHT[orientation](stored)
    pil = cf.H5Dataset(m)[0]
    assert np.array_equal(np.asarray(pil[0]), upright)
    np.testing.assert_allclose(pil[1]["boxes"].numpy(), want, rtol=1e-6)
    assert np.array_equal(cf.H5Dataset(m, output="tensor")[0][0].permute(1, 2, 0).numpy(), upright)
    encoded = cf.H5Dataset(m, output="bytes")[0][0]  # what DataLoader(decode="gpu") decodes
    assert np.array_equal(decode_cpu(encoded).permute(1, 2, 0).numpy(), upright)
    # an upright file is stored as it is; a turned one as its upright pixels (PNG: no decoder turns a JPEG)
    assert (bytes(encoded.numpy()) == (tmp_path / "ds/images/a.jpg").read_bytes()) == (orientation == 1)


SEGMENTS = "2 0.1 0.2 0.5 0.1 0.3 0.9\n0 0.5 0.5 0.9 0.5 0.9 0.9 0.5 0.9\n"


def segment_tree(root: Path) -> Path:
    """Ultralytics' segment format: two polygons in a 100x50 image, a background image."""
    write_image(root / "images/a.jpg", 100, 50)
    write(root / "labels/a.txt", SEGMENTS)
    write_image(root / "images/b.jpg", 20, 20)
    write(root / "data.yaml", "names: [cat, dog, bird]\n")
    return root


def test_yolo_segment_dataset_keeps_its_polygons(tmp_path):
    ds = Yolo(segment_tree(tmp_path / "ds"))
    assert ds.skipped == [] and ds.describe() == "yolo layout, 2 images, 2 polygons"
    _, target = ds[0]
    assert list(target) == ["boxes", "labels", "segments"]
    np.testing.assert_array_equal(target["labels"], [2, 0])
    # the polygons in pixels of the 100x50 image, their boxes their extents (segments2boxes)
    np.testing.assert_allclose(target["segments"][0], [[10, 10], [50, 5], [30, 45]], rtol=1e-6)
    np.testing.assert_allclose(target["segments"][1], [[50, 25], [90, 25], [90, 45], [50, 45]], rtol=1e-6)
    np.testing.assert_allclose(target["boxes"], [[10, 5, 50, 45], [50, 25, 90, 45]], rtol=1e-6)
    assert ds[1][1]["segments"] == [] and ds[1][1]["boxes"].shape == (0, 4)
    m = cf.pack(tmp_path / "ds", tmp_path / "y.h5", progress=False)
    image, got = cf.H5Dataset(m)[0]
    assert list(got) == ["boxes", "labels", "segments"] and got["segments"] == target["segments"]
    assert torch.equal(got["boxes"], torch.from_numpy(target["boxes"]))


def test_polygon_masks_are_ultralytics_polygon2mask():
    pytest.importorskip("cv2")
    # a rectangle 1..4 x 1..3 (points cut to int, as np.int32 casts: 4.9 -> 4): filled, its edges included
    masks = polygon_masks([[[1, 1], [4.9, 1], [4.9, 3.5], [1, 3.5]], [[0, 0], [1, 0], [0, 1]]], 5, 6)
    want = np.zeros((2, 5, 6), np.uint8)
    want[0, 1:4, 1:5] = 1
    want[1, 0, 0:2] = want[1, 1, 0] = 1
    assert masks.dtype == np.uint8 and np.array_equal(masks, want), masks
    ultralytics = pytest.importorskip("ultralytics.data.utils")
    polygons = [np.array([[10.5, 10.2], [50.9, 5.0], [30.2, 45.7]]), np.array([[50, 25], [90, 25], [90, 45], [50, 45]])]
    theirs = ultralytics.polygons2masks((50, 100), [p.reshape(-1) for p in polygons], color=1)  # Ultralytics' own
    assert np.array_equal(polygon_masks(polygons, 50, 100), theirs)


# Label files Ultralytics' verify_image_label keeps, changes or refuses (a 40x20 image each).
ULTRALYTICS_CASES = {
    "box": "1 0.5 0.5 0.2 0.4\n0 0.25 0.75 0.5 0.5\n",
    "edge": "0 -0.01 0.5 0.2 0.2\n1 0.5 1.01 0.5 0.02\n0 1.01 0 1.01 -0.0\n",
    "duplicates": "1 0.5 0.5 0.2 0.2\n0 0.5 0.5 0.4 0.4\n1 0.5 0.5 0.2 0.2\n",
    "bom_cr": "\ufeff0 0.5 0.5 0.2 0.2\r1 0.5 0.5 0.3 0.3\r",
    "empty": "  \n\n",
    "class": "3 0.5 0.5 0.2 0.2\n",
    "nan": "0 0.5 nan 0.2 0.2\n",
    "fields": "0 0.5 0.5 0.2\n",
    "six": "0 0.5 0.5 0.2 0.2 0.1\n",
    "over": "0 0.5 0.5 1.0101 0.2\n",
    "under": "0 -0.0101 0.5 0.2 0.2\n",
    "negative_size": "0 -0.005 0.5 -0.001 0.2\n",
    "mixed": "0 0.1 0.1 0.2 0.2 0.3 0.1\n0 0.5 0.5 0.2 0.2\n",
    "word": "0 0.5 half 0.2 0.2\n",
}


def test_yolo_reads_what_ultralytics_reads(tmp_path):
    """Ultralytics' own functions on the same files: ``verify_image_label`` (kept or dropped, the
    labels, the upright size) and ``imread`` (the pixels, upright), against the layout and its mirror."""
    utils = pytest.importorskip("ultralytics.data.utils")
    from ultralytics.utils.patches import imread

    root = tmp_path / "ds"
    write(root / "data.yaml", "names: [x, y, z]\n")
    for k, (name, text) in enumerate(sorted(ULTRALYTICS_CASES.items())):
        data = encode(photo(40, 20, RNG))
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / f"images/{name}.jpg").write_bytes(with_orientation(data, 1 + k % 8))
        write(root / f"labels/{name}.txt", text)
    (root / "images/latin1.jpg").write_bytes(encode(photo(40, 20, RNG)))
    (root / "labels/latin1.txt").write_bytes("0 0.5 0.5 0.2 0.2 # caf\xe9\n".encode("latin-1"))
    ds = Yolo(root)
    m = cf.pack(root, tmp_path / "y.h5", progress=False)
    mirrored = cf.H5Dataset(m)
    checked = dropped = 0
    for image in sorted((root / "images").iterdir()):
        rel, label = f"images/{image.name}", root / "labels" / (image.stem + ".txt")
        _, lb, shape, segments, *_ = utils.verify_image_label((str(image), str(label), "", False, 3, 0, 0, False))
        if lb is None:
            assert rel not in ds.paths and any(path == str(label) for path, _ in ds.skipped), rel
            dropped += 1
            continue
        i = ds.paths.index(rel)
        h, w = shape
        cx, cy, bw, bh = lb[:, 1:].astype(np.float64).T
        boxes = np.stack([cx - bw / 2, cy - bh / 2, cx + bw / 2, cy + bh / 2], 1) * [w, h, w, h]
        for target in (ds[i][1], mirrored[i][1]):
            np.testing.assert_allclose(np.asarray(target["boxes"]), boxes.reshape(-1, 4), rtol=1e-6, atol=1e-5)
            np.testing.assert_array_equal(np.asarray(target["labels"]), lb[:, 0].astype(np.int64))
        assert np.array_equal(np.asarray(mirrored[i][0]), imread(str(image))[..., ::-1]), rel
        checked += 1
    assert (checked, dropped) == (5, 10)


def test_yolo_images_ultralytics_drops_or_restores_as_its_check_image(tmp_path):
    """Ultralytics' own ``verify_image_label`` (its ``check_image``) on a copy of the export: an image
    under 10 pixels on a side, content of a format not in ``IMG_FORMATS``, a cut JPEG are dropped; a
    JPEG with bytes after its end marker is rewritten (upright, quality 100) and trained on. The
    layout drops and lists the same images, and its mirror's pixels are ``imread`` of the restored file."""
    utils = pytest.importorskip("ultralytics.data.utils")
    from ultralytics.utils.patches import imread

    root, rng = tmp_path / "ds", np.random.default_rng(6)  # its own: whether PIL decodes no_end.jpg depends on it
    write(root / "data.yaml", "names: [x]\n")
    jpeg = encode(photo(40, 20, rng))
    gif, ppm = io.BytesIO(), io.BytesIO()
    photo(40, 20, rng).save(gif, "GIF")
    photo(40, 20, rng).save(ppm, "PPM")
    files = {
        "tiny.jpg": encode(photo(8, 12, rng)),  # 8 wide, 12 high
        "flat.png": encode(photo(40, 9, rng), "PNG"),
        "gif.jpg": gif.getvalue(),
        "ppm.png": ppm.getvalue(),
        "cut.jpg": jpeg[: len(jpeg) // 2],  # PIL cannot open it: dropped
        "short.jpg": jpeg[:-40],  # PIL opens it, cannot decode it: dropped
        "no_end.jpg": encode(photo(40, 20, rng))[:-2],  # no end marker; PIL decodes this one: restored
        "trailing.jpg": with_orientation(encode(photo(40, 20, rng)), 6) + b"\0\0 trailing bytes",  # restored
        "ok.jpg": encode(photo(40, 20, rng)),
        "small_ok.png": encode(photo(10, 10, rng), "PNG"),
    }
    for name, data in files.items():
        (root / "images").mkdir(parents=True, exist_ok=True)
        (root / "images" / name).write_bytes(data)
        write(root / "labels" / (name.rsplit(".", 1)[0] + ".txt"), "0 0.25 0.5 0.2 0.4\n")
    theirs = tmp_path / "theirs"  # Ultralytics rewrites a JPEG it restores: a copy
    shutil.copytree(root, theirs)
    ds = Yolo(root)
    mirrored = cf.H5Dataset(cf.pack(root, tmp_path / "y.h5", progress=False))
    tensors = cf.H5Dataset(tmp_path / "y.h5", output="tensor")
    skipped = dict(ds.skipped)
    dropped, restored = [], []
    for name in sorted(files):
        rel, image = f"images/{name}", theirs / "images" / name
        _, lb, shape, *_, msg = utils.verify_image_label((str(image), str(theirs / "labels" / (image.stem + ".txt")),
                                                          "", False, 1, 0, 0, False))
        if lb is None:
            assert rel not in ds.paths and "left out" in skipped[str(root / rel)], (rel, msg)
            dropped.append(name)
            continue
        assert ("restored" in msg) == ("restores it" in skipped.get(str(root / rel), "")), (rel, msg)
        restored.append(name) if "restored" in msg else None
        i = ds.paths.index(rel)
        h, w = shape
        want = np.array([[0.15 * w, 0.3 * h, 0.35 * w, 0.7 * h]])
        for target in (ds[i][1], mirrored[i][1]):
            np.testing.assert_allclose(np.asarray(target["boxes"]), want, rtol=1e-6)
        pixels = imread(str(image))[..., ::-1]  # what Ultralytics trains on: the restored file's
        assert np.array_equal(np.asarray(mirrored[i][0]), pixels), rel
        assert np.array_equal(tensors[i][0].permute(1, 2, 0).numpy(), pixels), rel
    assert dropped == ["cut.jpg", "flat.png", "gif.jpg", "ppm.png", "short.jpg", "tiny.jpg"]
    assert restored == ["no_end.jpg", "trailing.jpg"]
    assert (root / "images/trailing.jpg").read_bytes() == files["trailing.jpg"]  # the source left as it is
    with pytest.raises(LayoutError, match="cut.jpg: not an image PIL can read"):
        Yolo(root, strict=True)


def test_yolo_segments_are_what_ultralytics_reads(tmp_path):
    utils = pytest.importorskip("ultralytics.data.utils")
    root = segment_tree(tmp_path / "ds")
    write(root / "labels/a.txt", SEGMENTS + "1 0.1 0.1 0.2 0.1 0.2 0.2\n" + SEGMENTS)  # duplicates too
    _, lb, (h, w), segments, *_ = utils.verify_image_label((str(root / "images/a.jpg"), str(root / "labels/a.txt"),
                                                           "", False, 3, 0, 0, False))
    target = Yolo(root)[0][1]
    np.testing.assert_array_equal(target["labels"], lb[:, 0].astype(np.int64))
    assert len(target["segments"]) == len(segments) == 3
    for ours, theirs in zip(target["segments"], segments):
        np.testing.assert_array_equal(np.array(ours, np.float32), theirs * np.array([w, h], np.float32))


# --- segmentation -----------------------------------------------------------------------------------


def palette_mask(width: int, height: int) -> Image.Image:
    mask = Image.fromarray(RNG.integers(0, 4, (height, width), dtype=np.uint8), "P")
    mask.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0])
    return mask


@pytest.fixture
def seg(tmp_path) -> Path:
    root = tmp_path / "seg"
    write_image(root / "images/a.jpg", 30, 20)
    (root / "masks").mkdir(parents=True)
    palette_mask(30, 20).save(root / "masks/a.png")
    write_image(root / "images/sub/b.png", 16, 8, "PNG")
    (root / "masks/sub").mkdir()
    Image.fromarray(RNG.integers(0, 255, (8, 16), dtype=np.uint8), "L").save(root / "masks/sub/b.png")
    return root


def test_segmentation_pairs_masks_exact_in_their_mode_and_palette(seg):
    ds = Segmentation(seg)
    assert ds.name == "segmentation" and ds.paths == ["images/a.jpg", "images/sub/b.png"] and ds.skipped == []
    assert [f.rel for f in ds.files] == ["images/a.jpg", "images/sub/b.png", "masks/a.png", "masks/sub/b.png"]
    for k, (name, mode) in enumerate([("a", "P"), ("sub/b", "L")]):
        image, mask = ds[k]
        assert image.kind == "image" and image.data == (seg / ds.paths[k]).read_bytes()
        assert mask.kind == "mask" and mask.path == f"masks/{name}.png"
        got, want = Image.open(io.BytesIO(mask.data)), Image.open(seg / mask.path)
        assert got.mode == want.mode == mode and got.getpalette() == want.getpalette()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert Segmentation.detect(seg) and not Yolo.detect(seg)


def test_segmentation_labels_folder(seg):
    (seg / "masks").rename(seg / "labels")
    ds = Segmentation(seg)
    assert ds[0][1].path == "labels/a.png" and ds.info == {"masks": "labels"}
    assert Segmentation.detect(seg)
    write(seg / "labels/x.txt", "0 0.5 0.5 1 1\n")  # YOLO labels beside: not a segmentation folder
    assert not Segmentation.detect(seg)


def test_segmentation_image_without_mask(seg):
    write_image(seg / "images/c.jpg", 8, 8)
    with pytest.raises(LayoutError, match="an image without a mask") as err:
        Segmentation(seg)
    assert err.value.path == str(seg / "images/c.jpg")
    ds = Segmentation(seg, on_error="skip")
    assert ds.paths == ["images/a.jpg", "images/sub/b.png"] and ds.skipped == [
        (str(seg / "images/c.jpg"), "an image without a mask")]


def test_segmentation_mask_without_image(seg):
    palette_mask(8, 8).save(seg / "masks/z.png")
    with pytest.raises(LayoutError, match="a mask without an image"):
        Segmentation(seg)
    assert Segmentation(seg, on_error="skip").skipped == [(str(seg / "masks/z.png"), "a mask without an image")]


def test_segmentation_two_images_with_one_stem(seg):
    write_image(seg / "images/a.png", 30, 20, "PNG")
    with pytest.raises(LayoutError, match="several files with the stem images/a"):
        Segmentation(seg)
    ds = Segmentation(seg, on_error="skip")
    assert ds.paths == ["images/sub/b.png"] and len(ds.skipped) == 3  # both images, and the lone mask


def test_segmentation_mask_of_another_size_fails_at_index(seg):
    palette_mask(31, 20).save(seg / "masks/a.png")
    ds = Segmentation(seg)  # sizes are in the files, not read at listing
    with pytest.raises(LayoutError, match="the mask is 31x20 pixels, its image images/a.jpg is 30x20"):
        ds[0]
    assert ds[1][1].path == "masks/sub/b.png"


# --- CSV --------------------------------------------------------------------------------------------


@pytest.fixture
def kaggle(tmp_path) -> Path:
    """A Kaggle-style folder: train.csv beside train/ (ids without extension), and a sub-folder."""
    root = tmp_path / "comp"
    for name in ("a1", "a2", "a3", "a4"):
        write_image(root / f"train/{name}.jpg", 12, 10)
    write_image(root / "train/extra/a5.png", 12, 10, "PNG")
    write_image(root / "train/a9.jpg", 12, 10)  # in no row: not a sample
    write(root / "train.csv", "id,label,age,score\na3,zebra,3,0.5\na1,Ant,1,1\na2,bee,12,2.25\n"
                              "a4,zebra,1,1.0\nextra/a5,bee,7,3\n")
    return root


def test_csv_class_names_are_imagefolder_indices(kaggle, tmp_path):
    ds = Csv(kaggle, kaggle / "train.csv")
    assert ds.name == "csv" and ds.skipped == []
    assert ds.paths == ["train/a3.jpg", "train/a1.jpg", "train/a2.jpg", "train/a4.jpg", "train/extra/a5.png"]
    folders = tmp_path / "imagefolder"
    for name in ("zebra", "Ant", "bee"):
        (folders / name).mkdir(parents=True)
    classes, class_to_idx = find_classes(str(folders))
    assert ds.info == {"columns": ["label", "age", "score"], "classes": {"label": classes}}
    image, target = ds[0]
    assert image == ImageFile((kaggle / "train/a3.jpg").read_bytes(), "train/a3.jpg", "image")
    assert target == (class_to_idx["zebra"], 3, 0.5)
    assert [ds[k][1] for k in range(len(ds))] == [(2, 3, 0.5), (0, 1, 1.0), (1, 12, 2.25), (2, 1, 1.0), (1, 7, 3.0)]
    assert all(type(ds[k][1][1]) is int and type(ds[k][1][2]) is float for k in range(len(ds)))
    assert [f.rel for f in ds.files] == ["train.csv", "train/a1.jpg", "train/a2.jpg", "train/a3.jpg",
                                        "train/a4.jpg", "train/extra/a5.png"]


def test_csv_single_label_column_numbers_and_paths_with_extension(tmp_path):
    root = tmp_path / "imgs"
    for name in ("x.jpg", "y.jpg", "d/z.png"):
        write_image(root / name, 8, 8, "PNG" if name.endswith("png") else "JPEG")
    table = write(tmp_path / "labels.csv", "\ufeffImage;target\nd/z.png;2\ny.jpg;1.0\n./x.jpg;0\n")  # BOM, ';'
    ds = Csv(root, table)
    assert ds.paths == ["d/z.png", "y.jpg", "x.jpg"] and [ds[k][1] for k in range(3)] == [2, 1, 0]
    assert ds.info == {"columns": ["target"], "classes": {}}
    assert ds.files[0].rel == "../labels.csv"


def test_csv_path_column_rule_and_the_only_table(tmp_path):
    root = tmp_path / "r"
    write_image(root / "p.jpg", 8, 8)
    write(root / "t.csv", "label,FileName\ncat,p.jpg\n")  # the path column is found by name, not place
    ds = Csv(root)
    assert ds.paths == ["p.jpg"] and ds[0][1] == 0 and ds.info["classes"] == {"label": ["cat"]}
    assert Csv.detect(root)
    write(root / "u.csv", "x\n")
    with pytest.raises(LayoutError, match="expected one .csv table at the top"):
        Csv(root)
    assert not Csv.detect(root)


def bad_csv(kaggle: Path, row: str) -> Path:
    """The kaggle table with ``row`` added as its line 7."""
    return write(kaggle / "train.csv", (kaggle / "train.csv").read_text() + row + "\n")


BAD_ROWS = {
    "duplicate_id": ("a1,bee,2,2", "names train/a1.jpg, as line 3 does"),
    "duplicate_by_extension": ("a1.jpg,bee,2,2", "names train/a1.jpg, as line 3 does"),
    "dotdot": ("../outside,bee,2,2", "has a '..' part"),
    "resolves_outside": ("train/../../outside.jpg,bee,2,2", "has a '..' part"),
    "absolute": ("/etc/passwd,bee,2,2", "empty or absolute"),
    "windows_absolute": ("C:\\x.jpg,bee,2,2", "empty or absolute"),
    "no_such_image": ("a8,bee,2,2", "'a8' names no image"),
    "not_an_image": ("train.csv,bee,2,2", "not an image file"),
    "field_count": ("a9,bee,2", "3 fields, the header has 4"),
    "empty_label": ("a9,,2,2", "column 'label' has no value"),
    "nan": ("a9,bee,nan,2", "column 'age' has 'nan', not a finite number"),
    "inf": ("a9,bee,2,-inf", "column 'score' has '-inf'"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_csv_bad_row_names_table_and_line_or_is_skipped(kaggle, case):
    (kaggle.parent / "outside.jpg").write_bytes(encode(photo(8, 8, RNG)))
    row, why = BAD_ROWS[case]
    table = bad_csv(kaggle, row)
    with pytest.raises(LayoutError, match=why.replace("(", r"\(")) as err:
        Csv(kaggle, table)
    assert err.value.path == str(table) and err.value.line == 7
    ds = Csv(kaggle, table, on_error="skip")
    assert len(ds) == 5 and len(ds.skipped) == 1 and ds.skipped[0][0] == str(table)
    assert ds.skipped[0][1].startswith("line 7: ") and all(not p.startswith("..") for p in ds.paths)


def test_csv_ambiguous_id(kaggle):
    write_image(kaggle / "other/a1.png", 8, 8, "PNG")
    with pytest.raises(LayoutError, match="'a1' names 2 images: other/a1.png, train/a1.jpg"):
        Csv(kaggle, kaggle / "train.csv")


def test_csv_over_the_size_limit_is_refused_unread(kaggle, monkeypatch):
    monkeypatch.setattr(table_module, "MAX_TABLE_BYTES", 20)
    monkeypatch.setattr(table_module, "read_limited", lambda *a: pytest.fail("read the table"))
    with pytest.raises(LayoutError, match="over the limit of 20 B"):
        Csv(kaggle, kaggle / "train.csv")


def test_csv_not_utf8_or_not_csv(kaggle):
    (kaggle / "train.csv").write_bytes(b"id,label\na1,caf\xe9\n")
    with pytest.raises(LayoutError, match="not UTF-8") as err:
        Csv(kaggle, kaggle / "train.csv")
    assert err.value.line == 2
    write(kaggle / "train.csv", 'id,label\na1,"unclosed\n')
    with pytest.raises(LayoutError, match="not CSV"):
        Csv(kaggle, kaggle / "train.csv")


def test_csv_without_a_label_column(kaggle):
    write(kaggle / "train.csv", "id\na1\n")
    with pytest.raises(LayoutError, match="no label column"):
        Csv(kaggle, kaggle / "train.csv")


def test_on_error_must_be_raise_or_skip(kaggle):
    with pytest.raises(ValueError, match="on_error must be"):
        Csv(kaggle, kaggle / "train.csv", on_error="ignore")
