"""Issue 52, item 6: Kaggle as a place. Its datasets are under the read-only ``/kaggle/input``, its
writable folder is ``/kaggle/working``; here ``env.KAGGLE_ROOT`` is a folder of the test's own."""

from __future__ import annotations

import subprocess

import pytest

import colabfast as cf
from colabfast.testing.data import make_imagefolder
from colabfast.where import env
from colabfast.where.env import MIRRORS_FOLDER


@pytest.fixture
def kaggle(local, monkeypatch):
    """A Kaggle notebook: its variables set, its root at ``<tmp>/kaggle`` with input/ and working/."""
    root = local / "kaggle"
    (root / "working").mkdir(parents=True)
    make_imagefolder(root / "input" / "pets", classes=2, per_class=2, size=(16, 12))
    monkeypatch.setattr(env, "KAGGLE_ROOT", str(root))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.setattr(env, "drive_mounts", lambda: [])
    return root


def _read_only(folder):
    """``folder`` as a read-only bind mount, as Kaggle mounts /kaggle/input; skips where none can be made."""
    if not env.can_mount():
        pytest.skip("a read-only bind mount needs root with CAP_SYS_ADMIN")
    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(folder)], check=True)


def test_kaggle_is_seen_by_its_variables_or_its_input_folder(local, monkeypatch):
    monkeypatch.setattr(env, "KAGGLE_ROOT", str(local / "kaggle"))
    for name in env.KAGGLE_VARS:
        monkeypatch.delenv(name, raising=False)
    assert not env.in_kaggle()
    (local / "kaggle" / "input").mkdir(parents=True)
    assert env.in_kaggle() and env.platform() in ("kaggle", "colab")
    assert env.kaggle_working() == local / "kaggle" / "working"


def test_mirrors_go_to_kaggle_working_and_the_account_says_so(kaggle):
    ds = cf.open_dataset(kaggle / "input" / "pets", workers=0, progress=False)
    assert len(ds) == 4 and ds.classes == ["n01440764", "n01443537"]
    assert len(list((kaggle / "working" / MIRRORS_FOLDER).glob("*.h5"))) == 1
    assert not (kaggle / "input" / MIRRORS_FOLDER).exists()
    assert f"on Kaggle: mirrors go to {kaggle / 'working' / MIRRORS_FOLDER}" in ds.account


def test_a_read_only_destination_names_kaggle_working(kaggle):
    _read_only(kaggle / "input")
    try:
        with pytest.raises(cf.errors.NotWritable, match=r"cannot write a mirror into .*input: it is read-only.*"
                           r"dst='.*kaggle/working/pets.h5'") as caught:
            cf.pack(kaggle / "input" / "pets", kaggle / "input" / "pets.h5", progress=False)
        assert isinstance(caught.value, cf.Error) and isinstance(caught.value, OSError)
        with pytest.raises(cf.errors.NotWritable, match=r"mirrors='.*kaggle/working/colabfast-mirrors'"):
            cf.open_dataset(kaggle / "input" / "pets", mirrors=kaggle / "input" / "m", progress=False)
    finally:
        subprocess.run(["umount", "-l", str(kaggle / "input")], check=False)


def test_pack_into_a_folder_it_cannot_make_is_an_error_naming_it(local):
    (local / "taken").write_text("a file where the folder would be\n")
    make_imagefolder(local / "pets", classes=2, per_class=1, size=(16, 12))
    with pytest.raises(cf.errors.NotWritable, match=r"cannot write a mirror into .*taken.*Pass dst= a folder"):
        cf.pack(local / "pets", local / "taken" / "pets.h5", progress=False)
    assert not list(local.glob("taken*/*"))
