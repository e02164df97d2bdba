"""The layout registry: every source layout colabfast packs and opens, by name, in one place.

A layout is one class, a `colabfast.layouts.base.BaseLayout` of one of three kinds: a `Layout` (a
folder read as a map-style dataset, packed into a mirror of columns), an `ImageLayout` (a folder
listed into an image mirror: ImageFolder, KITTI, plain files) or an `ArchiveLayout` (an archive read
as one stream: ImageNet's and Kaggle's). Its module registers it with `register`, and everything that
needs a layout takes it from here: ``layout="auto"`` asks the registered classes
(`detect_layout`: mirrors of columns first, in registration order, then archives, then image
folders), the drop-in a mirror opens as is the one its layout names or the `colabfast.datasets`
stage registered for its kind (`drop_in_of`), ``split=`` goes through its ``split_args``, and the
``colabfast`` command's ``--layout`` choices are the registered names. A layout of your own is one
module::

    from colabfast.layouts import Layout, register

    @register
    class Tiles(Layout):
        name = "tiles"
        ...

after which ``cf.pack(folder, dst, layout="tiles")`` packs it and ``cf.open_dataset`` opens its
mirror (as `colabfast.H5Dataset`, unless its ``drop_in`` names another class).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Optional

from colabfast.layouts.base import BaseLayout, Layout
from colabfast.layouts.tree import tree_of
from colabfast.where._fileio import PathLike

__all__ = ["REGISTRY", "LAYOUTS", "ANY_DATASET", "KINDS", "register", "unregister", "layout_class", "detect_layout",
           "register_drop_in", "drop_in_of", "AnyDataset"]

REGISTRY: dict[str, type[BaseLayout]] = {}  # name -> class: every layout, in registration order
LAYOUTS: dict[str, type[Layout]] = {}  # the layouts read as datasets (mirrors of columns)
KINDS = ("columns", "stream", "images")  # what BaseLayout.packed may be, in the order "auto" asks them
ANY_DATASET = "dataset"  # the layout a mirror of any map-style dataset records: it opens as H5Dataset
DROP_INS: dict[str, type] = {}  # a layout's name, or a kind -> the dataset that reads its mirrors
NAME = re.compile(r"[a-z][a-z0-9-]{0,63}\Z")
RESERVED = ("auto", ANY_DATASET)


def register(cls: type[BaseLayout]) -> type[BaseLayout]:
    """Register the layout class ``cls`` under ``cls.name`` (use as a class decorator): ``layout="auto"``
    asks it after the layouts of its kind registered before it. Returns ``cls``.

    Raises:
        TypeError: ``cls`` is not a `BaseLayout` subclass of a known kind (``packed``).
        ValueError: its name is not lowercase letters, digits and ``-`` (at most 64), is one colabfast
            keeps (``auto``, ``dataset``), or is another class's already.
    """
    if not (isinstance(cls, type) and issubclass(cls, BaseLayout) and getattr(cls, "packed", None) in KINDS):
        raise TypeError(f"register() takes a subclass of colabfast.layouts.Layout, ImageLayout or ArchiveLayout, "
                        f"not {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not NAME.match(name) or name in RESERVED:
        raise ValueError(f"{cls.__name__}.name must be lowercase letters, digits and '-' (at most 64), and not "
                         f"one of {', '.join(RESERVED)}: it is {name!r}")
    if REGISTRY.get(name, cls) is not cls:
        raise ValueError(f"layout {name!r} is registered already ({REGISTRY[name].__qualname__}): "
                         "unregister it first, or give the new one another name")
    REGISTRY[name] = cls
    if issubclass(cls, Layout):
        LAYOUTS[name] = cls
    return cls


def unregister(name: str) -> None:
    """Forget the layout ``name`` (a layout registered for a test, or replaced by another class).

    Raises:
        KeyError: no layout of that name is registered."""
    del REGISTRY[name]
    LAYOUTS.pop(name, None)


def layout_class(name: str) -> type[BaseLayout]:
    """The registered class of layout ``name``.

    Raises:
        KeyError: no layout of that name is registered (the message lists those that are)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no layout {name!r} is registered (registered: {', '.join(REGISTRY)})") from None


def detect_layout(tree: Any, labels: Optional[PathLike] = None, split: Optional[str] = None) -> type[BaseLayout]:
    """The layout ``layout="auto"`` reads the source whose names are ``tree`` (a
    `colabfast.layouts.tree.Tree`) as: the first registered layout of columns whose ``labels_suffixes``
    end ``labels``; else the first that `BaseLayout.detect` says it is, asking mirrors of columns
    first (registration order), then archives, then image folders (``files`` last: any folder). A
    folder's or an archive's path may stand for its tree."""
    tree = tree_of(tree)
    if labels is not None:
        named = next((cls for cls in LAYOUTS.values()
                      if cls.labels_suffixes and str(labels).lower().endswith(cls.labels_suffixes)), None)
        if named is not None:
            return named
    for kind in KINDS:  # within a kind, a layout that reads any folder (ImageFolder, files) is asked last
        for cls in sorted(REGISTRY.values(), key=lambda c: getattr(c, "catch_all", False)):
            if cls.packed == kind and cls.detect(tree, labels=labels, split=split):
                return cls
    return REGISTRY["files"]


def register_drop_in(dataset: type, *names: str) -> type:
    """Register ``dataset`` as the class that reads mirrors of the layouts or kinds ``names`` (a layout's
    own ``drop_in`` comes first): how the `colabfast.datasets` stage names its drop-ins. Returns it."""
    for name in names:
        DROP_INS[name] = dataset
    return dataset


def drop_in_of(name: str) -> tuple[type, Callable[[Optional[str]], dict]]:
    """The class that reads a mirror of layout ``name`` (its ``drop_in``, else the one registered for
    it or for its kind: `colabfast.H5Dataset` for mirrors of columns and `ANY_DATASET`), and the
    function that makes its arguments from ``open_dataset``'s ``split`` (the layout's ``split_args``).

    Raises:
        KeyError: no layout of that name is registered.
        LookupError: no drop-in is registered for it (`colabfast.datasets` not imported)."""
    cls = AnyDataset if name == ANY_DATASET else layout_class(name)
    dataset = cls.drop_in or DROP_INS.get(name) or DROP_INS.get(cls.packed)
    if dataset is None:
        raise LookupError(f"no dataset reads mirrors of layout {name!r}: import colabfast.datasets first")
    return dataset, cls.split_args


class AnyDataset(Layout):
    """The layout a mirror of any map-style dataset records: not packed by name (``pack(dataset)`` makes
    it), opened as `colabfast.H5Dataset`."""

    name = ANY_DATASET
