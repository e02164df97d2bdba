"""colabfast.pack from archives read as a stream (colabfast/packing/archivesource.py, colabfast/layouts/imagenet.py):
ImageNet's official tars and devkit, Kaggle's zip, a tar/zip of an ImageFolder tree. The oracle is
torchvision itself: ``torchvision.datasets.ImageNet`` parses the same tiny official archives."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import shutil
import tarfile
import warnings
import zipfile
from pathlib import Path

import h5py
import numpy as np
import pytest
import torchvision
from PIL import Image
from torchvision import transforms

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.mirror.verify import info
from colabfast.packing import archives, common, pack
from colabfast.packing.archivesource import ArchiveReadError
from colabfast.staging.extract import UnsafeArchiveError
from colabfast.testing.data import make_imagefolder
from colabfast.testing.imagenet_archives import _tar_bytes, make_imagenet_archives, make_kaggle_zip

pytest.importorskip("scipy")  # torchvision's devkit parser needs it; under CI a skip fails


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> dict[str, Path]:
    return make_imagenet_archives(tmp_path_factory.mktemp("ilsvrc"), classes=4, train_per_class=7, val_per_class=3)


@pytest.fixture(scope="module")
def oracle(official, tmp_path_factory, request) -> dict[str, torchvision.datasets.ImageNet]:
    """torchvision.datasets.ImageNet over the same archives: it extracts and parses them itself."""
    import torchvision.datasets.imagenet as tv

    root = tmp_path_factory.mktemp("torchvision-root")
    for path in official.values():
        shutil.copy(path, root / path.name)
    real = tv._verify_archive
    tv._verify_archive = lambda *args: None  # only the md5 check of the full-size download; parsing is untouched
    try:
        return {split: tv.ImageNet(root, split=split) for split in ("train", "val")}
    finally:
        tv._verify_archive = real


def _rel(path: str, root: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _by_torchvision_index(mirror: Path) -> tuple[list[str], list[int]]:
    """The mirror file's (paths, targets) sorted into torchvision's order by its ``order`` dataset."""
    with h5py.File(mirror, "r") as f:
        order = f["order"][:]
        offsets = f["path_offsets"][:]
        blob = f["paths"][:].tobytes()
        targets = f["targets"][:]
    paths = [blob[offsets[i]:offsets[i + 1]].decode() for i in range(len(order))]
    stored = np.argsort(order)
    assert np.array_equal(order[stored], np.arange(len(order)))  # a permutation of torchvision's indices
    return [paths[j] for j in stored], [int(targets[j]) for j in stored]


def _equal_index_for_index(mirror: H5ImageFolder, ds, resize=lambda img: img) -> None:
    """Issue 23 item 9: the mirror dataset is ``ds`` (torchvision's) index for index, whatever order
    the archive stored it in: paths, targets, samples, imgs and pixels."""
    source = mirror.reader.index.header.source
    root = getattr(ds, "split_folder", ds.root)
    assert [_rel(p, source) for p, _ in mirror.samples] == [_rel(p, root) for p, _ in ds.samples]
    assert mirror.targets == ds.targets and [t for _, t in mirror.imgs] == ds.targets
    assert [t for _, t in mirror.__getitems__(list(range(len(ds))))] == ds.targets
    for i in range(len(ds)):
        image, target = mirror[i]
        expected, expected_target = ds[i]
        assert target == expected_target
        assert np.array_equal(np.asarray(image), np.asarray(resize(expected))), ds.samples[i][0]


@pytest.mark.parametrize("split", ["train", "val"])
@pytest.mark.parametrize("image_size", [None, 24])
def test_official_archives_match_torchvision_imagenet(official, oracle, tmp_path, split, image_size):
    ds = oracle[split]
    dst = tmp_path / f"{split}.h5"
    pack(official[split], dst, labels=official["devkit"], store="raw", image_size=image_size, workers=2,
         progress=False)
    paths, targets = _by_torchvision_index(dst)
    assert paths == [_rel(p, ds.split_folder) for p, _ in ds.samples]
    assert targets == ds.targets
    mirror = H5ImageFolder(dst)
    assert mirror.classes == ds.wnids and mirror.class_to_idx == ds.wnid_to_idx
    with h5py.File(dst, "r") as f:
        assert [tuple(names) for names in __import__("json").loads(f.attrs["class_names"])] == ds.classes
        assert "ILSVRC2012_devkit_t12.tar.gz (data/meta.mat" in f.attrs["labels"]
        order = f["order"][:].tolist()
    assert order != sorted(order)  # stored in the archive's order: the index mapping is what is tested
    _equal_index_for_index(mirror, ds, transforms.Resize(image_size) if image_size else (lambda img: img))


def test_info_says_where_labels_came_from(official, tmp_path):
    dst = pack(official["val"], tmp_path / "val.h5", labels=official["devkit"], image_size=24, progress=False)
    text = str(info(dst))
    assert "labels from" in text and "ILSVRC2012_validation_ground_truth.txt" in text
    assert f"Labels from: {official['devkit']} (data/meta.mat" in repr(H5ImageFolder(dst))


def test_progress_shows_archive_bytes_images_and_time_left(official, tmp_path, capsys):
    """Issue 17: the bar counts the archive's bytes read (its total is the archive's size, so tqdm
    shows the rate and the time left) and says how many images are packed."""
    from tqdm import tqdm

    size = official["train"].stat().st_size
    pack(official["train"], tmp_path / "train.h5", image_size=24, workers=0, progress=True)
    err = capsys.readouterr().err
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    total = tqdm.format_sizeof(size, divisor=1000)  # decimal units, as every colabfast bar counts
    assert "pack: 100%" in last and "28 images packed" in last, last
    assert f"{total}/{total}" in last and "B/s" in last and "<" in last, last  # bytes, rate, elapsed<left


def test_a_missing_archive_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no archive at .*ILSVRC2012_img_train.tar"):
        pack(tmp_path / "ILSVRC2012_img_train.tar", tmp_path / "m.h5", progress=False)


def test_val_archive_without_devkit_says_what_to_pass(official, tmp_path):
    with pytest.raises(FileNotFoundError, match="labels=devkit"):
        pack(official["val"], tmp_path / "val.h5", progress=False)


def _extract_kaggle(zip_path: Path, root: Path) -> None:
    """Kaggle's layout made torchvision-readable independently: train/ as is, val/ sorted into class
    folders by LOC_val_solution.csv, as users do by hand."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(root / "raw")
    data = root / "raw" / "ILSVRC" / "Data" / "CLS-LOC"
    shutil.move(data / "train", root / "train")
    with open(root / "raw" / "LOC_val_solution.csv", newline="") as f:
        for row in csv.DictReader(f):
            wnid = row["PredictionString"].split()[0]
            (root / "val" / wnid).mkdir(parents=True, exist_ok=True)
            shutil.move(data / "val" / f"{row['ImageId']}.JPEG", root / "val" / wnid / f"{row['ImageId']}.JPEG")


@pytest.mark.parametrize("split", ["train", "val"])
def test_kaggle_zip_matches_imagefolder_of_its_tree(tmp_path, split):
    archive = make_kaggle_zip(tmp_path / "imagenet-object-localization-challenge.zip", classes=3,
                              train_per_class=5, val_per_class=3)
    _extract_kaggle(archive, tmp_path / "tree")
    ds = torchvision.datasets.ImageFolder(tmp_path / "tree" / split)
    dst = pack(archive, tmp_path / f"{split}.h5", split=split, store="raw", workers=2, progress=False)
    paths, targets = _by_torchvision_index(dst)
    assert paths == [_rel(p, ds.root) for p, _ in ds.samples] and targets == ds.targets
    mirror = H5ImageFolder(dst)
    assert mirror.classes == ds.classes
    _equal_index_for_index(mirror, ds)
    with h5py.File(dst, "r") as f:
        assert "LOC_synset_mapping.txt" in f.attrs["labels"]
        assert ("LOC_val_solution.csv" in f.attrs["labels"]) == (split == "val")


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip"])
def test_archive_of_an_imagefolder_tree(tmp_path, kind):
    tree = make_imagefolder(tmp_path / "data" / "pets", classes=3, per_class=4, size=(40, 30), odd_files=True)
    archive = tmp_path / f"pets.{kind}"
    if kind == "zip":
        shutil.make_archive(str(tmp_path / "pets"), "zip", tmp_path / "data")
    else:
        with tarfile.open(archive, "w:gz" if kind == "tar.gz" else "w") as tar:
            tar.add(tmp_path / "data" / "pets", arcname="pets")
    for hidden in sorted(tree.rglob(".*"), reverse=True):  # in the archive; colabfast skips them, torchvision would not
        shutil.rmtree(hidden) if hidden.is_dir() else hidden.unlink()
    ds = torchvision.datasets.ImageFolder(tree)
    dst = pack(archive, tmp_path / "m.h5", store="raw", workers=0, progress=False)
    paths, targets = _by_torchvision_index(dst)
    assert paths == [_rel(p, str(tree)) for p, _ in ds.samples] and targets == ds.targets
    mirror = H5ImageFolder(dst)
    assert mirror.classes == ds.classes
    _equal_index_for_index(mirror, ds)


@pytest.mark.parametrize("kind", ["tar", "zip"])
def test_a_repeated_member_is_packed_once_as_its_last_copy(tmp_path, kind):
    """Issue 15, case 13 (duplicate archive entries): an ImageFolder archive of 6 images where one
    name appears again at the end with other pixels. tar and unzip keep the last copy, so the mirror
    holds 6 samples, that name's pixels are the last copy's, and paths, targets and order are
    torchvision's ImageFolder of the tree extracted by tar."""
    tree = make_imagefolder(tmp_path / "data" / "pets", classes=3, per_class=2, size=(16, 12))
    repeated = sorted(tree.rglob("*.JPEG"))[1]
    later = io.BytesIO()
    Image.new("RGB", (10, 8), (250, 10, 10)).save(later, format="PNG")  # lossless: exact pixels
    members = [(p.relative_to(tmp_path / "data").as_posix(), p.read_bytes()) for p in sorted(tree.rglob("*.JPEG"))]
    members.append((repeated.relative_to(tmp_path / "data").as_posix(), later.getvalue()))
    archive = tmp_path / f"pets.{kind}"
    if kind == "tar":
        archive.write_bytes(_tar_bytes(members))
    else:
        with warnings.catch_warnings(), zipfile.ZipFile(archive, "w") as z:
            warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
            for name, data in members:
                z.writestr(name, data)
    repeated.write_bytes(later.getvalue())  # the tree as tar or unzip leaves it
    ds = torchvision.datasets.ImageFolder(tree)
    dst = pack(archive, tmp_path / "m.h5", store="raw", workers=0, progress=False)
    mirror = H5ImageFolder(dst)
    assert len(mirror) == len(ds) == 6
    paths, targets = _by_torchvision_index(dst)
    assert paths == [_rel(p, str(tree)) for p, _ in ds.samples] and targets == ds.targets
    _equal_index_for_index(mirror, ds)
    with h5py.File(dst, "r") as f:
        assert json.loads(f.attrs["skipped"]) == []  # an earlier copy is not an unreadable file


def test_hostile_inner_tar_is_refused_and_nothing_is_written_outside(tmp_path):
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, format="JPEG")
    inner = _tar_bytes([("n01440764_1.JPEG", jpeg.getvalue()), ("../../../escape.JPEG", jpeg.getvalue())])
    archive = tmp_path / "ILSVRC2012_img_train.tar"
    archive.write_bytes(_tar_bytes([("n01440764.tar", inner)]))
    with pytest.raises(UnsafeArchiveError, match=r"escape\.JPEG"):
        pack(archive, tmp_path / "out" / "m.h5", workers=0, progress=False)
    assert not list(tmp_path.rglob("escape*"))
    assert not (tmp_path / "out" / "m.h5").exists()


def test_links_and_devices_in_an_archive_are_never_read(tmp_path):
    buf = io.BytesIO()
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(jpeg, format="JPEG")
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info_ = tarfile.TarInfo("cat/1.jpg")
        info_.size = len(jpeg.getvalue())
        tar.addfile(info_, io.BytesIO(jpeg.getvalue()))
        link = tarfile.TarInfo("cat/2.jpg")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
        dev = tarfile.TarInfo("cat/3.jpg")
        dev.type = tarfile.CHRTYPE
        tar.addfile(dev)
    (tmp_path / "a.tar").write_bytes(buf.getvalue())
    dst = pack(tmp_path / "a.tar", tmp_path / "m.h5", workers=0, progress=False)
    assert len(H5ImageFolder(dst)) == 1


def test_truncated_archive_names_the_member_keeps_parts_and_resumes(official, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "CHUNK", 4)
    archive = tmp_path / "ILSVRC2012_img_train.tar"
    full = official["train"].read_bytes()
    archive.write_bytes(full[: int(len(full) * 0.7)])
    dst = tmp_path / "m.h5"
    with pytest.raises(ArchiveReadError, match=r"n014\d+\.tar") as err:
        pack(archive, dst, image_size=24, workers=2, progress=False)
    assert "run pack() again" in str(err.value)
    work = tmp_path / ".m.h5.colabfast-pack"
    parts = sorted(work.glob("stream-*.npz"))
    assert len(parts) >= 3 and not dst.exists()
    kept = {p.name: p.stat().st_mtime_ns for p in parts}

    archive.write_bytes(full)  # the complete upload
    encoded, seen = [], []
    real = archives._encode_chunk

    def encode(items, *a):
        if not encoded:  # the resumed pack's first new chunk: the kept parts are still there, untouched
            seen.append({p.name: p.stat().st_mtime_ns for p in work.glob("stream-*.npz")})
        encoded.append(len(items))
        return real(items, *a)

    monkeypatch.setattr(archives, "_encode_chunk", encode)
    pack(archive, dst, image_size=24, workers=0, progress=False)
    assert sum(encoded) == 28 - 4 * len(parts)  # only what was not packed before
    assert kept.items() <= seen[0].items()
    assert len(H5ImageFolder(dst)) == 28
    assert not work.exists()


def test_truncation_at_a_member_boundary_is_caught(tmp_path):
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, format="JPEG")
    whole = _tar_bytes([("cat/1.jpg", jpeg.getvalue()), ("dog/2.jpg", jpeg.getvalue())])
    cut = tmp_path / "a.tar"
    cut.write_bytes(whole[: 512 + 1024])  # the first member complete, then nothing: no end-of-archive block
    with pytest.raises(ArchiveReadError, match="end-of-archive"):
        pack(cut, tmp_path / "m.h5", workers=0, progress=False)


def test_resume_enters_a_plain_tar_at_the_member_reached(official, tmp_path, monkeypatch):
    """The resumed stream starts at the recorded member's offset: the bytes before it are not read again."""
    monkeypatch.setattr(common, "CHUNK", 7)  # a part per class
    archive = tmp_path / "ILSVRC2012_img_train.tar"
    shutil.copy(official["train"], archive)
    real = archives._encode_chunk
    calls = []

    def stop_at_the_third_part(items, *args):
        calls.append(len(items))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(items, *args)

    monkeypatch.setattr(archives, "_encode_chunk", stop_at_the_third_part)
    with pytest.raises(KeyboardInterrupt):
        pack(archive, tmp_path / "m.h5", workers=0, progress=False)
    monkeypatch.setattr(archives, "_encode_chunk", real)
    seen = []
    from colabfast.packing.archivesource import ArchiveSource

    original = ArchiveSource.images

    def spy(self, start, on_bytes=None):
        seen.append(start)
        yield from original(self, start, on_bytes)

    monkeypatch.setattr(ArchiveSource, "images", spy)
    pack(archive, tmp_path / "m.h5", workers=0, progress=False)
    with tarfile.open(archive) as tar:
        second = tar.getmembers()[1]
    assert seen == [(second.offset, 7)]  # two parts were finished: all 7 images of the second class tar
    assert len(H5ImageFolder(tmp_path / "m.h5")) == 28


def test_killed_archive_pack_resumes_from_its_last_part(tmp_path, monkeypatch):
    import subprocess
    import sys

    from colabfast.testing.imagenet_archives import make_train_tar

    archive = make_train_tar(tmp_path / "ILSVRC2012_img_train.tar", classes=4, per_class=60, size=(64, 48))
    dst = tmp_path / "m.h5"
    # The child stalls while saving its 4th part, so the kill always lands mid-stream with 3 parts logged
    # (on a busy machine the whole pack could otherwise finish before the parent looks).
    code = ("import time\nimport colabfast.packing as p\nfrom colabfast.packing import archives, common\n"
            "common.CHUNK = 8\nsave, saved = archives.save_part, []\n"
            "def stalling(path, result):\n    saved.append(path)\n    if len(saved) == 4:\n        time.sleep(600)\n"
            "    save(path, result)\n"
            "archives.save_part = stalling\n"
            f"p.pack({str(archive)!r}, {str(dst)!r}, image_size=32, workers=1, progress=False)\n")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    log = tmp_path / ".m.h5.colabfast-pack" / "stream.jsonl"
    try:
        for _ in range(1200):
            if log.exists() and len(log.read_text().splitlines()) >= 4:  # the key and 3 parts
                break
            subprocess.run(["sleep", "0.05"])
    finally:
        child.kill()
        child.wait()
    done = len(log.read_text().splitlines()) - 1
    assert done == 3 and not dst.exists()
    real = archives._encode_chunk
    encoded = []
    monkeypatch.setattr(common, "CHUNK", 8)
    monkeypatch.setattr(archives, "_encode_chunk", lambda items, *a: (encoded.append(len(items)), real(items, *a))[1])
    pack(archive, dst, image_size=32, workers=0, progress=False)
    assert sum(encoded) <= 240 - 8 * done  # the finished parts were not decoded again
    mirror = H5ImageFolder(dst)
    assert len(mirror) == 240 and sorted(mirror.targets) == [c for c in range(4) for _ in range(60)]


def test_an_archive_larger_than_the_disk_on_drivefs_warns_about_its_cache(official, tmp_path, monkeypatch):
    monkeypatch.setattr(archives.env, "drive_kind", lambda path: "drivefs")
    monkeypatch.setattr(archives.env, "disk_free", lambda path: 1000)  # bytes: less than the archive
    with pytest.warns(UserWarning, match=r"refresh_drive\(\).*continues from the archive member"):
        with pytest.raises(OSError):  # and the mirror cannot be built in 1000 bytes either
            pack(official["train"], tmp_path / "m.h5", image_size=24, workers=0, progress=False)


def test_an_archive_out_of_order_is_read_in_imagefolders_order(tmp_path):
    """Issue 23 item 9: a zip of a/1, a/2, b/3, b/4 with its members written b/4, a/2, b/3, a/1 is
    stored in that order (one sequential stream), and index i of the mirror is ImageFolder's sample i
    of the extracted tree: through the dataset, a Subset, and the loader with shuffle=False, read by
    threads or by worker processes (the archive's order came out: targets [1, 0, 1, 0])."""
    import torch

    import colabfast as cf

    names = ["a/1.png", "a/2.png", "b/3.png", "b/4.png"]
    archive = tmp_path / "ab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name in ["b/4.png", "a/2.png", "b/3.png", "a/1.png"]:
            png = io.BytesIO()
            k = names.index(name)
            Image.new("RGB", (6, 5), (60 * k, 250 - 60 * k, 7 * k)).save(png, format="PNG")
            z.writestr(name, png.getvalue())
        z.extractall(tmp_path / "tree")
    ds = torchvision.datasets.ImageFolder(tmp_path / "tree")
    dst = pack(archive, tmp_path / "ab.h5", workers=0, progress=False)
    with h5py.File(dst, "r") as f:
        assert f["order"][:].tolist() == [3, 1, 2, 0] and f["targets"][:].tolist() == [1, 0, 1, 0]
    _equal_index_for_index(H5ImageFolder(dst), ds)
    mirror = H5ImageFolder(dst, output="tensor")
    expected = torch.stack([torch.from_numpy(np.array(ds[i][0])).permute(2, 0, 1) for i in range(4)])
    for workers in (None, 1):  # None: the loader's reader threads
        loader = cf.DataLoader(mirror, 4, num_workers=workers, device="cpu")
        assert (loader.plan.reader is not None) == (workers is None)
        ((images, targets),) = list(loader)
        assert targets.tolist() == [0, 0, 1, 1] and torch.equal(images, expected)
        subset = torch.utils.data.Subset(mirror, [3, 0, 2])
        ((images, targets),) = list(cf.DataLoader(subset, 3, num_workers=workers, device="cpu"))
        assert targets.tolist() == [1, 0, 1] and torch.equal(images, expected[[3, 0, 2]])


def test_a_fifo_as_the_devkit_is_refused_without_blocking(official, tmp_path):
    """Issue 23 item D: every file pack reads is checked to be a regular file without blocking."""
    import threading

    from colabfast.layouts.imagenet import read_devkit

    fifo = tmp_path / "ILSVRC2012_devkit_t12.tar.gz"
    os.mkfifo(fifo)
    errors: list = []
    thread = threading.Thread(target=lambda: errors.append(pytest.raises(OSError, read_devkit, fifo)), daemon=True)
    thread.start()
    thread.join(30)
    stuck = thread.is_alive()
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the code before the fix waits for a writer
    thread.join(10)
    assert not stuck and "not a regular file but a FIFO" in str(errors[0].value)
