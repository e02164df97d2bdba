"""Hostile and corrupt mirrors (issue 14 items 3-6, issue 15 item 13): every one is refused with a
MirrorError naming the file, or read correctly; nothing crashes, hangs or reads another file.

Each mirror is built here from a small packed one. Most attacks rewrite an array *with* a valid
checksum (what a buggy or hostile writer produces), so the structural checks are what catch them;
the checksum tests flip bytes without fixing the checksums.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import h5py
import numpy as np
import psutil
import pytest
import torch

from colabfast.datasets.dropins import H5ImageFolder, H5Kitti
from colabfast.errors import MirrorError
from colabfast.loading.loader import DataLoader
from colabfast.mirror import index as mirror_index
from colabfast.mirror import safety as mirror_safety
from colabfast.mirror.format import header_crc32
from colabfast.mirror.index import load_index, write_array
from colabfast.mirror.verify import info, verify
from colabfast.packing import pack
from colabfast.testing.data import encode, make_imagefolder, make_kitti, photo


@pytest.fixture(scope="module", autouse=True)
def own_cache(tmp_path_factory):
    """Vetting verdicts go to a cache of this module's own, not the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLABFAST_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(autouse=True)
def fresh_process(monkeypatch):
    """Each test starts as a new process would: nothing vetted in memory (the cache file stays)."""
    monkeypatch.setattr(mirror_safety, "_vetted", set())


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("good")
    inet = make_imagefolder(base / "inet", classes=2, per_class=3, size=(32, 24), vary=0.2)
    make_kitti(base / "kitti", train=3, test=2, size=(48, 16))
    return {
        "encoded": pack(inet, base / "encoded.h5", progress=False),
        "raw": pack(inet, base / "raw.h5", store="raw", progress=False),
        "kitti": pack(base / "kitti", base / "kitti.h5", progress=False),
    }


def copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def put(g: h5py.Group, name: str, data, **attrs) -> None:
    """Replace dataset ``g[name]`` by ``data`` with a valid checksum: only the format checks can object."""
    if name in g:
        old = {k: v for k, v in g[name].attrs.items() if k != "crc32"}
        del g[name]
        attrs = {**old, **attrs}
    write_array(g, name, np.asarray(data), **attrs)


def set_attrs(f: h5py.File, **attrs) -> None:
    """Set root attributes and a matching header_crc32."""
    for key, value in attrs.items():
        f.attrs[key] = value
    f.attrs["header_crc32"] = header_crc32({k: f.attrs[k] for k in f.attrs})


def fingerprint(ds) -> str:
    """A digest of everything a user reads from a dataset: images, targets, classes, paths."""
    h = zlib.crc32(json.dumps([len(ds), getattr(ds, "classes", None), ds.source_paths]).encode())
    for i in range(len(ds)):
        image, target = ds[i]
        h = zlib.crc32(image.numpy().tobytes(), zlib.crc32(repr(target).encode(), h))
    return f"{h:08x}"


# --- item 3: data that is not in the file ---------------------------------------------------------


def test_external_storage_never_reads_another_file(good, tmp_path):
    """Attack (issue 14.3): `images` rewritten to use HDF5 external storage pointing at secret.txt;
    the reader returned that file's bytes."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"password=hunter2" * 100)
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        n = f["images"].shape[0]
        del f["images"]
        f.create_dataset("images", (n,), "u1", external=[(str(secret), 0, n)])
    with pytest.raises(MirrorError, match=r"m\.h5.*/images is stored in external files"):
        H5ImageFolder(m, output="bytes")
    with pytest.raises(MirrorError, match="external"):
        info(m)


def test_external_storage_on_a_fifo_does_not_block(good, tmp_path):
    """Attack (issue 14.3): external storage pointing at a FIFO made H5ImageFolder() block forever;
    run in a subprocess with a time limit so a regression fails instead of hanging pytest."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        n = f["images"].shape[0]
        del f["images"]
        f.create_dataset("images", (n,), "u1", external=[(str(fifo), 0, n)])
    code = ("import sys; from colabfast.datasets import H5ImageFolder; from colabfast.mirror import MirrorError\n"
            "try: H5ImageFolder(sys.argv[1])[0]\nexcept MirrorError as e: print('MirrorError', e)")
    out = subprocess.run([sys.executable, "-c", code, str(m)], capture_output=True, text=True, timeout=120)
    assert out.stdout.startswith("MirrorError") and "external" in out.stdout, out.stderr


def test_a_mirror_path_that_is_a_fifo_or_folder_is_refused(tmp_path):
    """Attack: the mirror path itself is a FIFO (h5py's open would block) or a folder."""
    os.mkfifo(tmp_path / "m.h5")
    with pytest.raises(MirrorError, match="not a regular file"):
        H5ImageFolder(tmp_path / "m.h5")
    with pytest.raises(MirrorError, match="not a regular file"):
        info(tmp_path)


def test_virtual_chunked_filtered_and_unallocated_data_are_refused(good, tmp_path):
    """Attack (issue 14.3): `images` as a virtual dataset over another file, chunked, gzip-filtered,
    or declared but never written (its data offset is unknown)."""
    other = tmp_path / "other.h5"
    with h5py.File(good["encoded"], "r") as f:
        data = f["images"][()]
    with h5py.File(other, "w") as f:
        f["x"] = data
    cases = {
        "virtual": lambda f: f.create_virtual_dataset("images", _layout(other, len(data))),
        "chunked": lambda f: f.create_dataset("images", data=data, chunks=(64,)),
        "filtered": lambda f: f.create_dataset("images", data=data, compression="gzip"),
        "storage at offset None": lambda f: f.create_dataset("images", (len(data),), "u1"),
    }
    for what, make in cases.items():
        m = copy(good["encoded"], tmp_path / f"{what.split()[0]}.h5")
        with h5py.File(m, "r+") as f:
            del f["images"]
            make(f)
        with pytest.raises(MirrorError, match=f"{m.name}.*/images .*{what}"):
            H5ImageFolder(m)


def _layout(src: Path, n: int) -> h5py.VirtualLayout:
    layout = h5py.VirtualLayout((n,), "u1")
    layout[:] = h5py.VirtualSource(str(src), "x", shape=(n,))
    return layout


def test_data_outside_the_file_is_refused(good):
    """Attack (issue 14.3): a dataset's data range ends past the end of the file."""
    with h5py.File(good["encoded"], "r") as f:
        ds = f["images"]
        end = ds.id.get_offset() + ds.shape[0]
        mirror_safety.check_storage(ds, "m.h5", end)  # exactly fits
        with pytest.raises(MirrorError, match="outside the file"):
            mirror_safety.check_storage(ds, "m.h5", end - 1)


def test_links_are_refused(good, tmp_path):
    """Attack: an index array replaced by an external link into another HDF5 file, or a soft link."""
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["offsets"] = np.arange(7, dtype=np.int64)
    links = {"ExternalLink": h5py.ExternalLink(str(other), "offsets"), "SoftLink": h5py.SoftLink("/order")}
    for kind, link in links.items():
        m = copy(good["encoded"], tmp_path / f"{kind}.h5")
        with h5py.File(m, "r+") as f:
            del f["image_offsets"]
            f["image_offsets"] = link
        with pytest.raises(MirrorError, match=f"image_offsets is a {kind}"):
            H5ImageFolder(m)


# --- item 4: libhdf5 crashing or looping ----------------------------------------------------------


def _fake_python(tmp_path: Path, body: str) -> str:
    script = tmp_path / "python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_crash_or_hang_while_reading_metadata_becomes_a_mirror_error(good, tmp_path, monkeypatch):
    """Attack (issue 14.4): libhdf5 segfaulted (rc 139) or looped forever on fuzzed metadata. The
    metadata is walked in a child process; here the child really dies of SIGSEGV, or really hangs."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    monkeypatch.setattr(mirror_safety.sys, "executable", _fake_python(tmp_path, "kill -SEGV $$"))
    with pytest.raises(MirrorError, match=r"m\.h5: libhdf5 crashed \(signal 11\)"):
        H5ImageFolder(m)
    monkeypatch.setattr(mirror_safety.sys, "executable", _fake_python(tmp_path, "exec sleep 60"))
    monkeypatch.setattr(mirror_safety, "VET_TIMEOUT", 1.0)  # where vet reads it
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(MirrorError, match=r"m\.h5: reading its HDF5 metadata did not finish in 1 s"):
        info(m)
    left = [p for p in psutil.Process().children() if p.pid not in before]
    assert left == []  # the hung child was killed, not left behind


def test_vetting_runs_once_per_file_version_and_not_for_what_you_packed(good, tmp_path, monkeypatch):
    """Item 4's cost: the child check runs once per file version (path, size, times, inode), is
    remembered across processes, and a mirror this process packed needs none."""
    runs = []
    real = mirror_safety.subprocess.run

    def run(cmd, *args, **kwargs):
        if "_vet_main" in " ".join(map(str, cmd)):
            runs.append(cmd[-1])
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(mirror_safety.subprocess, "run", run)
    mine = pack(good["encoded"].parent / "inet", tmp_path / "mine.h5", progress=False)
    H5ImageFolder(mine)
    mirror_safety._vetted.clear()  # as a new process (a spawned DataLoader worker) would start
    H5ImageFolder(mine)
    assert runs == []
    theirs = copy(good["encoded"], tmp_path / "theirs.h5")
    H5ImageFolder(theirs)
    info(theirs)
    mirror_safety._vetted.clear()
    H5ImageFolder(theirs)
    assert runs == [str(theirs)]
    os.utime(theirs, ns=(0, 0))  # a changed file is a new version
    H5ImageFolder(theirs)
    assert runs == [str(theirs)] * 2


# --- item 5: declared sizes and values ------------------------------------------------------------


def test_declared_sizes_are_not_trusted(good, tmp_path):
    """Attack (issue 14.5): a 5 MB mirror declared `image_offsets` of length 2^28 + 1 and opened with
    that length, taking 2.8 GB of RAM; here 2^31 elements too. Refused before anything is read."""
    rss = psutil.Process().memory_info().rss
    for n in (2**28 + 1, 2**31):
        m = copy(good["encoded"], tmp_path / f"big{n}.h5")
        with h5py.File(m, "r+") as f:
            del f["image_offsets"]
            f.create_dataset("image_offsets", (n,), "<i8")
        with pytest.raises(MirrorError, match=f"image_offsets declares {8 * n} bytes"):
            H5ImageFolder(m)
    assert psutil.Process().memory_info().rss - rss < 200 << 20


BAD_ARRAYS = {  # attack -> (mirror, dataset, new value from the old one, expected message)
    "negative offset": ("encoded", "image_offsets", lambda a: np.r_[a[:3], -5, a[4:]], "image_offsets do not rise"),
    "offsets going back": ("encoded", "image_offsets", lambda a: np.r_[a[:2], a[3], a[2], a[4:]], "do not rise"),
    "offsets past the data": ("encoded", "image_offsets", lambda a: np.r_[a[:-1], a[-1] + 10], "do not rise"),
    "offsets not from 0": ("encoded", "image_offsets", lambda a: a + 1, "do not rise from 0"),
    "more offsets than shapes": ("encoded", "image_offsets", lambda a: np.r_[a[:-1], a[-1], a[-1]],
                                 r"image_shapes is int32 \[6, 3\], expected int32 \[7, 3\]"),
    "shape not RGB": ("encoded", "image_shapes", lambda a: np.c_[a[:, :2], np.full(len(a), 4, np.int32)], "not"),
    "negative height": ("encoded", "image_shapes", lambda a: a * np.array([-1, 1, 1], np.int32), "H >= 1"),
    "raw shape not its size": ("raw", "image_shapes", lambda a: a + np.array([1, 0, 0], np.int32), "needs"),
    "2 columns of shapes": ("encoded", "image_shapes", lambda a: a[:, :2], r"expected int32 \[6, 3\]"),
    "target past the classes": ("encoded", "targets", lambda a: np.r_[a[:-1], 2], "outside 0..1"),
    "negative target": ("encoded", "targets", lambda a: np.r_[-1, a[1:]], "outside 0..1"),
    "targets of float": ("encoded", "targets", lambda a: a.astype(np.float64), "expected int64"),
    "short targets": ("encoded", "targets", lambda a: a[:-1], r"expected int64 \[6\]"),
    "KITTI objects past their columns": ("kitti", "training/object_offsets", lambda a: np.r_[a[:-1], a[-1] + 1],
                                         r"object_offsets do not rise|expected"),
    "KITTI type code past its names": ("kitti", "training/objects/type", lambda a: np.r_[a[:-1], 200].astype(np.uint8),
                                       "outside its"),
    "KITTI bbox of 3 columns": ("kitti", "training/objects/bbox", lambda a: a[:, :3], r"expected float64 \[\d+, 4\]"),
    "KITTI calib of 11 columns": ("kitti", "training/calib/P2", lambda a: a[:, :11], r"expected float64 \[3, 12\]"),
    "paths past their table": ("encoded", "path_offsets", lambda a: np.r_[a[:-1], a[-1] + 5], "path_offsets do not"),
}


@pytest.mark.parametrize("attack", BAD_ARRAYS)
def test_arrays_that_break_the_format_are_refused(good, tmp_path, attack):
    """Attacks (issue 14.5): index arrays rewritten with valid checksums but values that break the
    format; they raised RuntimeError/IndexError or gave wrong data. Each is one MirrorError."""
    store, name, change, message = BAD_ARRAYS[attack]
    m = copy(good[store], tmp_path / "m.h5")
    group, _, leaf = name.rpartition("/")
    with h5py.File(m, "r+") as f:
        g = f[group] if group else f
        put(g, leaf, change(g[leaf][()]))
    with pytest.raises(MirrorError, match=rf"m\.h5 is not a valid colabfast mirror: .*{message}"):
        ds = H5Kitti(m) if store == "kitti" else H5ImageFolder(m)
        assert ds.source_paths  # the paths are checked when read


def test_a_negative_offset_raises_in_the_dataloader_batch_path(good, tmp_path):
    """Attack (issue 14.5): in the DataLoader batch path a negative offset returned wrong bytes."""
    m = copy(good["raw"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        put(f, "image_offsets", np.r_[f["image_offsets"][:3], -5, f["image_offsets"][4:]])
    with pytest.raises(MirrorError, match="image_offsets do not rise"):
        next(iter(DataLoader(H5ImageFolder(m, output="tensor"), batch_size=4, num_workers=0)))


@pytest.mark.parametrize("rel", ["/etc/passwd", "../../secret.jpg", "a/../../b.jpg", "", b"\xff\xfe.jpg"])
def test_paths_must_be_plain_relative_utf8(good, tmp_path, rel):
    """Attack (issue 14.5): a path that is absolute, climbs out with `..`, is empty or is not UTF-8
    (it raised UnicodeDecodeError)."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        offsets = f["path_offsets"][()]
        blob = f["paths"][()].tobytes()
        raw = rel if isinstance(rel, bytes) else rel.encode()
        new = raw + blob[offsets[1]:]
        put(f, "paths", np.frombuffer(new, np.uint8))
        put(f, "path_offsets", np.r_[0, offsets[1:] - offsets[1] + len(raw)])
    ds = H5ImageFolder(m)
    with pytest.raises(MirrorError, match="path 0 .*(not a plain relative path|not UTF-8)"):
        assert ds.samples


BAD_ATTRS = {  # attack -> (root attributes, expected message)
    "unknown store": ({"store": "jpegxl"}, "stores images as 'jpegxl', which this colabfast does not know"),
    "unknown layout": ({"layout": "cocoa"}, "unknown layout 'cocoa'"),
    "classes not JSON": ({"classes": "[cat, dog"}, "attribute 'classes' is not JSON"),
    "classes of numbers": ({"classes": "[1, 2]"}, "attribute 'classes' is not what the format says"),
    "image_size of text": ({"image_size": '"big"'}, "attribute 'image_size' is not what the format says"),
    "skipped not a list": ({"skipped": "{}"}, "attribute 'skipped'"),
    "version as text": ({"format_version": "2"}, "attribute 'format_version' is '2', not an integer"),
    "version as an array": ({"format_version": np.array([2, 2])}, "not an integer"),
    "complete as text": ({"complete": "yes"}, "attribute 'complete' is 'yes', not true or false"),
    "source not UTF-8": ({"source": np.bytes_(b"\xff")}, "attribute 'source' is not UTF-8"),
    "quality 0": ({"quality": 0}, "JPEG quality 0"),
}


@pytest.mark.parametrize("attack", BAD_ATTRS)
def test_attributes_that_break_the_format_are_refused(good, tmp_path, attack):
    """Attacks (issue 14.5, 15.13): malformed root attributes (with a valid header checksum); they raised
    JSONDecodeError or, for an unknown store, were described as 'stores raw pixels'."""
    attrs, message = BAD_ATTRS[attack]
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        set_attrs(f, **attrs)
    for open_it in (H5ImageFolder, info):
        with pytest.raises(MirrorError, match=rf"m\.h5.*{message}"):
            open_it(m)


def test_undecodable_image_bytes_are_a_mirror_error(good, tmp_path):
    """Attack (issue 14.5): image bytes replaced by garbage (checksums not consulted): PIL raised
    UnidentifiedImageError naming a BytesIO, torchvision a RuntimeError."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        f["images"][:] = 7
    for output in ("pil", "tensor"):
        with pytest.raises(MirrorError, match=r"m\.h5: sample 2 cannot be decoded .*info --verify"):
            H5ImageFolder(m, output=output)[2]


# --- item 6: checksums ----------------------------------------------------------------------------


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x40]))


def test_a_flipped_byte_in_the_index_fails_at_open(good, tmp_path):
    """Attack (issue 14.6): one flipped bit in `targets` silently changed a label; in a root attribute
    the source folder. Both are checked when the mirror opens."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r") as f:
        where = f["targets"].id.get_offset() + 8 * 4
    _flip(m, where)
    with pytest.raises(MirrorError, match=r"/targets does not match its checksum"):
        H5ImageFolder(m)
    m = copy(good["encoded"], tmp_path / "n.h5")
    with h5py.File(m, "r+") as f:
        f.attrs["source"] = "/somewhere/else"
    with pytest.raises(MirrorError, match="header_crc32"):
        H5ImageFolder(m)


def test_a_flipped_byte_in_an_image_is_found_by_verify(good, tmp_path):
    """Attack (issue 14.6): flipped bytes in image data gave wrong pixels silently. verify=True checks
    every image read; `colabfast info --verify` checks them all and names the sample."""
    assert verify(good["encoded"]) == 6 and verify(good["kitti"]) == 5
    m = copy(good["raw"], tmp_path / "m.h5")
    index = load_index(m)
    _flip(m, index.data_offset + int(index.offsets[4]) + 10)
    H5ImageFolder(m)[4]  # off by default: raw pixels, one of them wrong
    ds = H5ImageFolder(m, output="tensor", verify=True)
    assert torch.equal(ds[3][0], H5ImageFolder(good["raw"], output="tensor")[3][0])
    with pytest.raises(MirrorError, match=r"sample 4 \(n\d+/.*\) does not match its checksum"):
        ds[4]
    with pytest.raises(MirrorError, match="sample 4"):
        ds.__getitems__([3, 4, 5])
    out = subprocess.run([sys.executable, "-m", "colabfast.cli", "info", "--verify", str(m)], capture_output=True,
                         text=True, env={**os.environ, "COLABFAST_CACHE": str(tmp_path)})
    assert out.returncode == 1 and "1 of 6 samples do not match their checksums" in out.stderr, out.stderr
    assert "sample 4 (" in out.stderr and "Traceback" not in out.stderr
    out = subprocess.run([sys.executable, "-m", "colabfast.cli", "info", "--verify", str(good["encoded"])],
                         capture_output=True, text=True)
    assert out.returncode == 0
    assert "verified: the 6 samples match their checksums, their declared sizes and kinds" in out.stdout


def _as_version_1(m: Path) -> None:
    """Strip what format version 2 added, as colabfast 0.1.0 wrote mirrors."""
    with h5py.File(m, "r+") as f:
        def strip(name, obj):
            if "crc32" in obj.attrs:
                del obj.attrs["crc32"]
        f.visititems(strip)
        for g in [f] + [f[s] for s in ("training", "testing") if s in f]:
            if "image_crc32" in g:
                del g["image_crc32"]
        del f.attrs["header_crc32"]
        f.attrs["format_version"] = 1


@pytest.mark.parametrize("which", ["encoded", "kitti"])
def test_version_1_mirrors_still_read(good, tmp_path, which):
    """Format version 1 (no checksums) reads as before; verify=True says it has no checksums."""
    m = copy(good[which], tmp_path / "v1.h5")
    _as_version_1(m)
    make = (lambda p, **k: H5Kitti(p, output="tensor", **k)) if which == "kitti" else \
        (lambda p, **k: H5ImageFolder(p, output="tensor", **k))
    assert fingerprint(make(m)) == fingerprint(make(good[which]))
    assert info(m).format_version == 1
    with pytest.raises(MirrorError, match="version 1 mirror without them"):
        make(m, verify=True)
    with pytest.raises(MirrorError, match="no checksums"):
        verify(m)


# --- a corpus of hostile mirrors and a bounded fuzz, read in a subprocess -------------------------


RUNNER = textwrap.dedent("""
    import json, sys, zlib
    from colabfast.mirror import safety as mirror_safety
    from colabfast.datasets import H5ImageFolder, H5Kitti
    from colabfast.mirror import MirrorError, info, verify
    sys.path.insert(0, sys.argv[2])
    from test_mirror import fingerprint
    mirror_safety.VET_TIMEOUT = 20
    for line in sys.stdin:
        path = line.strip()
        print("start", path, flush=True)
        kitti = "kitti" in path.rsplit("/", 1)[-1]
        try:
            info(path)
            ds = (H5Kitti if kitti else H5ImageFolder)(path, output="tensor", verify=True)
            outcome = fingerprint(ds)
            verify(path)
        except MirrorError as exc:
            outcome = "MirrorError"
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
        print("done", path, outcome, flush=True)
""")


def _hostile(good: Path, out: Path) -> list[Path]:
    """Hand-made corruptions of an imagefolder mirror, beyond those tested one by one above."""
    made = []

    def case(name, change):
        m = copy(good, out / f"hand-{name}.h5")
        with h5py.File(m, "r+") as f:
            change(f)
        made.append(m)

    case("images-missing", lambda f: f.__delitem__("images"))
    case("images-a-group", lambda f: (f.__delitem__("images"), f.create_group("images")))
    case("offsets-missing", lambda f: f.__delitem__("image_offsets"))
    case("deep-groups", lambda f: f.create_group("a/b/c/d/e"))
    case("named-type", lambda f: f.__setitem__("t", np.dtype("<i4")))
    case("string-dataset", lambda f: f.create_dataset("paths2", data=np.array([b"x"], dtype=object),
                                                     dtype=h5py.string_dtype()))
    case("extra-attr", lambda f: f["order"].attrs.__setitem__("x", np.zeros(1000, np.uint8)))
    case("offsets-unchecked", lambda f: f["image_offsets"].__setitem__(2, 10**12))
    case("crc-removed", lambda f: f["image_shapes"].attrs.__delitem__("crc32"))
    case("format-other", lambda f: f.attrs.__setitem__("format", "something-else"))
    case("kitti-layout", lambda f: set_attrs(f, layout="kitti"))
    return made


def _fuzzed(good: Path, out: Path, count: int, seed: int) -> list[Path]:
    """``count`` copies of ``good`` with 1-4 bytes changed: 4 in 5 in the metadata (anywhere but the
    image data), 1 in 5 in the image data."""
    rng = np.random.default_rng(seed)
    data = bytearray(good.read_bytes())
    with h5py.File(good, "r") as f:
        groups = [f[s] for s in ("training", "testing") if s in f] or [f]
        starts = [(g["images"].id.get_offset(), g["images"].shape[0]) for g in groups]
    in_images = np.zeros(len(data), bool)
    for start, n in starts:
        in_images[start : start + n] = True
    meta, pixels = np.flatnonzero(~in_images), np.flatnonzero(in_images)
    made = []
    for k in range(count):
        mutated = bytearray(data)
        pool = pixels if k % 5 == 4 else meta
        for pos in rng.choice(pool, int(rng.integers(1, 5)), replace=False):
            mutated[pos] ^= int(rng.integers(1, 256))
        m = out / f"fuzz-{good.stem}-{k:03d}.h5"
        m.write_bytes(bytes(mutated))
        made.append(m)
    return made


def test_hostile_corpus_and_fuzz_give_a_mirror_error_or_correct_data(good, tmp_path):
    """Attacks (issue 14.4-6): hand-made corruptions and 60 fuzzed mirrors (seeded byte mutations,
    mostly in the HDF5 metadata). Every one, read in a subprocess with a time limit so that a crash
    or a hang cannot take pytest down, must raise MirrorError or give exactly the packed data."""
    corpus = _hostile(good["encoded"], tmp_path) + _fuzzed(good["encoded"], tmp_path, 45, seed=14) \
        + _fuzzed(good["kitti"], tmp_path, 15, seed=15)
    expected = {"encoded": fingerprint(H5ImageFolder(good["encoded"], output="tensor")),
                "kitti": fingerprint(H5Kitti(good["kitti"], output="tensor"))}
    proc = subprocess.run([sys.executable, "-c", RUNNER, "", str(Path(__file__).parent)], capture_output=True,
                          text=True, input="".join(f"{p}\n" for p in corpus), timeout=900,
                          env={**os.environ, "COLABFAST_CACHE": str(tmp_path / "cache")})
    started = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("start")]
    assert proc.returncode == 0, f"the reader died (rc {proc.returncode}) on {started[-1:]}: {proc.stderr[-2000:]}"
    outcomes = dict(line.split(" ", 2)[1:] for line in proc.stdout.splitlines() if line.startswith("done"))
    assert len(outcomes) == len(corpus)
    wrong = {}
    for path, outcome in outcomes.items():
        ok = expected["kitti" if "kitti" in Path(path).name else "encoded"]
        if outcome not in ("MirrorError", ok) or (Path(path).name.startswith("hand-") and outcome != "MirrorError"):
            wrong[Path(path).name] = outcome
    assert not wrong, wrong
    refused = sum(o == "MirrorError" for o in outcomes.values())
    print(f"{len(corpus)} hostile mirrors: {refused} refused with MirrorError, {len(corpus) - refused} read correctly")


# --- issue 23: decoding never crashes or blows up, whatever a mirror's image bytes say -------------


@pytest.fixture(scope="module")
def pngs(tmp_path_factory) -> dict[str, Path]:
    """A KITTI mirror (PNG images) and an imagefolder mirror of PNGs (read by the loader's threads)."""
    base = tmp_path_factory.mktemp("png")
    rng = np.random.default_rng(23)
    for cls in ("a", "b"):
        (base / "folder" / cls).mkdir(parents=True)
        for n in range(4):
            (base / "folder" / cls / f"{n}.png").write_bytes(encode(photo(40, 30, rng), "PNG"))
    make_kitti(base / "kitti", train=3, test=1, size=(48, 16))
    return {"folder": pack(base / "folder", base / "folder.h5", progress=False),
            "kitti": pack(base / "kitti", base / "kitti.h5", progress=False)}


def _rewrite_image(m: Path, split: str, i: int, change) -> None:
    """Replace stored image ``i`` by ``change(bytes)`` (same length), its CRC-32 made valid again: a
    hostile mirror, which no checksum can catch."""
    index = load_index(m, split)
    start = index.data_offset + int(index.offsets[i])
    with open(m, "r+b") as fh:
        fh.seek(start)
        old = fh.read(int(index.offsets[i + 1] - index.offsets[i]))
        new = change(old)
        assert len(new) == len(old)
        fh.seek(start)
        fh.write(new)
    with h5py.File(m, "r+") as f:
        g = f[split] if split else f
        crc = g["image_crc32"][()]
        crc[i] = zlib.crc32(new)
        put(g, "image_crc32", crc)


def _flip_in_idat(data: bytes) -> bytes:
    at = data.index(b"IDAT") + 4 + 20  # a bit of the compressed pixels: libpng's "incorrect data check"
    return data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:]


READ_ONE = textwrap.dedent("""
    import sys
    from colabfast import DataLoader, H5ImageFolder, H5Kitti, MirrorError
    how, path = sys.argv[1], sys.argv[2]
    try:
        if how.startswith("kitti"):
            H5Kitti(path, output=how.split("-")[1])[1]
        else:
            loader = DataLoader(H5ImageFolder(path, output="tensor"), batch_size=4, device="cpu",
                                num_workers=2 if how == "workers" else None)
            print(loader.choices["reader"][1], flush=True)
            list(loader)
    except MirrorError as exc:
        print("MirrorError:", exc)
""")


@pytest.mark.parametrize("how", ["kitti-tensor", "kitti-pil", "threads", "workers"])
def test_a_corrupt_png_is_a_mirror_error_not_a_dead_process(pngs, tmp_path, how):
    """Issue 23.1: one flipped bit in a stored PNG's IDAT made torchvision.io.decode_image segfault the
    process (libpng: "IDAT: incorrect data check"), in the dataset, the loader's reader threads and
    its workers. Here the CRC-32 is even made to match. Read in a subprocess: a crash fails the test."""
    kitti = how.startswith("kitti")
    m = copy(pngs["kitti" if kitti else "folder"], tmp_path / "m.h5")
    _rewrite_image(m, "training" if kitti else "", 1, _flip_in_idat)
    out = subprocess.run([sys.executable, "-c", READ_ONE, how, str(m)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, f"rc {out.returncode}: {out.stderr[-2000:]}"
    if how == "threads":
        assert out.stdout.startswith("threads in this process")
    assert f"MirrorError: {m}: sample 1 cannot be decoded" in out.stdout, out.stdout + out.stderr[-2000:]


def _declare_size(data: bytes, w: int, h: int) -> bytes:
    """The JPEG ``data`` with its SOF0 header saying ``w`` x ``h`` (the scan stays small)."""
    at = data.index(b"\xff\xc0") + 5
    return data[:at] + h.to_bytes(2, "big") + w.to_bytes(2, "big") + data[at + 4:]


def _set_shapes(m: Path, shapes) -> None:
    with h5py.File(m, "r+") as f:
        put(f, "image_shapes", np.asarray(shapes, np.int32))


def _every_path(m: Path):
    """Each way a sample's image is decoded or handed on for decoding, as (name, call)."""
    from colabfast.loading.reader import BatchReader

    tensor, pil, nbytes = (H5ImageFolder(m, output=o) for o in ("tensor", "pil", "bytes"))
    return [
        ("tensor", lambda: tensor[0]),
        ("pil", lambda: pil[0]),
        ("bytes", lambda: nbytes[0]),
        ("threads", lambda: list(DataLoader(tensor, batch_size=3, device="cpu"))),
        ("workers", lambda: list(DataLoader(tensor, batch_size=3, device="cpu", num_workers=2))),
        ("gpu reader", lambda: BatchReader(nbytes, threads=1).read([0, 1, 2])),
        ("verify", lambda: verify(m)),
    ]


def test_decompression_bombs_are_refused_from_the_header(good, tmp_path):
    """Issue 23.2: 8 JPEGs whose headers (and image_shapes) say 16000x16000 took a process to 12.5 GB
    (output="tensor", the loader, verify); only PIL's own limit stopped output="pil". Every path
    refuses them from the header, by PIL.Image.MAX_IMAGE_PIXELS, before decoding anything."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    for i in range(6):
        _rewrite_image(m, "", i, lambda data: _declare_size(data, 16000, 16000))
    _set_shapes(m, [[16000, 16000, 3]] * 6)
    rss = psutil.Process().memory_info().rss
    for name, call in _every_path(m):
        with pytest.raises(MirrorError, match=r"16000x16000, 256\.0 million pixels, more than the limit of 89\.5 "
                                              r"million \(PIL\.Image\.MAX_IMAGE_PIXELS\)"):
            call()
        assert psutil.Process().memory_info().rss - rss < 300 << 20, name


def test_the_pixel_limit_is_pils(good, monkeypatch):
    """The one knob: PIL.Image.MAX_IMAGE_PIXELS, read at each decode (None: no limit)."""
    from PIL import Image

    ds = H5ImageFolder(good["encoded"], output="tensor")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(MirrorError, match=r"sample 0: the image at dataset index 0 is \d+x\d+, .* limit of 0\.0"):
        ds[0]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert ds[0][0].shape[0] == 3


@pytest.mark.parametrize("declared", [(60000, 60000), (12000, 12000), (10, 10)])
def test_decoded_shape_must_be_the_declared_shape_on_every_path(good, tmp_path, declared):
    """Issue 23.3: image_shapes declaring 60000x60000 for ordinary JPEGs gave MemoryError in the
    reader threads (they allocated by it); 12000x12000 and too-small shapes gave MirrorError on one
    path and the image on another. One rule: the header must give the declared shape."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    _set_shapes(m, [[*declared, 3]] * 6)
    h, w = declared
    for _, call in _every_path(m):
        with pytest.raises(MirrorError, match=rf"is \d+x\d+(, not the {w}x{h} declared for it|.*more than the limit)"):
            call()


def test_attributes_are_bounded_by_the_sample_count(good, tmp_path):
    """Issue 23.5: a 60 MB `classes` attribute took 49 s and 2.25 GB to open. An attribute larger than
    a mirror of that many samples holds is refused before it is read."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        set_attrs(f, classes=json.dumps(["a", "b"] + [f"c{i:07d}" for i in range(300_000)]))
    with pytest.raises(MirrorError, match=r"attribute 'classes' of / has 3\.\d MB, more than a mirror of 6 samples"):
        H5ImageFolder(m)
    with h5py.File(m, "r+") as f:
        set_attrs(f, classes=json.dumps(["a", "b"] + ["c" * 200] * 100))  # 20 kB: within the bound
    assert len(H5ImageFolder(m).classes) == 102


def test_index_arrays_are_bounded_before_they_are_read(good, tmp_path):
    """Issue 23.5: a 2 GiB sparse index reached 2.7 GB of RAM before its MirrorError. image_offsets
    cannot hold more samples than the image data has room for, nor paths more than PATH_MAX each."""
    rss = psutil.Process().memory_info().rss
    for name in ("image_offsets", "paths"):
        m = copy(good["encoded"], tmp_path / f"{name}.h5")
        with h5py.File(m, "r+") as f:
            del f[name]
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # storage in the file (sparse), never written
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
            dtype = np.dtype("<i8" if name == "image_offsets" else "u1")
            space = h5py.h5s.create_simple(((2 << 30) // dtype.itemsize,))
            h5py.h5d.create(f.id, name.encode(), h5py.h5t.py_create(dtype), space, dcpl=dcpl)
        assert m.stat().st_size > 2 << 30
        with pytest.raises(MirrorError, match=rf"/{name} is .*, expected .*\[<="):
            assert H5ImageFolder(m).source_paths
        assert psutil.Process().memory_info().rss - rss < 300 << 20, name
        m.unlink()


def test_the_vetting_child_does_not_import_from_the_current_folder(good, tmp_path, monkeypatch):
    """Issue 23.A: the child walking a mirror's metadata ran as `python -c`, so a json.py planted in
    the current folder (an untrusted archive one `%cd`'d into) ran in it."""
    ran = tmp_path / "planted-code-ran"
    (tmp_path / "json.py").write_text(f"open({str(ran)!r}, 'w').close()\nfrom _json import *\n")
    monkeypatch.chdir(tmp_path)
    m = copy(good["encoded"], tmp_path / "m.h5")
    assert len(H5ImageFolder(m)) == 6  # vetted in a child process, which found colabfast and h5py
    assert not ran.exists()


def test_verify_fails_a_kitti_mirror_without_kitti_splits(good, tmp_path):
    """Issue 23.F: a mirror whose layout says kitti but holds imagefolder tables passed `verify` with
    0 samples."""
    m = copy(good["encoded"], tmp_path / "m.h5")
    with h5py.File(m, "r+") as f:
        set_attrs(f, layout="kitti")
    for check in (verify, info):
        with pytest.raises(MirrorError, match="a kitti mirror without a training or testing split"):
            check(m)


# --- issue 24 item 3: one cutter of runs of consecutive samples ------------------------------------


def _views_runs(ordered: list[int], offsets: np.ndarray, cap: int) -> list[tuple[int, int]]:
    """MirrorReader.views' own loop before issue 24 (sorted distinct positions), as a reference."""
    out, start = [], 0
    for k in range(1, len(ordered) + 1):
        run_ends = k == len(ordered) or ordered[k] != ordered[k - 1] + 1
        too_big = k < len(ordered) and offsets[ordered[k] + 1] - offsets[ordered[start]] > cap
        if run_ends or too_big:
            out.append((start, k))
            start = k
    return out


def _batch_runs(indices: list[int], offsets: np.ndarray, cap: int) -> list[list[int]]:
    """BatchReader._read_runs' own loop before issue 24 (places in the batch, in stored order)."""
    out, run = [], []
    for k in np.argsort(indices, kind="stable").tolist():
        i = indices[k]
        if run and (i != indices[run[-1]] + 1 or offsets[i + 1] - offsets[indices[run[0]]] > cap):
            out.append(run)
            run = []
        run.append(k)
    return out + [run] if run else out


def test_runs_cut_consecutive_positions_within_the_byte_cap():
    offsets = np.array([0, 10, 20, 30, 100, 110, 120], np.int64)  # sample 3 has 70 bytes
    assert mirror_index.runs([], offsets, 30) == []
    assert mirror_index.runs([0, 1, 2, 4, 5], offsets, 30) == [(0, 3), (3, 5)]
    assert mirror_index.runs([0, 1, 2], offsets, 20) == [(0, 2), (2, 3)]  # 30 bytes is over 20
    assert mirror_index.runs([2, 3, 4], offsets, 30) == [(0, 1), (1, 2), (2, 3)]  # one sample over the cap: alone
    assert mirror_index.runs([1, 1, 2], offsets, 100) == [(0, 1), (1, 3)]  # a repeat starts a new run
    assert mirror_index.runs(np.array([5, 0, 1]), offsets, 100) == [(0, 1), (1, 3)]  # never reordered
    assert mirror_index.runs(np.arange(6), offsets, 1 << 20) == [(0, 6)]


def test_runs_are_what_both_readers_cut_before():
    """The one function gives what MirrorReader.views (sorted distinct positions) and the batch reader
    (a batch's positions in stable sorted order, repeats included) each computed themselves."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(1, 40))
        offsets = np.concatenate(([0], np.cumsum(rng.integers(1, 50, n)))).astype(np.int64)
        cap = int(rng.integers(1, 200))
        batch = rng.integers(0, n, int(rng.integers(0, 30))).tolist()
        ordered = sorted(set(batch))
        assert mirror_index.runs(ordered, offsets, cap) == _views_runs(ordered, offsets, cap)
        order = np.argsort(batch, kind="stable")
        assert [order[a:b].tolist() for a, b in mirror_index.runs(np.asarray(batch, np.int64)[order], offsets, cap)] \
            == _batch_runs(batch, offsets, cap)


# --- issue 24 item 3: one Header reads and writes the root attributes ------------------------------


def _stored(f: h5py.File, name: str) -> tuple:
    """A root attribute as HDF5 holds it: its value, the Python type h5py reads, its dtype and type class,
    and for text its encoding."""
    value, dtype = f.attrs[name], f.attrs.get_id(name).dtype
    return (value.tolist() if isinstance(value, np.generic) else value, type(value), dtype.str,
            f.attrs.get_id(name).get_type().get_class(), h5py.check_string_dtype(dtype))


def _old_root_attrs(kind: str, src: Path, dst: Path) -> dict:
    """The root attributes pack wrote before issue 24 (a hand-built dict, in its order), computed here
    from what went into the pack; ``created`` and ``fingerprint`` are taken from the file (a time, and
    a digest of the source that pack alone computes)."""
    import colabfast
    from colabfast.layouts.imagenet import DEVKIT_META, DEVKIT_VAL_TRUTH
    from colabfast.testing.data import WNIDS
    from colabfast.testing.imagenet_archives import _class_words

    with h5py.File(dst, "r") as f:
        created, fingerprint = f.attrs["created"], f.attrs["fingerprint"]
    layout = {"folder": "imagefolder", "kitti": "kitti", "archive": "imagefolder"}[kind]
    classes = None if kind == "kitti" else list(WNIDS[:2])
    attrs = {
        "format": "colabfast-mirror", "format_version": 2, "layout": layout, "store": "encoded",
        "image_size": json.dumps(None if kind == "kitti" else 16), "shuffled": kind == "folder",
        "seed": 7 if kind == "folder" else 0, "classes": json.dumps(classes), "source": str(src),
        "fingerprint": fingerprint, "skipped": "[]", "created": created, "colabfast_version": colabfast.__version__,
    }
    if kind != "kitti":
        attrs["quality"] = 70 if kind == "folder" else 90
    if kind == "archive":
        attrs["labels"] = f"{src.parent / 'ILSVRC2012_devkit_t12.tar.gz'} ({DEVKIT_META}, {DEVKIT_VAL_TRUTH})"
        attrs["class_names"] = json.dumps([_class_words(w).split(", ") for w in WNIDS[:2]])
    attrs["header_crc32"] = zlib.crc32(json.dumps(attrs, sort_keys=True).encode())  # of all the others
    return attrs


@pytest.fixture(scope="module")
def packed_kinds(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """One small mirror of each kind pack writes: a folder (shuffled, resized), kitti, an archive with labels."""
    from colabfast.testing.imagenet_archives import make_imagenet_archives

    pytest.importorskip("scipy")  # the devkit's meta.mat
    base = tmp_path_factory.mktemp("kinds")
    folder = make_imagefolder(base / "inet", classes=2, per_class=3, size=(32, 24))
    kitti = make_kitti(base / "kitti", train=2, test=1, size=(48, 16))
    archives = make_imagenet_archives(base / "ilsvrc", classes=2, train_per_class=2, val_per_class=2, size=(32, 24))
    return {
        "folder": (folder, pack(folder, base / "folder.h5", image_size=16, quality=70, shuffle=True, seed=7,
                                progress=False)),
        "kitti": (kitti, pack(kitti, base / "kitti.h5", progress=False)),
        "archive": (archives["val"], pack(archives["val"], base / "archive.h5", labels=archives["devkit"],
                                          image_size=16, progress=False)),
    }


@pytest.mark.parametrize("kind", ["folder", "kitti", "archive"])
def test_pack_writes_the_root_attributes_it_always_wrote(packed_kinds, tmp_path, kind):
    """Every root attribute, with its value and HDF5 type, is what pack's hand-built dict wrote before
    the Header wrote itself (issue 24 item 3), for each kind of mirror pack writes."""
    from datetime import datetime, timedelta, timezone

    src, dst = packed_kinds[kind]
    old = {**_old_root_attrs(kind, src, dst), "complete": True}
    with h5py.File(tmp_path / "old.h5", "w") as f:  # as pack wrote them: the dict, then complete
        for key, value in old.items():
            f.attrs[key] = value
    with h5py.File(dst, "r") as f, h5py.File(tmp_path / "old.h5", "r") as ref:
        assert sorted(f.attrs) == sorted(old)
        for name in old:
            assert _stored(f, name) == _stored(ref, name), name
        created = datetime.fromisoformat(f.attrs["created"])
    assert timedelta(0) <= datetime.now(timezone.utc) - created < timedelta(hours=1)
    assert len(old["fingerprint"]) == 64


@pytest.mark.parametrize("kind", ["folder", "kitti", "archive"])
def test_a_header_writes_what_it_reads_as_pack_always_wrote_it(packed_kinds, tmp_path, kind):
    """A packed mirror's Header, written to a new file, gives the bytes that the old hand-built dict
    gives (the same attributes, order, types and values), and reads back equal; info holds it."""
    import pickle

    from colabfast.mirror.format import Header

    src, dst = packed_kinds[kind]
    with h5py.File(dst, "r") as f:
        head = Header.read(f, dst)
    with h5py.File(tmp_path / "new.h5", "w") as f:
        head.write(f)
    with h5py.File(tmp_path / "old.h5", "w") as f:
        for key, value in {**_old_root_attrs(kind, src, dst), "complete": True}.items():
            f.attrs[key] = value
    assert (tmp_path / "new.h5").read_bytes() == (tmp_path / "old.h5").read_bytes()
    with h5py.File(tmp_path / "new.h5", "r") as f:
        assert Header.read(f, tmp_path / "new.h5") == head
    described = info(dst)
    assert described.header == head and pickle.loads(pickle.dumps(described)) == described
    assert (described.layout, described.classes, described.complete, described.format_version, described.labels) \
        == (head.layout, head.classes, True, 2, head.labels or "")


def test_a_header_without_its_optional_attributes_round_trips(tmp_path):
    from colabfast.mirror.format import Header

    head = Header(layout="files", store="raw", classes=None, image_size=[4, 6], quality=None, shuffled=False,
                  skipped=[{"path": "a/b.png", "error": "not an image"}], source="/data",
                  created="2026-01-01T00:00:00+00:00", colabfast_version="0.0")
    optional = {"complete", "quality", "seed", "fingerprint", "labels", "class_names"}
    assert not optional & set(head.attrs())  # absent where None (complete: where false)
    with h5py.File(tmp_path / "m.h5", "w") as f:
        head.write(f)
    with h5py.File(tmp_path / "m.h5", "r") as f:
        with pytest.raises(MirrorError, match="incomplete mirror"):
            Header.read(f, tmp_path / "m.h5")
        assert Header.read(f, tmp_path / "m.h5", complete=False) == head
