"""colabfast.diagnosis.doctor: the report and its advice for data on Drive, in RAM and on local disk, with and
without a GPU, on a machine whose slow probes (GPU, Colab marker, RAM) are faked."""

from __future__ import annotations

import pytest

from colabfast.diagnosis import doctor
from colabfast.where import codec, env, mounttable
from colabfast.where.mounttable import Mount


@pytest.fixture
def quiet_machine(monkeypatch, tmp_path):
    """No GPU, no Colab, known RAM: describe() without slow probes."""
    monkeypatch.setattr(env, "gpu", lambda: None)
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "absent"))
    monkeypatch.setattr(env, "ram_available", lambda: 20 * 10**9)
    monkeypatch.setattr(env, "ram_headroom", lambda: 4 * 10**9)
    monkeypatch.setattr(env, "can_mount", lambda: True)


def fake_drive(monkeypatch, mountpoint, fstype="fuse.drive", source="drive"):
    real = mounttable.mounts()
    monkeypatch.setattr(mounttable, "mounts", lambda: [*real, Mount(str(mountpoint), fstype, source, "0:99")])


def test_describe_says_to_stage_data_on_drive(quiet_machine, monkeypatch, tmp_path, standin):
    mp = tmp_path / "drive"
    data = mp / "MyDrive" / "kitti"
    data.mkdir(parents=True)
    (data / "000000.png").write_bytes(b"x" * 5000)
    fake_drive(monkeypatch, mp)
    text = doctor.describe(data)
    assert f"your data is under {mp} (Google Drive (DriveFS))" in text
    assert f"colabfast.stage('{data}')" in text
    assert f"Google Drive (DriveFS) at {mp}" in text  # the Drive row
    assert "5.0 kB in 1 files" in text
    assert "colabfast.stage() puts it on local disk" in text  # outside Colab, "auto" never mounts a RAM disk


def test_describe_warns_when_the_disk_cannot_hold_two_copies(quiet_machine, monkeypatch, tmp_path, standin):
    mp = tmp_path / "drive"
    data = mp / "MyDrive" / "big.tar"  # a single file is in use for its whole copy: it needs the 2N
    data.parent.mkdir(parents=True)
    data.write_bytes(b"x" * 6000)
    fake_drive(monkeypatch, mp)
    monkeypatch.setenv("HOME", str(tmp_path))  # DriveFS's cache on the same disk as /tmp, as in Colab
    monkeypatch.setattr(env, "disk_free", lambda path: 10_000)
    text = doctor.describe(data)
    assert "need 12.0 kB (2 x 6.0 kB: Drive caches what it reads), have 10.0 kB" in text


def test_describe_only_warns_for_a_folder_that_fits_once(quiet_machine, monkeypatch, tmp_path, standin):
    """Like stage(): a folder on DriveFS with room for N but not 2N is a warning, not 'not enough space'."""
    mp = tmp_path / "drive"
    data = mp / "MyDrive" / "big"
    data.mkdir(parents=True)
    (data / "a.bin").write_bytes(b"x" * 6000)
    fake_drive(monkeypatch, mp)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(env, "disk_free", lambda path: 10_000)
    text = doctor.describe(data)
    assert "not enough free space" not in text
    assert "- 10.0 kB free on " in text and "room for the 6.0 kB of data, not for 2 x 6.0 kB" in text
    assert "colabfast.refresh_drive()" in text
    monkeypatch.setattr(env, "disk_free", lambda path: 5_000)  # not even one copy fits: refused, as stage() does
    assert "not enough free space" in doctor.describe(data)


def test_describe_ram_and_local_data(quiet_machine, monkeypatch, tmp_path):
    (tmp_path / "x.bin").write_bytes(b"x" * 100)
    text = doctor.describe(tmp_path)
    assert "your data is on local disk" in text
    monkeypatch.setattr(doctor, "_tree_size", lambda path: (17 * 10**9, 1000))
    text = doctor.describe(tmp_path)
    assert "colabfast.stage() puts it on local disk" in text and "too big for a RAM disk (room for 16.0 GB" in text
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "x.bin"))  # in Colab: "auto" may pick a RAM disk
    monkeypatch.setattr(doctor, "_tree_size", lambda path: (12 * 10**9, 1000))
    text = doctor.describe(tmp_path)
    assert "colabfast.stage() puts it on local disk" in text and "leaving little RAM spare" in text
    if env.is_ram("/dev/shm"):
        assert "your data is in RAM (tmpfs at /dev/shm)" in doctor.describe("/dev/shm")


def test_describe_without_data(quiet_machine, monkeypatch, tmp_path, standin):
    fake_drive(monkeypatch, tmp_path / "drive")
    text = doctor.describe()
    assert f"Drive is mounted at {tmp_path / 'drive'} (Google Drive (DriveFS)): do not train from it" in text
    assert "colabfast doctor PATH" in text
    assert "a RAM disk can hold up to 16.0 GB (20.0 GB available, 4.0 GB kept for training)" in text
    assert f"DataLoader(num_workers={env.cpu_count()})" in text
    assert "no CUDA GPU" in text
    assert "does not exist" in doctor.describe(tmp_path / "missing")


def test_describe_in_colab_with_a_gpu(quiet_machine, monkeypatch, tmp_path, standin):
    marker = tmp_path / "hostname"
    marker.write_text("vm")
    monkeypatch.setattr(env, "COLAB_MARKER", str(marker))
    monkeypatch.setattr(env, "gpu", lambda: {"name": "Tesla T4", "memory": 15_000_000_000})
    monkeypatch.setattr(codec, "gpu_decode_available", lambda: True)
    monkeypatch.setattr(env, "drive_mounts", lambda: [])
    text = doctor.describe()
    assert text.startswith("platform  Google Colab")
    assert "Tesla T4, 15.0 GB; JPEG decode on GPU: yes" in text
    assert "Drive is not mounted: colabfast.mount() mounts it" in text
    assert f"{codec.jpeg_codec().name}.decode_jpeg(data, device='cuda')" in text
    assert f"JPEGs     decoded by {codec.jpeg_codec()}" in text


@pytest.fixture
def work(monkeypatch, tmp_path):
    """colabfast's local work folder (where stage() puts data by default) in tmp_path."""
    folder = tmp_path / "work"
    monkeypatch.setattr(env, "work_dir", lambda: folder)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return folder


def test_describe_outside_colab_says_where_stage_really_puts_small_data(quiet_machine, monkeypatch, tmp_path,
                                                                      standin, work):
    """Outside Colab stage(to="auto") never mounts a RAM disk: the doctor says local disk, and stage agrees."""
    mp = tmp_path / "drive"
    data = mp / "MyDrive" / "small"
    data.mkdir(parents=True)
    (data / "a.bin").write_bytes(b"x" * 5000)
    fake_drive(monkeypatch, mp)
    text = doctor.describe(data)
    assert "puts it on a RAM disk" not in text
    assert f"colabfast.stage() puts it on local disk, at {work / 'small'} (outside Colab" in text
    assert f"colabfast.stage('{data}', to='ram') puts it there" in text
    assert cf_stage(data) == work / "small"  # what stage() does with the same machine


def test_describe_in_colab_follows_stages_rule(quiet_machine, monkeypatch, tmp_path, standin, work):
    """In Colab small data goes to a RAM disk, large to local disk, and an earlier stage stays where it is:
    the doctor says what staging_destination.default_destination decides."""
    monkeypatch.setattr(env, "COLAB_MARKER", str(tmp_path / "hostname"))
    (tmp_path / "hostname").write_text("vm")
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x" * 5000)
    assert "colabfast.stage() puts it on a RAM disk (in Colab, data taking at most half" in doctor.describe(data)
    monkeypatch.setattr(env, "ram_available", lambda: 4 * 10**9 + 9000)  # 9 kB spare: 5 kB is more than half
    assert f"puts it on local disk, at {work / 'data'} (it takes more than half" in doctor.describe(data)
    monkeypatch.setattr(env, "ram_available", lambda: 20 * 10**9)
    (work / "data").mkdir(parents=True)
    (work / "data" / ".colabfast-stage.json").write_text("{}")  # an earlier stage on disk: stage() reuses it
    assert f"puts it on local disk, at {work / 'data'} (an earlier stage of it is at" in doctor.describe(data)


def test_describe_an_archive_by_its_extracted_name_and_size(quiet_machine, tmp_path, work):
    import zipfile

    archive = tmp_path / "set.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("a/b.bin", b"\0" * 100_000)
    text = doctor.describe(archive)
    assert f"your data takes 100.0 kB: colabfast.stage() puts it on local disk, at {work / 'set'}" in text


def cf_stage(path):
    from colabfast.staging import pipeline

    return pipeline.stage(path, progress=False)
