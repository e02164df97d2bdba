"""The stream cache's folder on local disk (colabfast.loading.streaming, colabfast.datasets.stream): the folders
of processes killed while they streamed deleted by the next open and by the doctor (never a live one),
cache_limit checked against the free space, a disk that fills mid-epoch one error naming the folder, block
files that no link redirects, and the raw errors of LOCAL_WORLD_SIZE and memory:// made colabfast's."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import colabfast as cf
from colabfast.diagnosis import doctor
from colabfast.loading.streaming import streams_of
from colabfast.testing import data
from colabfast.where import env

pytestmark = pytest.mark.usefixtures("local")  # this test's own work_dir

# Streams the mirror argv[1] in a loop's first batch, says where on stdout, then waits (for SIGKILL).
CHILD = """
import sys
import colabfast as cf
from colabfast.loading.streaming import streams_of
ds = cf.open_dataset(sys.argv[1], output="bytes", to="stream", cache_limit=1 << 24, progress=False)
next(iter(cf.DataLoader(ds, batch_size=16, shuffle=True)))
print(streams_of(ds)[0].directory.parent, flush=True)
sys.stdin.read()
"""


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("streamcache")
    src = data.make_imagefolder(root / "src", classes=4, per_class=90, size=(48, 40), vary=0.25)
    return cf.pack(src, root / "m.h5", shuffle=True, progress=False)


def _streaming_children(mirror, n):
    """``n`` processes streaming ``mirror`` (started together), each with its cache folder, once each has
    said it is streaming (a line on its stdout: no sleep)."""
    children = [subprocess.Popen([sys.executable, "-c", CHILD, str(mirror)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True) for _ in range(n)]  # work_dir: the same TMPDIR
    out = []
    for child in children:
        folder = child.stdout.readline().strip()
        assert folder, "a child did not start streaming"
        out.append((child, Path(folder)))
    return out


def _kill(child):
    child.send_signal(signal.SIGKILL)  # a Colab kernel restart: no finalizer runs
    child.wait()
    child.stdout.close()
    child.stdin.close()


def test_the_folders_of_killed_processes_are_deleted_and_never_a_live_ones(mirror, monkeypatch):
    (dead, dead_folder), (live, live_folder) = _streaming_children(mirror, 2)
    try:
        mine = cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=1 << 24, progress=False)
        mine_folder = streams_of(mine)[0].directory.parent
        assert any(dead_folder.rglob("u*")), "the child streamed no block"
        _kill(dead)
        assert dead_folder.exists()  # what a kill -9 leaves
        again = cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=1 << 24, progress=False)
        assert not dead_folder.exists()  # deleted by the next open
        assert live_folder.exists() and mine_folder.exists()  # another live process's, and this one's
        assert any(live_folder.rglob("u*"))
        del again

        _kill(live)
        monkeypatch.setattr(env, "gpu", lambda: None)  # the doctor without its slow probes
        monkeypatch.setattr(env, "install_problems", lambda: [])
        text = doctor.describe()
        assert "deleted 1 stream cache folder" in text and not live_folder.exists()
        assert mine_folder.exists()
        del mine
    finally:
        for child in (dead, live):
            _kill(child)


def test_a_cache_limit_above_the_free_space_is_refused_with_the_most_that_fits(mirror, monkeypatch):
    monkeypatch.setattr(env, "disk_free", lambda path: 10 << 20)
    with pytest.raises(cf.CacheLimitError, match=r"10\.5 MB free\. Pass cache_limit=10485760 or less"):
        cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=11 << 20, progress=False)
    assert not any((env.work_dir() / ".colabfast-stream").glob("m-*"))  # nothing left of the refused one
    ds = cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=10 << 20, progress=False)
    assert streams_of(ds)[0].limit == 10 << 20
    from colabfast.loading.streaming import limit_for

    folder = env.work_dir()
    assert limit_for(folder, 5 << 20, drivefs=True)[0] == 5 << 20  # Drive's own cache takes as much again
    with pytest.raises(cf.CacheLimitError, match="Drive's own cache takes as much again. Pass cache_limit=5242880"):
        limit_for(folder, (5 << 20) + 1, drivefs=True)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert limit_for(folder, None) == ((10 << 20) // 8, "half the local disk's free space, shared by 4 local ranks")
    with pytest.raises(cf.CacheLimitError, match="shared by 4 local ranks. Pass cache_limit=2621440 or less"):
        limit_for(folder, 3 << 20)


def test_a_disk_that_fills_up_mid_epoch_is_one_error_naming_the_folder(mirror, tmp_path, monkeypatch):
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    ram = tmp_path / "ram"
    ram.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ram)], check=True)
    try:
        monkeypatch.setattr(env, "work_dir", lambda: ram)
        ds = cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=2 << 20, progress=False)
        (cache,) = streams_of(ds)
        cache._warming.join()
        fd = os.open(ram / "filler", os.O_WRONLY | os.O_CREAT)  # something else fills the disk
        try:
            while os.write(fd, bytes(cache.page)):
                pass
        except OSError:
            os.ftruncate(fd, os.fstat(fd).st_size - 2 * cache.page)  # but 2 pages: room for the plan's file
        os.close(fd)
        assert 0 < env.disk_free(ram) < min(cache.disk)  # room for the plan's file, not for one block
        with pytest.raises(cf.NotEnoughSpace, match=f"{cache.directory}: the local disk filled up while streaming"):
            for _ in cf.DataLoader(ds, batch_size=16, shuffle=True):
                pass
        assert not list(cache.directory.glob(".u*"))  # the partial block is gone
        del ds, cache
    finally:
        subprocess.run(["umount", "-l", str(ram)], check=False)


def test_block_files_are_made_in_a_private_folder_and_no_link_redirects_them(mirror, tmp_path):
    victim = tmp_path / "victim"
    victim.write_bytes(b"mine")
    ds = cf.open_dataset(mirror, output="bytes", to="stream", cache_limit=1 << 24, progress=False)
    (cache,) = streams_of(ds)
    cache._warming.join()
    (cache.directory / f".u{cache.unit}-0.part").symlink_to(victim)  # planted where unit 0 is written
    handle = cache.source.open()
    try:
        cache._fetch_unit(handle, 0)
    finally:
        cache.source.close(handle)
    assert victim.read_bytes() == b"mine"
    for folder in (cache.directory, cache.directory.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    block = cache.directory / f"u{cache.unit}-0"
    assert not block.is_symlink() and block.stat().st_size == cache.sizes[0]
    with open(mirror, "rb") as f:  # the mirror's image data of the block's samples, as stored
        f.seek(cache.data_offset + int(cache.bounds[0]))
        assert block.read_bytes() == f.read(int(cache.sizes[0]))


def test_a_non_integer_local_world_size_is_refused_naming_it(mirror, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")
    with pytest.raises(cf.CacheLimitError, match="LOCAL_WORLD_SIZE='two' is not a whole number"):
        cf.open_dataset(mirror, output="bytes", to="stream", progress=False)
    assert not any((env.work_dir() / ".colabfast-stream").glob("m-*"))


def test_a_memory_url_says_why_it_cannot_stream(mirror):
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/colabfast-test/m.h5", mirror.read_bytes())
    try:
        with pytest.raises(cf.errors.StageRefused, match="memory:// .* cannot be streamed"):
            cf.open_dataset("memory://colabfast-test/m.h5", output="bytes", to="stream", progress=False)
    finally:
        fs.rm("/colabfast-test/m.h5")
