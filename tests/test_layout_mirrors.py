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
import zlib
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from PIL import Image

import colabfast as cf
import colabfast.mirror as mirror
from colabfast.layouts import Yolo
from colabfast.mirror import safety as mirror_safety
from colabfast.testing.data import photo
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
    monkeypatch.setattr(mirror_safety, "_vetted", set())


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
            raw = "transform" in kwargs and "target_transform" not in kwargs  # targets as the datasets gave them
            assert describe(ta) == describe(tb) if raw else ta == tb
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
    # torchvision takes target_keys (e.g. "masks") only for its own four classes, found through the MRO
    assert isinstance(ours, datasets.CocoDetection)
    same_dataset(wrap_v2(ours, target_keys="all"), wrap_v2(theirs, target_keys="all"))
    same_dataset(wrap_v2(ours, target_keys={"masks", "labels"}), wrap_v2(theirs, target_keys={"masks", "labels"}))
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
    assert isinstance(ours, datasets.VOCDetection)
    same_dataset(wrap_v2(ours, target_keys="all"), wrap_v2(theirs, target_keys="all"))
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


# --- item 2: the DataLoader over the drop-ins ---------------------------------------------------


def detection_batches(loader) -> list:
    batches = list(loader)
    assert batches, "no batch came out"
    for images, targets in batches:
        assert isinstance(targets, list) and len(targets) == len(images)  # one target per sample
    return batches


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("pipeline", [None, "v2"])
def test_dataloader_over_coco_targets_per_sample(coco, tmp_path, num_workers, pipeline):
    root, ann = coco
    m = pack(root, tmp_path / "coco.h5", labels=ann)
    transforms = None if pipeline is None else v2.Compose([v2.Resize((24, 24)), v2.ToImage()])
    ds = cf.H5CocoDetection(m, output="tensor", transforms=transforms)
    loader = cf.DataLoader(ds, batch_size=3, shuffle=False, num_workers=num_workers, device="cpu")
    batches = detection_batches(loader)
    got = [t for _, targets in batches for t in targets]
    assert got == [ds[i][1] for i in range(len(ds))]  # the annotation lists, as CocoDetection's
    images = [x for b, _ in batches for x in b]
    assert [tuple(x.shape) for x in images] == [tuple(ds[i][0].shape) for i in range(len(ds))]
    for i, x in enumerate(images):
        assert x.dtype == torch.uint8 and torch.equal(torch.as_tensor(x), torch.as_tensor(ds[i][0]))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_over_yolo_boxes_per_sample(yolo, tmp_path, num_workers):  # noqa: F811
    m = pack(yolo, tmp_path / "yolo.h5", split="train")
    ds = cf.H5Dataset(m, output="tensor")
    loader = cf.DataLoader(ds, batch_size=4, shuffle=False, num_workers=num_workers, device="cpu")
    (images, targets), = detection_batches(loader)
    for i, target in enumerate(targets):
        want = ds[i][1]
        assert torch.equal(target["boxes"], want["boxes"]) and torch.equal(target["labels"], want["labels"])
        assert torch.equal(images[i], ds[i][0])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_over_yolo_segments_per_sample(tmp_path, num_workers):
    from colabfast.testing.layouts import make_yolo

    root = make_yolo(tmp_path / "seg", 6, size=(64, 48), segments=True, orientation=6)
    ds = cf.H5Dataset(pack(root, tmp_path / "seg.h5"), output="tensor")
    loader = cf.DataLoader(ds, batch_size=3, shuffle=False, num_workers=num_workers, device="cpu")
    got = [t for _, targets in detection_batches(loader) for t in targets]
    source = Yolo(root)
    for i, target in enumerate(got):
        assert list(target) == ["boxes", "labels", "segments"]
        assert target["segments"] == source[i][1]["segments"]  # per object [[x, y], ...], as the layout's
        assert torch.equal(target["boxes"], torch.from_numpy(source[i][1]["boxes"]))


# --- item 3: on_error="skip" --------------------------------------------------------------------


def test_skip_packs_the_rest_and_lists_both_bad_files(coco, tmp_path):
    root, ann = coco
    data = json.loads(ann.read_text())
    data["annotations"][0]["bbox"] = [1, 2, "wide", 4]  # a bad annotation, of image 7 (b.jpg)
    ann.write_text(json.dumps(data))
    (root / "d.jpg").write_bytes(b"\xff\xd8\xff not a JPEG")  # an unreadable image, image 5
    with pytest.raises(Exception, match="instances.json"):
        pack(root, tmp_path / "strict.h5", labels=ann)
    m = pack(root, tmp_path / "coco.h5", labels=ann, on_error="skip")
    skipped = cf.info(m).skipped
    assert len(skipped) == 2, skipped
    bad_ann, bad_image = sorted(skipped, key=lambda s: s["path"].endswith("d.jpg"))
    assert bad_ann["path"].endswith("b.jpg") and "instances.json" in bad_ann["error"] and "bbox" in bad_ann["error"]
    assert bad_image["path"].endswith("d.jpg") and "cannot identify image" in bad_image["error"]
    ds = cf.H5CocoDetection(m)
    assert ds.ids == [3, 11]
    oracle = datasets.CocoDetection(str(root), str(tmp_path / "coco" / "instances.json"))
    for i, image_id in enumerate(ds.ids):
        same(ds[i], oracle[oracle.ids.index(image_id)])


# --- the workers write kept images straight into the mirror -------------------------------------


@pytest.fixture
def parts(monkeypatch) -> list[dict]:
    """Parts of 2 samples, and what each part saved (without its arrays' contents)."""
    import colabfast.packing.common as common
    import colabfast.packing.parts as packing_parts

    monkeypatch.setattr(common, "CHUNK", 2)
    saved: list[dict] = []
    real = packing_parts._save

    def save(path, errors, arrays, blobs):
        saved.append({**{k: (v.tolist() if v.ndim == 0 else len(v)) for k, v in arrays.items()},
                      **{k: spool.size for k, spool in blobs.items()}})
        real(path, errors, arrays, blobs)

    monkeypatch.setattr(packing_parts, "_save", save)
    return saved


def test_kept_images_are_written_once_into_the_mirror(coco, tmp_path, parts):
    """Every image of a COCO folder is kept as its file is, so the listing gives each one's place in the
    mirror: the workers write them there, the parts hold none of their bytes, and the mirror is the
    oracle's dataset with each file's bytes."""
    root, ann = coco
    pack(root, tmp_path / "inline.h5", labels=ann, workers=0)  # parts saved in this process: seen
    assert len(parts) == 2 and all(p["c0_direct"] is True and p["c0_blob"] == 0 for p in parts), parts
    for m in (tmp_path / "inline.h5", pack(root, tmp_path / "coco.h5", labels=ann, workers=2)):
        ours, theirs = cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann))
        same_dataset(ours, theirs)
        raw = cf.H5CocoDetection(m, output="bytes")
        files = [root / theirs.coco.imgs[i]["file_name"] for i in theirs.ids]
        assert [bytes(raw[i][0].numpy()) for i in range(len(raw))] == [f.read_bytes() for f in files]
        mirror_safety.vet(m)


def test_an_image_not_kept_as_its_file_has_the_mirror_assembled_again(coco, tmp_path, parts):
    """A CMYK JPEG is stored converted (as PNG), so its size is not its file's: its part keeps its images
    and the mirror is assembled from the parts and from what the other part wrote; the same samples."""
    root, ann = coco
    Image.open(root / "d.jpg").convert("CMYK").save(root / "d.jpg", "JPEG")  # image 5, the second sample
    m = pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    assert [p["c0_direct"] if "c0_direct" in p else None for p in parts] == [None, True]
    same_dataset(cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann)))
    assert not (m.parent / ".coco.h5.colabfast-pack").exists()  # nor its rebuild


def test_a_killed_pack_resumes_and_redoes_a_part_whose_written_images_were_lost(coco, tmp_path, parts, monkeypatch,
                                                                                 capsys):
    """Killed after its first part: the next run keeps that part, unless its images in the build no
    longer match their CRC-32s (they never reached the disk): then it makes the part again."""
    import colabfast.packing.dataset as packing_dataset

    root, ann = coco
    real, calls = packing_dataset._encode_part, []

    def killed_at_the_second(*args):
        calls.append(args[0])
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(packing_dataset, "_encode_part", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    monkeypatch.setattr(packing_dataset, "_encode_part", real)
    m = cf.pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    assert "resuming: 2 of 4 samples" in capsys.readouterr().out
    same_dataset(cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann)))

    m.unlink()
    calls.clear()
    monkeypatch.setattr(packing_dataset, "_encode_part", killed_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    monkeypatch.setattr(packing_dataset, "_encode_part", real)
    plan = json.loads((tmp_path / ".coco.h5.colabfast-pack" / "direct.json").read_text())
    with open(tmp_path / ".coco.h5.colabfast-partial", "r+b") as f:  # the first part's first image, lost
        f.seek(plan["base"])
        f.write(b"\0" * 16)
    redone = []
    monkeypatch.setattr(packing_dataset, "_encode_part", lambda *a: redone.append(a[0]) or real(*a))
    m = cf.pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    assert redone == [0, 2]
    same_dataset(cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann)))

    # killed after assembling in place, before sealing: the build holds more than its images, so the
    # next run assembles a new file from the parts and the images written (nothing is encoded again)
    m.unlink()
    seal = packing_dataset.seal
    monkeypatch.setattr(packing_dataset, "seal", lambda build: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    monkeypatch.setattr(packing_dataset, "seal", seal)
    redone.clear()
    monkeypatch.setattr(packing_dataset, "_encode_part", lambda *a: redone.append(a[0]) or real(*a))
    m = pack(root, tmp_path / "coco.h5", labels=ann, workers=0)
    assert redone == [] and not (tmp_path / ".coco.h5.colabfast-pack").exists()
    same_dataset(cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(ann)))
    mirror_safety.vet(m)


# --- item 4: packed from the simulated Drive ----------------------------------------------------


@pytest.mark.fuse
def test_pack_coco_from_the_simulated_drive(standin, tmp_path, monkeypatch):
    from colabfast.drive import mounting as drive
    from colabfast.drivesim import fs as drivesim
    from colabfast.where import standin as standin_module

    ok, why = drivesim.available()
    if not ok:
        pytest.skip(f"FUSE is not available: {why}")
    local = tmp_path / "local"
    root = local / "images"
    root.mkdir(parents=True)
    make_coco(root, local / "instances.json")
    shutil.copytree(local, standin / "MyDrive" / "coco")
    monkeypatch.setenv(standin_module.SIM_VAR, "open_ms=1,read_ms=0")
    my_drive = drive.mount(tmp_path / "drive")
    try:
        m = pack(my_drive / "coco" / "images", tmp_path / "coco.h5", labels=my_drive / "coco" / "instances.json")
        same_dataset(cf.H5CocoDetection(m), datasets.CocoDetection(str(root), str(local / "instances.json")))
        assert cf.info(m).source == str(my_drive / "coco" / "images")
    finally:
        drive.flush_and_unmount()


# --- item 5: hostile mirrors of columns ---------------------------------------------------------


class EveryKind(torch.utils.data.Dataset):
    """Samples with an image, a palette mask, ragged boxes (empty rows too), JSON and a string."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        mask = Image.fromarray(rng.integers(0, 4, (12, 10), dtype=np.uint8), "P")
        mask.putpalette([0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255])
        return photo(10, 12, rng), {"mask": mask, "boxes": torch.rand(i % 3, 4), "ann": [{"id": i, "t": [1, 2]}],
                                    "name": f"n{i} é", "score": i / 2}


@pytest.fixture
def columns_mirror(tmp_path) -> Path:
    return pack(EveryKind(), tmp_path / "good.h5", workers=0)


def read_all(m: Path) -> str:
    """Everything a user reads of a mirror of columns, as a comparable string."""
    ds = cf.H5Dataset(m, output="tensor", verify=True)
    cf.info(m)
    mirror.verify(m)
    out = []
    for i in range(len(ds)):
        image, target = ds[i]
        out.append(repr((image.tolist(), {k: v.tolist() if isinstance(v, torch.Tensor) else v
                                           for k, v in target.items()})))
    return "\n".join(out)


HOSTILE_RUNNER = textwrap.dedent("""
    import sys, zlib
    import colabfast.mirror as mirror
    from colabfast.mirror import format as mirror_format
    from colabfast.mirror import safety as mirror_safety
    from colabfast.mirror import MirrorError
    sys.path.insert(0, sys.argv[1])
    from tests.test_layout_mirrors import read_all
    mirror_format.VET_TIMEOUT = 20
    for line in sys.stdin:
        path = line.strip()
        print("start", path, flush=True)
        try:
            outcome = str(zlib.crc32(read_all(path).encode()))
        except MirrorError as exc:
            outcome = "MirrorError" if path in str(exc) else f"MirrorError not naming the file: {exc}"
        except FileNotFoundError as exc:
            outcome = "MirrorError" if path in str(exc) else f"FileNotFoundError: {exc}"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        print("done", path, outcome, flush=True)
""")


def hand_made(good: Path, out: Path) -> list[Path]:
    """Corruptions of a mirror of columns that keep every checksum valid (or break them on purpose)."""
    from tests.test_mirror import put, set_attrs

    with h5py.File(good, "r") as f:
        spec = json.loads(f.attrs["columns"])
    kinds = {f["name"]: k for k, f in enumerate(spec["fields"])}
    mask, boxes, ann, name = (f"columns/{kinds[n]}" for n in ("1.mask", "1.boxes", "1.ann", "1.name"))
    made = []

    def case(label, change):
        m = out / f"hand-{label}.h5"
        shutil.copyfile(good, m)
        with h5py.File(m, "r+") as f:
            change(f)
        made.append(m)

    def columns_attr(f, change):
        s = json.loads(f.attrs["columns"])
        change(s)
        set_attrs(f, columns=json.dumps(s))

    case("mask-missing", lambda f: f.__delitem__(mask))
    case("mask-images-missing", lambda f: f[mask].__delitem__("images"))
    case("mask-offsets-past", lambda f: put(f[mask], "image_offsets", f[mask]["image_offsets"][()] + 1))
    case("mask-shape-5-channels", lambda f: put(f[mask], "image_shapes", np.c_[f[mask]["image_shapes"][:, :2],
                                                                               np.full(5, 5, np.int32)]))
    case("mask-bytes-garbage", lambda f: f[mask]["images"].__setitem__(slice(None), 7))
    case("ragged-offsets-back", lambda f: put(f[boxes], "offsets", f[boxes]["offsets"][()][::-1]))
    case("ragged-offsets-past", lambda f: put(f[boxes], "offsets", f[boxes]["offsets"][()] * 2))
    case("ragged-values-3-wide", lambda f: put(f[boxes], "values", np.zeros((6, 3), np.float32)))
    case("ragged-dtype-object", lambda f: columns_attr(f, lambda s: s["fields"][kinds["1.boxes"]].update(dtype="|O")))
    case("ragged-dtype-text", lambda f: columns_attr(f, lambda s: s["fields"][kinds["1.boxes"]].update(dtype="<U4")))
    case("ragged-dtype-nonsense", lambda f: columns_attr(f, lambda s: s["fields"][kinds["1.boxes"]].update(
        dtype="xyz")))
    case("ragged-ndim-bad", lambda f: columns_attr(f, lambda s: s["fields"][kinds["1.boxes"]].update(
        meta={"ndim": "2"})))
    case("ragged-shape-huge", lambda f: columns_attr(f, lambda s: s["fields"][kinds["1.boxes"]].update(
        shape=[2**30, 2**30])))
    case("json-not-json", lambda f: put(f[ann], "data", np.frombuffer(b"{" * len(f[ann]["data"]), np.uint8)))
    case("json-deep", lambda f: (put(f[ann], "data", np.frombuffer(b"[" * 100000 + b"]" * 100000, np.uint8)),
                                 put(f[ann], "offsets", np.r_[0, np.full(5, 200000)].astype(np.int64))))
    case("str-not-utf8", lambda f: put(f[name], "data", np.full(len(f[name]["data"]), 0xFF, np.uint8)))
    case("str-offsets-past", lambda f: put(f[name], "offsets", f[name]["offsets"][()] + 10**12))
    case("template-column-past", lambda f: columns_attr(f, lambda s: s.__setitem__("template", {"column": 99})))
    case("template-deep", lambda f: columns_attr(f, lambda s: s.__setitem__("template", json.loads(
        '{"tuple": [' * 20 + '{"column": 0}' + "]}" * 20))))
    case("fields-not-a-list", lambda f: columns_attr(f, lambda s: s.__setitem__("fields", {"a": 1})))
    case("kind-unknown", lambda f: columns_attr(f, lambda s: s["fields"][0].update(kind="video")))
    case("columns-not-json", lambda f: set_attrs(f, columns="{"))
    case("columns-removed", lambda f: (f.attrs.__delitem__("columns"),
                                       set_attrs(f, layout=f.attrs["layout"])))
    case("version-2", lambda f: set_attrs(f, format_version=2))
    case("order-short", lambda f: put(f, "order", f["order"][()][:-1]))
    case("layout-info-list", lambda f: set_attrs(f, layout_info="[1]"))
    case("mask-crc-flipped", lambda f: f[mask]["image_crc32"].__setitem__(0, f[mask]["image_crc32"][0] ^ 1))
    case("truncated", lambda f: None)
    with open(made[-1], "r+b") as fh:
        fh.truncate(good.stat().st_size // 2)
    case("empty-file", lambda f: None)
    made[-1].write_bytes(b"")
    return made


def fuzzed(good: Path, out: Path, count: int, seed: int) -> list[Path]:
    rng = np.random.default_rng(seed)
    data = bytes(good.read_bytes())
    made = []
    for k in range(count):
        mutated = bytearray(data)
        for pos in rng.choice(len(data), int(rng.integers(1, 5)), replace=False):
            mutated[pos] ^= int(rng.integers(1, 256))
        m = out / f"fuzz-{k:03d}.h5"
        m.write_bytes(bytes(mutated))
        made.append(m)
    return made


def test_hostile_mirrors_of_columns_are_mirror_errors(columns_mirror, tmp_path):
    """Hand-made corruptions of a version 3 mirror (every column kind) and 20 fuzzed copies, read in a
    subprocess with a time limit: each is a MirrorError naming the file, or exactly the packed data."""
    corpus = hand_made(columns_mirror, tmp_path) + fuzzed(columns_mirror, tmp_path, 20, seed=25)
    expected = str(zlib.crc32(read_all(columns_mirror).encode()))
    proc = subprocess.run([sys.executable, "-c", HOSTILE_RUNNER, str(ROOT)], capture_output=True, text=True,
                          input="".join(f"{p}\n" for p in corpus), timeout=900, cwd=ROOT,
                          env={**os.environ, "COLABFAST_CACHE": str(tmp_path / "cache")})
    started = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("start")]
    assert proc.returncode == 0, f"the reader died (rc {proc.returncode}) on {started[-1:]}: {proc.stderr[-2000:]}"
    outcomes = dict(line.split(" ", 2)[1:] for line in proc.stdout.splitlines() if line.startswith("done"))
    assert len(outcomes) == len(corpus)
    wrong = {Path(p).name: o for p, o in outcomes.items()
             if o != "MirrorError" and (Path(p).name.startswith("hand-") or o != expected)}
    assert not wrong, wrong


# --- item 6: colabfast info ---------------------------------------------------------------------


def info_cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "colabfast.cli", "info", *args], capture_output=True, text=True,
                          cwd=ROOT, env={**os.environ, "COLABFAST_CACHE": str(cache)})


def test_info_lists_columns_and_verify_names_a_flipped_mask_byte(columns_mirror, tmp_path):
    out = info_cli(str(columns_mirror), cache=tmp_path / "cache")
    assert out.returncode == 0, out.stderr
    for line in ("0: image", "1.mask: mask", "1.boxes: ragged float32 [*, 4]", "1.ann: json", "1.name: str",
                 "1.score: float"):
        assert line in out.stdout, out.stdout
    out = info_cli("--verify", str(columns_mirror), cache=tmp_path / "cache")
    assert out.returncode == 0 and "verified" in out.stdout, out.stdout + out.stderr
    m = tmp_path / "flipped.h5"
    shutil.copyfile(columns_mirror, m)
    with h5py.File(m, "r") as f:
        spec = json.loads(f.attrs["columns"])
        k = next(k for k, s in enumerate(spec["fields"]) if s["name"] == "1.mask")
        at = f[f"columns/{k}/images"].id.get_offset() + int(f[f"columns/{k}/image_offsets"][3]) + 40
    with open(m, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x40]))
    out = info_cli("--verify", str(m), cache=tmp_path / "cache")
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "1 of 5 samples do not match their checksums" in out.stderr and "sample 3" in out.stderr
    assert "field '1.mask'" in out.stderr and str(m) in out.stderr


def _zip_tree(folder: Path, archive: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                z.write(path, path.relative_to(folder).as_posix())
    return archive


def test_an_export_zip_packs_as_its_layout_and_is_found_without_extracting(tmp_path, capsys):
    from torchvision.datasets import CocoDetection

    import colabfast as cf
    from colabfast.testing.layouts import make_coco, make_yolo

    export = tmp_path / "export"
    make_coco(export / "train", 5, size=(64, 48), seed=1)
    make_coco(export / "valid", 3, size=(64, 48), seed=2)
    (export / "README.roboflow.txt").write_text("exported\n")
    archive = _zip_tree(export, tmp_path / "export.zip")
    # the splits listed from the zip's listing (it said "holds the COCO exports train, valid_annotations.coco.json"
    # after extracting the whole export, a FileNotFoundError)
    with pytest.raises(cf.errors.PackRefused, match=r"several splits: 'train' \(train/\), 'valid' \(valid/\)\. Pass "
                                            r"split= one of them: pack\(.*split='train'\)"):
        cf.pack(archive, tmp_path / "m.h5", progress=False)
    cf.pack(archive, tmp_path / "train.h5", split="train", progress=False)
    ds = cf.H5CocoDetection(tmp_path / "train.h5")
    ref = CocoDetection(str(export / "train"), str(export / "train" / "_annotations.coco.json"))
    assert ds.ids == ref.ids and cf.info(tmp_path / "train.h5").source == str(archive)
    for (a, ta), (b, tb) in zip(ref, ds):
        assert ta == tb and np.array_equal(np.asarray(a), np.asarray(b))
    capsys.readouterr()
    cf.pack(archive, tmp_path / "train.h5", split="train")
    assert "already a complete mirror" in capsys.readouterr().out  # nothing extracted again
    assert not any((cf.env.work_dir() / "unpacked").glob("train-*"))  # the extraction is gone

    exported = make_yolo(tmp_path / "yolo", 4, size=(64, 48))
    packed = cf.pack(_zip_tree(exported, tmp_path / "yolo.zip"), tmp_path / "y.h5", progress=False)
    assert cf.info(packed).layout == "yolo" and len(cf.H5Dataset(packed)) == 4


def test_open_dataset_opens_an_export_zip(local):
    import colabfast as cf
    from colabfast.testing.layouts import make_coco

    tmp_path = local
    make_coco(tmp_path / "export" / "train", 4, size=(64, 48))
    archive = _zip_tree(tmp_path / "export", tmp_path / "export.zip")
    ds = cf.open_dataset(archive, "train", progress=False)
    assert type(ds).__name__ == "H5CocoDetection" and len(ds) == 4
    again = cf.open_dataset(archive, "train", progress=False)
    assert "found a mirror of it made" in again.account and "packed" not in again.account
