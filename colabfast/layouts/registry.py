"""The layout registry: every source layout colabfast packs and opens, by name, in one place.

A layout is one class: a :class:`~colabfast.layouts.base.Layout` (a folder read as a map-style
dataset, packed into a mirror of columns) or an :class:`~colabfast.layouts.images.ImageLayout`
(packed into an image mirror). Its module registers it with :func:`register`, and everything that
needs a layout takes it from here: ``pack``'s and ``open_dataset``'s ``layout="auto"`` asks the
registered :class:`Layout` classes in registration order (:meth:`Layout.worth_asking`, then
:meth:`Layout.detect`), the drop-in a mirror opens as is its layout's ``drop_in``, ``split=`` goes
through its ``split_args``, and the ``colabfast`` command's ``--layout`` choices are the registered
names. A layout of your own is one module::

    from colabfast.layouts import Layout, register

    @register
    class Tiles(Layout):
        name = "tiles"
        ...

after which ``cf.pack(folder, dst, layout="tiles")`` packs it and ``cf.open_dataset`` opens its
mirror (as :class:`colabfast.H5Dataset`, unless ``drop_in`` names another class).
"""

from __future__ import annotations

import re
from typing import Callable, Optional, Union

from colabfast.layouts.base import Layout
from colabfast.layouts.images import FilesLayout, ImageFolderLayout, ImageLayout, KittiLayout

__all__ = ["REGISTRY", "LAYOUTS", "ANY_DATASET", "register", "unregister", "layout_class", "drop_in_of"]

AnyLayout = Union[type[Layout], type[ImageLayout]]

REGISTRY: dict[str, AnyLayout] = {}  # name -> class: every layout pack takes by name
LAYOUTS: dict[str, type[Layout]] = {}  # the layouts read as datasets (mirrors of columns), in the order "auto" asks
ANY_DATASET = "dataset"  # the layout a mirror of any map-style dataset records: it opens as H5Dataset
_NAME = re.compile(r"[a-z][a-z0-9-]{0,63}\Z")
_RESERVED = ("auto", ANY_DATASET, "imagenet-train", "imagenet-val", "kaggle-train", "kaggle-val")


def register(cls: AnyLayout) -> AnyLayout:
    """Register the layout class ``cls`` under ``cls.name`` (use as a class decorator); a layout of
    :class:`Layout` is asked by ``layout="auto"`` after those registered before it. Returns ``cls``.

    Raises:
        TypeError: ``cls`` is neither a :class:`Layout` nor an :class:`ImageLayout` subclass.
        ValueError: its name is not lowercase letters, digits and ``-`` (at most 64), is one colabfast
            keeps (``auto``, ``dataset``, an archive layout), or is another class's already.
    """
    if not (isinstance(cls, type) and issubclass(cls, (Layout, ImageLayout))):
        raise TypeError(f"register() takes a subclass of colabfast.layouts.Layout, not {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not _NAME.match(name) or name in _RESERVED:
        raise ValueError(f"{cls.__name__}.name must be lowercase letters, digits and '-' (at most 64), and not "
                         f"one of {', '.join(_RESERVED)}: it is {name!r}")
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


def layout_class(name: str) -> AnyLayout:
    """The registered class of layout ``name``.

    Raises:
        KeyError: no layout of that name is registered (the message lists those that are)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"no layout {name!r} is registered (registered: {', '.join(REGISTRY)})") from None


def drop_in_of(name: str) -> tuple[type, Callable[[Optional[str]], dict]]:
    """The class that reads a mirror of layout ``name`` (:class:`colabfast.H5Dataset` for
    :data:`ANY_DATASET`), and the function that makes its arguments from ``open_dataset``'s
    ``split`` (the layout's ``split_args``). Imports the class (torchvision, h5py).

    Raises:
        KeyError: no layout of that name is registered."""
    import colabfast

    cls = _AnyDataset if name == ANY_DATASET else layout_class(name)
    return getattr(colabfast, cls.drop_in) if isinstance(cls.drop_in, str) else cls.drop_in, cls.split_args


class _AnyDataset(Layout):
    """What a mirror of any map-style dataset opens as (not packed by name: pack(dataset) makes it)."""

    name = ANY_DATASET


for _cls in (ImageFolderLayout, FilesLayout, KittiLayout):
    register(_cls)
