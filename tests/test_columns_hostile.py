"""Mirrors of columns against hostile files (issue 41 items 5, 12 and 13): a forged file ends in a
MirrorError that names the file, the column and the fix, within BOUND of what a valid file of its
kind costs; a mirror without images, and a drop-in opened on another layout's mirror, say what they
are."""

from __future__ import annotations

import json
import shutil
import zlib

import h5py
import numpy as np
import pytest
import torch
from measured import BOUND, measure
from PIL import Image
from torchvision import tv_tensors

import colabfast as cf
from colabfast.errors import MirrorError
from colabfast.mirror.format import attrs_crc32, header_crc32
from colabfast.mirror.index import Stored
from colabfast.mirror.verify import verify
from colabfast.testing.data import make_imagefolder

JSON_SAMPLES, JSON_BYTES = 16, 15 << 20  # 240 MB of JSON: what opening read whole, twice over, before issue 41


class Json(torch.utils.data.Dataset):
    """An image and a JSON list of one ``size``-character string per sample."""

    def __init__(self, n: int, size: int):
        self.n, self.size = n, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return Image.new("RGB", (4, 4)), [chr(97 + i) * self.size]


class Boxes(torch.utils.data.Dataset):
    """Every kind a forged column attribute can name a reader for: boxes, tensors, JSON, text."""

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        boxes = tv_tensors.BoundingBoxes(torch.ones(i, 4), format="XYXY", canvas_size=(4, 4))
        return Image.new("RGB", (4, 4)), {"boxes": boxes, "t": torch.zeros(2), "j": [i], "s": "é" * (i + 1)}


@pytest.fixture(scope="module")
def json_mirrors(tmp_path_factory):
    root = tmp_path_factory.mktemp("json")
    cf.pack(Json(JSON_SAMPLES, JSON_BYTES), root / "big.h5", workers=0, progress=False)
    cf.pack(Json(JSON_SAMPLES, 10), root / "small.h5", workers=0, progress=False)
    return root / "small.h5", root / "big.h5"


@pytest.fixture(scope="module")
def boxes_mirror(tmp_path_factory):
    path = tmp_path_factory.mktemp("boxes") / "boxes.h5"
    cf.pack(Boxes(), path, workers=0, progress=False)
    return path


def _fields(path) -> list[dict]:
    with h5py.File(path, "r") as f:
        return json.loads(f.attrs["columns"])["fields"]


def _forge_columns(src, dst, edit) -> None:
    """A copy of mirror ``src`` whose ``columns`` attribute ``edit`` changed, with a matching header checksum
    (what an attacker writes: the checksums guard against flipped bytes, not against intent)."""
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        spec = json.loads(f.attrs["columns"])
        edit(spec)
        f.attrs["columns"] = json.dumps(spec)
        f.attrs["header_crc32"] = header_crc32({k: f.attrs[k] for k in f.attrs})


def _forge_data(src, dst, name: str, head: bytes) -> None:
    """A copy of mirror ``src`` whose field ``name``'s data starts with ``head``, its checksum matching."""
    shutil.copy(src, dst)
    k = next(i for i, f in enumerate(_fields(src)) if f["name"] == name)
    with h5py.File(dst, "r+") as f:
        ds = f[f"columns/{k}/data"]
        data = ds[()]
        data[: len(head)] = np.frombuffer(head, np.uint8)
        ds[:] = data
        attrs = {a: ds.attrs[a] for a in ds.attrs}
        ds.attrs["crc32"] = np.uint32(attrs_crc32(attrs, zlib.crc32(data.data)))


# --- item 5: a column's data is read per sample; --verify decodes every value ------------------------


@pytest.mark.parametrize("action", ["open", "verify"])
def test_large_json_costs_its_index_to_open_and_a_stream_to_verify(json_mirrors, action):
    """Issue 41 item 5: H5Dataset read a whole JSON column when it opened (+480 MB here, linear in
    samples), and so did verify: opening reads the offsets, a sample its own bytes."""
    code = {
        "open": "import colabfast as cf\nd = cf.H5Dataset({path!r})\nassert len(d) == 16 and len(d[3][1][0]) > 0",
        "verify": "from colabfast.mirror import verify\nassert verify({path!r}) == 16",
    }[action]
    small, big = (measure(code.format(path=str(p))) for p in json_mirrors)
    assert small.error is None and big.error is None, (small.error, big.error)
    assert big.peak - small.peak < BOUND, f"{(big.peak - small.peak) >> 20} MB over a mirror of small JSON"
    assert big.seconds < 120


def test_columns_read_per_sample_give_what_resident_columns_give(tmp_path, monkeypatch):
    """Every kind read per sample from the file (no column data resident) comes back as read from memory."""
    from test_columns import Odd, _same

    cf.pack(Odd(), tmp_path / "odd.h5", workers=0, progress=False)
    resident = cf.H5Dataset(tmp_path / "odd.h5")
    monkeypatch.setattr(cf.mirror.index, "RESIDENT_BYTES", 0)  # where load_columns reads it
    per_sample = cf.H5Dataset(tmp_path / "odd.h5", verify=True)

    def on_disk(ds) -> int:
        return sum(isinstance(x, Stored) for v in ds._values.values() for x in (v if isinstance(v, tuple) else (v,)))

    assert on_disk(resident) == 0 and on_disk(per_sample) >= 8  # arrays, text, JSON: all but the empty ones
    for i in range(len(Odd())):
        for key, want in resident[i][1].items():
            _same(per_sample[i][1][key], want, f"sample {i} {key}")


@pytest.mark.parametrize("field, head, kind", [("1.j", b"{", "json"), ("1.s", b"\xff", "str")])
def test_verify_decodes_every_value(boxes_mirror, tmp_path, field, head, kind):
    """Issue 41 item 5: ``colabfast info --verify`` passed a mirror holding an undecodable JSON value
    (its checksum matching): verify decodes every str and JSON value, and names the sample and field."""
    bad = tmp_path / "bad.h5"
    _forge_data(boxes_mirror, bad, field, head)
    with pytest.raises(MirrorError, match=rf"(?s)bad\.h5: 1 of 3 samples .*\n  sample 0 \(0\), field '{field}': not "
                                          rf"valid {kind}.*pack it again"):
        verify(bad)
    with pytest.raises(MirrorError, match=rf"bad\.h5: sample 0, field '{field}' is not valid {kind}"):
        cf.H5Dataset(bad)[0]
    assert verify(boxes_mirror) == 3


# --- item 12: what a column's "as", box format and canvas may say ----------------------------------


def _set(name: str, key: str, value):
    def edit(spec):
        field = next(f for f in spec["fields"] if f["name"] == name)
        (field.setdefault("meta", {}) if key in ("format", "canvas", "nulls", "formats") else field)[key] = value
    return edit


@pytest.mark.parametrize("edit, match", [
    (_set("1.t", "as", "set_return_type"), r"column 3 \('1.t'\), of kind ndarray, is returned as 'set_return_type'"),
    (_set("1.t", "as", "wrap"), r"column 3 \('1.t'\), of kind ndarray, is returned as 'wrap'"),
    (_set("1.t", "as", "__class__"), r"column 3 \('1.t'\), of kind ndarray, is returned as '__class__'"),
    (_set("0", "as", "Mask"), r"column 0 \('0'\), of kind image, is returned as 'Mask'"),
    (_set("1.boxes", "format", "BOGUS"), r"column 1 \('1.boxes'\): box format 'BOGUS' is not one of torchvision's"),
    (_set("1.boxes", "canvas", 0), r"column 1 \('1.boxes'\): canvas 0 is not the index of its hidden"),
    (_set("1.boxes", "canvas", 99), r"column 1 \('1.boxes'\): canvas 99 is not"),
    (_set("1.boxes", "nulls", True), r"column 1 \('1.boxes'\), of kind ragged, has nulls True: pack writes it only"),
    (_set("0", "formats", 1), r"column 0 \('0'\), of kind image, has formats 1: pack writes it only as true"),
    (_set("0", "nulls", True), r"column 0 has nulls, which a mirror of format version 3 does not"),
], ids=["set_return_type", "wrap", "__class__", "image-as-Mask", "format", "canvas-image", "canvas-missing",
        "nulls-of-an-array", "formats-not-true", "nulls-in-version-3"])
def test_a_forged_column_attribute_is_refused_when_the_mirror_opens(boxes_mirror, tmp_path, edit, match):
    """Issue 41 item 12: a column's ``as`` named any torchvision.tv_tensors attribute, which the reader
    called (``set_return_type``, ``wrap``, ``__class__``); a bad box format or canvas was a KeyError."""
    bad = tmp_path / "bad.h5"
    _forge_columns(boxes_mirror, bad, edit)
    with pytest.raises(MirrorError, match=rf"bad\.h5 is not a valid colabfast mirror: {match}.*pack it again"):
        cf.H5Dataset(bad)[1]
    with pytest.raises(MirrorError, match="bad.h5"):
        cf.mirror.info(bad)
    ds = cf.H5Dataset(boxes_mirror)  # what pack writes still reads
    assert ds[2][1]["boxes"].format == tv_tensors.BoundingBoxFormat.XYXY and ds[2][1]["boxes"].canvas_size == (4, 4)


# --- item 13: mirrors without images; drop-ins on other layouts' mirrors ---------------------------


class Table(torch.utils.data.Dataset):
    """Samples of numbers, text and arrays, no image: pack's docstring says H5Dataset gives them back."""

    def __len__(self) -> int:
        return 5

    def __getitem__(self, i: int):
        return {"x": np.full(3, i, np.float32), "label": i % 2, "name": f"row {i}", "tags": ["a"] * i}


def test_h5dataset_reads_a_mirror_without_images(tmp_path):
    """Issue 41 item 13: H5Dataset refused a mirror without an image column, which pack writes and
    whose docstring says H5Dataset reads; its samples are its columns, in order, in a DataLoader too."""
    cf.pack(Table(), tmp_path / "t.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "t.h5", verify=True)
    assert len(ds) == 5
    for i in range(-5, 5):
        got, want = ds[i], Table()[i % 5]
        assert list(got) == list(want) and np.array_equal(got["x"], want["x"]) and got["x"].dtype == np.float32
        assert (got["label"], got["name"], got["tags"]) == (want["label"], want["name"], want["tags"])
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=1, collate_fn=list)
    assert [s["name"] for s in next(iter(loader))] == [f"row {i}" for i in range(5)]
    assert verify(tmp_path / "t.h5") == 5
    with pytest.raises(ValueError, match="holds no image column"):
        cf.H5Dataset(tmp_path / "t.h5", output="bytes")


def test_a_drop_in_opened_on_another_mirror_names_the_class_it_needs(boxes_mirror, tmp_path):
    """Issue 41 item 13: a COCO/VOC drop-in on a generic mirror, or H5Dataset on an image folder's,
    raised a bare ValueError: now a MirrorError naming the class the mirror's header says it needs."""
    for drop_in in (cf.H5CocoDetection, cf.H5VOCDetection, cf.H5VOCSegmentation):
        with pytest.raises(MirrorError, match=r"boxes\.h5 is a mirror of layout 'dataset', not of '.*': open it with "
                                              r"colabfast\.H5Dataset "):
            drop_in(boxes_mirror)
    folder = make_imagefolder(tmp_path / "inet", classes=2, per_class=1, size=(16, 12))
    cf.pack(folder, tmp_path / "inet.h5", progress=False)
    with pytest.raises(MirrorError, match=r"inet\.h5 is a mirror of layout 'imagefolder', not a mirror of columns: "
                                          r"open it with colabfast\.H5ImageFolder "):
        cf.H5Dataset(tmp_path / "inet.h5")
