"""colabfast.testing.layouts: the generated datasets are what torchvision and colabfast's layouts
read, and the same arguments give the same bytes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from colabfast.layouts.coco import Coco
from colabfast.layouts.segmentation import Segmentation
from colabfast.layouts.yolo import Yolo
from colabfast.testing.layouts import MAX_OBJECTS, make_coco, make_segmentation, make_yolo


def test_make_coco_is_read_by_torchvision_and_the_coco_layout(tmp_path):
    datasets = pytest.importorskip("torchvision.datasets")
    pytest.importorskip("pycocotools")
    ann = make_coco(tmp_path / "train", 12, size=(64, 48))
    assert ann == tmp_path / "train" / "_annotations.coco.json"
    oracle = datasets.CocoDetection(str(tmp_path / "train"), str(ann))
    layout = Coco(tmp_path / "train")
    assert len(oracle) == len(layout) == 12 and layout.ids == oracle.ids == list(range(1, 13))
    counts = []
    for i in range(12):
        image, target = oracle[i]
        assert layout[i]["target"] == target
        counts.append(len(target))
        assert all(len(a["segmentation"][0]) >= 8 and a["iscrowd"] == 0 and a["area"] > 0 for a in target)
        for a in target:
            x, y, w, h = a["bbox"]
            assert 0 <= x and 0 <= y and x + w <= image.width and y + h <= image.height
    assert max(counts) <= MAX_OBJECTS and 0 in counts and len(set(counts)) > 2
    cats = {c["id"] for c in json.loads(ann.read_text())["categories"]}
    assert {a["category_id"] for a in json.loads(ann.read_text())["annotations"]} <= cats


def test_make_coco_elsewhere_and_deterministic(tmp_path):
    a = make_coco(tmp_path / "a", 3, size=(40, 30), ann_file=tmp_path / "a.json", seed=5)
    b = make_coco(tmp_path / "b", 3, size=(40, 30), ann_file=tmp_path / "b.json", seed=5)
    assert a.read_bytes() == b.read_bytes() and not (tmp_path / "a" / "_annotations.coco.json").exists()
    assert [p.read_bytes() for p in sorted((tmp_path / "a").iterdir())] == \
        [p.read_bytes() for p in sorted((tmp_path / "b").iterdir())]
    assert Coco(tmp_path / "a", a).ids == [1, 2, 3]


def test_make_yolo_is_read_by_the_yolo_layout(tmp_path):
    root = make_yolo(tmp_path / "yolo", 10, size=(64, 48))
    layout = Yolo(root)
    assert len(layout) == 10 and layout.info["classes"] == ["person", "car", "dog"]
    assert not (root / "labels/train/000004.txt").exists()  # a background image without a label file
    for i in range(10):
        image, target = layout[i]
        w, h = Image.open(root / "images/train" / image.path.split("/")[-1]).size
        boxes = np.asarray(target["boxes"])
        assert boxes.shape == (len(target["labels"]), 4) and len(boxes) <= MAX_OBJECTS
        assert (boxes[:, :2] >= 0).all() and (boxes[:, 2] <= w).all() and (boxes[:, 3] <= h).all()


def test_make_yolo_segments_and_exif_orientation(tmp_path):
    """Polygons (Ultralytics' segment format) and every second image stored turned (EXIF 6): the
    layout reads each upright, its objects inside the upright image."""
    root = make_yolo(tmp_path / "yolo", 6, size=(64, 48), vary=0, segments=True, orientation=6)
    layout = Yolo(root)
    assert layout.skipped == [] and len(layout) == 6
    for i in range(6):
        image, target = layout[i]
        stored = Image.open(root / image.path)
        assert stored.size == (64, 48) and stored.getexif().get(274) == (6 if i % 2 else None)
        w, h = (48, 64) if i % 2 else (64, 48)
        assert len(target["segments"]) == len(target["labels"])
        for polygon, box in zip(target["segments"], target["boxes"]):
            points = np.asarray(polygon)
            assert 4 <= len(points) <= 8 and (points >= 0).all() and (points <= [w, h]).all()
            np.testing.assert_allclose(box, [*points.min(0), *points.max(0)], rtol=1e-6)
    with pytest.raises(ValueError, match="EXIF orientation"):
        make_yolo(tmp_path / "x", 1, orientation=9)


def test_make_segmentation_is_read_by_the_segmentation_layout(tmp_path):
    root = make_segmentation(tmp_path / "seg", 4, size=(48, 32), classes=3)
    layout = Segmentation(root)
    assert len(layout) == 4
    mask = Image.open(root / "masks/000000.png")
    assert mask.mode == "P" and mask.size == Image.open(root / "images/000000.jpg").size
    assert set(np.unique(np.asarray(mask))) <= {0, 1, 2, 255}
    with pytest.raises(ValueError, match="classes must be"):
        make_segmentation(tmp_path / "x", 1, classes=1)
