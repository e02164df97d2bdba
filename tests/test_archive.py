"""Safe archive extraction, through colabfast.stage: formats, resume, hostile entries."""

from __future__ import annotations

import io
import os
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import assert_same_tree

from colabfast import stage
from colabfast.archive import UnsafeArchiveError, extract, extracted_size, strip_archive_suffix
from colabfast.testing.data import make_files


@pytest.fixture
def tree(tmp_path) -> Path:
    return make_files(tmp_path / "kitti", 40, 10_000, per_folder=10, seed=2)


def _tar(path: Path, tree: Path, mode: str) -> Path:
    with tarfile.open(path, mode) as t:
        t.add(tree, arcname=tree.name)
    return path


def _zip(path: Path, tree: Path) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p in sorted(tree.rglob("*")):
            z.write(p, p.relative_to(tree.parent).as_posix())
    return path


@pytest.mark.parametrize("suffix,mode", [(".tar", "w"), (".tar.gz", "w:gz"), (".tgz", "w:gz"),
                                         (".tar.bz2", "w:bz2"), (".tar.xz", "w:xz"), (".zip", None)])
def test_archives_extract_identically(tree, tmp_path, suffix, mode):
    archive = tmp_path / f"kitti{suffix}"
    _zip(archive, tree) if mode is None else _tar(archive, tree, mode)
    out = stage(archive, tmp_path / "out", progress=False)
    assert out == tmp_path / "out" / "kitti"  # a single top-level folder is returned
    assert_same_tree(tree, out)
    again = stage(archive, tmp_path / "out", progress=False)  # unchanged archive: nothing to do
    assert again == out


def test_default_name_drops_suffix():
    assert strip_archive_suffix("kitti.tar.gz") == "kitti"
    assert strip_archive_suffix("imagenet.ZIP") == "imagenet"
    assert strip_archive_suffix("notes.txt") == "notes.txt"


def test_extracted_size(tree, tmp_path):
    data = sum(p.stat().st_size for p in tree.rglob("*.bin"))
    assert extracted_size(_zip(tmp_path / "a.zip", tree)) == data
    assert extracted_size(_tar(tmp_path / "a.tar.gz", tree, "w:gz")) >= data  # tar headers add a little


def test_resume_skips_entries_already_extracted(tree, tmp_path):
    archive = _tar(tmp_path / "k.tar", tree, "w")
    extract(archive, tmp_path / "out")
    kept = tmp_path / "out" / "kitti" / "d0000" / "f000001.bin"
    ino = kept.stat().st_ino
    (tmp_path / "out" / "kitti" / "d0001" / "f000012.bin").unlink()
    extract(archive, tmp_path / "out")
    assert kept.stat().st_ino == ino
    assert_same_tree(tree, tmp_path / "out" / "kitti")


def test_changed_archive_is_restaged(tree, tmp_path):
    archive = _tar(tmp_path / "k.tar", tree, "w")
    out = stage(archive, tmp_path / "out", progress=False)
    (tree / "d0000" / "f000000.bin").write_bytes(b"v2")
    os.utime(archive, ns=(0, 0))
    _tar(archive, tree, "w")
    out = stage(archive, tmp_path / "out", progress=False)
    assert (out / "d0000" / "f000000.bin").read_bytes() == b"v2"


def test_refuses_foreign_destination(tree, tmp_path):
    archive = _tar(tmp_path / "k.tar", tree, "w")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "mine.txt").write_text("user data")
    with pytest.raises(ValueError, match="was not staged"):
        stage(archive, tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "mine.txt").read_text() == "user data"


def _member(name: str, data: bytes | None = None, **attrs) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if data is not None else 0
    for k, v in attrs.items():
        setattr(info, k, v)
    return info, data


HOSTILE_TARS = {
    "zip-slip": [_member("ok.txt", b"ok"), _member("../evil.txt", b"evil")],
    "absolute path": [_member("{outside}/evil.txt", b"evil")],
    "symlink escape": [_member("link", type=tarfile.SYMTYPE, linkname="{outside}"),
                       _member("link/evil.txt", b"evil")],
    "relative symlink escape": [_member("up", type=tarfile.SYMTYPE, linkname="../..")],
    "hard link escape": [_member("hard", type=tarfile.LNKTYPE, linkname="{outside}/victim.txt")],
    "device entry": [_member("null", type=tarfile.CHRTYPE, devmajor=1, devminor=3)],
    "fifo": [_member("pipe", type=tarfile.FIFOTYPE)],
}


@pytest.mark.parametrize("kind", sorted(HOSTILE_TARS))
def test_hostile_tar_is_refused(kind, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim.txt").write_text("precious")
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        for info, data in HOSTILE_TARS[kind]:
            info = _member(info.name.format(outside=outside))[0] if "{outside}" in info.name else info
            if "{outside}" in info.linkname:
                info.linkname = info.linkname.format(outside=outside)
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    dst = tmp_path / "area" / "dst"
    with pytest.raises(UnsafeArchiveError) as err:
        stage(archive, dst, progress=False)
    assert "evil.tar.gz" in str(err.value)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]
    assert (outside / "victim.txt").read_text() == "precious"
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "area" / "evil.txt").exists()
    assert not dst.exists()
    assert [p.name for p in (tmp_path / "area").iterdir()] == [".dst.colabfast-stage.lock"]


def _zip_with(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for info, data in entries:
            z.writestr(info, data)
    return path


def _unix(name: str, mode: int) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = mode << 16
    return info


@pytest.mark.parametrize("kind", ["zip-slip", "absolute path", "windows drive", "symlink escape", "device"])
def test_hostile_zip_is_refused_before_writing(kind, tmp_path):
    entries = {
        "zip-slip": [("ok.txt", b"ok"), ("../evil.txt", b"evil")],
        "absolute path": [("ok.txt", b"ok"), (str(tmp_path / "evil.txt"), b"evil")],
        "windows drive": [("ok.txt", b"ok"), ("C:\\evil.txt", b"evil")],
        "symlink escape": [("ok.txt", b"ok"), (_unix("link", 0o120777), str(tmp_path).encode())],
        "device": [("ok.txt", b"ok"), (_unix("null", 0o020666), b"")],
    }[kind]
    archive = _zip_with(tmp_path / "evil.zip", entries)
    with pytest.raises(UnsafeArchiveError):
        stage(archive, tmp_path / "dst", progress=False)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "dst").exists()


def test_links_inside_the_archive_are_kept(tmp_path):
    archive = tmp_path / "ok.tar"
    with tarfile.open(archive, "w") as t:
        for info, data in [_member("a/real.txt", b"data"),
                           _member("a/alias.txt", type=tarfile.SYMTYPE, linkname="real.txt")]:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    out = stage(archive, tmp_path / "dst", progress=False)
    assert (out / "alias.txt").is_symlink() and (out / "alias.txt").read_bytes() == b"data"


def test_several_archives_make_one_folder(tmp_path):
    """KITTI ships images, labels and calibration as three zips that unpack into one tree."""
    from colabfast.testing.data import make_kitti

    kitti = make_kitti(tmp_path / "kitti", train=3, test=2, size=(60, 20))
    zips = []
    for part, folders in {"image_2": ["training/image_2", "testing/image_2"], "label_2": ["training/label_2"],
                          "calib": ["training/calib", "testing/calib"]}.items():
        path = tmp_path / f"data_object_{part}.zip"
        with zipfile.ZipFile(path, "w") as z:
            for folder in folders:
                for p in sorted((kitti / folder).iterdir()):
                    z.write(p, p.relative_to(kitti).as_posix())
        zips.append(path)
    out = stage(zips, tmp_path / "staged", progress=False)
    assert out == tmp_path / "staged"
    assert_same_tree(kitti, out)
    assert stage(zips, tmp_path / "staged", progress=False) == out  # unchanged: nothing to do
    with pytest.raises(ValueError, match="must be archives"):
        stage([zips[0], kitti], tmp_path / "x", progress=False)
