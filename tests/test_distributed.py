"""torchrun end to end (issue 43, item 2): ``torch.distributed.run`` starts 2 gloo ranks on the CPU
(tests/ddp_rank.py), both call ``open_dataset`` on one folder at once and read two epochs through
``colabfast.DataLoader``: one packs and stages, the other waits and opens the same copy; each rank reads
its share, the shares partition each epoch (padded as ``DistributedSampler`` pads). Also, in this
process: the plan under a world of 2 (``world`` stubbed), the shared seed, and the sampler's refusals."""

from __future__ import annotations

import collections
import json
import math
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from samples import Images
from torch.utils.data import DistributedSampler, TensorDataset

import colabfast as cf
from colabfast.loading import planning, sampler
from colabfast.loading.planning import BlockPlan, ShardPlan, plan
from colabfast.testing.data import make_imagefolder
from colabfast.where import env, mounttable

N = 21  # 3 classes x 7: not a multiple of 2 ranks, so the shares are padded


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    """The two ranks' records (tests/ddp_rank.py) of one torchrun, with this test's own cache and
    local disk (``COLABFAST_CACHE``, ``TMPDIR``) passed to them."""
    root = tmp_path_factory.mktemp("ddp")
    src = make_imagefolder(root / "src", classes=3, per_class=N // 3, size=(16, 12))
    (root / "tmp").mkdir()
    env = {**os.environ, "COLABFAST_CACHE": str(root / "cache"), "TMPDIR": str(root / "tmp"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(cf.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}
    script = Path(__file__).with_name("ddp_rank.py")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(src), str(root)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    records = [json.loads((root / f"rank{r}.json").read_text()) for r in range(2)]
    for r in records:
        r["root"] = root
    return records


def test_each_rank_reads_its_share_and_the_shares_partition_each_epoch(ranks):
    share = math.ceil(N / 2)
    for epoch in range(2):
        a, b = (r["mirror"][epoch] for r in ranks)
        assert len(a) == len(b) == share
        counts = collections.Counter(a + b)
        assert set(counts) == set(range(N))  # every sample, once, but for the padding
        assert sorted(counts.values()) == [1] * (N - (2 * share - N)) + [2] * (2 * share - N)
        assert b[-1] == a[0]  # padded by repeating the epoch's start, as DistributedSampler pads
    for r in ranks:
        assert r["mirror"][0] != r["mirror"][1]  # set_epoch: another order each epoch
        assert r["choices"]["mirror"][0] == f"BlockShuffleSampler(n={N}, block_size=1, rank={r['rank']}/2)"
    assert ranks[0]["batches"][0] == ranks[1]["batches"][0] == math.ceil(share / 4)


def test_a_dataset_that_is_no_mirror_gets_a_distributed_sampler_with_the_loaders_drop_last(ranks):
    for epoch in range(2):
        a, b = (r["plain"][epoch] for r in ranks)
        assert len(a) == len(b) == N // 2 and not set(a) & set(b)  # truncated, not padded: drop_last
    assert ranks[0]["plain"][0] != ranks[0]["plain"][1]
    assert ranks[1]["choices"]["plain"][0] == "DistributedSampler(rank=1/2, shuffle=True)"


def test_without_shuffle_every_rank_reads_the_whole_dataset_in_order(ranks):
    for r in ranks:
        assert r["evaluation"] == [list(range(N))] * 2
        assert r["choices"]["evaluation"][0] == "SequentialSampler"
        assert "DistributedSampler(dataset, shuffle=False)" in r["choices"]["evaluation"][1]


def test_one_rank_packs_and_stages_and_the_other_opens_the_same_copy(ranks):
    first, second = ranks
    assert first["staged"] == second["staged"] and first["inode"] == second["inode"]
    assert first["inode_after"] == first["inode"]  # nobody staged it again once the other had opened it
    assert Path(first["staged"]).is_relative_to(first["root"] / "tmp")  # the staged copy, not the mirror
    packed = [r for r in ranks if "packed " in r["account"]]
    found = [r for r in ranks if "found a mirror of it" in r["account"]]
    assert len(packed) == len(found) == 1, [r["account"] for r in ranks]
    up_to_date = [r for r in ranks if "is up to date, nothing copied" in r["stderr"]]  # stage's own word
    assert len(up_to_date) == 1, [r["stderr"][-500:] for r in ranks]
    assert up_to_date == [r for r in ranks if "nothing copied" in r["account"]]  # and the account says so
    assert len(list((first["root"] / "mirrors").glob("*.h5"))) == 1


def test_the_account_of_a_rank_that_waited_for_anothers_copy_says_nothing_was_copied(tmp_path):
    """The account line of a rank whose stage found the copy another rank made while it waited (it was
    not there when the rank looked), against one that copied."""
    from colabfast.opening.early import _staging_words
    from colabfast.staging.destination import Destination

    mirror, local = tmp_path / "m.h5", tmp_path / "local" / "m.h5"
    mirror.write_bytes(b"x" * 1000)
    before = (os.stat(mirror), Destination(False, local, "to='disk'"), None)  # nothing at `local` yet
    waited = _staging_words(local, before, 2.5, copied=0)
    assert "by another process" in waited and waited.endswith("nothing copied")
    assert "nothing copied" not in _staging_words(local, before, 2.5, copied=1)


# --- in this process: the plan under a world of 2, the seed, the refusals -----------------------------


def test_the_plan_shards_shuffled_datasets_and_says_why(monkeypatch):
    monkeypatch.setattr(planning, "world", lambda: (2, 1))
    mirror = plan(Images(40, mirror=True), batch_size=64, shuffle=True)
    assert mirror.sampler == BlockPlan(4, 2, 1) and "rank 1 of 2" in mirror.reasons["sampler"]
    other = plan(Images(40), batch_size=8, shuffle=True)
    assert other.sampler == ShardPlan(2, 1) and "rank 1 of 2" in other.reasons["sampler"]
    kept = plan(Images(40, mirror=True), batch_size=8, shuffle=False)
    assert kept.sampler == "SequentialSampler" and "whole dataset" in kept.reasons["sampler"]
    given = plan(Images(40), batch_size=8, sampler=[0, 1])
    assert given.sampler == [0, 1] and given.reasons["sampler"] == "set by caller"
    built = ShardPlan(2, 1).build(Images(21), torch.Generator().manual_seed(0), drop_last=True)
    assert isinstance(built, DistributedSampler) and built.rank == 1 and len(built) == 10
    monkeypatch.setattr(planning, "world", lambda: (1, 0))
    assert plan(Images(40), batch_size=8, shuffle=True).sampler == "RandomSampler"


def test_the_loader_passes_drop_last_and_draws_the_seed_as_random_sampler_does():
    torch.manual_seed(3)
    expected = int(torch.empty((), dtype=torch.int64).random_().item())
    torch.manual_seed(3)
    dl = cf.DataLoader(Images(40, mirror=True), 8, shuffle=True, drop_last=True, num_workers=0)
    assert isinstance(dl.sampler, cf.BlockShuffleSampler) and dl.sampler.drop_last and dl.sampler.seed == expected
    assert sampler.shared_seed(torch.Generator().manual_seed(5)) == \
        int(torch.empty((), dtype=torch.int64).random_(generator=torch.Generator().manual_seed(5)).item())


@pytest.mark.parametrize("kwargs, words", [
    ({"block_size": 0}, "block_size"),
    ({"num_replicas": 2, "rank": 2}, "rank"),
    ({"num_replicas": 4, "rank": 0, "drop_last": True}, "drop_last=False"),
])
def test_a_sampler_that_makes_no_epoch_is_refused_with_the_fix(kwargs, words):
    with pytest.raises(cf.errors.SamplerRefused, match=words) as caught:
        cf.BlockShuffleSampler(range(3), **{"block_size": 2, **kwargs})
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, cf.Error)
    with pytest.raises(cf.errors.SamplerRefused, match="drop_last=False"):
        ShardPlan(4, 0).build(TensorDataset(torch.zeros(3)), None, drop_last=True)


def test_ranks_mounting_a_ram_disk_at_once_share_one_mount(local):
    """Ranks staging with ``to="ram"`` all ask for the RAM disk at once: one mounts, the others reuse it
    (stacked tmpfs mounts would each hide what the one below holds)."""
    if not env.is_root():
        pytest.skip("mounting a tmpfs needs root (Colab runs as root)")
    path = local / "ram"
    start = threading.Barrier(4)

    def mount(_: int) -> Path:
        start.wait()
        return cf.ramdisk("16M", path).path

    try:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(mount, range(4))) == [path] * 4
        assert [m.mountpoint for m in mounttable.mounts()].count(str(path)) == 1
    finally:
        while os.path.ismount(path):
            subprocess.run(["umount", str(path)], check=True)
