"""A stand-in for ``google.colab.drive``, installed only inside a ``with`` block.

Notebooks written for Colab start with ``from google.colab import drive; drive.mount(...)``. Inside
``with colab_shim():`` that import gives a module whose ``mount`` and ``flush_and_unmount`` have
Colab's signatures, messages and errors and work on colabfast's local stand-in for Drive
(:func:`colabfast.drive.mounting.mount_standin`). It is never installed globally: other libraries take a
successful ``import google.colab`` as proof of running in Colab, so the shim lives in
``sys.modules`` only for the duration of the block, carries ``__colabfast_shim__ = True``, and
:func:`colabfast.where.env.in_colab` stays False under it.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import types
from typing import Iterator

from colabfast.drive import mounting as _drive
from colabfast.where import env

__all__ = ["colab_shim", "is_shim"]

MARK = "__colabfast_shim__"
_NAMES = ("google", "google.colab", "google.colab.drive")
_MISSING = object()


def mount(mountpoint, force_remount=False, timeout_ms=120000, readonly=False):
    """Mount your Google Drive at the specified mountpoint path (colabfast's local stand-in)."""
    return _drive.mount_standin(mountpoint, force_remount=force_remount, timeout_ms=timeout_ms, readonly=readonly)


def flush_and_unmount(timeout_ms=_drive.COLAB_FLUSH_TIMEOUT_MS):
    """Unmount Google Drive and flush any outstanding writes to it (colabfast's local stand-in)."""
    return _drive.flush_and_unmount_standin(timeout_ms)


def _module(name: str, doc: str, package: bool) -> types.ModuleType:
    module = types.ModuleType(name, doc)
    setattr(module, MARK, True)
    if package:
        module.__path__ = []  # a package, so the import system looks for submodules in sys.modules
    return module


def is_shim(module: types.ModuleType) -> bool:
    """True if ``module`` is one of this shim's modules, not Colab's."""
    return bool(getattr(module, MARK, False))


@contextlib.contextmanager
def colab_shim() -> Iterator[types.ModuleType]:
    """Make ``from google.colab import drive`` import colabfast's stand-in for the ``with`` block.

    The stand-in ``drive`` module has Colab's ``mount(mountpoint, force_remount=False,
    timeout_ms=120000, readonly=False)`` and ``flush_and_unmount(timeout_ms=86400000)``, printing and
    raising exactly what Colab's do (see :func:`colabfast.mount` for the stand-in itself). An existing
    ``google`` namespace package (protobuf, google-auth) is kept and only gains ``colab`` for the
    block; ``sys.modules`` is restored on exit, including a real ``google.colab`` imported before.

    Yields:
        The stand-in ``google.colab`` module (``.drive`` is the stand-in drive module).

    Raises:
        RuntimeError: on a real Colab runtime, where the real module must be used.
    """
    if env.in_colab():
        raise RuntimeError("colab_shim() is for running Colab notebooks elsewhere; this runtime is Colab")
    saved = {name: sys.modules.get(name) for name in _NAMES}
    google = saved["google"]
    if google is None:
        try:
            google = importlib.import_module("google")  # a real namespace package stays imported
        except ImportError:
            google = _module("google", "colabfast stand-in namespace for google.colab (not Colab)", True)
    old_colab = google.__dict__.get("colab", _MISSING)
    colab = _module("google.colab", "colabfast stand-in for google.colab (not Colab)", True)
    drive = _module("google.colab.drive", "colabfast stand-in for google.colab.drive (not Colab)", False)
    drive.mount, drive.flush_and_unmount = mount, flush_and_unmount
    drive.__all__ = ["flush_and_unmount", "mount"]
    colab.drive = drive
    google.colab = colab
    sys.modules.update({"google": google, "google.colab": colab, "google.colab.drive": drive})
    try:
        yield colab
    finally:
        if old_colab is _MISSING:
            del google.colab
        else:
            google.colab = old_colab
        for name, module in saved.items():
            if module is not None:
                sys.modules[name] = module
            elif name != "google" or is_shim(google):
                sys.modules.pop(name, None)
