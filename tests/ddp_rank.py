"""One rank of tests/test_distributed.py, started by ``torch.distributed.run`` (gloo, on the CPU).

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/ddp_rank.py SRC OUT

Opens the image folder ``SRC`` with ``colabfast.open_dataset`` (its mirror packed into ``OUT/mirrors``,
staged to local disk: ``to="disk"``), reads two epochs through ``colabfast.DataLoader`` with
``set_epoch``, and writes ``OUT/rank<r>.json``: which samples this rank read in each epoch (found by
their pixels, so the loader's own bookkeeping is not what is checked), what ``open_dataset`` said it did,
the staged copy it opened, and what ``stage`` printed. Each rank seeds torch differently first, as
independent processes do: the loaders must still agree on one order.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import colabfast as cf

EPOCHS = 2


def key(image: torch.Tensor) -> str:
    return hashlib.sha256(image.contiguous().numpy().tobytes()).hexdigest()


def epochs(loader: cf.DataLoader, index_of: dict[str, int]) -> list[list[int]]:
    """The dataset indices of the samples this rank reads, per epoch, found by each image's bytes."""
    read = []
    for epoch in range(EPOCHS):
        loader.set_epoch(epoch)
        read.append([index_of[key(image)] for images, _ in loader for image in images])
    return read


def main() -> None:
    src, out = Path(sys.argv[1]), Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1000 + rank)  # ranks' RNGs differ, as in any torchrun job that seeds by rank
    said = sys.stderr = io.StringIO()  # stage's own line: "... is up to date, nothing copied"
    # raw pixels: the loader's batches hold exactly ds[i]'s bytes, whichever decoder reads them
    ds = cf.open_dataset(src, mirrors=out / "mirrors", to="disk", output="tensor", store="raw", progress=True)
    sys.stderr = sys.__stderr__
    staged = Path(ds.path)
    index_of = {key(ds[i][0]): i for i in range(len(ds))}
    assert len(index_of) == len(ds), "two images with the same pixels: the test cannot tell them apart"

    mirror = cf.DataLoader(ds, batch_size=4, shuffle=True, device="cpu")
    # not a mirror: a DistributedSampler, drop_last passed on to it
    tensors = torch.utils.data.TensorDataset(torch.stack([ds[i][0] for i in range(len(ds))]),
                                             torch.arange(len(ds)))
    plain = cf.DataLoader(tensors, batch_size=5, shuffle=True, drop_last=True, num_workers=0, device="cpu")
    evaluation = cf.DataLoader(ds, batch_size=4, shuffle=False, device="cpu")
    record = {
        "rank": rank, "world": world, "pid": os.getpid(),
        "account": ds.account, "stderr": said.getvalue(), "staged": str(staged), "inode": staged.stat().st_ino,
        "mirror": epochs(mirror, index_of), "plain": epochs(plain, index_of),
        "evaluation": epochs(evaluation, index_of),
        "choices": {name: [str(value) for value in loader.choices["sampler"]] for name, loader in
                    (("mirror", mirror), ("plain", plain), ("evaluation", evaluation))},  # (what, why)
        "batches": [len(mirror), len(plain), len(evaluation)],
    }
    dist.barrier()  # every rank has opened and read: a copy staged again by a late rank would show now
    record["inode_after"] = staged.stat().st_ino
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
