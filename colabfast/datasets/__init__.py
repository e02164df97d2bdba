"""Datasets over HDF5 mirrors: drop-ins for torchvision's ``ImageFolder`` and ``Kitti``.

Safe in DataLoader workers under fork, spawn and forkserver: nothing HDF5 is held open, a dataset
pickles as its path, and images are read with one ``os.pread`` each (the datasets are contiguous).
Index ``i`` is the source's sample ``i``; the file may store samples in another order (``shuffle=True``,
an archive's), mapped by :func:`stored_positions`, and :func:`read_order` walks a dataset in stored order."""

from __future__ import annotations

from colabfast.datasets import h5dataset  # noqa: F401, I001 (it registers its drop-ins with colabfast.layouts.registry)
from colabfast.datasets.dropins import H5ImageFolder, H5Kitti, MirrorDataset, read_order, through_subsets, unwrap
from colabfast.datasets.mirrorreader import MirrorReader, stored_positions

__all__ = [
    "H5ImageFolder",
    "H5Kitti",
    "MirrorDataset",
    "MirrorReader",
    "read_order",
    "stored_positions",
    "through_subsets",
    "unwrap",
]
