"""Shared fixtures. Under ``CI=true`` a skipped test fails: a green CI run means the real FUSE,
tmpfs and torchvision paths ran. Only tests marked ``cuda`` may skip there (CI has no GPU)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest

from colabfast.drive import exposing
from colabfast.drive import mounting as drive
from colabfast.drivesim import fs as drivesim
from colabfast.where import env, mounttable
from colabfast.where import standin as standin_module

CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# Ultralytics, the oracle of the YOLO tests, installs packages it wants at run time unless told not to
# (ultralytics/utils/__init__.py, YOLO_AUTOINSTALL), and looks online for fonts and weights.
os.environ.setdefault("YOLO_AUTOINSTALL", "false")
os.environ.setdefault("YOLO_OFFLINE", "true")


@pytest.fixture(autouse=True)
def _pil_image_open_restored():
    """Importing Ultralytics replaces ``PIL.Image.open`` for the whole process
    (``ultralytics/utils/patches.py``: a wrapper that, on a file Pillow cannot identify, installs and
    registers pi-heif): put Pillow's own back after each test, so that a YOLO test never changes what
    the tests after it see."""
    from PIL import Image

    before = Image.open
    yield
    Image.open = before


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    needs = item.get_closest_marker("cuda") or item.get_closest_marker("torchcodec")  # a GPU; a leg's torchcodec
    if CI and report.skipped and not hasattr(report, "wasxfail") and needs is None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI=true, where every non-CUDA path must run: {reason}"


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """A private stand-in root for Drive (``$COLABFAST_DRIVE_ROOT``, holding ``MyDrive/``) on a machine
    that is not Colab and asks for no simulator; whatever the test exposes of it is taken down after."""
    root = tmp_path / "standin"
    monkeypatch.setenv("COLABFAST_DRIVE_ROOT", str(root))
    monkeypatch.delenv(standin_module.SIM_VAR, raising=False)
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "no-colab"))
    (root / "MyDrive").mkdir(parents=True)
    yield root
    for mp in env.standin_mountpoints():
        if mp.startswith(str(tmp_path)):
            exposing.unexpose(mp)
    for m in reversed(mounttable.mounts()):  # what a failed test left mounted
        if m.mountpoint.startswith(str(tmp_path)):
            subprocess.run(["umount", "-l", m.mountpoint], check=False, capture_output=True)


@pytest.fixture
def small_tmpfs(request, tmp_path):
    """A tmpfs of 512 KiB mounted at ``tmp_path/small`` (another size, e.g. ``"8m"``, through
    ``@pytest.mark.parametrize("small_tmpfs", ["8m"], indirect=True)``); unmounted after."""
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root")
    size = getattr(request, "param", "512k")
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


@pytest.fixture
def need_fuse():
    """Skips (fails under CI=true) where the Drive simulator cannot mount: no FUSE or no mfusepy."""
    from colabfast.drivesim.fs import available

    ok, why = available()
    if not ok:
        pytest.skip(why)


def tree_files(root) -> dict:
    """{relative path: bytes} of every regular file under ``root``, skipping colabfast's own files."""
    from pathlib import Path

    root = Path(root)
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".colabfast-" not in p.name
    }


def assert_same_tree(a, b) -> None:
    """Every file under ``a`` exists under ``b`` with identical bytes, and vice versa."""
    fa, fb = tree_files(a), tree_files(b)
    assert sorted(fa) == sorted(fb)
    different = [rel for rel in fa if fa[rel] != fb[rel]]
    assert not different, f"files differ: {different[:5]}"


def assert_flat_over_epochs_with_breaks(loader, period: int, epochs: int = 50) -> None:
    """Iterate ``loader`` (batches on CUDA, images first) ``epochs`` times, leaving epoch ``e`` after
    batch ``e % period``: the thread count and ``torch.cuda.memory_allocated`` must stay flat."""
    import gc
    import threading

    import torch

    threads, allocated = None, []
    for epoch in range(epochs):
        for i, batch in enumerate(loader):
            batch[0].float().mean()
            if i == epoch % period:
                break
        gc.collect()
        torch.cuda.synchronize()
        if epoch == 2:
            threads = threading.active_count()
        allocated.append(torch.cuda.memory_allocated())
    assert threading.active_count() == threads
    assert max(allocated[5:]) <= allocated[4], allocated


@pytest.fixture
def local(tmp_path, monkeypatch):
    """This test's own cache and local disk (what a runtime loses when it ends); not in Colab."""
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "no-colab"))
    return tmp_path


@pytest.fixture
def my_drive(local, monkeypatch):
    """The stand-in Drive served by the Drive simulator at ``<tmp>/drive``; yields its MyDrive (the
    stand-in root's own MyDrive, written directly, is ``<tmp>/standin/MyDrive``)."""
    ok, why = drivesim.available()
    if not ok:
        pytest.skip(f"FUSE is not available: {why}")
    monkeypatch.setenv("COLABFAST_DRIVE_ROOT", str(local / "standin"))
    monkeypatch.setenv(standin_module.SIM_VAR, "open_ms=1,read_ms=0")
    yield drive.mount(local / "drive")
    for mp in env.standin_mountpoints():
        if mp.startswith(str(local)):
            exposing.unexpose(mp)
    for m in reversed(mounttable.mounts()):
        if m.mountpoint.startswith(str(local)):
            subprocess.run(["umount", "-l", m.mountpoint], check=False, capture_output=True)
