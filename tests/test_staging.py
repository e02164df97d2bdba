"""colabfast.staging (stage) on local files: trees, single files, big files, resume, verification, space."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_same_tree

import colabfast.staging as stage_mod
from colabfast import env, stage
from colabfast.staging import StageError
from colabfast.testing.data import make_files


@pytest.fixture
def src(tmp_path) -> Path:
    root = make_files(tmp_path / "src", 60, 20_000, per_folder=20, seed=1)
    (root / "empty_dir").mkdir()
    (root / "d0000" / "link_to_file").symlink_to(root / "d0001" / "f000020.bin")
    (root / "dangling").symlink_to(tmp_path / "nowhere")
    return root


def test_tree_is_copied_identically(src, tmp_path):
    out = stage(src, tmp_path / "dst", progress=False)
    assert out == tmp_path / "dst"
    assert (out / "empty_dir").is_dir()
    assert not (out / "d0000" / "link_to_file").is_symlink()  # symlinks are followed
    assert not (out / "dangling").exists()
    assert_same_tree(src, out)
    for p in src.rglob("*.bin"):
        assert (out / p.relative_to(src)).stat().st_mtime_ns == p.stat().st_mtime_ns


def test_rerun_copies_nothing_and_recopies_changes(src, tmp_path):
    dst = stage(src, tmp_path / "dst", progress=False)
    before = {p: p.stat().st_ino for p in dst.rglob("*.bin")}
    changed = src / "d0002" / "f000045.bin"
    changed.write_bytes(b"new content")
    (dst / "d0000" / "f000003.bin").unlink()
    stage(src, dst, progress=False)
    assert_same_tree(src, dst)
    deleted = dst / "d0000" / "f000003.bin"  # copied again; its inode number may or may not be reused
    rewritten = {p for p, ino in before.items() if p != deleted and p.stat().st_ino != ino}
    assert rewritten == {dst / "d0002" / "f000045.bin"}


def test_interrupt_stops_promptly_and_resumes(tmp_path, monkeypatch):
    src = make_files(tmp_path / "src", 200, 20_000, per_folder=50)
    dst = tmp_path / "dst"
    real_wait = stage_mod.wait

    def interrupted_wait(*args, **kwargs):  # the notebook's stop button hits the waiting main thread
        if dst.is_dir() and len(list(dst.rglob("*.bin"))) >= 20:
            raise KeyboardInterrupt
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(stage_mod, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        stage(src, dst, workers=2, progress=False)
    monkeypatch.undo()
    copied = {p.relative_to(dst) for p in dst.rglob("*.bin")}
    assert 0 < len(copied) < 200  # queued files were cancelled, not copied after the interrupt
    for rel in copied:
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
    assert not list(dst.rglob("*colabfast-partial"))
    assert stage_mod.read_json(stage_mod._manifest_path(dst))["complete"] is False
    stage(src, dst, progress=False)
    assert_same_tree(src, dst)
    assert stage_mod.read_json(stage_mod._manifest_path(dst))["complete"] is True


def test_killed_process_resumes(tmp_path):
    src = make_files(tmp_path / "src", 400, 50_000, per_folder=100)
    dst = tmp_path / "dst"
    # A child stages slowly (one thread, 10 ms per file) and is SIGKILLed mid-copy.
    code = (
        "import time, colabfast.staging as s\n"
        "real = s._Copier._copy_small\n"
        "def slow(self, f):\n"
        "    time.sleep(0.01); return real(self, f)\n"
        "s._Copier._copy_small = slow\n"
        f"s.stage({str(src)!r}, {str(dst)!r}, workers=1, progress=False)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    try:
        deadline = 200
        while deadline and len(list(dst.rglob("*.bin"))) < 40:
            deadline -= 1
            subprocess.run(["sleep", "0.05"])
    finally:
        child.kill()
        child.wait()
    assert 0 < len(list(dst.rglob("*.bin"))) < 400
    stage(src, dst, progress=False)
    assert_same_tree(src, dst)
    assert not list(dst.rglob("*colabfast-partial"))


def test_single_file_to_path_or_folder(tmp_path):
    f = tmp_path / "data.h5"
    f.write_bytes(os.urandom(100_000))
    assert stage(f, tmp_path / "out" / "copy.h5", progress=False).read_bytes() == f.read_bytes()
    (tmp_path / "folder").mkdir()
    out = stage(f, tmp_path / "folder", progress=False)
    assert out == tmp_path / "folder" / "data.h5" and out.read_bytes() == f.read_bytes()


def test_big_file_is_copied_in_ranges(tmp_path, monkeypatch):
    monkeypatch.setattr(stage_mod, "BIG_FILE", 1 << 20)
    monkeypatch.setattr(stage_mod, "RANGE", 300_000)
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3_000_001))
    for verify in ("size", "sha256"):
        out = stage(big, tmp_path / verify / "big.bin", verify=verify, progress=False)
        assert out.read_bytes() == big.read_bytes()
        assert not list(out.parent.glob("*partial*"))


def test_sha256_catches_silent_corruption(src, tmp_path):
    dst = stage(src, tmp_path / "dst", verify="sha256", progress=False)
    victim = dst / "d0001" / "f000030.bin"
    st = victim.stat()
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF  # same size, and the mtime is put back: only the content differs
    victim.write_bytes(bytes(data))
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    stage(src, dst, verify="size", progress=False)
    assert victim.read_bytes() != (src / "d0001" / "f000030.bin").read_bytes()  # size check can't see it
    stage(src, dst, verify="sha256", progress=False)
    assert_same_tree(src, dst)


def test_bad_arguments_are_refused(src, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stage(tmp_path / "missing", progress=False)
    with pytest.raises(ValueError, match="verify"):
        stage(src, tmp_path / "x", verify="md5", progress=False)
    with pytest.raises(ValueError, match="not both"):
        stage(src, tmp_path / "x", to="ram", progress=False)
    with pytest.raises(ValueError, match="inside"):
        stage(src, src / "inner", progress=False)


@pytest.fixture
def small_tmpfs(tmp_path):
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_space_preflight_refuses_with_numbers(src, small_tmpfs):
    with pytest.raises(OSError) as info:
        stage(src, small_tmpfs / "dst", progress=False)
    assert info.value.errno == errno.ENOSPC
    msg = str(info.value)
    assert re.search(r"not enough free space on \S+/small: need 1\.2 MB, have 52\d\.\d kB", msg), msg
    assert not (small_tmpfs / "dst").exists() or not list((small_tmpfs / "dst").rglob("*.bin"))


def test_drivefs_needs_twice_the_space(tmp_path, monkeypatch):
    # DriveFS exists only in Colab: stand in for its mount-table answer, keep the real disk numbers.
    monkeypatch.setattr(env, "drive_kind", lambda path: "drivefs")
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    free = env.disk_free(tmp_path)
    with pytest.raises(OSError, match=r"need .* GB \(2 x .* GB: Drive caches what it reads\)"):
        stage_mod.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src")
    monkeypatch.setattr(env, "drive_kind", lambda path: None)
    stage_mod.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src")


# --- through the FUSE Drive simulator ---------------------------------------------------------------


@pytest.fixture
def drive(tmp_path):
    """A folder of 120 files served by the Drive simulator (10 ms per open: quick, yet Drive-shaped)."""
    from colabfast.testing.drivesim import DriveSim, available

    ok, why = available()
    if not ok:
        pytest.skip(f"FUSE is not available: {why}")
    src = make_files(tmp_path / "drive" / "data", 120, 30_000, per_folder=30, seed=5)
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=10, read_ms=1, mbps=None) as sim:
        yield sim, src


def test_from_drive_identical_and_rerun_opens_nothing(drive, tmp_path):
    sim, src = drive
    assert env.drive_kind(sim.mountpoint) == "drivesim"
    dst = stage(sim.mountpoint / "data", tmp_path / "dst", progress=False)
    assert_same_tree(src, dst)
    assert sim.stats()["opens"] == 120
    sim.reset_stats()
    stage(sim.mountpoint / "data", dst, progress=False)
    assert sim.stats()["opens"] == 0 and sim.stats()["bytes_read"] == 0  # listings only


def test_transient_faults_are_retried(drive, tmp_path):
    sim, src = drive
    sim.set(eio_open=0.02, eio_read=0.02)
    sim.disconnect(0.6)  # every request fails with ENOTCONN for 0.6 s, starting now
    dst = stage(sim.mountpoint / "data", tmp_path / "dst", progress=False)
    assert_same_tree(src, dst)
    stats = sim.stats()
    assert stats["enotconn"] > 0 and stats["eio"] > 0  # the faults happened and were survived


def test_permanent_failures_are_named_and_the_rest_stays(drive, tmp_path):
    sim, src = drive
    sim.set(eio_open=0.3)
    with pytest.raises(StageError) as err:
        stage(sim.mountpoint / "data", tmp_path / "dst", retries=0, progress=False)
    failed = set(err.value.failures)
    assert 0 < len(failed) < 120
    assert f"{len(failed)} of 120 files could not be staged" in str(err.value)
    assert "Input/output error" in str(err.value) and sorted(failed)[0] in str(err.value)
    staged = {p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*.bin")}
    assert staged == {p.relative_to(src).as_posix() for p in src.rglob("*.bin")} - failed
    assert not list((tmp_path / "dst").rglob("*colabfast-partial"))
    sim.set(eio_open=0.0)
    sim.reset_stats()
    stage(sim.mountpoint / "data", tmp_path / "dst", progress=False)
    assert_same_tree(src, tmp_path / "dst")
    assert sim.stats()["opens"] == len(failed)  # only the missing files were fetched again


def test_killed_while_copying_from_drive_resumes(tmp_path):
    from colabfast.testing.drivesim import DriveSim

    src = make_files(tmp_path / "drive" / "data", 200, 20_000, per_folder=50)
    dst = tmp_path / "dst"
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=50, read_ms=1, mbps=None) as sim:
        code = (f"import colabfast as c; c.stage({str(sim.mountpoint / 'data')!r}, {str(dst)!r}, workers=4, "
                "progress=False)")
        child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
        try:
            for _ in range(400):
                if dst.is_dir() and len(list(dst.rglob("*.bin"))) >= 20:
                    break
                subprocess.run(["sleep", "0.05"])
        finally:
            child.kill()
            child.wait()
        done = len(list(dst.rglob("*.bin")))
        assert 0 < done < 200
        sim.reset_stats()
        stage(sim.mountpoint / "data", dst, progress=False)
        assert_same_tree(src, dst)
        assert not list(dst.rglob("*colabfast-partial"))
        assert sim.stats()["opens"] <= 200 - done + 4  # what was done stays done (4 were mid-copy)


def test_big_file_ranges_from_drive(tmp_path, monkeypatch):
    from colabfast.testing.drivesim import DriveSim

    monkeypatch.setattr(stage_mod, "BIG_FILE", 1 << 20)
    monkeypatch.setattr(stage_mod, "RANGE", 256 << 10)
    (tmp_path / "drive").mkdir()
    big = tmp_path / "drive" / "mirror.h5"
    big.write_bytes(os.urandom(5_000_000))
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=5, read_ms=1, mbps=None, eio_read=0.05) as sim:
        (tmp_path / "local").mkdir()
        out = stage(sim.mountpoint / "mirror.h5", tmp_path / "local", verify="sha256", progress=False)
        assert out == tmp_path / "local" / "mirror.h5" and out.read_bytes() == big.read_bytes()
        assert sim.stats()["opens"] >= 20  # one per range: the ranges were read in parallel


def test_archive_from_drive(tmp_path):
    import tarfile

    from colabfast.testing.drivesim import DriveSim

    src = make_files(tmp_path / "data", 50, 20_000, per_folder=10)
    (tmp_path / "drive").mkdir()
    with tarfile.open(tmp_path / "drive" / "data.tar.gz", "w:gz") as t:
        t.add(src, arcname="data")
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=5, read_ms=1, mbps=None, eio_read=0.05) as sim:
        out = stage(sim.mountpoint / "data.tar.gz", tmp_path / "out", progress=False)
    assert_same_tree(src, out)
