"""Packing straight to the destination when the local disk is short: :func:`tries`.

Into a destination on another file system (Drive), a pack builds its parts and the mirror in the local
work folder and copies the mirror over at the end (:func:`~colabfast.packing.common.publish`): the
local disk must hold about the mirror. Where it cannot (`NotEnoughSpace`), :func:`tries` packs again
with the work folder beside the destination, ``.<name>.colabfast-pack`` (see
:func:`~colabfast.packing.common.pack_work_dir`): parts, spools and the build, under its temporary name,
are all written there, verified there and renamed into place, so the local disk holds nothing that
grows with the dataset (:data:`BUDGET` bounds what it may hold); a killed run resumes from the parts
left there. What it costs against the local build: ``benchmarks/pack_straight.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, Iterator

from colabfast.errors import NotEnoughSpace
from colabfast.packing.common import STRAIGHT, pack_work_dir
from colabfast.where import env
from colabfast.where._fileio import PathLike

__all__: list[str] = []  # internal to colabfast.packing: nothing here is public

BUDGET = 1 << 20  # bytes of local disk a pack straight to its destination may use (its lock; nothing per sample)


@contextlib.contextmanager
def at_destination() -> Iterator[None]:
    """Within the block, a pack's work folder is beside its destination, wherever that is."""
    token = STRAIGHT.set(True)
    try:
        yield
    finally:
        STRAIGHT.reset(token)


def tries(dst: PathLike, progress: bool) -> Iterator[contextlib.AbstractContextManager]:
    """The attempts at a pack into ``dst``, each run as ``with attempt:``: the first as asked, and where
    it finds the local disk short for a destination on another file system, a second with its work at
    ``dst`` (:func:`at_destination`; the local work folder deleted first, freeing what it held for the
    loader's caches). A `NotEnoughSpace` of the last attempt, or for ``dst`` on the local disk, is raised."""
    first = _Short(Path(os.path.realpath(os.path.abspath(dst))), progress)
    yield first
    if first.short:
        yield at_destination()


class _Short(contextlib.AbstractContextManager):
    """Ends a pack that found the local disk short where packing straight to ``dst`` would not need it."""

    def __init__(self, dst: Path, progress: bool) -> None:
        self.dst, self.progress, self.short = dst, progress, False

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> bool:
        if not isinstance(exc, NotEnoughSpace) or STRAIGHT.get() or not env.is_fuse(self.dst.parent):
            return False
        shutil.rmtree(pack_work_dir(self.dst), ignore_errors=True)
        if self.progress:
            print(f"pack: {exc.strerror}: packing straight to {self.dst.parent} instead (its parts and build "
                  "beside it, under temporary names)")
        self.short = True
        return True
