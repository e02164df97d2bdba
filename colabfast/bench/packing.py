"""Pack throughput and mirror size per store mode: :func:`colabfast.pack` of an ImageNet-style tree of
real JPEGs (500x375, ImageNet's average) from local disk, as it is (``encoded``, ``raw``) and resized to
a 256 px short side at pack time (how ImageNet fits Colab's disk).

Each row reports images/s, MB/s of source JPEGs consumed, the mirror's size, and that size as a
multiple of the source's. The peers' own preparation times and sizes are in the epoch scenario.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

from colabfast import env
from colabfast.bench.timing import Result, measure
from colabfast.testing import data

IMAGE_SIZE = (500, 375)  # (width, height)
CLASSES = 10
# (store, image_size) per row: as stored, and pre-resized to a 256 px short side.
MODES: tuple[tuple[str, Optional[int]], ...] = (("encoded", None), ("raw", None), ("encoded", 256), ("raw", 256))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run(size: float = 1.0, repeats: int = 3, modes: Sequence[tuple[str, Optional[int]]] = MODES,
        workers: Optional[int] = None, work: Optional[Union[str, Path]] = None) -> list[Result]:
    """Measure :func:`colabfast.pack` per store mode; one scenario ``pack/500x375``.

    Args:
        size: scale: 1.0 is 2000 JPEGs of 500x375 (about 120 MB).
        repeats: packs per mode (median reported, with min and max); each starts from nothing.
        modes: ``(store, image_size)`` pairs, see :data:`MODES`.
        workers: pack's decoding processes (default: the CPU count).
        work: where to put the data (default: a temp folder).

    Returns:
        Rows with ``images/s``, ``MB/s`` (source bytes per second), ``mirror MB`` and ``x source``.
    """
    from colabfast.packing import pack

    workers = env.cpu_count() if workers is None else workers
    per_class = max(2, round(2000 * size / CLASSES))
    n = per_class * CLASSES
    scenario = f"pack/{IMAGE_SIZE[0]}x{IMAGE_SIZE[1]}"
    rows = []
    with tempfile.TemporaryDirectory(prefix="colabfast-bench-", dir=work) as tmp:
        tmp = Path(tmp)
        src = data.make_imagefolder(tmp / "imagefolder", classes=CLASSES, per_class=per_class, size=IMAGE_SIZE)
        source_bytes = _bytes(src)
        out = tmp / "out"
        dst = out / "mirror.h5"
        for store, image_size in modes:
            method = f"colabfast.pack store={store!r}" + (f", image_size={image_size}" if image_size else "")

            def once(store: str = store, image_size: Optional[int] = image_size) -> None:
                pack(src, dst, store=store, image_size=image_size, workers=workers, progress=False)

            med, low, high = measure(once, repeats, setup=lambda: shutil.rmtree(out, ignore_errors=True))
            mirror = dst.stat().st_size
            note = f"{n} JPEGs, {source_bytes / 1e6:.0f} MB"
            if image_size:
                note += f"; resized to a {image_size} px short side"
                note += ", re-encoded as JPEG q90" if store == "encoded" else ""
            rows.append(Result(scenario, method, med, low, high, repeats, {
                "images/s": n / med, "MB/s": source_bytes / med / 1e6, "mirror MB": mirror / 1e6,
                "x source": mirror / source_bytes,
            }, note=note))
        shutil.rmtree(out, ignore_errors=True)
    return rows
