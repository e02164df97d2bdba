"""colabfast.layouts.images: layout detection and the samples of an ImageFolder tree, a KITTI tree and a list
of files, in torchvision's order and with its labels, from small real trees."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from torchvision.datasets import Kitti
from torchvision.datasets.folder import IMG_EXTENSIONS as TORCHVISION_EXTENSIONS
from torchvision.datasets.folder import find_classes, make_dataset

from colabfast.layouts import detect_layout
from colabfast.layouts.images import IMG_EXTENSIONS, is_image, read_source
from colabfast.testing.data import encode, make_imagefolder, make_kitti, photo


def test_image_names_are_torchvisions_minus_hidden_ones():
    assert IMG_EXTENSIONS == TORCHVISION_EXTENSIONS
    for name in ("a.jpg", "cls/A.JPEG", "x/y/z.png", "b.Webp", "c.tiff", "d.pgm"):
        assert is_image(name), name
    for name in ("notes.txt", "a.jpg.txt", "Thumbs.db", "jpg", "cls/.DS_Store"):
        assert not is_image(name), name
    for name in ("._a.jpg", "cls/._a.JPEG", ".ipynb_checkpoints/a.jpg", "cls/.hidden/b.png"):
        assert not is_image(name), name


def test_detect_layout(tmp_path):
    kitti = make_kitti(tmp_path / "kitti", train=1, test=0, size=(40, 20))
    assert detect_layout(kitti).name == "kitti"
    make_kitti(tmp_path / "tv" / "Kitti" / "raw", train=0, test=1, size=(40, 20))
    assert detect_layout(tmp_path / "tv").name == "kitti"  # torchvision's root
    inet = make_imagefolder(tmp_path / "inet", classes=1, per_class=1, size=(16, 16))
    assert detect_layout(inet).name == "imagefolder"
    flat = tmp_path / "flat"
    (flat / ".ipynb_checkpoints").mkdir(parents=True)  # a hidden folder is no class
    (flat / "a.jpg").write_bytes(encode(photo(16, 16, np.random.default_rng(0))))
    assert detect_layout(flat).name == "files"


# --- ImageFolder ------------------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path) -> Path:
    """An ImageFolder tree with the odd files real ones hold (nested folders, PNGs, junk, hidden), and a
    file named after a nested folder: torchvision takes a folder's files before its sub-folders'."""
    root = make_imagefolder(tmp_path / "train", classes=3, per_class=3, size=(24, 16), odd_files=True)
    (root / "n01440764" / "z_last.jpg").write_bytes(encode(photo(16, 16, np.random.default_rng(0))))
    return root


def test_imagefolder_samples_are_torchvisions(tree, tmp_path):
    source = read_source(tree)
    assert source.layout == "imagefolder" and source.root == tree and len(source.splits) == 1
    split = source.splits[0]
    assert split.name == "" and split.root == tree and split.targets.dtype == np.int64
    # Hidden entries are the one place colabfast and torchvision differ (see is_image): move them
    # out of torchvision's sight.
    shutil.move(tree / ".ipynb_checkpoints", tmp_path / "checkpoints")
    for hidden in tree.rglob("._*"):
        hidden.unlink()
    classes, class_to_idx = find_classes(tree)
    want = make_dataset(tree, class_to_idx, extensions=IMG_EXTENSIONS)
    assert source.classes == classes
    assert [(f.rel, int(t)) for f, t in zip(split.files, split.targets)] == [
        (Path(p).relative_to(tree).as_posix(), t) for p, t in want]
    assert len(split.files) == 3 * 3 + 7 + 1  # the odd images count, the junk does not
    for f in split.files:
        st = (tree / f.rel).stat()
        assert (f.size, f.mtime_ns) == (st.st_size, st.st_mtime_ns)
    assert source.describe() == "imagefolder layout, 17 images in 3 classes"


def test_imagefolder_errors_name_the_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path / 'missing'} does not exist: check the path"):
        read_source(tmp_path / "missing")
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=f"no class folders in {flat}"):
        read_source(flat, layout="imagefolder")
    inet = make_imagefolder(tmp_path / "inet", classes=["cat", "dog"], per_class=1, size=(16, 16))
    (inet / "empty").mkdir()
    (inet / "empty" / "notes.txt").write_text("no images")
    with pytest.raises(FileNotFoundError, match=f"no images in the class folders empty under {inet}"):
        read_source(inet)
    with pytest.raises(ValueError, match="a layout of image folders .*'imagefolder'.*, not 'coco'"):
        read_source(inet, layout="coco")


def test_a_folder_read_as_files_is_every_image_unlabelled(tree):
    source = read_source(tree, layout="files")
    (split,) = source.splits
    assert source.classes is None and split.targets.tolist() == [-1] * 17
    assert [f.rel for f in split.files] == sorted(f.rel for f in split.files)
    assert all(is_image(f.rel) for f in split.files) and "n01440764/nested/n01440764_nested.jpeg" in {
        f.rel for f in split.files}
    assert source.describe() == "files layout, 17 images"
    empty = tree / "n01443537" / "nested-empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no image files"):
        read_source(empty, layout="files")


# --- a list of files --------------------------------------------------------------------------------


@pytest.fixture
def files(tmp_path) -> list[Path]:
    rng = np.random.default_rng(1)
    paths = [tmp_path / "a" / "1.jpg", tmp_path / "a" / "2.png", tmp_path / "b" / "c" / "3.jpg"]
    for p in paths:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(encode(photo(16, 12, rng)))
    return paths


def test_a_list_of_files_keeps_its_order_and_labels(files, tmp_path):
    plain = read_source(files)
    (split,) = plain.splits
    assert plain.layout == "files" and plain.root == tmp_path and plain.classes is None
    assert [f.rel for f in split.files] == ["a/1.jpg", "a/2.png", "b/c/3.jpg"]
    assert [f.size for f in split.files] == [p.stat().st_size for p in files]
    assert split.targets.tolist() == [-1, -1, -1]
    named = read_source([(files[0], "dog"), (str(files[1]), "cat"), (files[2], "dog")])
    assert named.classes == ["cat", "dog"] and named.splits[0].targets.tolist() == [1, 0, 1]
    numbered = read_source([(files[0], 7), (files[1], np.int64(2)), (files[2], 0)], layout="files")
    assert numbered.classes is None and numbered.splits[0].targets.tolist() == [7, 2, 0]
    assert read_source(files[1:2]).root == tmp_path / "a"


def test_a_list_of_files_refuses_what_it_cannot_label(files):
    with pytest.raises(ValueError, match="labels must be all ints, all strings, or absent"):
        read_source([(files[0], 1), (files[1], "cat")])
    with pytest.raises(ValueError, match="labels must be all ints, all strings, or absent"):
        read_source([files[0], (files[1], 1)])
    with pytest.raises(ValueError, match="layout='files', not 'imagefolder'"):
        read_source(files, layout="imagefolder")
    with pytest.raises(FileNotFoundError, match="empty list"):
        read_source([])
    with pytest.raises(FileNotFoundError):
        read_source([files[0].with_name("missing.jpg")])


# --- KITTI ------------------------------------------------------------------------------------------


@pytest.fixture
def kitti(tmp_path) -> Path:
    """torchvision's KITTI root: ``root/Kitti/raw/{training,testing}``."""
    make_kitti(tmp_path / "root" / "Kitti" / "raw", train=5, test=2, size=(64, 24))
    return tmp_path / "root"


def test_kitti_objects_are_torchvisions(kitti):
    source = read_source(kitti)
    base = kitti / "Kitti" / "raw"
    assert source.layout == "kitti" and source.root == base and source.classes is None
    training, testing = source.splits
    assert (training.name, testing.name) == ("training", "testing")
    assert [f.rel for f in training.files] == [f"training/image_2/{i:06d}.png" for i in range(5)]
    assert [f.rel for f in testing.files] == ["testing/image_2/000000.png", "testing/image_2/000001.png"]
    assert training.targets is None and testing.objects is None
    assert source.describe() == "kitti layout, 7 images (training 5, testing 2)"
    tv = Kitti(str(kitti), train=True)
    by_stem = {Path(p).stem: tv._parse_target(i) for i, p in enumerate(tv.images)}
    objects = training.objects
    assert objects.offsets[0] == 0 and objects.offsets[-1] == len(objects.type)
    assert objects.offsets[2] == objects.offsets[1]  # make_kitti's image 1 has no objects
    for n, f in enumerate(training.files):
        want = by_stem[Path(f.rel).stem]
        rows = range(objects.offsets[n], objects.offsets[n + 1])
        assert [objects.type[r] for r in rows] == [o["type"] for o in want]
        for key in ("truncated", "occluded", "alpha", "rotation_y"):
            assert getattr(objects, key)[list(rows)].tolist() == [o[key] for o in want], key
        for key in ("bbox", "dimensions", "location"):
            assert getattr(objects, key)[list(rows)].tolist() == [o[key] for o in want], key


def test_kitti_calibration_is_read_per_image(kitti):
    base = kitti / "Kitti" / "raw"
    (base / "testing" / "calib" / "000001.txt").unlink()
    training, testing = read_source(kitti).splits
    assert training.calib["P2"].shape == (5, 12) and training.calib["R0_rect"].shape == (5, 9)
    line = next(x for x in (base / "training" / "calib" / "000003.txt").read_text().splitlines() if x.startswith("P2:"))
    assert training.calib["P2"][3].tolist() == [float(v) for v in line.split()[1:]]
    assert not np.isnan(testing.calib["P0"][0]).any() and np.isnan(testing.calib["P0"][1]).all()


def test_kitti_label_errors_name_the_file(kitti):
    labels = kitti / "Kitti" / "raw" / "training" / "label_2"
    before = read_source(kitti).splits[0].objects
    text = (labels / "000003.txt").read_text()
    (labels / "000003.txt").write_text(text.replace("\n", "\n\n", 1) + "\n")  # blank lines hold no object
    assert read_source(kitti).splits[0].objects.type == before.type
    (labels / "000002.txt").write_text("Car 0.00 0 1.0 1 2 3\n")
    with pytest.raises(ValueError, match=r"000002\.txt: a KITTI label line has 15 fields, this one has 7: 'Car 0"):
        read_source(kitti)
    (labels / "000002.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"1 training images have no label file in .*, e\.g\. 000002\.txt"):
        read_source(kitti)
    with pytest.raises(FileNotFoundError, match="no KITTI layout under"):
        read_source(kitti / "Kitti", layout="kitti")


def test_kitti_without_calibration_has_none(kitti):
    for split in ("training", "testing"):
        shutil.rmtree(kitti / "Kitti" / "raw" / split / "calib")
    assert all(s.calib is None for s in read_source(kitti, layout="kitti").splits)
    nested = kitti / "Kitti" / "raw" / "training" / "image_2" / "extra" / "000009.png"
    nested.parent.mkdir()
    nested.write_bytes(b"")  # only image_2's own files are images
    os.remove(kitti / "Kitti" / "raw" / "training" / "image_2" / "000004.png")
    assert len(read_source(kitti).splits[0].files) == 4
