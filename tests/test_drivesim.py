"""Tests for colabfast.drivesim: real FUSE mounts of small folders, no mocks."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from colabfast.drivesim.fs import DriveSimParams, available
from colabfast.drivesim.simulator import DriveSim, build_parser
from colabfast.errors import DriveSimError
from colabfast.where import env, mounttable

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.fuse, pytest.mark.usefixtures("need_fuse")]

# No latency unless a test asks for it: the tests check behaviour, and lower bounds where they time.
FAST = dict(open_ms=0.0, read_ms=0.0, mbps=None)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A small tree: empty, tiny, page-sized and multi-request files, a subfolder and a symlink."""
    root = tmp_path / "src"
    (root / "sub" / "deeper").mkdir(parents=True)
    rng = random.Random(0)
    files = {
        "empty.bin": b"",
        "tiny.txt": b"hello drive\n",
        "page.bin": rng.randbytes(4096),
        "big.bin": rng.randbytes(300_000),  # three kernel read requests of <= 128 KiB
        "sub/a.txt": b"a" * 1000,
        "sub/deeper/b.bin": rng.randbytes(50_000),
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    os.symlink("tiny.txt", root / "link.txt")
    return root


def mounted(path: Path) -> bool:
    return any(m.mountpoint == os.path.realpath(path) for m in mounttable.mounts())


def process_gone(pid: int) -> bool:
    """True when ``pid`` has exited (a zombie counts: containers' init may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def tree(root: Path) -> dict[str, bytes]:
    """Relative path -> content (files) or ``b"-> target"`` (symlinks) for everything under root."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            out[rel] = b"-> " + os.readlink(p).encode() if p.is_symlink() else p.read_bytes()
        for name in dirnames:
            out[str((Path(dirpath) / name).relative_to(root)) + "/"] = b""
    return out


def test_available_reports_missing_fusermount(monkeypatch):
    assert available() == (True, "")
    monkeypatch.setenv("PATH", "/nonexistent")
    ok, why = available()
    assert not ok and "fusermount3" in why


def test_bytes_identical_through_the_mount(src):
    with DriveSim(src, **FAST) as sim:
        assert tree(sim.mountpoint) == tree(src)
        assert os.readlink(sim.mountpoint / "link.txt") == "tiny.txt"
        with open(sim.mountpoint / "big.bin", "rb") as f:  # random access, not only whole files
            f.seek(200_000)
            assert f.read(1000) == (src / "big.bin").read_bytes()[200_000:201_000]
        assert os.statvfs(sim.mountpoint).f_bsize == os.statvfs(src).f_bsize


def test_listings_carry_the_same_attributes_as_stat(src):
    """READDIRPLUS hands the kernel every entry's attributes with the listing (cached, so a wrong
    field would be served to every later stat): they must equal the source's, symlinks unfollowed,
    in a folder bigger than one kernel readdir buffer."""
    many = src / "many"
    many.mkdir()
    for i in range(300):
        (many / f"f{i:03d}").write_bytes(b"x" * i)
        os.utime(many / f"f{i:03d}", ns=(1_600_000_000_123_456_789 + i, 1_600_000_000_987_654_321 + i))

    def listing(root: Path) -> dict[str, tuple]:
        out = {}
        for folder in (root, root / "sub", root / "many"):
            with os.scandir(folder) as it:
                for e in it:
                    st = e.stat(follow_symlinks=False)
                    out[os.path.relpath(e.path, root)] = (st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink)
        return out

    with DriveSim(src, **FAST) as sim:
        assert listing(sim.mountpoint) == listing(src)
        assert len(listing(sim.mountpoint)) == 300 + 9


def test_mount_table_and_drive_kind(src):
    with DriveSim(src, **FAST) as sim:
        m = mounttable.mount_of(sim.mountpoint)
        assert (m.source, m.fstype) == ("colabfast-drivesim", "fuse.drivesim")
        assert env.drive_kind(sim.mountpoint) == "drivesim"
        assert env.drive_kind(sim.mountpoint / "sub" / "a.txt") == "drivesim"
        assert env.is_fuse(sim.mountpoint)


def test_writes_and_renames_pass_through(src):
    with DriveSim(src, **FAST) as sim:
        mp = sim.mountpoint
        sim.reset_stats()
        (mp / "new.bin").write_bytes(b"x" * 200_000)
        with open(mp / "new.bin", "ab") as f:
            f.write(b"tail")
        assert (src / "new.bin").read_bytes() == b"x" * 200_000 + b"tail"
        stats = sim.stats()
        assert stats["bytes_written"] == 200_004 and stats["writes"] >= 2

        os.rename(mp / "new.bin", mp / "sub" / "moved.bin")
        assert not (src / "new.bin").exists() and (src / "sub" / "moved.bin").stat().st_size == 200_004
        os.truncate(mp / "sub" / "moved.bin", 10)
        assert (src / "sub" / "moved.bin").read_bytes() == b"x" * 10

        (mp / "made").mkdir()
        assert (src / "made").is_dir()
        (mp / "made").rmdir()
        assert not (src / "made").exists()
        (mp / "tiny.txt").unlink()
        assert not (src / "tiny.txt").exists()
        os.symlink("sub/a.txt", mp / "alink")
        assert os.readlink(src / "alink") == "sub/a.txt"
        assert (mp / "alink").read_bytes() == b"a" * 1000

        os.chmod(mp / "page.bin", 0o600)
        assert (src / "page.bin").stat().st_mode & 0o777 == 0o600
        os.utime(mp / "page.bin", ns=(1_000_000_000, 2_000_000_000))
        assert (src / "page.bin").stat().st_mtime_ns == 2_000_000_000
        before = time.time() - 5
        os.utime(mp / "page.bin")  # "now", which libfuse passes as UTIME_NOW
        assert (src / "page.bin").stat().st_mtime >= before
        with open(mp / "sub" / "moved.bin", "r+b") as f:
            f.write(b"yy")
            os.fsync(f.fileno())
        assert (src / "sub" / "moved.bin").read_bytes() == b"yy" + b"x" * 8


def test_latency_and_bandwidth_lower_bounds(src):
    with DriveSim(src, open_ms=150, read_ms=0, mbps=None) as sim:
        t = time.monotonic()
        fd = os.open(sim.mountpoint / "tiny.txt", os.O_RDONLY)
        assert time.monotonic() - t >= 0.15
        os.close(fd)
        t = time.monotonic()
        os.listdir(sim.mountpoint / "sub")  # opendir pays the open latency too
        assert time.monotonic() - t >= 0.15

        sim.set(open_ms=0, read_ms=100)
        with open(sim.mountpoint / "tiny.txt", "rb") as f:
            t = time.monotonic()
            f.read()
            assert time.monotonic() - t >= 0.1

        sim.set(read_ms=0, mbps=2.0)  # 300 kB at 2 MB/s: at least 0.15 s
        assert (sim.params.open_ms, sim.params.read_ms, sim.params.mbps) == (0, 0, 2.0)
        t = time.monotonic()
        assert (sim.mountpoint / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert time.monotonic() - t >= 0.15


def test_counters(src):
    names = ["tiny.txt", "page.bin", "big.bin", "sub/a.txt"]
    with DriveSim(src, **FAST) as sim:
        os.listdir(sim.mountpoint)
        assert sim.stats()["opendirs"] >= 1
        sim.reset_stats()
        assert set(sim.stats().values()) == {0}
        for name in names:
            (sim.mountpoint / name).read_bytes()
        stats = sim.stats()
        assert stats["opens"] == len(names)
        assert stats["bytes_read"] == sum((src / n).stat().st_size for n in names)
        assert stats["reads"] >= len(names) + 2  # big.bin takes three requests of <= 128 KiB
        assert stats["writes"] == stats["bytes_written"] == stats["eio"] == stats["enotconn"] == 0


def test_eio_probability_one_fails_every_open_and_read(src):
    names = ["tiny.txt", "page.bin", "big.bin", "sub/a.txt"]
    with DriveSim(src, eio_read=1.0, **FAST) as sim:
        for name in names:
            with open(sim.mountpoint / name, "rb") as f, pytest.raises(OSError) as e:
                f.read()
            assert e.value.errno == errno.EIO
        assert sim.stats()["eio"] >= len(names)

        sim.set(eio_read=0.0, eio_open=1.0)
        for name in names:
            with pytest.raises(OSError) as e:
                open(sim.mountpoint / name, "rb")
            assert e.value.errno == errno.EIO

        sim.set(eio_open=0.0)
        sim.reset_stats()
        for name in names:
            assert (sim.mountpoint / name).read_bytes() == (src / name).read_bytes()
        assert sim.stats()["eio"] == 0


def test_eio_probability_between(src):
    with DriveSim(src, eio_open=0.5, seed=1, **FAST) as sim:
        failures = 0
        for _ in range(40):
            try:
                os.close(os.open(sim.mountpoint / "tiny.txt", os.O_RDONLY))
            except OSError as e:
                assert e.errno == errno.EIO
                failures += 1
        assert 5 < failures < 35
        assert sim.stats()["eio"] == failures


def test_a_file_just_written_may_not_open_though_stat_finds_it(src):
    """enoent_fresh: Drive's lag with what was just written. Old files always open; a file written
    through the mount a moment ago fails some opens with ENOENT while stat finds it."""
    os.utime(src / "tiny.txt", (1e9, 1e9))  # written long ago
    with DriveSim(src, enoent_fresh=0.5, seed=2, **FAST) as sim:
        for _ in range(10):
            os.close(os.open(sim.mountpoint / "tiny.txt", os.O_RDONLY))  # written before the mount
        new = sim.mountpoint / "new.bin"
        new.write_bytes(b"x" * 100)
        failures = 0
        for _ in range(20):
            try:
                os.close(os.open(new, os.O_RDONLY))
            except FileNotFoundError:
                failures += 1
                assert new.stat().st_size == 100
        assert 2 < failures < 18 and sim.stats()["enoent"] == failures
        time.sleep(1.1)  # no longer fresh
        for _ in range(10):
            os.close(os.open(new, os.O_RDONLY))


def test_disconnect_fails_with_enotconn_then_recovers(src):
    with DriveSim(src, **FAST) as sim:
        assert (sim.mountpoint / "tiny.txt").read_bytes() == b"hello drive\n"
        sim.disconnect(3600)  # down for longer than any load could delay the two requests below
        with pytest.raises(OSError) as e:
            (sim.mountpoint / "tiny.txt").read_bytes()
        assert e.value.errno == errno.ENOTCONN
        with pytest.raises(OSError) as e:
            os.listdir(sim.mountpoint / "sub")
        assert e.value.errno == errno.ENOTCONN
        t = time.monotonic()
        sim.disconnect(1.0)  # a new window replaces it: back by itself after 1 s

        def works() -> bool:
            try:
                return (sim.mountpoint / "tiny.txt").read_bytes() == b"hello drive\n"
            except OSError as e:
                assert e.errno == errno.ENOTCONN
                return False

        assert wait_for(works)
        assert time.monotonic() - t >= 1.0
        assert sim.stats()["enotconn"] >= 2


def test_enotconn_window_from_start(src):
    with DriveSim(src, enotconn_after=0.0, enotconn_for=3.0, **FAST) as sim:
        t = time.monotonic()
        with pytest.raises(OSError) as e:
            os.listdir(sim.mountpoint)
        assert e.value.errno == errno.ENOTCONN

        def works() -> bool:
            try:
                return "tiny.txt" in os.listdir(sim.mountpoint)
            except OSError:
                return False

        assert wait_for(works)
        assert time.monotonic() - t > 0.5  # a lower bound well inside the 3 s window


def test_readonly_refuses_writes(src):
    before = tree(src)
    with DriveSim(src, readonly=True, **FAST) as sim:
        mp = sim.mountpoint
        assert (mp / "tiny.txt").read_bytes() == b"hello drive\n"
        attempts = [
            lambda: open(mp / "new.txt", "wb"),
            lambda: open(mp / "tiny.txt", "r+b"),
            lambda: open(mp / "tiny.txt", "wb"),
            lambda: (mp / "dir").mkdir(),
            lambda: (mp / "tiny.txt").unlink(),
            lambda: os.rename(mp / "tiny.txt", mp / "t2.txt"),
            lambda: os.chmod(mp / "tiny.txt", 0o600),
            lambda: os.symlink("x", mp / "l2"),
            lambda: os.truncate(mp / "tiny.txt", 0),
        ]
        for attempt in attempts:
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS
    assert tree(src) == before


def test_with_unmounts_when_the_body_raises(src):
    class Boom(Exception):
        pass

    sim = DriveSim(src, **FAST)
    with pytest.raises(Boom), sim:
        f = open(sim.mountpoint / "tiny.txt", "rb")  # an open file makes a plain unmount busy
        pid = sim._proc.pid
        assert mounted(sim.mountpoint)
        raise Boom
    assert not mounted(sim.mountpoint)
    assert wait_for(lambda: process_gone(pid))
    assert not sim.mountpoint.exists()  # the temporary mountpoint is removed
    with pytest.raises(OSError) as e:  # the server is gone: the file left open is dead
        f.close()
    assert e.value.errno == errno.ENOTCONN
    sim.stop()  # a second stop is harmless


def test_start_stop_and_given_mountpoint(src, tmp_path):
    mp = tmp_path / "mnt"
    mp.mkdir()
    sim = DriveSim(src, mp, **FAST).start()
    try:
        assert sim.mountpoint == mp and mounted(mp)
        with pytest.raises(ValueError):
            sim.set(open_ms=-1)
        with pytest.raises(ValueError):
            sim.set(latency=3)
    finally:
        sim.stop()
    assert not mounted(mp) and mp.is_dir()  # a given mountpoint stays

    again = DriveSim(src, **FAST)  # a temporary mountpoint is made again on a second start
    for _ in range(2):
        with again:
            assert (again.mountpoint / "tiny.txt").read_bytes() == b"hello drive\n"
        assert not again.mountpoint.exists()


def test_start_errors_name_the_problem(src, tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(DriveSimError, match="not a directory"):
        DriveSim(src, tmp_path / "a-file", **FAST).start()
    with DriveSim(src, tmp_path / "made" / "mnt", **FAST) as sim:  # a missing mountpoint is made, as the CLI does
        assert (sim.mountpoint / "tiny.txt").exists()
    assert not (tmp_path / "made" / "mnt").exists()
    with pytest.raises(ValueError, match="eio_read"):
        DriveSim(src, eio_read=2.0)
    with pytest.raises(ValueError, match="not a directory"):
        DriveSim(tmp_path / "nothing-here")


def parse(argv: list[str]) -> DriveSimParams:
    return DriveSimParams.from_args(build_parser(argparse.ArgumentParser()).parse_args(["SRC", "MNT", *argv]))


def test_params_round_trip_the_command_line():
    assert parse([]) == DriveSimParams()  # the CLI's defaults are the dataclass's
    odd = DriveSimParams(open_ms=7.5, read_ms=0.0, mbps=None, eio_open=0.25, eio_read=1e-4, enotconn_after=1.5,
                         enotconn_for=2.0, readonly=True, seed=3)
    for params in (DriveSimParams(), odd, dataclasses.replace(odd, mbps=0.1, enotconn_after=None, readonly=False)):
        assert parse(params.argv()) == params
    assert parse(["--mbps", "0"]).mbps is None  # 0 on the command line: no cap
    assert odd.live() == {"open_ms": 7.5, "read_ms": 0.0, "mbps": None, "eio_open": 0.25, "eio_read": 1e-4,
                          "enoent_fresh": 0.0}


def test_params_are_checked(src):
    for bad, field in [({"open_ms": -1}, "open_ms"), ({"mbps": 0}, "mbps"), ({"eio_open": 1.5}, "eio_open"),
                       ({"enotconn_for": -1}, "enotconn_for")]:
        with pytest.raises(ValueError, match=field):
            DriveSimParams(**bad)
    with pytest.raises(ValueError, match="live parameters: open_ms, read_ms, mbps, eio_open, eio_read"):
        DriveSimParams().with_live(seed=1)  # fixed once mounted
    assert DriveSimParams().with_live(mbps=None).mbps is None
    with pytest.raises(TypeError, match="latency"):
        DriveSim(src, latency=3)
    sim = DriveSim(src, params=DriveSimParams(open_ms=5, seed=9), read_ms=0)  # keywords over the params
    assert sim.params == DriveSimParams(open_ms=5, read_ms=0, seed=9)
    assert sim._command()[-2:] == ["--control", str(os.getpid())]
    assert sim._command()[-2 - len(sim.params.argv()):-2] == sim.params.argv()


def test_server_exits_and_unmounts_when_parent_is_killed(src):
    child = textwrap.dedent(f"""
        import sys, time
        from colabfast.drivesim.simulator import DriveSim
        sim = DriveSim({str(src)!r}, open_ms=0, read_ms=0, mbps=None).start()
        print(sim.mountpoint, sim._proc.pid, flush=True)
        time.sleep(120)
    """)
    proc = subprocess.Popen(
        [sys.executable, "-c", child],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline().split()
        assert line, "the child did not mount"
        mountpoint, server = Path(line[0]), int(line[1])
        assert mounted(mountpoint)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    try:
        assert wait_for(lambda: not mounted(mountpoint))
        assert wait_for(lambda: process_gone(server))
    finally:
        if mounted(mountpoint):
            subprocess.run(["fusermount3", "-uz", str(mountpoint)])
        if mountpoint.is_dir():
            mountpoint.rmdir()


def test_cli_runs_in_foreground_and_unmounts_on_sigterm(src, tmp_path):
    mp = tmp_path / "cli-mnt"  # created by the CLI
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "colabfast.drivesim",
            str(src),
            str(mp),
            "--open-ms",
            "0",
            "--read-ms",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert wait_for(lambda: mounted(mp)), "the CLI did not mount"
        assert (mp / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
        assert env.drive_kind(mp) == "drivesim"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not mounted(mp)
        assert "mounted at" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        if mounted(mp):
            subprocess.run(["fusermount3", "-uz", str(mp)])


def test_cli_help_names_every_option():
    out = subprocess.run(
        [sys.executable, "-m", "colabfast.drivesim", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
    ).stdout
    for option in ("SRC", "MOUNTPOINT", "--open-ms", "--read-ms", "--mbps", "--eio-open", "--eio-read",
                   "--enotconn-after", "--enotconn-for", "--readonly", "--seed"):  # fmt: skip
        assert option in out
    assert "--control" not in out
