"""colabfast.staging (stage) on local files: trees, single files, big files, resume, verification, space."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
import tarfile
import warnings
import zipfile
from pathlib import Path

import pytest
from conftest import assert_same_tree

from colabfast import stage
from colabfast.errors import StageError
from colabfast.staging import archives as stage_mod_archives
from colabfast.staging import copy as stage_mod_copy
from colabfast.staging import destination as stage_mod_destination
from colabfast.testing.data import make_files
from colabfast.where import env


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))  # stage locks and records go there

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
    real_wait = stage_mod_copy.wait

    def interrupted_wait(*args, **kwargs):  # the notebook's stop button hits the waiting main thread
        if dst.is_dir() and len(list(dst.rglob("*.bin"))) >= 20:
            raise KeyboardInterrupt
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(stage_mod_copy, "wait", interrupted_wait)
    with pytest.raises(KeyboardInterrupt):
        stage(src, dst, workers=2, progress=False)
    monkeypatch.undo()
    copied = {p.relative_to(dst) for p in dst.rglob("*.bin")}
    assert 0 < len(copied) < 200  # queued files were cancelled, not copied after the interrupt
    for rel in copied:
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
    assert not list(dst.rglob("*colabfast-partial"))
    assert stage_mod_archives.read_json(stage_mod_destination.manifest_path(dst))["complete"] is False
    stage(src, dst, progress=False)
    assert_same_tree(src, dst)
    assert stage_mod_archives.read_json(stage_mod_destination.manifest_path(dst))["complete"] is True


def test_killed_process_resumes(tmp_path):
    src = make_files(tmp_path / "src", 400, 50_000, per_folder=100)
    dst = tmp_path / "dst"
    # A child stages slowly (one thread, 10 ms per file) and is SIGKILLed mid-copy.
    code = (
        "import time, colabfast.staging.copy as s\nfrom colabfast import stage\n"
        "real = s._Copier._copy_small\n"
        "def slow(self, f):\n"
        "    time.sleep(0.01); return real(self, f)\n"
        "s._Copier._copy_small = slow\n"
        f"stage({str(src)!r}, {str(dst)!r}, workers=1, progress=False)\n"
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
    monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
    monkeypatch.setattr(stage_mod_copy, "RANGE", 300_000)
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
        stage_mod_destination.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src")
    monkeypatch.setattr(env, "drive_kind", lambda path: None)
    stage_mod_destination.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src")


# --- through the FUSE Drive simulator ---------------------------------------------------------------


@pytest.fixture
def drive(tmp_path, need_fuse):
    """A folder of 120 files served by the Drive simulator (10 ms per open: quick, yet Drive-shaped)."""
    from colabfast.drivesim.simulator import DriveSim

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
    from colabfast.drivesim.simulator import DriveSim

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
    from colabfast.drivesim.simulator import DriveSim

    monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
    monkeypatch.setattr(stage_mod_copy, "RANGE", 256 << 10)
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

    from colabfast.drivesim.simulator import DriveSim

    src = make_files(tmp_path / "data", 50, 20_000, per_folder=10)
    (tmp_path / "drive").mkdir()
    with tarfile.open(tmp_path / "drive" / "data.tar.gz", "w:gz") as t:
        t.add(src, arcname="data")
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=5, read_ms=1, mbps=None, eio_read=0.05) as sim:
        out = stage(sim.mountpoint / "data.tar.gz", tmp_path / "out", progress=False)
    assert_same_tree(src, out)


# --- issue 15: never lose or corrupt data -------------------------------------------------------------


@pytest.mark.parametrize("small_tmpfs", ["4m"], indirect=True)
@pytest.mark.parametrize("path", ["small files", "big file"])
def test_disk_filling_during_stage_never_leaves_a_short_file(tmp_path, small_tmpfs, monkeypatch, path):
    """Issue 15, case 1: another process fills the destination after the space check passed. A
    write that stores only part of a chunk must not be taken as done (the old code renamed a
    94,208-of-1,000,000-byte file into place): ENOSPC is raised and nothing incomplete stays."""
    src = tmp_path / "src"
    src.mkdir()
    sizes = [1_000_000] * 3 if path == "small files" else [3_000_000]
    if path == "big file":
        monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
        monkeypatch.setattr(stage_mod_copy, "RANGE", 256 << 10)
    for i, size in enumerate(sizes):
        (src / f"{i}.bin").write_bytes(os.urandom(size))
    dst, filler = small_tmpfs / "dst", small_tmpfs / "filler"
    real_check = stage_mod_copy.check_space

    def check_then_fill(*args, **kwargs):
        real_check(*args, **kwargs)
        free = os.statvfs(small_tmpfs).f_bavail * os.statvfs(small_tmpfs).f_frsize
        subprocess.run(["sh", "-c", f"head -c {free - 100_000} /dev/zero > {filler}"], check=True)

    monkeypatch.setattr(stage_mod_copy, "check_space", check_then_fill)  # where the copy engine calls it
    with pytest.raises(OSError) as err:
        stage(src, dst, workers=1, progress=False)
    assert err.value.errno == errno.ENOSPC and "filled up" in str(err.value)
    for p in dst.glob("*.bin"):  # whatever looks complete is complete
        assert p.read_bytes() == (src / p.name).read_bytes()
    assert not list(dst.glob("*partial*"))
    monkeypatch.setattr(stage_mod_copy, "check_space", real_check)
    filler.unlink()
    stage(src, dst, progress=False)
    assert_same_tree(src, dst)


def test_foreign_folder_is_refused_and_left_alone(src, tmp_path):
    """Issue 15, case 2: staging into a folder of the user's overwrote their same-named file."""
    (src / "notes.txt").write_text("dataset notes")
    dst = tmp_path / "mine"
    dst.mkdir()
    (dst / "notes.txt").write_text("my notes")
    with pytest.raises(ValueError, match=rf"{dst} is a folder colabfast did not stage, and it holds notes.txt"):
        stage(src, dst, progress=False)
    assert os.listdir(dst) == ["notes.txt"] and (dst / "notes.txt").read_text() == "my notes"
    stage(src, dst, overwrite=True, progress=False)
    assert_same_tree(src, dst)


def test_second_source_is_refused_not_merged(tmp_path):
    """Issue 15, case 3: stage B into a folder staged from A mixed the two datasets."""
    a = make_files(tmp_path / "a", 4, 1000, per_folder=2, seed=1)
    b = make_files(tmp_path / "b", 6, 1000, per_folder=3, seed=2)
    dst = stage(a, tmp_path / "dst", progress=False)
    with pytest.raises(ValueError, match=rf"was staged from {a}, not {b}: .* mix two datasets"):
        stage(b, dst, progress=False)
    assert_same_tree(a, dst)
    stage(b, dst, overwrite=True, progress=False)
    assert_same_tree(b, dst)


def test_a_single_file_is_not_staged_over_the_users_file(tmp_path):
    """Issue 15, case 2, for one file: a file of the user's at the destination is never replaced."""
    src = tmp_path / "weights.bin"
    src.write_bytes(b"dataset" * 100)
    dst = tmp_path / "mine.bin"
    dst.write_bytes(b"my own work")
    with pytest.raises(ValueError, match=rf"{dst} is a file colabfast did not stage: .* nothing was written"):
        stage(src, dst, progress=False)
    assert dst.read_bytes() == b"my own work"
    stage(src, dst, overwrite=True, progress=False)
    assert dst.read_bytes() == src.read_bytes()


def test_a_second_archive_is_refused_not_merged(tmp_path):
    """Issue 15, case 3, for archives: extracting archive B into the folder staged from archive A."""
    import tarfile

    archives = []
    for name, files in (("a", {"cat/1.jpg": b"1", "dog/3.jpg": b"3"}), ("b", {"cat/2.jpg": b"2", "eel/4.jpg": b"4"})):
        for rel, data in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_bytes(data)
        with tarfile.open(tmp_path / f"{name}.tar", "w") as tar:
            tar.add(tmp_path / name, arcname=".")
        archives.append(tmp_path / f"{name}.tar")
    dst = tmp_path / "dst"
    assert stage(archives[0], dst, progress=False) == dst

    def images():
        return sorted(p.relative_to(dst).as_posix() for p in dst.rglob("*.jpg"))

    mixing = r"was staged from .*a\.tar, not .*b\.tar: staging there would mix two datasets"
    with pytest.raises(ValueError, match=mixing):
        stage(archives[1], dst, progress=False)
    assert images() == ["cat/1.jpg", "dog/3.jpg"]
    stage(archives[1], dst, overwrite=True, progress=False)
    assert images() == ["cat/2.jpg", "eel/4.jpg"]


@pytest.mark.parametrize("path", ["small file", "big file"])
def test_source_rewritten_during_copy_is_copied_again(tmp_path, monkeypatch, path):
    """Issue 15, case 4: a same-size rewrite in place during the copy gave a torn file (old bytes,
    then new) that passed the size check. The change is seen (size, mtime, inode) and the file
    copied again; one that keeps changing is named in the error."""
    if path == "big file":
        monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
        monkeypatch.setattr(stage_mod_copy, "RANGE", 1 << 20)
    src = tmp_path / "src"
    src.mkdir()
    victim = src / "data.bin"
    victim.write_bytes(os.urandom(3 << 20))
    os.utime(victim, ns=(10**18, 10**18))  # an old file: its rewrite gets a new mtime
    versions, reads = [], []
    real = stage_mod_copy._Copier._check_abort

    def rewrite_in_place(self):  # called before each chunk: after the first, the source is rewritten
        reads.append(1)
        if len(reads) >= 2 and len(versions) < rewrites:  # old bytes were read already: a torn copy
            versions.append(os.urandom(3 << 20))
            with open(victim, "r+b") as f:
                f.write(versions[-1])
        real(self)

    monkeypatch.setattr(stage_mod_copy._Copier, "_check_abort", rewrite_in_place)
    rewrites = 1
    out = stage(src, tmp_path / "dst", workers=2, progress=False)
    assert (out / "data.bin").read_bytes() == versions[-1] == victim.read_bytes()
    rewrites = 100
    reads.clear()
    victim.write_bytes(os.urandom(3 << 20))
    with pytest.raises(StageError, match=r"data.bin changed while it was copied"):
        stage(src, tmp_path / "dst", workers=2, retries=1, progress=False)


def test_sha256_resume_after_kill_reuses_verified_files(tmp_path, monkeypatch):
    """Issue 15, case 6: after a kill, a re-run with verify="sha256" re-copied every file because
    the hashes were recorded only at the end. Each verified file is now journaled as it completes."""
    src = make_files(tmp_path / "src", 200, 20_000, per_folder=50)
    dst = tmp_path / "dst"
    code = (
        "import time, colabfast.staging.copy as s\nfrom colabfast import stage\n"
        "real = s._Copier._copy_small\n"
        "def slow(self, f):\n"
        "    time.sleep(0.01); return real(self, f)\n"
        "s._Copier._copy_small = slow\n"
        f"stage({str(src)!r}, {str(dst)!r}, workers=1, verify='sha256', progress=False)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    try:
        for _ in range(400):
            if len(list(dst.rglob("*.bin"))) >= 40:
                break
            subprocess.run(["sleep", "0.05"])
    finally:
        child.kill()
        child.wait()
    done = len(list(dst.rglob("*.bin")))
    assert 0 < done < 200
    copied = []
    real = stage_mod_copy._Copier._copy_small
    monkeypatch.setattr(stage_mod_copy._Copier, "_copy_small", lambda self, f: copied.append(f) or real(self, f))
    stage(src, dst, verify="sha256", progress=False)
    assert_same_tree(src, dst)
    assert len(copied) <= 200 - done + 1  # at most the file being verified at the kill is redone
    record = stage_mod_archives.read_json(stage_mod_destination.manifest_path(dst))
    assert record["complete"] and len(record["sha256"]) == 200


def test_flaky_mount_large_files_retry_per_range(tmp_path, monkeypatch, need_fuse):
    """Issue 15, case 8: with 10% of read requests failing (EIO), a large file read as a few big
    requests failed every time once a range was retried whole; now a failed read is retried in
    smaller requests at its offset, and the files arrive intact."""
    from colabfast.drivesim.simulator import DriveSim

    monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
    monkeypatch.setattr(stage_mod_copy, "RANGE", 4 << 20)
    (tmp_path / "drive" / "big").mkdir(parents=True)
    for i in range(2):
        (tmp_path / "drive" / "big" / f"{i}.bin").write_bytes(os.urandom(8 << 20))
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=1, read_ms=0, mbps=None, eio_read=0.1) as sim:
        out = stage(sim.mountpoint / "big", tmp_path / "dst", progress=False)
        assert sim.stats()["eio"] > 0
    assert_same_tree(tmp_path / "drive" / "big", out)


def test_names_near_name_max_are_staged(tmp_path):
    """Issue 15, case 10: a 250-byte name plus '.' and '.colabfast-partial' passes NAME_MAX (255). A
    single file staged into a folder also looked for colabfast 0.1's record beside it, a name as long,
    and even that look failed (ENAMETOOLONG)."""
    src = tmp_path / "src"
    src.mkdir()
    long = "n" * 246 + ".jpeg"
    (src / long).write_bytes(b"long name")
    out = stage(src, tmp_path / "dst", progress=False)
    assert (out / long).read_bytes() == b"long name"
    (tmp_path / "one").mkdir()
    for _ in range(2):  # into an existing folder, then again onto the file staged there
        assert stage(src / long, tmp_path / "one", progress=False).read_bytes() == b"long name"
    import tarfile

    with tarfile.open(tmp_path / "long.tar", "w") as t:
        t.add(src / long, arcname=f"d/{long}")
    assert (stage(tmp_path / "long.tar", tmp_path / "x", progress=False) / long).read_bytes() == b"long name"


def _without_root_read_override() -> None:
    """In a child about to exec: drop CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH from the bounding set
    (prctl PR_CAPBSET_DROP), so root obeys permission bits like any user."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        if libc.prctl(24, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_unreadable_subfolder_is_listed_and_the_rest_staged(tmp_path):
    """Issue 15, case 11: one sub-folder that cannot be listed aborted the whole stage with a bare
    PermissionError. It is now named in the StageError, as an unreadable file is, and the rest staged.
    (Root reads any folder, so as root the stage runs in a child without that privilege.)"""
    import json

    src = make_files(tmp_path / "src", 9, 1000, per_folder=3, seed=3)
    os.chmod(src / "d0001", 0)
    code = (
        "import json, colabfast as cf\n"
        f"try:\n    cf.stage({str(src)!r}, {str(tmp_path / 'dst')!r}, progress=False)\n"
        "except cf.StageError as e:\n    print(json.dumps([sorted(e.failures), str(e)]))\n"
    )
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             preexec_fn=_without_root_read_override if env.is_root() else None)
    finally:
        os.chmod(src / "d0001", 0o755)
    assert run.returncode == 0, run.stderr
    failures, message = json.loads(run.stdout)
    assert failures == ["d0001/"]
    assert "1 of 7 files or folders could not be staged" in message and "Permission denied" in message
    staged = sorted(p.relative_to(tmp_path / "dst").as_posix() for p in (tmp_path / "dst").rglob("*.bin"))
    assert staged == sorted(p.relative_to(src).as_posix() for p in src.rglob("*.bin")
                            if not p.is_relative_to(src / "d0001"))
    assert not (tmp_path / "dst" / "d0001").exists()


# --- issue 13: staging's rough edges ----------------------------------------------------------------


def test_state_lives_inside_the_destination_or_the_cache(src, tmp_path):
    (tmp_path / "area").mkdir()
    stage(src, tmp_path / "area" / "dst", progress=False)
    assert os.listdir(tmp_path / "area") == ["dst"]
    assert (tmp_path / "area" / "dst" / ".colabfast-stage.json").is_file()
    f = tmp_path / "one.bin"
    f.write_bytes(b"x" * 100)
    (tmp_path / "files").mkdir()
    stage(f, tmp_path / "files", progress=False)
    assert os.listdir(tmp_path / "files") == ["one.bin"]
    # a re-staged copy of a staged folder does not carry colabfast's record along
    again = stage(tmp_path / "area" / "dst", tmp_path / "again", progress=False)
    assert stage_mod_archives.read_json(again / ".colabfast-stage.json")["source"] == str(tmp_path / "area" / "dst")


def test_missing_source_message_is_plain(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        stage(tmp_path / "nope", tmp_path / "x", progress=False)
    assert str(err.value) == f"nothing to stage: {tmp_path / 'nope'} does not exist."
    assert err.value.errno == errno.ENOENT


def test_empty_folder_warns(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.warns(UserWarning, match="holds no files"):
        out = stage(tmp_path / "empty", tmp_path / "dst", progress=False)
    assert out.is_dir()


def test_auto_outside_colab_mounts_nothing(tmp_path, monkeypatch):
    """Outside Colab, to="auto" stages to disk: a RAM disk is mounted only when asked for."""
    src = make_files(tmp_path / "data", 4, 1000, per_folder=2)
    monkeypatch.setattr(env, "work_dir", lambda: tmp_path / "work")
    mounts_before = Path("/proc/mounts").read_text()
    out = stage(src, progress=False)
    assert out == tmp_path / "work" / "data" and not env.is_ram(out)
    assert Path("/proc/mounts").read_text() == mounts_before


def test_drivefs_folder_only_warns_at_twice_the_space(tmp_path, monkeypatch):
    """colabtools#1915: DriveFS evicts its cache as the disk fills, so a folder that fits once (but
    not twice) is staged with a warning; a single file or an archive still needs 2x."""
    monkeypatch.setattr(env, "drive_kind", lambda path: "drivefs")
    monkeypatch.setattr(Path, "home", lambda: tmp_path)
    free = env.disk_free(tmp_path)
    with pytest.warns(UserWarning, match=r"room for the .* GB of data, not for 2 x .*refresh_drive\(\)"):
        stage_mod_destination.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src", folder=True)
    with pytest.raises(OSError, match="Drive caches what it reads"):
        stage_mod_destination.check_space(int(free * 0.6), tmp_path / "dst", tmp_path / "src")


@pytest.mark.parametrize("verify", ["size", "sha256"])
@pytest.mark.parametrize("path", ["small file", "big file"])
def test_source_rewritten_with_its_mtime_put_back_is_copied_again(tmp_path, monkeypatch, path, verify):
    """Issue 23 item E: a same-size rewrite during the copy, its modification time then put back
    (6 of 6 torn copies were accepted, with verify="sha256" too, and kept by re-runs): the change
    time differs, so the file is copied again and the copy is the new bytes."""
    if path == "big file":
        monkeypatch.setattr(stage_mod_copy, "BIG_FILE", 1 << 20)
        monkeypatch.setattr(stage_mod_copy, "RANGE", 1 << 20)
    src = tmp_path / "src"
    src.mkdir()
    victim = src / "data.bin"
    victim.write_bytes(os.urandom(3 << 20))
    os.utime(victim, ns=(10**18, 10**18))
    versions, reads = [], []
    real = stage_mod_copy._Copier._check_abort

    def rewrite_in_place(self):  # after the first chunk: new bytes, the old modification time
        reads.append(1)
        if len(reads) == 2:
            versions.append(os.urandom(3 << 20))
            with open(victim, "r+b") as f:
                f.write(versions[-1])
            os.utime(victim, ns=(10**18, 10**18))
        real(self)

    monkeypatch.setattr(stage_mod_copy._Copier, "_check_abort", rewrite_in_place)
    out = stage(src, tmp_path / "dst", workers=2, verify=verify, progress=False)
    torn = (out / "data.bin").read_bytes() != versions[-1]  # a bool: no diff of 3 MB when it fails
    assert len(versions) == 1 and not torn


def test_tar_rewritten_while_extracted_is_refused_and_leaves_nothing(tmp_path, monkeypatch):
    """Issue 23 item E: an uncompressed .tar rewritten during its extraction was accepted (tar has no
    checksum of the data). Its identity is compared before and after, as a file's is: an error
    naming it, nothing left behind; a re-run once it is stable stages the new bytes."""
    src = tmp_path / "src" / "d"
    src.mkdir(parents=True)
    (src / "a.bin").write_bytes(b"old" * 1000)
    archive = tmp_path / "d.tar"
    with tarfile.open(archive, "w") as t:
        t.add(src, arcname="d")
    real = stage_mod_archives.extract

    def extract_then_rewrite(path, dst, **kwargs):
        real(path, dst, **kwargs)
        if not rewritten:
            rewritten.append(1)
            data = archive.read_bytes().replace(b"old" * 1000, b"new" * 1000)
            mtime = archive.stat().st_mtime_ns
            archive.write_bytes(data)
            os.utime(archive, ns=(mtime, mtime))

    rewritten: list[int] = []
    monkeypatch.setattr(stage_mod_archives, "extract", extract_then_rewrite)  # where staging calls it
    with pytest.raises(OSError, match=r"d.tar changed while it was extracted") as err:
        stage(archive, tmp_path / "out" / "d", progress=False)
    assert err.value.errno == errno.EAGAIN
    assert list((tmp_path / "out").iterdir()) == []
    out = stage(archive, tmp_path / "out" / "d", progress=False)
    assert (out / "a.bin").read_bytes() == b"new" * 1000


def test_corrupt_archive_leaves_nothing(tmp_path):
    """Issue 23 item 8: a zip whose data does not match its CRC-32 ends in BadZipFile, and its partial
    extraction (the files before the bad one) is removed: an archive that fails leaves nothing."""
    archive = tmp_path / "lying.zip"
    with zipfile.ZipFile(archive, "w") as z:  # stored: the bytes are in the file as written
        z.writestr("d/a.txt", b"a" * 5000)
        z.writestr("d/b.txt", b"b" * 5000)
    archive.write_bytes(archive.read_bytes().replace(b"b" * 5000, b"b" * 4999 + b"c"))
    with pytest.raises(zipfile.BadZipFile):
        stage(archive, tmp_path / "out" / "d", progress=False)
    assert list((tmp_path / "out").iterdir()) == []


def test_files_named_like_colabfasts_own_are_copied_or_refused_never_dropped(tmp_path):
    """Issue 41 item 15 (issue 23 item F made it a warning): a user's files named '*.colabfast-partial'
    or '.colabfast-*' were left out and stage reported success. A name colabfast never writes
    (``notes.colabfast-partial``: no leading dot; ``.colabfast-settings``) is copied, and a resumed run
    deletes only colabfast's own temporary files; a name colabfast writes in a staged folder
    (``.NAME.colabfast-partial``, its record) is refused by name before anything is written, unless
    its folder is a stage of colabfast's (then it is that stage's record, left out as before)."""
    from colabfast.errors import StageRefused
    from colabfast.staging.destination import JOURNAL, RECORD
    from colabfast.where._fileio import partial_name

    src = make_files(tmp_path / "src", 3, 100)
    (src / "notes.colabfast-partial").write_text("mine")
    (src / "d").mkdir()
    (src / "d" / ".colabfast-settings").write_text("mine too")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = stage(src, tmp_path / "first", progress=False)
    assert (out / "notes.colabfast-partial").read_text() == "mine"
    assert (out / "d" / ".colabfast-settings").read_text() == "mine too"

    # a run that was interrupted: its record incomplete, a file missing, a partial file of it left
    record = stage_mod_archives.read_json(out / RECORD)
    stage_mod_archives.write_json_atomic(out / RECORD, {**record, "complete": False})
    missing = sorted(out.rglob("*.bin"))[0]
    missing.unlink()
    stage_mod_archives.partial_path(missing).write_bytes(b"half")
    stage(src, out, progress=False)
    assert missing.is_file() and not stage_mod_archives.partial_path(missing).exists()
    assert (out / "notes.colabfast-partial").read_text() == "mine"  # the user's, not a leftover

    (src / ".a.bin.colabfast-partial").write_text("mine")  # the temporary name of a.bin
    (src / "d" / RECORD).write_text('{"my": "settings"}')
    (src / "d" / JOURNAL).write_text("my log\n")
    with pytest.raises(StageRefused, match=r"3 files of .*src are named as colabfast names its own in a staged "
                                           r"folder .*nothing was written: \.a\.bin\.colabfast-partial, "
                                           r"d/\.colabfast-stage\.json, d/\.colabfast-stage\.sha256\.jsonl\. "
                                           r"Rename them"):
        stage(src, tmp_path / "second", progress=False)
    assert not (tmp_path / "second").exists()

    # a folder colabfast staged: its record and leftovers are that stage's, left out quietly
    stage_mod_archives.partial_path(out / "d" / "x.bin").write_bytes(b"half")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = stage(out, tmp_path / "again", progress=False)
    assert sorted(p.name for p in again.rglob("*") if p.is_file()) == sorted(
        p.name for p in out.rglob("*") if p.is_file() and p.name != partial_name("x.bin"))
    assert stage_mod_archives.read_json(again / RECORD)["source"] == str(out)


def test_default_destination_is_this_users_and_not_named_like_the_package(tmp_path, monkeypatch):
    """Issue 23 item 18: the default destination outside Colab was <tempdir>/colabfast/<name>: shared
    by every user, and a script run from the temp folder imported the staged data as `colabfast`.
    It is <tempdir>/colabfast-data-<uid>/<name>, made for this user alone; a folder of that name
    that someone else made is refused."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    src = make_files(tmp_path / "src", 3, 100)
    out = stage(src, progress=False)
    assert out == tmp_path / "tmp" / f"colabfast-data-{os.getuid()}" / "src"
    assert out.parent.stat().st_mode & 0o777 == 0o700
    assert_same_tree(src, out)
    other = tmp_path / "other-tmp"
    monkeypatch.setattr(tempfile, "tempdir", str(other))
    (other / f"colabfast-data-{os.getuid()}").mkdir(parents=True)
    os.chown(other / f"colabfast-data-{os.getuid()}", os.getuid() + 1, -1)  # as another user made it
    with pytest.raises(PermissionError, match="is not a folder of yours"):
        stage(src, progress=False)


@pytest.mark.parametrize("verify", ["size", "sha256"])
def test_archive_of_one_folder_named_like_it_is_not_nested(tmp_path, capsys, verify):
    """Issue 23 item 18: `colabfast stage other.tar.gz` landed in .../other/other. A single top folder
    named like the destination becomes the destination; a re-run returns the same path, copies
    nothing (with sha256: the recorded hashes match) and says so."""
    src = make_files(tmp_path / "other", 4, 100)
    archive = tmp_path / "other.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        t.add(src, arcname="other")
    out = stage(archive, tmp_path / "dst" / "other", verify=verify, progress=False)
    assert out == tmp_path / "dst" / "other"
    assert_same_tree(src, out)
    assert sorted(p.name for p in (tmp_path / "dst").iterdir()) == ["other"]  # no partial left beside it
    ino = next(out.rglob("*.bin")).stat().st_ino
    capsys.readouterr()
    assert stage(archive, tmp_path / "dst" / "other", verify=verify) == out
    assert next(out.rglob("*.bin")).stat().st_ino == ino
    assert f"{out} is up to date, nothing copied" in capsys.readouterr().err
    assert stage(archive, tmp_path / "elsewhere", progress=False) == tmp_path / "elsewhere" / "other"


def test_a_cancelled_stage_stops_and_leaves_no_partial_file(tmp_path, need_fuse):
    import threading

    from colabfast.drivesim.simulator import DriveSim

    (tmp_path / "drive").mkdir()
    (tmp_path / "drive" / "big.h5").write_bytes(os.urandom(24 << 20))
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=1, read_ms=1, mbps=20) as sim:
        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()  # 24 MB at 20 MB/s: more than a second to copy
        with pytest.raises(OSError, match="cancelled") as raised:
            stage(sim.mountpoint / "big.h5", tmp_path / "dst" / "big.h5", progress=False, cancel=cancel)
        assert raised.value.errno == errno.ECANCELED
        assert not any(p.is_file() for p in (tmp_path / "dst").rglob("*"))  # no partial, no copy


def test_refusals_are_colabfast_errors_that_stay_value_errors(tmp_path):
    """Issue 41 item 13: stage's refusals of bad arguments and destinations were plain ValueErrors,
    which ``except colabfast.Error`` missed. Each is a StageRefused: a colabfast.Error and still a
    ValueError, naming what and the fix; nothing is written."""
    import colabfast as cf
    from colabfast.errors import StageRefused

    src = make_files(tmp_path / "src", 3, 100)
    (tmp_path / "yours").mkdir()
    (tmp_path / "yours" / "thesis.tex").write_text("mine")
    refused = [
        (dict(verify="md5"), "verify must be 'size' or 'sha256', not 'md5'"),
        (dict(to="cloud", dst=None), "to must be 'auto', 'disk' or 'ram', not 'cloud'"),
        (dict(to="ram"), "pass dst or to, not both"),
        (dict(workers=0), "workers must be at least 1, not 0"),
        (dict(src=[src]), "a list of sources must be archives"),
        (dict(dst=src / "inside"), "cannot stage .*src into .*inside: one is inside the other"),
        (dict(dst=tmp_path / "yours"), "is a folder colabfast did not stage, and it holds thesis.tex: .* Pass "
                                       "another dst, empty the folder, or pass overwrite=True"),
    ]
    for kwargs, message in refused:
        args = {"src": src, "dst": tmp_path / "dst", "progress": False, **kwargs}
        with pytest.raises(StageRefused, match=message) as caught:
            stage(args.pop("src"), args.pop("dst"), **args)
        assert isinstance(caught.value, cf.Error) and isinstance(caught.value, ValueError)
        assert not isinstance(caught.value, OSError)  # not taken for a disk or mount error
    assert not (tmp_path / "dst").exists() and not (src / "inside").exists()
    assert os.listdir(tmp_path / "yours") == ["thesis.tex"]
