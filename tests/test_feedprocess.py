"""colabfast.loading.feedprocess: DataLoader(feed="process") yields feed="thread"'s batches tensor for tensor, epoch
after epoch; a stopped epoch leaves nothing behind; errors and a dead subprocess surface in the
training process; what cannot run in a subprocess is refused with the reason."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from torchvision.transforms import v2

import colabfast as cf
from colabfast.errors import MirrorError
from colabfast.loading import feedprocess
from colabfast.loading.feedprocess import FeedProcessError, pack, packed_size, unpack
from colabfast.packing import pack as pack_mirror
from colabfast.testing.data import make_imagefolder

CROP_FLIP = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip()])


@pytest.fixture(scope="module")
def mirror(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("feedprocess")
    src = make_imagefolder(out / "src", classes=3, per_class=10, size=(60, 44), vary=0.3)
    return pack_mirror(src, out / "encoded.h5", progress=False)


def _epochs(loader, epochs: int) -> list:
    return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(epochs)]


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b) and all(len(ea) == len(eb) for ea, eb in zip(a, b))
    for ea, eb in zip(a, b):
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert torch.equal(ya, yb)
            assert xa.shape == xb.shape and xa.stride() == xb.stride() and xa.dtype == xb.dtype
            assert torch.equal(xa, xb)


def test_pack_keeps_every_tensor_its_dtype_shape_strides_and_the_rest_of_the_batch():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (4, 3, 5, 7), dtype=torch.uint8, generator=g)
    batch = (
        images.float().contiguous(memory_format=torch.channels_last).to(torch.bfloat16),
        [{"boxes": torch.rand(3, 4, generator=g, dtype=torch.float64), "name": "a", "n": 3},
         {"boxes": torch.zeros(0, 4), "mask": torch.rand(5, 7, generator=g) > 0.5}],
        torch.arange(10)[::3],  # not dense: made contiguous
        images[0].permute(1, 2, 0),  # a permuted view: dense, kept permuted
        torch.tensor(7),
    )
    slot = torch.full((packed_size(batch),), 0xAB, dtype=torch.uint8)
    meta, used = pack(batch, slot)
    assert used == packed_size(batch) and used % feedprocess.ALIGN == 0
    out = unpack(meta, slot.clone())
    assert type(out) is tuple and out[1][0]["name"] == "a" and out[1][0]["n"] == 3
    pairs = [(batch[0], out[0]), (batch[1][0]["boxes"], out[1][0]["boxes"]),
             (batch[1][1]["boxes"], out[1][1]["boxes"]), (batch[1][1]["mask"], out[1][1]["mask"]),
             (batch[2], out[2]), (batch[3], out[3]), (batch[4], out[4])]
    for before, after in pairs:
        assert after.dtype == before.dtype and after.shape == before.shape and torch.equal(after, before)
    assert out[0].is_contiguous(memory_format=torch.channels_last)
    assert out[3].stride() == batch[3].stride() and out[2].is_contiguous()


def test_a_process_feed_gives_the_thread_feeds_batches_and_survives_a_break(mirror):
    def loader(feed: str):
        ds = cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP)
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", feed=feed,
                             generator=torch.Generator().manual_seed(5))

    threads, process = loader("thread"), loader("process")
    assert process.plan.feed == "process" and threads.plan.feed == "thread"
    _assert_same(_epochs(threads, 2), _epochs(process, 2))  # the same draws, epoch after epoch
    feed = process._process
    assert feed is not None and feed.alive
    for i, _ in enumerate(process):  # an epoch left after two batches: stopped, its slots come back
        if i == 1:
            break
    again = _epochs(process, 1)[0]
    assert process._process is feed  # the same subprocess
    labels = torch.cat([y for _, y in again])
    assert sorted(labels.tolist()) == sorted(cf.H5ImageFolder(mirror).targets)
    assert all(x.shape == (len(y), 3, 24, 24) for x, y in again)
    process.close()
    assert not feed.alive and process._process is None
    assert len(_epochs(process, 1)[0]) == len(again)  # a new subprocess


def test_the_subprocess_raises_its_errors_in_the_training_loop_and_a_dead_one_is_replaced(mirror, tmp_path):
    bad = tmp_path / "bad.h5"
    shutil.copy(mirror, bad)
    reader = cf.H5ImageFolder(bad, output="tensor").reader
    start, end = int(reader.offsets[7]), int(reader.offsets[8])
    with open(bad, "r+b") as f:  # sample 7 keeps the JPEG signature; the rest is not a JPEG any more
        f.seek(reader.data_offset + start + 3)
        f.write(b"\x00" * (end - start - 3))
    loader = cf.DataLoader(cf.H5ImageFolder(bad, output="tensor", transform=CROP_FLIP), batch_size=4,
                           device="cpu", feed="process")
    with pytest.raises(MirrorError, match="sample 7"):
        for _ in loader:
            pass

    loader = cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor", transform=CROP_FLIP), batch_size=4,
                           device="cpu", feed="process")
    batches = iter(loader)
    next(batches)
    feed = loader._process
    assert feed is not None
    os.kill(feed._process.pid, signal.SIGKILL)
    with pytest.raises(FeedProcessError, match="signal 9"):
        for _ in batches:
            pass
    assert not feed.alive
    assert len(_epochs(loader, 1)[0]) == 8  # 30 samples in batches of 4, from a new subprocess


class _Unpicklable(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        return torch.zeros(3, 4, 4, dtype=torch.uint8), i


def test_what_cannot_run_in_a_subprocess_is_refused_with_the_reason(mirror):
    with pytest.raises(ValueError, match="no batch reader applies"):
        cf.DataLoader(_Unpicklable(), batch_size=2, device="cpu", feed="process")
    with pytest.raises(ValueError, match="feed must be"):
        cf.DataLoader(_Unpicklable(), batch_size=2, device="cpu", feed="processes")
    loader = cf.DataLoader(cf.H5ImageFolder(mirror, output="tensor"), batch_size=4, device="cpu")
    assert loader.choices["feed"][0] == "thread"
    with pytest.raises(ValueError, match="cannot be pickled"):
        feedprocess.FeedProcess(lambda: None, torch.device("cpu"), slots=2, ahead=2)


# --- CUDA --------------------------------------------------------------------------------------------


@pytest.mark.cuda
def test_on_cuda_a_process_feed_hands_over_the_thread_feeds_batches_by_cuda_ipc(tmp_path):
    """nvJPEG, colabfast.images.transforms' batched crop and flip and bf16 normalisation in the subprocess:
    the batches that arrive through the slots equal the in-process feeder's, and 30 epochs with
    early breaks leave neither threads nor GPU memory behind."""
    from conftest import assert_flat_over_epochs_with_breaks

    from colabfast.images import transforms as T

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    src = make_imagefolder(tmp_path / "src", classes=3, per_class=12, size=(150, 200), vary=0.2)
    mirror = pack_mirror(src, tmp_path / "m.h5", progress=False)
    t = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip()])

    def loader(feed: str):
        return cf.DataLoader(cf.H5ImageFolder(mirror, output="bytes"), batch_size=5, shuffle=True, device="cuda",
                             transform=t, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25), dtype=torch.bfloat16,
                             memory_format=torch.channels_last, feed=feed, generator=torch.Generator().manual_seed(9))

    threads, process = loader("thread"), loader("process")
    assert process.choices["decode"][0] == "gpu"
    a, b = _epochs(threads, 2), _epochs(process, 2)
    assert all(x.is_cuda and y.is_cuda for epoch in b for x, y in epoch)
    _assert_same(a, b)
    assert_flat_over_epochs_with_breaks(process, period=3, epochs=30)
    process.close()
