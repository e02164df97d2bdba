"""Small in-memory datasets shaped like colabfast's, shared by test_collate.py and test_loading.py:
``Images`` (H5ImageFolder-like tensors or JPEG bytes) and ``Kitti`` (ragged images, lists of dicts)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from colabfast.testing.data import KITTI_TYPES, encode, photo


def hwc_image(h: int, w: int, seed: int) -> torch.Tensor:
    """uint8 [3, H, W] viewing HWC memory, as torchvision.io.decode_jpeg and H5ImageFolder return."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g).permute(2, 0, 1)


class Images(Dataset):
    """(image, label) like H5ImageFolder: output="tensor" (HWC views) or "bytes" (JPEG files)."""

    classes = ["a", "b"]

    def __init__(self, n=12, size=(12, 10), *, output="tensor", mirror=False, ragged=False, broken=()):
        self.n, self.size, self.output, self.is_mirror = n, size, output, mirror
        self.ragged, self.broken = ragged, broken

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        h, w = self.size
        if self.ragged:
            h, w = h + i % 3, w + i % 2
        if self.output == "bytes":
            if i in self.broken:
                return torch.tensor([0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3], dtype=torch.uint8), i % 2
            jpeg = encode(photo(w, h, np.random.default_rng(i)))
            return torch.frombuffer(bytearray(jpeg), dtype=torch.uint8), i % 2
        return hwc_image(h, w, i), i % 2


class Kitti(Dataset):
    """KITTI-like: PNG-sized ragged images and a list of object dicts per image (None in the test split)."""

    def __init__(self, n=6, test_split=False):
        self.n, self.test_split = n, test_split

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.test_split:
            return hwc_image(20 + i % 2, 60 - i % 3, i), None
        objects = [
            {
                "type": KITTI_TYPES[(i + k) % len(KITTI_TYPES)],
                "truncated": 0.0,
                "occluded": k % 3,
                "alpha": -1.5,
                "bbox": [10.0 * k, 5.0, 10.0 * k + 8, 15.0],
                "dimensions": [1.5, 1.6, 3.9],
                "location": [1.0, 1.7, 10.0 + k],
                "rotation_y": 0.1 * k,
            }
            for k in range(i % 3)  # image 0 has no objects
        ]
        return hwc_image(20 + i % 2, 60 - i % 3, i), objects


def assert_same(a, b):
    """Recursive equality of collated batches (tensors by value and dtype)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b
