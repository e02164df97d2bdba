"""colabfast.loading.collate: uint8 image batches (channels-last or contiguous, ragged, encoded, in shared
memory in a worker) and everything else as ``default_collate`` does, KITTI targets per sample."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from samples import Images, Kitti, assert_same, hwc_image
from torch.utils.data import default_collate

import colabfast.loading.collate
from colabfast.images.decode import Encoded, EncodedImages
from colabfast.loading.collate import collate
from colabfast.loading.prefetch import ImageList
from colabfast.testing.data import photo


def test_collate_batches_hwc_images_channels_last_with_default_collate_values():
    samples = [Images()[i] for i in range(4)]
    images, labels = collate(samples)
    want_images, want_labels = default_collate(samples)
    assert images.shape == (4, 3, 12, 10) and images.dtype == torch.uint8
    assert images.is_contiguous(memory_format=torch.channels_last) and images.permute(0, 2, 3, 1).is_contiguous()
    assert torch.equal(images, want_images) and torch.equal(labels, want_labels)
    flat, _ = collate(samples, memory_format=torch.contiguous_format)
    assert flat.is_contiguous() and torch.equal(flat, want_images)


def test_collate_bare_image_samples_and_ragged_images():
    same = collate([hwc_image(5, 6, s) for s in range(3)])
    assert same.shape == (3, 3, 5, 6)
    ragged = collate([hwc_image(5, 6, 0), hwc_image(7, 6, 1)])
    assert isinstance(ragged, ImageList) and [tuple(x.shape) for x in ragged] == [(3, 5, 6), (3, 7, 6)]


def test_collate_keeps_kitti_targets_per_sample():
    ds = Kitti()
    samples = [ds[i] for i in range(4)]
    images, targets = collate(samples)
    assert isinstance(images, ImageList) and len(images) == 4
    assert targets == [s[1] for s in samples]  # not transposed, nothing lost
    assert targets[0] == [] and len(targets[2]) == 2
    _, none = collate([Kitti(test_split=True)[i] for i in range(3)])
    assert none == [None, None, None]
    # equal lengths, all dicts: still per sample
    _, same_len = collate([samples[1], samples[1]])
    assert same_len == [samples[1][1], samples[1][1]]


def test_collate_mirrors_default_collate_elsewhere():
    Point = collections.namedtuple("Point", "x y")
    samples = [
        (hwc_image(4, 4, i), i, 0.5 * i, f"s{i}", {"k": i, "v": [i, i + 1]}, Point(i, 2 * i), np.float32(i))
        for i in range(3)
    ]
    got, want = collate(samples), default_collate(samples)
    assert_same(got[1:], want[1:])
    assert torch.equal(got[0], want[0])
    no_images = [({"a": i, "b": (i, 2.0)}, [i, i]) for i in range(3)]
    assert_same(collate(no_images), default_collate(no_images))
    with pytest.raises(TypeError):  # as default_collate: PIL images need a transform
        collate([(photo(8, 8, np.random.default_rng(0)), 0)] * 2)


def test_collate_packs_encoded_files_into_one_tensor():
    ds = Images(4, output="bytes")
    samples = [ds[i] for i in range(4)]
    packed, labels = collate(samples)
    assert isinstance(packed, EncodedImages) and packed.indices is None and len(packed) == 4
    assert packed.data.dim() == 1 and packed.lengths.tolist() == [len(s[0]) for s in samples]
    assert all(torch.equal(f, s[0]) for f, s in zip(packed, samples))
    tagged = collate([(Encoded(s[0], 10 + k), s[1]) for k, s in enumerate(samples)])
    assert tagged[0].indices.tolist() == [10, 11, 12, 13] and tagged[0].where(2) == "dataset index 12"


def test_collate_uses_shared_memory_in_a_worker(monkeypatch):
    monkeypatch.setattr(colabfast.loading.collate, "get_worker_info", lambda: object())
    images, _ = collate([Images()[i] for i in range(2)])
    assert images.is_shared()
    packed, _ = collate([Images(2, output="bytes")[i] for i in range(2)])
    assert packed.data.is_shared()
