"""colabfast.images.augment: a fused crop-and-flip gives exactly torchvision's v2 transforms' pixels and draws;
draft decoding stays close to them and applies only where the crop is shrunk 2x or more."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision.transforms import v2

from colabfast.images import augment
from colabfast.images.decode import decode_cpu
from colabfast.testing.data import encode, photo


def _stored(w: int, h: int, raw: bool, seed: int = 0) -> tuple[torch.Tensor, tuple[int, int, int]]:
    img = photo(w, h, np.random.default_rng(seed))
    if raw:
        return torch.from_numpy(np.asarray(img).reshape(-1).copy()), (h, w, 3)
    return torch.frombuffer(bytearray(encode(img)), dtype=torch.uint8), (h, w, 3)


def _expected(tf, stored: torch.Tensor, shape, raw: bool) -> torch.Tensor:
    """What a worker's v2 transform gives for the image as the mirror dataset hands it over."""
    h, w, c = shape
    image = stored.view(h, w, c).permute(2, 0, 1) if raw else decode_cpu(stored, 0, size=(h, w))
    return tf(image)


TRANSFORMS = {
    "rrc+hflip": v2.Compose([v2.RandomResizedCrop(32), v2.RandomHorizontalFlip()]),
    "rrc-rect+flips": v2.Compose([v2.RandomResizedCrop((24, 40), scale=(0.3, 1.0), ratio=(0.5, 2.0)),
                                  v2.RandomHorizontalFlip(0.7), v2.RandomVerticalFlip(0.4)]),
    "rrc-nearest": v2.RandomResizedCrop(20, interpolation=v2.InterpolationMode.NEAREST),
    "resize-short-side": v2.Compose([v2.Resize(30), v2.RandomHorizontalFlip()]),
    "resize-max-size": v2.Resize(30, max_size=36),
    "center-crop": v2.Compose([v2.CenterCrop(40), v2.RandomVerticalFlip()]),
    "evaluation": v2.Compose([v2.Resize(36), v2.CenterCrop(32)]),
    "center-crop-padded": v2.CenterCrop((90, 30)),  # taller than the image: torchvision pads it
    "flip-only": v2.RandomHorizontalFlip(),
    "center-crop-hflip": v2.Compose([v2.CenterCrop(40), v2.RandomHorizontalFlip(0.6), v2.RandomVerticalFlip(0.6)]),
    # the crop is the output's size where the image is 40x40: no resize (torchvision returns the crop)
    "rrc-output-sized": v2.Compose([v2.RandomResizedCrop(40, scale=(1.0, 1.0), ratio=(1.0, 1.0)),
                                    v2.RandomHorizontalFlip()]),
}


@pytest.mark.parametrize("raw", [True, False], ids=["raw", "jpeg"])
@pytest.mark.parametrize("name", list(TRANSFORMS))
def test_a_fused_transform_is_the_v2_transform_pixel_for_pixel_and_draw_for_draw(name, raw):
    tf = TRANSFORMS[name]
    fused = augment.fuse(tf)
    assert fused is not None
    for seed, (w, h) in enumerate([(96, 72), (61, 83), (40, 40), (300, 12)]):
        stored, shape = _stored(w, h, raw, seed)
        torch.manual_seed(seed)
        want = [_expected(tf, stored, shape, raw) for _ in range(6)]
        after = torch.rand(3)  # where the global stream stands after the transforms' draws
        g = torch.Generator().manual_seed(seed)
        got = [fused(stored, shape, raw, 0, g) for _ in range(6)]
        for a, b in zip(want, got):
            assert a.shape == b.shape and a.dtype == b.dtype == torch.uint8
            assert torch.equal(a, b), (name, w, h)
        assert torch.equal(torch.rand(3, generator=g), after)  # the same numbers drawn, no more, no fewer


@pytest.mark.parametrize("channels_last", [True, False], ids=["channels-last", "contiguous"])
@pytest.mark.parametrize("raw", [True, False], ids=["raw", "jpeg"])
@pytest.mark.parametrize("name", [n for n, tf in TRANSFORMS.items() if augment.fuse(tf).output_size() is not None])
def test_make_into_writes_the_v2_transforms_pixels_into_a_batchs_memory(name, raw, channels_last):
    """The reader's path: each image made straight into its row of a batch (channels-last or not),
    flips applied there, the decoded pixels in reused scratch memory."""
    tf = TRANSFORMS[name]
    fused = augment.fuse(tf)
    h, w = fused.output_size()
    for seed, size in enumerate([(96, 72), (61, 83), (40, 40), (300, 12)]):
        stored, shape = _stored(*size, raw, seed)
        torch.manual_seed(seed)
        want = [_expected(tf, stored, shape, raw) for _ in range(6)]
        batch = torch.full((6, h, w, 3) if channels_last else (6, 3, h, w), 7, dtype=torch.uint8)
        slots = batch.numpy().transpose(0, 3, 1, 2) if channels_last else batch.numpy()
        g = torch.Generator().manual_seed(seed)
        for k in range(6):
            fused.make_into(stored, shape, raw, 0, *fused.draw(shape, g), slots[k : k + 1])
        got = batch.permute(0, 3, 1, 2) if channels_last else batch
        for k in range(6):
            assert torch.equal(want[k], got[k]), (name, size, k)


def test_fuse_takes_only_what_it_reproduces():
    assert augment.fuse(v2.Compose([v2.RandomHorizontalFlip(), v2.RandomResizedCrop(8)])) is None  # order
    assert augment.fuse(v2.Compose([v2.RandomResizedCrop(8), v2.ColorJitter(0.2)])) is None
    assert augment.fuse(lambda x: x) is None

    class MyCrop(v2.RandomResizedCrop):  # a subclass may draw otherwise
        pass

    assert augment.fuse(MyCrop(8)) is None
    fused = augment.fuse(v2.Compose([v2.Resize(8), v2.RandomVerticalFlip(0.25)]), draft=True)
    assert fused is not None and fused.flips == ((-2, 0.25),) and fused.draft


def test_draft_decodes_a_large_jpeg_scaled_only_where_the_crop_shrinks_enough(monkeypatch):
    import simplejpeg

    stored, shape = _stored(1024, 768, raw=False)
    calls: list[dict] = []
    real = simplejpeg.decode_jpeg

    def spy(*args, **kwargs):
        if "min_height" in kwargs:  # a scaled decode (the exact path decodes through decode_cpu)
            calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(augment.simplejpeg, "decode_jpeg", spy)
    exact = augment.fuse(v2.Resize(96))
    drafted = augment.fuse(v2.Resize(96), draft=True)
    g = torch.Generator()
    a = exact(stored, shape, False, 0, g)
    assert calls == []
    b = drafted(stored, shape, False, 0, g)
    # 768 / 96 = 8: the smallest side may shrink 4x and still give twice the 96 rows
    assert calls and calls[-1]["min_height"] == 192 and calls[-1]["min_width"] == 256
    assert a.shape == b.shape == (3, 96, 128)
    diff = (a.int() - b.int()).abs().float()
    assert 0 < diff.mean() < 1 and diff.max() < 20  # close to decode-then-resize, not equal
    calls.clear()
    small = augment.fuse(v2.Resize(500), draft=True)  # shrunk less than 2x: decoded at full size
    assert torch.equal(small(stored, shape, False, 0, g), augment.fuse(v2.Resize(500))(stored, shape, False, 0, g))
    assert calls == []


def test_draft_crops_the_same_region_and_keeps_the_draws():
    stored, shape = _stored(1200, 900, raw=False, seed=3)
    tf = v2.Compose([v2.RandomResizedCrop(64, scale=(0.5, 1.0)), v2.RandomHorizontalFlip()])
    exact, drafted = augment.fuse(tf), augment.fuse(tf, draft=True)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    means = []
    for _ in range(8):
        a, b = exact(stored, shape, False, 0, g1), drafted(stored, shape, False, 0, g2)
        assert a.shape == b.shape == (3, 64, 64)
        means.append((a.int() - b.int()).abs().float().mean().item())
    # the same region to within half a pixel of the 1/4-scale image: on this texture-rich photo, that
    # sub-pixel shift of a random crop is a few levels
    assert 0 < np.mean(means) < 5 and max(means) < 8
    assert torch.equal(g1.get_state(), g2.get_state())


def test_a_jpeg_whose_header_disagrees_with_its_declared_size_is_refused_before_decoding():
    stored, (h, w, c) = _stored(200, 100, raw=False)
    for draft in (False, True):
        with pytest.raises(ValueError, match="200x100|100x200|size"):
            augment.fuse(v2.Resize(20), draft=draft)(stored, (h * 2, w, c), False, 7, torch.Generator())


def test_the_direct_resize_call_is_torchvisions_resize():
    """Where torchvision resizes uint8 with torch's own antialiased bilinear kernel, the fused crop calls
    that kernel directly (``_resized_hwc``): the same pixels as ``F.resize`` for crops smaller, larger
    and the size of the output, odd sizes and one channel; a transform with other options keeps
    ``F.resize``."""
    from torchvision.transforms.v2 import functional as F

    fused = augment.fuse(v2.RandomResizedCrop(32))
    if not augment._native_resize(v2.RandomResizedCrop(32)):
        pytest.skip("torchvision resizes uint8 through float32 on this CPU")
    assert fused is not None and fused.native
    rng = np.random.default_rng(3)
    for h, w, c in ((7, 9, 3), (31, 40, 3), (32, 32, 3), (100, 57, 3), (64, 80, 1)):
        crop = rng.integers(0, 256, (h, w, c), dtype=np.uint8)
        for size in ((32, 32), (24, 40)):
            ours = augment._resized_hwc(crop, size)
            theirs = F.resize(torch.from_numpy(crop).permute(2, 0, 1), list(size),
                              interpolation=v2.InterpolationMode.BILINEAR, antialias=True)
            assert ours.shape == theirs.shape and torch.equal(ours, theirs), (h, w, c, size)
    for other in (v2.RandomResizedCrop(32, antialias=False),
                  v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.BICUBIC)):
        assert not augment.fuse(other).native
