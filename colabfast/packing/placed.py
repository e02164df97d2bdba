"""Packing straight to the destination when the local disk is short: :func:`straight`.

Into a destination on another file system (Drive), a pack builds its parts and the mirror in the local
work folder and copies the mirror over at the end (:func:`~colabfast.packing.common._publish`): the
local disk must hold about the mirror. Where it cannot (`NotEnoughSpace`), :func:`straight` packs again
with the work folder beside the destination, ``.<name>.colabfast-pack`` (see
:func:`~colabfast.packing.common._work_dir`): parts, spools and the build, under its temporary name,
are all written there, verified there and renamed into place, so the local disk holds nothing that
grows with the dataset (:data:`BUDGET` bounds what it may hold); a killed run resumes from the parts
left there. What it costs against the local build: ``benchmarks/pack_straight.py``.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from colabfast.errors import NotEnoughSpace
from colabfast.packing.common import STRAIGHT, _work_dir
from colabfast.where import env

__all__: list[str] = []  # internal to colabfast.packing: nothing here is public

BUDGET = 1 << 20  # bytes of local disk a pack straight to its destination may use (its lock; nothing per sample)

T = TypeVar("T")


@contextlib.contextmanager
def at_destination() -> Iterator[None]:
    """Within the block, a pack's work folder is beside its destination, wherever that is."""
    token = STRAIGHT.set(True)
    try:
        yield
    finally:
        STRAIGHT.reset(token)


def straight(dst: Path, progress: bool, pack: Callable[[], T]) -> T:
    """``pack()``, and where it finds the local disk short for a destination ``dst`` on another file
    system, ``pack()`` again with its work at ``dst`` (its local work folder deleted first, freeing
    what it held for the loader's caches).

    Raises:
        NotEnoughSpace: the destination is short too, or ``dst`` is on the local disk already.
    """
    try:
        return pack()
    except NotEnoughSpace as exc:
        real = Path(dst).absolute().resolve()
        if STRAIGHT.get() or not env.is_fuse(real.parent):
            raise
        shutil.rmtree(_work_dir(real), ignore_errors=True)
        if progress:
            print(f"pack: {exc.strerror}: packing straight to {real.parent} instead (its parts and build beside "
                  "it, under temporary names)")
        with at_destination():
            return pack()
