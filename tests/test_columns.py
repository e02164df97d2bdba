"""Mirrors of columns (format version 3): pack(any map-style dataset) and H5Dataset give back what
the dataset returned, for every column kind; bad samples and bad mirrors are named errors."""

from __future__ import annotations

import io
import math

import h5py
import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors

import colabfast as cf
from colabfast.errors import MirrorError
from colabfast.mirror.columns import FieldError
from colabfast.mirror.index import load_columns


class Odd(torch.utils.data.Dataset):
    """Every column kind, with odd values: empty ragged rows, NaN, unicode, modes L/RGBA/P, no boxes."""

    def __init__(self, n: int = 7):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        rng = np.random.default_rng(i)
        g = torch.Generator().manual_seed(i)
        h, w = 9 + i, 13
        rgb = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
        palette = Image.fromarray(rng.integers(0, 4, (h, w), dtype=np.uint8)).convert("P")
        palette.putpalette([0, 0, 0, 128, 0, 0, 0, 128, 0, 128, 128, 0] + [0] * 756)
        return rgb, {
            "grey": Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)),
            "rgba": Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8)),
            "mask": palette,
            "chw": torch.from_numpy(rng.integers(0, 256, (3, h, w), dtype=np.uint8)),
            "hwc": rng.integers(0, 256, (h, w, 1), dtype=np.uint8),
            "boxes": torch.rand(i % 3, 4, generator=g),  # 0 rows in samples 0, 3, 6
            "labels": torch.arange(i % 3),
            "instances": tv_tensors.Mask(torch.zeros(i % 2, h, w, dtype=torch.uint8)),  # [0, H, W] too
            "bb": tv_tensors.BoundingBoxes(torch.rand(i % 3, 4, generator=g), format="XYWH", canvas_size=(h, w)),
            "name": f"sample {i} é 日本 \U0001f600",
            "empty": "",
            "score": float("nan") if i == 2 else i / 3,
            "big": 2**62 + i,
            "np_int": np.int16(-i),
            "np_float": np.float32(i) / 7,
            "ok": bool(i % 2),
            "blob": bytes(range(i)),
            "vector": np.full((2, 3), i, dtype=np.float64),
            "flags": np.array([i % 2 == 0, True]),
            "json": [{"id": i, "bbox": [1.5, 2, 3, 4], "tags": ["a", None]}] * (i % 2),
            "none": None,
        }


def _same(a, b, where: str) -> None:
    assert type(a) is type(b), (where, type(a), type(b))
    if isinstance(b, Image.Image):
        assert (a.mode, a.size, a.getpalette()) == (b.mode, b.size, b.getpalette()), where
        assert np.array_equal(np.asarray(a), np.asarray(b)), where
    elif isinstance(b, (torch.Tensor, np.ndarray)):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(np.asarray(a), np.asarray(b)), where
        if isinstance(b, tv_tensors.BoundingBoxes):
            assert (a.format, a.canvas_size) == (b.format, b.canvas_size), where
    elif isinstance(b, float) and math.isnan(b):
        assert math.isnan(a), where
    else:
        assert a == b, where


@pytest.fixture(scope="module")
def odd_mirror(tmp_path_factory):
    path = tmp_path_factory.mktemp("odd") / "odd.h5"
    cf.pack(Odd(), path, workers=2, progress=False)
    return path


def test_every_kind_comes_back_as_the_dataset_returned_it(odd_mirror):
    ds, ref = cf.H5Dataset(odd_mirror), Odd()
    assert len(ds) == len(ref)
    for i in range(len(ref)):
        got, want = ds[i], ref[i]
        _same(got[0], want[0], f"{i} image")
        assert list(got[1]) == list(want[1])
        for key in want[1]:
            _same(got[1][key], want[1][key], f"{i} {key}")


def test_info_lists_the_columns(odd_mirror):
    text = str(cf.info(odd_mirror))
    assert "colabfast mirror v3" in text and "1.boxes: ragged float32 [*, 4]" in text
    assert "1.json: json" in text and "1.mask: mask" in text and "1.vector: ndarray <f8 [2, 3]" in text


def test_output_tensor_and_bytes(odd_mirror):
    ref = Odd()[1]
    t = cf.H5Dataset(odd_mirror, output="tensor")[1]
    assert t[0].dtype == torch.uint8 and torch.equal(t[0].permute(1, 2, 0), torch.from_numpy(np.array(ref[0])))
    assert t[1]["mask"].shape == (1, 10, 13) and np.array_equal(t[1]["mask"][0].numpy(), np.asarray(ref[1]["mask"]))
    b = cf.H5Dataset(odd_mirror, output="bytes")[1]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(b[0].numpy().tobytes()))), np.asarray(ref[0]))


def test_transforms_apply_as_torchvision_does(odd_mirror):
    ds = cf.H5Dataset(odd_mirror, transform=lambda x: x.size, target_transform=lambda t: t["name"])
    assert ds[3] == ((13, 12), Odd()[3][1]["name"])
    joint = cf.H5Dataset(odd_mirror, transforms=lambda x, t: (t["big"], x.mode))
    assert joint[0] == (2**62, "RGB")


def test_a_jpeg_file_opened_with_pil_keeps_its_bytes(tmp_path):
    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    img.save(tmp_path / "a.jpg", quality=80)

    class Files(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            opened = Image.open(tmp_path / "a.jpg")
            return (opened if i == 0 else opened.rotate(90)), i  # sample 1's pixels are not the file's

    cf.pack(Files(), tmp_path / "m.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "m.h5", output="bytes")
    assert ds[0][0].numpy().tobytes() == (tmp_path / "a.jpg").read_bytes()
    assert ds[1][0].numpy().tobytes()[:8] == b"\x89PNG\r\n\x1a\n"  # changed pixels: stored losslessly
    assert np.array_equal(np.asarray(cf.H5Dataset(tmp_path / "m.h5")[1][0]), np.asarray(Files()[1][0]))


def test_fields_ask_for_jpeg(tmp_path):
    class Plain(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"image": Image.new("RGB", (32, 24), (10 * i, 20, 30)), "label": i}

    cf.pack(Plain(), tmp_path / "j.h5", fields={"image": "jpeg"}, quality=75, workers=0, progress=False)
    data = cf.H5Dataset(tmp_path / "j.h5", output="bytes")[2]["image"].numpy().tobytes()
    assert data[:2] == b"\xff\xd8"
    with pytest.raises(FieldError, match="'label'.*holds int"):
        cf.pack(Plain(), tmp_path / "x.h5", fields={"label": "jpeg"}, workers=0, progress=False)
    with pytest.raises(FieldError, match="'nope'"):
        cf.pack(Plain(), tmp_path / "y.h5", fields={"nope": "png"}, workers=0, progress=False)


class Drifting(torch.utils.data.Dataset):
    def __init__(self, bad):
        self.bad = bad

    def __len__(self):
        return 5

    def __getitem__(self, i):
        sample = {"image": Image.new("RGB", (8, 8)), "label": 1, "boxes": np.zeros((i, 4), np.float32)}
        if i == 3:
            sample = self.bad(sample)
        return sample


@pytest.mark.parametrize("bad, match", [
    (lambda s: {**s, "extra": 1}, "sample 3: field 'sample' should be a dict with keys"),
    (lambda s: {**s, "label": "one"}, "sample 3: field 'label' is str"),
    (lambda s: {**s, "boxes": np.zeros((3, 4), np.float64)}, "sample 3: field 'boxes' is ndarray float64"),
    (lambda s: {**s, "image": np.zeros((8, 8), np.int32)}, "sample 3: field 'image'"),
])
def test_a_sample_that_does_not_fit_names_index_and_field(tmp_path, bad, match):
    with pytest.raises(FieldError, match=match):
        cf.pack(Drifting(bad), tmp_path / "d.h5", workers=0, progress=False)
    assert not (tmp_path / "d.h5").exists()


def test_values_no_column_holds_are_refused_before_any_work(tmp_path):
    class Objects(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return Image.new("RGB", (4, 4)), object()

    with pytest.raises(FieldError, match="field '1' holds object.*nothing is pickled"):
        cf.pack(Objects(), tmp_path / "o.h5", workers=0, progress=False)


def test_a_failing_sample_is_a_pack_error_or_a_listed_skip(tmp_path):
    class Flaky(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            if i == 4:
                raise OSError("Drive said no")
            return Image.new("RGB", (8, 8), (i, 0, 0)), i

    with pytest.raises(cf.PackError, match="4: OSError: Drive said no"):
        cf.pack(Flaky(), tmp_path / "f.h5", workers=2, progress=False)
    with pytest.warns(UserWarning, match="skipped 1 samples"):
        cf.pack(Flaky(), tmp_path / "f.h5", workers=2, on_error="skip", progress=False)
    ds = cf.H5Dataset(tmp_path / "f.h5")
    assert [ds[i][1] for i in range(len(ds))] == [0, 1, 2, 3, 5]
    assert cf.info(tmp_path / "f.h5").skipped == [{"path": "4", "error": "OSError: Drive said no"}]


def test_a_dataset_that_says_what_it_holds_is_not_packed_twice(tmp_path, capsys):
    class Known(Odd):
        fingerprint = "v1"

    cf.pack(Known(3), tmp_path / "k.h5", workers=0)
    cf.pack(Known(3), tmp_path / "k.h5", workers=0)
    assert "already a complete mirror" in capsys.readouterr().out
    cf.pack(Odd(3), tmp_path / "a.h5", workers=0)
    cf.pack(Odd(3), tmp_path / "a.h5", workers=0)  # anonymous: packed again, never taken for the old one
    assert "already a complete mirror" not in capsys.readouterr().out


def test_never_overwrites_a_file_that_is_not_its_mirror(tmp_path):
    (tmp_path / "mine.h5").write_bytes(b"my thesis")
    with pytest.raises(ValueError, match="not a readable colabfast mirror"):
        cf.pack(Odd(2), tmp_path / "mine.h5", workers=0, progress=False)
    assert (tmp_path / "mine.h5").read_bytes() == b"my thesis"
    cf.pack(Odd(2), tmp_path / "m.h5", workers=0, progress=False)

    class Other(Odd):
        pass

    with pytest.raises(ValueError, match="is a mirror of .*Odd, not of .*Other"):
        cf.pack(Other(2), tmp_path / "m.h5", workers=0, progress=False)


def test_resumes_from_finished_parts(tmp_path, monkeypatch):
    from colabfast.packing import common

    monkeypatch.setattr(common, "CHUNK", 2)
    calls, armed = [], [True]

    class Counted(Odd):
        fingerprint = "counted"

        def __getitem__(self, i):
            calls.append(i)
            if i == 5 and armed[0]:
                raise KeyboardInterrupt  # killed mid-run
            return super().__getitem__(i)

    with pytest.raises(KeyboardInterrupt):
        cf.pack(Counted(), tmp_path / "r.h5", workers=0, progress=False)
    calls.clear()
    armed[0] = False
    cf.pack(Counted(), tmp_path / "r.h5", workers=0, progress=False)
    assert sorted(set(calls)) == [0, 4, 5]  # sample 0 (the fields), then the one part that failed
    assert len(cf.H5Dataset(tmp_path / "r.h5")) == 7


class Threads(torch.utils.data.Dataset):
    """Each sample: the torch thread count its reader thread sees."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int) -> dict:
        return {"threads": torch.get_num_threads(), "sum": int(torch.ones(64).sum())}


def test_pack_workers_run_torch_on_one_core_as_dataloader_workers_do(tmp_path):
    # the packing process set torch's thread count (colabfast's reader threads do): a forked worker's reader
    # threads then raced to rebuild torch's thread pool and failed ("Invalid thread pool!") about one pack in three
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        cf.pack(Threads(), tmp_path / "t.h5", workers=2, progress=False)
    finally:
        torch.set_num_threads(before)
    ds = cf.H5Dataset(tmp_path / "t.h5")
    assert [ds[i]["threads"] for i in range(len(ds))] == [1] * 16
    assert {ds[i]["sum"] for i in range(len(ds))} == {64}


def test_loader_batches_a_mirror_of_columns(odd_mirror):
    ds = cf.H5Dataset(odd_mirror, output="tensor", transforms=lambda x, t: (x[:, :8, :8], t["labels"]))
    batches = list(cf.DataLoader(ds, batch_size=3, num_workers=2))
    assert batches[0][0].shape == (3, 3, 8, 8) and len(batches[0][1]) == 3
    assert [len(x) for b in batches for x in b[1]] == [i % 3 for i in range(7)]


def _corrupt(path, edit):
    with h5py.File(path, "r+") as f:
        edit(f)


@pytest.mark.parametrize("edit, match", [
    (lambda f: f["columns/1/offsets"].__setitem__(1, 10**9), "offsets|checksum"),
    (lambda f: f["columns/2/values"].__setitem__(0, 7), "checksum"),
    (lambda f: f.attrs.__setitem__("columns", '{"template": {"column": 99}, "fields": []}'), "header_crc32|columns"),
])
def test_a_corrupt_column_is_a_mirror_error(tmp_path, edit, match):
    class Small(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return Image.new("RGB", (4, 4)), "x" * i, i

    cf.pack(Small(), tmp_path / "s.h5", workers=0, progress=False)
    _corrupt(tmp_path / "s.h5", edit)
    with pytest.raises(MirrorError, match=match):
        load_columns(tmp_path / "s.h5")


def test_a_hugging_face_dataset_keeps_its_jpeg_bytes(tmp_path):
    datasets = pytest.importorskip("datasets")  # in the test extra (Colab has it): CI runs this
    rng = np.random.default_rng(0)
    files = []
    for i in range(4):
        out = io.BytesIO()
        mode = "L" if i == 1 else "RGB"
        Image.fromarray(rng.integers(0, 256, (20 + i, 30, 3), dtype=np.uint8)).convert(mode).save(
            out, "PNG" if i == 2 else "JPEG")
        files.append({"bytes": out.getvalue(), "path": None})
    turned = Image.fromarray(rng.integers(0, 256, (10, 16, 3), dtype=np.uint8))
    exif = turned.getexif()
    exif[0x0112] = 6  # rotated: datasets turns it when it decodes
    out = io.BytesIO()
    turned.save(out, "JPEG", exif=exif)
    files.append({"bytes": out.getvalue(), "path": None})
    hf = datasets.Dataset.from_dict({"image": files, "label": [0, 1, 2, 3, 4], "caption": list("abcde")})
    hf = hf.cast_column("image", datasets.Image())
    cf.pack(hf, tmp_path / "hf.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "hf.h5")
    for i in range(len(hf)):
        got, want = ds[i], hf[i]
        assert list(got) == ["image", "label", "caption"] and got["label"] == want["label"]
        assert got["caption"] == want["caption"] and got["image"].mode == want["image"].mode
        assert np.array_equal(np.asarray(got["image"]), np.asarray(want["image"]))
    stored = cf.H5Dataset(tmp_path / "hf.h5", output="bytes")
    assert stored[0]["image"].numpy().tobytes() == files[0]["bytes"]  # the JPEG as it was
    assert stored[4]["image"].numpy().tobytes()[:4] == b"\x89PNG"  # turned by datasets: stored as it returns it
    assert cf.info(tmp_path / "hf.h5").layout == "dataset"


def _same_as_hugging_face(got, want, where):
    """One value of a mirror of a Hugging Face dataset against the dataset's own: equal values, and
    images of the same mode, size, format and pixels."""
    if isinstance(want, Image.Image):
        assert isinstance(got, Image.Image), where
        assert (got.mode, got.size, got.format) == (want.mode, want.size, want.format), where
        assert got.tobytes() == want.tobytes() and got.getpalette() == want.getpalette(), where
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def test_a_hugging_face_dataset_gives_back_none_where_it_holds_none(tmp_path):
    """Issue 39 A1: None in a str (int, float...) column after sample 0 was a FieldError, and
    fields={"col": "json"} did not help; a None image was one too. Every feature may hold None."""
    datasets = pytest.importorskip("datasets")
    out = io.BytesIO()
    Image.new("RGB", (3, 2), (9, 8, 7)).save(out, "PNG")
    features = datasets.Features({
        "text": datasets.Value("string"), "first_none": datasets.Value("string"), "n": datasets.Value("int64"),
        "x": datasets.Value("float32"), "flag": datasets.Value("bool"), "raw": datasets.Value("binary"),
        "label": datasets.ClassLabel(names=["a", "b"]), "image": datasets.Image(), "no_image": datasets.Image()})
    png = {"bytes": out.getvalue(), "path": None}
    hf = datasets.Dataset.from_dict({
        "text": ["a", None, "", None], "first_none": [None, "b", None, "d"], "n": [1, None, -(1 << 62), None],
        "x": [0.5, float("nan"), None, -1.25], "flag": [True, None, False, None], "raw": [b"\x00", None, b"", None],
        "label": [1, None, 0, None], "image": [png, None, png, None], "no_image": [None, png, None, None]},
        features=features)
    cf.pack(hf, tmp_path / "hf.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "hf.h5")
    for i in range(len(hf)):
        got, want = ds[i], hf[i]
        assert list(got) == list(want)
        for key in want:
            if isinstance(want[key], float) and math.isnan(want[key]):
                assert math.isnan(got[key])
            else:
                _same_as_hugging_face(got[key], want[key], (i, key))
    kinds = {f.name: f.kind for f in ds.fields}
    assert kinds == {"text": "str", "first_none": "str", "n": "int", "x": "float", "flag": "bool", "raw": "bytes",
                     "label": "int", "image": "image", "no_image": "image"}
    assert cf.info(tmp_path / "hf.h5").version == 4  # colabfast before nulls refuses it, not returns ""

    class Texts(torch.utils.data.Dataset):  # not Hugging Face's: fields= names the kind
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return {"t": [None, "b", "c"][i], "u": ["a", None, "c"][i]}

    cf.pack(Texts(), tmp_path / "t.h5", workers=0, progress=False, fields={"t": "str", "u": "json"})
    ds = cf.H5Dataset(tmp_path / "t.h5")
    assert [ds[i] for i in range(3)] == [Texts()[i] for i in range(3)]
    assert [f.kind for f in ds.fields] == ["str", "json"]


def test_hugging_face_images_come_back_in_their_mode_and_format(tmp_path):
    """Issue 39 A2 and A3: a 16-bit PNG (I;16) was refused as "PNG cannot hold exactly", and every
    image came back with format None. The images ``datasets`` holds: files in any format (kept as
    they are), and PIL images it encoded itself (PNG for 1, L, LA, RGB, RGBA, else TIFF)."""
    datasets = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    rgb = Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8))
    wide = Image.fromarray(rng.integers(0, 1 << 16, (5, 7), dtype=np.uint16))

    def file(img, fmt, **kw):
        out = io.BytesIO()
        img.save(out, fmt, **kw)
        return {"bytes": out.getvalue(), "path": None}

    assert wide.mode == "I;16"
    files = [file(wide, "PNG"), file(rgb, "PNG"), file(rgb, "WEBP"), file(rgb, "WEBP", lossless=True),
             file(rgb, "JPEG"), file(rgb.convert("P"), "GIF"), file(rgb.convert("CMYK"), "TIFF"),
             file(rgb.convert("LA"), "PNG"), file(rgb.convert("1"), "BMP")]
    made = [wide, rgb.convert("P"), rgb.convert("RGBA"), rgb.convert("1"), rgb.convert("F"), rgb.convert("I"),
            rgb.convert("CMYK"), rgb.convert("YCbCr"), Image.fromarray(rng.integers(0, 255, (5, 7), dtype=np.uint8))]
    hf = datasets.Dataset.from_dict({"image": files + made, "i": list(range(len(files) + len(made)))},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "i": datasets.Value("int32")}))
    cf.pack(hf, tmp_path / "hf.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "hf.h5")
    seen = set()
    for i in range(len(hf)):
        got, want = ds[i], hf[i]
        _same_as_hugging_face(got["image"], want["image"], i)
        seen.add((want["image"].mode, want["image"].format))
    assert {("I;16", "PNG"), ("I;16", "TIFF"), ("F", "TIFF"), ("I", "TIFF"), ("RGB", "WEBP"), ("RGB", "JPEG"),
            ("P", "GIF"), ("CMYK", "TIFF"), ("YCbCr", "TIFF")} <= seen

    # a feature's mode: datasets converts what it decodes (format None), and so does the mirror's
    hf = hf.cast_column("image", datasets.Image(mode="RGB"))
    cf.pack(hf, tmp_path / "rgb.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "rgb.h5")
    for i in range(len(hf)):
        _same_as_hugging_face(ds[i]["image"], hf[i]["image"], i)


def test_a_pil_image_of_any_mode_comes_back_in_its_mode_and_format(tmp_path):
    """Issue 39 A2 for any dataset: PIL images in modes PNG does not hold exactly (I, F, CMYK) were a
    FieldError; they are stored as TIFF, as datasets stores them. A PNG file's image keeps "PNG"."""
    rng = np.random.default_rng(1)
    rgb = Image.fromarray(rng.integers(0, 256, (6, 4, 3), dtype=np.uint8))
    rgb.save(tmp_path / "a.png")
    modes = ["I;16", "I", "F", "CMYK", "LA", "P"]

    class Modes(torch.utils.data.Dataset):
        def __len__(self):
            return len(modes) + 1

        def __getitem__(self, i):
            if i == len(modes):
                return Image.open(tmp_path / "a.png")
            return rgb.convert("L").convert(modes[i]) if modes[i] == "I;16" else rgb.convert(modes[i])

    cf.pack(Modes(), tmp_path / "m.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "m.h5")
    for i in range(len(ds)):
        _same_as_hugging_face(ds[i], Modes()[i], i)
    assert ds[len(modes)].format == "PNG" and ds[0].format is None

    class Unheld(torch.utils.data.Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, i):
            return rgb.convert("HSV")

    with pytest.raises(FieldError, match="mode HSV, which neither PNG nor TIFF holds exactly"):
        cf.pack(Unheld(), tmp_path / "u.h5", workers=0, progress=False)


def test_reader_threads_build_the_batches_workers_build(odd_mirror):
    ds = cf.H5Dataset(odd_mirror, output="tensor")
    threaded = cf.DataLoader(ds, batch_size=3)
    assert "colabfast.loading.reader" in repr(threaded) and "targets from the columns" in repr(threaded)
    workers = cf.DataLoader(ds, batch_size=3, num_workers=2)
    assert "worker" in repr(workers)
    for (ia, ta), (ib, tb) in zip(threaded, workers, strict=True):
        assert len(ia) == len(ib) and all(torch.equal(a, b) for a, b in zip(ia, ib))
        assert isinstance(ta, list) and isinstance(tb, list)  # dicts holding ragged fields: one per sample
        for a, b in zip(ta, tb, strict=True):
            assert list(a) == list(b)
            for key in a:
                _same(a[key], b[key], key)
    assert "worker processes" in repr(cf.DataLoader(cf.H5Dataset(odd_mirror, output="tensor",
                                                                 transform=lambda x: x), batch_size=3))


def test_ragged_targets_stay_per_sample_even_when_a_batch_holds_one_size(tmp_path):
    class Boxes(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            m = 1 if i < 3 else i  # samples 0-2 hold one box each: a batch of them could be stacked
            return (torch.zeros(3, 8, 8, dtype=torch.uint8),
                    {"boxes": torch.full((m, 4), float(i)), "labels": torch.arange(m)})

    cf.pack(Boxes(), tmp_path / "b.h5", workers=0, progress=False)
    ds = cf.H5Dataset(tmp_path / "b.h5")
    assert ds.per_sample() == {(1,)}
    for workers in (0, 2):
        batches = list(cf.DataLoader(ds, batch_size=3, num_workers=workers))
        for images, targets in batches:
            assert images.shape == (3, 3, 8, 8) and isinstance(targets, list) and len(targets) == 3
            assert all(set(t) == {"boxes", "labels"} and t["boxes"].shape[1] == 4 for t in targets)
        assert [t["boxes"].shape[0] for _, ts in batches for t in ts] == [1, 1, 1, 3, 4, 5]
