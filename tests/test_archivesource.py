"""colabfast.packing.archivesource.ArchiveSource on small real archives: layouts, images streamed in archive
order with their resume positions, inner per-class tars one level deep, resuming, refusals of unsafe
or broken archives, and torchvision's view of what was streamed."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from colabfast.packing import archivesource
from colabfast.packing.archivesource import ArchiveReadError, ArchiveSource, Position
from colabfast.staging.extract import UnsafeArchiveError
from colabfast.testing.data import encode, photo
from colabfast.testing.imagenet_archives import _tar_bytes, make_kaggle_zip, make_train_tar


def jpeg(seed: int) -> bytes:
    return encode(photo(8, 8, np.random.default_rng(seed)))


def tar_of(members: list, mode: str = "w") -> bytes:
    """A tar of ``(name, bytes)`` files, or of ``(name, tarfile type, linkname)`` links and devices."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode=mode, format=tarfile.GNU_FORMAT) as tar:
        for member in members:
            info = tarfile.TarInfo(member[0])
            if len(member) == 2:
                info.size = len(member[1])
                tar.addfile(info, io.BytesIO(member[1]))
            else:
                info.type, info.linkname = member[1], member[2]
                tar.addfile(info)
    return buf.getvalue()


def offsets(path: Path) -> dict[str, int]:
    """Each tar member's header offset, by name."""
    with tarfile.open(path) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def streamed(source: ArchiveSource, start: Position = Position(0, 0)) -> list[tuple[str, bytes, Position]]:  # noqa: B008
    return list(source.images(start))


FOLDER = [
    ("data/dog/2.jpg", jpeg(2)),
    ("data/cat/1.jpg", jpeg(1)),
    ("data/cat/notes.txt", b"not an image"),
    ("data/cat/._1.jpg", b"\x00\x05\x16\x07 AppleDouble"),
    ("data/cat/3.png", encode(photo(8, 8, np.random.default_rng(3)), "PNG")),
    ("data/cat/link.jpg", tarfile.SYMTYPE, "/etc/shadow"),
    ("data/cat/dev.jpg", tarfile.CHRTYPE, ""),
]


@pytest.mark.parametrize("suffix, mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tar.bz2", "w:bz2")])
def test_an_imagefolder_tar_streams_its_images_in_archive_order(tmp_path, suffix, mode):
    archive = tmp_path / f"folder{suffix}"
    archive.write_bytes(tar_of(FOLDER, mode))
    source = ArchiveSource(archive)
    assert source.layout == "imagefolder" and source.labels is None
    assert source.describe() == "an ImageFolder tree in an archive"
    at = offsets(archive)
    assert streamed(source) == [  # no text, hidden file, link or device: none is read
        ("data/dog/2.jpg", jpeg(2), Position(at["data/dog/2.jpg"], 1)),
        ("data/cat/1.jpg", jpeg(1), Position(at["data/cat/1.jpg"], 1)),
        ("data/cat/3.png", FOLDER[4][1], Position(at["data/cat/3.png"], 1)),
    ]
    paths, targets, classes, order = source.samples(["data/dog/2.jpg", "data/cat/1.jpg", "data/cat/3.png"])
    assert paths == ["cat/1.jpg", "cat/3.png", "dog/2.jpg"] and classes == ["cat", "dog"]
    assert targets.tolist() == [0, 0, 1] and targets.dtype == np.int64 and order.tolist() == [2, 0, 1]
    assert source.class_names(classes) is None


def test_a_stream_resumes_after_the_position_it_reached(tmp_path):
    for suffix, mode in ((".tar", "w"), (".tar.gz", "w:gz")):
        archive = tmp_path / f"folder{suffix}"
        archive.write_bytes(tar_of(FOLDER, mode))
        source = ArchiveSource(archive)
        full = streamed(source)
        assert streamed(source, full[0][2]) == full[1:] and streamed(source, full[-1][2]) == []


def test_bytes_read_are_reported_up_to_the_end(tmp_path):
    archive = tmp_path / "folder.tar"
    archive.write_bytes(tar_of(FOLDER))
    seen: list[int] = []
    list(ArchiveSource(archive).images(on_bytes=seen.append))
    assert seen == sorted(seen) and seen[-1] == archive.stat().st_size


def test_a_tar_of_per_class_tars_is_imagenets_training_archive(tmp_path):
    nested = tar_of([("deep.JPEG", jpeg(9))])
    outer = tmp_path / "train.tar"
    outer.write_bytes(tar_of([
        ("n01.tar", tar_of([("n01_b.JPEG", jpeg(1)), ("notes.txt", b"x"), ("n01_a.JPEG", jpeg(2)),
                            ("deeper.tar", nested)])),
        ("n02.tar", tar_of([("n02_a.JPEG", jpeg(3))])),
    ]))
    source = ArchiveSource(outer)
    assert source.layout == "imagenet-train"
    at = offsets(outer)
    full = streamed(source)
    assert full == [  # in each inner tar's order; a tar inside an inner tar is never opened
        ("n01/n01_b.JPEG", jpeg(1), Position(at["n01.tar"], 1)),
        ("n01/n01_a.JPEG", jpeg(2), Position(at["n01.tar"], 2)),
        ("n02/n02_a.JPEG", jpeg(3), Position(at["n02.tar"], 1)),
    ]
    assert streamed(source, Position(at["n01.tar"], 1)) == full[1:]  # into an inner tar
    assert streamed(source, Position(at["n01.tar"], 2)) == full[2:]
    paths, targets, classes, order = source.samples([name for name, _, _ in full])
    assert paths == ["n01/n01_a.JPEG", "n01/n01_b.JPEG", "n02/n02_a.JPEG"] and order.tolist() == [1, 0, 2]


def test_make_train_tar_reads_as_its_classes(tmp_path):
    source = ArchiveSource(make_train_tar(tmp_path / "ILSVRC2012_img_train.tar", classes=2, per_class=3,
                                          size=(16, 12)))
    names = [name for name, _, _ in source.images()]
    assert len(names) == 6 and {n.split("/")[0] for n in names} == {"n01440764", "n01443537"}
    assert source.samples(names)[2] == ["n01440764", "n01443537"]


def test_a_zip_streams_in_file_order_and_its_last_copy_of_a_name(tmp_path):
    archive = tmp_path / "folder.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("cat/1.jpg", jpeg(1))
        zf.writestr("cat/notes.txt", b"x")
        zf.writestr("dog/2.jpg", jpeg(2))
        with pytest.warns(UserWarning, match="Duplicate name"):
            zf.writestr("cat/1.jpg", jpeg(3))  # unzip keeps the last copy
    source = ArchiveSource(archive)
    assert source.layout == "imagefolder"
    full = streamed(source)
    assert full == [("dog/2.jpg", jpeg(2), Position(1, 0)), ("cat/1.jpg", jpeg(3), Position(2, 0))]
    assert streamed(source, Position(1, 0)) == full[1:]


def test_kaggles_zip_streams_the_split_asked_for(tmp_path):
    archive = make_kaggle_zip(tmp_path / "imagenet-object-localization-challenge.zip", classes=2,
                              train_per_class=2, val_per_class=2, size=(16, 12))
    train = ArchiveSource(archive)
    assert train.layout == "kaggle-train" and train.describe().startswith("Kaggle's ImageNet zip, train/")
    names = [name for name, _, _ in train.images()]
    assert sorted(names) == ["n01440764/n01440764_0.JPEG", "n01440764/n01440764_1.JPEG",
                             "n01443537/n01443537_0.JPEG", "n01443537/n01443537_1.JPEG"]
    assert train.class_names(["n01440764"]) == [("class n01440764", "764 thing")]
    val = ArchiveSource(archive, split="val")
    assert val.layout == "kaggle-val"
    names = [name for name, _, _ in val.images()]
    assert len(names) == 4 and all(n.startswith("ILSVRC2012_val_") for n in names)  # test/ is left out
    paths, targets, classes, _ = val.samples(names)
    assert classes == ["n01440764", "n01443537"] and sorted(targets.tolist()) == [0, 0, 1, 1]
    assert all(p.split("/")[0] == classes[t] for p, t in zip(paths, targets))


def test_archive_source_leaves_out_earlier_copies_of_a_tar_member(tmp_path):
    """Issue 15, case 13, the source's half: a tar is a stream, so the earlier copy of a repeated
    member is streamed too; superseded() names it once the stream has ended, and samples() leaves it
    out of torchvision's view (order -1) so that the last copy alone is a sample."""
    jpeg = io.BytesIO()
    Image.new("RGB", (8, 8)).save(jpeg, format="JPEG")
    archive = tmp_path / "a.tar"
    archive.write_bytes(_tar_bytes([("cat/1.jpg", b"first"), ("dog/2.jpg", jpeg.getvalue()),
                                    ("./cat/1.jpg", jpeg.getvalue())]))
    source = ArchiveSource(archive)
    names = [name for name, _, _ in source.images()]
    assert names == ["cat/1.jpg", "dog/2.jpg", "cat/1.jpg"] and source.superseded(names) == [0]
    paths, targets, classes, order = source.samples(names, skip=source.superseded(names))
    assert paths == ["cat/1.jpg", "dog/2.jpg"] and targets.tolist() == [0, 1] and order.tolist() == [-1, 1, 0]


# --- refusals ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("members", [
    [("cat/1.jpg", b"x"), ("../escape.jpg", b"x")],
    [("/etc/cron.d/x.jpg", b"x")],
    [("n01.tar", tar_of([("n01_1.JPEG", b"x"), ("../../escape.JPEG", b"x")]))],  # inside an inner tar
])
def test_unsafe_member_names_are_refused(tmp_path, members):
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_of(members))
    with pytest.raises(UnsafeArchiveError, match="escape|absolute"):
        list(ArchiveSource(archive).images())


def test_an_unsafe_zip_is_refused_before_streaming(tmp_path):
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("cat/1.jpg", b"x")
        zf.writestr("cat/../../escape.jpg", b"x")
    with pytest.raises(UnsafeArchiveError, match="escape"):
        ArchiveSource(archive)


def test_a_member_too_large_to_be_an_image_is_never_read(tmp_path, monkeypatch):
    monkeypatch.setattr(archivesource, "MAX_IMAGE", 100)
    tar = tmp_path / "a.tar"
    tar.write_bytes(tar_of([("cat/big.jpg", bytes(101)), ("cat/small.jpg", bytes(100))]))
    zip_ = tmp_path / "a.zip"
    with zipfile.ZipFile(zip_, "w") as zf:
        zf.writestr("cat/big.jpg", bytes(101))
        zf.writestr("cat/small.jpg", bytes(100))
    for archive in (tar, zip_):
        got = [(name, data) for name, data, _ in ArchiveSource(archive).images()]
        assert got == [("cat/big.jpg", "101 bytes: too large to be an image"), ("cat/small.jpg", bytes(100))]


def test_a_truncated_archive_names_the_member(tmp_path):
    whole = tar_of([("cat/1.jpg", jpeg(1)), ("dog/2.jpg", jpeg(2) * 3)])
    cut = tmp_path / "cut.tar"
    cut.write_bytes(whole[: offsets_in(whole)["dog/2.jpg"] + 1024])  # half-way through dog/2.jpg
    with pytest.raises(ArchiveReadError, match=r"cannot read member 'dog/2\.jpg'.*run pack\(\) again") as err:
        list(ArchiveSource(cut).images())
    assert err.value.archive == str(cut) and err.value.member == "dog/2.jpg"
    cut.write_bytes(whole[: offsets_in(whole)["dog/2.jpg"]])  # at a member boundary, without the end blocks
    with pytest.raises(ArchiveReadError, match="end-of-archive"):
        list(ArchiveSource(cut).images())


def offsets_in(data: bytes) -> dict[str, int]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: m.offset for m in tar.getmembers()}


def test_archives_that_do_not_fit_their_layout_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a file"):
        ArchiveSource(tmp_path / "missing.tar")
    tar = tmp_path / "a.tar"
    tar.write_bytes(tar_of(FOLDER))
    with pytest.raises(ValueError, match="layout 'kaggle-train' reads zip, and .*a.tar is a tar"):
        ArchiveSource(tar, layout="kaggle-train")
    with pytest.raises(ValueError, match="labels='.*ILSVRC2012_devkit_t12.tar.gz'"):
        ArchiveSource(tar, layout="imagenet-val")
    empty = tmp_path / "empty.tar"
    empty.write_bytes(tar_of([]))
    with pytest.raises(FileNotFoundError, match="holds no files"):
        ArchiveSource(empty)
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"not a tar at all" * 64)
    with pytest.raises(ArchiveReadError, match="the first member"):
        ArchiveSource(junk)
    zip_ = tmp_path / "a.zip"
    with zipfile.ZipFile(zip_, "w") as zf:
        zf.writestr("cat/1.jpg", jpeg(1))
    with pytest.raises(ValueError, match="layout 'imagenet-train' reads tar, and .*a.zip is a zip"):
        ArchiveSource(zip_, layout="imagenet-train")
    with pytest.raises(ValueError, match="split='val' only applies to Kaggle's zip"):
        ArchiveSource(zip_, layout="imagefolder", split="val")
    with pytest.raises(FileNotFoundError, match="not Kaggle's ImageNet zip"):
        ArchiveSource(zip_, layout="kaggle-train")
    no_images = tmp_path / "b.zip"
    with zipfile.ZipFile(no_images, "w") as zf:
        zf.writestr("notes.txt", b"x")
    with pytest.raises(FileNotFoundError, match="no images under the top of"):
        ArchiveSource(no_images)
    (tmp_path / "bad.zip").write_bytes(b"PK not really")
    with pytest.raises(ArchiveReadError, match="central directory"):
        ArchiveSource(tmp_path / "bad.zip")


def test_an_image_outside_a_class_folder_is_named(tmp_path):
    archive = tmp_path / "a.tar"
    archive.write_bytes(tar_of([("cat/1.jpg", jpeg(1)), ("stray.jpg", jpeg(2))]))
    source = ArchiveSource(archive)
    names = [name for name, _, _ in source.images()]
    with pytest.raises(FileNotFoundError, match="'stray.jpg' is not in a class folder"):
        source.samples(names)
    with pytest.raises(FileNotFoundError, match="no images in"):
        source.samples([])
