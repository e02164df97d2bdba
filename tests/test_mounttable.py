"""colabfast.where.mounttable: /proc/self/mountinfo parsed (escapes, malformed lines, no table at all) and
the mount that holds a path (the longest mountpoint, the latest of equals, through symlinks)."""

from __future__ import annotations

import os

import pytest

from colabfast.where import mounttable
from colabfast.where.mounttable import Mount

MOUNTINFO = r"""22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /dev/shm rw,nosuid,nodev shared:5 - tmpfs tmpfs rw,size=6094848k
40 22 0:50 / /content/drive rw,nosuid,nodev,relatime shared:20 - fuse.drive drive rw,user_id=0,group_id=0
42 22 0:52 / /tmp/sim rw,nosuid,nodev - fuse colabfast-drivesim rw,user_id=0
43 22 253:16 / /mnt/My\040Data rw,relatime - ext4 /dev/vdb rw
44 22 253:17 / /mnt/back\134slash rw,relatime - ext4 /dev/vdc rw
not a mount line
45 43 0:60 / /mnt/My\040Data/inner rw - tmpfs tmpfs rw
46 22 0:61 / /content/drive rw,nosuid,nodev - fuse.sshfs host:/x rw
"""


@pytest.fixture
def table(tmp_path, monkeypatch):
    path = tmp_path / "mountinfo"
    path.write_text(MOUNTINFO)
    monkeypatch.setattr(mounttable, "MOUNTINFO", str(path))


def test_the_table_is_parsed_in_mount_order(table):
    found = mounttable.mounts()
    assert found[:3] == [
        Mount("/", "ext4", "/dev/vda", "253:0"),
        Mount("/dev/shm", "tmpfs", "tmpfs", "0:26"),
        Mount("/content/drive", "fuse.drive", "drive", "0:50"),
    ]
    assert found[3].source == mounttable.DRIVESIM_SOURCE
    assert [m.mountpoint for m in found[4:6]] == ["/mnt/My Data", "/mnt/back\\slash"]  # octal escapes undone
    assert len(found) == 8  # the malformed line is skipped


def test_mount_of_takes_the_longest_and_latest_mountpoint(table):
    assert mounttable.mount_of("/mnt/My Data/inner/x.jpg").fstype == "tmpfs"
    assert mounttable.mount_of("/mnt/My Data/x.jpg").device == "253:16"
    assert mounttable.mount_of("/mnt/My Datax").mountpoint == "/"  # a prefix of the name is no parent
    assert mounttable.mount_of("/content/drive/MyDrive").fstype == "fuse.sshfs"  # mounted over drive
    assert mounttable.mount_of("/tmp/sim").source == "colabfast-drivesim"


def test_mount_of_resolves_symlinks(table, tmp_path):
    link = tmp_path / "shm"
    link.symlink_to("/dev/shm")
    assert os.path.realpath(link) == "/dev/shm"
    assert mounttable.mount_of(link / "data").mountpoint == "/dev/shm"


def test_no_table_means_no_mounts(tmp_path, monkeypatch):
    monkeypatch.setattr(mounttable, "MOUNTINFO", str(tmp_path / "absent"))
    assert mounttable.mounts() == [] and mounttable.mount_of("/usr") is None


def test_this_machines_table_holds_the_root():
    assert mounttable.mount_of("/") is not None and any(m.mountpoint == "/" for m in mounttable.mounts())
