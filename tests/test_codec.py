"""colabfast.where.codec: TorchCodec's decode_jpeg where torchcodec >= 0.16 works, torchvision.io's otherwise
(not installed, too old, broken), chosen once; the same pixels as PIL either way, EXIF orientation not
applied, and no torchvision deprecation warning out of it."""

from __future__ import annotations

import io
import warnings
from importlib import metadata

import numpy as np
import pytest
import torch
from PIL import Image

from colabfast.images.decode import decode_cpu
from colabfast.testing.data import encode, photo
from colabfast.where import codec


@pytest.fixture(autouse=True)
def choose_again():
    codec._reset()
    yield
    codec._reset()


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def pil_rgb(data: bytes) -> torch.Tensor:
    """PIL's stored pixels (Image.open applies no EXIF orientation), as RGB uint8 [3, H, W]."""
    return torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)


def jpeg(mode="RGB", subsampling=0, progressive=False, orientation=None, size=(61, 37)) -> bytes:
    img = photo(*size, np.random.default_rng(3)).convert(mode)
    buf = io.BytesIO()
    extra = {}
    if orientation is not None:
        exif = img.getexif()
        exif[0x0112] = orientation
        extra["exif"] = exif
    img.save(buf, "JPEG", quality=90, subsampling=subsampling, progressive=progressive, **extra)
    return buf.getvalue()


def extraneous(data: bytes) -> bytes:
    """A JPEG libjpeg decodes only with a warning (bytes before the end marker): simplejpeg refuses it."""
    return data[:-2] + bytes(40) + data[-2:]


CASES = {
    "baseline 4:4:4": jpeg(),
    "4:2:0": jpeg(subsampling=2),
    "progressive 4:2:2": jpeg(subsampling=1, progressive=True),
    "grey": jpeg("L", subsampling=-1),
    "CMYK": encode(photo(40, 30, np.random.default_rng(6)).convert("CMYK")),
    **{f"EXIF orientation {o}": jpeg(orientation=o, size=(64, 48)) for o in range(1, 9)},
    "extraneous bytes, EXIF 6": extraneous(jpeg(orientation=6, size=(48, 32))),
}


def no_torchcodec(monkeypatch, version=None, module_error=None):
    """Make torchcodec look absent (version None), at ``version``, or failing to import with ``module_error``."""
    real_version, real_import = metadata.version, codec.importlib.import_module

    def fake_version(name):
        if name != "torchcodec":
            return real_version(name)
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    def fake_import(name, *args, **kwargs):
        if name.startswith("torchcodec"):
            if module_error is None:
                raise AssertionError(f"{name} imported, though its version rules it out")
            raise module_error
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(codec.metadata, "version", fake_version)
    monkeypatch.setattr(codec.importlib, "import_module", fake_import)


def decodes_like_pil():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # torchvision 0.29's must not get out
        for name, data in CASES.items():
            got = codec.decode_jpeg(as_tensor(data))
            assert got.dtype == torch.uint8 and torch.equal(got, pil_rgb(data)), name
        batch = codec.decode_jpeg([as_tensor(d) for d in CASES.values()])
        assert isinstance(batch, list) and len(batch) == len(CASES)
        assert all(torch.equal(got, pil_rgb(d)) for got, d in zip(batch, CASES.values()))
        odd = CASES["extraneous bytes, EXIF 6"]  # simplejpeg refuses it: the CPU decode's fallback is the codec
        assert torch.equal(decode_cpu(as_tensor(odd)), pil_rgb(odd))


def test_the_chosen_codec_gives_pils_stored_pixels():
    decodes_like_pil()
    chosen = codec.jpeg_codec()
    assert chosen.name in ("torchcodec", "torchvision.io") and chosen.version and chosen.why
    assert codec.jpeg_codec() is chosen  # chosen once


@pytest.mark.torchcodec
def test_torchcodec_is_chosen_where_it_is_new_enough():
    pytest.importorskip("torchcodec")
    version = metadata.version("torchcodec")
    if codec._version(version) < codec.MIN_TORCHCODEC:
        pytest.skip(f"torchcodec {version} is older than 0.16")
    chosen = codec.jpeg_codec()
    assert (chosen.name, chosen.version) == ("torchcodec", version), chosen
    decodes_like_pil()


def test_torchvision_is_chosen_without_torchcodec(monkeypatch):
    no_torchcodec(monkeypatch)
    chosen = codec.jpeg_codec()
    assert chosen.name == "torchvision.io" and chosen.why == "torchcodec is not installed"
    decodes_like_pil()


def test_an_old_torchcodec_is_not_even_imported(monkeypatch):
    no_torchcodec(monkeypatch, "0.11.0")  # Colab's, late 2026: audio and video only
    chosen = codec.jpeg_codec()
    assert chosen.name == "torchvision.io" and "torchcodec 0.11.0 is older than 0.16" in chosen.why
    decodes_like_pil()


def test_a_broken_torchcodec_falls_back_and_says_why(monkeypatch):
    no_torchcodec(monkeypatch, "0.17.0", OSError("libtorchcodec_core7.so: undefined symbol: _ZN3c10"))
    chosen = codec.jpeg_codec()
    assert chosen.name == "torchvision.io"
    assert chosen.why.startswith("torchcodec 0.17.0 did not work: OSError: libtorchcodec_core7.so: undefined")
    decodes_like_pil()


def test_a_torchcodec_that_decodes_wrong_pixels_falls_back(monkeypatch):
    wrong = type("decoders", (), {"decode_jpeg": staticmethod(lambda data, mode, device: torch.zeros(3, 8, 16,
                                                                                                   dtype=torch.uint8))})
    no_torchcodec(monkeypatch, "0.17.0")
    real_import = codec.importlib.import_module
    monkeypatch.setattr(codec.importlib, "import_module",
                        lambda name, *a, **k: wrong if name == "torchcodec.decoders" else real_import(name, *a, **k))
    chosen = codec.jpeg_codec()
    assert chosen.name == "torchvision.io" and "not libjpeg-turbo's pixels" in chosen.why


@pytest.mark.torchcodec
def test_both_codecs_give_the_same_pixels(monkeypatch):
    pytest.importorskip("torchcodec")
    if codec.jpeg_codec().name != "torchcodec":
        pytest.skip(f"torchcodec is not used here: {codec.jpeg_codec().why}")
    ours = [codec.decode_jpeg(as_tensor(d)) for d in CASES.values()]
    codec._reset()
    no_torchcodec(monkeypatch)
    assert codec.jpeg_codec().name == "torchvision.io"
    theirs = [codec.decode_jpeg(as_tensor(d)) for d in CASES.values()]
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs))


def test_exif_is_hidden_from_the_decoder_in_a_copy():
    plain = as_tensor(jpeg())
    assert codec.without_exif(plain) is plain  # no APP1: the same tensor, no copy
    data = as_tensor(jpeg(orientation=6))
    hidden = codec.without_exif(data)
    assert hidden is not data and hidden.numel() == data.numel()
    assert bytes(data.tolist()).count(b"Exif\x00\x00") == 1  # the caller's bytes are untouched
    changed = (hidden != data).nonzero().flatten().tolist()
    assert len(changed) == 1 and data[changed[0]] == 0xE1 and hidden[changed[0]] == 0xEF
    assert Image.open(io.BytesIO(bytes(hidden.tolist()))).getexif().get(0x0112) is None
    assert torch.equal(pil_rgb(bytes(hidden.tolist())), pil_rgb(bytes(data.tolist())))


def test_a_corrupt_jpeg_raises_from_either_codec(monkeypatch):
    cut = as_tensor(CASES["baseline 4:4:4"][:200])
    for absent in (False, True):
        codec._reset()
        if absent:
            no_torchcodec(monkeypatch)
        with pytest.raises(RuntimeError):
            codec.decode_jpeg(cut)
        with pytest.raises(ValueError, match="cannot decode the image at dataset index 4"):
            decode_cpu(cut, 4)
