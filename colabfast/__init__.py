"""colabfast: end the data-loading bottleneck of PyTorch training in Google Colab and Jupyter.

The data path, one module each: ``mounttable`` (the machine's mounts) -> ``env`` (where we run;
``standin`` is Drive's local stand-in, ``drivesim`` a simulated Drive with its latency and faults) ->
``drive`` (mount Google Drive; ``fetching`` for shared links) -> ``staging`` (copy it to local disk or
RAM; ``archive``, ``tmpfs``) -> ``packing`` (HDF5 mirrors; ``mirror`` is the format, ``sources`` the
layouts, ``archivesource`` archives read as one stream, ``imagenet`` ImageNet's labels) -> ``datasets``
-> ``loading`` (feed the GPU; ``reader``, ``sampler``, ``collate``, ``prefetch``, ``gpudecode``,
``transforms``) -> ``diagnosis`` (are we data-bound?). ``opening`` (``open_dataset``) takes a source
from Drive to a dataset in one call, through staging, packing and datasets; ``yolodata``
(``ultralytics_data``) writes a YOLO export's mirrors out as a local tree Ultralytics trains from. ``doctor``
(``colabfast doctor``) reads ``env`` and ``staging`` to advise where data should live.

Public names load on first use, so ``import colabfast`` and the CLI start fast.
"""

from __future__ import annotations

import importlib
import importlib.util

__version__ = "0.1.0"

# public name -> module it is imported from (every error is defined in colabfast.errors)
_EXPORTS = {
    "Error": "colabfast.errors",
    "OpenRefused": "colabfast.opening",
    "mount": "colabfast.drive",
    "refresh_drive": "colabfast.drive",
    "flush_drive": "colabfast.drive",
    "DriveError": "colabfast.drive",
    "fetch": "colabfast.fetching",
    "FetchError": "colabfast.fetching",
    "FetchRefused": "colabfast.errors",
    "stage": "colabfast.staging",
    "StageError": "colabfast.staging",
    "StageRefused": "colabfast.staging",
    "NotEnoughSpace": "colabfast.errors",
    "ramdisk": "colabfast.tmpfs",
    "RamDisk": "colabfast.tmpfs",
    "pack": "colabfast.packing",
    "PackError": "colabfast.packing",
    "PackRefused": "colabfast.packing",
    "SplitRefused": "colabfast.packing",
    "SourceNotFound": "colabfast.errors",
    "SourceNotAFolder": "colabfast.errors",
    "ArchiveReadError": "colabfast.archivesource",
    "UnsafeArchiveError": "colabfast.archive",
    "open_dataset": "colabfast.opening",
    "NothingToOpen": "colabfast.opening",
    "H5ImageFolder": "colabfast.datasets",
    "H5Kitti": "colabfast.datasets",
    "H5Dataset": "colabfast.h5dataset",
    "H5CocoDetection": "colabfast.h5dataset",
    "H5VOCDetection": "colabfast.h5dataset",
    "H5VOCSegmentation": "colabfast.h5dataset",
    "FieldError": "colabfast.columns",
    "LayoutError": "colabfast.layouts",
    "LayoutFileNotFoundError": "colabfast.layouts.base",
    "LayoutNotFoundError": "colabfast.layouts.base",
    "MirrorError": "colabfast.mirror",
    "ImageSizeError": "colabfast.gpudecode",
    "IndexTypeError": "colabfast.h5dataset",
    "info": "colabfast.mirror",
    "BlockShuffleSampler": "colabfast.sampler",
    "DataLoader": "colabfast.loading",
    "FeedProcessError": "colabfast.feedprocess",
    "CUDAPrefetcher": "colabfast.prefetch",
    "diagnose": "colabfast.diagnosis",
    "Report": "colabfast.diagnosis",
    "ultralytics_data": "colabfast.yolodata",
    "ExportRefused": "colabfast.yolodata",
}

__all__ = ["env", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    if importlib.util.find_spec(f"colabfast.{name}") is not None:  # a module: cf.env, cf.drive, ...
        return importlib.import_module(f"colabfast.{name}")
    raise AttributeError(f"module 'colabfast' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
