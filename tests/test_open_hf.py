"""colabfast.open_dataset of a Hugging Face dataset (issue 40, item 2): a ``datasets.Dataset``, a
split of a ``DatasetDict`` and an ``IterableDataset`` that ends are packed once into the mirrors
folder, found again by their fingerprint (an IterableDataset's: its rows' hash), and opened as an
H5Dataset whose samples are the dataset's own ``dataset[i]``. No Drive: ``mirrors=`` a local folder."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import colabfast as cf
import colabfast.packing
from colabfast.errors import OpenRefused
from colabfast.opening.mirrors import default_dataset_mirrors
from colabfast.where import env
from colabfast.where.env import MIRRORS_FOLDER

datasets = pytest.importorskip("datasets")  # in the test extra (Colab has it): CI runs this

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def local(local, monkeypatch):
    """conftest's ``local``, and no Drive mount seen."""
    monkeypatch.setattr(env, "drive_mounts", lambda: [])
    return local


def _file(img: Image.Image, fmt: str) -> dict:
    out = io.BytesIO()
    img.save(out, fmt)
    return {"bytes": out.getvalue(), "path": None}


FEATURES = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "owl"]),
                              "caption": datasets.Value("string"), "score": datasets.Value("float32")})


def _rows(n: int = 7, seed: int = 0) -> dict:
    """Images as datasets holds them: JPEG and PNG files (RGB and L) and a PIL image it encodes itself."""
    rng = np.random.default_rng(seed)
    images = []
    for i in range(n):
        img = Image.fromarray(rng.integers(0, 256, (9 + i, 13, 3), dtype=np.uint8))
        images.append(img if i == 3 else _file(img.convert("L") if i == 2 else img, "JPEG" if i % 2 else "PNG"))
    return {"image": images, "label": [i % 3 for i in range(n)], "caption": [f"photo {i} é" for i in range(n)],
            "score": [i / 3 - 1 for i in range(n)]}


def _dataset(n: int = 7, seed: int = 0, name: str = "pets") -> datasets.Dataset:
    return datasets.Dataset.from_dict(_rows(n, seed), features=FEATURES,
                                      info=datasets.DatasetInfo(dataset_name=name, features=FEATURES))


def _same(got, want, where) -> None:
    if isinstance(want, Image.Image):
        assert isinstance(got, Image.Image), where
        assert (got.mode, got.size, got.format) == (want.mode, want.size, want.format), where
        assert got.tobytes() == want.tobytes(), where
    else:
        assert type(got) is type(want) and got == want, (where, got, want)


def _same_samples(ds, rows: list[dict]) -> None:
    assert isinstance(ds, cf.H5Dataset) and len(ds) == len(rows)
    for i, want in enumerate(rows):
        got = ds[i]
        assert list(got) == list(want), i
        for key in want:
            _same(got[key], want[key], (i, key))


def _mirrors(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.h5"))


def _no_pack(monkeypatch) -> None:
    """A second call must find the mirror: packing again fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("open_dataset packed again")

    monkeypatch.setattr(colabfast.packing, "pack", refuse)


def test_a_dataset_opens_as_its_own_samples_and_is_found_again(local, monkeypatch):
    hf = _dataset()
    folder = local / "mirrors"
    ds = cf.open_dataset(hf, mirrors=folder, to="disk", workers=0, progress=False)
    _same_samples(ds, [hf[i] for i in range(len(hf))])
    assert {hf[i]["image"].format for i in range(len(hf))} >= {"PNG", "JPEG"}  # the files' formats came back
    assert hf[2]["image"].mode == "L"
    names = _mirrors(folder)
    assert len(names) == 1 and names[0].startswith("pets-") and names[0].endswith(".h5")
    assert "packed" in ds.account and hf._fingerprint[:16] in ds.account
    assert cf.info(folder / names[0]).layout == "dataset"
    before = os.stat(folder / names[0])

    _no_pack(monkeypatch)
    again = cf.open_dataset(hf, mirrors=folder, to="disk", workers=0, progress=False)
    after = os.stat(folder / names[0])
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    assert _mirrors(folder) == names
    assert "found a mirror of it made" in again.account and "packed" not in again.account
    _same_samples(again, [hf[i] for i in range(len(hf))])


def test_a_changed_dataset_gets_a_new_mirror_beside_the_old(local):
    folder = local / "mirrors"
    hf = _dataset()
    cf.open_dataset(hf, mirrors=folder, workers=0, progress=False)
    first = _mirrors(folder)
    changed = hf.map(lambda row: {"caption": row["caption"].upper()})
    assert changed._fingerprint != hf._fingerprint
    ds = cf.open_dataset(changed, mirrors=folder, workers=0, progress=False)
    names = _mirrors(folder)
    assert len(names) == 2 and set(first) < set(names)
    assert f"kept {first[0]}" in ds.account
    _same_samples(ds, [changed[i] for i in range(len(changed))])
    assert ds[0]["caption"] == "PHOTO 0 É"


def test_a_dataset_dict_opens_the_split_asked_for(local):
    folder = local / "mirrors"
    dd = datasets.DatasetDict(train=_dataset(7, 0), test=_dataset(3, 1))
    ds = cf.open_dataset(dd, split="test", mirrors=folder, workers=0, progress=False)
    _same_samples(ds, [dd["test"][i] for i in range(3)])
    assert [n.rsplit("-", 1)[0] for n in _mirrors(folder)] == ["pets-test"]

    one = datasets.DatasetDict(validation=_dataset(2, 2))  # one split: no split= needed
    _same_samples(cf.open_dataset(one, mirrors=folder, workers=0, progress=False), [one["validation"][i]
                                                                                    for i in range(2)])


@pytest.mark.parametrize("split", [None, "val"])
def test_a_dataset_dict_of_several_splits_needs_split(local, split):
    folder = local / "mirrors"
    dd = datasets.DatasetDict(train=_dataset(7, 0), test=_dataset(3, 1))
    with pytest.raises(cf.errors.PackRefused) as caught:
        cf.open_dataset(dd, split=split, mirrors=folder, workers=0, progress=False)
    assert isinstance(caught.value, cf.Error)
    message = str(caught.value)
    assert "'test' (3 rows)" in message and "'train' (7 rows)" in message
    assert "open_dataset(dataset_dict, split='train')" in message
    assert (split is None) == ("several splits" in message) and (split is None or "no split 'val'" in message)
    assert not folder.exists()  # refused before anything was written


def test_an_iterable_dataset_dict_needs_split_too(local):
    rows = datasets.Dataset.from_dict({"n": [1, 2, 3]})
    idd = datasets.IterableDatasetDict(train=rows.to_iterable_dataset(), test=rows.to_iterable_dataset())
    with pytest.raises(cf.errors.PackRefused, match=r"this IterableDatasetDict: several splits: 'test' \(rows not "
                                                    r"counted\), 'train' \(rows not counted\)\. Pass split= one of "
                                                    r"them: open_dataset\(dataset_dict, split='train'\)"):
        cf.open_dataset(idd, mirrors=local / "mirrors", progress=False)
    ds = cf.open_dataset(idd, split="test", mirrors=local / "mirrors", workers=0, progress=False)
    assert [ds[i] for i in range(len(ds))] == [{"n": 1}, {"n": 2}, {"n": 3}]


def test_an_iterable_dataset_is_read_each_time_and_found_by_its_rows(local, monkeypatch):
    """An IterableDataset has no fingerprint: its rows are read to local disk on every call, and their
    hash finds its mirror; other rows get another mirror."""
    folder = local / "mirrors"

    def iterable(seed: int):
        rows = _rows(5, seed)
        rows["image"][3] = _file(rows["image"][3], "PNG")  # a generator yields what datasets holds: files

        def gen():
            for i in range(5):
                yield {key: rows[key][i] for key in rows}

        return datasets.IterableDataset.from_generator(gen, features=FEATURES)

    source = iterable(0)
    # An IterableDataset made from a generator yields the generator's values, not cast to its features
    # (a float32 score is the Python float it was given); the mirror holds them as the features say,
    # as the same rows read into a Dataset give them.
    want = [{**row, "score": float(np.float32(row["score"]))} for row in source]
    assert want != list(source)  # the score is what differs, and only it
    ds = cf.open_dataset(source, mirrors=folder, workers=0, progress=False)
    _same_samples(ds, want)
    assert "no fingerprint" in ds.account and "packed" in ds.account
    names = _mirrors(folder)
    assert len(names) == 1 and names[0].startswith("generator-train-")
    assert not any((env.work_dir() / "hf").iterdir())  # the rows read to local disk are gone

    with monkeypatch.context() as m:  # the same rows from a new IterableDataset: found, not packed
        _no_pack(m)
        again = cf.open_dataset(iterable(0), mirrors=folder, workers=0, progress=False)
    assert "found a mirror of it made" in again.account and _mirrors(folder) == names
    _same_samples(again, want)

    other = iterable(1)
    ds = cf.open_dataset(other, mirrors=folder, workers=0, progress=False)
    assert len(_mirrors(folder)) == 2
    _same_samples(ds, [{**row, "score": float(np.float32(row["score"]))} for row in other])


def test_what_open_dataset_does_not_take_is_named_with_the_call_to_make(local):
    class Squares(torch.utils.data.Dataset):
        def __len__(self):
            return 3

        def __getitem__(self, i):
            return i * i

    assert cf.errors.OpenRefused is OpenRefused  # exported at the top, as every colabfast error
    for obj in (Squares(), 42):
        with pytest.raises(OpenRefused) as caught:
            cf.open_dataset(obj, mirrors=local / "mirrors", progress=False)
        assert isinstance(caught.value, cf.Error) and isinstance(caught.value, TypeError)
    with pytest.raises(OpenRefused, match=r"Squares, a map-style dataset.*colabfast\.pack\(dataset, "):
        cf.open_dataset(Squares(), progress=False)
    with pytest.raises(OpenRefused, match="a builtins.int: it takes a path"):
        cf.open_dataset(42, progress=False)

    hf = _dataset(3)
    with pytest.raises(cf.errors.PackRefused, match="this Dataset is one split already"):
        cf.open_dataset(hf, split="train", mirrors=local / "mirrors", progress=False)
    with pytest.raises(cf.errors.PackRefused, match="layout, shuffle: pack options for a folder"):
        cf.open_dataset(hf, mirrors=local / "mirrors", layout="imagefolder", shuffle=True, progress=False)
    with pytest.raises(cf.errors.PackRefused, match="image_size=32: a Hugging Face Dataset's images are packed as it "
                                             "holds them"):
        cf.open_dataset(hf, mirrors=local / "mirrors", image_size=32, progress=False)
    with pytest.raises(cf.errors.PackRefused, match="store='raw' is for folders"):
        cf.open_dataset(hf, mirrors=local / "mirrors", store="raw", progress=False)
    assert not (local / "mirrors").exists()


def test_mirrors_of_a_dataset_go_to_my_drive_when_mounted_else_the_local_cache(local, monkeypatch):
    assert default_dataset_mirrors() == local / "cache" / MIRRORS_FOLDER
    ds = cf.open_dataset(_dataset(3), workers=0, progress=False)  # no mirrors=: the cache, opened in place
    assert [p.parent for p in (local / "cache" / MIRRORS_FOLDER).glob("pets-*.h5")] == [local / "cache" /
                                                                                         MIRRORS_FOLDER]
    assert "opened in place" in ds.account
    mount = local / "drive"
    (mount / "MyDrive").mkdir(parents=True)
    monkeypatch.setattr(env, "drive_mounts", lambda: [env.DriveMount(str(mount), "standin")])
    assert default_dataset_mirrors() == mount / "MyDrive" / MIRRORS_FOLDER
    # several Drives (another process's stand-in beside ours): Colab's /content/drive, else the first by
    # mountpoint, whatever order they are listed in (it took the first listed, which changed between calls)
    other = local / "a-drive"
    (other / "MyDrive").mkdir(parents=True)
    monkeypatch.setattr(env, "COLAB_CONTENT", str(local))  # so that local/drive plays /content/drive
    for listed in ([mount, other], [other, mount]):
        monkeypatch.setattr(env, "drive_mounts", lambda listed=listed: [env.DriveMount(str(m), "standin")
                                                                        for m in listed])
        assert default_dataset_mirrors() == mount / "MyDrive" / MIRRORS_FOLDER
    monkeypatch.setattr(env, "COLAB_CONTENT", "/nowhere")
    for listed in ([mount, other], [other, mount]):
        monkeypatch.setattr(env, "drive_mounts", lambda listed=listed: [env.DriveMount(str(m), "standin")
                                                                        for m in listed])
        assert default_dataset_mirrors() == other / "MyDrive" / MIRRORS_FOLDER


def test_importing_colabfast_does_not_import_datasets():
    code = ("import sys, colabfast, colabfast.opening, colabfast.packing.hf, colabfast.packing; "
            "colabfast.open_dataset; assert 'datasets' not in sys.modules, 'datasets imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --- issue 51, item 9: rows streamed, and images checked as any image --------------------------------------

MB = 1 << 20
ROWS_CODE = """
import datasets, colabfast as cf
datasets.disable_progress_bars()
blob = bytes(range(256)) * ({size} // 256)  # one row's bytes (the same object in every row: the source costs one)
features = datasets.Features({{"blob": datasets.Value("binary"), "label": datasets.Value("int64")}})

def rows():
    for i in range({rows}):
        yield {{"blob": blob, "label": i}}

if {iterable}:
    ds = datasets.IterableDataset.from_generator(rows, features=features)
else:  # on disk, memory-mapped, as load_dataset gives it
    ds = datasets.Dataset.from_generator(rows, features=features, cache_dir={out!r} + "/cache", writer_batch_size=1)
open("/proc/self/clear_refs", "w").write("5")  # the peak (VmHWM) from here on: opening or packing it
with open("/proc/self/status") as f:  # what the process holds now: the rows' source, what made it
    open({out!r} + "/base", "w").write(next(line.split()[1] for line in f if line.startswith("VmRSS:")))
if {iterable}:
    cf.open_dataset(ds, mirrors={out!r} + "/mirrors", to="disk", workers=0, progress=False)
else:
    cf.pack(ds, {out!r} + "/m.h5", workers=0, progress=False)
"""


@pytest.mark.parametrize("iterable", [True, False], ids=["IterableDataset, open_dataset", "Dataset on disk, pack"])
def test_rows_of_100_mb_cost_about_a_row_over_the_dataset(local, iterable):
    """Rows reach the mirror one at a time (workers=0: the workers' code, in the measured process): three rows of
    100 MB cost at most the dataset (its pages mapped as they are read) and two rows more than three rows of 4 kB.
    Before, an IterableDataset's rows were all held to be written (datasets writes 100 binary rows a batch),
    +800 MB for three rows, +1.7 GB for six, and the mirror's check read two rows at once."""
    from measured import measure

    costs = {}
    for size in (4096, 100 * MB):
        out = local / f"out-{size}"
        out.mkdir()
        got = measure(ROWS_CODE.format(size=size, rows=3, iterable=iterable, out=str(out)))
        assert got.error is None, got.error
        costs[size] = got.peak - int((out / "base").read_text()) * 1024  # the peak over what it held before
    assert costs[100 * MB] - costs[4096] < 3 * 100 * MB + 2 * 100 * MB, costs


def _png_bomb(width: int, height: int) -> bytes:
    """An RGB PNG of ``width`` x ``height`` black pixels, compressed row by row (never held decoded)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return len(data).to_bytes(4, "big") + kind + data + zlib.crc32(kind + data).to_bytes(4, "big")

    z, row = zlib.compressobj(9), bytes(1 + 3 * width)  # filter byte 0, then the row's pixels
    idat = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    head = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


BAD_IMAGES = {  # bytes in an Image feature, and what the refusal says
    "not an image": (b"this is not an image" * 10, "cannot decode the image at row {row}, feature 'image'"),
    "cut short": (None, "cannot decode the image at row {row}, feature 'image'"),
    "a pixel bomb": (_png_bomb(12000, 12000), "the image at row {row}, feature 'image' is 12000x12000, 144.0 million "
                                              "pixels, more than the limit"),
}


@pytest.mark.parametrize("row", [0, 2])
@pytest.mark.parametrize("case", BAD_IMAGES)
def test_image_bytes_pil_cannot_open_or_a_pixel_bomb_are_refused_naming_the_row(local, case, row):
    """As pack refuses any image file: one PackError naming the row (with on_error="skip", left out and listed),
    nothing decoded of a bomb. Before, row 0 gave Pillow's own UnidentifiedImageError, later rows Pillow's
    words ("cannot identify image file <_io.BytesIO ...>"), and a bomb was decoded first."""
    good = _file(Image.new("RGB", (9, 7), (10, 20, 30)), "PNG")
    data, words = BAD_IMAGES[case]
    bad = {"bytes": data if data is not None else good["bytes"][:40], "path": None}
    hf = datasets.Dataset.from_dict({"image": [bad if i == row else good for i in range(4)], "label": [0, 1, 2, 3]},
                                    features=datasets.Features({"image": datasets.Image(),
                                                                "label": datasets.Value("int64")}))
    for call in (lambda: cf.pack(hf, local / "m.h5", workers=0, progress=False),
                 lambda: cf.open_dataset(hf, mirrors=local / "mirrors", workers=0, progress=False)):
        with pytest.raises(cf.PackError) as refused:
            call()
        assert f"\n  {row}: " in str(refused.value) and words.format(row=row) in str(refused.value), str(refused.value)
    assert not (local / "m.h5").exists() and not any(local.rglob("*.h5"))
    with pytest.warns(UserWarning, match="skipped 1 samples"):
        cf.pack(hf, local / "m.h5", workers=0, on_error="skip", progress=False)
    mirror = cf.H5Dataset(local / "m.h5")
    assert [mirror[i]["label"] for i in range(len(mirror))] == [i for i in range(4) if i != row]
    assert [s["path"] for s in cf.info(local / "m.h5").header.skipped] == [str(row)]


def test_a_pixel_bomb_costs_what_a_valid_image_costs(local, tmp_path):
    """Its header is read, its pixels never: before, packing it decoded 432 MB (+550 MB over a valid image)."""
    from measured import BOUND, measure

    code = """
import datasets, colabfast as cf
datasets.disable_progress_bars()
data = open({path!r}, "rb").read()
hf = datasets.Dataset.from_dict({{"image": [{{"bytes": data, "path": None}}]}}, features=datasets.Features(
    {{"image": datasets.Image()}}))
cf.pack(hf, {out!r}, workers=0, progress=False)
"""
    (tmp_path / "bomb.png").write_bytes(_png_bomb(12000, 12000))
    (tmp_path / "valid.png").write_bytes(_file(Image.new("RGB", (16, 16)), "PNG")["bytes"])
    ok = measure(code.format(path=str(tmp_path / "valid.png"), out=str(tmp_path / "valid.h5")))
    assert ok.error is None, ok.error
    got = measure(code.format(path=str(tmp_path / "bomb.png"), out=str(tmp_path / "bomb.h5")))
    assert got.colabfast_error and "row 0, feature 'image' is 12000x12000" in got.error, got.error
    assert got.peak - ok.peak < BOUND, (got.peak, ok.peak)


def test_a_save_to_disk_folder_opens_as_load_from_disk_reads_it(local, monkeypatch):
    """Issue 52, item 4: a Dataset's save_to_disk folder (it raised NothingToOpen), its mirror beside it."""
    hf = _dataset()
    hf.save_to_disk(str(local / "saved"))
    want = datasets.load_from_disk(str(local / "saved"))
    ds = cf.open_dataset(local / "saved", workers=0, progress=False)
    _same_samples(ds, [want[i] for i in range(len(want))])
    assert "datasets.load_from_disk" in ds.account and len(_mirrors(local / MIRRORS_FOLDER)) == 1
    _no_pack(monkeypatch)
    again = cf.open_dataset(str(local / "saved"), workers=0, progress=False)
    assert "found a mirror of it made" in again.account


def test_a_saved_dataset_dict_folder_needs_split(local):
    dd = datasets.DatasetDict(train=_dataset(7, 0), test=_dataset(3, 1))
    dd.save_to_disk(str(local / "saved"))
    with pytest.raises(cf.SplitRefused, match=r"'test' \(3 rows\).*'train' \(7 rows\)"):
        cf.open_dataset(local / "saved", workers=0, progress=False)
    ds = cf.open_dataset(local / "saved", "test", workers=0, progress=False)
    _same_samples(ds, [dd["test"][i] for i in range(3)])
