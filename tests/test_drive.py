"""colabfast.drive: the local stand-in (bind mount and folder of symlinks), mount() in a faked Colab,
refresh_drive()/flush_drive() for DriveFS (faked google.colab.drive), google-drive-ocamlfuse (fake
executables on PATH) and the stand-in."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from colabfast.drive import mounting as drive
from colabfast.errors import DriveError
from colabfast.where import env, mounttable
from colabfast.where import standin as standin_module
from colabfast.where.mounttable import Mount


@pytest.fixture
def links(standin, monkeypatch):
    """The stand-in as a folder of symlinks, as for a user without mount rights."""
    monkeypatch.setattr(env, "can_mount", lambda: False)
    return standin


def test_mount_as_links(links, tmp_path, capsys):
    mp = tmp_path / "drive"
    my_drive = drive.mount(str(mp))
    assert my_drive == mp / "MyDrive"
    assert capsys.readouterr().out == f"Mounted at {mp}\n"
    assert sorted(os.listdir(mp)) == ["My Drive", "MyDrive", "Shareddrives"]
    (my_drive / "data").mkdir()
    (my_drive / "data" / "a.txt").write_text("hello")
    assert (mp / "My Drive" / "data" / "a.txt").read_text() == "hello"
    assert (links / "MyDrive" / "data" / "a.txt").read_text() == "hello"
    assert standin_module.form(mp) == "links"
    assert env.drive_kind(my_drive / "data") == "standin"
    assert env.DriveMount(str(mp), "standin") in env.drive_mounts()


def test_mount_twice_and_force_remount(links, tmp_path, capsys):
    mp = str(tmp_path / "drive")
    drive.mount(mp)
    drive.mount(mp)
    drive.mount(mp, force_remount=True)
    assert capsys.readouterr().out.splitlines() == [
        f"Mounted at {mp}",
        f'Drive already mounted at {mp}; to attempt to forcibly remount, call drive.mount("{mp}", force_remount=True).',
        f"Mounted at {mp}",
    ]
    assert sorted(os.listdir(mp)) == ["My Drive", "MyDrive", "Shareddrives"]


def test_mount_binds_where_it_may_mount(standin, tmp_path):
    mp = tmp_path / "drive"
    (drive.mount(mp) / "kept.txt").write_text("x")
    is_mount = mounttable.mount_of(mp).mountpoint == str(mp)  # os.path.ismount misses binds within one file system
    if env.can_mount():
        assert is_mount and standin_module.form(mp) == "bind"
    else:
        assert not is_mount and standin_module.form(mp) == "links"
    assert env.drive_kind(mp / "MyDrive" / "kept.txt") == "standin"
    drive.flush_and_unmount()
    assert mounttable.mount_of(mp).mountpoint != str(mp) and os.listdir(mp) == []
    assert (standin / "MyDrive" / "kept.txt").read_text() == "x"


def test_readonly(standin, tmp_path):
    mp = tmp_path / "drive"
    if env.can_mount():
        my_drive = drive.mount(mp, readonly=True)
        with pytest.raises(OSError) as err:
            (my_drive / "new.txt").write_text("x")
        assert err.value.errno == errno.EROFS
    else:
        with pytest.warns(UserWarning, match="not enforced"):
            drive.mount(mp, readonly=True)


def test_mount_errors_are_colabs(links, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(ValueError, match="^Mountpoint must not already contain files$"):
        drive.mount(tmp_path / "full")
    with pytest.raises(ValueError, match="^Mountpoint must not contain a space.$"):
        drive.mount(tmp_path / "my drive")
    with pytest.raises(ValueError, match="^Mountpoint must be in a directory that exists: .*missing does not exist"):
        drive.mount(tmp_path / "missing" / "drive")  # Colab's words, then (outside Colab) the folder


def test_content_is_created_for_colab_paths(links, tmp_path, monkeypatch):
    content = tmp_path / "content"
    monkeypatch.setattr(env, "COLAB_CONTENT", str(content))
    assert drive.mount(content / "drive") == content / "drive" / "MyDrive"
    assert (content / "drive" / "MyDrive").is_dir()


def test_mount_in_colab_calls_colabs_drive(tmp_path, monkeypatch):
    calls = []
    fake = types.SimpleNamespace(mount=lambda *a, **k: calls.append((a, k)))
    monkeypatch.setitem(sys.modules, "google.colab", types.SimpleNamespace(drive=fake))
    monkeypatch.setitem(sys.modules, "google.colab.drive", fake)
    monkeypatch.setattr(env, "in_colab", lambda: True)
    assert drive.mount("/content/drive", readonly=True) == env.Path("/content/drive/MyDrive")
    assert calls == [(("/content/drive",), {"force_remount": False, "timeout_ms": 120000, "readonly": True})]


def test_flush_and_unmount_standin(links, tmp_path, capsys):
    drive.flush_and_unmount()
    assert capsys.readouterr().out == "Drive not mounted, so nothing to flush and unmount.\n"
    a, b = tmp_path / "a", tmp_path / "b"
    (drive.mount(a) / "f.txt").write_text("kept")
    drive.mount(b)
    capsys.readouterr()
    drive.flush_and_unmount()
    assert capsys.readouterr().out == ""  # Colab prints nothing on success
    assert os.listdir(a) == [] and os.listdir(b) == []
    assert (links / "MyDrive" / "f.txt").read_text() == "kept"
    assert env.standin_mountpoints() == []


def test_refresh_and_flush_on_the_standin(links, tmp_path, capsys):
    mp = tmp_path / "drive"
    (drive.mount(mp) / "f.txt").write_text("x")
    capsys.readouterr()
    report = drive.refresh_drive(mp)
    assert (report.kind, report.freed) == ("standin", 0)
    assert "nothing to do" in capsys.readouterr().out
    report = drive.flush_drive(mp, quiet=True)
    assert report.kind == "standin" and "synced" in str(report)
    assert capsys.readouterr().out == ""
    assert (mp / "MyDrive" / "f.txt").read_text() == "x"


def test_nothing_mounted(links, tmp_path):
    with pytest.raises(DriveError, match=f"no Google Drive is mounted at {tmp_path}; mount it first"):
        drive.refresh_drive(tmp_path)
    with pytest.raises(DriveError, match="mount it first"):
        drive.flush_drive(tmp_path)


@pytest.mark.fuse
def test_mount_through_the_simulator(standin, tmp_path, monkeypatch, capsys):
    pytest.importorskip("colabfast.drivesim")
    monkeypatch.setenv(standin_module.SIM_VAR, "open_ms=5,mbps=200")
    mp = tmp_path / "drive"
    my_drive = drive.mount(mp)
    assert capsys.readouterr().out == f"Mounted at {mp}\n"
    assert standin_module.form(mp) == "drivesim" and env.drive_kind(my_drive) == "drivesim"
    (my_drive / "a.txt").write_text("through FUSE")
    assert (mp / "My Drive" / "a.txt").read_text() == "through FUSE"
    assert drive.refresh_drive(mp, quiet=True).kind == "drivesim"
    drive.flush_and_unmount()
    assert standin_module.form(mp) is None and os.listdir(mp) == []
    assert (standin / "MyDrive" / "a.txt").read_text() == "through FUSE"


def test_bad_simulator_setting(links, tmp_path, monkeypatch):
    monkeypatch.setenv(standin_module.SIM_VAR, "open_ms=slow")
    with pytest.raises(DriveError, match="COLABFAST_DRIVE_SIM='open_ms=slow': open_ms must be a number"):
        drive.mount(tmp_path / "drive")


# --- DriveFS, with a fake google.colab.drive ------------------------------------------------------


class FakeColabDrive:
    """Colab's drive module as refresh/flush use it: records calls; Drive shows in the mount table
    while mounted."""

    def __init__(self, mountpoint, cache, monkeypatch):
        self.mountpoint, self.cache = str(mountpoint), cache
        self.calls, self.mounted = [], True
        self.flush_fails = self.mount_fails = False
        real = mounttable.mounts()
        monkeypatch.setattr(
            mounttable,
            "mounts",
            lambda: real + ([Mount(self.mountpoint, "fuse.drive", "drive", "0:98")] if self.mounted else []),
        )
        module = types.SimpleNamespace(flush_and_unmount=self.flush_and_unmount, mount=self.mount)
        monkeypatch.setitem(sys.modules, "google.colab", types.SimpleNamespace(drive=module))
        monkeypatch.setitem(sys.modules, "google.colab.drive", module)
        monkeypatch.setattr(env, "in_colab", lambda: True)

    def flush_and_unmount(self, timeout_ms=24 * 60 * 60 * 1000):
        self.calls.append(("flush_and_unmount", self.cache.exists()))
        self.flush_timeout_ms = timeout_ms
        if self.flush_fails:
            raise ValueError("flush_and_unmount failed")
        self.mounted = False

    def mount(self, mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
        self.calls.append(("mount", mountpoint, force_remount))
        self.options = {"timeout_ms": timeout_ms, "readonly": readonly}
        if self.mount_fails:
            raise ValueError("mount failed")
        self.mounted = True


@pytest.fixture
def drivefs(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "root"))
    cache = env.drivefs_dir()
    content = cache / "1234567890" / "content_cache" / "d42"
    content.mkdir(parents=True)
    (content / "blob").write_bytes(os.urandom(1 << 20))
    return FakeColabDrive(tmp_path / "drive", cache, monkeypatch)


def test_refresh_drivefs_flushes_before_dropping_the_cache(drivefs, capsys):
    report = drive.refresh_drive(os.path.join(drivefs.mountpoint, "MyDrive", "data"))  # a path inside will do
    assert drivefs.calls == [("flush_and_unmount", True), ("mount", drivefs.mountpoint, True)]
    assert not drivefs.cache.exists()
    assert report.kind == "drivefs" and report.freed >= 1 << 20
    out = capsys.readouterr().out
    assert f"removed the DriveFS cache {drivefs.cache} (1.0 MB)" in out and "mounted again" in out


def test_refresh_drivefs_keeps_the_cache_when_the_flush_fails(drivefs):
    """Issue 13: the flush waits at most 30 minutes (Colab's own default is a day), and a flush that
    fails or times out keeps the cache holding the unsynced writes, and says what to do."""
    drivefs.flush_fails = True
    advice = "did not finish within 30 minutes.*was kept.*colabfast.flush_drive\\(\\) again"
    with pytest.raises(DriveError, match=advice):
        drive.refresh_drive(drivefs.mountpoint, quiet=True)
    assert drivefs.flush_timeout_ms == 30 * 60 * 1000
    assert drivefs.cache.exists()
    assert [c[0] for c in drivefs.calls] == ["flush_and_unmount"]


def test_refresh_drivefs_says_how_to_mount_again(drivefs):
    drivefs.mount_fails = True
    with pytest.raises(DriveError, match=r"force_remount=True"):
        drive.refresh_drive(drivefs.mountpoint, quiet=True)
    assert not drivefs.cache.exists()


def test_flush_drivefs_keeps_the_cache(drivefs):
    report = drive.flush_drive(drivefs.mountpoint, quiet=True)
    assert [c[0] for c in drivefs.calls] == ["flush_and_unmount", "mount"]
    assert drivefs.cache.exists() and report.freed == 0


def test_refresh_and_flush_mount_again_with_the_users_options(drivefs):
    """Issue 13: they remounted with Colab's defaults, dropping readonly and timeout_ms."""
    drive.mount(drivefs.mountpoint, readonly=True, timeout_ms=600000)
    assert drivefs.options == {"timeout_ms": 600000, "readonly": True}
    drivefs.options = None
    drive.refresh_drive(drivefs.mountpoint, quiet=True)
    assert drivefs.options == {"timeout_ms": 600000, "readonly": True}
    drivefs.options = None
    drive.flush_drive(drivefs.mountpoint, quiet=True)
    assert drivefs.options == {"timeout_ms": 600000, "readonly": True}


def test_refresh_refuses_while_files_on_drive_are_open(drivefs):
    """Issue 13: a remount under a loader's open files kills its persistent workers (ENOTCONN)."""
    data = Path(drivefs.mountpoint) / "MyDrive" / "m.h5"
    data.parent.mkdir(parents=True)
    data.write_bytes(b"x" * 100)
    with open(data, "rb"):
        for call in (drive.refresh_drive, drive.flush_drive):
            with pytest.raises(DriveError, match=f"still has files open there:\n  {data} \\(pid {os.getpid()}"):
                call(drivefs.mountpoint, quiet=True)
    assert drivefs.calls == [] and drivefs.cache.exists()  # nothing was flushed, unmounted or dropped
    drive.refresh_drive(drivefs.mountpoint, quiet=True)  # closed: goes ahead
    assert not drivefs.cache.exists()


def test_open_files_of_child_processes_count(tmp_path):
    (tmp_path / "f").write_text("x")
    child = subprocess.Popen([sys.executable, "-c", f"f = open({str(tmp_path / 'f')!r}); import time; "
                              "print('open', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "open"
        assert drive.open_files_under(str(tmp_path)) == [f"{tmp_path / 'f'} (pid {child.pid}, a child process)"]
    finally:
        child.kill()
        child.wait()


def test_failures_on_drivefs_are_named_from_its_log(drivefs, tmp_path):
    """Issue 13: a persistent EIO on DriveFS is often Drive's download quota; its log says so."""
    inside = os.path.join(drivefs.mountpoint, "MyDrive", "data")
    eio = OSError(errno.EIO, "Input/output error")
    assert drive.failure_advice(inside, [eio]) is None  # no log: nothing specific to say
    log = env.drivefs_dir() / drive.DRIVEFS_LOG
    log.parent.mkdir(parents=True)
    log.write_text("2026-11-23 INFO ok\n2026-11-23 ERROR download failed: QUOTA_EXCEEDED (403)\n")
    assert "Drive download quota exceeded" in drive.failure_advice(inside, [eio])
    assert "copy the folder to your own Drive" in drive.failure_advice(inside, [eio])
    log.write_text("E QueryManager timed out after 60s\n")
    assert "timeout_ms=" in drive.failure_advice(inside, [eio])
    gone = OSError(errno.ENOTCONN, "Transport endpoint is not connected")
    assert "colabfast.mount(force_remount=True)" in drive.failure_advice(tmp_path, [gone])
    from colabfast.errors import StageError

    err = StageError(Path(inside), tmp_path / "dst", {"a.jpg": gone}, 3, drive.failure_advice(Path(inside), [gone]))
    assert "force_remount=True" in str(err) and "run stage() again" not in str(err)


def test_kaggle_gets_advice_instead_of_an_empty_drive(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(env, "in_colab", lambda: False)
    monkeypatch.setattr(env, "in_kaggle", lambda: True)
    with pytest.raises(DriveError, match="Kaggle dataset.*colabfast.fetch"):
        drive.mount(tmp_path / "drive")
    assert "Mounted at" not in capsys.readouterr().out and not (tmp_path / "drive").exists()


def test_outside_colab_one_line_names_the_standin(links, tmp_path, capsys):
    drive.mount(tmp_path / "drive")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(standin_module.root()) in err[0] and "not in Colab" in err[0]


# --- google-drive-ocamlfuse, with fake executables on PATH ---------------------------------------

FAKE_OCAMLFUSE = """\
import os, pathlib, shutil, sys, time
args = sys.argv[1:]
if os.environ.get("FAKE_SERVE"):  # the running client: serves until fusermount -u stops it
    time.sleep(60)
    sys.exit(0)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(["google-drive-ocamlfuse", *args]) + "\\n")
label = args[args.index("-label") + 1] if "-label" in args else "default"
if "-cc" in args:
    if os.environ.get("FAKE_CC_FAILS"):
        print("Error: cannot clear the cache: Permission denied", file=sys.stderr)
        sys.exit(2)
    cache = pathlib.Path.home() / ".gdfuse" / label / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    cache.mkdir(parents=True)
    sys.exit(0)
pathlib.Path(os.environ["FAKE_STATE"]).write_text(args[-1])
"""

FAKE_FUSERMOUNT = """\
import os, pathlib, signal, sys
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(" ".join(["fusermount", *sys.argv[1:]]) + "\\n")
state = pathlib.Path(os.environ["FAKE_STATE"])
if not state.exists() or state.read_text() != sys.argv[-1]:
    print(f"fusermount: entry for {sys.argv[-1]} not found in /etc/mtab", file=sys.stderr)
    sys.exit(1)
state.unlink()
pid = pathlib.Path(os.environ["FAKE_STATE"] + ".pid")
if pid.exists():
    os.kill(int(pid.read_text()), signal.SIGTERM)
"""


class FakeOcamlfuse:
    def __init__(self, tmp_path, monkeypatch):
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        for name, body in (("google-drive-ocamlfuse", FAKE_OCAMLFUSE), ("fusermount", FAKE_FUSERMOUNT)):
            exe = bin_dir / name
            exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
            exe.chmod(0o755)
        self.exe = str(bin_dir / "google-drive-ocamlfuse")
        self.log, self.state = tmp_path / "log", tmp_path / "mounted"
        self.mountpoint = str(tmp_path / "gdrive")
        os.mkdir(self.mountpoint)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        monkeypatch.setenv("FAKE_LOG", str(self.log))
        monkeypatch.setenv("FAKE_STATE", str(self.state))
        real = mounttable.mounts()
        entry = Mount(self.mountpoint, "fuse.google-drive-ocamlfuse", "google-drive-ocamlfuse", "0:97")
        monkeypatch.setattr(mounttable, "mounts", lambda: real + ([entry] if self.state.exists() else []))
        self.client = None

    def start(self, *argv):
        """Mount: leave a client process running with ``argv`` on its command line."""
        self.state.write_text(self.mountpoint)
        self.client = subprocess.Popen([self.exe, *argv, self.mountpoint], env={**os.environ, "FAKE_SERVE": "1"})
        (self.state.parent / "mounted.pid").write_text(str(self.client.pid))

    def cache(self, label):
        cache = env.Path(os.environ["HOME"]) / ".gdfuse" / label / "cache"
        cache.mkdir(parents=True)
        (cache / "file.bin").write_bytes(os.urandom(300_000))
        return cache

    def calls(self):
        return self.log.read_text().splitlines()

    def stop(self):
        if self.client is not None and self.client.poll() is None:
            self.client.kill()
            self.client.wait()


@pytest.fixture
def ocamlfuse(tmp_path, monkeypatch):
    fake = FakeOcamlfuse(tmp_path, monkeypatch)
    yield fake
    fake.stop()


def test_refresh_ocamlfuse_clears_its_cache_with_cc(ocamlfuse):
    cache = ocamlfuse.cache("work")
    ocamlfuse.start("-label", "work")
    report = drive.refresh_drive(ocamlfuse.mountpoint, quiet=True)
    mp = ocamlfuse.mountpoint
    assert ocamlfuse.calls() == [
        f"fusermount -u {mp}",
        "google-drive-ocamlfuse -cc -label work",
        f"google-drive-ocamlfuse -label work {mp}",  # mounted again with the client's own command line
    ]
    assert ocamlfuse.client.poll() is not None  # waited for the client to exit before clearing
    assert os.listdir(cache) == [] and report.freed >= 300_000
    assert env.drive_kind(mp) == "ocamlfuse"


def test_refresh_ocamlfuse_default_label(ocamlfuse):
    ocamlfuse.cache("default")
    ocamlfuse.state.write_text(ocamlfuse.mountpoint)  # mounted by a client this test cannot see
    drive.refresh_drive(ocamlfuse.mountpoint, quiet=True)
    mp = ocamlfuse.mountpoint
    assert ocamlfuse.calls() == [f"fusermount -u {mp}", "google-drive-ocamlfuse -cc", f"google-drive-ocamlfuse {mp}"]


def test_refresh_ocamlfuse_failure_raises_with_the_next_step(ocamlfuse, monkeypatch):
    cache = ocamlfuse.cache("default")
    ocamlfuse.start()
    monkeypatch.setenv("FAKE_CC_FAILS", "1")
    with pytest.raises(DriveError, match="exit status 2: Error: cannot clear the cache.*next: Drive is unmounted"):
        drive.refresh_drive(ocamlfuse.mountpoint, quiet=True)
    assert os.listdir(cache) == ["file.bin"]
    assert len(ocamlfuse.calls()) == 2  # not mounted again over a failed step


def test_flush_ocamlfuse_remounts_without_clearing(ocamlfuse):
    cache = ocamlfuse.cache("default")
    ocamlfuse.start()
    drive.flush_drive(ocamlfuse.mountpoint, quiet=True)
    mp = ocamlfuse.mountpoint
    assert ocamlfuse.calls() == [f"fusermount -u {mp}", f"google-drive-ocamlfuse {mp}"]
    assert os.listdir(cache) == ["file.bin"]
