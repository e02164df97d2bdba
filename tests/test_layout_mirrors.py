"""Issue 25, checks: each folder layout packed and read back end to end, against torchvision's own
classes as oracles on the same folders (COCO, VOC detection and segmentation), YOLO against the
layout's own arrays, image/mask pairs and CSV tables through ``H5Dataset``; the DataLoader over
them; ``on_error="skip"``; packing from the simulated Drive; hostile mirrors of columns; and
``colabfast info`` on them."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import colabfast as cf
import colabfast.mirror as mirror
from colabfast.layouts import Yolo
from colabfast.mirror import MirrorError
from colabfast.testing.data import encode, photo
from tests.test_layouts_coco_voc import make_coco, make_voc
from tests.test_layouts_yolo_seg_csv import kaggle, seg, yolo  # noqa: F401 (fixtures)

datasets = pytest.importorskip("torchvision.datasets")
pytest.importorskip("pycocotools")
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap_v2  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Vetting verdicts in this test's own cache; nothing vetted in memory, as in a new process."""
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mirror, "_vetted", set())


def pack(src, dst, **kwargs) -> Path:
    return cf.pack(src, dst, progress=False, **kwargs)


def same_image(a: Image.Image, b: Image.Image) -> None:
    assert a.mode == b.mode and a.size == b.size
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def same(a, b) -> None:
    """``a == b`` for what torchvision's datasets and their v2 wrappers return: PIL images, tensors
    (of the same class: ``BoundingBoxes`` with their format and canvas), dicts, lists, numbers."""
    assert type(a) is type(b) or isinstance(a, Image.Image) and isinstance(b, Image.Image), (type(a), type(b))
    if isinstance(a, Image.Image):  # torchvision's is a PngImageFile, ours an Image: both PIL images
        same_image(a, b)
        assert a.getpalette() == b.getpalette()
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        for key in ("format", "canvas_size"):
            assert getattr(a, key, None) == getattr(b, key, None)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            same(x, y)
    else:
        assert a == b


def same_dataset(ours, theirs) -> None:
    """The same items, or the same error where torchvision's raises one (its v2 wrapper of VOCDetection
    raises KeyError for an annotation without objects)."""
    assert len(ours) == len(theirs)
    for i in range(len(theirs)):
        try:
            want = theirs[i]
        except Exception as exc:
            with pytest.raises(type(exc), match=str(exc)):
                ours[i]
            continue
        same(ours[i], want)


def describe(target):
    """A ``target_transform=``: what a target holds, comparable with ``==`` (a PIL mask by its pixels)."""
    if isinstance(target, Image.Image):
        return target.mode, target.size, target.getpalette(), target.tobytes()
    return repr(target)


def flip_pair(image, target):
    """A ``transforms=`` callable that looks at both."""
    return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT), (describe(target), image.size)


def transform_arguments(make_ours, make_theirs) -> None:
    """``transform``, ``target_transform`` and ``transforms`` do what torchvision's do, and both refuse
    ``transforms`` with the others."""
    for kwargs in ({"transform": np.asarray}, {"target_transform": describe},
                   {"transform": np.asarray, "target_transform": describe}, {"transforms": flip_pair}):
        ours, theirs = make_ours(**kwargs), make_theirs(**kwargs)
        for i in range(len(theirs)):
            (a, ta), (b, tb) = ours[i], theirs[i]
            if isinstance(b, np.ndarray):
                np.testing.assert_array_equal(a, b)
            else:
                same_image(a, b)
            assert ta == tb if "transform" not in kwargs or "target_transform" in kwargs else describe(ta) == describe(tb)
    with pytest.raises(ValueError, match="Only transforms or transform/target_transform"):
        make_theirs(transform=np.asarray, transforms=flip_pair)
    with pytest.raises(ValueError, match="Only transforms or transform/target_transform"):
        make_ours(transform=np.asarray, transforms=flip_pair)


def tensor_output_is_the_pil_pixels(mirror_path: Path, cls, image_of=lambda item: item[0]) -> None:
    pil, tensor = cls(mirror_path), cls(mirror_path, output="tensor")
    for i in range(len(pil)):
        t = image_of(tensor[i])
        assert t.dtype == torch.uint8 and t.ndim == 3 and t.shape[0] == 3
        np.testing.assert_array_equal(t.permute(1, 2, 0).numpy(), np.asarray(image_of(pil[i])))


# --- item 1: each layout against its oracle -----------------------------------------------------


@pytest.fixture
def coco(tmp_path) -> tuple[Path, Path]:
    root = tmp_path / "coco" / "images"
    root.mkdir(parents=True)
    make_coco(root, tmp_path / "coco" / "instances.json")
    return root, tmp_path / "coco" / "instances.json"


@pytest.mark.parametrize("layout", ["coco", "auto"])
def test_coco_drop_in_is_coco_detection(coco, tmp_path, layout):
    root, ann = coco
    m = pack(root, tmp_path / "coco.h5", layout=layout, labels=ann)
    ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
    assert cf.info(m).layout == "coco"
    assert ours.ids == theirs.ids and len(ours) == len(theirs) == 4
    same_dataset(ours, theirs)
    assert all(ours[i][0].mode == "RGB" for i in range(len(ours)))
    assert ours.categories == json.loads(ann.read_text())["categories"]
    transform_arguments(lambda **kw: cf.H5CocoDetection(m, **kw),
                        lambda **kw: datasets.CocoDetection(str(root), str(ann), **kw))
    same_dataset(wrap_v2(ours), wrap_v2(theirs))
    # torchvision takes target_keys (e.g. "masks") only for its own four classes, by identity: a drop-in
    # that is not a subclass of CocoDetection cannot have them (the docstring says so)
    with pytest.raises(ValueError, match="target_keys.*H5CocoDetection"):
        wrap_v2(ours, target_keys="all")
    tensor_output_is_the_pil_pixels(m, cf.H5CocoDetection)


def test_coco_v2_pipeline_on_both(coco, tmp_path):
    """The wrapped datasets with a v2 detection pipeline (flip, resize, to a float tensor) give the same."""
    root, ann = coco
    m = pack(root, tmp_path / "coco.h5", labels=ann)
    pipeline = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.Resize((32, 40)), v2.ToImage(),
                           v2.ToDtype(torch.float32, scale=True)])
    same_dataset(wrap_v2(cf.H5CocoDetection(m, transforms=pipeline)),
                 wrap_v2(datasets.CocoDetection(str(root), str(ann), transforms=pipeline)))


@pytest.mark.parametrize("layout", ["voc-detection", "auto"])
def test_voc_detection_drop_in_is_voc_detection(tmp_path, layout):
    make_voc(tmp_path / "voc")
    m = pack(tmp_path / "voc", tmp_path / "voc.h5", layout=layout, split="train")
    ours = cf.H5VOCDetection(m)
    theirs = datasets.VOCDetection(str(tmp_path / "voc"), year="2012", image_set="train")
    assert len(ours) == len(theirs) == 3
    same_dataset(ours, theirs)
    transform_arguments(lambda **kw: cf.H5VOCDetection(m, **kw),
                        lambda **kw: datasets.VOCDetection(str(tmp_path / "voc"), image_set="train", **kw))
    same_dataset(wrap_v2(ours), wrap_v2(theirs))
    tensor_output_is_the_pil_pixels(m, cf.H5VOCDetection)


def test_voc_segmentation_drop_in_is_voc_segmentation(tmp_path):
    make_voc(tmp_path / "voc")
    m = pack(tmp_path / "voc", tmp_path / "voc.h5", layout="voc-segmentation", split="train")
    ours = cf.H5VOCSegmentation(m)
    theirs = datasets.VOCSegmentation(str(tmp_path / "voc"), year="2012", image_set="train")
    assert len(ours) == len(theirs) == 3
    same_dataset(ours, theirs)  # the masks: mode "P", the palette, the pixels (255 on borders)
    assert all(ours[i][1].mode == "P" for i in range(3))
    transform_arguments(lambda **kw: cf.H5VOCSegmentation(m, **kw),
                        lambda **kw: datasets.VOCSegmentation(str(tmp_path / "voc"), image_set="train", **kw))
    same_dataset(wrap_v2(ours), wrap_v2(theirs))
    tensor_output_is_the_pil_pixels(m, cf.H5VOCSegmentation)


def test_voc_segmentation_auto_on_a_segmentation_only_tree(tmp_path):
    voc = make_voc(tmp_path / "voc")
    shutil.rmtree(voc / "ImageSets" / "Main")
    m = pack(tmp_path / "voc", tmp_path / "voc.h5", split="train")
    assert cf.info(m).layout == "voc-segmentation"
    same_dataset(cf.H5VOCSegmentation(m), datasets.VOCSegmentation(str(tmp_path / "voc"), image_set="train"))


@pytest.mark.parametrize("layout", ["yolo", "auto"])
def test_yolo_through_h5dataset_is_the_layouts_boxes(yolo, tmp_path, layout):  # noqa: F811
    m = pack(yolo, tmp_path / "yolo.h5", layout=layout, split="train")
    ds, source = cf.H5Dataset(m), Yolo(yolo, "train")
    assert len(ds) == len(source) == 4 and ds.classes == ["cat", "dog", "bird"]
    for i in range(len(source)):
        image, target = ds[i]
        file, want = source[i]
        same_image(image, Image.open(io.BytesIO(file.data)).convert("RGB"))
        assert list(target) == ["boxes", "labels"]
        assert target["boxes"].dtype == torch.float32 and target["boxes"].shape == (len(want["labels"]), 4)
        assert target["labels"].dtype == torch.int64
        np.testing.assert_array_equal(target["boxes"].numpy(), want["boxes"])
        np.testing.assert_array_equal(target["labels"].numpy(), want["labels"])
    tensor_output_is_the_pil_pixels(m, cf.H5Dataset)


@pytest.mark.parametrize("layout", ["segmentation", "auto"])
def test_segmentation_pairs_through_h5dataset(seg, tmp_path, layout):  # noqa: F811
    m = pack(seg, tmp_path / "seg.h5", layout=layout)
    ds = cf.H5Dataset(m)
    assert len(ds) == 2
    for i, (name, mode) in enumerate([("a", "P"), ("sub/b", "L")]):
        image, mask = ds[i]
        want = Image.open(seg / f"masks/{name}.png")
        same_image(image, Image.open(seg / ds.source_paths[i]).convert("RGB"))
        same_image(mask, want)
        assert mask.mode == mode and mask.getpalette() == want.getpalette()
    tensor_output_is_the_pil_pixels(m, cf.H5Dataset)


@pytest.mark.parametrize("layout", ["csv", "auto"])
def test_csv_through_h5dataset(kaggle, tmp_path, layout):  # noqa: F811
    m = pack(kaggle, tmp_path / "csv.h5", layout=layout, labels=kaggle / "train.csv")
    ds = cf.H5Dataset(m)
    assert [ds[i][1] for i in range(len(ds))] == [(2, 3, 0.5), (0, 1, 1.0), (1, 12, 2.25), (2, 1, 1.0), (1, 7, 3.0)]
    for i in range(len(ds)):
        same_image(ds[i][0], Image.open(kaggle / ds.source_paths[i]).convert("RGB"))
    tensor_output_is_the_pil_pixels(m, cf.H5Dataset)
