"""Packing straight to the destination when the local disk is short (colabfast.packing.placed): the
local disk used stays within the budget, the mirror is the one a local build makes, a folder three
times the local disk opens with to="stream" in a first runtime, and a killed write leaves no mirror."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import colabfast as cf
from colabfast.packing import folders
from colabfast.packing.placed import BUDGET, at_destination
from colabfast.testing import data, layouts
from colabfast.where import env

pytestmark = pytest.mark.fuse


def _tmpfs(path: Path, size: int) -> None:
    if not env.can_mount():
        pytest.skip("mounting a tmpfs needs root with CAP_SYS_ADMIN")
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)


def _short(local: Path, monkeypatch, size: int) -> Path:
    """The local disk (colabfast's work folder and cache: TMPDIR, $COLABFAST_CACHE) made a tmpfs of ``size`` bytes."""
    disk = local / "tmp"
    _tmpfs(disk, size)
    monkeypatch.setenv("COLABFAST_CACHE", str(disk / "cache"))
    return disk


@pytest.fixture
def short_disk(my_drive, local, monkeypatch):
    disk = _short(local, monkeypatch, BUDGET)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _flowers(my_drive: Path, per_class: int, name: str = "flowers") -> tuple[Path, Path]:
    """An ImageFolder on the simulated Drive: (its path there, its path in the stand-in root behind it)."""
    behind = my_drive.parent.parent / "standin" / "MyDrive" / name
    data.make_imagefolder(behind, classes=4, per_class=per_class, size=(160, 120), quality=95)
    return my_drive / name, behind


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _used(disk: Path) -> int:
    return int(subprocess.run(["df", "--output=used", "-B1", str(disk)], capture_output=True, text=True,
                              check=True).stdout.split()[-1])


def test_the_local_disk_holds_no_more_than_the_budget_while_packing_straight(short_disk, my_drive):
    src, behind = _flowers(my_drive, per_class=80)
    assert _size(behind) > 3 * BUDGET  # the local build needs three times the whole local disk
    dst = my_drive / "mirrors" / "flowers.h5"
    # The local disk is the budget: a byte written there past it fails the pack with ENOSPC.
    cf.pack(src, dst, progress=False)
    ds = cf.H5ImageFolder(dst)
    assert len(ds) == 320 and ds.classes == sorted(p.name for p in behind.iterdir())
    assert sorted(p.name for p in dst.parent.iterdir()) == ["flowers.h5"]  # no parts, no temporary name left
    assert _used(short_disk) <= BUDGET // 2


def _same_mirror(a: Path, b: Path, dataset: type) -> None:
    x, y = dataset(a), dataset(b)
    assert len(x) == len(y) > 0
    assert getattr(x, "classes", None) == getattr(y, "classes", None)
    for i in range(len(x)):
        (u, s), (v, t) = x[i], y[i]
        assert np.array_equal(np.asarray(u), np.asarray(v)) and s == t


@pytest.mark.parametrize("layout", ["imagefolder", "coco"])
def test_the_mirror_written_straight_equals_the_one_built_locally(my_drive, local, layout):
    behind = my_drive.parent.parent / "standin" / "MyDrive" / layout
    if layout == "coco":
        layouts.make_coco(behind, 300, size=(96, 72))
    else:
        data.make_imagefolder(behind, classes=3, per_class=100, size=(96, 72))
    src = my_drive / layout
    built = cf.pack(src, local / "built.h5", progress=False)
    with at_destination():
        straight = cf.pack(src, my_drive / f"{layout}.h5", progress=False)
    drop_in = cf.H5CocoDetection if layout == "coco" else cf.H5ImageFolder
    _same_mirror(built, straight, drop_in)


@pytest.fixture
def short_for_stream(my_drive, local, monkeypatch):
    disk = _short(local, monkeypatch, 2 << 20)
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_folder_three_times_the_local_disk_streams_in_a_first_runtime(short_for_stream, my_drive):
    from torchvision.datasets import ImageFolder
    from torchvision.transforms.functional import pil_to_tensor

    src, behind = _flowers(my_drive, per_class=160)
    assert _size(behind) > 3 * (2 << 20)
    ds = cf.open_dataset(src, to="stream", output="tensor", progress=False)
    assert "packed" in ds.account and "streamed from" in ds.account, ds.account
    truth = ImageFolder(str(behind))
    assert len(ds) == len(truth) and ds.classes == truth.classes
    seen = 0
    for images, targets in cf.DataLoader(ds, batch_size=16):
        for image, target in zip(images, targets):
            want, label = truth[seen]
            assert torch.equal(image, pil_to_tensor(want)) and int(target) == label
            seen += 1
    assert seen == len(truth)


def test_a_killed_straight_write_leaves_no_mirror_and_the_next_run_finishes_it(short_disk, my_drive, monkeypatch):
    src, behind = _flowers(my_drive, per_class=80)
    dst = my_drive / "mirrors" / "flowers.h5"
    writes = []
    real = folders.write_all

    def killed_on_the_second(fd, view, offset):
        writes.append(offset)
        if len(writes) == 2:
            raise KeyboardInterrupt  # the runtime stops while the mirror is half written at its destination
        return real(fd, view, offset)

    monkeypatch.setattr(folders, "write_all", killed_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        cf.pack(src, dst, progress=False)
    assert len(writes) == 2 and not dst.exists()
    left = sorted(p.name for p in dst.parent.iterdir())  # the build under its temporary name, and the parts
    assert left == [".flowers.h5.colabfast-pack", ".flowers.h5.colabfast-partial"], left
    with pytest.raises(cf.errors.NothingToOpen, match="does not exist"):
        cf.open_dataset(dst, progress=False)
    monkeypatch.setattr(folders, "write_all", real)
    cf.pack(src, dst, progress=False)  # it finishes what was left at the destination
    assert len(cf.H5ImageFolder(dst)) == 320
    assert sorted(p.name for p in dst.parent.iterdir()) == ["flowers.h5"]
