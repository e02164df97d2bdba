"""colabfast.loading.reader: whole batches read by threads give exactly the worker path's batches, and stay
safe on truncated files, flaky mounts and long runs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import psutil
import pytest
import torch
from torch.utils.data import Subset

import colabfast as cf
from colabfast.datasets.dropins import H5ImageFolder
from colabfast.errors import MirrorError
from colabfast.images.decode import EncodedImages, encoded_size
from colabfast.loading import reader
from colabfast.loading.collate import collate
from colabfast.loading.loader import _Prepared
from colabfast.loading.sampler import BlockShuffleSampler
from colabfast.packing import pack
from colabfast.testing.data import make_imagefolder


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("reader")
    same = make_imagefolder(out / "same", classes=3, per_class=14, size=(48, 40))
    vary = make_imagefolder(out / "vary", classes=2, per_class=9, size=(60, 44), vary=0.3)
    return {
        "raw": pack(same, out / "raw.h5", store="raw", progress=False),
        "encoded": pack(same, out / "encoded.h5", progress=False),
        "raw-vary": pack(vary, out / "raw-vary.h5", store="raw", progress=False),
        "encoded-vary": pack(vary, out / "encoded-vary.h5", progress=False),
        # stored in a random order; indexed in the source's (issue 23 item 9)
        "shuffled": pack(same, out / "shuffled.h5", store="raw", shuffle=True, seed=4, progress=False),
    }


def _epoch(loader) -> list:
    return [batch for batch in loader]


def _same(a, b) -> None:
    """Two batches hold the same images (pixels and layout of the batch tensor) and targets."""
    (ia, ta), (ib, tb) = a, b
    assert torch.equal(ta, tb) and ta.dtype == tb.dtype
    if isinstance(ia, list):  # images of different sizes: an ImageList (a list) of them
        assert type(ia) is type(ib) and len(ia) == len(ib)
        assert all(torch.equal(x, y) for x, y in zip(ia, ib))
    else:
        assert ia.shape == ib.shape and ia.dtype == ib.dtype and ia.stride() == ib.stride()
        assert torch.equal(ia, ib)


@pytest.mark.parametrize("name", ["raw", "encoded", "raw-vary", "encoded-vary", "shuffled"])
@pytest.mark.parametrize("drop_last", [False, True])
def test_threads_give_the_worker_paths_batches(mirrors, name, drop_last):
    """Same samples, order, pixels and labels as the worker processes for one shuffle seed."""
    ds = H5ImageFolder(mirrors[name], output="tensor")
    kw = dict(batch_size=8, shuffle=True, drop_last=drop_last, device="cpu")
    threaded = cf.DataLoader(ds, generator=torch.Generator().manual_seed(5), **kw)
    workers = cf.DataLoader(ds, generator=torch.Generator().manual_seed(5), num_workers=2, **kw)
    assert threaded.plan.reader is not None and workers.plan.reader is None
    assert threaded.plan.num_workers == 0 and str(threaded.plan.reader) in repr(threaded)
    a, b = _epoch(threaded), _epoch(workers)
    assert len(a) == len(b) == len(threaded)
    for x, y in zip(a, b):
        _same(x, y)
    for loader in (threaded, workers):  # set_epoch reshuffles both alike
        loader.set_epoch(3)
    for x, y in zip(_epoch(threaded), _epoch(workers)):
        _same(x, y)


@pytest.mark.parametrize("name", ["raw", "encoded-vary", "shuffled"])
def test_a_subset_of_a_mirror_is_read_by_threads_as_the_workers_read_it(mirrors, name):
    """A train/validation split (Subset, random_split, nested) keeps the reader: same batches."""
    ds = H5ImageFolder(mirrors[name], output="tensor")
    train, _ = torch.utils.data.random_split(ds, [0.75, 0.25], generator=torch.Generator().manual_seed(1))
    for subset in (train, Subset(train, list(range(len(train) - 1, -1, -2))), Subset(ds, [-1, 0, 5, 6, 7])):
        kw = dict(batch_size=4, shuffle=True, device="cpu")
        threaded = cf.DataLoader(subset, generator=torch.Generator().manual_seed(2), **kw)
        workers = cf.DataLoader(subset, generator=torch.Generator().manual_seed(2), num_workers=1, **kw)
        assert threaded.plan.reader is not None and threaded.plan.reader.threads > 0
        a, b = _epoch(threaded), _epoch(workers)
        assert len(a) == len(b) == len(threaded)
        for x, y in zip(a, b):
            _same(x, y)
    with pytest.raises(IndexError, match=f"outside its dataset of {len(ds)} samples"):
        cf.DataLoader(Subset(ds, [0, len(ds)]), 2, device="cpu")


@pytest.mark.parametrize("memory_format", [None, torch.channels_last])
def test_in_memory_replicas_and_layout(mirrors, memory_format):
    """in_memory mirrors, a caller's sampler for one DDP replica, and the batch layout asked for."""
    ds = H5ImageFolder(mirrors["raw"], output="tensor", in_memory=True)
    plain = H5ImageFolder(mirrors["raw"], output="tensor")
    for rank in (0, 1):
        samplers = [BlockShuffleSampler(ds, 4, seed=11, num_replicas=2, rank=rank) for _ in range(2)]
        threaded = cf.DataLoader(ds, 6, sampler=samplers[0], device="cpu", memory_format=memory_format)
        workers = cf.DataLoader(plain, 6, sampler=samplers[1], num_workers=1, device="cpu",
                                memory_format=memory_format)
        assert threaded.plan.reader is not None
        a, b = _epoch(threaded), _epoch(workers)
        assert len(a) == len(b) > 0
        for x, y in zip(a, b):
            _same(x, y)
            if memory_format == torch.channels_last:
                assert x[0].is_contiguous(memory_format=torch.channels_last)
            else:
                assert x[0].is_contiguous()


@pytest.mark.parametrize("workers", [None, 0])  # the reader's threads; torch's path (__getitems__)
@pytest.mark.parametrize("in_memory", [False, True])
def test_a_shuffled_mirror_reads_whole_blocks_and_gives_the_sources_samples(mirrors, workers, in_memory,
                                                                          monkeypatch):
    """Issue 23 item 9: index i of a mirror packed with shuffle=True is the source's sample i (as in
    the mirror packed in order), and the loader with shuffle=False gives them in that order; the
    BlockShuffleSampler reads it in stored order: a batch of one block is one read, also for each
    of two replicas and through a Subset of the blocks."""
    ds = H5ImageFolder(mirrors["shuffled"], output="tensor", in_memory=in_memory)
    plain = H5ImageFolder(mirrors["raw"], output="tensor")
    assert ds.reader.positions is not None and ds.targets == plain.targets and ds.samples == plain.samples
    kw = dict(num_workers=workers, device="cpu")
    ((images, targets),) = list(cf.DataLoader(ds, 42, **kw))
    assert targets.tolist() == plain.targets and torch.equal(images, torch.stack([x for x, _ in plain]))
    reads: list[int] = []  # where each read starts: read_into's, and read_ranges' one read per range
    real, ranges = ds.reader.read_into, ds.reader.read_ranges
    monkeypatch.setattr(ds.reader, "read_into", lambda out, start: (reads.append(start), real(out, start)))
    monkeypatch.setattr(ds.reader, "read_ranges",
                        lambda memory, starts, lengths: (reads.extend(starts), ranges(memory, starts, lengths)))
    first_stored = [int(i) for i in np.argsort(ds.reader.positions)[:21]]  # the samples stored at 0..20
    for dataset, replicas in ((ds, 1), (ds, 2), (Subset(ds, first_stored), 1)):
        for rank in range(replicas):
            sampler = BlockShuffleSampler(dataset, 7, seed=rank, num_replicas=replicas, rank=rank)
            order = list(sampler.order(0))
            sampler.set_epoch(0)
            reads.clear()
            batches = list(cf.DataLoader(dataset, 7, sampler=sampler, **kw))
            assert len(reads) == (0 if in_memory else len(batches))  # in_memory: no read at all
            mirror_indices = order if dataset is ds else [first_stored[i] for i in order]
            assert torch.cat([t for _, t in batches]).tolist() == [plain.targets[i] for i in mirror_indices]
            assert torch.equal(torch.cat([x for x, _ in batches]), torch.stack([plain[i][0] for i in mirror_indices]))


def test_bytes_batches_equal_the_collated_worker_batches(mirrors):
    """decode='gpu' gets the batch's files packed in one tensor: the same EncodedImages the worker
    path's collate builds, read with one pread per run."""
    ds = H5ImageFolder(mirrors["encoded-vary"], output="bytes")
    threads_before = threading.active_count()
    r = reader.BatchReader(ds, threads=2)
    indices = [3, 4, 5, 6, 0, 11, 12]
    images, targets = r.read(indices)
    images_ref, targets_ref = collate([(_Prepared(ds, keep_jpeg=True, transform=None)[i]) for i in indices])
    assert isinstance(images, EncodedImages) and isinstance(images_ref, EncodedImages)
    assert torch.equal(images.data, images_ref.data) and torch.equal(images.lengths, images_ref.lengths)
    assert torch.equal(images.indices, images_ref.indices) and torch.equal(targets, targets_ref)
    # every header read once here and handed on, so decode_batch does not read them again
    assert images.sizes.tolist() == [list(encoded_size(f.numpy())) for f in images]
    assert images_ref.sizes is None  # the worker path's collate leaves the check to decode_batch
    batches = list(r.batches([indices[:3], indices[3:]]))
    assert torch.equal(torch.cat([b[0].data for b in batches]), images.data)
    # threads=0 (the CUDA feeder reading its own batches): the same batches, read in the calling
    # thread when each is asked for, none ahead
    inline = reader.BatchReader(ds, threads=0)
    assert (inline.threads, inline.prefetch) == (0, 0)
    caller, seen = threading.get_ident(), []

    def order():
        for part in (indices[:3], indices[3:]):
            seen.append(len(seen))
            yield part

    got = inline.batches(order())
    first = next(got)
    assert seen == [0] and torch.equal(first[0].data, batches[0][0].data)  # nothing read ahead
    second = next(got)
    assert torch.equal(second[0].data, batches[1][0].data) and torch.equal(second[1], batches[1][1])
    assert threading.get_ident() == caller and threading.active_count() == threads_before


def test_bytes_batches_refuse_a_header_unlike_its_declared_size(mirrors, tmp_path):
    """The batch's one header read per file (checked_jpeg_sizes) sends a file whose header disagrees
    with the mirror's declared size to the full check, which names the sample and the fix."""
    import shutil

    import h5py

    from colabfast.mirror.index import write_array

    bad = tmp_path / "declared.h5"
    shutil.copy(mirrors["encoded-vary"], bad)
    with h5py.File(bad, "r+") as f:
        shapes = f["image_shapes"][:]
        shapes[5, 1] += 1
        del f["image_shapes"]
        write_array(f, "image_shapes", shapes)
    r = reader.BatchReader(H5ImageFolder(bad, output="bytes"), threads=0)
    r.read([3, 4])  # the others still read
    with pytest.raises(MirrorError, match=rf"{bad}: sample 5: .*not the {shapes[5, 1]}x{shapes[5, 0]} declared"):
        r.read([3, 4, 5, 6])


def test_where_the_reader_does_not_apply_the_loader_says_why(mirrors):
    ds = H5ImageFolder(mirrors["raw"], output="tensor", transform=lambda x: x)
    loader = cf.DataLoader(ds, 4, device="cpu")
    assert loader.plan.reader is None and loader.plan.num_workers > 0 and loader.plan.facts.own_transforms
    pil = reader.applies(H5ImageFolder(mirrors["raw"]), transform_on_cpu=False, decode="auto")
    assert pil == (False, "worker processes: output='pil' makes PIL images per sample")  # the loader refuses it
    given = cf.DataLoader(H5ImageFolder(mirrors["raw"], output="tensor"), 4, num_workers=1, device="cpu")
    assert given.plan.reader is None and given.num_workers == 1  # the caller's choice stands


def test_torch_worker_options_with_the_reader(mirrors):
    """prefetch_factor and persistent_workers are habits from torch's DataLoader: with the reader
    they must not crash torch's checks (they need workers there); prefetch_factor sets the reader's
    read-ahead per thread. worker_init_fn or multiprocessing_context ask for worker processes."""
    ds = H5ImageFolder(mirrors["raw"], output="tensor")
    loader = cf.DataLoader(ds, 4, device="cpu", prefetch_factor=3, persistent_workers=True)
    assert loader.plan.reader is not None and loader.plan.reader.prefetch == 3 * loader.plan.reader.threads
    assert loader.plan.prefetch_factor == 3 and loader.plan.persistent_workers is False
    assert loader.prefetch_factor is None and loader.persistent_workers is False  # torch's: no workers
    assert sum(len(t) for _, t in _epoch(loader)) == len(ds)
    for asks in ({"worker_init_fn": _noop}, {"multiprocessing_context": "fork"}):
        workers = cf.DataLoader(ds, 4, device="cpu", **asks)
        assert workers.plan.reader is None and workers.num_workers > 0, asks


def _noop(worker_id):
    pass


def test_verify_catches_a_flipped_byte_in_the_reader(mirrors, tmp_path):
    import shutil

    for name in ("raw", "encoded"):
        bad = tmp_path / f"{name}.h5"
        shutil.copy(mirrors[name], bad)
        ds = H5ImageFolder(bad, output="tensor")
        where = ds.reader.data_offset + int(ds.reader.offsets[5]) + 7
        with open(bad, "r+b") as f:
            f.seek(where)
            byte = f.read(1)
            f.seek(where)
            f.write(bytes([byte[0] ^ 0x40]))
        loader = cf.DataLoader(H5ImageFolder(bad, output="tensor", verify=True), 8, device="cpu")
        assert loader.plan.reader is not None
        with pytest.raises(MirrorError, match="sample 5"):
            _epoch(loader)


def test_truncated_raw_mirror_raises_instead_of_killing_the_process(mirrors, tmp_path):
    """Issue 15, case 14: a raw mirror truncated while a loader reads it killed the interpreter with
    SIGBUS (it was memory-mapped). Reads are preads now: a clear MirrorError, and the process lives."""
    import shutil

    m = tmp_path / "raw.h5"
    shutil.copy(mirrors["raw"], m)
    script = textwrap.dedent(f"""
        import os, torch, colabfast as cf
        from colabfast.mirror import MirrorError
        ds = cf.H5ImageFolder({str(m)!r}, output="tensor")
        it = iter(cf.DataLoader(ds, 4, device="cpu", prefetch_factor=None))
        next(it)
        os.truncate({str(m)!r}, ds.reader.data_offset + int(ds.reader.offsets[10]))
        ds.reader.views([20])
        print("not reached")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, (out.returncode, out.stderr[-2000:])  # an exception, not -SIGBUS
    assert "MirrorError" in out.stderr and "truncated or replaced" in out.stderr


@pytest.mark.parametrize("name, memory_format", [("raw", None), ("raw", torch.channels_last),
                                                  ("encoded", None), ("encoded", torch.channels_last)])
def test_batch_memory_is_reused_only_once_the_caller_drops_it(mirrors, name, memory_format):
    """Batches are written into recycled memory (fresh pages cost a fault each), but never into memory
    that a batch, or a view of one, the caller still holds."""
    ds = H5ImageFolder(mirrors[name], output="tensor")
    r = reader.BatchReader(ds, threads=2, channels_last=memory_format == torch.channels_last)
    order = list(torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 2, drop_last=False))
    want = [r.read(indices)[0].clone() for indices in order]

    def address(images):
        return images.untyped_storage().data_ptr()

    first = r.read(order[0])[0]
    where = address(first)
    del first
    second = r.read(order[1])[0]
    assert address(second) == where and torch.equal(second, want[1])  # dropped, so reused
    view = second[1:]
    del second
    third = r.read(order[2])[0]
    assert address(third) != where and torch.equal(view, want[1][1:])  # a view holds the batch
    del third, view

    held = []
    for _ in range(3):  # through the threads, several epochs: every batch right, held ones untouched
        for k, (images, _) in enumerate(r.batches(order)):
            assert torch.equal(images, want[k])
            if k == 4:
                held.append(images[1:])
            if k == 7:
                held.append(images)
        assert len(r._memory._arrays) <= r._memory.keep
    for k, image in enumerate(held):
        assert torch.equal(image, want[7] if k % 2 else want[4][1:])


def test_memory_stays_flat_over_20_epochs(mirrors):
    """RSS after epoch 20 is within a few batches of RSS after epoch 3 (bounded by the prefetch)."""
    ds = H5ImageFolder(mirrors["encoded"], output="tensor")
    loader = cf.DataLoader(ds, 8, shuffle=True, device="cpu")
    batch_bytes = 8 * 48 * 40 * 3
    proc = psutil.Process()
    for epoch in range(20):
        loader.set_epoch(epoch)
        for _ in loader:
            pass
        if epoch == 2:
            start = proc.memory_info().rss
    # A leak of one batch per epoch would be 17 batches; allow 8 MB of allocator noise on top of it.
    grown = proc.memory_info().rss - start
    assert grown < 8e6 + 4 * batch_bytes, f"RSS grew {grown / 1e6:.1f} MB over 17 epochs"


def test_mirror_reads_from_a_flaky_drive_are_retried(mirrors, tmp_path):
    """Issue 15, case 12: reading a mirror straight from Drive had no EIO retry (one epoch of three
    crashed). Reads now retry the transient errors stage() retries, at the failing offset."""
    from colabfast.drivesim.fs import available
    from colabfast.drivesim.simulator import DriveSim

    ok, why = available()
    if not ok:
        pytest.skip(f"FUSE is not available: {why}")
    # 4 MB of raw pixels: far more than the kernel reads ahead when the mirror is opened
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=40, size=(128, 128))
    local = H5ImageFolder(pack(src, tmp_path / "drive" / "m.h5", store="raw", progress=False), output="tensor")
    expected = torch.stack([local[i][0] for i in range(len(local))])
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=1, read_ms=0, mbps=None) as sim:
        ds = H5ImageFolder(sim.mountpoint / "m.h5", output="tensor")  # opened (and vetted) without faults
        sim.set(eio_read=0.2)
        for _ in range(3):
            images = torch.cat([b[0] for b in cf.DataLoader(ds, 8, device="cpu", shuffle=True)])
            images = images[torch.argsort(torch.tensor(_order(ds, images, expected)))]
            assert torch.equal(images, expected)
        assert sim.stats()["eio"] > 0


def test_crops_read_from_a_flaky_drive_are_retried_and_read_runs_whole(tmp_path, monkeypatch):
    """A raw mirror's crops read only each crop's rows (MirrorReader.read_ranges, one pread per image):
    on Drive a failed pread is read again with read_into's retries, and a batch mostly of runs of
    consecutive samples (BlockShuffleSampler) is read a run at a time (on Drive the reads are what
    cost). The crops are the per-sample CenterCrop of the local file either way."""
    from torchvision.transforms import v2

    from colabfast.drivesim.fs import available
    from colabfast.drivesim.simulator import DriveSim

    ok, why = available()
    if not ok:
        pytest.skip(f"FUSE is not available: {why}")
    read = {"crop first": 0, "runs whole": 0}  # batches read each way
    crop_rows = reader.BatchReader._crop_rows

    def counted(self, *args):
        rows = crop_rows(self, *args)
        read["runs whole" if rows is None else "crop first"] += 1
        return rows

    monkeypatch.setattr(reader.BatchReader, "_crop_rows", counted)
    src = make_imagefolder(tmp_path / "src", classes=2, per_class=40, size=(128, 96))
    crop = v2.CenterCrop((64, 100))
    local = H5ImageFolder(pack(src, tmp_path / "drive" / "m.h5", store="raw", progress=False), output="tensor")
    expected = torch.stack([crop(local[i][0]) for i in range(len(local))])
    with DriveSim(tmp_path / "drive", tmp_path / "mnt", open_ms=1, read_ms=0, mbps=None) as sim:
        ds = H5ImageFolder(sim.mountpoint / "m.h5", output="tensor", transform=crop)
        sim.set(eio_read=0.2)
        for kwargs in ({"shuffle": True}, {"sampler": BlockShuffleSampler(ds, block_size=8, seed=1)}):
            loader = cf.DataLoader(ds, 8, device="cpu", **kwargs)
            assert loader.plan.reader is not None and loader.plan.reader.fused is not None
            images = torch.cat([b[0] for b in loader])
            assert torch.equal(images[torch.argsort(torch.tensor(_order(ds, images, expected)))], expected)
        assert sim.stats()["eio"] > 0
    assert read["crop first"] > 0 and read["runs whole"] > 0


def test_a_crops_rows_read_from_a_truncated_file_raise(mirrors, tmp_path):
    """The crop-first reads name a truncated file as every read does (MirrorError), never a short batch."""
    import shutil

    from torchvision.transforms import v2

    m = tmp_path / "raw.h5"
    shutil.copy(mirrors["raw"], m)
    ds = H5ImageFolder(m, output="tensor", transform=v2.CenterCrop(32))
    it = iter(cf.DataLoader(ds, 4, device="cpu", shuffle=True, prefetch_factor=None))
    next(it)
    os.truncate(m, ds.reader.data_offset + int(ds.reader.offsets[4]))
    with pytest.raises(MirrorError, match="truncated or replaced"):
        for _ in it:
            pass


def _order(ds, images, expected) -> list[int]:
    """The dataset index of each image of a shuffled epoch (the images are distinct)."""
    keys = {bytes(x.numpy().tobytes()): i for i, x in enumerate(expected)}
    return [keys[bytes(x.numpy().tobytes())] for x in images]


def test_views_only_where_the_loaders_collate_copies(mirrors):
    """Issue 16, item 2: the mirror hands over views of its read buffer only through the wrapper the
    colabfast loader owns (its collate copies every image); a plain DataLoader's workers get
    compacted tensors. No module state decides it."""
    ds = H5ImageFolder(mirrors["raw"], output="tensor")

    def shares(batch):  # in the worker: does each image view a buffer larger than itself?
        return [x[0].untyped_storage().nbytes() > x[0].numel() for x in batch]

    plain = torch.utils.data.DataLoader(ds, 4, num_workers=1, collate_fn=shares)
    assert not any(v for b in plain for v in b)
    wrapped = _Prepared(ds, keep_jpeg=False, transform=None, decode=False, views=True)
    owned = torch.utils.data.DataLoader(wrapped, 4, num_workers=1, collate_fn=shares)
    assert all(v for b in owned for v in b)
    loader = cf.DataLoader(ds, 4, num_workers=1, device="cpu")
    assert isinstance(loader.dataset, _Prepared) and loader.dataset.views
    assert all(torch.equal(a[0], torch.stack([ds[i][0] for i in range(k * 4, k * 4 + len(a[0]))]))
               for k, a in enumerate(loader))



def test_plan_is_pure_and_is_what_the_loader_does(mirrors):
    """Issue 16, item 3: the defaults are planned by a pure function, testable without a loader."""
    from colabfast.loading.planning import BlockPlan, ReaderPlan, plan

    ds = H5ImageFolder(mirrors["raw"], output="tensor")
    state = torch.random.get_rng_state()
    p = plan(ds, batch_size=8, shuffle=True, device="cpu")
    assert torch.equal(state, torch.random.get_rng_state())  # no random number drawn
    assert isinstance(p.reader, ReaderPlan) and p.num_workers == 0
    assert p.sampler == BlockPlan(1)  # 8 // 16 blocks, at least 1
    assert p.prefetch_factor == 2 and p.reader.prefetch == 2 * p.reader.threads
    given = plan(ds, batch_size=8, num_workers=2, device="cpu")
    assert given.num_workers == 2 and given.reader is None
    assert given.choices()["reader"][0] == "none"
    assert given.persistent_workers is True and given.prefetch_factor == 4
    loader = cf.DataLoader(ds, 8, shuffle=True, device="cpu")
    assert loader.plan.choices() == p.choices()  # the loader builds from the same plan
    for name in ("num_workers", "pin_memory", "prefetch_factor", "decode", "collate_fn", "device"):
        assert loader.choices[name] == p.choices()[name], name
    assert isinstance(loader.sampler, BlockShuffleSampler) and loader.sampler.block_size == 1


READ_DECLARED = """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))  # today's 80 GiB ask fails, never swaps the machine
    import torchvision.transforms.v2 as T
    import colabfast as cf
    kw = {"transform": T.RandomResizedCrop(32)} if %(fused)r else {}
    loader = cf.DataLoader(cf.H5ImageFolder(%(path)r, output="tensor"), batch_size=8, device="cpu", **kw)
    assert loader.choices["reader"][0] != "none", loader.choices["reader"]
    for batch in loader:
        pass
"""


@pytest.mark.parametrize("fused", [False, True])
def test_declared_sizes_over_the_pixel_limit_are_a_mirror_error_before_memory_is_allocated(mirrors, tmp_path, fused):
    """Issue 41 item 8: a mirror declaring 60000x60000 images made the batch reader allocate 80 GiB for
    an epoch's first batch (split among threads), and the fused path 10 GiB of decoding memory per
    thread, before any header was read: a raw MemoryError. Measured in a child process."""
    import shutil

    import h5py
    from measured import BOUND, measure

    from colabfast.mirror.index import write_array

    bad = tmp_path / "declared.h5"
    shutil.copy(mirrors["encoded"], bad)
    with h5py.File(bad, "r+") as f:
        n = len(f["image_shapes"])
        del f["image_shapes"]
        write_array(f, "image_shapes", np.array([[60000, 60000, 3]] * n, np.int32))
    valid = measure(READ_DECLARED % {"fused": fused, "path": str(mirrors["encoded"])})
    assert valid.error is None, valid.error
    got = measure(READ_DECLARED % {"fused": fused, "path": str(bad)})
    assert got.colabfast_error and got.error.startswith("MirrorError"), got.error
    assert f"{bad}: sample 0" in got.error and "60000x60000" in got.error, got.error
    assert "raise PIL.Image.MAX_IMAGE_PIXELS" in got.error, got.error
    assert got.peak - valid.peak < BOUND and got.seconds < 60, (got.peak, valid.peak, got.seconds)
