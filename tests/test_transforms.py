"""colabfast.images.transforms: batched crops against torchvision's per-image results, on the CPU."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from colabfast.images import transforms as T
from colabfast.images.decode import decode_cpu
from colabfast.testing.data import encode, photo


def photos(n=8, seed=0, low=(300, 220), high=(520, 400)) -> list[torch.Tensor]:
    """Decoded photo-like JPEGs of different sizes, uint8 [3, H, W]."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        w, h = int(rng.integers(low[0], high[0])), int(rng.integers(low[1], high[1]))
        out.append(decode_cpu(torch.frombuffer(bytearray(encode(photo(w, h, rng))), dtype=torch.uint8)))
    return out


def sizes(images):
    return torch.tensor([i.shape[-2] for i in images]), torch.tensor([i.shape[-1] for i in images])


def test_random_resized_crop_matches_torchvision_for_the_same_crops():
    images = photos()
    t = T.RandomResizedCrop(224, generator=torch.Generator().manual_seed(1))
    state = t.generator.get_state()
    out = t(images)
    t.generator.set_state(state)
    top, left, h, w = t.get_params(*sizes(images))
    assert out.shape == (8, 3, 224, 224) and out.dtype == torch.uint8
    for k, image in enumerate(images):
        want = F.resized_crop(image, int(top[k]), int(left[k]), int(h[k]), int(w[k]), [224, 224], antialias=True)
        diff = (out[k].int() - want.int()).abs().float()
        # roi_align's box filter vs torchvision's antialiased triangle filter: measured 0.2-0.5 levels.
        assert diff.mean() < 1.5, (k, diff.mean())


def test_crop_parameters_follow_torchvision_distribution():
    # A very wide image makes torchvision's 10 attempts fail often: the fallback rate must match too.
    height, width, n = 60, 500, 4000
    g = torch.Generator().manual_seed(0)
    top, left, h, w = T.crop_params(torch.full((n,), height), torch.full((n,), width), (0.08, 1.0), (3 / 4, 4 / 3), g)
    torch.manual_seed(0)
    ref = torch.tensor([v2.RandomResizedCrop.get_params(torch.empty(3, height, width), [0.08, 1.0], [3 / 4, 4 / 3])
                        for _ in range(n)])
    ours = torch.stack([top, left, h, w], 1)
    assert ((ours[:, 2:] > 0) & (ours[:, 2] <= height)[:, None] & (ours[:, 3] <= width)[:, None]).all()
    assert (ours[:, 0] + ours[:, 2] <= height).all() and (ours[:, 1] + ours[:, 3] <= width).all()
    fallback = lambda p: ((p[:, 2] == height) & (p[:, 3] == 80)).float().mean()  # noqa: E731  centre crop, ratio 4/3
    assert abs(fallback(ours) - fallback(ref)) < 0.04, (fallback(ours), fallback(ref))
    area = lambda p: (p[:, 2] * p[:, 3]).float().mean() / (height * width)  # noqa: E731
    assert abs(area(ours) - area(ref)) < 0.02
    for column in (0, 1):  # positions uniform over what fits
        mean, want = ours[:, column].float().mean(), ref[:, column].float().mean()
        assert abs(mean - want) < 0.1 * want + 1, (column, mean, want)


def test_same_generator_state_same_crops_and_workers_diverge():
    images = photos(4)
    a = T.RandomResizedCrop(32, generator=torch.Generator().manual_seed(7))(images)
    b = T.RandomResizedCrop(32, generator=torch.Generator().manual_seed(7))(images)
    assert torch.equal(a, b)
    torch.manual_seed(3)
    c = T.RandomResizedCrop(32)(images)
    torch.manual_seed(3)
    assert torch.equal(c, T.RandomResizedCrop(32)(images))  # seeded from torch's global RNG


def test_center_crop_resize_and_flip_equal_torchvision():
    images = photos(5)
    crop = T.CenterCrop((100, 120))(images)
    assert all(torch.equal(crop[k], v2.CenterCrop((100, 120))(i)) for k, i in enumerate(images))
    flipped = T.Compose([T.CenterCrop(90), T.RandomHorizontalFlip(p=1.0)])(images)
    assert all(torch.equal(flipped[k], v2.CenterCrop(90)(i).flip(-1)) for k, i in enumerate(images))
    resized = T.Resize(200)(images)  # shorter side 200: sizes differ, so a list
    assert isinstance(resized, list)
    for got, image in zip(resized, images):
        want = v2.Resize(200, antialias=True)(image)
        assert got.shape == want.shape and (got.int() - want.int()).abs().float().mean() < 1.5
    val = T.Compose([T.Resize(256), T.CenterCrop(224)])(images)  # one resampling instead of two
    for got, image in zip(val, images):
        want = v2.CenterCrop(224)(v2.Resize(256, antialias=True)(image))
        assert (got.int() - want.int()).abs().float().mean() < 1.5


def test_flip_before_a_crop_mirrors_the_crop():
    image = photos(1)[0]
    got = T.Compose([T.RandomHorizontalFlip(p=1.0), T.CenterCrop((50, 60)), T.Resize((50, 60))])(image)
    assert got.shape == (3, 50, 60) and torch.equal(got, v2.CenterCrop((50, 60))(image.flip(-1)))


def test_stacked_batches_and_single_images():
    images = photos(3, low=(200, 150), high=(201, 151))
    stacked = torch.stack(images)
    t = T.CenterCrop(64)
    assert torch.equal(t(stacked), t(images)) and torch.equal(t(images[0]), t(images)[0])
    floats = T.Resize((20, 30))(stacked.float())
    assert floats.dtype == torch.float32 and floats.shape == (3, 3, 20, 30)


def one(geometry: T.Geometry, k: int) -> T.Geometry:
    return T.Geometry(*(getattr(geometry, f.name)[k:k + 1] for f in dataclasses.fields(T.Geometry)))


@pytest.mark.parametrize("plan", [
    # boxes inside each image, many touching its right or bottom edge: the repeated edge row/column
    T.Compose([T.RandomResizedCrop((37, 53), scale=(0.7, 1.0), generator=torch.Generator().manual_seed(2)),
               T.RandomHorizontalFlip(generator=torch.Generator().manual_seed(3))]),
    T.Resize((41, 29)),  # the whole image: every box ends on the edge
    T.Compose([T.Resize(300), T.CenterCrop((280, 330))]),  # boxes reaching outside: the mask path
], ids=["crops", "whole", "outside"])
def test_padding_a_ragged_batch_never_changes_a_pixel(plan):
    """Ragged images are padded into one tensor for roi_align: each image must come out as it does
    rendered alone, with no padding (float32 output, so rounding hides nothing)."""
    images = [i.float() for i in photos(6, low=(200, 150), high=(320, 260))]
    heights, widths = T._sizes(images)
    geometry = T.Geometry.whole(heights, widths)
    plan.plan(geometry)
    batch = T.render(images, geometry)
    for k, image in enumerate(images):
        alone = T.render(image[None], one(geometry, k))[0]
        got = batch[k]
        assert got.shape == alone.shape
        assert (got - alone).abs().max() < 1e-3, (k, (got - alone).abs().max())


def test_bad_input_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="channel count"):
        T.CenterCrop(4)([torch.zeros(3, 8, 8, dtype=torch.uint8), torch.zeros(1, 9, 9, dtype=torch.uint8)])
    with pytest.raises(ValueError, match="empty"):
        T.CenterCrop(4)([])
    with pytest.raises(TypeError, match="torchvision.transforms.v2.Compose"):
        T.Compose([v2.RandomResizedCrop(8)])
    with pytest.raises(ValueError, match="scale and ratio"):
        T.RandomResizedCrop(8, scale=(1.0, 0.5))


class Same(torch.utils.data.Dataset):
    """The same photo at every index: any difference between outputs is the random crop."""

    def __init__(self, n=8):
        self.n, self.image = n, photos(1, low=(120, 90), high=(121, 91))[0]

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.image, i


def test_dataloader_takes_batched_transforms_and_workers_draw_different_crops():
    from colabfast.loading.loader import DataLoader

    torch.manual_seed(0)
    t = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()])
    loader = DataLoader(Same(8), 4, device="cpu", num_workers=2, transform=t)
    assert "per image in the workers" in repr(loader)
    (a, _), (b, _) = list(loader)  # one batch from each worker
    assert a.shape == b.shape == (4, 3, 24, 24)
    crops = torch.cat([a, b])
    assert len({bytes(c.flatten().tolist()) for c in crops}) == 8  # no worker repeats the other's crops


def test_the_loader_reseeds_its_transforms_each_epoch_from_its_generator():
    """The loader seeds the batched transforms (issue 11): the same torch.manual_seed repeats a run,
    each epoch draws new crops, and a transform built with its own generator keeps that stream."""
    from colabfast.loading.loader import DataLoader

    def run(seed, transform, epochs=2):
        torch.manual_seed(seed)
        loader = DataLoader(Same(8), 8, device="cpu", num_workers=0, transform=transform)
        return [next(iter(loader))[0] for _ in range(epochs)]

    t = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip()])
    first, again = run(1, t), run(1, t)  # the same transform object, reused: reseeded by the loader
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], first[1])  # a new epoch, new crops
    assert not torch.equal(run(2, t)[0], first[0])

    own = T.RandomResizedCrop(24, generator=torch.Generator().manual_seed(7))
    twin = T.RandomResizedCrop(24, generator=torch.Generator().manual_seed(7))
    expected = torch.stack([twin(Same().image) for _ in range(8)])  # on the CPU: per image, in order
    assert torch.equal(run(1, own, epochs=1)[0], expected)  # not reseeded: the caller's stream


def test_reseed_walks_nested_compose_and_skips_given_generators():
    a, b = T.RandomResizedCrop(8), T.RandomHorizontalFlip(generator=torch.Generator().manual_seed(3))
    c = T.RandomHorizontalFlip()
    state = b.generator.get_state()
    assert T.reseed(T.Compose([a, T.Compose([b, c])]), 100)
    assert a.generator.initial_seed() == 100 and c.generator.initial_seed() == 101
    assert torch.equal(b.generator.get_state(), state)
    assert not T.reseed(T.Compose([T.CenterCrop(4)]), 5)
    state = torch.random.get_rng_state()
    assert not T.reseed(T.CenterCrop(4), None) and not T.reseed(v2.RandomHorizontalFlip(), None)
    assert torch.equal(torch.random.get_rng_state(), state)  # nothing to reseed: no number drawn
    g = torch.Generator().manual_seed(9)
    expected = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(9)).item())
    assert T.reseed(a, g) and a.generator.initial_seed() == expected % 2**63


def test_one_image_on_the_cpu_is_torchvisions_own_resized_crop():
    """DataLoader workers call the transforms one CPU image at a time: there the crop is rendered by
    torchvision's resized_crop (antialiased), pixel for pixel, where the box lies on whole pixels."""
    images = photos(6)
    t = T.Compose([T.RandomResizedCrop(96, generator=torch.Generator().manual_seed(4)),
                   T.RandomHorizontalFlip(generator=torch.Generator().manual_seed(5))])
    twin = T.RandomResizedCrop(96, generator=torch.Generator().manual_seed(4))
    flips = torch.Generator().manual_seed(5)
    for image in images:
        top, left, h, w = (int(v[0]) for v in twin.get_params(*sizes([image])))
        want = F.resized_crop(image, top, left, h, w, [96, 96], antialias=True)
        if bool(torch.rand(1, generator=flips) < 0.5):
            want = want.flip(-1)
        assert torch.equal(t(image), want)
    fractional = T.Compose([T.Resize(100), T.CenterCrop(64)])(images[0])  # off whole pixels: roi_align
    want = v2.CenterCrop(64)(v2.Resize(100, antialias=True)(images[0]))
    assert fractional.shape == (3, 64, 64) and (fractional.int() - want.int()).abs().float().mean() < 1.5
