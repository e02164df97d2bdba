"""Issue 39: H5CocoDetection, H5VOCDetection (each year torchvision reads), H5VOCSegmentation,
H5ImageFolder and H5Kitti put through the checks of torchvision's own dataset tests
(``test/datasets_utils.py``'s ``DatasetTestCase``: not found, smoke, ``str``, feature types, number of
examples, transforms; ``test/test_datasets.py``'s ``CocoDetectionTestCase``, ``VOCDetectionTestCase``,
``VOCSegmentationTestCase``, ``ImageFolderTestCase`` and ``KittiTestCase``: segmentation kinds, classes,
a slice, ``wrap_dataset_for_transforms_v2`` in the process and under spawned DataLoader workers), on fake
data written as ``test_datasets.py`` writes it, item for item against ``CocoDetection``,
``VOCDetection``, ``VOCSegmentation``, ``ImageFolder`` and ``Kitti`` on the same files; and
``H5CocoDetection.coco`` evaluated with ``COCOeval`` as torchvision's detection references evaluate."""

from __future__ import annotations

import inspect
import json
import os
import pickle
import shutil
import unittest.mock
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import colabfast as cf
from colabfast.datasets.h5dataset import IndexTypeError
from colabfast.layouts import Coco
from colabfast.mirror import safety as mirror_safety
from tests.test_layout_mirrors import same, same_dataset
from tests.test_layouts_coco_voc import make_coco

datasets = pytest.importorskip("torchvision.datasets")
pytest.importorskip("pycocotools")
from pycocotools.cocoeval import COCOeval  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.datasets import wrap_dataset_for_transforms_v2 as wrap_v2  # noqa: E402
from torchvision.transforms import v2  # noqa: E402


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """Vetting verdicts in this test's own cache; nothing vetted in memory, as in a new process."""
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(mirror_safety, "_vetted", set())


def pack(src, dst, **kwargs) -> Path:
    return cf.pack(src, dst, progress=False, workers=0, **kwargs)


def as_list(batch):  # module level, so spawned workers can unpickle it
    return batch


# --- fake data, as torchvision's test/test_datasets.py writes it ------------------------------------


def random_image(path: Path, rng: np.random.Generator) -> None:
    """``datasets_utils.create_image_file``: random RGB pixels, 3 to 10 pixels a side, saved by the name's
    extension."""
    h, w = rng.integers(3, 11, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(path)


def tv_coco(tmp: Path, segmentation_kind: str = "list") -> tuple[Path, Path]:
    """``CocoDetectionTestCase.inject_fake_data``: 3 images ``images/{idx:012d}.jpg``, image entries of
    ``file_name`` and ``id`` only (no width, no height), 2 annotations an image (random boxes in 0..1,
    ``category_id`` 0..90), no ``categories``. Returns ``(root, annFile)``."""
    rng = np.random.default_rng(len(segmentation_kind))
    root, ann = tmp / "images", tmp / "annotations" / "annotations.json"
    for idx in range(3):
        random_image(root / f"{idx:012d}.jpg", rng)
    images = [{"file_name": f"{idx:012d}.jpg", "id": idx} for idx in range(3)]
    segmentation = {"list": lambda: [rng.random(8).tolist()], "rle": lambda: {"size": [10, 10], "counts": [1]},
                    "rle_encoded": lambda: {"size": [2400, 2400], "counts": "PQRQ2[1\\Y2f0gNVNRhMg2"},
                    "bad": lambda: 123}[segmentation_kind]
    annotations = [{"image_id": k % 3, "id": k, "bbox": rng.random(4).tolist(), "segmentation": segmentation(),
                    "category_id": int(rng.integers(91)), "area": float(rng.random()),
                    "iscrowd": int(rng.integers(2))} for k in range(6)]
    ann.parent.mkdir(parents=True)
    ann.write_text(json.dumps({"images": images, "annotations": annotations}))
    return root, ann


# torchvision's VOC configurations: every year and image set it reads (VOCSegmentationTestCase.ADDITIONAL_CONFIGS)
VOC_CONFIGS = [(str(year), image_set) for year in range(2007, 2013) for image_set in ("train", "val", "trainval")]
VOC_CONFIGS.append(("2007", "test"))
VOC_SETS = {"train": (0, 1, 2), "val": (3, 4), "test": (5,), "trainval": (0, 1, 2, 3, 4)}


def tv_voc(tmp: Path, year: str, image_set: str) -> Path:
    """``VOCSegmentationTestCase.inject_fake_data``: ``VOCdevkit/VOC<year>`` (2011: under ``TrainVal``) with
    6 images ``JPEGImages/{idx:06d}.jpg``, ``SegmentationClass`` PNGs (random RGB, as there), one XML
    annotation of one object each, the image sets in ``ImageSets/Main`` (only ``test`` for 2007's test
    set) copied to ``ImageSets/Segmentation``. Returns the VOC folder."""
    rng = np.random.default_rng(int(year))
    base = (tmp / "TrainVal" if year == "2011" else tmp) / "VOCdevkit" / f"VOC{year}"
    main = base / "ImageSets" / "Main"
    main.mkdir(parents=True)
    for name in ("test",) if image_set == "test" else ("train", "val", "trainval"):
        (main / f"{name}.txt").write_text("".join(f"{idx:06d}\n" for idx in VOC_SETS[name]))
    shutil.copytree(main, base / "ImageSets" / "Segmentation")
    (base / "Annotations").mkdir()
    for idx in range(6):
        random_image(base / "JPEGImages" / f"{idx:06d}.jpg", rng)
        random_image(base / "SegmentationClass" / f"{idx:06d}.png", rng)
        annotation = ET.Element("annotation")
        obj = ET.SubElement(annotation, "object")
        ET.SubElement(obj, "name").text = "dog"
        box = ET.SubElement(obj, "bndbox")
        for name, text in {"xmin": "1", "xmax": "2", "ymin": "3", "ymax": "4"}.items():
            ET.SubElement(box, name).text = text
        (base / "Annotations" / f"{idx:06d}.xml").write_bytes(ET.tostring(annotation))
    return base


def tv_imagefolder(tmp: Path) -> Path:
    """``ImageFolderTestCase.inject_fake_data``: classes ``a`` and ``b``, 1 or 2 random images each
    (``datasets_utils.create_image_folder``), named ``{cls}_{idx}.png``. Returns the root."""
    rng = np.random.default_rng(7)
    for cls in ("a", "b"):
        for idx in range(int(rng.integers(1, 3))):
            random_image(tmp / cls / f"{cls}_{idx}.png", rng)
    return tmp


KITTI_LINE = "Pedestrian 0.00 0 -0.20 712.40 143.00 810.73 307.92 1.89 0.48 1.20 1.84 1.47 8.41 0.01\n"


def tv_kitti(tmp: Path) -> Path:
    """``KittiTestCase.inject_fake_data``: ``Kitti/raw/training/image_2`` with 1 random image
    ``{idx:06d}.png`` and its ``label_2`` file of one Pedestrian line, ``testing/image_2`` with 2 images, no
    labels, no calibration. Returns the root torchvision's Kitti takes."""
    rng = np.random.default_rng(8)
    raw = tmp / "Kitti" / "raw"
    for folder, count in (("training", 1), ("testing", 2)):
        for idx in range(count):
            random_image(raw / folder / "image_2" / f"{idx:06d}.png", rng)
    (raw / "training" / "label_2").mkdir()
    (raw / "training" / "label_2" / "000000.txt").write_text(KITTI_LINE)
    return tmp


# --- DatasetTestCase's checks -------------------------------------------------------------------------


def dataset_test_case(make_ours, make_theirs, feature_types: tuple, num_examples: int) -> None:
    """``DatasetTestCase``'s smoke, str, feature types, number of examples and transforms checks on ours
    (the drop-in on a mirror, made by ``make_ours(**transforms)``), and every item, plain and through the
    v2 wrapper, the item of torchvision's own dataset (``make_theirs``) on the same files."""
    ours, theirs = make_ours(), make_theirs()
    assert isinstance(ours, datasets.VisionDataset) and isinstance(ours, type(theirs))
    assert isinstance(str(ours), str)
    item = ours[0]
    assert len(item) == len(feature_types)
    for value, kind in zip(item, feature_types):
        assert isinstance(value, kind), (type(value), kind)
    assert len(ours) == len(theirs) == num_examples
    accepted = inspect.signature(type(theirs)).parameters  # ImageFolder takes no transforms=
    for kwarg in [k for k in ("transform", "target_transform", "transforms") if k in accepted]:
        mock = unittest.mock.Mock(wraps=lambda *args: args[0] if len(args) == 1 else args)
        make_ours(**{kwarg: mock})[0]
        mock.assert_called()
    same_dataset(ours, theirs)
    same_dataset(wrap_v2(ours), wrap_v2(theirs))
    if isinstance(theirs, (datasets.CocoDetection, datasets.VOCDetection, datasets.Kitti)):  # taking target_keys
        same_dataset(wrap_v2(ours, target_keys="all"), wrap_v2(theirs, target_keys="all"))


def spawned_like_torchvision(ours, theirs) -> list:
    """``datasets_utils.check_transforms_v2_wrapper_spawn``: the wrapped dataset with ``v2.Resize`` under a
    DataLoader of spawned workers gives resized images, and here the very items of torchvision's wrapped
    dataset. Returns the items."""
    loader = torch.utils.data.DataLoader(wrap_v2(ours), batch_size=2, num_workers=1, collate_fn=as_list,
                                         multiprocessing_context="spawn")
    got = [item for batch in loader for item in batch]
    for item, want in zip(got, wrap_v2(theirs)):
        assert tuple(v2.functional.get_size(item[0])) == (12, 32)
        same(tuple(item), tuple(want))
    assert len(got) == len(theirs)
    return got


RESIZE = v2.Resize((12, 32))


# --- COCO -----------------------------------------------------------------------------------------------


@pytest.fixture
def tvcoco(tmp_path) -> tuple[Path, Path, Path]:
    """torchvision's COCO test data, packed: ``(root, annFile, mirror)``."""
    root, ann = tv_coco(tmp_path / "src")
    return root, ann, pack(root, tmp_path / "coco.h5", labels=ann)


def test_coco_dataset_test_case(tvcoco):
    """CocoDetectionTestCase on its own data (image entries without width/height, no categories, category
    ids of none): colabfast refused to pack it before issue 39."""
    root, ann, m = tvcoco
    dataset_test_case(lambda **kw: cf.H5CocoDetection(m, **kw),
                      lambda **kw: datasets.CocoDetection(str(root), str(ann), **kw), (Image.Image, list), 3)
    ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
    assert ours.ids == theirs.ids == [0, 1, 2]
    notes = [what for _, what in Coco(root, ann).notes]
    assert [n.split(" (")[0] for n in notes] == [
        "3 image entries have no positive 'width' and 'height'", "there is no 'categories' list: read as pycocotools "
        "reads it: no categories", "6 annotations have a category_id not among the categories"]
    assert ours.info["notes"] == [[str(ann), n] for n in notes]
    assert "read as the format's owner reads it (3 leniencies)" in str(cf.info(m))


def test_coco_slice_raises_as_torchvision(tvcoco):
    """CocoDetectionTestCase.test_slice_error."""
    root, ann, m = tvcoco
    for ds in (datasets.CocoDetection(str(root), str(ann)), cf.H5CocoDetection(m)):
        with pytest.raises(ValueError, match="Index must be of type integer"):
            ds[:2]
        with pytest.raises(ValueError, match="Index must be of type integer"):
            ds["0"]
    ours = cf.H5CocoDetection(m)
    same(ours[np.int64(1)], ours[1])  # a numpy int, as samplers may give, still indexes
    same(ours[torch.tensor(2)], ours[2])
    with pytest.raises(IndexError):
        ours[3]


@pytest.mark.parametrize("kind", ["list", "rle", "rle_encoded", "bad"])
def test_coco_segmentation_kinds(tmp_path, kind):
    """CocoDetectionTestCase.test_segmentation_kind: every kind packs; the wrapper's masks are
    torchvision's, and a bad segmentation is its ValueError, when read. (The RLE kinds' counts cover a
    few of their pixels, pycocotools decodes the rest from uninitialised memory: their masks are only read.)"""
    root, ann = tv_coco(tmp_path / "src", kind)
    ours_raw = cf.H5CocoDetection(pack(root, tmp_path / "coco.h5", labels=ann))
    theirs_raw = datasets.CocoDetection(str(root), str(ann))
    ours, theirs = wrap_v2(ours_raw, target_keys="all"), wrap_v2(theirs_raw, target_keys="all")
    if kind == "bad":
        for ds in (ours, theirs):
            with pytest.raises(ValueError, match="COCO segmentation expected to be a dict or a list"):
                list(ds)
    elif kind in ("rle", "rle_encoded"):
        assert [item[1]["masks"].shape[0] for item in ours] == [2, 2, 2]
        keys = {"image_id", "boxes", "labels", "segmentation", "area", "iscrowd", "bbox", "category_id"}
        same_dataset(wrap_v2(ours_raw, target_keys=keys), wrap_v2(theirs_raw, target_keys=keys))
    else:
        same_dataset(ours, theirs)


def test_coco_v2_wrapper_under_dataloaders(tvcoco):
    """A torch DataLoader over wrap_dataset_for_transforms_v2(H5CocoDetection) yields the wrapped targets
    (boxes as BoundingBoxes), in the process and in spawned workers (MirrorDataset.__getitems__ hands the
    wrapper's subclass its per-index items)."""
    root, ann, m = tvcoco
    theirs = wrap_v2(datasets.CocoDetection(str(root), str(ann)))
    loader = torch.utils.data.DataLoader(wrap_v2(cf.H5CocoDetection(m)), batch_size=2, collate_fn=as_list)
    got = [item for batch in loader for item in batch]
    assert len(got) == 3
    for item, want in zip(got, theirs):
        assert isinstance(item[1]["boxes"], tv_tensors.BoundingBoxes) and item[1]["boxes"].shape == (2, 4)
        same(tuple(item), tuple(want))
    spawned = spawned_like_torchvision(cf.H5CocoDetection(m, transform=RESIZE),
                                       datasets.CocoDetection(str(root), str(ann), transform=RESIZE))
    assert all(isinstance(item[1]["boxes"], tv_tensors.BoundingBoxes) for item in spawned)


def test_coco_not_found(tmp_path):
    """DatasetTestCase.test_not_found_or_corrupted: FileNotFoundError (or RuntimeError), for the mirror and
    for the source pack reads, as torchvision's CocoDetection raises for its files."""
    with pytest.raises(FileNotFoundError):
        datasets.CocoDetection(str(tmp_path), str(tmp_path / "annotations.json"))
    with pytest.raises(FileNotFoundError):
        cf.H5CocoDetection(tmp_path / "missing.h5")
    with pytest.raises(FileNotFoundError, match="annotations.json: is missing") as info:
        pack(tmp_path, tmp_path / "coco.h5", labels=tmp_path / "annotations.json")
    assert isinstance(info.value, cf.Error)


def get_coco_api_from_dataset(dataset):
    """torchvision's ``references/detection/coco_utils.py``: a CocoDetection's ``coco``, through Subsets."""
    for _ in range(10):
        if isinstance(dataset, datasets.CocoDetection):
            break
        if isinstance(dataset, torch.utils.data.Subset):
            dataset = dataset.dataset
    assert isinstance(dataset, datasets.CocoDetection)
    return dataset.coco


def evaluate(coco, kind: str) -> np.ndarray:
    """``COCOeval`` of the ground truth itself as detections (score 1): what the references run, on it."""
    detections = [{"image_id": a["image_id"], "category_id": a["category_id"], "score": 1.0,
                   **({"bbox": a["bbox"]} if kind == "bbox" else {"segmentation": coco.annToRLE(a)})}
                  for a in coco.anns.values()]
    ev = COCOeval(coco, coco.loadRes(detections), kind)
    ev.evaluate()
    ev.accumulate()
    ev.summarize()
    return ev.stats


def test_coco_api_of_the_mirror_is_torchvisions(tmp_path):
    """H5CocoDetection.coco: pycocotools' COCO of the mirror, equal to torchvision's dataset.coco, found
    by the detection references' get_coco_api_from_dataset, and evaluated by COCOeval (bbox and segm) to
    the same numbers."""
    root = tmp_path / "images"
    root.mkdir()
    ann = tmp_path / "instances.json"
    make_coco(root, ann)
    m = pack(root, tmp_path / "coco.h5", labels=ann)
    ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
    coco = get_coco_api_from_dataset(torch.utils.data.Subset(ours, [0, 1]))
    assert coco is ours.coco  # built once
    for name in ("imgs", "anns", "cats"):
        assert getattr(coco, name) == getattr(theirs.coco, name), name
    assert {i: coco.imgToAnns[i] for i in coco.imgs} == {i: theirs.coco.imgToAnns[i] for i in theirs.coco.imgs}
    assert sorted(coco.getImgIds()) == ours.ids == theirs.ids
    assert "coco" not in ours.__getstate__()  # not pickled into DataLoader workers
    assert pickle.loads(pickle.dumps(ours)).coco.anns == coco.anns
    for kind in ("bbox", "segm"):  # (COCOeval's segm turns the ground truth's polygons into RLEs, in place)
        stats = evaluate(coco, kind)
        np.testing.assert_array_equal(stats, evaluate(theirs.coco, kind))
        assert stats[0] == 1.0


def test_coco_api_keeps_the_jsons_keys_and_order(tmp_path):
    """Issue 52, item 7: ``.coco`` lacked ``info``/``licenses`` and listed ids sorted; pycocotools' ``COCO``
    keeps the JSON's keys and its images' and annotations' order."""
    import json
    import random

    from colabfast.testing.layouts import make_coco as make_export

    ann = make_export(tmp_path / "images", 6, size=(32, 24), seed=3)
    data = json.loads(ann.read_text())
    data["images"].reverse()
    random.Random(0).shuffle(data["annotations"])
    data = {"info": data["info"], "images": data["images"], "licenses": data["licenses"],
            "annotations": data["annotations"], "categories": data["categories"]}  # keys in another order too
    ann.write_text(json.dumps(data))
    ours = cf.H5CocoDetection(pack(tmp_path / "images", tmp_path / "coco.h5")).coco
    try:
        from pycocotools.coco import COCO

        theirs = COCO(str(ann)).dataset
    except ImportError:
        theirs = data
    assert list(ours.dataset) == list(theirs) == ["info", "images", "licenses", "annotations", "categories"]
    assert ours.dataset == theirs and list(ours.imgs) == [i["id"] for i in data["images"]]
    assert list(ours.anns) == [a["id"] for a in data["annotations"]]


def test_coco_api_on_torchvisions_test_data(tvcoco):
    """The same COCO for images without width/height and without categories; loadRes works on it."""
    root, ann, m = tvcoco
    ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
    assert ours.coco.imgs == theirs.coco.imgs and ours.coco.anns == theirs.coco.anns
    assert ours.coco.loadRes([{"image_id": 0, "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1.0}]).anns


def test_coco_api_of_a_mirror_without_image_entries(tmp_path, monkeypatch):
    """A mirror packed before the layout kept each image's entry: the COCO is built of the ids, file names
    and the stored images' sizes."""
    root = tmp_path / "images"
    root.mkdir()
    ann = tmp_path / "instances.json"
    make_coco(root, ann)
    item = Coco.__getitem__
    monkeypatch.setattr(Coco, "__getitem__", lambda self, i: {k: v for k, v in item(self, i).items() if k != "coco"})
    m = pack(root, tmp_path / "coco.h5", labels=ann)
    ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
    assert "coco" not in [f.name for f in ours.fields]
    assert ours.coco.imgs == {i: {k: img[k] for k in ("id", "file_name", "height", "width")}
                              for i, img in theirs.coco.imgs.items()}
    assert ours.coco.anns == theirs.coco.anns


def test_coco_duplicate_annotation_id_refused(tmp_path):
    """pycocotools keeps one annotation per id: torchvision returns the later one twice. Refused, saying so."""
    root, ann = tv_coco(tmp_path / "src")
    dataset = json.loads(ann.read_text())
    dataset["annotations"][3]["id"] = 0  # image 0's second annotation
    ann.write_text(json.dumps(dataset))
    target = datasets.CocoDetection(str(root), str(ann))[0][1]
    assert target[0] is target[1]  # what torchvision would give
    with pytest.raises(cf.LayoutError, match=r"annotation id 0 appears twice \(also annotations\[0\]\): pycocotools "
                                             "keeps one annotation per id") as info:
        pack(root, tmp_path / "coco.h5", labels=ann)
    assert str(ann) in str(info.value) and "Give each annotation its own id" in str(info.value)


# --- VOC ------------------------------------------------------------------------------------------------


VOC_CLASSES = {"voc-detection": (cf.H5VOCDetection, "VOCDetection", (Image.Image, dict)),
               "voc-segmentation": (cf.H5VOCSegmentation, "VOCSegmentation", (Image.Image, Image.Image))}


@pytest.mark.parametrize("layout", VOC_CLASSES)
@pytest.mark.parametrize("year, image_set", VOC_CONFIGS)
def test_voc_dataset_test_case(tmp_path, layout, year, image_set):
    """VOCDetectionTestCase and VOCSegmentationTestCase, each year and image set torchvision reads, found
    where torchvision finds it (VOC 2011 under TrainVal/) from the same root."""
    cls, name, features = VOC_CLASSES[layout]
    tv_voc(tmp_path / "src", year, image_set)
    m = pack(tmp_path / "src", tmp_path / "voc.h5", layout=layout, split=image_set, year=year)

    def theirs(**kw):
        return getattr(datasets, name)(str(tmp_path / "src"), year=year, image_set=image_set, **kw)

    dataset_test_case(lambda **kw: cls(m, **kw), theirs, features, len(VOC_SETS[image_set]))
    ours = cls(m, year=year, image_set=image_set)
    assert (ours.year, ours.image_set) == (theirs().year, theirs().image_set) == (year, image_set)
    assert ours.images == theirs().images and ours.targets == theirs().targets
    if layout == "voc-detection":
        assert ours.annotations == theirs().annotations
        assert ours[0][1]["annotation"]["object"] == [{"name": "dog", "bndbox": {"xmin": "1", "xmax": "2",
                                                                                  "ymin": "3", "ymax": "4"}}]
    else:
        assert ours.masks == theirs().masks


def test_voc_2011_auto_and_year_checked(tmp_path):
    """VOC 2011 as its archive unpacks (TrainVal/VOCdevkit/VOC2011) is detected from the root without year=;
    the drop-ins check year= and image_set= against the mirror, as torchvision's pick the folder."""
    tv_voc(tmp_path / "src", "2011", "train")
    m = pack(tmp_path / "src", tmp_path / "voc.h5", split="val")
    assert cf.info(m).layout == "voc-detection"
    same_dataset(cf.H5VOCDetection(m), datasets.VOCDetection(str(tmp_path / "src"), year="2011", image_set="val"))
    with pytest.raises(ValueError, match=r"year='2012', and .* is a mirror of VOC2011's 'val' image set"):
        cf.H5VOCDetection(m, year="2012")
    with pytest.raises(ValueError, match="image_set='train'"):
        cf.H5VOCDetection(m, image_set="train")
    assert len(cf.H5VOCDetection(m, year=2011, image_set="val")) == 2


def test_voc_year_picks_among_several(tmp_path):
    """A root holding several years (2011 under TrainVal/, as torchvision looks for it): pack's year= picks
    one, as torchvision's year= does; without it, a LayoutError asks for it."""
    for year, image_set in (("2007", "test"), ("2011", "train"), ("2012", "train")):
        tv_voc(tmp_path / "src", year, image_set)
    with pytest.raises(cf.LayoutError, match=r"several years \(VOC2007, VOC2011, VOC2012\)"):
        pack(tmp_path / "src", tmp_path / "voc.h5", split="train")
    for year, image_set in (("2007", "test"), ("2011", "trainval"), ("2012", "val")):
        m = pack(tmp_path / "src", tmp_path / f"voc{year}.h5", layout="voc-segmentation", split=image_set, year=year)
        same_dataset(cf.H5VOCSegmentation(m), datasets.VOCSegmentation(str(tmp_path / "src"), year=year,
                                                                       image_set=image_set))
    with pytest.raises(ValueError, match="year=2012 picks a Pascal VOC tree's year"):
        pack(tmp_path / "src" / "VOCdevkit" / "VOC2012" / "JPEGImages", tmp_path / "x.h5", year=2012)


@pytest.mark.parametrize("layout", VOC_CLASSES)
def test_voc_not_found(tmp_path, layout):
    """DatasetTestCase.test_not_found_or_corrupted: torchvision raises RuntimeError for a missing tree (or
    year), FileNotFoundError for a missing image set; the layouts raise LayoutErrors of those types."""
    name = VOC_CLASSES[layout][1]
    with pytest.raises(RuntimeError, match="Dataset not found"):
        getattr(datasets, name)(str(tmp_path))
    with pytest.raises(RuntimeError, match="is not a Pascal VOC tree") as info:
        pack(tmp_path, tmp_path / "voc.h5", layout=layout)
    assert isinstance(info.value, cf.LayoutError)
    voc = tv_voc(tmp_path / "src", "2012", "train")
    with pytest.raises(RuntimeError, match="Dataset not found"):
        getattr(datasets, name)(str(tmp_path / "src"), year="2010")
    with pytest.raises(RuntimeError, match="has no VOC2010 folder"):
        pack(tmp_path / "src", tmp_path / "voc.h5", layout=layout, year="2010")
    for folder in ("Main", "Segmentation"):
        (voc / "ImageSets" / folder / "val.txt").unlink()
    with pytest.raises(FileNotFoundError):
        getattr(datasets, name)(str(tmp_path / "src"), image_set="val")
    with pytest.raises(FileNotFoundError, match=r"val.txt: is missing. Pass split= one of \['train', "
                                                r"'trainval'\]") as info:
        pack(tmp_path / "src", tmp_path / "voc.h5", layout=layout, split="val")
    assert isinstance(info.value, cf.LayoutError)
    with pytest.raises(FileNotFoundError):
        VOC_CLASSES[layout][0](tmp_path / "missing.h5")


@pytest.mark.parametrize("layout", VOC_CLASSES)
def test_voc_slice_and_spawned_wrapper(tmp_path, layout):
    """A slice raises what torchvision's VOC datasets raise (an AttributeError: they hand a list to
    PIL.Image.open), a TypeError too; the v2 wrapper with Resize under spawned workers, as
    check_transforms_v2_wrapper_spawn."""
    cls, name, _ = VOC_CLASSES[layout]
    tv_voc(tmp_path / "src", "2012", "train")
    m = pack(tmp_path / "src", tmp_path / "voc.h5", layout=layout, split="train")
    theirs = getattr(datasets, name)(str(tmp_path / "src"), image_set="train")
    with pytest.raises(AttributeError):
        theirs[:2]
    for error in (AttributeError, TypeError, IndexTypeError, cf.Error):
        with pytest.raises(error, match="indices are ints, not slice"):
            cls(m)[:2]
    spawned_like_torchvision(cls(m, transform=RESIZE),
                             getattr(datasets, name)(str(tmp_path / "src"), image_set="train", transform=RESIZE))


def test_open_dataset_passes_year(tmp_path):
    """open_dataset(year=) packs that year, as pack(year=)."""
    tv_voc(tmp_path / "src", "2011", "val")
    tv_voc(tmp_path / "src", "2012", "val")
    ds = cf.open_dataset(tmp_path / "src", split="val", layout="voc-detection", year="2011",
                         mirrors=tmp_path / "mirrors", progress=False)
    assert isinstance(ds, cf.H5VOCDetection) and ds.year == "2011"
    assert os.path.basename(ds.images[0]) == "000003.jpg"


# --- ImageFolder ----------------------------------------------------------------------------------------


@pytest.fixture
def tvimagefolder(tmp_path) -> tuple[Path, Path]:
    """torchvision's ImageFolder test data, packed: ``(root, mirror)``."""
    root = tv_imagefolder(tmp_path / "src")
    return root, pack(root, tmp_path / "folder.h5", layout="imagefolder")


def test_imagefolder_dataset_test_case(tvimagefolder):
    """ImageFolderTestCase: DatasetTestCase's checks (smoke, str, feature types, number of examples,
    transforms, the v2 wrapper) and test_classes, item for item against torchvision's ImageFolder."""
    root, m = tvimagefolder
    theirs = datasets.ImageFolder(str(root))
    dataset_test_case(lambda **kw: cf.H5ImageFolder(m, **kw), lambda **kw: datasets.ImageFolder(str(root), **kw),
                      (Image.Image, int), len(theirs.samples))
    ours = cf.H5ImageFolder(m)
    assert ours.classes == theirs.classes == ["a", "b"]
    assert ours.class_to_idx == theirs.class_to_idx and ours.targets == theirs.targets
    assert [(Path(p).name, t) for p, t in ours.samples] == [(Path(p).name, t) for p, t in theirs.samples]


def test_imagefolder_spawned_wrapper_and_slice(tvimagefolder):
    """check_transforms_v2_wrapper_spawn with v2.Resize; a slice raises what torchvision's ImageFolder
    raises for it (a TypeError: it opens a tuple of samples as a path), ours an instance of that type."""
    root, m = tvimagefolder
    spawned_like_torchvision(cf.H5ImageFolder(m, transform=RESIZE), datasets.ImageFolder(str(root), transform=RESIZE))
    with pytest.raises(Exception) as theirs:
        datasets.ImageFolder(str(root))[:2]
    with pytest.raises(type(theirs.value)):
        cf.H5ImageFolder(m)[:2]


def test_imagefolder_not_found(tmp_path):
    """DatasetTestCase.test_not_found_or_corrupted: torchvision's ImageFolder raises FileNotFoundError for a
    missing root; so does pack for that root, and the drop-in for a missing mirror."""
    with pytest.raises(FileNotFoundError):
        datasets.ImageFolder(str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError) as info:
        pack(tmp_path / "missing", tmp_path / "folder.h5", layout="imagefolder")
    assert isinstance(info.value, cf.Error)
    with pytest.raises(FileNotFoundError):
        cf.H5ImageFolder(tmp_path / "missing.h5")


# --- Kitti ----------------------------------------------------------------------------------------------


def tv_kitti_by_name(root: Path, **kw):
    """torchvision's Kitti with its images (and their label files) in file-name order, as the mirror indexes
    them: torchvision lists them in ``os.listdir`` order."""
    ds = datasets.Kitti(str(root), **kw)
    order = sorted(range(len(ds.images)), key=lambda i: ds.images[i])
    ds.images = [ds.images[i] for i in order]
    ds.targets = [ds.targets[i] for i in order] if ds.targets else ds.targets
    return ds


@pytest.fixture
def tvkitti(tmp_path) -> tuple[Path, Path]:
    """torchvision's Kitti test data, packed: ``(root, mirror)``."""
    root = tv_kitti(tmp_path / "src")
    return root, pack(root, tmp_path / "kitti.h5", layout="kitti")


@pytest.mark.parametrize("train", [True, False])
def test_kitti_dataset_test_case(tvkitti, train):
    """KittiTestCase (train=True and False): DatasetTestCase's checks, feature types (PIL image, a list of
    objects or None for the test split), item for item against torchvision's Kitti."""
    root, m = tvkitti
    dataset_test_case(lambda **kw: cf.H5Kitti(m, train=train, **kw),
                      lambda **kw: tv_kitti_by_name(root, train=train, **kw),
                      (Image.Image, (list, type(None))), 1 if train else 2)
    ours, theirs = cf.H5Kitti(m, train=train), tv_kitti_by_name(root, train=train)
    assert [Path(p).name for p in ours.images] == [Path(p).name for p in theirs.images]
    assert [Path(p).name for p in ours.targets] == [Path(p).name for p in theirs.targets]
    if train:
        assert ours[0][1] == theirs[0][1] and ours[0][1][0]["type"] == "Pedestrian"
    else:
        assert [target for _, target in ours] == [target for _, target in theirs] == [None, None]


@pytest.mark.parametrize("train", [True, False])
def test_kitti_spawned_wrapper(tvkitti, train):
    """check_transforms_v2_wrapper_spawn with v2.Resize, each split (the test split's targets are None)."""
    root, m = tvkitti
    spawned_like_torchvision(cf.H5Kitti(m, train=train, transform=RESIZE),
                             tv_kitti_by_name(root, train=train, transform=RESIZE))


@pytest.mark.parametrize("train", [True, False])
def test_kitti_slice_raises_as_torchvision(tvkitti, train):
    """A slice raises what torchvision's Kitti raises for it (an AttributeError: it hands a list to
    PIL.Image.open), ours an instance of that type."""
    root, m = tvkitti
    with pytest.raises(Exception) as theirs:
        datasets.Kitti(str(root), train=train)[:2]
    with pytest.raises(type(theirs.value)):
        cf.H5Kitti(m, train=train)[:2]


def test_kitti_not_found(tmp_path):
    """DatasetTestCase.test_not_found_or_corrupted, which takes FileNotFoundError or RuntimeError:
    torchvision's Kitti raises RuntimeError for a root without its folders; pack a colabfast error that is
    a FileNotFoundError (SourceNotFound), the drop-in FileNotFoundError for a missing mirror."""
    (tmp_path / "src").mkdir()
    with pytest.raises(RuntimeError, match="Dataset not found"):
        datasets.Kitti(str(tmp_path / "src"))
    with pytest.raises((FileNotFoundError, RuntimeError), match="no KITTI layout under") as info:
        pack(tmp_path / "src", tmp_path / "kitti.h5", layout="kitti")
    assert isinstance(info.value, cf.Error)
    with pytest.raises(FileNotFoundError):
        cf.H5Kitti(tmp_path / "missing.h5")
