"""From where the data is to a fast dataset in one call: :func:`open_dataset`.

It does what the step-by-step calls do (:func:`colabfast.pack` a folder or archive into a mirror,
:func:`colabfast.flush_drive`, :func:`colabfast.stage` the mirror, open it with its drop-in dataset),
deciding each step the way a careful user would. The decisions are small functions, each given what
it decides from (what the path is, where its mirrors live, what a mirror is named, which dataset reads
it), and :func:`open_dataset` only wires them, as torchvision's ``datasets/folder.py`` does.

A source's mirrors are found by the fingerprint :func:`colabfast.pack` records in each (the source's
files with their sizes and times, its layout, the options), and named by it, so a changed source or
other options make a new mirror beside the old ones, which stay until you delete them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from colabfast.errors import NothingToOpen, OpenRefused
from colabfast.opening.kinds import ACCEPTS, what_is
from colabfast.opening.mirrors import default_dataset_mirrors, default_mirrors, drop_in, mirror_name
from colabfast.opening.opener import _pack_options, open_dataset
from colabfast.where.env import MIRRORS_FOLDER

__all__ = [
    "open_dataset",
    "DROP_INS",
    "MIRRORS_FOLDER",
    "ACCEPTS",
    "what_is",
    "default_mirrors",
    "mirror_name",
    "drop_in",
    "NothingToOpen",
    "OpenRefused",
    "default_dataset_mirrors",
]  # noqa: F822 (DROP_INS: module __getattr__)

if TYPE_CHECKING:
    from colabfast.datasets.dropins import MirrorDataset


def _drop_ins() -> dict[str, tuple[type[MirrorDataset], Callable[[Optional[str]], dict]]]:
    """The layout a mirror records -> the dataset that reads it, and the function that makes its
    arguments from ``split``: each registered layout's ``drop_in`` and ``split_args``
    (:mod:`colabfast.layouts.registry`), and :class:`colabfast.H5Dataset` for a mirror of any dataset."""
    import colabfast.datasets  # noqa: F401 (registers the drop-ins)
    from colabfast.layouts import REGISTRY
    from colabfast.layouts.registry import ANY_DATASET, drop_in_of

    return {name: drop_in_of(name) for name in (*REGISTRY, ANY_DATASET)}


def __getattr__(name: str) -> Any:
    if name == "PACK_OPTIONS":  # from pack's signature, which imports the packing modules
        return _pack_options()
    if name == "DROP_INS":  # made when asked for (its classes import h5py and torchvision), from the registry
        return _drop_ins()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
