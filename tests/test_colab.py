"""colab_shim(): `from google.colab import drive` inside the block gives a stand-in with Colab's
signatures, messages, errors and check order (google/colab/drive.py), and leaves no trace after."""

from __future__ import annotations

import importlib
import inspect
import os
import sys

import pytest

from colabfast.testing import colab_shim
from colabfast.testing.colab import is_shim
from colabfast.where import env


@pytest.fixture
def colab(standin, monkeypatch):
    monkeypatch.setattr(env, "can_mount", lambda: False)  # folder of symlinks: nothing to unmount if a test fails
    with colab_shim():
        from google.colab import drive

        yield drive


def test_signatures_match_colabs(colab):
    # As in google/colab/drive.py.
    assert str(inspect.signature(colab.mount)) == "(mountpoint, force_remount=False, timeout_ms=120000, readonly=False)"
    assert str(inspect.signature(colab.flush_and_unmount)) == "(timeout_ms=86400000)"
    assert colab.__all__ == ["flush_and_unmount", "mount"]


def test_marked_never_colab(colab):
    import google.colab

    assert is_shim(google.colab) and is_shim(colab)
    assert "not Colab" in google.colab.__doc__
    assert env.in_colab() is False and env.platform() != "colab"


def test_mount_messages_and_paths(colab, tmp_path, capsys):
    mp = str(tmp_path / "drive")
    assert colab.mount(mp) is None
    colab.mount(mp)
    assert capsys.readouterr().out.splitlines() == [
        f"Mounted at {mp}",
        f'Drive already mounted at {mp}; to attempt to forcibly remount, call drive.mount("{mp}", force_remount=True).',
    ]
    with open(os.path.join(mp, "MyDrive", "train.csv"), "w") as f:
        f.write("a,b\n")
    with open(os.path.join(mp, "My Drive", "train.csv")) as f:
        assert f.read() == "a,b\n"
    assert os.path.isdir(os.path.join(mp, "Shareddrives"))
    colab.mount(mp, force_remount=True, timeout_ms=1000, readonly=False)
    assert capsys.readouterr().out == f"Mounted at {mp}\n"


def test_flush_and_unmount(colab, tmp_path, standin, capsys):
    colab.flush_and_unmount()
    assert capsys.readouterr().out == "Drive not mounted, so nothing to flush and unmount.\n"
    mp = tmp_path / "drive"
    colab.mount(str(mp))
    (mp / "MyDrive" / "ckpt.pt").write_bytes(b"weights")
    capsys.readouterr()
    assert colab.flush_and_unmount() is None
    assert capsys.readouterr().out == ""
    assert os.listdir(mp) == []  # the mountpoint stays, empty, as in Colab
    assert (standin / "MyDrive" / "ckpt.pt").read_bytes() == b"weights"
    colab.flush_and_unmount()
    assert capsys.readouterr().out == "Drive not mounted, so nothing to flush and unmount.\n"


def test_errors_in_colabs_words(colab, tmp_path):
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    afile = tmp_path / "file"
    afile.write_text("x")
    cases = [
        (str(tmp_path / "my drive"), "Mountpoint must not contain a space."),
        ("~/my drive", "Mountpoint must not contain a space."),  # checked before ~ is expanded
        (str(tmp_path / "a link"), "Mountpoint must not contain a space."),  # space wins over symlink
        (str(link), "Mountpoint must not be a symlink"),
        (str(full), "Mountpoint must not already contain files"),
        (str(afile), "Mountpoint must either be a directory or not exist"),
        (str(tmp_path / "missing" / "drive"), "Mountpoint must be in a directory that exists"),
    ]
    (tmp_path / "a link").symlink_to(tmp_path)
    for mountpoint, message in cases:
        with pytest.raises(ValueError) as err:
            colab.mount(mountpoint)
        assert str(err.value) == message, mountpoint
    assert os.listdir(full) == ["x"]


def test_mountpoint_must_be_a_str_as_in_colab(colab, tmp_path):
    with pytest.raises(TypeError):
        colab.mount(tmp_path / "drive")  # Colab's `' ' in mountpoint` fails on a Path too


def test_no_trace_after_the_block(standin):
    before = {name: sys.modules.get(name) for name in ("google", "google.colab", "google.colab.drive")}
    with colab_shim() as shim:
        assert importlib.import_module("google.colab.drive") is shim.drive
    assert {name: sys.modules.get(name) for name in before} == before
    if before["google.colab"] is None:
        with pytest.raises(ImportError):
            importlib.import_module("google.colab")


def test_existing_google_namespace_package_survives(standin, tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "google" / "otherlib"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    for name in [n for n in sys.modules if n == "google" or n.startswith("google.")]:
        monkeypatch.delitem(sys.modules, name)
    with colab_shim():
        from google.colab import drive  # noqa: F401
        from google.otherlib import VALUE

        assert VALUE == 42
    import google

    assert not hasattr(google, "colab")
    assert importlib.import_module("google.otherlib").VALUE == 42


def test_refused_on_real_colab(tmp_path, monkeypatch):
    marker = tmp_path / "hostname"
    marker.write_text("vm")
    monkeypatch.setattr(env, "COLAB_MARKER", str(marker))
    with pytest.raises(RuntimeError, match="this runtime is Colab"):
        with colab_shim():
            pass
