"""colabfast.ramdisk: tmpfs mounts (root, as in Colab), growth, refusals, staging into RAM."""

from __future__ import annotations

import os
import subprocess

import pytest
from conftest import assert_same_tree

from colabfast import RamDisk, cli, ramdisk, stage
from colabfast.testing.data import make_files
from colabfast.where import env
from colabfast.where.tmpfs import default_path, parse_size, release_ramdisk


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))  # stage locks and records go there

@pytest.fixture
def unmount_after():
    mounted = []
    yield mounted
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


def _size(path) -> int:
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize


def test_parse_size():
    assert parse_size(123) == 123
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5g") == int(1.5 * (1 << 30))
    assert parse_size("8GiB") == 8 << 30
    with pytest.raises(ValueError, match="size"):
        parse_size("lots")


def test_mounts_grows_and_reuses(tmp_path, unmount_after):
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    path = tmp_path / "ram"
    assert ramdisk("16M", path) == path
    unmount_after.append(path)
    assert env.is_ram(path) and os.path.ismount(path)
    assert _size(path) == 16 << 20
    (path / "keep.txt").write_text("still here")
    assert ramdisk("32M", path) == path  # grows in place, keeping what is stored
    assert _size(path) == 32 << 20
    assert (path / "keep.txt").read_text() == "still here"
    assert ramdisk("8M", path) == path and _size(path) == 32 << 20  # never shrinks under data


def test_refuses_sizes_that_starve_the_machine(tmp_path):
    too_big = env.ram_available() - env.ram_headroom() + (1 << 30)
    with pytest.raises(ValueError, match=r"would starve this machine: .* GB of RAM is free .* keeps .* GB"):
        ramdisk(too_big, tmp_path / "ram")
    assert not os.path.ismount(tmp_path / "ram")


def test_refuses_non_empty_folder(tmp_path):
    (tmp_path / "ram").mkdir()
    (tmp_path / "ram" / "file").write_text("x")
    with pytest.raises(ValueError, match="not empty"):
        ramdisk("16M", tmp_path / "ram")


def test_stage_to_ram(tmp_path, unmount_after):
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    src = make_files(tmp_path / "data", 20, 10_000, per_folder=5)
    out = stage(src, to="ram", progress=False)
    unmount_after.append(default_path())
    assert out == default_path() / "data" and env.is_ram(out)
    assert_same_tree(src, out)
    again = stage(src, progress=False)  # to="auto" finds the copy already in RAM
    assert again == out


def test_release_gives_the_ram_back(tmp_path, unmount_after, capsys):
    """A RAM disk colabfast mounts stays until released: RamDisk.release(), a with block, or the CLI."""
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    path = tmp_path / "ram"
    rd = ramdisk("16M", path)
    unmount_after.append(path)
    assert isinstance(rd, RamDisk) and rd.path == path and os.fspath(rd) == str(path)
    (rd / "x.bin").write_bytes(b"x" * 1000)
    rd.release()
    assert not os.path.ismount(path) and not path.exists()
    assert release_ramdisk(path) is False  # nothing left to release
    with ramdisk("16M", path) as rd:
        assert os.path.ismount(rd)
    assert not os.path.ismount(path)
    ramdisk("16M", path)
    assert cli.main(["ramdisk", "--release", "--path", str(path)]) == 0
    assert "released" in capsys.readouterr().out and not os.path.ismount(path)


def test_release_leaves_other_tmpfs_alone(tmp_path, unmount_after):
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    path = tmp_path / "theirs"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)], check=True)
    unmount_after.append(path)
    with pytest.raises(ValueError, match="did not mount"):
        release_ramdisk(path)
    assert os.path.ismount(path)
