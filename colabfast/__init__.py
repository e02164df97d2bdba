"""colabfast: end the data-loading bottleneck of PyTorch training in Google Colab and Jupyter.

The data path, a folder per stage: ``where`` (where we run: the machine, its mount table, Drive's local
stand-in, a RAM disk) -> ``drive`` (mount Google Drive, fetch shared links, the Drive simulator) ->
``staging`` (copy to local disk or RAM; archives extracted safely) -> ``mirror`` (the HDF5 mirror
format, its checks, its index, its columns) -> ``layouts`` (every source layout, one registry) ->
``packing`` (sources into mirrors) -> ``images`` (decode, transforms, augmentation) -> ``datasets``
(the drop-ins over mirrors) -> ``loading`` (the DataLoader: plan, reader threads, sampler, collate,
feed to the GPU) -> ``diagnosis`` (are we data-bound? where should data live?). ``opening``
(``open_dataset``, ``ultralytics_data``) takes a source from Drive to a dataset in one call, through
all of them. ``tools`` (``colabfast demo``, ``colabfast bench``) and ``testing`` sit beside the data
path: nothing in it imports them.

Public names load on first use, so ``import colabfast`` and the CLI start fast.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

# public name -> module it is imported from (every error is defined in colabfast.errors)
_EXPORTS = {
    "Error": "colabfast.errors",
    "mount": "colabfast.drive",
    "refresh_drive": "colabfast.drive",
    "flush_drive": "colabfast.drive",
    "DriveError": "colabfast.drive",
    "fetch": "colabfast.staging.fetching",
    "FetchError": "colabfast.staging.fetching",
    "stage": "colabfast.staging",
    "StageError": "colabfast.staging",
    "NotEnoughSpace": "colabfast.errors",
    "ramdisk": "colabfast.where.tmpfs",
    "RamDisk": "colabfast.where.tmpfs",
    "pack": "colabfast.packing",
    "PackError": "colabfast.packing",
    "SplitRefused": "colabfast.packing",
    "ArchiveReadError": "colabfast.packing.archivesource",
    "open_dataset": "colabfast.opening",
    "H5ImageFolder": "colabfast.datasets",
    "H5Kitti": "colabfast.datasets",
    "H5Dataset": "colabfast.datasets.h5dataset",
    "H5CocoDetection": "colabfast.datasets.h5dataset",
    "H5VOCDetection": "colabfast.datasets.h5dataset",
    "H5VOCSegmentation": "colabfast.datasets.h5dataset",
    "LayoutError": "colabfast.layouts",
    "MirrorError": "colabfast.mirror",
    "info": "colabfast.mirror",
    "BlockShuffleSampler": "colabfast.loading.sampler",
    "DataLoader": "colabfast.loading",
    "LoaderStateError": "colabfast.loading.loader",
    "CUDAPrefetcher": "colabfast.loading.prefetch",
    "diagnose": "colabfast.diagnosis",
    "Report": "colabfast.diagnosis",
    "ultralytics_data": "colabfast.opening.ultralytics",
    "CacheLimitError": "colabfast.errors",
}

# modules users reach by their short names (cf.env, cf.doctor; `from colabfast import transforms`)
_MODULES = {
    "env": "colabfast.where.env",
    "doctor": "colabfast.diagnosis.doctor",
    "transforms": "colabfast.images.transforms",
}

__all__ = ["env", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    if importlib.util.find_spec(f"colabfast.{name}") is not None:  # a folder: cf.drive, cf.mirror, ...
        return importlib.import_module(f"colabfast.{name}")
    raise AttributeError(f"module 'colabfast' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
