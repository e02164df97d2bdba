"""colabfast.standin: the folder that plays Drive outside Colab, its registry of mountpoints, and the
forms it is exposed in (a folder of symlinks, a bind mount), on real folders and mounts. Colab's
messages around it (``Mounted at ...``) are colabfast.drive's, tested in test_drive and test_colab."""

from __future__ import annotations

import errno
import os
import stat

import pytest

import colabfast
from colabfast.drive import exposing, mounting
from colabfast.errors import DriveError, Error
from colabfast.where import env, mounttable
from colabfast.where import standin as standin_module


def test_root_is_the_variable_or_a_folder_in_home(tmp_path, monkeypatch):
    monkeypatch.delenv("COLABFAST_DRIVE_ROOT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert standin_module.root() == tmp_path / "colabfast-drive"
    monkeypatch.setenv("COLABFAST_DRIVE_ROOT", str(tmp_path / "elsewhere"))
    assert standin_module.root() == tmp_path / "elsewhere"


def test_prepare_root_lays_it_out_as_drive(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_DRIVE_ROOT", str(tmp_path / "fresh"))
    top = standin_module.prepare_root()
    assert top == tmp_path / "fresh" and sorted(os.listdir(top)) == ["My Drive", "MyDrive", "Shareddrives"]
    assert (top / "MyDrive").is_dir() and not (top / "MyDrive").is_symlink() and (top / "Shareddrives").is_dir()
    assert os.readlink(top / "My Drive") == "MyDrive"  # relative: it resolves through a bind mount too
    (top / "MyDrive" / "kept.txt").write_text("x")
    assert standin_module.prepare_root() == top and (top / "My Drive" / "kept.txt").read_text() == "x"


def test_the_registry_keeps_each_mountpoint_once_in_order(standin):
    registry = standin / standin_module.REGISTRY
    assert standin_module.registered() == []
    standin_module.register("/mnt/a")
    standin_module.register("/mnt/b")
    standin_module.register("/mnt/a")
    assert standin_module.registered() == ["/mnt/a", "/mnt/b"] and registry.read_text() == "/mnt/a\n/mnt/b\n"
    standin_module.unregister("/mnt/c")  # never registered: nothing changes
    standin_module.unregister("/mnt/a")
    assert standin_module.registered() == ["/mnt/b"]
    assert [p.name for p in standin.iterdir() if p.name.startswith(registry.name)] == [registry.name]  # no temporary


def test_the_registry_of_a_missing_root_is_empty(tmp_path, monkeypatch):
    monkeypatch.setenv("COLABFAST_DRIVE_ROOT", str(tmp_path / "missing"))
    assert standin_module.registered() == []


def test_a_folder_of_links_is_told_by_its_mydrive_link(standin, tmp_path):
    links, other, plain = tmp_path / "links", tmp_path / "other", tmp_path / "plain"
    for folder in (links, other, plain / "MyDrive"):
        folder.mkdir(parents=True)
    (links / "MyDrive").symlink_to(standin / "MyDrive")
    (other / "MyDrive").symlink_to(tmp_path / "plain" / "MyDrive")
    assert standin_module.is_links(links) and standin_module.is_links(str(links))
    assert not any(standin_module.is_links(f) for f in (other, plain, tmp_path / "none"))


# --- exposing it ------------------------------------------------------------------------------------


def test_expose_as_a_folder_of_links(standin, tmp_path):
    mp = tmp_path / "content" / "drive"  # its folders are created, as Colab's client does
    assert exposing.expose(str(mp), False, may_mount=False) == "links"
    assert sorted(os.listdir(mp)) == ["My Drive", "MyDrive", "Shareddrives"]
    for name, target in standin_module.LINKS.items():
        assert (mp / name).is_symlink() and os.path.realpath(mp / name) == os.path.realpath(standin / target)
    assert standin_module.is_links(mp) and standin_module.registered() == [str(mp)]
    assert env.drive_kind(mp / "MyDrive") == "standin" and env.standin_mountpoints() == [str(mp)]
    (mp / "My Drive" / "a.txt").write_text("through the link")
    assert (standin / "MyDrive" / "a.txt").read_text() == "through the link"
    (mp / "mine.txt").write_text("not colabfast's")
    (mp / "Shareddrives").unlink()
    (mp / "Shareddrives").symlink_to(tmp_path)  # a link of the user's, under one of its names
    mounting.flush_and_unmount()
    assert sorted(os.listdir(mp)) == ["Shareddrives", "mine.txt"]  # only its own links are taken down
    assert standin_module.registered() == [] and (standin / "MyDrive" / "a.txt").read_text() == "through the link"


def test_readonly_links_warn_that_they_cannot_enforce_it(standin, tmp_path):
    with pytest.warns(UserWarning, match=f"readonly=True is not enforced at {tmp_path / 'drive'}: .* symlinks"):
        assert exposing.expose(str(tmp_path / "drive"), True, may_mount=False) == "links"


def test_expose_by_a_bind_mount_where_it_may_mount(standin, tmp_path):
    if not env.can_mount():
        pytest.skip("a bind mount needs root with CAP_SYS_ADMIN")
    (standin / "MyDrive" / "kept.txt").write_text("x")
    mp, ro = tmp_path / "drive", tmp_path / "readonly"
    assert exposing.expose(str(mp), False, may_mount=True) == "bind"
    assert exposing.expose(str(ro), True, may_mount=True) == "bind"
    assert mounttable.mount_of(mp).mountpoint == str(mp) and mounttable.mount_of(ro).mountpoint == str(ro)
    assert (mp / "My Drive" / "kept.txt").read_text() == "x" and (ro / "MyDrive" / "kept.txt").read_text() == "x"
    (mp / "MyDrive" / "new.txt").write_text("y")
    assert (standin / "MyDrive" / "new.txt").read_text() == "y"
    with pytest.raises(OSError) as err:
        (ro / "MyDrive" / "no.txt").write_text("z")
    assert err.value.errno == errno.EROFS
    assert sorted(standin_module.registered()) == sorted([str(mp), str(ro)])
    mounting.flush_and_unmount()
    assert mounttable.mount_of(mp).mountpoint != str(mp) and os.listdir(mp) == [] and standin_module.registered() == []


def test_a_simulator_setting_it_cannot_use_is_refused(standin, tmp_path, monkeypatch):
    monkeypatch.setenv(standin_module.SIM_VAR, "open_ms=slow")
    with pytest.raises(DriveError, match=r"^COLABFAST_DRIVE_SIM='open_ms=slow': open_ms must be a number, e\.g\. "):
        exposing.expose(str(tmp_path / "drive"), False, may_mount=False)
    monkeypatch.setenv(standin_module.SIM_VAR, "no_such_option=1")
    with pytest.raises(DriveError, match="COLABFAST_DRIVE_SIM='no_such_option=1': the Drive simulator did not start"):
        exposing.expose(str(tmp_path / "drive"), False, may_mount=False)
    assert standin_module.registered() == [] and os.listdir(tmp_path / "drive") == []


# --- commands ---------------------------------------------------------------------------------------


def test_run_turns_a_failed_command_into_a_drive_error_with_the_next_step():
    assert exposing.run(["true"], "nothing") is None
    with pytest.raises(DriveError) as err:
        exposing.run(["sh", "-c", "echo oops >&2; exit 3"], "try again")
    assert str(err.value) == "`sh -c 'echo oops >&2; exit 3'` failed with exit status 3: oops; next: try again"
    with pytest.raises(DriveError, match="^`false` failed with exit status 1; next: look$"):
        exposing.run(["false"], "look")
    with pytest.raises(DriveError, match="^`colabfast-no-such-command` is not installed here; next: install it$"):
        exposing.run(["colabfast-no-such-command"], "install it")


def test_fusermount_is_whichever_is_installed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert exposing.fusermount() == "fusermount"  # none: the name, for an error that says so
    fuse3 = tmp_path / "fusermount3"
    fuse3.write_text("#!/bin/sh\n")
    fuse3.chmod(fuse3.stat().st_mode | stat.S_IXUSR)
    assert exposing.fusermount() == str(fuse3)
    fuse2 = tmp_path / "fusermount"
    fuse2.write_text("#!/bin/sh\n")
    fuse2.chmod(fuse2.stat().st_mode | stat.S_IXUSR)
    assert exposing.fusermount() == str(fuse2)


def test_drive_error_is_one_error_users_can_catch():
    assert colabfast.DriveError is DriveError
    assert issubclass(DriveError, Error) and issubclass(DriveError, RuntimeError)
