"""colabfast.layouts.yolo, .segmentation and .table: small real folders made here. YOLO against the
format's definition (boxes computed by hand, in pixels), masks byte-exact in their own mode and
palette, CSV class indices as ImageFolder numbers folders of those names; every hostile input an
error naming the file and line, or a listed skip."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from torchvision.datasets.folder import find_classes

from colabfast.layouts import ImageFile, LayoutError
from colabfast.layouts import table as table_module
from colabfast.layouts import yolo as yolo_module
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.table import Csv
from colabfast.layouts.yolo import Yolo, label_path
from colabfast.testing.data import encode, photo

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
    assert ds.skipped == [] and len(ds) == 4
    image, target = ds[0]
    assert image == ImageFile((yolo / "images/train/a.jpg").read_bytes(), "images/train/a.jpg", "image")
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
    assert Yolo(root, on_error="skip").skipped == [(str(root / "v1.0/labels/b.txt"), "a label file without an image")]


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


BAD_LINES = {
    "field_count": ("0 0.5 0.5 0.2\n", "4 fields"),
    "even_polygon": ("0 0.1 0.1 0.2 0.2 0.3\n", "6 fields"),
    "not_a_number": ("0 0.5 half 0.2 0.2\n", "'half' is not a number"),
    "nan": ("0 nan 0.5 0.2 0.2\n", "not finite"),
    "inf": ("0 0.5 0.5 inf 0.2\n", "not finite"),
    "outside_0_1": ("0 0.5 0.5 1.2 0.2\n", "coordinate 1.2 is outside 0..1"),
    "negative": ("0 -0.1 0.5 0.2 0.2\n", "coordinate -0.1 is outside 0..1"),
    "class_out_of_range": ("3 0.5 0.5 0.2 0.2\n", "class id 3 is not one of the 3 classes"),
    "class_negative": ("-1 0.5 0.5 0.2 0.2\n", "class id -1"),
    "class_not_integer": ("1.5 0.5 0.5 0.2 0.2\n", "class id 1.5"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_yolo_malformed_line_names_file_and_line_or_is_skipped(yolo, case):
    text, why = BAD_LINES[case]
    bad = write(yolo / "labels/train/a.txt", "1 0.5 0.5 0.2 0.4\n\n" + text)  # line 3 (a blank line between)
    with pytest.raises(LayoutError, match=why) as err:
        Yolo(yolo, "train")
    assert err.value.path == str(bad) and err.value.line == 3 and f"{bad}, line 3: " in str(err.value)
    ds = Yolo(yolo, "train", on_error="skip")
    assert "images/train/a.jpg" not in ds.paths and len(ds) == 3
    assert len(ds.skipped) == 1 and ds.skipped[0][0] == str(bad) and ds.skipped[0][1].startswith("line 3: ")
    assert all(f.rel != "labels/train/a.txt" for f in ds.files)


def test_yolo_label_without_image_is_an_error_or_a_skip(yolo):
    orphan = write(yolo / "labels/train/gone.txt", "0 0.5 0.5 0.2 0.2\n")
    with pytest.raises(LayoutError, match="a label file without an image") as err:
        Yolo(yolo, "train")
    assert err.value.path == str(orphan)
    ds = Yolo(yolo, "train", on_error="skip")
    assert len(ds) == 4 and ds.skipped == [(str(orphan), "a label file without an image")]


def test_yolo_label_file_over_the_limit_is_refused_unread(yolo, monkeypatch):
    monkeypatch.setattr(yolo_module, "MAX_LABEL_BYTES", 10)
    with pytest.raises(LayoutError, match="over the limit of 10"):
        Yolo(yolo, "train")


def test_yolo_label_file_not_utf8(yolo):
    (yolo / "labels/train/a.txt").write_bytes(b"0 0.5 0.5 0.2 0.2\n\xff\xfe\n")
    with pytest.raises(LayoutError, match="not UTF-8") as err:
        Yolo(yolo, "train")
    assert err.value.line == 2


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
    (yolo / "images/train/c.jpg").write_bytes(b"not a jpeg")
    ds = Yolo(yolo, "train")
    with pytest.raises(LayoutError, match="not an image PIL can read"):
        ds[2]


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
