"""colabfast.layouts.coco and .voc against torchvision's CocoDetection, VOCDetection and
VOCSegmentation on the same small folders (made as torchvision's tests/test_datasets.py makes
them), and each hostile annotation a LayoutError or a listed skip."""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from colabfast.layouts import LayoutError
from colabfast.layouts import coco as coco_module
from colabfast.layouts.coco import Coco
from colabfast.layouts.voc import VOCDetection, VOCSegmentation
from colabfast.testing.data import encode, photo

datasets = pytest.importorskip("torchvision.datasets")
pytest.importorskip("pycocotools")


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


# --- COCO ------------------------------------------------------------------------------------------

def make_coco(root: Path, ann_file: Path) -> dict:
    """Images under ``root`` (JPEG and PNG, one in a sub-folder) and a COCO JSON at ``ann_file`` whose
    image ids are out of order, whose annotations interleave images, and with an image without any."""
    rng = np.random.default_rng(0)
    names = {7: "b.jpg", 3: "a.jpg", 11: "sub/c.png", 5: "d.jpg"}
    images = []
    for i, name in names.items():
        w, h = int(rng.integers(20, 60)), int(rng.integers(20, 60))
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(encode(photo(w, h, rng), "PNG" if name.endswith(".png") else "JPEG"))
        images.append({"id": i, "file_name": name, "width": w, "height": h})
    annotations = []
    for k, image_id in enumerate([7, 3, 7, 11, 3, 7]):  # image 5 has none
        img = next(im for im in images if im["id"] == image_id)
        x, y = float(rng.uniform(0, img["width"] / 2)), float(rng.uniform(0, img["height"] / 2))
        w, h = float(rng.uniform(1, img["width"] - x)), float(rng.uniform(1, img["height"] - y))
        annotations.append({"id": 100 + k, "image_id": image_id, "category_id": int(rng.integers(1, 4)),
                            "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0,
                            "segmentation": [[x, y, x + w, y, x + w, y + h]]})
    categories = [{"id": c, "name": n, "supercategory": "thing"} for c, n in ((1, "cat"), (2, "dog"), (3, "bird"))]
    dataset = {"info": {"description": "test"}, "images": images, "annotations": annotations, "categories": categories}
    ann_file.write_text(json.dumps(dataset))
    return dataset


def assert_matches_coco(layout: Coco, root: Path, ann_file: Path) -> None:
    oracle = datasets.CocoDetection(str(root), str(ann_file))
    assert len(layout) == len(oracle)
    assert layout.ids == oracle.ids
    for i in range(len(oracle)):
        image, target = oracle[i]
        sample = layout[i]
        assert sample["id"] == oracle.ids[i]
        assert sample["image"].path == layout.paths[i]
        np.testing.assert_array_equal(pixels(sample["image"].data), np.asarray(image))
        assert sample["target"] == target


def test_coco_matches_torchvision(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    ann = tmp_path / "instances.json"
    dataset = make_coco(root, ann)
    layout = Coco(root, ann)
    assert_matches_coco(layout, root, ann)
    assert layout.ids == [3, 5, 7, 11]
    assert layout.paths == ["a.jpg", "d.jpg", "b.jpg", "sub/c.png"]
    assert [len(layout[i]["target"]) for i in range(4)] == [2, 0, 3, 1]
    assert layout.info["categories"] == dataset["categories"]
    assert layout.info["annotation_file"] == os.path.abspath(ann)
    assert layout.info["coco_keys"] == list(dataset)  # the JSON's keys in its order, as pycocotools keeps them
    assert layout.info["coco_other"] == {k: v for k, v in dataset.items()
                                         if k not in ("images", "annotations", "categories")}
    assert sorted(f.rel for f in layout.files) == sorted([*layout.paths, os.path.abspath(ann)])
    assert all(f.size == os.path.getsize(root / f.rel) for f in layout.files if f.rel in layout.paths)
    assert layout.skipped == []
    assert not Coco.detect(root)


def test_coco_roboflow_export(tmp_path):
    train = tmp_path / "export" / "train"
    train.mkdir(parents=True)
    ann = train / "_annotations.coco.json"
    make_coco(train, ann)
    assert Coco.detect(train)
    layout = Coco(train)
    assert_matches_coco(layout, train, ann)
    assert layout.info["annotation_file"] == "_annotations.coco.json"
    assert "_annotations.coco.json" in {f.rel for f in layout.files}


def coco_case(tmp_path: Path, change) -> tuple[Path, Path]:
    """A COCO folder whose JSON ``change`` (a function of the dataset dict) made hostile."""
    root = tmp_path / "images"
    root.mkdir()
    ann = root / "_annotations.coco.json"
    dataset = make_coco(root, ann)
    text = change(dataset, root)
    ann.write_text(text if isinstance(text, str) else json.dumps(dataset))
    return root, ann


def set_image(k, **values):
    def change(d, root):
        d["images"][k].update(values)
    return change


def set_ann(k, **values):
    def change(d, root):
        d["annotations"][k].update(values)
    return change


def outside_file(d, root):
    (root.parent / "secret.jpg").write_bytes((root / "a.jpg").read_bytes())
    (root / "link.jpg").symlink_to(root.parent / "secret.jpg")
    d["images"][1]["file_name"] = "link.jpg"


def outside_folder(d, root):
    (root.parent / "elsewhere").mkdir()
    (root.parent / "elsewhere" / "a.jpg").write_bytes((root / "a.jpg").read_bytes())
    (root / "linked").symlink_to(root.parent / "elsewhere")
    d["images"][1]["file_name"] = "linked/a.jpg"


def dotdot(d, root):
    (root.parent / "secret.jpg").write_bytes((root / "a.jpg").read_bytes())
    d["images"][1]["file_name"] = "../secret.jpg"


def nan_bbox(d, root):
    d["annotations"][0]["bbox"] = "NANBOX"  # image 7's
    return json.dumps(d).replace('"NANBOX"', "[NaN, 1, 1, 1]")


def duplicate_image(d, root):
    d["images"].append(dict(d["images"][0], file_name="a.jpg"))  # image 7 again


def missing_file(d, root):
    (root / "a.jpg").unlink()  # image 3


# (the JSON's change, what the error says, the image ids left with on_error="skip"). What pycocotools loads
# (an image without width, a box past the edge, an unknown category or image_id) is in COCO_LENIENT instead.
COCO_CASES = {
    "absolute": (set_image(1, file_name="/etc/passwd"), "not a path inside", [5, 7, 11]),
    "dotdot": (dotdot, "not a path inside", [5, 7, 11]),
    "hidden": (set_image(1, file_name=".hidden/a.jpg"), "not a path inside", [5, 7, 11]),
    "symlink out": (outside_file, "resolves outside", [5, 7, 11]),
    "symlinked folder out": (outside_folder, "resolves outside", [5, 7, 11]),
    "missing image": (missing_file, "is missing", [5, 7, 11]),
    "duplicate image id": (duplicate_image, "appears twice", [3, 5, 11]),
    "string image id": (set_image(1, id="3"), "no int 'id'", [5, 7, 11]),
    "duplicate annotation id": (set_ann(1, id=100), "annotation id 100 appears twice (also annotations[0]): "
                                "pycocotools keeps one annotation per id", [5, 7, 11]),
    "bbox of 3": (set_ann(1, bbox=[1, 2, 3]), "not 4 finite numbers", [5, 7, 11]),
    "bbox NaN": (nan_bbox, "not 4 finite numbers", [3, 5, 11]),
    "bbox string": (set_ann(1, bbox=["1", 2, 3, 4]), "not 4 finite numbers", [5, 7, 11]),
    "bbox negative size": (set_ann(1, bbox=[1, 1, -3, 5]), "negative width or height", [5, 7, 11]),
    "unhashable category": (set_ann(3, category_id=[1]), "category_id [1]", [3, 5, 7]),
    "unhashable image_id": (set_ann(0, image_id={"a": 1}), "image_id {'a': 1}", [3, 5, 7, 11]),
    "annotation not a dict": (lambda d, r: d["annotations"].append([1, 2]), "not an object", [3, 5, 7, 11]),
}

@pytest.mark.parametrize("case", COCO_CASES)
def test_coco_hostile(tmp_path, case):
    change, says, kept = COCO_CASES[case]
    root, ann = coco_case(tmp_path, change)
    with pytest.raises(LayoutError, match=re.escape(says)) as info:
        Coco(root)
    assert str(ann) in str(info.value) or str(root) in str(info.value)
    layout = Coco(root, on_error="skip")
    assert layout.ids == kept
    assert len(layout.skipped) >= 1 and says in " ".join(why for _, why in layout.skipped)
    dataset = json.loads(ann.read_text())
    for i in range(len(layout)):  # what is kept is whole: all of its image's annotations
        assert layout[i]["target"] == [a for a in dataset["annotations"]
                                       if isinstance(a, dict) and a["image_id"] == layout.ids[i]]
    assert not any("secret" in p for p in layout.paths)


def no_categories(d, root):
    del d["categories"]


# What pycocotools (so torchvision's CocoDetection) loads, which colabfast once refused: (the JSON's change,
# what the note says). Each is loaded as torchvision loads it, with on_error="raise", and noted.
COCO_LENIENT = {
    "no width": (set_image(1, width=None), "1 image entries have no positive 'width' and 'height' (e.g. image 3)"),
    "no width nor height": (lambda d, r: [im.pop(k) for im in d["images"] for k in ("width", "height")],
                            "4 image entries have no positive 'width'"),
    "no categories": (no_categories, "there is no 'categories' list"),
    "unknown category": (set_ann(3, category_id=42), "1 annotations have a category_id not among the categories "
                                                     "(e.g. annotations[3] (id 103): category_id 42)"),
    "bbox outside": (set_ann(1, bbox=[0, 0, 1000, 5]), "1 boxes pass their image's edge by more than 1 px"),
    "bbox before the edge": (set_ann(1, bbox=[-5, 0, 3, 5]), "1 boxes pass their image's edge"),
    "unknown image_id": (set_ann(0, image_id=99), "1 annotations name an image_id that is not among the images "
                                                  "(e.g. annotations[0] (id 100): image_id 99): left out"),
}


@pytest.mark.parametrize("case", COCO_LENIENT)
def test_coco_loads_what_pycocotools_loads(tmp_path, case):
    """Issue 39: what pycocotools loads is loaded, as torchvision's CocoDetection returns it, and noted."""
    change, says = COCO_LENIENT[case]
    root, ann = coco_case(tmp_path, change)
    layout = Coco(root)
    assert_matches_coco(layout, root, ann)
    assert layout.skipped == []
    assert [path for path, _ in layout.notes] == [str(ann)] * len(layout.notes)
    assert says in " ".join(what for _, what in layout.notes), layout.notes
    assert layout.info["notes"] == [list(n) for n in layout.notes]
    assert says in layout.describe()
    assert Coco(root, on_error="skip").notes == layout.notes


def test_coco_notes_count_each_kind_once(tmp_path):
    """A million leniencies of one kind cost one record: how many, and the first."""
    def change(d, root):
        for a in d["annotations"]:
            a["category_id"] = 1000 + a["id"]
            a["image_id"] = 99 if a["id"] % 2 else a["image_id"]
    root, ann = coco_case(tmp_path, change)
    notes = [what for _, what in Coco(root).notes]
    assert len(notes) == 2
    assert notes[0].startswith("3 annotations have a category_id not among the categories (e.g. annotations[0]")
    assert notes[1].startswith("3 annotations name an image_id that is not among the images (e.g. annotations[1]")
    (tmp_path / "clean").mkdir()
    assert Coco(coco_case(tmp_path / "clean", lambda d, r: None)[0]).notes == []


@pytest.mark.parametrize("text", ['{"images": [\n  {"id": 1,\n  }\n]}', "\n\n[1, 2"])
def test_coco_malformed_json_names_the_line(tmp_path, text):
    # The line Python's own json names: 3.13 puts a trailing comma's error on the comma's line, 3.11 after it.
    with pytest.raises(json.JSONDecodeError) as python:
        json.loads(text)
    line = python.value.lineno
    (tmp_path / "_annotations.coco.json").write_text(text)
    with pytest.raises(LayoutError, match="not valid JSON") as info:
        Coco(tmp_path, on_error="skip")  # nothing to skip: the whole file is unusable
    assert info.value.line == line and info.value.path == str(tmp_path / "_annotations.coco.json")


def test_coco_not_coco(tmp_path):
    (tmp_path / "_annotations.coco.json").write_text('{"annotations": []}')
    with pytest.raises(LayoutError, match="no 'images' list"):
        Coco(tmp_path)


def test_coco_deep_json_refused_before_parsing(tmp_path, monkeypatch):
    ann = tmp_path / "_annotations.coco.json"
    ann.write_text('{"images": [], "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    monkeypatch.setattr(json, "loads", lambda *a, **k: pytest.fail("parsed"))
    with pytest.raises(LayoutError, match="nests 100001 levels deep"):
        Coco(tmp_path)


def test_coco_brackets_in_strings_do_not_count(tmp_path):
    root = tmp_path / "images"
    root.mkdir()
    ann = tmp_path / "a.json"
    dataset = make_coco(root, ann)
    dataset["info"]["description"] = 'a \\" [[[[' + "[" * 100 + '\\\\'
    dataset["categories"][0]["name"] = "{" * 100 + '"'
    ann.write_text(json.dumps(dataset))
    assert Coco(root, ann).info["categories"][0]["name"] == "{" * 100 + '"'


def test_coco_json_over_size_limit_refused_unread(tmp_path, monkeypatch):
    root, ann = coco_case(tmp_path, lambda d, r: None)
    monkeypatch.setattr(coco_module, "MAX_ANNOTATION_BYTES", ann.stat().st_size - 1)
    with pytest.raises(LayoutError, match=f"is {ann.stat().st_size} bytes, more than"):
        Coco(root)


def test_coco_fifo_annotation_refused(tmp_path):
    os.mkfifo(tmp_path / "_annotations.coco.json")
    with pytest.raises(LayoutError, match="not a regular file"):
        Coco(tmp_path)


def test_coco_missing_annotation_file(tmp_path):
    with pytest.raises(LayoutError, match="_annotations.coco.json: is missing"):
        Coco(tmp_path)


# --- VOC -------------------------------------------------------------------------------------------

VOC_CLASSES = ("aeroplane", "bicycle", "bird", "boat", "person")


def voc_xml(name: str, size: tuple[int, int], objects: list[tuple[str, tuple[int, int, int, int]]]) -> str:
    objs = "".join(
        f"<object><name>{c}</name><pose>Unspecified</pose><truncated>0</truncated><difficult>0</difficult>"
        f"<bndbox><xmin>{b[0]}</xmin><ymin>{b[1]}</ymin><xmax>{b[2]}</xmax><ymax>{b[3]}</ymax></bndbox>"
        f"{'<part><name>head</name><bndbox><xmin>1</xmin></bndbox></part>' if c == 'person' else ''}</object>"
        for c, b in objects)
    return (f"<annotation>\n  <folder>VOC2012</folder>\n  <filename>{name}.jpg</filename>\n"
            f"  <source><database>The VOC2012 Database</database></source>\n"
            f"  <size><width>{size[0]}</width><height>{size[1]}</height><depth>3</depth></size>\n"
            f"  <segmented>1</segmented>\n  {objs}\n</annotation>\n")


def make_voc(root: Path, year: str = "2012", ids=("2008_000001", "2008_000002", "2008_000003", "2008_000004")) -> Path:
    """A VOCdevkit/VOC<year> tree under ``root`` as torchvision's tests make one: JPEG images, XML
    annotations (0, 1 and several objects), palette PNG masks, and the image sets."""
    rng = np.random.default_rng(int(year))
    voc = root / "VOCdevkit" / f"VOC{year}"
    for d in ("JPEGImages", "Annotations", "SegmentationClass", "ImageSets/Main", "ImageSets/Segmentation"):
        (voc / d).mkdir(parents=True)
    palette = rng.integers(0, 256, 768, dtype=np.uint8).tolist()
    for k, i in enumerate(ids):
        w, h = int(rng.integers(20, 50)), int(rng.integers(20, 50))
        (voc / "JPEGImages" / f"{i}.jpg").write_bytes(encode(photo(w, h, rng)))
        objects = [(VOC_CLASSES[int(rng.integers(len(VOC_CLASSES)))], (1, 2, w - 1, h - 1)) for _ in range(k % 3)]
        (voc / "Annotations" / f"{i}.xml").write_text(voc_xml(i, (w, h), objects))
        mask = Image.fromarray(rng.choice([0, 1, 2, 15, 255], (h, w)).astype(np.uint8), "P")
        mask.putpalette(palette)
        mask.save(voc / "SegmentationClass" / f"{i}.png")
    (voc / "ImageSets" / "Main" / "train.txt").write_text("".join(f"{i}\n" for i in ids[::-1][:3]))
    (voc / "ImageSets" / "Main" / "val.txt").write_text(f"{ids[-1]}\n")
    (voc / "ImageSets" / "Main" / "bird_train.txt").write_text(f"{ids[0]}  1\n")
    (voc / "ImageSets" / "Segmentation" / "train.txt").write_text("".join(f"{i}\n" for i in ids[1:]))
    return voc


@pytest.mark.parametrize("where", ["parent", "VOCdevkit", "VOC2012"])
def test_voc_detection_matches_torchvision(tmp_path, where):
    voc = make_voc(tmp_path)
    root = {"parent": tmp_path, "VOCdevkit": tmp_path / "VOCdevkit", "VOC2012": voc}[where]
    prefix = {"parent": "VOCdevkit/VOC2012/", "VOCdevkit": "VOC2012/", "VOC2012": ""}[where]
    oracle = datasets.VOCDetection(str(tmp_path), year="2012", image_set="train")
    layout = VOCDetection(root, split="train")
    assert len(layout) == len(oracle) == 3
    assert layout.ids == ["2008_000004", "2008_000003", "2008_000002"]
    for i in range(len(oracle)):
        image, target = oracle[i]
        sample = layout[i]
        np.testing.assert_array_equal(pixels(sample["image"].data), np.asarray(image))
        assert sample["target"] == target
    assert [len(layout[i]["target"]["annotation"]["object"]) for i in range(3)] == [0, 2, 1]
    assert layout.paths[0] == f"{prefix}JPEGImages/2008_000004.jpg"
    xmls = [f"{prefix}Annotations/{i}.xml" for i in layout.ids]
    assert {f.rel for f in layout.files} == {f"{prefix}ImageSets/Main/train.txt", *layout.paths, *xmls}
    assert layout.info == {"year": "2012", "split": "train", "image_set": f"{prefix}ImageSets/Main/train.txt"}
    assert VOCDetection.detect(root) and VOCSegmentation.detect(root)


def test_voc_segmentation_matches_torchvision(tmp_path):
    make_voc(tmp_path)
    oracle = datasets.VOCSegmentation(str(tmp_path), year="2012", image_set="train")
    layout = VOCSegmentation(tmp_path, split="train")
    assert len(layout) == len(oracle) == 3
    for i in range(len(oracle)):
        image, mask = oracle[i]
        sample = layout[i]
        assert sample["image"].kind == "image" and sample["mask"].kind == "mask"
        np.testing.assert_array_equal(pixels(sample["image"].data), np.asarray(image))
        got = Image.open(io.BytesIO(sample["mask"].data))
        assert got.mode == mask.mode == "P"
        assert got.getpalette() == mask.getpalette()
        np.testing.assert_array_equal(np.asarray(got), np.asarray(mask))
    assert len(layout.files) == 1 + 2 * 3


def test_voc_years_and_splits(tmp_path):
    make_voc(tmp_path, "2007")
    make_voc(tmp_path, "2012")
    with pytest.raises(LayoutError, match=r"several years \(VOC2007, VOC2012\).*year='2012'"):
        VOCDetection(tmp_path)
    assert VOCDetection(tmp_path, year=2007).info["year"] == "2007"
    assert VOCDetection(tmp_path, "val", year="2012").ids == ["2008_000004"]
    with pytest.raises(LayoutError, match="no VOC2010"):
        VOCDetection(tmp_path, year=2010)
    with pytest.raises(LayoutError, match=r"is missing. Pass split= one of \['train', 'val'\]"):
        VOCDetection(tmp_path, "test", year=2007)
    with pytest.raises(LayoutError, match="not an image set name"):
        VOCDetection(tmp_path, "../Main/train", year=2007)
    with pytest.raises(LayoutError, match="not a Pascal VOC tree"):
        VOCDetection(tmp_path / "VOCdevkit" / "VOC2012" / "JPEGImages")
    assert not VOCDetection.detect(tmp_path / "VOCdevkit" / "VOC2012" / "JPEGImages")


BILLION_LAUGHS = ('<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
                  ' <!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">\n'
                  ' <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">\n'
                  ']>\n<annotation><filename>&lol3;</filename></annotation>\n')


def xml_case(text):
    def change(voc):
        (voc / "Annotations" / "2008_000003.xml").write_text(text)
    return change


def missing_jpeg(voc):
    (voc / "JPEGImages" / "2008_000003.jpg").unlink()


def symlinked_xml(voc):
    outside = voc.parent.parent.parent / "secret.xml"
    outside.write_text(voc_xml("x", (10, 10), []))
    (voc / "Annotations" / "2008_000003.xml").unlink()
    (voc / "Annotations" / "2008_000003.xml").symlink_to(outside)


def dotdot_id(voc):
    (voc / "ImageSets" / "Main" / "train.txt").write_text("2008_000004\n../../../secret\n2008_000002\n")


# (the change, what the error says, the line it names or None, the ids left with on_error="skip")
VOC_CASES = {
    "malformed XML": (xml_case("<annotation>\n<size>\n</annotation>\n"), "not valid XML", 3),
    "billion laughs": (xml_case(BILLION_LAUGHS), "is refused", None),
    "external entity": (xml_case('<!DOCTYPE a [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
                                 "<annotation>&e;</annotation>"), "is refused", None),
    "root not annotation": (xml_case("<html><body/></html>"), "root element is <html>", None),
    "deep XML": (xml_case("<annotation>" + "<a>" * 100 + "</a>" * 100 + "</annotation>"),
                 "nests elements more than 64 deep", None),
    "XML too large": (xml_case("<annotation><folder>" + "x" * (1 << 20) + "</folder></annotation>"), "more than", None),
    "missing image": (missing_jpeg, "is missing", None),
    "symlink out": (symlinked_xml, "resolves outside", None),
    "id with ..": (dotdot_id, "not a plain file name", 2),
}


@pytest.mark.parametrize("case", VOC_CASES)
def test_voc_hostile(tmp_path, case):
    change, says, line = VOC_CASES[case]
    voc = make_voc(tmp_path)
    change(voc)
    with pytest.raises(LayoutError, match=says) as info:
        VOCDetection(tmp_path)
    assert info.value.line == line
    assert "2008_000003" in info.value.path or "train.txt" in info.value.path
    layout = VOCDetection(tmp_path, on_error="skip")
    assert layout.ids == ["2008_000004", "2008_000002"]
    assert len(layout.skipped) == 1 and says in layout.skipped[0][1]
    oracle = datasets.VOCDetection(str(tmp_path), year="2012", image_set="val")
    assert layout[0]["target"] == oracle[0][1]


def test_voc_segmentation_missing_mask(tmp_path):
    voc = make_voc(tmp_path)
    (voc / "SegmentationClass" / "2008_000003.png").unlink()
    with pytest.raises(LayoutError, match=r"SegmentationClass/2008_000003.png: is missing \(id '2008_000003' in "
                                          r"VOCdevkit/VOC2012/ImageSets/Segmentation/train.txt, line 2\)"):
        VOCSegmentation(tmp_path)
    layout = VOCSegmentation(tmp_path, on_error="skip")
    assert layout.ids == ["2008_000002", "2008_000004"]


def test_on_error_checked(tmp_path):
    make_voc(tmp_path)
    with pytest.raises(ValueError, match="on_error"):
        VOCSegmentation(tmp_path, on_error="ignore")

