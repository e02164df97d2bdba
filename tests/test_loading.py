"""colabfast.loading: the plan and the drop-in DataLoader (CPU; CUDA tests are marked). The collate is
tested in test_collate.py; the datasets here are samples.py's."""

from __future__ import annotations

import multiprocessing
import time

import pytest
import torch
import torch.utils.data as tud
from samples import Images, Kitti, assert_same, hwc_image
from torch.utils.data import Dataset, IterableDataset, Subset, default_collate
from torchvision.transforms import v2

from colabfast.images.decode import decode_cpu
from colabfast.loading import loader as loading_loader
from colabfast.loading import planning as loading_planning
from colabfast.loading.loader import DataLoader
from colabfast.loading.sampler import BlockShuffleSampler

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# --- DataLoader: outputs ------------------------------------------------------------------------------


def manual(batch_images: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return v2.Normalize(MEAN, STD)(v2.ToDtype(dtype, scale=True)(batch_images))


@pytest.mark.parametrize("workers", [0, 2])
def test_outputs_equal_plain_dataloader_plus_manual_normalisation(workers):
    ds = Images(10)
    plain = list(tud.DataLoader(ds, 4, num_workers=workers))
    ours = list(DataLoader(ds, 4, num_workers=workers, device="cpu", mean=MEAN, std=STD))
    assert len(ours) == len(plain) == 3
    for (x, y), (px, py) in zip(ours, plain):
        assert x.dtype == torch.float32 and x.is_contiguous()
        torch.testing.assert_close(x, manual(px), rtol=0, atol=1e-6)
        assert torch.equal(y, py)


def test_without_normalisation_the_batches_are_the_plain_ones():
    ds = Images(10)
    for ours, plain in zip(DataLoader(ds, 4, num_workers=0), tud.DataLoader(ds, 4)):
        assert_same(ours, plain)
        assert ours[0].is_contiguous()


def test_dtype_and_channels_last():
    ds = Images(8)
    x, _ = next(iter(DataLoader(ds, 8, num_workers=0, dtype=torch.bfloat16)))
    px, _ = next(iter(tud.DataLoader(ds, 8)))
    torch.testing.assert_close(x, px.to(torch.bfloat16) / 255)
    x, _ = next(iter(DataLoader(ds, 8, num_workers=0, mean=MEAN, std=STD, memory_format=torch.channels_last)))
    assert x.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(x, manual(px))


def test_kitti_targets_pass_through_and_a_transform_makes_images_stackable():
    ds = Kitti(6)
    images, targets = next(iter(DataLoader(ds, 3, num_workers=0, mean=MEAN, std=STD)))
    assert type(images) is list and [tuple(i.shape) for i in images] == [tuple(ds[k][0].shape) for k in range(3)]
    torch.testing.assert_close(images[1], manual(ds[1][0].unsqueeze(0))[0])
    assert targets == [ds[k][1] for k in range(3)]
    resized, targets = next(iter(DataLoader(ds, 3, num_workers=1, transform=v2.Resize((16, 32), antialias=True))))
    assert resized.shape == (3, 3, 16, 32) and resized.dtype == torch.uint8
    assert targets == [ds[k][1] for k in range(3)]
    _, none = next(iter(DataLoader(Kitti(4, test_split=True), 2, num_workers=0)))
    assert none == [None, None]


# --- DataLoader: defaults and arguments ---------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
def test_defaults_fill_only_what_is_unset(monkeypatch):
    monkeypatch.setattr(loading_loader.env, "cpu_count", lambda: 3)
    dl = DataLoader(Images(), 4, device="cpu")
    assert (dl.num_workers, dl.persistent_workers, dl.prefetch_factor, dl.pin_memory) == (3, True, 4, False)
    assert dl.plan.num_workers == 3 and dl.plan.prefetch_factor == 4
    assert isinstance(dl, tud.DataLoader) and len(dl) == 3
    text = repr(dl)  # every decision, with its reason
    assert all(name in text and why in text for name, (_, why) in dl.choices.items())
    mine = DataLoader(Images(), 4, num_workers=1, persistent_workers=False, prefetch_factor=2, pin_memory=False)
    assert (mine.num_workers, mine.persistent_workers, mine.prefetch_factor, mine.pin_memory) == (1, False, 2, False)
    none = DataLoader(Images(), 4, num_workers=0)
    assert (none.persistent_workers, none.prefetch_factor) == (False, None)


def test_every_dataloader_argument_is_forwarded_in_torch_order():
    ds = Images(9)
    g = torch.Generator().manual_seed(0)

    def init(worker_id):
        pass

    def my_collate(batch):
        return default_collate(batch)

    dl = DataLoader(ds, 2, True, None, None, 1, my_collate, False, True, 5.0, init, "spawn", g, prefetch_factor=3,
                    persistent_workers=False, in_order=False, pin_memory_device="")  # fmt: skip
    assert dl.dataset is ds and dl.batch_size == 2 and isinstance(dl.sampler, tud.RandomSampler)
    assert dl.num_workers == 1 and dl.collate_fn is my_collate and dl.pin_memory is False and dl.drop_last
    assert dl.timeout == 5.0 and dl.worker_init_fn is init and dl.generator is g
    assert dl.multiprocessing_context is multiprocessing.get_context("spawn")
    assert dl.prefetch_factor == 3 and dl.persistent_workers is False and dl.in_order is False
    assert len(dl) == 4  # drop_last
    sampler = tud.SequentialSampler(ds)
    batches = tud.BatchSampler(sampler, 3, False)
    assert DataLoader(ds, sampler=sampler, num_workers=0).sampler is sampler
    assert DataLoader(ds, batch_sampler=batches, num_workers=0).batch_sampler is batches
    with pytest.raises(ValueError, match="mutually exclusive"):  # torch's own checks still apply
        DataLoader(ds, 2, True, sampler)


def test_iterable_dataset_gets_no_workers():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter([hwc_image(4, 4, i) for i in range(5)])

    dl = DataLoader(Stream(), 2)
    assert dl.num_workers == 0 and dl.plan.facts.iterable
    assert [b.shape[0] for b in dl] == [2, 2, 1]


def test_no_default_workers_when_spawned_workers_cannot_import_a_notebook_dataset(monkeypatch):
    class NotebookImages(Images):
        pass

    NotebookImages.__module__ = "__main__"  # as if defined in a notebook cell
    assert DataLoader(NotebookImages(), 2).num_workers > 0  # fork (Linux): workers inherit __main__
    monkeypatch.setattr(torch.multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    spawned = DataLoader(NotebookImages(), 2)
    assert spawned.num_workers == 0 and spawned.plan.facts.from_main
    assert DataLoader(Subset(NotebookImages(), [0, 1]), 2).num_workers == 0
    assert DataLoader(Images(), 2).num_workers > 0


def test_epochs_reiterate_with_persistent_workers():
    dl = DataLoader(Images(10), 3, shuffle=True, num_workers=1)
    assert dl.persistent_workers
    epochs = [torch.cat([y for _, y in dl]) for _ in range(3)]
    for labels in epochs:
        assert len(labels) == 10
    seen = [sorted(torch.cat([x[:, 0, 0, 0] for x, _ in dl]).tolist()) for _ in range(2)]
    assert seen[0] == seen[1] == sorted(Images(10)[i][0][0, 0, 0].item() for i in range(10))


def test_a_shuffled_mirror_gets_a_block_shuffle_sampler_seeded_by_torch():
    mirror = Images(40, mirror=True)
    torch.manual_seed(0)
    dl = DataLoader(mirror, 64, shuffle=True, num_workers=0)
    assert isinstance(dl.sampler, BlockShuffleSampler) and dl.sampler.block_size == 4
    assert dl.plan.sampler == loading_planning.BlockPlan(4)
    torch.manual_seed(0)
    again = DataLoader(mirror, 64, shuffle=True, num_workers=0)
    assert list(dl.sampler) == list(again.sampler)
    subset = DataLoader(Subset(mirror, range(30)), 8, shuffle=True, num_workers=0)
    assert isinstance(subset.sampler, BlockShuffleSampler)
    assert isinstance(DataLoader(mirror, 8, num_workers=0).sampler, tud.SequentialSampler)
    assert isinstance(DataLoader(Images(40), 8, shuffle=True, num_workers=0).sampler, tud.RandomSampler)
    assert DataLoader(mirror, 4096, shuffle=True, num_workers=0).sampler.block_size == 64
    torch.manual_seed(1)
    assert list(DataLoader(mirror, 64, shuffle=True, num_workers=0).sampler) != list(dl.sampler)
    mirror.shuffled = True  # packed with pack(shuffle=True): its blocks already mix classes
    assert DataLoader(mirror, 64, shuffle=True, num_workers=0).sampler.block_size == 64


def test_set_epoch_is_forwarded():
    dl = DataLoader(Images(40, mirror=True), 4, shuffle=True, num_workers=0)
    dl.set_epoch(3)
    assert dl.sampler.epoch == 3 and list(dl.sampler) == dl.sampler.order(3).tolist()
    dist = tud.DistributedSampler(Images(8), num_replicas=2, rank=0)
    DataLoader(Images(8), 2, sampler=dist, num_workers=0).set_epoch(5)
    assert dist.epoch == 5


def test_device_checks(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert DataLoader(Images(), 2, num_workers=0).device == torch.device("cpu")
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        DataLoader(Images(), 2, device="cuda")
    with pytest.raises(ValueError, match="decode='gpu' needs a CUDA device"):
        DataLoader(Images(output="bytes"), 2, decode="gpu", device="cpu")
    with pytest.raises(ValueError, match="decode must be"):
        DataLoader(Images(), 2, decode="nvjpeg")


# --- DataLoader: decoding -----------------------------------------------------------------------------


def test_bytes_are_decoded_in_the_workers_on_the_cpu():
    ds = Images(6, output="bytes")
    dl = DataLoader(ds, 3, num_workers=1, device="cpu", mean=MEAN, std=STD)
    assert dl.choices["decode"][0] == "cpu"
    assert dl.dataset.dataset is ds and dl.dataset.classes == ["a", "b"]  # a thin, transparent wrapper
    x, y = next(iter(dl))
    want = torch.stack([decode_cpu(ds[i][0]) for i in range(3)])
    torch.testing.assert_close(x, manual(want), rtol=0, atol=1e-6)
    assert y.tolist() == [0, 1, 0]


def test_undecodable_bytes_name_the_dataset_index():
    ds = Images(6, output="bytes", broken=(4,))
    with pytest.raises(ValueError, match="dataset index 4"):
        list(DataLoader(ds, 3, num_workers=0, device="cpu"))
    with pytest.raises(ValueError, match="dataset index 4"):  # from a worker process too
        list(DataLoader(ds, 3, num_workers=1, device="cpu"))


def test_undetected_bytes_are_still_decoded():
    class Anonymous(Dataset):  # yields JPEG bytes but does not say so (no `output`)
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return Images(4, output="bytes")[i]

    dl = DataLoader(Anonymous(), 2, num_workers=0, device="cpu")
    assert dl.choices["decode"][0] == "auto"
    x, _ = next(iter(dl))
    assert x.shape == (2, 3, 12, 10) and x.dtype == torch.uint8


# --- CUDA --------------------------------------------------------------------------------------------


def need_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.cuda
def test_cuda_loader_equals_cpu_loader():
    need_cuda()
    ds = Kitti(6)
    kw = dict(mean=MEAN, std=STD, dtype=torch.float16, memory_format=torch.channels_last, num_workers=1)
    crop = v2.CenterCrop((16, 32))  # exact on both devices, unlike interpolation
    cuda = DataLoader(ds, 3, device="cuda", transform=crop, **kw)
    cpu = DataLoader(ds, 3, device="cpu", transform=crop, **kw)
    assert cuda.pin_memory and cuda.choices["pin_memory"][0] is True
    for _epoch in range(2):
        for (gx, gt), (cx, ct) in zip(cuda, cpu):
            assert gx.is_cuda and gx.dtype == torch.float16 and gx.is_contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(gx.cpu().float(), cx.float(), rtol=0, atol=2e-2)
            assert gt == ct


@pytest.mark.cuda
def test_gpu_decode_through_the_loader():
    need_cuda()
    # Photo-like images large enough to be smooth: nvJPEG and libjpeg-turbo differ by a mean of about
    # 2 levels on such images (500x375: 1.96, max 20), by up to 4.2 on tiny noisy ones.
    ds = Images(8, size=(150, 200), output="bytes", ragged=True)
    dl = DataLoader(ds, 4, device="cuda", mean=MEAN, std=STD, transform=v2.CenterCrop(128), num_workers=1)
    assert dl.choices["decode"][0] == "gpu"
    cpu = DataLoader(ds, 4, device="cpu", mean=MEAN, std=STD, transform=v2.CenterCrop(128), num_workers=1)
    for (gx, gy), (cx, cy) in zip(dl, cpu):
        assert gx.is_cuda and gx.shape == cx.shape == (4, 3, 128, 128) and gy.is_cuda
        levels = ((gx.cpu() - cx) * 255 * torch.tensor(STD).view(3, 1, 1)).abs().mean()
        assert levels < 3.5, levels  # JPEG decoders differ by a few levels
        assert torch.equal(gy.cpu(), cy)
    broken = DataLoader(Images(6, output="bytes", broken=(5,)), 3, device="cuda", num_workers=0)
    with pytest.raises(ValueError, match="dataset index 5"):
        list(broken)


@pytest.mark.cuda
def test_cuda_loader_repeats_under_a_seed_and_fifty_epochs_with_breaks_stay_flat():
    """Issue 11 through colabfast.DataLoader itself: batched GPU transforms drawn in the feeder thread
    repeat under torch.manual_seed; 50 epochs with early breaks leave no thread and no memory behind."""
    from conftest import assert_flat_over_epochs_with_breaks

    from colabfast.images import transforms as T

    need_cuda()
    ds = Images(16, size=(150, 200), output="bytes", ragged=True)
    t = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip()])

    def run(seed):
        torch.manual_seed(seed)
        loader = DataLoader(ds, 4, device="cuda", transform=t, num_workers=1, feed_depth=2)
        return loader, [x.cpu() for x, _ in loader]

    loader, first = run(3)
    assert loader.choices["transform"][1].startswith("whole batches on the GPU")
    assert all(torch.equal(a, b) for a, b in zip(first, run(3)[1]))
    assert not all(torch.equal(a, b) for a, b in zip(first, [x.cpu() for x, _ in loader]))  # next epoch
    assert_flat_over_epochs_with_breaks(loader, period=3)


def test_torchvision_imagefolder_drop_in(tmp_path):
    from torchvision.datasets import ImageFolder

    from colabfast.testing.data import make_imagefolder

    root = make_imagefolder(tmp_path / "train", classes=2, per_class=3, size=(40, 30), vary=0.2)
    ds = ImageFolder(root, transform=v2.Compose([v2.ToImage(), v2.Resize((24, 24), antialias=True)]))
    plain = list(tud.DataLoader(ds, 4))
    ours = list(DataLoader(ds, 4, num_workers=1, mean=MEAN, std=STD))
    for (x, y), (px, py) in zip(ours, plain):
        assert type(x) is torch.Tensor and x.shape == px.shape
        torch.testing.assert_close(x, manual(px.as_subclass(torch.Tensor)), rtol=0, atol=1e-6)
        assert torch.equal(y, py)


# --- the plan -----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    from colabfast.packing import pack
    from colabfast.testing.data import make_imagefolder

    out = tmp_path_factory.mktemp("loading")
    return pack(make_imagefolder(out / "src", classes=2, per_class=4, size=(20, 16)), out / "m.h5", progress=False)


def test_the_plan_is_typed_and_frozen_and_the_loader_lists_it(monkeypatch, mirror):
    """Issue 24, item 2: one field per decision, their reasons, and loader.choices in its old shape
    (name -> (value, why)) made from the same plan."""
    import dataclasses

    monkeypatch.setattr(loading_loader.env, "cpu_count", lambda: 2)
    p = loading_planning.plan(Images(), batch_size=4, device="cpu", memory_format=torch.channels_last)
    assert isinstance(p, loading_planning.Plan) and p.device == torch.device("cpu")
    assert (p.num_workers, p.persistent_workers, p.prefetch_factor, p.pin_memory) == (2, True, 4, False)
    assert p.layout == torch.channels_last and p.collate_fn.keywords == {"memory_format": torch.channels_last}
    assert p.reader is None and p.sampler == "SequentialSampler" and p.decode == "auto"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.num_workers = 0  # type: ignore[misc]
    assert set(p.reasons) == set(p.choices())
    dl = DataLoader(Images(), 4, device="cpu", memory_format=torch.channels_last)
    planned = p.choices()
    assert list(dl.choices)[:len(planned)] == list(planned) and all(dl.choices[k] == v for k, v in planned.items())
    assert dl.choices["collate_fn"][0] == "colabfast.loading.collate.collate" and dl.plan.layout == torch.channels_last
    assert dl.collate_fn.keywords == {"memory_format": torch.channels_last}
    assert all(isinstance(why, str) for _, why in dl.choices.values())
    unbatched = loading_planning.plan(Images(), batch_size=None, device="cpu", num_workers=0)
    assert unbatched.layout is None and unbatched.collate_fn is None
    assert unbatched.choices()["collate_fn"][0] == "default_convert"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # planning needs no GPU, only its index
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    cuda = loading_planning.plan(Images(output="bytes"), batch_size=4)
    assert cuda.device == torch.device("cuda", 0) and cuda.layout == torch.channels_last and cuda.pin_memory
    assert cuda.decode == "gpu" and cuda.layout == torch.channels_last
    # A mirror's files for nvJPEG: read by the feeder thread itself into pinned memory, no reader threads
    from colabfast.datasets.dropins import H5ImageFolder

    gpu = loading_planning.plan(H5ImageFolder(mirror, output="bytes"), batch_size=4)
    assert gpu.decode == "gpu" and gpu.pin_memory and gpu.num_workers == 0
    assert (gpu.reader.threads, gpu.reader.prefetch, gpu.prefetch_factor) == (0, 0, None)
    assert str(gpu.choices()["reader"][0]) == "in the feeder thread"


def test_the_datasets_facts_are_found_once_through_any_subsets(mirror, monkeypatch):
    """Issue 38, item 3: plan() walks the Subsets once (dataset_facts) and every decision reads the facts."""
    from colabfast.datasets.dropins import H5ImageFolder

    ds = H5ImageFolder(mirror, output="bytes")
    nested = Subset(Subset(ds, [7, 6, 5, -1, 0]), [3, 0, 4])
    facts = loading_planning.dataset_facts(nested)
    assert facts.inner is ds and facts.dataset is nested and facts.mapping.tolist() == [7, 7, 0]
    assert (facts.output, facts.mirror, facts.iterable, facts.own_transforms) == ("bytes", True, False, False)
    assert loading_planning.dataset_facts(ds).mapping is None
    walked = []
    through = loading_loader.datasets.through_subsets
    monkeypatch.setattr(loading_loader.datasets, "through_subsets", lambda d: walked.append(d) or through(d))
    p = loading_planning.plan(nested, batch_size=2, shuffle=True, device="cpu")
    assert walked == [nested]  # once, for every decision
    assert p.facts == facts and p.decode == "cpu" and p.sampler == loading_planning.BlockPlan(1)
    with pytest.raises(IndexError, match="outside its dataset"):
        loading_planning.dataset_facts(Subset(ds, [len(ds)]))


def test_the_loader_does_what_its_plan_says(mirror, monkeypatch):
    """The plan's reader is what makes the batches: its threads read (fused: the thread workers' threads);
    without one, torch's fetcher reads the dataset in the worker processes or, with none, here."""
    import threading

    from colabfast.datasets.dropins import H5ImageFolder
    from colabfast.loading import reader

    names: list[str] = []
    read = reader.BatchReader.read

    def spy(self, indices, *args, **kwargs):
        names.append(threading.current_thread().name)
        return read(self, indices, *args, **kwargs)

    monkeypatch.setattr(reader.BatchReader, "read", spy)
    for transform, prefix in ((None, "colabfast-reader"), (v2.RandomResizedCrop(8), "colabfast-worker-")):
        loader = DataLoader(H5ImageFolder(mirror, output="tensor"), 2, device="cpu", transform=transform)
        assert loader.plan.reader is not None and (loader.plan.reader.fused is not None) == (transform is not None)
        names.clear()
        assert sum(len(y) for _, y in loader) == 8
        assert names and all(n.startswith(prefix) for n in names), names
    plain = DataLoader(H5ImageFolder(mirror, output="tensor"), 2, device="cpu", num_workers=0)
    assert plain.plan.reader is None and plain.plan.num_workers == 0
    names.clear()
    assert sum(len(y) for _, y in plain) == 8 and names == []


def test_a_pil_mirror_is_refused_before_iterating_with_the_fix(mirror, monkeypatch):
    """Issue 23, item 13: H5ImageFolder's default output="pil" met torch's default_collate error in a
    worker; the loader refuses it when made, naming the mirror and what to pass."""
    from colabfast.datasets.dropins import H5ImageFolder

    for ds in (H5ImageFolder(mirror), Subset(H5ImageFolder(mirror), [0, 1, 2])):
        with pytest.raises(ValueError, match=r"H5ImageFolder\('.*m\.h5'\) gives PIL images") as e:
            DataLoader(ds, 2, device="cpu")
        assert "output='tensor'" in str(e.value) and "PILToTensor()" in str(e.value)
        with pytest.raises(ValueError, match="gives PIL images"):
            loading_planning.plan(ds, batch_size=2, device="cpu")
    # Whatever makes tensors before batching is left alone: the dataset's transform, a per-image
    # loader transform on the CPU, the caller's collate_fn, no batching, or output="tensor".
    images, labels = next(iter(DataLoader(H5ImageFolder(mirror, transform=v2.PILToTensor()), 2, num_workers=0)))
    assert images.shape == (2, 3, 16, 20) and labels.tolist() == [0, 0]
    cpu = DataLoader(H5ImageFolder(mirror), 2, num_workers=0, device="cpu", transform=v2.PILToTensor())
    assert torch.equal(next(iter(cpu))[0], images)
    assert len(next(iter(DataLoader(H5ImageFolder(mirror), 2, num_workers=0, collate_fn=list)))) == 2
    assert next(iter(DataLoader(H5ImageFolder(mirror), None, num_workers=0, device="cpu")))[0].size == (20, 16)
    assert torch.equal(next(iter(DataLoader(H5ImageFolder(mirror, output="tensor"), 2, device="cpu")))[0], images)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ValueError, match="gives PIL images"):  # on CUDA the loader's transform runs after batching
        loading_planning.plan(H5ImageFolder(mirror), batch_size=2, transform=v2.PILToTensor())


@pytest.mark.parametrize("batch_size, block, spans", [(2, 1, 2), (16, 1, 16), (100, 6, 17), (4096, 64, 64)])
def test_the_block_sampler_says_how_many_blocks_a_batch_mixes(batch_size, block, spans):
    """Issue 23, item 16: the reason said "a batch mixes 16 blocks" whatever the batch size."""
    p = loading_planning.plan(Images(40, mirror=True), batch_size=batch_size, shuffle=True, num_workers=0, device="cpu")
    assert p.sampler == loading_planning.BlockPlan(block)
    assert p.reasons["sampler"] == (f"h5 mirror, shuffle=True, blocks of {block}: a batch of {batch_size} mixes at "
                                    f"least {spans} blocks (pack(shuffle=True) allows 64)")
    order = list(BlockShuffleSampler(range(400), block, seed=0))
    first = order[:batch_size]
    assert len({i // block for i in first}) >= min(spans, 400 // block)  # what the sentence claims
    unbatched = loading_planning.plan(Images(40, mirror=True), batch_size=None, shuffle=True, num_workers=0,
                                      device="cpu")
    assert unbatched.reasons["sampler"] == "h5 mirror, shuffle=True, blocks of 64: no batches to mix"


class _FreezeCount(Dataset):
    """Each sample is ``gc.get_freeze_count()`` where it is made: in a worker, what the fork froze."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> int:
        import gc

        return gc.get_freeze_count()


@pytest.mark.skipif(multiprocessing.get_start_method() != "fork", reason="workers fork only where fork is the default")
@pytest.mark.parametrize("persistent", [True, False])
def test_forked_workers_start_with_the_parents_objects_frozen_where_cuda_is_initialised(monkeypatch, persistent):
    """On an H100 a forked worker's garbage collector freed an inherited CUDA tensor the feeder had
    record_stream-ed and the worker aborted (CUDA error: initialization error); gc.freeze() around the
    fork keeps the child's collector off what it inherits, and the parent takes its objects back."""
    import gc

    plain = DataLoader(_FreezeCount(), 2, num_workers=1, device="cpu", persistent_workers=persistent)
    assert [int(v) for b in plain for v in b] == [0] * 4  # no CUDA: nothing frozen
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    loader = DataLoader(_FreezeCount(), 2, num_workers=1, device="cpu", persistent_workers=persistent)
    for _epoch in range(2):
        counts = [int(v) for b in loader for v in b]
        assert len(counts) == 4 and min(counts) > 1000, counts  # the parent's objects, frozen in the child
        assert gc.get_freeze_count() == 0  # and taken back here


def test_more_workers_than_cpus_is_explained_and_warned_once(monkeypatch, mirror):
    """Issue 39 item 6: num_workers=8 on 2 CPUs was taken silently, and asking for workers turned off
    the reader threads."""
    import warnings

    from colabfast.datasets.dropins import H5ImageFolder

    monkeypatch.setattr(loading_loader.env, "cpu_count", lambda: 2)
    monkeypatch.setattr(loading_planning, "_WARNED", set())
    ds = H5ImageFolder(mirror, output="tensor", transform=v2.RandomResizedCrop(8))
    assert DataLoader(ds, 2, device="cpu").choices["reader"][0] != "none"  # the reader threads, unasked
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader = DataLoader(ds, 2, device="cpu", num_workers=8)
        DataLoader(ds, 2, device="cpu", num_workers=8)
    value, why = loader.choices["num_workers"]
    assert value == 8 and "8 worker processes on 2 CPUs" in why and "turned off the reader threads" in why
    ours = [w for w in caught if str(w.message).startswith("colabfast.DataLoader")]
    assert len(ours) == 1 and why in str(ours[0].message)
    assert DataLoader(ds, 2, device="cpu", num_workers=2).choices["num_workers"][1] == "set by caller"


def test_stage_times_account_for_the_work_done(mirror):
    """Issue 38, item 6: the reader threads time reading, decoding and transforming, and making each
    batch, counted in samples; the training loop's waits in batches; no "copy" stage on the CPU."""
    from colabfast.datasets.dropins import H5ImageFolder

    for transform in (None, v2.RandomResizedCrop(8)):
        loader = DataLoader(H5ImageFolder(mirror, output="tensor"), 3, device="cpu", transform=transform)
        assert loader.plan.reader is not None and loader.stage_times() == {}
        for _epoch in range(2):
            assert sum(len(y) for _, y in loader) == 8
        times = loader.stage_times()
        assert list(times) == ["read", "decode+transform", "collate", "wait"], times
        assert [t.count for t in times.values()] == [16, 16, 16, 6]  # samples, samples, samples, batches
        assert all(t.seconds > 0 for t in times.values())


def test_a_slow_transform_makes_decode_and_transform_the_slowest_stage():
    def slow(image):
        time.sleep(0.005)
        return image

    loader = DataLoader(Images(8), 4, num_workers=0, device="cpu", transform=slow)
    assert sum(len(y) for _, y in loader) == 8
    times = loader.stage_times()
    assert [(name, t.count) for name, t in times.items()] == [("read", 8), ("decode+transform", 8), ("collate", 8),
                                                             ("wait", 2)]
    assert times["decode+transform"].seconds >= 8 * 0.005  # the sleeps, all accounted for
    assert max(("read", "decode+transform", "collate"), key=lambda n: times[n].seconds) == "decode+transform"
    from colabfast.diagnosis.report import diagnose

    report = diagnose(loader, lambda batch: None, steps=3, warmup=1, verbose=False)
    assert report.verdict == "data-bound" and report.slowest_stage()[0] == "decode+transform"
    assert "decode+transform takes" in report.headline() and report.stages["decode+transform"].count == 12
