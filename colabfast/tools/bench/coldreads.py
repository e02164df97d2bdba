"""Cold reads of a mirror on the Drive simulator: :class:`colabfast.BlockShuffleSampler` against a
fully random sampler, same mirror, same DataLoader.

Each run starts fresh workers, which open the mirror again; the simulator's kernel cache is dropped
on every open, so every run reads cold through the simulated link. The mirror datasets read each
batch's runs of consecutive samples with one read each (``__getitems__``): a block-shuffled batch is
a few large reads, a randomly sampled batch one small read per sample, each paying Drive's
per-request latency.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Optional

from torch.utils.data import DataLoader, RandomSampler

from colabfast.datasets.dropins import H5ImageFolder
from colabfast.drivesim.simulator import DriveSim
from colabfast.loading.sampler import BlockShuffleSampler
from colabfast.packing import pack
from colabfast.testing import data
from colabfast.tools.bench.timing import Result, measure


def _as_lists(batch: list) -> tuple:
    return tuple(zip(*batch))


def run(size: float = 1.0, repeats: int = 3, batch_size: int = 64, workers: int = 2, image_size: int = 128,
        drive: Optional[dict] = None, work: Optional[Path] = None) -> list[Result]:
    """Measure one cold epoch of a mirror on the simulated Drive, per sampler and per output.

    Args:
        size: 1.0 is 4000 images (ImageNet-like photos packed at ``image_size``, about 10 kB each).
        repeats: epochs per sampler (median reported), each with fresh workers.
        batch_size, workers: the DataLoader's.
        image_size: short side the mirror is packed at (ImageNet is commonly packed at 128-256).
        drive: simulator settings over :class:`~colabfast.drivesim.fs.DriveSimParams`' defaults
            (100 ms per open, 2 ms per read request, 60 MB/s).
    """
    rows = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        n = max(2 * batch_size, int(4000 * size))
        src = data.make_imagefolder(tmp / "src", classes=10, per_class=n // 10, size=(500, 375), vary=0.2)
        (tmp / "drive").mkdir()
        mirror = pack(src, tmp / "drive" / "mirror.h5", image_size=image_size, shuffle=True, progress=False)
        nbytes = mirror.stat().st_size
        with DriveSim(tmp / "drive", tmp / "mnt", **(drive or {})) as sim:
            for output in ("bytes", "tensor"):
                ds = H5ImageFolder(sim.mountpoint / "mirror.h5", output=output)
                samplers = {"torch RandomSampler": lambda ds=ds: RandomSampler(ds),
                            "colabfast.BlockShuffleSampler(64)": lambda ds=ds: BlockShuffleSampler(ds, 64)}
                for name, make in samplers.items():
                    def epoch(make=make, ds=ds) -> None:
                        loader = DataLoader(ds, batch_size, sampler=make(), num_workers=workers, collate_fn=_as_lists)
                        for _ in loader:
                            pass

                    sim.reset_stats()
                    med, low, high = measure(epoch, repeats)
                    reads = sim.stats()["reads"] / repeats
                    rows.append(Result(f"cold-reads/{output}", name, med, low, high, repeats, {
                        "images/s": len(ds) / med, "MB/s": nbytes / med / 1e6, "reads/epoch": reads}))
    return rows
