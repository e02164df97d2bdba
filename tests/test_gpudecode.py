"""colabfast.images.decode: packed batches of files, the CPU decode (pixels equal torchvision's and PIL's)
and its errors, and the batched decode on the CPU and (CUDA-marked tests) with nvJPEG."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.io import ImageReadMode
from torchvision.io import decode_image as tv_decode_image

from colabfast.images.decode import (
    Encoded,
    EncodedImages,
    check_encoded,
    checked_jpeg_sizes,
    decode_batch,
    decode_cpu,
    decode_hwc,
    is_encoded,
    is_jpeg,
    jpeg_mask,
)
from colabfast.testing.data import encode, photo
from colabfast.where.codec import quiet_torchvision

cuda = pytest.mark.cuda


def need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def as_tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8)


def jpeg_files(n=5, size=(48, 32), seed=0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [as_tensor(encode(photo(*size, rng))) for _ in range(n)]


def decode_image(data: torch.Tensor, mode: ImageReadMode) -> torch.Tensor:
    """torchvision.io.decode_image, the oracle (deprecated by torchvision 0.29: its warning silenced here)."""
    with quiet_torchvision():
        return tv_decode_image(data, mode=mode)


def pil_rgb(data: bytes) -> torch.Tensor:
    """PIL's pixels of an encoded file, converted to RGB: uint8 [3, H, W]."""
    return torch.from_numpy(np.array(Image.open(io.BytesIO(data)).convert("RGB"))).permute(2, 0, 1)


# --- packed files -----------------------------------------------------------------------------------


def test_pack_puts_the_files_back_to_back_and_gives_them_back():
    files = [as_tensor(b"\xff\xd8\xffabc"), as_tensor(b""), as_tensor(b"\x89PNG1234567")]
    packed = EncodedImages.pack(files, [7, 8, 9])
    assert packed.data.dtype == torch.uint8
    assert bytes(packed.data.tolist()) == b"\xff\xd8\xffabc\x89PNG1234567"
    assert packed.lengths.tolist() == [6, 0, 11] and packed.lengths.dtype == torch.int64
    assert packed.indices.tolist() == [7, 8, 9] and len(packed) == 3
    assert [bytes(f.tolist()) for f in packed] == [bytes(f.tolist()) for f in files]
    assert packed.where(2) == "dataset index 9"
    anonymous = EncodedImages.pack(files)
    assert anonymous.indices is None and anonymous.where(2) == "batch position 2"
    assert EncodedImages.pack(files, shared=True).data.is_shared()
    assert not packed.data.is_shared()


def test_a_batch_of_headers_is_checked_as_check_encoded_checks_each(monkeypatch):
    """checked_jpeg_sizes passes exactly the files check_encoded passes with the declared size, and
    sends every other one (a wrong size, cut short, not a JPEG, over the pixel limit, empty) to it."""
    rng = np.random.default_rng(1)
    good = [encode(photo(40, 30, rng)) for _ in range(3)]
    files = [good[0], good[1][:40], encode(photo(40, 30, rng), "PNG"), b"", good[2], encode(photo(30, 40, rng)),
             b"\xff\xd8\xff\xe0garbage"]
    packed = EncodedImages.pack([as_tensor(f) for f in files])
    data, lengths = packed.data.numpy(), packed.lengths.numpy()
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    declared = np.array([[30, 40, 3]] * len(files))
    assert jpeg_mask(data, starts, lengths).tolist() == [True, True, False, False, True, True, True]
    sizes, passed = checked_jpeg_sizes(data, starts, lengths, declared)
    assert sizes.dtype == np.int64 and sizes.tolist() == [[30, 40]] * len(files)
    assert passed.tolist() == [True, False, False, False, True, False, False]

    def full(k):
        try:
            check_encoded(data[starts[k] : starts[k] + lengths[k]], k, declared[k][:2])
            return True
        except ValueError:
            return False

    # every file the batch check passed passes the full check; the PNG passes only the full check
    assert [full(k) for k in range(len(files))] == [True, False, True, False, True, False, False]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 30 * 40 - 1)
    assert not checked_jpeg_sizes(data, starts, lengths, declared)[1].any()
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert checked_jpeg_sizes(data, starts, lengths, declared)[1].tolist() == passed.tolist()
    empty = np.zeros(0, np.uint8)
    assert jpeg_mask(empty, np.zeros(2, np.int64), np.zeros(2, np.int64)).tolist() == [False, False]


def test_encoded_files_are_told_by_their_signature():
    rng = np.random.default_rng(0)
    img = photo(16, 12, rng)
    for fmt in ("JPEG", "PNG", "GIF", "WEBP"):
        assert is_encoded(as_tensor(encode(img, fmt))), fmt
    jpeg, png = as_tensor(encode(img)), as_tensor(encode(img, "PNG"))
    assert is_jpeg(jpeg) and not is_jpeg(png) and not is_jpeg(as_tensor(b"\xff\xd8"))
    assert is_encoded(Encoded(as_tensor(b"anything"), 3))
    assert not is_encoded(decode_cpu(jpeg))  # a decoded image [3, H, W]
    assert not is_encoded(jpeg.to(torch.int64)) and not is_encoded(jpeg[:3])
    assert not is_encoded(as_tensor(b"BM6\x00\x00\x00 a bitmap"))  # decode_image reads no BMP
    assert not is_encoded(np.frombuffer(encode(img), np.uint8))  # not a tensor


# --- the CPU decode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode, subsampling, progressive", [("RGB", 0, False), ("RGB", 2, False), ("RGB", 1, True),
                                                           ("L", -1, False)])
def test_cpu_decode_gives_torchvisions_and_pils_pixels(mode, subsampling, progressive):
    # JPEGs go to simplejpeg (GIL released, into the caller's memory); its libjpeg-turbo settings must
    # give exactly what torchvision.io.decode_image and PIL give, or the reader and worker paths differ.
    img = photo(61, 37, np.random.default_rng(3)).convert(mode)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90, subsampling=subsampling, progressive=progressive)
    data = torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)
    want = decode_image(data, mode=ImageReadMode.RGB)
    pil = torch.from_numpy(np.array(Image.open(buf).convert("RGB"))).permute(2, 0, 1)
    got = decode_cpu(data)
    assert got.shape == (3, 37, 61) and torch.equal(got, want) and torch.equal(got, pil)
    out = np.zeros((37, 61, 3), np.uint8)
    into = decode_cpu(data, 4, out=out)
    assert torch.equal(into, want) and into.data_ptr() == out.ctypes.data  # decoded in place, no copy


@pytest.mark.parametrize("fmt, mode", [("PNG", m) for m in ("RGB", "L", "LA", "RGBA", "P")]
                         + [("GIF", "P"), ("WEBP", "RGB"), ("WEBP", "RGBA")])
def test_cpu_decode_of_other_formats_gives_pils_rgb_pixels(fmt, mode):
    data = encode(photo(40, 30, np.random.default_rng(5)).convert(mode), fmt)
    got = decode_cpu(as_tensor(data))
    assert got.shape == (3, 30, 40) and got.dtype == torch.uint8
    assert torch.equal(got, pil_rgb(data))
    out = np.zeros((30, 40, 3), np.uint8)
    assert torch.equal(decode_cpu(as_tensor(data), out=out), got) and np.array_equal(out, got.permute(1, 2, 0).numpy())


def test_cpu_decode_of_a_cmyk_jpeg_is_rgb():
    data = encode(photo(40, 30, np.random.default_rng(6)).convert("CMYK"))
    got = decode_cpu(as_tensor(data))
    assert got.shape == (3, 30, 40)
    assert (got.int() - pil_rgb(data).int()).abs().max() <= 1  # PIL's CMYK to RGB rounds apart


def test_cpu_decode_into_memory_of_the_wrong_size_or_of_bad_bytes_names_the_image():
    data = jpeg_files(1, size=(48, 32))[0]
    for shape in [(32, 47, 3), (40, 48, 3)]:  # smaller and larger than the image
        with pytest.raises(ValueError, match="dataset index 5 is 48x32, not the"):
            decode_cpu(data, 5, out=np.zeros(shape, np.uint8))
    png = torch.frombuffer(bytearray(encode(photo(20, 10, np.random.default_rng(0)), "PNG")), dtype=torch.uint8)
    out = np.zeros((10, 20, 3), np.uint8)
    assert torch.equal(decode_cpu(png, out=out), decode_image(png, mode=ImageReadMode.RGB)) and out.any()
    with pytest.raises(ValueError, match=r"dataset index 9 \(10 bytes"):
        decode_cpu(data[:10].clone(), 9)
    # A JPEG libjpeg decodes only with a warning (simplejpeg refuses it) decodes as torchvision does.
    raw = bytes(data.tolist())
    odd = torch.frombuffer(bytearray(raw[:-2] + bytes(40) + raw[-2:]), dtype=torch.uint8)
    assert torch.equal(decode_cpu(odd, out=np.zeros((32, 48, 3), np.uint8)), decode_image(odd, mode=ImageReadMode.RGB))


def test_decode_into_a_reused_buffer_checks_the_declared_size_as_the_header_check_does(monkeypatch):
    """The reader threads' path: a scratch buffer larger than the image, the header's check folded into
    the decode. Every size the header would refuse is refused, with the same message."""
    data = jpeg_files(1, size=(48, 32))[0]
    scratch = np.zeros(10_000, np.uint8)
    got = decode_hwc(data, 5, (32, 48), scratch)
    assert np.shares_memory(got, scratch) and np.array_equal(got, decode_cpu(data).permute(1, 2, 0).numpy())
    for size in [(48, 32), (32, 47), (32, 49), (31, 48), (16, 96)]:  # transposed, narrower, wider, same pixels
        with pytest.raises(ValueError, match="dataset index 5 is 48x32, not the"):
            decode_hwc(data, 5, size, scratch)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # the declared size is over the limit: refused unread
    with pytest.raises(ValueError, match="dataset index 5 is 48x32, 0.0 million pixels, more than the limit"):
        decode_hwc(data, 5, (32, 48), scratch)


def test_cpu_decode_errors_name_the_image_and_the_fix():
    png = encode(photo(20, 10, np.random.default_rng(0)), "PNG")
    declared = r"^the image at dataset index 3 is 20x10, not the 21x10 declared for it\. Re-pack"
    with pytest.raises(ValueError, match=declared):
        decode_cpu(as_tensor(png), 3, out=np.zeros((10, 21, 3), np.uint8))
    with pytest.raises(ValueError) as err:
        decode_cpu(as_tensor(b"not an image at all"), "train/cat/1.jpg")
    message = str(err.value)
    assert message.startswith("cannot decode the image at train/cat/1.jpg (19 bytes, starting b'not an i'): ")
    assert message.endswith(". Re-pack or remove that file.")
    with pytest.raises(ValueError, match=r"^cannot decode the image at image \(12 bytes"):
        decode_cpu(as_tensor(png[:12]))


# --- the batched decode -----------------------------------------------------------------------------


def test_decode_batch_on_the_cpu_decodes_every_file_in_order():
    rng = np.random.default_rng(2)
    files = [as_tensor(encode(photo(30, 20, rng))), as_tensor(encode(photo(17, 11, rng), "PNG")),
             as_tensor(encode(photo(25, 40, rng).convert("L")))]
    out = decode_batch(EncodedImages.pack(files, [4, 5, 6]), "cpu")
    assert [tuple(x.shape) for x in out] == [(3, 20, 30), (3, 11, 17), (3, 40, 25)]
    assert all(x.device.type == "cpu" and x.dtype == torch.uint8 for x in out)
    assert all(torch.equal(x, decode_cpu(f)) for x, f in zip(out, files))


def test_decode_batch_names_the_file_it_cannot_decode():
    broken = torch.tensor([0xFF, 0xD8, 0xFF, 0xE0] + [0] * 60, dtype=torch.uint8)  # a JPEG signature, no JPEG
    files = jpeg_files(2) + [broken]
    with pytest.raises(ValueError, match="dataset index 12"):
        decode_batch(EncodedImages.pack(files, [10, 11, 12]), "cpu")
    with pytest.raises(ValueError, match="batch position 2"):
        decode_batch(EncodedImages.pack(files), torch.device("cpu"))


@cuda
def test_gpu_decode_equals_cpu_decode_within_jpeg_tolerance():
    need_cuda()
    # Photo-like 500x375 JPEGs: nvJPEG and libjpeg-turbo (IDCT, chroma upsampling) differ by a mean
    # of about 1.9 levels there (worst image 2.4, single pixels up to 74 at sharp edges, measured on an
    # H100); tiny noisy images differ by up to 4.2.
    files = jpeg_files(4, size=(500, 375))
    packed = EncodedImages.pack(files, list(range(4)))
    gpu = decode_batch(packed, "cuda")
    cpu = decode_batch(packed, "cpu")
    for g, c in zip(gpu, cpu):
        assert g.is_cuda and g.shape == c.shape == (3, 375, 500) and g.dtype == torch.uint8
        diff = (g.cpu().int() - c.int()).abs().float()
        assert diff.mean() < 3, diff.mean()  # nvJPEG and libjpeg-turbo round differently (H100: <= 2.4)


@cuda
def test_gpu_decode_falls_back_for_png_and_names_a_broken_file():
    need_cuda()
    rng = np.random.default_rng(1)
    png = torch.frombuffer(bytearray(encode(photo(40, 30, rng), "PNG")), dtype=torch.uint8)
    files = jpeg_files(2) + [png]
    out = decode_batch(EncodedImages.pack(files, [3, 4, 5]), "cuda")
    assert out[2].is_cuda and torch.equal(out[2].cpu(), decode_cpu(png))
    broken = torch.tensor([0xFF, 0xD8, 0xFF, 0xE0] + [0] * 60, dtype=torch.uint8)  # a JPEG signature, no JPEG
    with pytest.raises(ValueError, match="dataset index 11"):
        decode_batch(EncodedImages.pack([files[1], broken], [10, 11]), "cuda")


@cuda
def test_gpu_decode_of_grayscale_and_cmyk_jpegs_is_rgb():
    need_cuda()
    rng = np.random.default_rng(4)
    files = [as_tensor(encode(photo(64, 48, rng).convert(mode))) for mode in ("L", "CMYK", "RGB")]
    gpu = decode_batch(EncodedImages.pack(files, [0, 1, 2]), "cuda")
    assert all(g.is_cuda and g.shape == (3, 48, 64) and g.dtype == torch.uint8 for g in gpu)
    for g, f in zip([gpu[0], gpu[2]], [files[0], files[2]]):  # nvJPEG's CMYK colours are not libjpeg's
        assert (g.cpu().int() - decode_cpu(f).int()).abs().float().mean() < 5
