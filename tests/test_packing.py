"""colabfast.pack: layouts, stores, resizing, shuffling, bad files, resuming, atomic output."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import torch
from PIL import Image
from torchvision import transforms

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.mirror.verify import info
from colabfast.packing import PackError, common, folders, pack, resized_size
from colabfast.testing.data import add_broken_images, make_imagefolder, make_kitti


@pytest.fixture(scope="module")
def inet(tmp_path_factory) -> Path:
    return make_imagefolder(tmp_path_factory.mktemp("src") / "inet", classes=3, per_class=6, size=(96, 72),
                            vary=0.3, odd_files=True)


def test_layout_is_detected(inet, tmp_path, capsys):
    pack(inet, tmp_path / "a.h5", progress=True)
    assert "imagefolder layout, 25 images in 3 classes" in capsys.readouterr().out
    kitti = make_kitti(tmp_path / "kitti", train=3, test=2, size=(120, 40))
    pack(kitti, tmp_path / "k.h5", progress=False)
    assert info(tmp_path / "k.h5").layout == "kitti"
    flat = tmp_path / "flat"
    flat.mkdir()
    for p in sorted((inet / "n01440764").glob("*.JPEG"))[:3]:
        (flat / p.name).write_bytes(p.read_bytes())
    pack(flat, tmp_path / "f.h5", progress=False)
    assert info(tmp_path / "f.h5").layout == "files"


def test_files_layout_with_labels(inet, tmp_path):
    files = sorted((inet / "n01443537").glob("*.JPEG"))[:4]
    pack([(f, "dog" if i % 2 else "cat") for i, f in enumerate(files)], tmp_path / "f.h5", progress=False)
    ds = H5ImageFolder(tmp_path / "f.h5")
    assert ds.classes == ["cat", "dog"] and ds.targets == [0, 1, 0, 1]
    assert np.array_equal(np.asarray(ds[1][0]), np.asarray(Image.open(files[1]).convert("RGB")))


def test_resize_matches_torchvision(inet, tmp_path):
    pack(inet, tmp_path / "raw.h5", store="raw", image_size=40, progress=False)
    pack(inet, tmp_path / "exact.h5", store="raw", image_size=(32, 48), progress=False)
    ref = [Image.open(p).convert("RGB") for p, _ in H5ImageFolder(tmp_path / "raw.h5").samples]
    for i, img in enumerate(H5ImageFolder(tmp_path / "raw.h5")):
        assert np.array_equal(np.asarray(img[0]), np.asarray(transforms.Resize(40)(ref[i])))
    for i, img in enumerate(H5ImageFolder(tmp_path / "exact.h5", output="tensor")):
        assert img[0].shape == (3, 32, 48)
        assert np.array_equal(img[0].permute(1, 2, 0).numpy(), np.asarray(transforms.Resize((32, 48))(ref[i])))
    assert resized_size(500, 375, 256) == (341, 256) and resized_size(375, 500, 256) == (256, 341)


def test_resized_encoded_is_jpeg_at_quality(inet, tmp_path):
    pack(inet, tmp_path / "small.h5", image_size=32, quality=70, progress=False)
    ds = H5ImageFolder(tmp_path / "small.h5", output="bytes")
    data = ds[0][0].numpy().tobytes()
    assert data[:2] == b"\xff\xd8" and min(Image.open(__import__("io").BytesIO(data)).size) == 32
    assert info(tmp_path / "small.h5").quality == 70


def test_shuffle_stores_a_random_order_and_indexes_in_the_sources(inet, tmp_path):
    pack(inet, tmp_path / "plain.h5", progress=False)
    pack(inet, tmp_path / "shuf.h5", shuffle=True, seed=3, progress=False)
    plain, shuf = H5ImageFolder(tmp_path / "plain.h5", output="tensor"), H5ImageFolder(tmp_path / "shuf.h5",
                                                                                     output="tensor")
    with h5py.File(tmp_path / "shuf.h5", "r") as f:
        order = f["order"][:]
    assert sorted(order) == list(range(len(plain))) and list(order) != sorted(order)
    assert np.array_equal(order, np.random.default_rng(3).permutation(len(plain)))
    with h5py.File(tmp_path / "plain.h5", "r") as f:
        assert f["order"][:].tolist() == list(range(len(plain)))  # a folder is stored in its own order
    assert plain.reader.positions is None  # so indexing it maps nothing
    assert shuf.reader.positions.tolist() == np.argsort(order).tolist()
    # Issue 23 item 9: the file is shuffled, the dataset is not: index i is the source's sample i.
    assert shuf.targets == plain.targets and shuf.samples == plain.samples and shuf.imgs == plain.imgs
    assert shuf.source_paths == plain.source_paths
    for i in range(len(shuf)):
        assert np.array_equal(shuf[i][0].numpy(), plain[i][0].numpy())
        stored_at = int(shuf.reader.positions[i])  # the file holds sample i there
        assert torch.equal(shuf.reader.read(stored_at), plain.reader.read(i))


def test_broken_images_raise_listing_all_and_write_nothing(inet, tmp_path):
    src = tmp_path / "src"
    subprocess.run(["cp", "-r", str(inet), str(src)], check=True)
    bad = add_broken_images(src / "n01484850")
    with pytest.raises(PackError) as err:
        pack(src, tmp_path / "m.h5", progress=False)
    assert sorted(p for p, _ in err.value.failures) == sorted(map(str, bad))
    msg = str(err.value)
    assert "empty file (0 bytes)" in msg and "truncated" in msg and "not an image" in msg
    assert not (tmp_path / "m.h5").exists()
    with pytest.warns(UserWarning, match="skipped 3 unreadable files"):
        pack(src, tmp_path / "m.h5", on_error="skip", progress=False)
    mirror = info(tmp_path / "m.h5")
    unreadable = [s["path"] for s in mirror.skipped if not s["error"].startswith("hidden")]
    assert sorted(unreadable) == sorted(map(str, bad))
    assert mirror.samples[""] == 25
    assert "5 source files were skipped:" in str(mirror)  # and 2 hidden entries of odd_files


def test_rerun_is_free_and_changes_repack(inet, tmp_path):
    dst = pack(inet, tmp_path / "m.h5", progress=False)
    mtime = dst.stat().st_mtime_ns
    pack(inet, dst, progress=False)
    assert dst.stat().st_mtime_ns == mtime  # up to date: not rewritten
    pack(inet, dst, store="raw", progress=False)
    assert info(dst).store == "raw"


def test_interrupted_pack_resumes_from_its_parts(tmp_path, monkeypatch):
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=300, size=(32, 24))
    monkeypatch.setattr(common, "CHUNK", 50)
    encoded = []
    real = folders._encode_chunk

    def counting(items, *args):
        encoded.append(len(items))
        if len(encoded) == 5:
            raise KeyboardInterrupt  # the notebook's stop button, mid-pack
        return real(items, *args)

    monkeypatch.setattr(folders, "_encode_chunk", counting)
    with pytest.raises(KeyboardInterrupt):
        pack(src, tmp_path / "m.h5", workers=0, progress=False)
    assert not (tmp_path / "m.h5").exists()
    assert len(list((tmp_path / ".m.h5.colabfast-pack").glob("*.npz"))) == 4
    encoded.clear()
    monkeypatch.setattr(folders, "_encode_chunk", lambda items, *a: (encoded.append(len(items)), real(items, *a))[1])
    pack(src, tmp_path / "m.h5", workers=0, progress=False)
    assert sum(encoded) == 600 - 4 * 50  # only the unfinished parts were decoded again
    assert not (tmp_path / ".m.h5.colabfast-pack").exists()
    assert H5ImageFolder(tmp_path / "m.h5").targets == [0] * 300 + [1] * 300


def _allocated(folder: Path) -> int:
    """Bytes of disk the files under ``folder`` take (a sparse file counts only what was written)."""
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


def test_assembly_moves_the_parts_into_the_mirror_peak_disk_is_the_mirror_and_one_part(tmp_path, monkeypatch):
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=120, size=(64, 48))
    monkeypatch.setattr(common, "CHUNK", 20)
    out = tmp_path / "out"
    out.mkdir()
    peak, real = [0], folders.load_part

    def measuring(path):
        peak[0] = max(peak[0], _allocated(out))
        return real(path)

    monkeypatch.setattr(folders, "load_part", measuring)
    dst = pack(src, out / "m.h5", store="raw", workers=0, progress=False)
    mirror = dst.stat().st_size
    with h5py.File(dst) as f:
        images = f["images"].shape[0]
    part = images / 12  # 12 parts of 20 images
    assert images > 0.9 * mirror  # raw pixels: the mirror is its images
    assert peak[0] <= mirror + 2 * part + 256 * 1024, (peak[0], mirror, part)  # not parts + mirror (~2x)
    assert _allocated(out) == dst.stat().st_blocks * 512  # no parts left
    fresh = H5ImageFolder(dst, output="tensor")
    reference = transforms.functional.pil_to_tensor
    for i in (0, 19, 20, 239):  # first and last image of parts
        path, target = fresh.samples[i]
        x, y = fresh[i]
        assert y == target and torch_equal(x, reference(Image.open(path).convert("RGB")))


def torch_equal(a, b) -> bool:
    return a.shape == b.shape and bool((a == b).all())


def test_killed_assembly_continues_with_the_parts_not_yet_moved(tmp_path, monkeypatch):
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=60, size=(48, 32))
    monkeypatch.setattr(common, "CHUNK", 20)
    real, loaded = folders.load_part, []

    def dying(path):
        loaded.append(path.name)
        if len(loaded) == 6 + 3:  # 6 loads lay the mirror out, then 2 parts are moved: the kill
            raise KeyboardInterrupt
        return real(path)

    monkeypatch.setattr(folders, "load_part", dying)
    with pytest.raises(KeyboardInterrupt):
        pack(src, tmp_path / "m.h5", workers=0, progress=False)
    work = tmp_path / ".m.h5.colabfast-pack"
    assert len(list(work.glob("*.npz"))) == 4  # 2 of 6 moved into the unfinished mirror, and deleted
    assert not (tmp_path / "m.h5").exists()
    monkeypatch.setattr(folders, "load_part", real)
    monkeypatch.setattr(folders, "_encode_chunk", lambda *a: pytest.fail("nothing is decoded again"))
    dst = pack(src, tmp_path / "m.h5", workers=0, progress=False)
    assert not work.exists()
    ds = H5ImageFolder(dst, output="bytes", verify=True)
    for i in range(len(ds)):  # every image's bytes are the source file's, CRC-checked
        data, target = ds[i]
        assert data.numpy().tobytes() == Path(ds.samples[i][0]).read_bytes() and target == ds.samples[i][1]


def test_killed_pack_resumes(tmp_path):
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=400, size=(32, 24))
    dst = tmp_path / "m.h5"
    code = ("import colabfast.packing as p, colabfast.packing.common as c\n"
            "c.CHUNK = 40\n"
            f"p.pack({str(src)!r}, {str(dst)!r}, workers=1, progress=False)\n")
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    work = tmp_path / ".m.h5.colabfast-pack"
    try:
        for _ in range(600):
            if len(list(work.glob("*.npz"))) >= 3:
                break
            subprocess.run(["sleep", "0.05"])
        workers = psutil.Process(child.pid).children(recursive=True)
    finally:
        child.kill()
        child.wait()
    assert workers  # the decoding processes
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"pack workers outlived the killed pack: {alive}"
    assert not dst.exists() or info(dst).complete
    pack(src, dst, progress=False)
    ds = H5ImageFolder(dst, output="tensor")
    assert len(ds) == 800 and ds.targets == [0] * 400 + [1] * 400
    ref = Image.open(src / "n01443537" / "n01443537_7.JPEG").convert("RGB")
    i = ds.samples.index((str(src / "n01443537" / "n01443537_7.JPEG"), 1))
    assert np.array_equal(ds[i][0].permute(1, 2, 0).numpy(), np.asarray(ref))


def test_bad_arguments(inet, tmp_path):
    with pytest.raises(ValueError, match="store"):
        pack(inet, tmp_path / "m.h5", store="png")
    with pytest.raises(ValueError, match="image_size"):
        pack(inet, tmp_path / "m.h5", image_size=(10,))
    with pytest.raises(ValueError, match="on_error"):
        pack(inet, tmp_path / "m.h5", on_error="ignore")
    with pytest.raises(FileNotFoundError, match="missing does not exist: check the path"):
        pack(tmp_path / "missing", tmp_path / "m.h5")
    (tmp_path / "notes.txt").write_text("not a dataset")
    with pytest.raises(NotADirectoryError, match=r"notes.txt is a file, not a dataset folder or an archive.*\.zip"):
        pack(tmp_path / "notes.txt", tmp_path / "m.h5")


def test_space_preflight_counts_the_mirror_and_warns_about_drive_cache(inet, tmp_path, monkeypatch):
    from colabfast.layouts.images import is_image
    from colabfast.where import env

    src_bytes = sum(p.stat().st_size for p in inet.rglob("*") if is_image(p.relative_to(inet).as_posix()))
    monkeypatch.setattr(env, "disk_free", lambda path: int(0.9 * src_bytes))
    with pytest.raises(OSError, match=r"need .* \(.* of images for the mirror, and a margin\), have"):
        pack(inet, tmp_path / "full.h5", progress=False)
    assert not (tmp_path / "full.h5").exists()
    monkeypatch.setattr(env, "disk_free", lambda path: int(1.5 * src_bytes + 64e6))
    pack(inet, tmp_path / "fits.h5", progress=False)  # the parts move into the mirror: 1x and a margin fits
    monkeypatch.setattr(env, "drive_kind", lambda path: "drivefs")  # only Colab has DriveFS
    with pytest.warns(UserWarning, match=r"fills Drive's local cache.*refresh_drive\(\).*resumes"):
        pack(inet, tmp_path / "from-drive.h5", progress=False)


def test_a_second_pack_into_the_same_destination_waits_for_the_first(inet, tmp_path, capsys):
    import threading

    from filelock import FileLock

    from colabfast.packing import lock_path

    dst = tmp_path / "m.h5"
    lock = FileLock(lock_path(dst))  # what a running pack() holds
    lock.acquire()
    done = threading.Event()
    thread = threading.Thread(target=lambda: (pack(inet, dst, workers=0), done.set()))
    thread.start()
    for _ in range(200):
        if f"waiting for another process packing into {dst}" in capsys.readouterr().err:
            break
        subprocess.run(["sleep", "0.05"])
    else:
        raise AssertionError("the second pack() did not say it waits")
    assert not done.is_set() and not dst.exists() and not (tmp_path / ".m.h5.colabfast-pack").exists()
    lock.release()
    thread.join(60)
    assert done.is_set() and info(dst).complete and len(H5ImageFolder(dst)) == 25
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".m.h5")] == []  # no lock left beside it


def test_concurrent_packs_with_different_options_both_succeed_with_one_complete_mirror(tmp_path):
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=300, size=(48, 36))
    dst = tmp_path / "m.h5"
    children = [subprocess.Popen([sys.executable, "-c", "import colabfast.packing as p, colabfast.packing.common as c\n"
                                  f"c.CHUNK = 32\np.pack({str(src)!r}, {str(dst)!r}, image_size={size}, workers=1, "
                                  "progress=False)\n"], cwd=Path(__file__).parents[1], stderr=subprocess.PIPE)
                for size in (16, 24)]
    for child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err.decode()
    mirror = info(dst)
    assert mirror.complete and mirror.image_size in (16, 24) and mirror.samples[""] == 600
    assert len(H5ImageFolder(dst, output="tensor")[599][0].shape) == 3


def test_pack_killed_while_copying_onto_drive_reuses_its_verified_local_mirror(inet, tmp_path, monkeypatch):
    """The destination looks like Drive (a FUSE mount): the mirror is built locally, then copied."""
    dst, work = tmp_path / "drive" / "m.h5", tmp_path / "local"
    code = ("import os, signal, shutil\nfrom pathlib import Path\n"
            "import colabfast.where.env as e, colabfast.packing as p\n"
            f"e.is_fuse = lambda path: True\ne.work_dir = lambda: Path({str(work)!r})\n"
            "def half_then_die(source, target, length=0):\n"
            "    data = source.read()\n"
            "    target.write(data[: len(data) // 2])\n"
            "    target.flush()\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "shutil.copyfileobj = half_then_die\n"
            f"p.pack({str(inet)!r}, {str(dst)!r}, image_size=24, workers=0, progress=False)\n")
    child = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1])
    assert child.returncode == -9 and not dst.exists()
    built = list(work.rglob("mirror.h5"))
    assert len(built) == 1 and info(built[0]).complete  # verified, kept until the copy is done

    monkeypatch.setattr(common.env, "is_fuse", lambda path: True)
    monkeypatch.setattr(common.env, "work_dir", lambda: work)

    def rebuilt(*args):
        raise AssertionError("the images were decoded again")

    monkeypatch.setattr(folders, "_make_parts", rebuilt)
    pack(inet, dst, image_size=24, workers=0, progress=False)
    assert info(dst).complete and len(H5ImageFolder(dst)) == 25
    assert not list(work.rglob("mirror.h5"))


def test_retries_reach_the_reads(inet, tmp_path, monkeypatch):
    seen = []
    real = folders.retry
    monkeypatch.setattr(folders, "retry", lambda fn, retries: (seen.append(retries), real(fn, retries))[1])
    pack(inet, tmp_path / "m.h5", retries=2, workers=0, progress=False)
    assert seen and set(seen) == {2}


def test_mirror_is_format_version_2_with_checksums(inet, tmp_path):
    """Every dataset but `images` carries the CRC-32 of its bytes, each image its own, and the root
    attributes theirs: what load_index and verify check."""
    import zlib

    from colabfast.mirror.format import FORMAT_VERSION, attrs_crc32, header_crc32
    from colabfast.mirror.verify import verify

    dst = pack(inet, tmp_path / "m.h5", progress=False)
    with h5py.File(dst, "r") as f:
        assert f.attrs["format_version"] == FORMAT_VERSION == 2
        assert f.attrs["header_crc32"] == header_crc32(dict(f.attrs))
        offsets, blob = f["image_offsets"][()], f["images"][()]
        assert f["image_crc32"][()].tolist() == [zlib.crc32(blob[a:b]) for a, b in zip(offsets, offsets[1:])]
        for name, ds in f.items():
            if name != "images":
                attrs = dict(ds.attrs)
                assert attrs["crc32"] == attrs_crc32(attrs, zlib.crc32(ds[()])), name
    assert verify(dst) == len(offsets) - 1


def test_pack_writes_over_nothing_but_a_mirror_of_the_same_source(inet, tmp_path):
    """Issue 23 item 6: a user's file, or a mirror of another source, was replaced silently."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    with pytest.raises(ValueError, match=r"notes.txt exists and is not a readable colabfast mirror.*overwrite=True"):
        pack(inet, notes, progress=False)
    assert notes.read_text() == "mine" and not (tmp_path / ".notes.txt.colabfast-pack").exists()
    other = make_imagefolder(tmp_path / "other", classes=2, per_class=2, size=(16, 12))
    dst = pack(inet, tmp_path / "m.h5", progress=False)
    with pytest.raises(ValueError, match=rf"m.h5 is a mirror of {inet}, not of {other}.*overwrite=True"):
        pack(other, dst, progress=False)
    assert len(H5ImageFolder(dst)) == 25
    pack(inet, dst, image_size=16, progress=False)  # the same source with other options: rebuilt
    assert info(dst).image_size == 16
    assert pack(other, dst, overwrite=True, progress=False) == dst and len(H5ImageFolder(dst)) == 4
    assert pack(inet, notes, overwrite=True, progress=False) == notes and len(H5ImageFolder(notes)) == 25


def test_a_folder_as_destination_is_refused_before_anything_is_read(inet, tmp_path, monkeypatch):
    """Issue 23 item 7: it did all the work, then failed with [Errno 21] leaving its partial files."""
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(folders, "read_source", lambda *a: pytest.fail("the source was read"))
    for overwrite in (False, True):
        with pytest.raises(ValueError, match=rf"{out} is a folder: pack writes one mirror file.*{out}/inet.h5"):
            pack(inet, out, overwrite=overwrite, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_packs_into_one_destination_spelled_through_a_link_share_the_lock(inet, tmp_path, capsys):
    """Issue 23 F: two packs into one file through a symlinked alias deleted each other's parts."""
    import threading

    from filelock import FileLock

    from colabfast.packing import lock_path

    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    lock = FileLock(lock_path(tmp_path / "real" / "m.h5"))
    lock.acquire()
    done = threading.Event()
    thread = threading.Thread(target=lambda: (pack(inet, tmp_path / "alias" / "m.h5", workers=0), done.set()))
    thread.start()
    for _ in range(200):
        if "waiting for another process packing into" in capsys.readouterr().err:
            break
        subprocess.run(["sleep", "0.05"])
    else:
        raise AssertionError("a pack through the alias did not wait for the lock of the real path")
    lock.release()
    thread.join(60)
    assert done.is_set() and len(H5ImageFolder(tmp_path / "real" / "m.h5")) == 25


def test_pngs_with_transparency_on_1_bit_and_16_bit_grey_images_are_packed(tmp_path):
    """Issue 23 item 10: Pillow's 1_trns.png and i_trns.png loaded in torchvision but store="encoded"
    raised "transparency for RGB must be list or tuple"."""
    from torchvision.datasets import ImageFolder

    rng = np.random.default_rng(0)
    (tmp_path / "src" / "a").mkdir(parents=True)
    bits = Image.fromarray((rng.random((12, 10)) > 0.5).astype(np.uint8) * 255).convert("1")
    bits.save(tmp_path / "src" / "a" / "1_trns.png", transparency=0)
    grey = Image.fromarray(rng.integers(0, 65535, (12, 10), dtype=np.uint16)).convert("I;16")
    grey.save(tmp_path / "src" / "a" / "i_trns.png", transparency=3000)
    reference = ImageFolder(str(tmp_path / "src"))
    for store in ("encoded", "raw"):
        ds = H5ImageFolder(pack(tmp_path / "src", tmp_path / f"{store}.h5", store=store, progress=False))
        assert len(ds) == 2
        for (image, target), (expected, label) in zip(ds, reference):
            assert target == label and np.array_equal(np.asarray(image), np.asarray(expected))


def _unblock(fifo: Path) -> None:
    """Give a reader stuck on ``fifo`` (the code before the fix) an end of file, so the test ends."""
    import os

    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # no reader: nothing is stuck
        pass


def _finishes(fn, fifo: Path, seconds: float = 60):
    import threading

    outcome: list = []

    def target():
        try:
            outcome.append(fn())
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    stuck = thread.is_alive()
    _unblock(fifo)
    thread.join(10)
    assert not stuck, f"pack blocked on the FIFO {fifo}"
    return outcome[0]


@pytest.mark.parametrize("kind", ["label_2", "calib"])
def test_a_fifo_as_a_kitti_label_or_calib_file_is_refused_without_blocking(tmp_path, kind):
    """Issue 23 item D: a FIFO named like a label file blocked pack forever."""
    import os

    src = make_kitti(tmp_path / "kitti", train=3, test=0, size=(40, 20))
    fifo = src / "training" / kind / "000002.txt"
    fifo.unlink()
    os.mkfifo(fifo)
    error = _finishes(lambda: pack(src, tmp_path / "k.h5", workers=0, progress=False), fifo)
    assert isinstance(error, OSError) and "not a regular file but a FIFO" in str(error) and str(fifo) in str(error)
    assert not (tmp_path / "k.h5").exists()


def test_a_fifo_in_a_list_of_files_is_an_unreadable_file(inet, tmp_path):
    import os

    fifo = tmp_path / "x.jpg"
    os.mkfifo(fifo)
    files = sorted((inet / "n01440764").glob("n*.JPEG"))[:2] + [fifo]
    error = _finishes(lambda: pack(files, tmp_path / "f.h5", workers=0, progress=False), fifo)
    assert isinstance(error, PackError) and error.failures == [(str(fifo), error.failures[0][1])]
    assert "not a regular file but a FIFO" in error.failures[0][1]


def test_names_that_are_not_utf8_are_packed_as_torchvision_loads_them(tmp_path):
    """Issue 23 F: pack's fingerprint raised UnicodeEncodeError on a file name that is not UTF-8."""
    import os

    from torchvision.datasets import ImageFolder

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=2, size=(24, 16))
    first = sorted((src / "n01440764").iterdir())[0]
    os.rename(first, os.fsencode(src / "n01440764") + b"/\xff\xfe.JPEG")
    os.rename(src / "n01443537", os.fsencode(src) + b"/n\xe9")  # a Latin-1 class name
    reference = ImageFolder(str(src))
    ds = H5ImageFolder(pack(src, tmp_path / "m.h5", progress=False))
    assert ds.classes == reference.classes and ds.targets == reference.targets
    for (image, _), (expected, _) in zip(ds, reference):
        assert np.array_equal(np.asarray(image), np.asarray(expected))
    # The mirror's paths are UTF-8: an undecodable byte is kept as the text \xNN.
    assert f"{src}/n01440764/\\xff\\xfe.JPEG" in [p for p, _ in ds.samples]
    assert pack(src, tmp_path / "m.h5", progress=False) == tmp_path / "m.h5"  # up to date


def test_linked_folders_are_followed_as_torchvision_does_but_not_loops(tmp_path):
    """Issue 23 item 11: a symlinked sub-folder inside a class folder (here a second link to a folder
    of the tree) was left out; torchvision follows it (os.walk(followlinks=True))."""
    import os

    from torchvision.datasets import ImageFolder

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=2, size=(24, 16))
    outside = make_imagefolder(tmp_path / "outside", classes=1, per_class=2, size=(24, 16))
    a, b = sorted(p for p in src.iterdir())
    os.symlink(outside / "n01440764", a / "linked")  # a link that leaves the source
    os.symlink(a, b / "also")  # a second way to reach class a's folder, from class b
    reference = ImageFolder(str(src))
    assert len(reference) == (2 + 2) + (2 + (2 + 2))  # a: its own and linked's; b: its own and all of a's
    ds = H5ImageFolder(pack(src, tmp_path / "m.h5", progress=False))
    assert ds.samples == reference.samples
    for (image, _), (expected, _) in zip(ds, reference):
        assert np.array_equal(np.asarray(image), np.asarray(expected))
    os.symlink(a, a / "loop")  # torchvision would follow it until the path is too long
    ds = H5ImageFolder(pack(src, tmp_path / "m.h5", progress=False))
    assert ds.samples == reference.samples  # the loop is not followed, nothing else changes


def test_hidden_files_and_folders_are_reported_and_listed_in_the_mirror(tmp_path, capsys):
    """Issue 23 item 12: pack left out what torchvision reads (309 samples against 307, other
    classes) without a word."""
    from colabfast import cli

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=2, size=(24, 16))
    a = sorted(src.iterdir())[0]
    image = next(a.iterdir()).read_bytes()
    (src / ".ipynb_checkpoints").mkdir()  # torchvision: a class
    (a / "._x.jpg").write_bytes(image)
    (a / ".thumbs").mkdir()
    for name in ("1.jpg", "2.png", "notes.txt"):
        (a / ".thumbs" / name).write_bytes(image)
    with pytest.warns(UserWarning, match=r"left out 3 hidden files or folders that torchvision reads"):
        dst = pack(src, tmp_path / "m.h5", progress=False)
    assert len(H5ImageFolder(dst)) == 4
    assert {s["path"]: s["error"] for s in info(dst).skipped} == {
        str(src / ".ipynb_checkpoints"): "hidden folder, not taken for a class (torchvision's ImageFolder takes "
                                          "it for one)",
        str(a / "._x.jpg"): "hidden file, left out (torchvision's ImageFolder reads it)",
        str(a / ".thumbs"): "hidden folder, its 2 images left out (torchvision's ImageFolder reads them)",
    }
    capsys.readouterr()
    assert cli.main(["info", str(dst)]) == 0
    assert f"3 source files were skipped:\n    {src / '.ipynb_checkpoints'}: hidden folder" in capsys.readouterr().out


def test_an_unreadable_sub_folder_is_listed_not_a_raw_error(tmp_path):
    """Issue 23 F: one sub-folder that cannot be listed aborted pack with a raw PermissionError, even
    with on_error="skip". (Root reads any folder, so as root pack runs in a child without that right.)"""
    import json
    import os

    from test_staging import _without_root_read_override

    from colabfast.where import env

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=2, size=(24, 16))
    a = sorted(src.iterdir())[0]
    (a / "sub").mkdir()
    (a / "sub" / "x.jpg").write_bytes(next(a.glob("*.JPEG")).read_bytes())
    os.chmod(a / "sub", 0)
    code = ("import json, warnings, colabfast as cf\n"
            f"try:\n    cf.pack({str(src)!r}, {str(tmp_path / 'raise.h5')!r}, workers=0, progress=False)\n"
            "except cf.PackError as e:\n    print(json.dumps(e.failures))\n"
            "with warnings.catch_warnings(record=True) as w:\n"
            "    warnings.simplefilter('always')\n"
            f"    cf.pack({str(src)!r}, {str(tmp_path / 'skip.h5')!r}, on_error='skip', workers=0, progress=False)\n"
            "print(json.dumps([str(x.message) for x in w]))\n")
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             preexec_fn=_without_root_read_override if env.is_root() else None)
    finally:
        os.chmod(a / "sub", 0o755)
    assert run.returncode == 0, run.stderr
    failures, warned = map(json.loads, run.stdout.splitlines())
    assert failures == [[str(a / "sub"), "folder cannot be listed (Permission denied): its images are unknown"]]
    assert not (tmp_path / "raise.h5").exists()
    assert warned == [f"pack: skipped 1 unreadable files and folders, e.g. {a / 'sub'}: folder cannot be listed "
                      "(Permission denied): its images are unknown"]
    mirror = info(tmp_path / "skip.h5")
    assert mirror.samples[""] == 4 and [s["path"] for s in mirror.skipped] == [str(a / "sub")]


def test_the_jpeg_check_refuses_exactly_what_pil_refuses(monkeypatch):
    """encode_image checks a kept JPEG with libjpeg-turbo (simplejpeg, strict, 1/8 scale) and asks PIL
    only where that raises: truncated files fail as PIL's decode fails, a file with only a libjpeg
    warning (extraneous bytes before a marker, which PIL reads) is kept, and a whole file never
    reaches PIL's decoder."""
    import io

    from PIL import JpegImagePlugin

    from colabfast.mirror.encoding import encode_image
    from colabfast.testing.data import photo

    rng = np.random.default_rng(2)
    files = []
    for mode, progressive in (("RGB", False), ("RGB", True), ("L", False), ("L", True)):
        out = io.BytesIO()
        photo(96, 64, rng).convert(mode).save(out, "JPEG", quality=90, progressive=progressive)
        files.append(out.getvalue())

    def pil_refuses(data: bytes) -> bool:
        try:
            Image.open(io.BytesIO(data)).convert("RGB")
        except OSError:
            return True
        return False

    def refused(data: bytes) -> bool:
        try:
            encode_image(data, "encoded", None, 90)
        except OSError:
            return True
        return False

    for good in files:
        for cut in (len(good) // 3, len(good) // 2, len(good) - 40, len(good) - 3):
            assert refused(good[:cut]) == pil_refuses(good[:cut]) is True, cut
        sos = good.index(b"\xff\xda")  # stray bytes before the scan: a libjpeg warning, read by PIL
        stray = good[:sos] + b"\x00\x00" + good[sos:]
        assert not pil_refuses(stray)
        assert encode_image(stray, "encoded", None, 90)[0] == stray
    calls = []
    monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", lambda self, *a: calls.append(a))
    for good in files:
        assert encode_image(good, "encoded", None, 90) == (good, (64, 96, 3))
    assert not calls  # checked by libjpeg-turbo alone


def test_a_jpeg_corrupt_inside_is_found_by_the_check_at_one_eighth_scale(tmp_path):
    """Kept JPEGs are checked by decoding them at 1/8 scale (encode_image): all the entropy-coded data
    is still decoded, so a file corrupt inside, whole in length, fails where a full decode fails."""
    import io

    from colabfast.mirror.encoding import encode_image
    from colabfast.testing.data import encode, photo

    good = encode(photo(320, 240, np.random.default_rng(1)))
    assert encode_image(good, "encoded", None, 90) == (good, (240, 320, 3))

    def fails(fn) -> bool:
        try:
            fn()
        except OSError:
            return True
        return False

    caught = []
    for start in range(len(good) // 4, len(good) - 64, len(good) // 16):  # corruptions along the data
        bad = bytearray(good)
        for k in range(start, start + 48):
            bad[k] = 0xFF if k % 5 == 0 else bad[k] ^ 0x5A
        data = bytes(bad)
        full = fails(lambda d=data: Image.open(io.BytesIO(d)).convert("RGB"))  # what ImageFolder meets
        assert fails(lambda d=data: encode_image(d, "encoded", None, 90)) == full, start
        if full:
            caught.append(data)
    assert caught  # some corruption a full decode finds: the check found each one too
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "bad.jpg").write_bytes(caught[0])
    (tmp_path / "src" / "a" / "good.jpg").write_bytes(good)
    with pytest.raises(PackError, match="bad.jpg"):
        pack(tmp_path / "src", tmp_path / "m.h5", workers=0, progress=False)


def test_refusals_are_colabfast_errors_that_stay_value_errors(inet, tmp_path):
    """Issue 41 item 13: pack's refusals of bad arguments and destinations were plain ValueErrors,
    which ``except colabfast.Error`` missed. Each is a PackRefused: a PackError (so a colabfast.Error)
    and still a ValueError, naming what and the fix; nothing is written."""
    import colabfast as cf
    from colabfast.packing import PackRefused

    (tmp_path / "folder.h5").mkdir()
    (tmp_path / "mine.h5").write_text("my notes")
    tar = tmp_path / "photos.tar"
    with tarfile.open(tar, "w") as t:
        t.add(next(inet.rglob("*.JPEG")), "a/x.JPEG")
    refused = [
        (dict(store="png"), "store must be 'encoded' or 'raw'"),
        (dict(image_size=(10,)), "image_size must be a positive int"),
        (dict(on_error="ignore"), "on_error must be 'raise' or 'skip'"),
        (dict(quality=0), "quality must be 1..100"),
        (dict(labels="x.tar.gz"), "labels= and split= are for packing from an archive"),
        (dict(dst=tmp_path / "folder.h5"), "is a folder: pack writes one mirror file. Pass a file name"),
        (dict(dst=tmp_path / "mine.h5"), "is not a readable colabfast mirror: .* Pass another dst, or overwrite=True"),
        (dict(src=tar, layout="kaggle-train"), "layout 'kaggle-train' reads zip, and .*photos.tar is a tar"),
    ]
    for kwargs, message in refused:
        args = {"src": inet, "dst": tmp_path / "m.h5", "progress": False, **kwargs}
        with pytest.raises(PackRefused, match=message) as caught:
            pack(args.pop("src"), args.pop("dst"), **args)
        assert isinstance(caught.value, cf.Error) and isinstance(caught.value, ValueError)
        assert isinstance(caught.value, cf.PackError) and caught.value.failures == []
    assert not (tmp_path / "m.h5").exists() and (tmp_path / "mine.h5").read_text() == "my notes"


def _fill(path: Path, nbytes: int) -> None:
    """A file taking ``nbytes`` of its disk (allocated, not sparse)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.posix_fallocate(fd, 0, nbytes)
    finally:
        os.close(fd)


@pytest.mark.parametrize("small_tmpfs", ["80m"], indirect=True)
@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_a_pack_stopped_by_a_full_disk_resumes_once_space_is_back(small_tmpfs, kind, tmp_path, monkeypatch, capsys):
    """Issue 41 item 14: a disk that filled during pack kept the finished parts, but the re-run's
    free-space check asked for the whole mirror again, those parts not counted, and refused on the
    same disk once the space was back. It counts what it will reuse, and finishes the mirror; from a
    folder, and from an archive read as a stream."""
    from colabfast.packing import archives
    from colabfast.where import env

    src = make_imagefolder(tmp_path / "src", classes=2, per_class=16, size=(320, 240), vary=0.2)
    if kind == "archive":
        with tarfile.open(tmp_path / "src.tar", "w") as tar:
            tar.add(src, "src")
        src = tmp_path / "src.tar"
    src_bytes = sum(p.stat().st_size for p in (src.rglob("*.JPEG") if kind == "folder" else [src]))
    monkeypatch.setattr(common, "CHUNK", 4)  # 8 parts
    need = int(1.02 * src_bytes + 64e6)  # what the check asks of a fresh pack (see folders._preflight)
    _fill(small_tmpfs / "other-data", env.disk_free(small_tmpfs) - need - src_bytes // 4)  # room, and a little
    dst = small_tmpfs / "m.h5"
    module = folders if kind == "folder" else archives
    saved = []
    real = module.save_part

    def then_the_disk_fills(path, result):  # something else fills the disk halfway through (Drive's cache)
        real(path, result)
        saved.append(path)
        if len(saved) == 4:
            _fill(small_tmpfs / "filler", env.disk_free(small_tmpfs) - 4096)

    monkeypatch.setattr(module, "save_part", then_the_disk_fills)
    with pytest.raises(OSError) as full:
        pack(src, dst, workers=0, progress=False)
    assert full.value.errno == errno.ENOSPC
    work = small_tmpfs / ".m.h5.colabfast-pack"
    assert sorted(work.glob("*.npz")) == sorted(saved) and not list(work.glob("*colabfast-partial"))
    (small_tmpfs / "filler").unlink()  # the space is back
    assert env.disk_free(small_tmpfs) < need  # not room for a whole new mirror: only for the rest of this one
    monkeypatch.setattr(module, "save_part", real)
    pack(src, dst, workers=0, progress=True)
    out = capsys.readouterr().out
    assert ("resuming: 16 of 32 images were packed by an earlier run" if kind == "folder" else
            "resuming after the 16 images an earlier run packed") in out
    ds = H5ImageFolder(dst)
    assert len(ds) == 32 and ds.targets == [0] * 16 + [1] * 16
    assert not work.exists()


def test_pack_of_a_tree_of_split_folders_packs_the_split_asked_for(tmp_path):
    """PyTorch's transfer-learning tutorial tree, hymenoptera/{train,val}/{ants,bees}: pack() took its
    splits for two classes, 'train' and 'val', as ImageFolder does. Now it asks for the split, as
    open_dataset does, and packs that folder as the ImageFolder it is."""
    from torchvision.datasets import ImageFolder

    from colabfast.packing import SplitRefused

    root = tmp_path / "hymenoptera"
    make_imagefolder(root / "train", classes=["ants", "bees"], per_class=3, size=(40, 30), seed=1)
    make_imagefolder(root / "val", classes=["ants", "bees"], per_class=2, size=(40, 30), seed=2)
    with pytest.raises(SplitRefused) as caught:
        pack(root, tmp_path / "m.h5", progress=False)
    assert str(caught.value) == (f"{root}: several splits: 'train' (train/), 'val' (val/). Pass split= one of "
                                 f"them: pack({str(root)!r}, dst, split='train')")
    with pytest.raises(SplitRefused, match=r"no split 'test': there are 'train' \(train/\), 'val' \(val/\)"):
        pack(root, tmp_path / "m.h5", split="test", progress=False)
    assert not any(tmp_path.glob("m.h5*"))  # nothing written

    ds = H5ImageFolder(pack(root, tmp_path / "val.h5", split="val", progress=False))
    theirs = ImageFolder(root / "val")
    assert ds.classes == theirs.classes == ["ants", "bees"] and ds.targets == theirs.targets and len(ds) == 4
    assert [np.asarray(ds[i][0]).tobytes() for i in range(4)] == [np.asarray(theirs[i][0]).tobytes() for i in range(4)]
    # a layout given is read as given: the caller says the folders are classes
    forced = H5ImageFolder(pack(root, tmp_path / "forced.h5", layout="imagefolder", progress=False))
    assert forced.classes == ["train", "val"] and len(forced) == 10
