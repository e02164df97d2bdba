"""colabfast.where.env under faked markers: Colab/Kaggle detection, a faked mount table with every Drive
client (colabfast.where.mounttable parses it: test_mounttable.py), where a path lives, the stand-in's forms
and machine facts."""

from __future__ import annotations

import os
import shutil
import sys
import types

import pytest

from colabfast.where import codec, env, mounttable
from colabfast.where import standin as standin_module
from colabfast.where.env import DriveMount

MOUNTINFO = r"""22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=6094848k
40 22 0:50 / /content/drive rw,nosuid,nodev,relatime shared:20 - fuse.drive drive rw,user_id=0,group_id=0
41 22 0:51 / /gdrive rw,nosuid,nodev - fuse.google-drive-ocamlfuse google-drive-ocamlfuse rw,user_id=0
42 22 0:52 / /tmp/sim rw,nosuid,nodev - fuse colabfast-drivesim rw,user_id=0
43 22 253:16 / /mnt/My\040Data rw,relatime - ext4 /dev/vdb rw
44 22 0:53 / /mnt/remote rw,nosuid,nodev - fuse.sshfs user@host:/data rw,user_id=0
"""


@pytest.fixture
def fake_table(tmp_path, monkeypatch):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    monkeypatch.setattr(mounttable, "MOUNTINFO", str(path))


def test_colab_is_detected_by_its_marker_file_only(tmp_path, monkeypatch):
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "hostname"))
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab_20250101")  # also set on Kaggle: no proof
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    assert not env.in_colab()
    assert env.platform() in ("jupyter", "python")
    (tmp_path / "hostname").write_text("colab-vm\n")
    assert env.in_colab() and env.platform() == "colab"


def test_kaggle(tmp_path, monkeypatch):
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "absent"))
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    assert env.platform() == "kaggle"


def test_ram_and_fuse_from_the_mount_table(fake_table):
    assert env.is_ram("/dev/shm/colabfast") and not env.is_ram("/content/drive/MyDrive")
    assert env.is_fuse("/gdrive/x") and not env.is_fuse("/mnt/My Data/x")


@pytest.mark.parametrize(
    "path, kind",
    [
        ("/content/drive/MyDrive/data", "drivefs"),
        ("/content/drive", "drivefs"),
        ("/gdrive/My Drive/x", "ocamlfuse"),
        ("/tmp/sim/MyDrive", "drivesim"),
        ("/mnt/My Data/x", None),
        ("/usr/lib", None),
    ],
)
def test_drive_kind_from_the_mount_table(fake_table, standin, path, kind):
    assert env.drive_kind(path) == kind


@pytest.mark.parametrize(
    "path, where",
    [
        ("/content/drive/MyDrive/data", "drivefs"),
        ("/gdrive/My Drive/x", "ocamlfuse"),
        ("/tmp/sim/MyDrive", "drivesim"),
        ("/mnt/remote/x", "fuse"),
        ("/dev/shm/colabfast", "ram"),
        ("/mnt/My Data/x", "disk"),
        ("/usr/lib", "disk"),
    ],
)
def test_storage_says_where_a_path_lives(fake_table, standin, path, where):
    assert env.storage(path) == where
    assert env.storage(standin / "MyDrive" / "data") == "standin"


def test_drive_mounts_lists_every_client(fake_table, standin):
    assert env.drive_mounts() == [
        DriveMount("/content/drive", "drivefs"),
        DriveMount("/gdrive", "ocamlfuse"),
        DriveMount("/tmp/sim", "drivesim"),
    ]


def test_standin_forms(standin, tmp_path):
    assert env.drive_kind(standin / "MyDrive" / "data") == "standin"
    links = tmp_path / "drive"
    links.mkdir()
    (links / "MyDrive").symlink_to(standin / "MyDrive")
    assert standin_module.form(links) == "links"
    assert env.drive_kind(links) == "standin"
    assert standin_module.form(tmp_path) is None and env.drive_kind(tmp_path) is None
    alias = tmp_path / "alias"
    alias.symlink_to(links)
    assert standin_module.form(alias) is None  # a symlinked mountpoint is never followed


def test_standin_mountpoints_come_from_the_registry(standin, tmp_path):
    links, gone = tmp_path / "drive", tmp_path / "gone"
    links.mkdir()
    (links / "MyDrive").symlink_to(standin / "MyDrive")
    (standin / standin_module.REGISTRY).write_text(f"{links}\n{gone}\n")
    assert env.standin_mountpoints() == [str(links)]
    assert DriveMount(str(links), "standin") in env.drive_mounts()


def test_the_registry_is_written_and_read_in_standin_only(standin, tmp_path):
    """One owner: colabfast.standin records where mount() exposed the stand-in and reads it back (env
    asks it), rewriting the registry through a temporary name so a reader never sees half of it."""
    registry = standin_module.REGISTRY
    links = tmp_path / "drive"
    links.mkdir()
    (links / "MyDrive").symlink_to(standin / "MyDrive")
    standin_module.register(str(links))
    standin_module.register(str(tmp_path / "gone"))
    standin_module.register(str(links))  # once only
    assert (standin / registry).read_text() == f"{links}\n{tmp_path / 'gone'}\n"
    assert standin_module.registered() == [str(links), str(tmp_path / "gone")]
    assert env.standin_mountpoints() == [str(links)]
    standin_module.unregister(str(links))
    assert (standin / registry).read_text() == f"{tmp_path / 'gone'}\n"
    assert env.standin_mountpoints() == []
    assert [p.name for p in standin.iterdir() if p.name.startswith(registry)] == [registry]


def test_standin_root_and_folders(tmp_path, monkeypatch):
    monkeypatch.delenv("COLABFAST_DRIVE_ROOT", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert standin_module.root() == tmp_path / "colabfast-drive"
    assert env.drivefs_dir() == tmp_path / ".config" / "Google" / "DriveFS"
    monkeypatch.delenv("COLABFAST_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert env.cache_dir() == tmp_path / ".cache" / "colabfast"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_dir() == tmp_path / "xdg" / "colabfast"
    monkeypatch.setenv("COLABFAST_CACHE", str(tmp_path / "c"))
    assert env.cache_dir() == tmp_path / "c"


def test_machine_facts(monkeypatch):
    assert env.recommended_num_workers() == env.cpu_count() >= 1
    if os.path.exists("/dev/shm"):
        assert env.shm_size() == shutil.disk_usage("/dev/shm").total
    assert env.has_fuse() == os.path.exists("/dev/fuse")
    monkeypatch.setattr(env, "is_root", lambda: False)
    assert env.can_mount() is False


def test_can_mount_reads_the_capability(monkeypatch, tmp_path):
    monkeypatch.setattr(env, "is_root", lambda: True)
    with open("/proc/self/status") as f:
        cap = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    assert env.can_mount() == bool(cap >> 21 & 1)


def test_gpu_falls_back_to_nvml(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert env.gpu() is None
    assert codec.gpu_decode_available() is False
    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetHandleByIndex=lambda i: "h0",
        nvmlDeviceGetName=lambda h: b"Tesla T4",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=15_843_721_216),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    assert env.gpu() == {"name": "Tesla T4", "memory": 15_843_721_216}


@pytest.mark.cuda
def test_gpu_decoder_on_a_real_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    assert env.gpu()["memory"] > 0
    assert codec.gpu_decode_available() is True
