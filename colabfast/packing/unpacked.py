"""Packing an archive of a folder layout (a Roboflow or Ultralytics export zip, a VOCdevkit tar): the
archive is extracted safely to local disk (:func:`colabfast.staging.extract.extract`: nothing outside the
folder, no links), packed as the folder it holds, and the extraction deleted.

Unlike ImageNet's archives (:mod:`colabfast.packing.archives`) these are not read as a stream: a
layout's annotation file may come after its images in a tar, and an export is small beside the disk.
The mirror records the archive as its source, and a fingerprint of the archive itself (its name,
size and time, the layout and options), so a second run finds the finished mirror without
extracting anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Iterator, Optional

from colabfast.errors import SourceNotFound
from colabfast.packing.common import PackRefused, SplitRefused
from colabfast.staging.extract import archive_suffix, extract
from colabfast.where import env
from colabfast.where._fileio import PathLike, retry

__all__ = ["archive_layout", "check_split", "pack_unpacked", "read_once", "unpacked_fingerprint"]


def archive_layout(path: PathLike, layout: str) -> Optional[str]:
    """The :mod:`colabfast.layouts` layout the archive at ``path`` is packed as: ``layout`` when it is
    one, else for ``"auto"`` what a zip's member names show (read from its central directory: no data
    read); None for anything else (ImageNet's archives and archives of an ImageFolder tree)."""
    from colabfast.errors import ArchiveReadError
    from colabfast.layouts import LAYOUTS, detect_layout
    from colabfast.layouts.tree import tree_of

    if layout in LAYOUTS:
        return layout
    if layout != "auto" or archive_suffix(path) != ".zip":
        return None
    try:
        found = detect_layout(tree_of(path))
    except (OSError, ArchiveReadError):
        return None  # packing it as an archive stream says what is wrong
    return found.name if found.packed == "columns" else None


def check_split(path: PathLike, layout: str, labels: Optional[PathLike], split: Optional[str]) -> None:
    """Refuse, from a zip's listing (its central directory: no member read, nothing extracted), a
    ``split`` the export does not hold, or ``split=None`` where it holds several: what packing would
    find only once the archive is extracted. A tar is listed only by reading it whole: it is not checked
    here, nor is VOC's image set (the layout checks both once extracted).

    Raises:
        SplitRefused: listing the export's splits and the call to make.
    """
    from colabfast.errors import ArchiveReadError
    from colabfast.layouts.tree import tree_of
    from colabfast.staging.extract import UnsafeArchiveError

    if archive_suffix(path) != ".zip" or labels is not None:
        return
    try:
        names = [n for n in getattr(tree_of(path), "names", []) if n and not n.endswith("/")]
    except (OSError, ArchiveReadError, UnsafeArchiveError):
        return  # extracting it says what is wrong
    found = _listed_splits(names, layout, split)
    if found and (split is None and len(found) > 1 or split is not None and split not in found):
        raise SplitRefused(path, found, split)


def _listed_splits(names: list[str], layout: str, split: Optional[str]) -> Optional[dict[str, str]]:
    """The splits an export's member ``names`` show (name -> where, inside the archive), read as
    :func:`_open` reads the extracted folder; None where there is no split to choose (the layout's
    files at the top) or the listing does not say."""
    tops = {n.split("/", 1)[0] for n in names if not n.startswith(".")}
    prefix = f"{next(iter(tops))}/" if len(tops) == 1 and all("/" in n for n in names if not n.startswith(".")) else ""
    rels = [n[len(prefix):] for n in names if n.startswith(prefix)]
    found: dict[str, str] = {}
    if layout == "yolo":
        from colabfast.layouts.yolo import yolo_splits

        found = yolo_splits(rels)
        if "" in found:  # images/ of no split: the layout refuses a split= itself
            return None
    elif layout == "coco":
        from colabfast.layouts.coco import ROBOFLOW_JSON

        if ROBOFLOW_JSON in rels:
            return None
        found = {r.split("/")[0]: r.split("/")[0] + "/" for r in rels if r.count("/") == 1
                 and r.endswith(f"/{ROBOFLOW_JSON}")}
    elif layout in ("segmentation", "csv") and split is not None:
        found = {r.split("/")[0]: r.split("/")[0] + "/" for r in rels if "/" in r and not r.startswith(".")}
    return {name: prefix + where for name, where in found.items()} or None


_KEPT: dict[Optional[tuple], list] = {}  # read_once's zips: (path, size, mtime_ns) -> [folder, extracted]


@contextlib.contextmanager
def read_once(path: PathLike) -> Iterator[None]:
    """Within the block, the zip at ``path`` is listed once and extracted at most once, however many of its
    splits are packed (:func:`colabfast.ultralytics_data` packs each); the extraction is removed at the
    block's end. Anything but a zip: nothing done."""
    from colabfast.layouts.tree import LISTED, zip_key

    key = zip_key(path) if archive_suffix(path) == ".zip" else None
    if key is None or key in _KEPT:
        yield
        return
    tag = hashlib.sha1(os.fsencode(key[0])).hexdigest()[:10]
    folder = env.work_dir() / "unpacked" / f"{Path(key[0]).stem}-{tag}-{os.getpid()}"
    _KEPT[key], LISTED[key] = [folder, False], None
    try:
        yield
    finally:
        del _KEPT[key]
        LISTED.pop(key, None)
        shutil.rmtree(folder, ignore_errors=True)


def unpacked_fingerprint(path: PathLike, layout: str, labels: Optional[PathLike], split: Optional[str],
                         options: dict, retries: int = 5, year: Optional[str] = None) -> str:
    """What a mirror of the archive at ``path`` records and is found by: the archive's name, size and
    modification time, the layout, ``labels``, ``split``, VOC's ``year`` and the options."""
    st = retry(lambda: os.stat(path), retries)
    key = {"archive": os.path.basename(os.fspath(path)), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
           "layout": layout, "labels": None if labels is None else os.fspath(labels), "split": split, **options}
    if year is not None:  # absent otherwise: the mirrors packed before year= existed keep their fingerprint
        key["year"] = year
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def pack_unpacked(src: PathLike, dst: PathLike, *, layout: str, labels: Optional[PathLike], split: Optional[str],
                  options: dict, workers: int, on_error: str, progress: bool, overwrite: bool, retries: int,
                  fields: Optional[dict], year: Optional[str] = None) -> Path:
    """:func:`colabfast.pack` for an archive of the folder layout ``layout``: ``labels`` (a COCO JSON or
    a CSV table) is a path inside the archive; ``split`` picks, in an export holding ``train/``,
    ``valid/`` and ``test/`` folders, the one to pack (for VOC, the image set); ``year`` VOC's year.
    Returns ``dst`` as given.

    A failure removes the extraction (and a zip's split is checked before anything is extracted).

    Raises:
        what :func:`colabfast.pack` and :func:`colabfast.staging.extract.extract` raise; ``FileNotFoundError``
        when the archive does not hold what the layout reads; :class:`SplitRefused` (a ``PackRefused``)
        for a ``split`` it lacks, or none where it holds several.
    """
    from colabfast.layouts import LAYOUTS
    from colabfast.layouts.tree import zip_key
    from colabfast.packing.common import is_complete, printable
    from colabfast.packing.dataset import pack_columns

    archive = Path(os.path.abspath(src))
    check_split(archive, layout, labels, split)  # before anything is written
    fingerprint = unpacked_fingerprint(archive, layout, labels, split, options, retries, year)
    real = Path(os.path.realpath(os.path.abspath(dst)))
    if not overwrite and is_complete(real, fingerprint):  # found before extracting anything
        if progress:
            print(f"pack: {real} is already a complete mirror of {archive} with these options")
        return Path(os.path.abspath(dst))
    tag = hashlib.sha1(os.fsencode(real)).hexdigest()[:10]
    kept = _KEPT.get(zip_key(archive)) if _KEPT else None  # read_once's: extracted once for every split
    folder = kept[0] if kept else env.work_dir() / "unpacked" / f"{real.stem}-{tag}"
    if progress and not (kept and kept[1]):
        print(f"pack: extracting {archive} to {folder} (a {layout} layout is packed from its folder)")
    try:
        if not (kept and kept[1]):
            extract(archive, folder, retries=retries)  # resumes: entries already extracted are skipped
            if kept:
                kept[1] = True
        if layout not in LAYOUTS:  # an image layout that does not stream (KITTI, plain files): its folder's
            from colabfast.packing.folders import pack_folder

            root = _top(folder) / (split or "")
            done = pack_folder(root, dst, options=options, workers=workers, on_error=on_error, progress=progress,
                               overwrite=overwrite, layout=layout, shuffle=False, seed=0, retries=retries,
                               recorded=(fingerprint, archive))
            if not kept:
                shutil.rmtree(folder, ignore_errors=True)
            return done
        dataset = _open(folder, layout, labels, split, on_error, retries, archive, year)
        done = pack_columns(dataset, dst, options=options, workers=workers, on_error=on_error, progress=progress,
                            overwrite=overwrite, layout=layout, fields=fields, source=printable(str(archive)),
                            fingerprint=fingerprint, split=split)
    except Exception:
        # A failure leaves no extraction behind (an export is quick to extract again); an interrupted
        # run (Ctrl-C, a killed runtime) keeps it, and the next run's extract() resumes it.
        shutil.rmtree(folder, ignore_errors=True)
        if kept:
            kept[1] = False
        raise
    if not kept:
        shutil.rmtree(folder, ignore_errors=True)
    return done


def _top(folder: Path) -> Path:
    """The extracted ``folder``, or the one folder at its top (``zip -r ds.zip ds``)."""
    entries = [p for p in folder.iterdir() if not p.name.startswith(".") and p.name != "__MACOSX"]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else folder


def _open(folder: Path, layout: str, labels: Optional[PathLike], split: Optional[str], on_error: str, retries: int,
          archive: Path, year: Optional[str] = None) -> Any:
    """The layout over the extracted ``folder``: its root the folder (or its one top-level folder),
    or for an export of several splits (``train/``, ``valid/``, ``test/``) the folder ``split``."""
    from colabfast.layouts import LAYOUTS

    root = _top(folder)
    kwargs: dict[str, Any] = {"on_error": on_error, "retries": retries}
    if year is not None:
        kwargs["year"] = year
    if LAYOUTS[layout].packs_split:
        if split is not None:
            kwargs["split"] = split
    elif split is not None:  # an export's split folder (its only folder: then the one at the top)
        if (root / split).is_dir():
            root = root / split
        elif root.name != split:
            held = {p.name: f"{p.name}/" for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
            if held:
                raise SplitRefused(archive, held, split)
            raise SourceNotFound(f"{archive} holds no folder {split!r} (split=) at its top, and no folder at all")
    elif layout == "coco" and labels is None and not (root / "_annotations.coco.json").is_file():
        splits = {p.name: f"{p.name}/" for p in root.iterdir() if (p / "_annotations.coco.json").is_file()}
        if len(splits) > 1:
            raise SplitRefused(archive, splits, split)
        if not splits:
            raise SourceNotFound(f"{archive} holds no _annotations.coco.json: pass labels= the annotation JSON "
                                 "inside it")
        root = root / next(iter(splits))
    if labels is not None:
        inside = Path(os.path.normpath(os.fspath(labels)))
        if inside.is_absolute() or inside.parts[:1] == ("..",):
            raise PackRefused(f"labels={labels!r}: for an archive, the path of the annotation file inside it")
        kwargs["labels"] = folder / inside if (folder / inside).exists() else root / inside
    return LAYOUTS[layout](root, **kwargs)  # type: ignore[call-arg]
