"""colabfast.ultralytics_data: a YOLO export (folder, data.yaml, zip) as a local YOLO tree that
Ultralytics trains from, its labels checked with Ultralytics' own ``verify_image_label``."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

import colabfast as cf
from colabfast.layouts import LayoutError
from colabfast.opening.ultralytics import COMPLETE, ExportRefused
from colabfast.testing.data import encode, photo
from colabfast.testing.layouts import with_orientation
from colabfast.where import env

os.environ.setdefault("YOLO_OFFLINE", "true")  # Ultralytics must not try to download anything here,
os.environ.setdefault("YOLO_AUTOINSTALL", "false")  # nor install packages (ultralytics/utils/__init__.py)

RNG = np.random.default_rng(0)
CLASSES = 3


def image(path: Path, width: int, height: int, fmt: str = "JPEG", orientation: int = 0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = encode(photo(width, height, RNG), fmt)
    path.write_bytes(with_orientation(data, orientation) if orientation else data)
    return path


def text(path: Path, content: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    return path


def export(root: Path) -> Path:
    """An Ultralytics export: boxes, an EXIF-rotated JPEG (orientation 6: stored 60x30, upright 30x60),
    a PNG, a background image, duplicate rows, a subfolder, an image Ultralytics drops (a class
    outside names), and a val split."""
    image(root / "images/train/a.jpg", 80, 40)
    text(root / "labels/train/a.txt", "1 0.5 0.5 0.2 0.4\n0 0.25 0.75 0.5 0.5\n0 0.25 0.75 0.5 0.5\n")
    image(root / "images/train/turned.jpg", 60, 30, orientation=6)
    text(root / "labels/train/turned.txt", "2 0.25 0.5 0.2 0.4\n0 0.7 0.1 0.1 0.05\n")
    image(root / "images/train/b.png", 48, 32, "PNG")
    text(root / "labels/train/b.txt", "0 0.333333 0.1234567 0.0101 0.3\n")
    image(root / "images/train/background.jpg", 32, 32)
    image(root / "images/train/sub/d.jpg", 50, 70)
    text(root / "labels/train/sub/d.txt", "2 -0.01 0.5 0.2 0.2\n1 0.5 1.01 0.5 0.02\n")
    image(root / "images/train/dropped.jpg", 40, 40)
    text(root / "labels/train/dropped.txt", "7 0.5 0.5 0.2 0.2\n")
    image(root / "images/val/v.jpg", 64, 48)
    text(root / "labels/val/v.txt", "0 0.5 0.5 0.9 0.9\n")
    text(root / "data.yaml", "path: .\ntrain: images/train\nval: images/val\nnc: 3\nnames: [cat, dog, bird]\n")
    return root


def segments_export(root: Path) -> Path:
    """Ultralytics' segment format (every object a polygon), one image EXIF-rotated."""
    image(root / "images/train/a.jpg", 100, 50)
    text(root / "labels/train/a.txt", "2 0.1 0.2 0.5 0.1 0.3 0.9\n0 0.5 0.5 0.9 0.5 0.9 0.9 0.5 0.9\n")
    image(root / "images/train/turned.jpg", 60, 30, orientation=8)
    text(root / "labels/train/turned.txt", "1 0.1 0.1 0.6 0.2 0.4 0.8 0.15 0.7\n")
    image(root / "images/val/v.jpg", 40, 40)
    text(root / "labels/val/v.txt", "0 0.2 0.2 0.8 0.2 0.8 0.8\n")
    text(root / "data.yaml", "train: images/train\nval: images/val\nnames: {0: a, 1: b, 2: c}\n")
    return root


def tree(root: Path) -> dict[str, tuple[int, int]]:
    """{relative path: (inode, mtime_ns)} of every file under ``root``."""
    return {p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


def contents(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def verified(image_path: Path, label_path: Path):
    """What Ultralytics reads of an image and its label file: (labels [M, 5] or None, (h, w), segments)."""
    from ultralytics.data.utils import verify_image_label

    _, lb, shape, segments, *_ = verify_image_label((str(image_path), str(label_path), "", False, CLASSES, 0, 0,
                                                     False))
    return lb, shape, segments


def label_of(image_path: Path) -> Path:
    from ultralytics.data.utils import img2label_paths

    return Path(img2label_paths([str(image_path)])[0])


def same_as_ultralytics(src_images: Path, out_images: Path) -> int:
    """Every image under ``src_images`` read by ``verify_image_label`` from the export and from the
    written tree: dropped in both, or the same labels, size and polygons (to float32 rounding);
    the image bytes the export's unless EXIF-turned (then the same upright pixels, by Ultralytics' imread).
    The number of images compared."""
    from ultralytics.utils.patches import imread

    compared = 0
    for src in sorted(p for p in src_images.rglob("*") if p.is_file()):
        out = out_images / src.relative_to(src_images)
        lb, shape, segments = verified(src, label_of(src))
        if lb is None:  # Ultralytics drops it: so does the tree
            assert not out.exists(), out
            continue
        got, got_shape, got_segments = verified(out, label_of(out))
        assert got is not None and got_shape == shape, out
        np.testing.assert_array_equal(got[:, 0], lb[:, 0])
        np.testing.assert_allclose(got[:, 1:], lb[:, 1:], rtol=0, atol=5e-7)
        assert len(got_segments) == len(segments)
        for ours, theirs in zip(got_segments, segments):
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=5e-7)
        with Image.open(src) as im:
            turned = im.getexif().get(274, 1) != 1
        if turned:
            assert np.array_equal(imread(str(out)), imread(str(src))), out  # upright pixels, as Ultralytics reads
        else:
            assert out.read_bytes() == src.read_bytes(), out
        compared += 1
    return compared


def test_labels_are_what_ultralytics_reads_from_the_export(local):
    root = export(local / "drive/ds")
    data = cf.ultralytics_data(root, mirrors=local / "drive/mirrors", to="disk", progress=False)
    out = data.parent
    assert same_as_ultralytics(root / "images/train", out / "images/train") == 5
    assert same_as_ultralytics(root / "images/val", out / "images/val") == 1
    assert not (out / "images/train/dropped.jpg").exists() and (out / "images/train/turned.jpg").exists()
    assert not (out / "labels/train/background.txt").exists()  # a background image: no label file
    # the turned image is upright in the tree: 30 wide, 60 high, no EXIF orientation left to apply
    with Image.open(out / "images/train/turned.jpg") as im:
        assert im.size == (30, 60) and im.getexif().get(274, 1) == 1


def test_polygons_are_what_ultralytics_reads_from_the_export(local):
    root = segments_export(local / "drive/seg")
    data = cf.ultralytics_data(root / "data.yaml", mirrors=local / "drive/mirrors", to="disk", progress=False)
    assert same_as_ultralytics(root / "images/train", data.parent / "images/train") == 2
    assert same_as_ultralytics(root / "images/val", data.parent / "images/val") == 1
    first = (data.parent / "labels/train/a.txt").read_text().splitlines()
    assert len(first) == 2 and all(len(line.split()) > 6 for line in first)  # still polygons


def png(path: Path, pixels: np.ndarray, **save) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, **save)
    return path


def test_16_bit_and_palette_images_are_read_as_ultralytics_reads_them(local):
    """Ultralytics decodes with OpenCV (``imread``, ``ultralytics/utils/patches.py``): a 16-bit grey
    PNG or TIFF keeps each value's high byte, where Pillow's ``convert("RGB")`` clips it to 255. The
    tree's files and the mirror's pixels are OpenCV's, to the pixel."""
    import cv2
    from ultralytics.utils.patches import imread

    root = local / "drive/deep"
    grey16 = RNG.integers(0, 65536, (30, 40), dtype=np.uint16)
    png(root / "images/train/grey16.png", grey16)
    png(root / "images/train/grey16-trns.png", grey16[::-1].copy(), transparency=1234)
    png(root / "images/train/grey16.tif", grey16[:, ::-1].copy())
    cv2.imwrite(str(root / "images/train/rgb16.png"), RNG.integers(0, 65536, (30, 40, 3), dtype=np.uint16))
    palette = Image.fromarray(RNG.integers(0, 256, (30, 40, 3), dtype=np.uint8)).quantize(16)
    palette.save(text(root / "images/train/palette.png", "")), palette.save(root / "images/train/palette4.png",
                                                                              bits=4, transparency=3)
    turned = cv2.imencode(".png", grey16)[1].tobytes()  # a 16-bit grey PNG with an EXIF orientation
    (root / "images/train/turned16.png").write_bytes(
        turned[:33] + png_chunk(b"eXIf", with_orientation_exif(6)) + turned[33:])
    sources = sorted((root / "images/train").iterdir())
    for src in sources:
        text(label_of(src), "1 0.5 0.5 0.5 0.5\n")
    text(root / "data.yaml", "train: images/train\nval: images/train\nnames: [a, b, c]\n")
    with Image.open(root / "images/train/grey16.png") as im:
        assert im.mode == "I;16" and np.asarray(im.convert("RGB")).max() == 255  # Pillow's clip
    data = cf.ultralytics_data(root, "train", mirrors=local / "drive/mirrors", to="disk", progress=False)
    ds = cf.open_dataset(root, "train", mirrors=local / "drive/mirrors", layout="yolo", progress=False)
    for k, src in enumerate(sources):
        theirs = imread(str(src))
        assert theirs.shape[2] == 3 and (src.name != "grey16.png" or theirs.max() > 200), src
        assert np.array_equal(imread(str(data.parent / "images/train" / src.name)), theirs), src.name
        assert ds.source_paths[k].endswith(src.name)
        assert np.array_equal(np.asarray(ds[k][0])[..., ::-1], theirs), src.name  # the mirror's pixels


def png_chunk(kind: bytes, data: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def with_orientation_exif(orientation: int) -> bytes:
    """A PNG's ``eXIf`` chunk data: the TIFF block alone, without JPEG's ``Exif\\0\\0`` header."""
    exif = Image.Exif()
    exif[274] = orientation
    return exif.tobytes()[6:]


def roboflow_zip(local: Path) -> Path:
    """A Roboflow YOLO export zip: train/valid/test folders, ``../train/images`` paths, a roboflow block."""
    root = local / "export"
    for split, n in (("train", 3), ("valid", 1), ("test", 1)):
        for k in range(n):
            image(root / f"{split}/images/{split}{k}.jpg", 40, 30)
            text(root / f"{split}/labels/{split}{k}.txt", f"{k % CLASSES} 0.5 0.5 0.25 0.5\n")
    text(root / "data.yaml", "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 3\n"
         "names: ['a', 'b', 'c']\n\nroboflow:\n  workspace: me\n  project: things\n  version: 2\n"
         "  license: CC BY 4.0\n  url: https://universe.roboflow.com/me/things/dataset/2\n")
    archive = local / "drive/things.v2i.yolov8.zip"
    archive.parent.mkdir(parents=True)
    with zipfile.ZipFile(archive, "w") as z:
        for p in sorted(root.rglob("*")):
            if p.is_file():
                z.write(p, p.relative_to(root).as_posix())
    return archive


def test_yaml_keys_kept_and_paths_rewritten_to_local_disk(local):
    archive = roboflow_zip(local)
    original = yaml.safe_load(zipfile.ZipFile(archive).read("data.yaml"))
    data = cf.ultralytics_data(archive, mirrors=local / "drive/mirrors", to="disk", progress=False)
    doc = yaml.safe_load(data.read_text())
    assert Path(doc["path"]) == data.parent and data.parent.is_relative_to(env.work_dir())
    assert {k: doc[k] for k in ("train", "val", "test")} == {"train": "images/train", "val": "images/valid",
                                                             "test": "images/test"}
    assert {k: v for k, v in doc.items() if k not in ("path", "train", "val", "test")} == \
        {k: v for k, v in original.items() if k not in ("train", "val", "test")}  # names, nc, roboflow: kept
    for key, n in (("train", 3), ("val", 1), ("test", 1)):
        folder = Path(doc["path"]) / doc[key]
        assert folder.is_dir() and len(list(folder.iterdir())) == n
    written = [p for p in data.parent.rglob("*") if p.is_file()]
    assert all(not os.path.islink(p) and p.resolve().is_relative_to(env.work_dir()) for p in written)
    # split= keeps the YAML keys asked for
    data = cf.ultralytics_data(archive, "train", mirrors=local / "drive/mirrors", to="disk", progress=False)
    assert {k for k in yaml.safe_load(data.read_text()) if k in ("train", "val", "test")} == {"train"}


ROBOFLOW_PATHS = "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n"


@pytest.mark.parametrize("paths", [ROBOFLOW_PATHS, "train: train/images\nval: valid/images\ntest: test/images\n",
                                   "path: .\ntrain: train/images\nval: valid/images\ntest: test/images\n"])
def test_an_unzipped_roboflow_export_is_read_as_its_zip(local, paths):
    """What Roboflow's ``version.download("yolov8")`` leaves (its zip unzipped: ``<split>/images``, no
    ``images/`` folder), with its YAML's paths as Roboflow writes them or as users fix them: the tree
    of its zip, and Ultralytics' labels."""
    archive = roboflow_zip(local)
    root = local / "export"  # the folder the zip holds
    yaml_text = (root / "data.yaml").read_text()
    (root / "data.yaml").write_text(paths + yaml_text[len(ROBOFLOW_PATHS):])
    from_zip = cf.ultralytics_data(archive, mirrors=local / "drive/mirrors", to="disk", progress=False)
    from_folder = cf.ultralytics_data(root, mirrors=local / "drive/mirrors", to="disk", progress=False)
    ours, theirs = contents(from_folder.parent), contents(from_zip.parent)
    assert ours.keys() == theirs.keys() and len([k for k in ours if k.startswith("images/")]) == 5
    assert all(ours[k] == theirs[k] for k in ours if k not in ("data.yaml", COMPLETE))
    doc, zipped = yaml.safe_load(from_folder.read_text()), yaml.safe_load(from_zip.read_text())
    assert {**doc, "path": None} == {**zipped, "path": None}
    for split, key in (("train", "train"), ("valid", "val"), ("test", "test")):
        assert doc[key] == f"images/{split}"
        assert same_as_ultralytics(root / split / "images", from_folder.parent / doc[key]) == (3 if key == "train"
                                                                                                else 1)


def test_a_zip_is_listed_and_extracted_once_whatever_its_splits(local, monkeypatch):
    """Three splits (train, valid, test) read the zip as often as one: one extraction, one listing."""
    from colabfast.packing import unpacked

    archive = roboflow_zip(local)
    opened: list[str] = []
    extracted: list[str] = []
    zip_init, extract = zipfile.ZipFile.__init__, unpacked.extract

    def counted_init(self, file, *args, **kwargs):
        name = os.fspath(file) if isinstance(file, (str, os.PathLike)) else getattr(file, "name", "")
        opened.append(os.path.abspath(name)) if name else None
        zip_init(self, file, *args, **kwargs)

    def counted_extract(src, *args, **kwargs):
        extracted.append(os.fspath(src))
        return extract(src, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "__init__", counted_init)
    monkeypatch.setattr(unpacked, "extract", counted_extract)
    reads = {}
    for split in ("train", None):
        new_runtime(local)
        opened.clear(), extracted.clear()
        data = cf.ultralytics_data(archive, split, mirrors=local / f"drive/mirrors-{split}", to="disk",
                                   progress=False)
        reads[split] = opened.count(str(archive))
        assert extracted == [str(archive)], extracted
    assert len(yaml.safe_load(data.read_text())) >= 3 and reads[None] == reads["train"] <= 3, reads
    assert not any((env.work_dir() / "unpacked").iterdir())  # the extraction is removed


def test_a_staged_mirror_of_another_mirrors_folder_is_refused_in_ultralytics_datas_terms(local):
    """``open_dataset(mirrors=A)`` then ``ultralytics_data(mirrors=B)``: the staged copy from A is not
    replaced, and the message says what ultralytics_data takes (not stage's ``dst=``/``overwrite=``)."""
    from colabfast.errors import StageRefused

    archive = roboflow_zip(local)
    first, other = local / "drive/mirrors", local / "drive/other-mirrors"
    cf.open_dataset(archive, "train", mirrors=first, to="disk", output="bytes", layout="yolo", progress=False)
    with pytest.raises(StageRefused) as info:
        cf.ultralytics_data(archive, mirrors=other, to="disk", progress=False)
    message = str(info.value)
    assert isinstance(info.value, cf.Error) and "\n" not in message, message
    assert f"mirrors={str(first)!r}" in message and "dst" not in message and "overwrite" not in message, message
    data = cf.ultralytics_data(archive, mirrors=first, to="disk", progress=False)  # what the message says
    assert len(list((data.parent / "images/train").iterdir())) == 3


def account_times(out: str) -> tuple[float, dict[str, float]]:
    """The total and the parts of ultralytics_data's printed account (its last line)."""
    import re

    line = [x for x in out.splitlines() if x.startswith("ultralytics_data: ")][-1]
    total, parts = re.fullmatch(r".*\(([0-9.]+) s: (.*)\)", line).groups()
    return float(total), {what: float(s) for what, s in re.findall(r"(?:^|, )([^,]+?) ([0-9.]+) s", parts)}


def test_the_accounts_times_add_up_to_the_calls(local, capsys):
    """Each part of the account is timed from the end of the one before, from the call's start: they
    add up to the printed total (to its rounding), which is the call's time (within the test's own)."""
    import time

    archive = roboflow_zip(local)
    for runtime in ("first", "later"):
        new_runtime(local)
        capsys.readouterr()
        began = time.perf_counter()
        cf.ultralytics_data(archive, mirrors=local / "drive/mirrors", to="disk")
        wall = time.perf_counter() - began
        total, parts = account_times(capsys.readouterr().out)
        assert abs(sum(parts.values()) - total) <= 0.005 * (len(parts) + 1), (total, parts)
        assert total <= wall + 0.005 and "imports" in parts and "other" in parts, (total, wall, parts)
        splits = [what for what in parts if what.startswith("split ")]
        assert len(splits) == (3 if runtime == "first" else 0), parts  # a later runtime stages by the record
        assert ("the tree written" in parts) == (runtime == "first"), parts


def test_second_call_and_second_runtime_pack_nothing(local, monkeypatch):
    import shutil

    from colabfast import packing

    root = export(local / "drive/ds")
    mirrors = local / "drive/mirrors"
    before_export = contents(local / "drive/ds")
    data = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    packed, written = tree(mirrors), tree(data.parent)
    assert sorted(p.rsplit("-", 1)[0] for p in packed if p.endswith(".h5")) == ["ds", "ds"]  # one mirror per split
    assert [p for p in packed if not p.endswith(".h5")] == [record_of(local / "drive/ds", mirrors).name]

    def no_pack(*args, **kwargs):
        raise AssertionError("packed again")

    monkeypatch.setattr(packing, "pack", no_pack)
    assert cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False) == data  # same runtime
    assert tree(data.parent) == written and tree(mirrors) == packed  # nothing rewritten
    shutil.rmtree(local / "tmp")  # a new runtime: local disk empty, the mirrors on Drive
    (local / "tmp").mkdir()
    again = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    assert tree(mirrors) == packed and (again.parent / COMPLETE).is_file()
    assert contents(again.parent).keys() == {**dict.fromkeys(written)}.keys()
    assert contents(local / "drive/ds") == before_export  # nothing written into the export


def assert_refused(call, local: Path, *words: str, error: type = ExportRefused) -> str:
    drive_before = contents(local / "drive")
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert isinstance(info.value, cf.Error) and "\n" not in message, message
    for word in words:
        assert word in message, message
    assert contents(local / "drive") == drive_before  # nothing written beside the export, no mirror
    left = [p for p in (local / "tmp").rglob("*") if p.is_file()]
    assert left == [], left  # nothing on local disk
    return message


def test_bad_inputs_are_refused_with_the_call_to_make(local):
    root = export(local / "drive/ds")
    image(local / "drive/other/images/x.jpg", 20, 20)
    mirrors = local / "drive/mirrors"

    def call(path, *args):
        return lambda: cf.ultralytics_data(path, *args, mirrors=mirrors, to="disk", progress=False)

    text(root / "data.yaml", "train: ../other/images\nval: images/val\nnames: [a, b, c]\n")
    assert_refused(call(root), local, "outside the dataset folder", "train:")
    text(root / "data.yaml", "train: /content/elsewhere/images/train\nval: images/val\nnames: [a, b, c]\n")
    assert_refused(call(root), local, "outside the dataset folder")
    text(root / "data.yaml", "train: images/train\nval: images/validation\nnames: [a, b, c]\n")
    assert_refused(call(root / "data.yaml"), local, "val:", "does not hold", "ultralytics_data(")
    (root / "images/empty").mkdir()
    text(root / "data.yaml", "train: images/train\nval: images/empty\nnames: [a, b, c]\n")
    assert_refused(call(root), local, "holds no image", "val:")
    text(root / "data.yaml", "train: labels/train\nval: images/val\nnames: [a, b, c]\n")
    assert_refused(call(root), local, "not an images/<split> nor <split>/images folder")
    text(root / "data.yaml", "train: images/train\nnames: [a, b, c]\n")
    assert_refused(call(root, "val"), local, "no val: split", "split=['train']")
    os.symlink(local / "drive/other.yaml", root / "linked.yaml")
    text(local / "drive/other.yaml", "train: images/train\nnames: [a, b, c]\n")
    assert_refused(call(root / "linked.yaml"), local, "outside the export's folder")
    (root / "linked.yaml").unlink()
    (local / "drive/other.yaml").unlink()
    text(root / "data.yaml", "train: images/train\nval: images/val\nnames: [a, b, c]\nkpt_shape: [17, 3]\n")
    assert_refused(call(root), local, "pose")
    text(root / "data.yaml", "train: [images/train, images/val]\nval: images/val\nnames: [a, b, c]\n")
    assert_refused(call(root), local, "list")
    text(root / "data.yaml", "names: !!python/object/apply:os.system [echo hi]\ntrain: images/train\n")
    assert_refused(call(root), local, "not valid YAML", error=LayoutError)
    coco = local / "drive/coco.zip"
    with zipfile.ZipFile(coco, "w") as z:
        z.writestr("train/_annotations.coco.json", '{"images": [], "annotations": [], "categories": []}')
        z.writestr("train/a.jpg", encode(photo(8, 8, RNG)))
    assert_refused(call(coco), local, "coco export", "open_dataset")
    classify = local / "drive/flowers"
    image(classify / "train/rose/1.jpg", 8, 8)
    assert_refused(call(classify), local, "classification export", "open_dataset")


@pytest.mark.fuse
def test_ultralytics_trains_one_epoch_from_the_local_tree(local, monkeypatch):
    """The issue's "done when": YOLOv8n (from its YAML: no weights downloaded) trains one epoch on the
    CPU at imgsz=64 from what ultralytics_data returns for an export on the Drive simulator (its mirrors
    kept there too), with the simulator unmounted before training: every file it reads is local."""
    from ultralytics import YOLO

    from colabfast.drivesim.simulator import DriveSim
    from colabfast.where import mounttable

    root = local / "drive/ds"
    for k in range(4):
        image(root / f"images/train/{k}.jpg", 64, 48, orientation=6 if k == 0 else 0)
        text(root / f"labels/train/{k}.txt", f"{k % CLASSES} 0.5 0.5 0.4 0.4\n")
    for k in range(2):
        image(root / f"images/val/{k}.jpg", 64, 48)
        text(root / f"labels/val/{k}.txt", f"{k % CLASSES} 0.4 0.5 0.3 0.6\n")
    text(root / "data.yaml", "train: images/train\nval: images/val\nnames: [a, b, c]\n")
    with DriveSim(local / "drive", local / "mnt", open_ms=1, read_ms=0, mbps=None) as sim:
        data = cf.ultralytics_data(sim.mountpoint / "ds", mirrors=sim.mountpoint / "mirrors", to="disk",
                                   progress=False)
    assert not any(m.mountpoint == str(local / "mnt") for m in mounttable.mounts())  # Drive is gone
    assert not os.path.ismount(local / "mnt") and any((local / "drive/mirrors").glob("*.h5"))
    monkeypatch.chdir(local)
    model = YOLO("yolov8n.yaml")
    model.train(data=data, epochs=1, imgsz=64, batch=2, device="cpu", workers=0, plots=False, amp=False,
                project=str(local / "runs"), name="one", exist_ok=True, verbose=False, seed=0)
    trainer = model.trainer
    im_files = trainer.train_loader.dataset.im_files
    assert len(im_files) == 4 and all(Path(f).is_relative_to(data.parent) for f in im_files)
    assert len(trainer.train_loader.dataset.labels) == 4
    assert sum(len(lb["cls"]) for lb in trainer.train_loader.dataset.labels) == 4
    assert trainer.epoch == 0 and (local / "runs/one/weights/last.pt").is_file()


def test_writing_the_tree_never_imports_ultralytics(local):
    """``import colabfast`` and ``ultralytics_data`` itself only write files: Ultralytics is for training."""
    import subprocess
    import sys

    root = export(local / "drive/ds")
    code = ("import sys, colabfast as cf; assert 'ultralytics' not in sys.modules; "
            f"p = cf.ultralytics_data({str(root)!r}, mirrors={str(local / 'drive/mirrors')!r}, to='disk', "
            "progress=False); assert p.is_file(); print(sorted(m for m in sys.modules if m.startswith('ultralytics')))")
    environ = dict(os.environ, COLABFAST_CACHE=str(local / "cache"), TMPDIR=str(local / "tmp"))
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr


def test_export_without_split_folders(local):
    """images/ and labels/ alone, named by both train: and val:, as Ultralytics' small examples are."""
    root = local / "drive/flat"
    image(root / "images/a.jpg", 40, 20)
    text(root / "labels/a.txt", "1 0.5 0.5 0.2 0.4\n")
    image(root / "images/b.jpg", 20, 40)
    text(root / "data.yaml", "train: images\nval: images\nnames: [a, b, c]\n")
    data = cf.ultralytics_data(root, mirrors=local / "drive/mirrors", to="disk", progress=False)
    doc = yaml.safe_load(data.read_text())
    assert (doc["train"], doc["val"]) == ("images/all", "images/all")
    assert len(list((local / "drive/mirrors").glob("*.h5"))) == 1  # one mirror for both keys
    assert same_as_ultralytics(root / "images", data.parent / "images/all") == 2


def in_new_runtime(path: Path, local: Path, runtime: str) -> tuple[str, Path]:
    """``ultralytics_data(path)`` in a new process with its own cache and local disk (a new runtime, Drive
    still mounted): what it printed, and the data.yaml it returned."""
    import subprocess
    import sys

    (local / runtime / "tmp").mkdir(parents=True)
    environ = dict(os.environ, COLABFAST_CACHE=str(local / runtime / "cache"), TMPDIR=str(local / runtime / "tmp"))
    code = "import sys, colabfast as cf; print(cf.ultralytics_data(sys.argv[1], to='disk'))"
    done = subprocess.run([sys.executable, "-c", code, str(path)], env=environ, capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr
    return done.stdout, Path(done.stdout.strip().splitlines()[-1])


@pytest.mark.fuse
def test_on_drive_first_runtime_packs_next_runtime_only_stages(my_drive, local):
    behind = export(local / "standin/MyDrive/things")  # written behind the mount, seen through it
    exported = contents(behind)
    data = cf.ultralytics_data(my_drive / "things/data.yaml", to="disk", progress=False)
    mirrors = my_drive / "colabfast-mirrors"  # the default: the top of My Drive

    def ours() -> dict:  # the export's mirrors (another process on this machine may use the same Drive)
        return {name: st for name, st in tree(mirrors).items() if name.startswith("things-")}

    packed = ours()
    assert len(packed) == 2 and data.parent.is_relative_to(env.work_dir())
    assert same_as_ultralytics(behind / "images/train", data.parent / "images/train") == 5
    printed, again = in_new_runtime(my_drive / "things", local, "runtime2")
    assert again.is_file() and again.is_relative_to(local / "runtime2/tmp")
    assert "packed" not in printed and "no per-file work" in printed and "staged its mirrors" in printed, printed
    assert ours() == packed and contents(behind) == exported  # nothing written beside the export
    assert contents(again.parent / "images") == contents(data.parent / "images")
    assert contents(again.parent / "labels") == contents(data.parent / "labels")


def record_of(root: Path, mirrors: Path, split=None) -> Path:
    """The record of the export at ``root`` (folder or zip) in the mirrors folder
    (colabfast.opening.exportrecord)."""
    from colabfast.opening.exportrecord import record_path

    return record_path(mirrors, root, split)


class Calls:
    """The calls that list, stat or open a path below ``root`` (the export), made while watching:
    ``os.scandir``, ``os.listdir``, ``os.stat``, ``os.lstat``, ``os.open``, ``open``/``io.open``."""

    def __init__(self, root: Path, monkeypatch):
        import builtins
        import io

        self.root, self.seen, self._lstat = os.path.realpath(root), [], os.lstat
        for module, name in ((os, "scandir"), (os, "listdir"), (os, "stat"), (os, "lstat"), (os, "open"),
                             (io, "open"), (builtins, "open")):
            monkeypatch.setattr(module, name, self._watch(name, getattr(module, name)))

    def _watch(self, name, real):
        def call(path=".", *args, **kwargs):
            if isinstance(path, (str, bytes, os.PathLike)) and not isinstance(path, int):
                where = os.fsdecode(os.path.abspath(os.fspath(path)))
                if where == self.root or where.startswith(self.root + os.sep):
                    self.seen.append((name, os.path.relpath(where, self.root)))
            return real(path, *args, **kwargs)
        return call

    def listed(self) -> list:
        return [c for c in self.seen if c[0] in ("scandir", "listdir")]

    def opened(self) -> list:
        return [c for c in self.seen if c[0] in ("open", "io.open")]

    def files_stated(self) -> list:
        """Files (not folders) of the export that were stat'ed."""
        import stat as st

        def is_dir(rel: str) -> bool:
            try:
                return st.S_ISDIR(self._lstat(os.path.normpath(os.path.join(self.root, rel))).st_mode)
            except FileNotFoundError:
                return False

        return sorted({rel for name, rel in list(self.seen) if name in ("stat", "lstat") and not is_dir(rel)})


def new_runtime(local: Path) -> None:
    """Local disk and cache emptied, as a new runtime finds them; the mirrors (on Drive) stay."""
    import shutil

    for name in ("tmp", "cache"):
        shutil.rmtree(local / name, ignore_errors=True)
    (local / "tmp").mkdir()


def test_a_later_runtime_does_no_per_file_work_on_the_export(local, monkeypatch):
    """The issue's "a second runtime does no per-file work on Drive": the record is read, the YAML
    stat'ed and each folder of the splits listed once (names only); no file of the export opened or
    stat'ed but the YAML, no folder listed twice; and a second call in that runtime stages nothing."""
    from collections import Counter

    from colabfast import packing
    from colabfast.staging import pipeline

    root = export(local / "drive/ds")
    mirrors = local / "drive/mirrors"
    data = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    first = contents(data.parent)
    assert record_of(root, mirrors).is_file()
    new_runtime(local)
    with monkeypatch.context() as m:
        m.setattr(packing, "pack", lambda *a, **k: pytest.fail("packed again"))
        calls = Calls(root, m)
        again = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    listed = Counter(rel for _, rel in calls.listed())
    assert set(listed) == {".", "images/train", "images/train/sub", "labels/train", "labels/train/sub",
                           "images/val", "labels/val"}, calls.seen  # "." : the YAML is found there
    assert max(listed.values()) == 1 and calls.opened() == [], calls.seen
    assert calls.files_stated() == ["data.yaml"], calls.seen
    assert again == data and contents(again.parent) == first  # the same tree, from the staged mirrors
    with monkeypatch.context() as m:  # the same runtime: the tree is complete, nothing is staged
        m.setattr(pipeline, "stage", lambda *a, **k: pytest.fail("staged again"))
        calls = Calls(root, m)
        assert cf.ultralytics_data(root / "data.yaml", mirrors=mirrors, to="disk", progress=False) == data
        assert calls.opened() == [] and calls.files_stated() == ["data.yaml"], calls.seen


def test_a_later_runtime_vets_the_mirrors_as_they_are_staged(local, monkeypatch):
    """Issue 42 item 4: a later runtime vets each mirror's copy in the mirrors folder (in a child
    process, while it is staged), and trusts the staged copy of that version instead of vetting it
    again after the copy; a mirror that fails the vetting is still refused."""
    from colabfast.errors import MirrorError
    from colabfast.mirror import safety

    root = export(local / "drive/ds")
    mirrors = local / "drive/mirrors"
    data = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    first = contents(data.parent)
    real_vet, vetted = safety.vet, []

    def vet(path, *args, **kwargs):  # the calls that start a child: the file's version not vetted before
        key = safety._key(Path(path))
        if key not in safety._vetted and key not in safety._cached():
            vetted.append(Path(path))
        return real_vet(path, *args, **kwargs)

    new_runtime(local)
    monkeypatch.setattr(safety, "_vetted", set())  # a new process remembers no vetting (the cache is gone)
    monkeypatch.setattr(safety, "vet", vet)
    again = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    assert again == data and contents(again.parent) == first
    assert sorted(vetted) == sorted(mirrors.glob("*.h5")), vetted  # each where it is kept, none of the copies

    new_runtime(local)  # a mirror the vetting refuses: not trusted, so its staged copy is vetted, and refused
    monkeypatch.setattr(safety, "vet", lambda path, *a, **k: (_ for _ in ()).throw(MirrorError(f"{path}: bad")))
    with pytest.raises(MirrorError, match="bad"):
        cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)


def relisted(calls: Calls) -> bool:
    """Whether the export was read as open_dataset reads it (its YAML opened, its folders listed again),
    not only checked against its record."""
    from collections import Counter

    return bool(calls.opened()) or max(Counter(rel for _, rel in calls.listed()).values(), default=0) > 1


def test_a_changed_export_is_noticed_where_its_record_says(local, monkeypatch):
    """Files added, removed or renamed, the YAML edited: noticed, the export listed and packed again.
    A label file rewritten under its name: missed (the docstring says so) until relist=True."""
    root = export(local / "drive/ds")
    mirrors = local / "drive/mirrors"
    cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)

    def run(**kwargs) -> tuple[Path, Calls]:
        new_runtime(local)
        with monkeypatch.context() as m:
            calls = Calls(root, m)
            return cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False, **kwargs), calls

    image(root / "images/train/sub/new.jpg", 40, 40)  # a file added in a subfolder
    text(root / "labels/train/sub/new.txt", "1 0.5 0.5 0.5 0.5\n")
    data, calls = run()
    assert relisted(calls) and (data.parent / "labels/train/sub/new.txt").is_file()
    data, calls = run()  # the new record: the export is not listed again
    assert not relisted(calls) and (data.parent / "images/train/sub/new.jpg").is_file()
    (root / "images/val/v.jpg").rename(root / "images/val/w.jpg")  # a rename
    (root / "labels/val/v.txt").rename(root / "labels/val/w.txt")
    data, calls = run()
    assert relisted(calls) and sorted(p.name for p in (data.parent / "images/val").iterdir()) == ["w.jpg"]
    text(root / "data.yaml", "path: .\ntrain: images/train\nval: images/val\nnc: 3\nnames: [cat, dog, cow]\n")
    data, calls = run()
    assert relisted(calls) and yaml.safe_load(data.read_text())["names"] == ["cat", "dog", "cow"]
    (root / "labels/train/a.txt").write_text("2 0.5 0.5 0.2 0.4\n")  # rewritten in place: missed without relist
    data, calls = run()
    assert not relisted(calls) and len((data.parent / "labels/train/a.txt").read_text().splitlines()) == 2
    data, calls = run(relist=True)
    assert relisted(calls) and (data.parent / "labels/train/a.txt").read_text().startswith("2 0.5 0.5 0.2")
    data, calls = run()  # relist wrote the record anew
    assert not relisted(calls) and (data.parent / "labels/train/a.txt").read_text().startswith("2 0.5 0.5 0.2")


def test_a_replaced_zip_is_noticed_and_a_deleted_mirror_packed_again(local, monkeypatch):
    archive = roboflow_zip(local)
    mirrors = local / "drive/mirrors"
    data = cf.ultralytics_data(archive, mirrors=mirrors, to="disk", progress=False)
    assert len(list((data.parent / "images/train").iterdir())) == 3
    new_runtime(local)
    with monkeypatch.context() as m:
        calls = Calls(archive, m)
        assert cf.ultralytics_data(archive, mirrors=mirrors, to="disk", progress=False) == data
    assert calls.opened() == [] and calls.files_stated() == ["."], calls.seen  # the zip stat'ed, not opened
    with zipfile.ZipFile(archive, "a") as z:  # the export downloaded again, one image more
        z.writestr("train/images/extra.jpg", encode(photo(40, 30, RNG)))
        z.writestr("train/labels/extra.txt", "0 0.5 0.5 0.5 0.5\n")
    new_runtime(local)
    data = cf.ultralytics_data(archive, mirrors=mirrors, to="disk", progress=False)
    assert len(list((data.parent / "images/train").iterdir())) == 4
    for mirror in mirrors.glob("*.h5"):  # the mirrors deleted: packed again, not an error
        mirror.unlink()
    new_runtime(local)
    again = cf.ultralytics_data(archive, mirrors=mirrors, to="disk", progress=False)
    assert again == data and len(list(mirrors.glob("*.h5"))) == 3


def test_a_record_that_is_not_the_exports_is_not_trusted(local, capsys):
    """A record naming a mirror that is not the one it recorded (another fingerprint) is not used: the
    export is listed, its own mirror found by fingerprint."""
    import json

    root = export(local / "drive/ds")
    mirrors = local / "drive/mirrors"
    data = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=False)
    record = record_of(root, mirrors)
    rec = json.loads(record.read_text())
    train, val = rec["mirrors"]["train"], rec["mirrors"]["val"]
    rec["mirrors"]["train"], rec["mirrors"]["val"] = {**train, "name": val["name"]}, {**val, "name": train["name"]}
    record.write_text(json.dumps(rec))
    new_runtime(local)
    again = cf.ultralytics_data(root, mirrors=mirrors, to="disk", progress=True)
    printed = capsys.readouterr().out
    assert "is not the mirror the export's record names" in printed and "listed" in printed, printed
    assert contents(again.parent) == contents(data.parent)


def test_an_image_not_of_its_declared_size_fails_the_tree_and_leaves_nothing(local, monkeypatch):
    """The writer checks each image's header against the size its mirror declares, as reading it does:
    a mirror that disagrees raises MirrorError naming the sample, and no tree is left."""
    from colabfast.datasets import mirrorreader
    from colabfast.errors import MirrorError

    root = export(local / "drive/ds")
    real = mirrorreader.MirrorReader.__init__

    def wrong_size(self, *args, **kwargs):
        real(self, *args, **kwargs)
        self.shapes = self.shapes.copy()
        self.shapes[0, 0] += 1  # the first stored image declared a pixel taller than its header
    monkeypatch.setattr(mirrorreader.MirrorReader, "__init__", wrong_size)
    with pytest.raises(MirrorError, match=r"sample \d+"):
        cf.ultralytics_data(root, mirrors=local / "drive/mirrors", to="disk", progress=False)
    assert not any((env.work_dir() / "ultralytics").glob("*/images")), "a partial tree was left"

