"""Issue 41: pack() of hostile datasets and folders ends in a colabfast.Error naming the sample (or file)
and the fix, within 256 MB of what a valid input of its kind costs (measured in a child process,
tests/measured.py), in seconds, with nothing half-written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import colabfast as cf
from colabfast.mirror.columns import MAX_DEPTH, MAX_TEMPLATE_DEPTH, FieldError


class Images(torch.utils.data.Dataset):
    """Sample 1's image is 120x100 (12000 pixels), the others 10x10."""

    def __init__(self, kind: str):
        self.kind = kind

    def __len__(self) -> int:
        return 3

    def __getitem__(self, i: int):
        h, w = (100, 120) if i == 1 else (10, 10)
        if self.kind == "tensor":
            return torch.zeros(3, h, w, dtype=torch.uint8), i
        if self.kind == "ndarray":
            return np.zeros((h, w, 3), np.uint8), i
        return Image.new("RGB", (w, h)), i


@pytest.mark.parametrize("kind", ["tensor", "ndarray", "pil"])
def test_an_image_over_the_pixel_limit_is_refused_before_it_is_encoded(tmp_path, monkeypatch, kind):
    """Item 7: an image tensor over PIL.Image.MAX_IMAGE_PIXELS was encoded unchecked (the attack's process
    was killed at 4 GB), into a mirror every reader then refuses. The same limit is checked before encoding,
    the sample named as an unreadable file is, with how to raise the limit."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 10_000)
    with pytest.raises(cf.PackError, match=r"1: ImageSizeError: the image at sample 1, field '0', is 120x100, "
                                           r"0\.0 million pixels, more than the limit of 0\.0 million "
                                           r"\(PIL\.Image\.MAX_IMAGE_PIXELS\).*raise PIL\.Image\.MAX_IMAGE_PIXELS"):
        cf.pack(Images(kind), tmp_path / "m.h5", workers=0, progress=False)
    assert not (tmp_path / "m.h5").exists()
    with pytest.warns(UserWarning, match="skipped 1 samples"):
        cf.pack(Images(kind), tmp_path / "m.h5", workers=0, progress=False, on_error="skip")
    assert [cf.H5Dataset(tmp_path / "m.h5")[i][1] for i in range(2)] == [0, 2]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)  # the knob: no limit
    cf.pack(Images(kind), tmp_path / "all.h5", workers=0, progress=False)
    assert cf.H5Dataset(tmp_path / "all.h5", output="tensor")[1][0].shape == (3, 100, 120)


def _nested(depth: int, make) -> object:
    x: object = 1
    for _ in range(depth):
        x = make(x)
    return x


class Nested(torch.utils.data.Dataset):
    def __init__(self, first, later=None):
        self.first, self.later = first, later

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        return self.first if i == 0 or self.later is None else self.later


@pytest.mark.parametrize("sample, match", [
    (_nested(5000, lambda x: {"a": x}), f"sample 0 nests lists, tuples or dicts more than {MAX_DEPTH} levels deep"),
    (_nested(5000, lambda x: (x,)), f"sample 0 nests lists, tuples or dicts more than {MAX_DEPTH} levels deep"),
    (_nested(5000, lambda x: [x]), f"sample 0 nests lists, tuples or dicts more than {MAX_DEPTH} levels deep"),
    (_nested(MAX_TEMPLATE_DEPTH + 1, lambda x: (x, 0)), "field '0.0.0.0.0.0.0.0' is a tuple nested 8 levels deep"),
])
def test_a_sample_nested_too_deep_is_a_field_error(tmp_path, sample, match):
    """Item 7: a dict nested 5,000 deep raised a raw RecursionError; tuples 9 deep were packed into a
    mirror that no reader opens (its template is at most 8 deep). Both limits are stated and checked."""
    with pytest.raises(FieldError, match=match):
        cf.pack(Nested(sample), tmp_path / "n.h5", workers=0, progress=False)
    assert not (tmp_path / "n.h5").exists()


def test_a_later_sample_nested_too_deep_is_a_field_error_naming_it(tmp_path):
    with pytest.raises(FieldError, match=f"sample 1: field '1' nests lists and dicts more than {MAX_DEPTH} levels"):
        cf.pack(Nested((0, [1]), (0, _nested(5000, lambda x: [x]))), tmp_path / "n.h5", workers=0, progress=False)
    with pytest.raises(FieldError, match=r"sample 1: field '1' should be a tuple of 2 .* but it is \(\(\(\(\(\(\("):
        cf.pack(Nested((0, (1, 2)), (0, _nested(5000, lambda x: (x,)))), tmp_path / "n.h5", workers=0,
                progress=False)


def test_nesting_within_the_limits_packs_and_reads_back(tmp_path):
    # fields 8 deep with the image's tuple; lists MAX_DEPTH deep in all
    deep = (_nested(MAX_TEMPLATE_DEPTH - 2, lambda x: (x, 0)), _nested(MAX_DEPTH - 2, lambda x: [x]))
    cf.pack(Nested((torch.zeros(3, 4, 4, dtype=torch.uint8), deep)), tmp_path / "ok.h5", workers=0, progress=False)
    image, back = cf.H5Dataset(tmp_path / "ok.h5", output="tensor")[1]
    assert back == deep and image.shape == (3, 4, 4)


CLAIMS = """
    import resource, warnings
    resource.setrlimit(resource.RLIMIT_AS, (5 << 30, 5 << 30))  # today's walk of len() stops here, not the machine
    import torch
    import colabfast as cf

    class Claims(torch.utils.data.Dataset):
        def __len__(self):
            return %(n)d

        def __getitem__(self, i):
            if i >= 10:
                raise IndexError(i)
            return torch.full((3, 8, 8), i, dtype=torch.uint8), i

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cf.pack(Claims(), %(dst)r, workers=0, progress=False)
    ds = cf.H5Dataset(%(dst)r)
    assert [ds[i][1] for i in range(len(ds))] == list(range(10)), len(ds)
    assert %(n)d == 10 or any("dataset[10] raised IndexError" in str(w.message) for w in seen), seen
"""


def test_a_len_of_a_trillion_stops_at_the_first_index_error(tmp_path):
    """Item 7: a __len__ of 10^12 over 10 samples grew memory without bound (a list of every part, then
    of every path) before the first IndexError. Parts are made in order, a few at a time, and the first
    IndexError ends the dataset, as iterating it would: the 10 samples are packed, with a warning."""
    from measured import BOUND, measure

    valid = measure(CLAIMS % {"n": 10, "dst": str(tmp_path / "valid.h5")})
    assert valid.error is None, valid.error
    got = measure(CLAIMS % {"n": 10**12, "dst": str(tmp_path / "claims.h5")})
    assert got.error is None, got.error
    assert got.peak - valid.peak < BOUND and got.seconds < 60, (got.peak, valid.peak, got.seconds)


def test_the_end_found_in_a_middle_part_drops_the_parts_past_it(tmp_path, monkeypatch):
    """With parts of 4 samples made by 2 worker processes, the end (23) is found while parts past it are
    being made: they are left out, and the mirror holds samples 0..22, as iterating the dataset gives."""
    from colabfast.packing import common

    monkeypatch.setattr(common, "CHUNK", 4)

    class Ends(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 50

        def __getitem__(self, i: int):
            if i == 7:
                raise OSError("Drive said no")
            if i >= 23:
                raise IndexError(i)
            return torch.full((3, 4, 4), i, dtype=torch.uint8), i

    with pytest.warns(UserWarning, match=r"len\(\) is 50, but dataset\[23\] raised IndexError: packed samples 0..22"):
        cf.pack(Ends(), tmp_path / "e.h5", workers=2, progress=False, on_error="skip")
    ds = cf.H5Dataset(tmp_path / "e.h5")
    assert [ds[i][1] for i in range(len(ds))] == [i for i in range(23) if i != 7]
    assert cf.info(tmp_path / "e.h5").skipped == [{"path": "7", "error": "OSError: Drive said no"}]


BIG = """
    import torch
    import colabfast as cf

    class Big(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            return torch.full((%(mb)d << 20,), i, dtype=torch.uint8), i

    cf.pack(Big(), %(dst)r, workers=0, progress=False)
    ds = cf.H5Dataset(%(dst)r)  # what a reader holds: a sample at a time (a column past 64 MiB stays on disk)
    x, y = ds[1]
    assert len(ds) == 2 and x.shape == (%(mb)d << 20,) and x.min() == 1 and y == 1
"""


def test_large_samples_are_streamed_through_the_parts(tmp_path):
    """Item 7: a 300 MB tensor per sample cost 11 times its size (copies of every sample of a part to
    join them, and of every part's column to assemble it). Values go to spools as they come (a file past
    SPOOL), samples are fetched as many at a time as IN_FLIGHT holds, and the parts are copied into the
    mirror a piece at a time: two 64 MB samples cost what reading their column back costs."""
    from measured import BOUND, measure

    valid = measure(BIG % {"mb": 1, "dst": str(tmp_path / "valid.h5")})
    assert valid.error is None, valid.error
    got = measure(BIG % {"mb": 64, "dst": str(tmp_path / "big.h5")})
    assert got.error is None, got.error
    assert got.peak - valid.peak < BOUND and got.seconds < 60, (got.peak, valid.peak, got.seconds)


def _odd_folder(root, odd: bool):
    """An ImageFolder of classes a, b and c, 3 JPEGs each; with ``odd``, class a also holds a JPEG with an
    invalid UTF-8 name, one with a 255-byte name, a sparse 200 MB file named .jpg, a dangling link, and
    links to its own folder and its parent (loops); class c two links to each other."""
    import io
    import os

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 10, 10)).save(buf, "JPEG")
    for cls in ("a", "b", "c"):
        (root / cls).mkdir(parents=True)
        for i in range(3):
            (root / cls / f"{i}.jpg").write_bytes(buf.getvalue())
    if odd:
        a = os.fsencode(root / "a")
        for name in (b"bad\xff\xfe.jpg", b"x" * 251 + b".jpg"):
            with open(os.path.join(a, name), "wb") as f:
                f.write(buf.getvalue())
        with open(root / "a" / "sparse.jpg", "wb") as f:
            f.truncate(200 << 20)  # no disk: all of it a hole
        os.symlink("/nonexistent/nothing.jpg", root / "a" / "dangling.jpg")
        os.symlink("loopb.jpg", root / "c" / "loopa.jpg")
        os.symlink("loopa.jpg", root / "c" / "loopb.jpg")
        os.symlink(".", root / "a" / "here")
        os.symlink("..", root / "a" / "up")
    return root


PACK_FOLDER = """
    import resource, warnings
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # a guard for the machine, far above the bound
    import colabfast as cf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cf.pack(%(src)r, %(dst)r, on_error="skip", workers=2, progress=False)
"""


def test_a_folder_of_odd_names_links_and_a_sparse_file_packs_within_the_bound(tmp_path):
    """Item 6b: such a folder packed with on_error="skip" grew past 4 GB. The entry that costs is the sparse
    200 MB file: read whole (then sent to a worker) to learn it is no image; a file that large is now read
    whole only where an image format could start as it does. Links to each other (ELOOP) are left out as
    dangling links are, where they made the whole class folder unreadable (a raw OSError at the top)."""
    from measured import BOUND, measure

    valid = measure(PACK_FOLDER % {"src": str(_odd_folder(tmp_path / "valid", False)),
                                   "dst": str(tmp_path / "valid.h5")})
    assert valid.error is None, valid.error
    got = measure(PACK_FOLDER % {"src": str(_odd_folder(tmp_path / "odd", True)), "dst": str(tmp_path / "odd.h5")})
    assert got.error is None, got.error
    assert got.peak - valid.peak < BOUND and got.seconds < 60, (got.peak, valid.peak, got.seconds)
    ds = cf.H5ImageFolder(tmp_path / "odd.h5")
    assert len(ds) == 11 and ds.classes == ["a", "b", "c"]  # both odd names are JPEGs: packed
    skipped = [s["path"].rsplit("/", 2)[-2:] for s in cf.info(tmp_path / "odd.h5").skipped]
    assert skipped == [["a", "sparse.jpg"]], skipped
