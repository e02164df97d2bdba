"""Safe archive extraction, through colabfast.stage: formats, resume, hostile entries."""

from __future__ import annotations

import errno
import gzip
import io
import os
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
from conftest import assert_same_tree

from colabfast import stage
from colabfast.staging.extract import (
    UnsafeArchiveError,
    check_tar_member,
    extract,
    extracted_size,
    strip_archive_suffix,
)
from colabfast.testing.data import make_files


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))  # stage locks go there


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
    """The classic tar escapes (issue 14, writes outside dst), one per case: zip-slip ('../evil.txt'),
    an absolute name, a symlink to an outside folder then a file written through it, a relative
    symlink climbing out ('../..'), a hard link to an outside file, a character device (/dev/null's
    1:3) and a FIFO. Each is refused naming the archive; nothing outside is created or changed, and
    stage() leaves neither dst nor a partial extraction beside it."""
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
    assert list((tmp_path / "area").iterdir()) == []  # no partial extraction, no state beside dst


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
    """The zip escapes (issue 14, writes outside dst), each after a harmless 'ok.txt': zip-slip
    ('../evil.txt'), an absolute name, a Windows drive name ('C:\\evil.txt'), a Unix symlink entry
    to an outside folder, and a character device entry. A zip's directory is checked whole before
    anything is written, so not even 'ok.txt' lands: dst is never created."""
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


def _tar_with(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as t:
        for info, data in members:
            t.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def test_links_are_refused_unless_allowed(tmp_path):
    """Datasets need no links: by default an archive with one is refused, naming the entry;
    allow_links=True extracts links that stay inside the destination."""
    archive = _tar_with(tmp_path / "ok.tar", [
        _member("a/real.txt", b"data"),
        _member("a/alias.txt", type=tarfile.SYMTYPE, linkname="real.txt"),
        _member("a/hard.txt", type=tarfile.LNKTYPE, linkname="a/real.txt"),
    ])
    with pytest.raises(UnsafeArchiveError, match=r"'a/alias.txt' is a symbolic link .*allow_links=True"):
        stage(archive, tmp_path / "dst", progress=False)
    assert not (tmp_path / "dst").exists()
    out = stage(archive, tmp_path / "dst", allow_links=True, progress=False)
    assert (out / "alias.txt").is_symlink() and (out / "alias.txt").read_bytes() == b"data"
    assert (out / "hard.txt").stat().st_ino == (out / "real.txt").stat().st_ino


def _zip_link(z: zipfile.ZipFile, name: str, target: str) -> None:
    z.writestr(_unix(name, 0o120777), target)


@pytest.mark.parametrize("allow_links", [False, True])
def test_zip_symlink_chain_cannot_write_outside(tmp_path, allow_links):
    """Issue 14, attack 1 (zip symlink chain): 'up' -> a/b/c/d/../../../.. is inside dst when it is
    made, then a, b, c, d -> '.' make it lead four levels up, and 'up/pwned.txt' is written through it.
    Refused: links by default; with allow_links, the write through the link 'up'."""
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        _zip_link(z, "up", "a/b/c/d/../../../..")
        for name in "abcd":
            _zip_link(z, name, ".")
        z.writestr(_unix("up/pwned.txt", 0o100644), "x")
    dst = tmp_path / "l1" / "l2" / "l3" / "x" / "out"
    refused = "'up' is a symbolic link" if not allow_links else \
        r"'up/pwned.txt' goes through 'up', which is a link \(to 'a/b/c/d/../../../..'"
    with pytest.raises(UnsafeArchiveError, match=refused):
        stage(archive, dst, allow_links=allow_links, progress=False)
    assert not [p for p in tmp_path.rglob("pwned.txt")]
    assert not dst.exists() and not [p for p in tmp_path.rglob("*") if p.is_symlink()]


def _chain_zip(path: Path, write_through: bool) -> Path:
    """Issue 14, attack 1's archive: 'up' -> a/b/c/d/../../../.., then a, b, c, d -> '.'."""
    with zipfile.ZipFile(path, "w") as z:
        _zip_link(z, "up", "a/b/c/d/../../../..")
        for name in "abcd":
            _zip_link(z, name, ".")
        if write_through:
            z.writestr(_unix("up/pwned.txt", 0o100644), "x")
    return path


@pytest.mark.parametrize("write_through", [True, False])
def test_failed_extract_leaves_no_link_leading_outside(tmp_path, write_through):
    """Issue 14, attack 1 against extract() itself (no stage() to remove its work folder): with
    allow_links, 'up' leads four levels up once a, b, c, d -> '.' exist. The write of 'up/pwned.txt'
    through it is refused naming that entry, or (with no write) the final check of every link
    refuses 'up'; either way the links the failed extraction made are removed, so nothing left in
    dst leads outside."""
    dst = tmp_path / "l1" / "l2" / "l3" / "x" / "out"
    archive = _chain_zip(tmp_path / "evil.zip", write_through)
    refused = r"'up/pwned.txt' goes through 'up', which is a link" if write_through else \
        r"'up' is a link to 'a/b/c/d/../../../..', which with the links after it leads outside"
    with pytest.raises(UnsafeArchiveError, match=refused):
        extract(archive, dst, allow_links=True)
    assert not list(tmp_path.rglob("pwned.txt"))
    assert dst.is_dir() and not [p for p in dst.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize("link", ["symbolic", "hard"])
def test_link_over_a_folder_is_refused_without_a_partial(tmp_path, link):
    """A link entry named like a folder extracted before it ('d/' with 'd/x.txt', then 'd' -> '.'):
    a link never replaces a folder, so this is refused naming the entry (not a bare
    IsADirectoryError), and stage() leaves neither dst nor its partial extraction beside it."""
    over = _member("d", type=tarfile.SYMTYPE, linkname=".") if link == "symbolic" else \
        _member("d", type=tarfile.LNKTYPE, linkname="real.txt")
    archive = _tar_with(tmp_path / "odd.tar", [_member("real.txt", b"data"), _member("d", type=tarfile.DIRTYPE),
                                               _member("d/x.txt", b"x"), over])
    (tmp_path / "area").mkdir()
    with pytest.raises(UnsafeArchiveError, match="'d' is a link, but the archive also has a folder of that name"):
        stage(archive, tmp_path / "area" / "dst", allow_links=True, progress=False)
    assert list((tmp_path / "area").iterdir()) == []
    with pytest.raises(UnsafeArchiveError, match="'d' is a link"):
        extract(archive, tmp_path / "direct", allow_links=True)
    assert (tmp_path / "direct" / "d" / "x.txt").read_bytes() == b"x"  # the folder is left as it was


def test_link_made_to_lead_outside_by_later_links_is_refused(tmp_path):
    """Issue 14, attack 1 without the write: with allow_links, a link that was inside when made but
    leads outside once the later links exist is caught when every link is resolved again at the end."""
    archive = tmp_path / "evil.zip"
    with zipfile.ZipFile(archive, "w") as z:
        _zip_link(z, "up", "a/b/../..")
        _zip_link(z, "a", ".")
        _zip_link(z, "b", ".")
    with pytest.raises(UnsafeArchiveError, match="'up' is a link to 'a/b/../..', which with the links after it"):
        stage(archive, tmp_path / "dst", allow_links=True, progress=False)
    assert not (tmp_path / "dst").exists() and not [p for p in tmp_path.rglob("*") if p.is_symlink()]


@pytest.mark.parametrize("allow_links", [False, True])
def test_tar_realpath_limit_attack(tmp_path, allow_links):
    """Issue 14, attack 2: CVE-2025-4517, the realpath-limit attack on tarfile's 'data' filter
    (CPython's test_realpath_limit_attack). Links to long folder names make the expanded path pass
    PATH_MAX, where os.path.realpath stops resolving; a link through them then leads out, and a hard
    link and a file are written through it. Python 3.11.7 lacks the fix."""
    dst = tmp_path / "area" / "dst"
    (tmp_path / "area").mkdir()
    flag = tmp_path / "area" / "flag"
    flag.write_text("precious")
    steps = "abcdefghijklmnop"
    work = tmp_path / "area" / ".dst.colabfast-partial"  # where stage() extracts before renaming
    component = "d" * ((os.pathconf(tmp_path, "PC_PATH_MAX") - len(str(work)) - 1) // (len(steps) + 1))
    members, path = [], ""
    for step in steps:
        members.append(_member(os.path.join(path, component), type=tarfile.DIRTYPE, mode=0o777))
        members.append(_member(os.path.join(path, step), type=tarfile.SYMTYPE, linkname=component))
        path = os.path.join(path, component)
    linkpath = os.path.join(*steps, "l" * 254)
    members += [
        _member(linkpath, type=tarfile.SYMTYPE, linkname=os.path.join(*[".."] * len(steps))),
        _member("escape", type=tarfile.SYMTYPE, linkname=os.path.join(linkpath, "..")),
        _member("flaglink", type=tarfile.LNKTYPE, linkname=os.path.join("escape", "flag")),
        _member("flaglink", b"overwrite"),
        _member("escape/newfile", b"new"),
    ]
    archive = _tar_with(tmp_path / "evil.tar", members)
    # Refused at the first link by default; with links allowed, where an entry's path would be
    # followed through one (writes never traverse links), long before 'escape' is reached.
    refusal = r"entry 'a/b/c/.*' goes through 'a', which is a link" if allow_links else r"entry 'a' is a symbolic link"
    with pytest.raises(UnsafeArchiveError, match=refusal):
        stage(archive, dst, allow_links=allow_links, progress=False)
    assert flag.read_text() == "precious"
    assert sorted(p.name for p in (tmp_path / "area").iterdir()) == ["flag"]


class _Zeros(io.RawIOBase):
    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        memoryview(buffer).cast("B")[:] = bytes(len(buffer))
        return len(buffer)


@pytest.mark.parametrize("small_tmpfs", ["8m"], indirect=True)
@pytest.mark.parametrize("kind", ["bz2, one huge entry", "bz2, many entries", "gz, forged size"])
def test_decompression_bomb_stops_before_the_disk_fills(tmp_path, small_tmpfs, kind):
    """Issue 14, attack 7 (decompression bomb): a .tar.bz2 of a few hundred bytes, or a .tar.gz of a
    few tens of kB whose gzip size trailer (ISIZE) is forged to its own size, holding 40 MiB of
    zeros, staged to an 8 MiB tmpfs. bz2 records no size and the forged trailer lies, so the
    preflight passes; the bytes are counted as extracted and the stage stops with a clear ENOSPC,
    leaving nothing."""
    sizes = [1 << 20] * 40 if kind == "bz2, many entries" else [40 << 20]
    suffix = ".tar.gz" if kind.startswith("gz") else ".tar.bz2"
    archive = tmp_path / f"bomb{suffix}"
    with tarfile.open(archive, "w:gz" if suffix == ".tar.gz" else "w:bz2") as t:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"bomb/{i:03d}.bin")
            info.size = size
            t.addfile(info, io.BufferedReader(_Zeros()))
    if suffix == ".tar.gz":
        with open(archive, "r+b") as f:  # the trailer's last 4 bytes: the size, modulo 2**32
            f.seek(-4, io.SEEK_END)
            f.write(archive.stat().st_size.to_bytes(4, "little"))
        assert extracted_size(archive) == archive.stat().st_size  # the forged size fools the estimate
    assert archive.stat().st_size < 100_000
    with pytest.raises(OSError) as err:
        stage(archive, small_tmpfs / "out", progress=False)
    assert err.value.errno == errno.ENOSPC
    assert f"bomb{suffix} does not fit" in str(err.value) and "decompression bomb" in str(err.value)
    assert list(small_tmpfs.iterdir()) == []  # the partial extraction is gone
    free = os.statvfs(small_tmpfs)
    assert free.f_bfree == free.f_blocks


def test_zip_entries_without_type_bits_are_files(tmp_path):
    """Issue 15, case 9: zipfile.writestr(name, data) stores mode 0o600 with no file-type bits."""
    archive = _zip_with(tmp_path / "plain.zip", [("data/a.txt", b"alpha"), ("data/b.txt", b"beta")])
    out = stage(archive, tmp_path / "dst", progress=False)
    assert (out / "a.txt").read_bytes() == b"alpha" and (out / "b.txt").read_bytes() == b"beta"


def test_duplicate_entries_last_wins(tmp_path):
    """Issue 15, case 13: an entry repeated in an archive ends as its last copy, as with tar and
    unzip (same size and time, so a resume check must not skip the second)."""
    first, last = _member("d/x.txt", b"first", mtime=1_700_000_000), _member("d/x.txt", b"later", mtime=1_700_000_000)
    out = stage(_tar_with(tmp_path / "dup.tar", [first, last]), tmp_path / "t", progress=False)
    assert (out / "x.txt").read_bytes() == b"later"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name
        archive = _zip_with(tmp_path / "dup.zip", [("d/x.txt", b"first"), ("d/x.txt", b"later")])
    out = stage(archive, tmp_path / "z", progress=False)
    assert (out / "x.txt").read_bytes() == b"later"


def test_backslashes_in_zip_names_follow_unzip(tmp_path):
    """Issue 15, case 13: Info-ZIP unzip reads backslashes as separators only in names made on
    MS-DOS (host 0) with no '/'; elsewhere a backslash is part of the file name."""
    dos = zipfile.ZipInfo("dir\\c.txt")
    dos.create_system = 0
    archive = _zip_with(tmp_path / "bs.zip", [(_unix("a\\b.txt", 0o100644), b"unix"), (dos, b"dos")])
    out = stage(archive, tmp_path / "dst", progress=False)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
                  and ".colabfast-" not in p.name) == ["a\\b.txt", "dir/c.txt"]
    evil = zipfile.ZipInfo("..\\evil.txt")
    evil.create_system = 0
    with pytest.raises(UnsafeArchiveError, match="outside"):
        stage(_zip_with(tmp_path / "evil.zip", [(evil, b"x")]), tmp_path / "dst2", progress=False)
    assert not (tmp_path / "evil.txt").exists()


def test_check_tar_member_names_the_safe_path(tmp_path):
    assert check_tar_member("a.tar", _member("./train/n01/x.JPEG", b"")[0]) == "train/n01/x.JPEG"
    with pytest.raises(UnsafeArchiveError, match="'..'"):
        check_tar_member("a.tar", _member("train/../../x", b"")[0])
    with pytest.raises(UnsafeArchiveError, match="link"):
        check_tar_member("a.tar", _member("l", type=tarfile.SYMTYPE, linkname="x")[0])


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


def _declared_record(kind: bytes, declared: int, actual: bytes) -> bytes:
    """A tar header record (GNU long name "L", pax "x", ...) whose header declares ``declared`` bytes
    while ``actual`` follow: what a 1 MB gzip declaring a 1 GiB name amounts to, without the GiB."""
    info = tarfile.TarInfo("././@LongLink")
    info.type, info.size = kind, declared
    head = info.tobuf(tarfile.GNU_FORMAT)
    return head + actual + b"\0" * (-len(actual) % 512)


def _header_bomb(path: Path, kind: str) -> Path:
    if kind == "huge pax path":  # real bytes: a 2 MB pax 'path' record (tarfile writes it whole)
        with tarfile.open(path, "w:gz", format=tarfile.PAX_FORMAT) as t:
            t.addfile(_member("x" * (2 << 20), b"data")[0], io.BytesIO(b"data"))
        return path
    if kind == "huge GNU long name":
        with tarfile.open(path, "w:gz", format=tarfile.GNU_FORMAT) as t:
            t.addfile(_member("y" * (2 << 20), b"data")[0], io.BytesIO(b"data"))
        return path
    record = {"declared 1 GiB long name": tarfile.GNUTYPE_LONGNAME, "declared 1 GiB pax header": tarfile.XHDTYPE,
              "declared 1 GiB long link": tarfile.GNUTYPE_LONGLINK}
    if kind in record:
        body = _declared_record(record[kind], 1 << 30, b"x" * 4096)
    else:  # "chained headers": a pax header before a pax header before ...
        body = b"".join(_declared_record(tarfile.XHDTYPE, 11, b"11 a=bcdef\n") for _ in range(5000))
    info, data = _member("a/f.txt", b"data")
    body += info.tobuf(tarfile.GNU_FORMAT) + data + b"\0" * 508 + b"\0" * 1024
    path.write_bytes(gzip.compress(body))
    return path


@pytest.mark.parametrize("kind", ["huge pax path", "huge GNU long name", "declared 1 GiB long name",
                                  "declared 1 GiB pax header", "declared 1 GiB long link", "chained headers"])
@pytest.mark.parametrize("reader", ["stage", "pack"])
def test_tar_header_bombs_are_refused_before_reading(tmp_path, kind, reader):
    """Issue 23 item 4: tarfile reads a pax or GNU long-name record whole, whatever size its header
    declares (a 1 MB tar.gz declaring a 1 GiB name took 6.2 GB of RAM, and pack then said "no images").
    Records are bounded before they are read, by stage and by pack's archive streams alike: an
    UnsafeArchiveError naming the archive, with the name quoted cut short, and nothing left at dst."""
    from colabfast.packing.archivesource import ArchiveSource

    archive = _header_bomb(tmp_path / "bomb.tar.gz", kind)
    with pytest.raises(UnsafeArchiveError) as err:
        if reader == "stage":
            stage(archive, tmp_path / "dst", progress=False)
        else:
            list(ArchiveSource(archive).images())
    assert "bomb.tar.gz" in str(err.value)
    assert len(str(err.value)) < 1000
    assert not (tmp_path / "dst").exists()
    assert {p.name for p in tmp_path.iterdir()} <= {"bomb.tar.gz", "cache"}  # no partial extraction either


def test_zip_link_with_a_huge_target_is_refused_before_reading(tmp_path):
    """Issue 23 item 4: a zip symlink's target is its data, read whole (a 1 GiB target took 4.1 GB with
    allow_links=True): its declared size is checked first."""
    archive = _zip_with(tmp_path / "bomb.zip", [("ok.txt", b"ok"), (_unix("link", 0o120777), b"a/" * 5000)])
    with pytest.raises(UnsafeArchiveError, match="bomb.zip.*'link' is a link to a target of 10000 bytes"):
        stage(archive, tmp_path / "dst", progress=False, allow_links=True)
    assert not (tmp_path / "dst").exists()


def test_error_messages_quote_long_names_cut_short(tmp_path):
    err = UnsafeArchiveError(tmp_path / "a.tar", "z" * 100_000, "is odd")
    assert len(str(err)) < 600 and f"'{'z' * 200}...'" in str(err)
    assert err.member == "z" * 100_000


def test_links_an_interrupted_run_left_are_checked_again(tmp_path):
    """Issue 23 item B: a run killed right after making 'up -> a/b/c/d/../../../..' (inside: a..d do
    not exist yet), then an archive that makes 'a'..'d' -> '.': each new link is harmless alone, but
    'up' now leads four levels above dst. Every link in dst is resolved at the end of every run, and
    the one leading outside is refused and removed."""
    first = _tar_with(tmp_path / "first.tar", [_member("up", type=tarfile.SYMTYPE, linkname="a/b/c/d/../../../..")])
    extract(first, tmp_path / "dst", allow_links=True)
    second = _tar_with(tmp_path / "second.tar",
                       [_member(n, type=tarfile.SYMTYPE, linkname=".") for n in "abcd"])
    with pytest.raises(UnsafeArchiveError, match="'up' is a link to 'a/b/c/d/../../../..', which with the links"):
        extract(second, tmp_path / "dst", allow_links=True)
    assert not [p for p in (tmp_path / "dst").rglob("*") if p.is_symlink()]
    extract(first, tmp_path / "again", allow_links=True)
    with pytest.raises(UnsafeArchiveError, match="'up' is a link .* left by an earlier extraction"):
        extract(_tar_with(tmp_path / "plain.tar", [_member("f.txt", b"x")]), tmp_path / "again")
