"""Datasets over HDF5 mirrors: drop-ins for torchvision's ``ImageFolder`` and ``Kitti``.

Safe in DataLoader workers under fork, spawn and forkserver: nothing HDF5 is held open between
calls or across a fork, and a dataset pickles as its path (workers re-read the small metadata).
Images are read with one ``os.pread`` at the image's place in the file (the mirror's datasets are
contiguous, so their file offset is fixed), which skips HDF5's per-call overhead and its global
lock; per sample the dataset holds a few integers (offsets, shape, label), not Python objects.

Two orders meet here. A dataset's index ``i`` is the source's sample ``i``, in torchvision's order;
the file stores its samples in the order they were packed (a seeded random order with
``pack(shuffle=True)``, an archive's member order). The mirror's ``order`` dataset records each stored
sample's source index, and :func:`stored_positions` turns it into the one array that maps an index to
its stored position (None, free, where the two orders agree). Everything that reads works on stored
positions (:meth:`MirrorReader.views`, :mod:`colabfast.loading.reader`); :func:`read_order` lets a sampler walk
a dataset in stored order, so a block of consecutive stored samples is still one read."""

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
