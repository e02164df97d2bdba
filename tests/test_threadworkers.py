"""colabfast.loading.threadworkers: per-sample random transforms in the reader threads give exactly the batches of
worker processes under the same seed, epoch after epoch, and leave torch's global generator alone."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import Subset
from torchvision.transforms import v2

import colabfast as cf
from colabfast.errors import MirrorError
from colabfast.loading import threadworkers
from colabfast.packing import pack
from colabfast.testing.data import make_imagefolder

CROP_FLIP = v2.Compose([v2.RandomResizedCrop(24), v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(0.3)])


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("threadworkers")
    src = make_imagefolder(out / "src", classes=3, per_class=12, size=(60, 44), vary=0.3)
    return {"raw": pack(src, out / "raw.h5", store="raw", progress=False),
            "encoded": pack(src, out / "encoded.h5", progress=False),
            "shuffled": pack(src, out / "shuffled.h5", shuffle=True, seed=3, progress=False)}


def _run(make_loader, epochs: int = 3, seed: int = 11) -> tuple[list, torch.Tensor]:
    torch.manual_seed(seed)
    loader = make_loader()
    out = []
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        out.append([(x.clone() if isinstance(x, torch.Tensor) else [i.clone() for i in x], y.clone())
                    for x, y in loader])
    return out, torch.rand(4)  # where torch's global stream stands afterwards


def _assert_same(a: list, b: list) -> None:
    assert len(a) == len(b)
    for ea, eb in zip(a, b):
        assert len(ea) == len(eb)
        for (xa, ya), (xb, yb) in zip(ea, eb):
            assert torch.equal(ya, yb) and type(xa) is type(xb)
            xs, ys = (xa, xb) if isinstance(xa, list) else ([xa], [xb])  # a batch, or a list of images
            assert len(xs) == len(ys)
            for pa, pb in zip(xs, ys):
                assert pa.shape == pb.shape and pa.stride() == pb.stride() and torch.equal(pa, pb)


@pytest.mark.parametrize("name", ["raw", "encoded", "shuffled"])
@pytest.mark.parametrize("where", ["dataset", "loader"])
def test_threads_give_the_worker_processes_batches_sample_for_sample(mirrors, name, where):
    def loader(**kwargs):
        own = CROP_FLIP if where == "dataset" else None
        ds = cf.H5ImageFolder(mirrors[name], output="tensor", transform=own)
        return cf.DataLoader(ds, batch_size=5, shuffle=True, device="cpu",
                             transform=None if where == "dataset" else CROP_FLIP, **kwargs)

    threads = loader()
    assert threads.plan.reader.fused is not None and threads.num_workers == 0
    workers = loader(num_workers=2)
    assert workers.plan.reader is None and workers.num_workers == 2
    (a, after_a), (b, after_b) = _run(loader), _run(lambda: loader(num_workers=2))
    _assert_same(a, b)
    assert torch.equal(after_a, after_b)  # both drew their base seed from it, and nothing else


def test_without_persistent_workers_each_epoch_draws_a_new_base_seed_as_torch_does(mirrors):
    def loader(**kwargs):
        ds = cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=CROP_FLIP)
        return cf.DataLoader(ds, batch_size=4, device="cpu", persistent_workers=False, **kwargs)

    a, after_a = _run(loader)
    b, after_b = _run(lambda: loader(num_workers=2))
    _assert_same(a, b)
    assert torch.equal(after_a, after_b)
    assert not torch.equal(a[0][0][0], a[1][0][0])  # epochs differ (same order, new crops)
    assert loader().plan.reader.fused is not None


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_a_subset_and_a_generator_give_the_same_batches_as_workers(mirrors, memory_format):
    def loader(**kwargs):
        ds = Subset(cf.H5ImageFolder(mirrors["encoded"], output="tensor", transform=CROP_FLIP), list(range(3, 30, 2)))
        return cf.DataLoader(ds, batch_size=3, shuffle=True, device="cpu", generator=torch.Generator().manual_seed(5),
                             memory_format=memory_format, **kwargs)

    assert loader().plan.reader.fused is not None
    _assert_same(_run(loader)[0], _run(lambda: loader(num_workers=2))[0])


def test_the_training_loop_drawing_meanwhile_changes_nothing(mirrors):
    """The reader threads never touch torch's global generator: a loop drawing from it (dropout on the
    CPU) gets the same numbers, and the batches stay the same."""
    def loader():
        ds = cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=CROP_FLIP)
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu")

    torch.manual_seed(1)
    quiet = [x.clone() for x, _ in loader()]
    torch.manual_seed(1)
    busy, draws = [], []
    for x, _ in loader():
        busy.append(x.clone())
        draws.append(torch.rand(2))
    assert all(torch.equal(a, b) for a, b in zip(quiet, busy))
    torch.manual_seed(1)
    for _ in range(2):  # what the loader drew: its BlockShuffleSampler's seed, then the threads' base seed
        torch.empty((), dtype=torch.int64).random_()
    assert all(torch.equal(d, torch.rand(2)) for d in draws)


def test_what_does_not_fuse_stays_in_worker_processes_and_the_loader_says_why(mirrors):
    cases = {
        "ColorJitter": (v2.Compose([v2.RandomResizedCrop(8), v2.ColorJitter(0.3)]), None),
        "a lambda": (lambda x: x, None),
        "a target_transform": (CROP_FLIP, lambda y: y + 1),
    }
    for label, (transform, target_transform) in cases.items():
        ds = cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=transform, target_transform=target_transform)
        loader = cf.DataLoader(ds, batch_size=4, device="cpu")
        assert loader.plan.reader is None and loader.num_workers == 2, label
    both = cf.DataLoader(cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=CROP_FLIP), 4, device="cpu",
                         transform=CROP_FLIP)
    assert both.plan.reader is None and both.num_workers == 2
    shown = repr(cf.DataLoader(cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=CROP_FLIP), 4,
                               device="cpu"))
    assert "2 threads, per-sample transforms fused" in shown or "1 threads, per-sample transforms fused" in shown


def test_an_undecodable_image_names_its_sample_from_a_reader_thread(mirrors, tmp_path):
    import shutil

    bad = tmp_path / "bad.h5"
    shutil.copy(mirrors["encoded"], bad)
    reader = cf.H5ImageFolder(bad, output="tensor").reader
    start, end = int(reader.offsets[7]), int(reader.offsets[8])
    with open(bad, "r+b") as f:  # sample 7 keeps the JPEG signature; the rest is not a JPEG any more
        f.seek(reader.data_offset + start + 3)
        f.write(b"\x00" * (end - start - 3))
    loader = cf.DataLoader(cf.H5ImageFolder(bad, output="tensor", transform=CROP_FLIP), batch_size=4, device="cpu")
    assert loader.plan.reader.fused is not None
    with pytest.raises(MirrorError, match="sample 7"):
        for _ in loader:
            pass


def test_batches_are_dealt_to_threads_as_torch_deals_them_to_workers():
    made: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def fetch(indices, generator):
        with lock:
            made.append((indices[0], generator.initial_seed(), threading.current_thread().name))
        return indices[0], torch.get_num_threads()

    g = torch.Generator().manual_seed(3)
    base = int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(3)).item())
    tw = threadworkers.ThreadWorkers(fetch, workers=2, prefetch=4, generator=g)
    main_threads = torch.get_num_threads()
    out = list(tw.batches([[k] for k in range(9)]))
    assert [k for k, _ in out] == list(range(9))  # in order
    assert all(n == 1 for _, n in out)  # each reader thread runs torch on one core
    assert torch.get_num_threads() == main_threads  # and this thread keeps its own
    seeds = {k: seed for k, seed, _ in made}
    assert all(seeds[k] == base + k % 2 for k in range(9))
    names = {k: name for k, _, name in made}
    assert len({names[k] for k in range(0, 9, 2)}) == 1 and names[0] != names[1]
    list(tw.batches([[0]]))  # persistent: the same streams go on, no new base seed
    assert g.initial_seed() == 3 and torch.equal(g.get_state(), _after_one_draw(3))


def _after_one_draw(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    return g.get_state()


def test_stopping_early_returns_and_the_next_epoch_runs(mirrors):
    ds = cf.H5ImageFolder(mirrors["raw"], output="tensor", transform=CROP_FLIP)
    loader = cf.DataLoader(ds, batch_size=2, shuffle=True, device="cpu")
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert sum(len(y) for _, y in loader) == len(ds)


class _Pairs(torch.utils.data.Dataset):
    """(uint8 image [3, H, W], class) pairs of a few sizes: packed as a mirror of columns (PNG images)."""

    def __len__(self) -> int:
        return 14

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randint(0, 256, (3, 30 + 3 * (i % 4), 40), dtype=torch.uint8, generator=g), i % 3


def test_a_mirror_of_pairs_with_the_loaders_transform_gives_the_workers_batches(tmp_path):
    m = pack(_Pairs(), tmp_path / "pairs.h5", progress=False)

    def loader(**kwargs):
        ds = cf.H5Dataset(m, output="tensor")
        return cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu", transform=CROP_FLIP, **kwargs)

    assert loader().plan.reader.fused is not None
    _assert_same(_run(loader)[0], _run(lambda: loader(num_workers=2))[0])


@pytest.mark.parametrize("transform", [CROP_FLIP, None], ids=["fused", "decode only"])
def test_each_epochs_first_batch_is_made_by_every_thread_and_is_the_same_batch(mirrors, monkeypatch, transform):
    """The training loop waits for an epoch's first batch: both reader threads make a piece of it (the
    random draws made first, in order, from thread 0's generator), and it is the batch one thread makes."""
    from colabfast.loading import reader

    made: list[tuple[str, int, bool]] = []
    read = reader.BatchReader.read

    def spy(self, indices, generator=None, draws=None, out=None):
        made.append((threading.current_thread().name, len(indices), draws is not None))
        return read(self, indices, generator, draws, out)

    def loader(**kwargs):
        ds = cf.H5ImageFolder(mirrors["encoded"], output="tensor", transform=transform)
        return cf.DataLoader(ds, batch_size=6, shuffle=True, device="cpu", **kwargs)  # 36 samples: 6 batches

    monkeypatch.setattr(threadworkers, "_OPENMP", False)  # the spy's threads are counted, not torch's
    monkeypatch.setattr(reader.BatchReader, "read", spy)
    one = loader()
    assert one.plan.reader is not None and one.plan.reader.threads == 2
    a, _ = _run(loader, epochs=2)
    pieces = [m for m in made if m[1] == 3]
    assert len(pieces) == 4  # two pieces, each epoch
    if transform is not None:  # one piece to each thread worker (a pool of readers takes them as they come)
        assert {name for name, _, _ in pieces[:2]} == {"colabfast-worker-0_0", "colabfast-worker-1_0"}
    assert all(drawn == (transform is not None) for _, _, drawn in pieces)
    assert len(a[0]) == 6 and [n for _, n, _ in made].count(6) == 2 * 5  # every other batch made whole
    if transform is not None:
        b, _ = _run(lambda: loader(num_workers=2), epochs=2)
    else:  # one thread only (no split): the batches of a single reader
        monkeypatch.setattr(reader.BatchReader, "split", lambda *args: None)
        b, _ = _run(loader, epochs=2)
    _assert_same(a, b)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("in_memory", [False, True], ids=["file", "in-memory"])
@pytest.mark.parametrize("vary", [0.3, 0.0], ids=["sizes-vary", "one-size"])
def test_centre_crops_of_a_raw_mirror_give_the_worker_processes_batches(tmp_path, monkeypatch, memory_format,
                                                                        in_memory, vary):
    """Evaluation's CenterCrop on a raw mirror: only the rows each crop covers read from the file, then
    each crop copied into its row of the batch as a box of rows (FusedTransform.make_into), or, where
    the images have one size and none is flipped, the whole batch in one copy; flipped or padded ones
    through torch: the workers' batches."""
    from colabfast.datasets.mirrorreader import MirrorReader
    from colabfast.loading.reader import BatchReader

    ranges: list[list[int]] = []  # the bytes of each image read crop first, per batch
    read_ranges, crop_rows = MirrorReader.read_ranges, BatchReader._crop_rows
    crop_first = threading.local()

    def rows_read(self, *args):
        crop_first.on = True
        try:
            return crop_rows(self, *args)
        finally:
            crop_first.on = False

    def ranges_read(self, memory, starts, lengths):
        if getattr(crop_first, "on", False):
            ranges.append(list(lengths))
        return read_ranges(self, memory, starts, lengths)

    monkeypatch.setattr(BatchReader, "_crop_rows", rows_read)
    monkeypatch.setattr(MirrorReader, "read_ranges", ranges_read)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=20, size=(40, 30), vary=vary)
    mirror = pack(src, tmp_path / "raw.h5", store="raw", progress=False)
    for tf in (v2.CenterCrop(24), v2.Compose([v2.CenterCrop((24, 20)), v2.RandomHorizontalFlip(0.3)]),
               v2.CenterCrop(34)):  # taller than some images: torchvision pads those
        def loader(tf=tf, **kwargs):
            ds = cf.H5ImageFolder(mirror, output="tensor", transform=tf, in_memory=in_memory)
            return cf.DataLoader(ds, batch_size=8, shuffle=True, device="cpu", memory_format=memory_format, **kwargs)

        assert loader().plan.reader.fused is not None
        ranges.clear()
        (a, after_a), (b, after_b) = _run(loader), _run(lambda: loader(num_workers=2))
        _assert_same(a, b)
        assert torch.equal(after_a, after_b)
        crop = tf.size[0] if isinstance(tf, v2.CenterCrop) else 24  # rows
        shapes = cf.H5ImageFolder(mirror).reader.shapes
        if in_memory or crop > shapes[:, 0].max():  # RAM is not read; a batch with a crop that pads reads whole
            assert not ranges
        else:  # the crop's rows of each image, no more
            assert ranges or crop > shapes[:, 0].min()
            assert all(n in {crop * int(w) * 3 for w in shapes[:, 1]} for lengths in ranges for n in lengths)
