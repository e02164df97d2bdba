"""colabfast.loading.sampler: block shuffle orders, epochs, seeding, replica shares."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from colabfast.datasets.dropins import H5ImageFolder, read_order
from colabfast.loading.sampler import BlockShuffleSampler, block_shuffle, replica_share
from colabfast.packing import pack
from colabfast.testing.data import make_imagefolder


def blocks_of(order: np.ndarray, block_size: int) -> list[int]:
    """The block ids in the order they are first visited, checking each block is visited in one run."""
    ids = order // block_size
    runs = [int(ids[0])] + [int(b) for a, b in zip(ids[:-1], ids[1:]) if a != b]
    assert len(runs) == len(set(runs)), "a block was split"
    return runs


def test_order_is_a_permutation_of_whole_shuffled_blocks():
    order = block_shuffle(1000, 64, seed=3, epoch=0)
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(1000))
    runs = blocks_of(order, 64)
    assert sorted(runs) == list(range(16))  # 15 full blocks and a short last one
    assert runs != sorted(runs)  # blocks are shuffled...
    first_block = order[:64] if runs[0] != 15 else order[64:128]
    assert first_block.tolist() != sorted(first_block.tolist())  # ...and so are items inside a block


def test_same_seed_and_epoch_same_order_else_different():
    a = block_shuffle(500, 16, seed=1, epoch=0)
    assert np.array_equal(a, block_shuffle(500, 16, seed=1, epoch=0))
    assert not np.array_equal(a, block_shuffle(500, 16, seed=1, epoch=1))
    assert not np.array_equal(a, block_shuffle(500, 16, seed=2, epoch=0))


def test_any_int64_seed_orders_an_epoch():
    """A resume state's seed is any int64 (docs/resume.md); NumPy takes none below 0, so it is taken modulo 2**64."""
    for seed in (-1, -2**63, 2**63 - 1):
        order = block_shuffle(50, 4, seed=seed, epoch=3)
        assert sorted(order.tolist()) == list(range(50))
    assert not np.array_equal(block_shuffle(50, 4, seed=-1, epoch=0), block_shuffle(50, 4, seed=1, epoch=0))


def test_block_size_one_is_a_full_shuffle():
    order = block_shuffle(100, 1, seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(100))
    assert order.tolist() != list(range(100))


@pytest.mark.parametrize("n", [0, 1, 7])
def test_small_datasets(n):
    assert sorted(block_shuffle(n, 4, seed=0, epoch=0).tolist()) == list(range(n))


def test_replica_shares_are_contiguous_equal_and_padded_like_distributed_sampler():
    order = np.arange(10, dtype=np.int64) * 10
    shares = [replica_share(order, 4, r) for r in range(4)]
    assert [len(s) for s in shares] == [3, 3, 3, 3]
    assert np.concatenate(shares).tolist() == order.tolist() + [0, 10]  # padded from the start
    assert shares[1].tolist() == [30, 40, 50]  # contiguous, not strided
    dropped = [replica_share(order, 4, r, drop_last=True) for r in range(4)]
    assert np.concatenate(dropped).tolist() == order[:8].tolist()


def test_sampler_reshuffles_each_iteration_until_set_epoch_pins_it():
    s = BlockShuffleSampler(range(200), 8, seed=5)
    first, second = list(s), list(s)
    assert sorted(first) == sorted(second) == list(range(200))
    assert first != second  # no set_epoch: each iteration is a new epoch
    assert first == s.order(0).tolist() and second == s.order(1).tolist()
    s.set_epoch(7)
    assert list(s) == list(s) == s.order(7).tolist()
    assert all(isinstance(i, int) for i in s)


def test_default_seed_is_fixed_like_distributed_sampler():
    torch.manual_seed(0)
    a = list(BlockShuffleSampler(range(300), 4))
    torch.manual_seed(1)
    assert list(BlockShuffleSampler(range(300), 4)) == a  # every rank must agree: seed 0
    assert list(BlockShuffleSampler(range(300), 4, seed=1)) != a


def test_no_shuffle_keeps_order_and_shares():
    assert list(BlockShuffleSampler(range(10), 4, shuffle=False)) == list(range(10))
    shares = [list(BlockShuffleSampler(range(10), 4, shuffle=False, num_replicas=2, rank=r)) for r in range(2)]
    assert shares == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


def _rank_share(rank: int, init: str, out: str) -> None:  # runs in a spawned process
    import json

    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        s = BlockShuffleSampler(range(51), 8)  # num_replicas and rank come from torch.distributed
        with open(f"{out}.{rank}", "w") as f:
            json.dump([s.num_replicas, s.rank, list(s)], f)
    finally:
        torch.distributed.destroy_process_group()


def test_replicas_default_from_torch_distributed(tmp_path):
    import json

    torch.multiprocessing.spawn(_rank_share, args=(f"file://{tmp_path / 'store'}", str(tmp_path / "share")), nprocs=2)
    (n0, r0, a), (n1, r1, b) = (json.loads((tmp_path / f"share.{r}").read_text()) for r in range(2))
    assert (n0, r0, n1, r1) == (2, 0, 2, 1)
    assert len(a) == len(b) == 26 and set(a) | set(b) == set(range(51))


def test_replicas_split_one_global_order():
    samplers = [BlockShuffleSampler(range(103), 8, seed=2, num_replicas=3, rank=r) for r in range(3)]
    for s in samplers:
        s.set_epoch(4)
    shares = [list(s) for s in samplers]
    assert [len(s) for s in samplers] == [35, 35, 35] == [len(x) for x in shares]
    assert set(sum(shares, [])) == set(range(103))
    assert sum(shares, [])[:103] == block_shuffle(103, 8, 2, 4).tolist()
    assert len(BlockShuffleSampler(range(103), 8, seed=2, num_replicas=3, drop_last=True)) == 34


def test_bad_arguments():
    with pytest.raises(ValueError, match="block_size"):
        BlockShuffleSampler(range(10), 0)
    with pytest.raises(ValueError, match="rank"):
        BlockShuffleSampler(range(10), 2, num_replicas=2, rank=2)


@pytest.fixture(scope="module")
def mirrors(tmp_path_factory) -> dict[str, H5ImageFolder]:
    out = tmp_path_factory.mktemp("sampler")
    src = make_imagefolder(out / "src", classes=2, per_class=12, size=(8, 8))
    return {"plain": H5ImageFolder(pack(src, out / "plain.h5", store="raw", progress=False)),
            "shuffled": H5ImageFolder(pack(src, out / "shuffled.h5", store="raw", shuffle=True, seed=1,
                                           progress=False))}


def test_blocks_are_runs_of_stored_samples_of_a_reordered_mirror(mirrors):
    """Issue 23 item 9: a mirror's index i is torchvision's sample i, stored elsewhere in a shuffled
    mirror; the sampler walks it in stored order, so every block is still consecutive stored samples,
    with replicas too, and shuffle=False reads the file front to back."""
    ds = mirrors["shuffled"]
    at = ds.reader.positions  # index -> stored position
    assert at is not None and np.array_equal(np.sort(at), np.arange(24))
    assert read_order(ds).tolist() == np.argsort(at).tolist()
    for replicas in (1, 2):
        shares = [BlockShuffleSampler(ds, 4, seed=3, num_replicas=replicas, rank=r).order(0) for r in range(replicas)]
        for share in shares:
            assert sorted(blocks_of(at[share], 4)) == sorted(set((at[share] // 4).tolist()))
        assert sorted(np.concatenate(shares).tolist()) == list(range(24))
    runs = blocks_of(at[BlockShuffleSampler(ds, 4, seed=3).order(0)], 4)
    assert runs != sorted(runs)  # still shuffled
    assert at[list(BlockShuffleSampler(ds, 4, shuffle=False))].tolist() == list(range(24))


def test_a_subset_of_a_mirror_is_walked_in_stored_order(mirrors):
    """random_split's Subsets hold indices in random order; the sampler reads their samples at rising
    places in the file (blocks of neighbours), yielding the Subset's own indices."""
    for ds in mirrors.values():
        at = ds.reader.positions if ds.reader.positions is not None else np.arange(len(ds))
        train, _ = torch.utils.data.random_split(ds, [16, 8], generator=torch.Generator().manual_seed(0))
        stored = at[np.asarray(train.indices)]  # where each of the Subset's samples is stored
        assert list(BlockShuffleSampler(train, 4, shuffle=False)) == np.argsort(stored).tolist()
        order = BlockShuffleSampler(train, 4, seed=2).order(0)
        assert sorted(order.tolist()) == list(range(16))
        rank = np.argsort(np.argsort(stored))  # each Subset index's rank in stored order
        assert sorted(blocks_of(rank[order], 4)) == [0, 1, 2, 3]


def test_a_mirror_stored_in_its_own_order_needs_no_mapping(mirrors):
    plain = mirrors["plain"]
    assert plain.reader.positions is None and read_order(plain) is None
    assert read_order(torch.utils.data.Subset(plain, [2, 3, 9])) is None
    assert list(BlockShuffleSampler(plain, 4, shuffle=False)) == list(range(24))
    assert list(BlockShuffleSampler(plain, 4, seed=1)) == list(BlockShuffleSampler(range(24), 4, seed=1))
