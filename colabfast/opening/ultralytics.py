"""A YOLO export on Drive as a local ``data.yaml`` that Ultralytics trains from: :func:`ultralytics_data`.

Ultralytics reads a dataset as thousands of small files (an image and a label file per sample,
``ultralytics/data/dataset.py``), which is what a Drive mount is slowest at. :func:`ultralytics_data`
packs the export once per split into a mirror (:func:`colabfast.open_dataset`'s machinery: found
again by its fingerprint in the mirrors folder, so a new runtime packs nothing; a record of the export
kept beside the mirrors, :mod:`colabfast.opening.exportrecord`, lets it find them with no per-file
work on Drive), stages the mirror,
and writes it out as a YOLO tree on local disk with the dataset YAML's paths rewritten to it. Training
then reads local files only. This module writes files: it does not import Ultralytics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import os
import posixpath
import shutil
import time
import zipfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from colabfast.errors import ExportRefused, SourceNotFound, excerpt
from colabfast.where import env
from colabfast.where._fileio import PathLike, locked

__all__ = ["ultralytics_data", "ExportRefused", "SPLIT_KEYS", "TREE_FOLDER", "COMPLETE"]

# The keys of a dataset YAML that name image folders: Ultralytics' check_det_dataset
# (ultralytics/data/utils.py) resolves "train", "val", "test" and "minival" (and renames "validation" to "val").
SPLIT_KEYS = ("train", "val", "validation", "test", "minival")
TREE_FOLDER = "ultralytics"  # under colabfast.where.env.work_dir(): the local YOLO trees
COMPLETE = ".colabfast-complete"  # the marker file of a tree written whole
WRITER = 1  # the version of what is written: a change makes new trees, not reuses old ones
YAML_NAMES = ("data.yaml", "data.yml")
CALL = "colabfast.ultralytics_data"


@dataclasses.dataclass
class _Export:
    """A YOLO export, folder or zip: what :func:`colabfast.open_dataset` is given (``src``), its
    dataset YAML (``doc``, at ``yaml_rel``), and whether a folder path (POSIX, relative to the
    layout's root) is in it."""

    src: Path
    kind: str  # "folder" or "archive"
    yaml_rel: str
    doc: dict
    members: Optional[list[str]] = None  # an archive's file names, relative to the layout's root
    text: str = ""  # the YAML as read
    stamp: Optional[list[int]] = None  # the YAML's (a zip's) [size, mtime_ns], taken before it was read
    _splits: Optional[dict[str, str]] = None

    @property
    def stem(self) -> str:
        """The start of the tree's name: the folder's or the zip's name."""
        from colabfast.staging.extract import strip_archive_suffix

        return strip_archive_suffix(self.src.name) if self.kind == "archive" else self.src.name

    def holds(self, rel: str) -> bool:
        if self.members is None:
            return (self.src / rel).is_dir()
        return rel == "." or any(m.startswith(rel + "/") for m in self.members)

    def splits(self) -> dict[str, str]:
        """The export's splits, as :class:`colabfast.layouts.Yolo` finds them: name -> images folder
        (listed once)."""
        if self._splits is None:
            self._splits = self._listed_splits()
        return self._splits

    def _listed_splits(self) -> dict[str, str]:
        from colabfast.layouts.yolo import yolo_splits

        if self.members is not None:
            return yolo_splits(self.members)
        from colabfast.layouts._folder import first_file
        from colabfast.layouts.images import is_image

        found: dict[str, str] = {}
        with contextlib.suppress(OSError):  # Ultralytics' images/<split>/ (none in a Roboflow export)
            held = sorted((self.src / "images").iterdir())
            if any(p.is_file() and is_image(p.name) for p in held):
                found[""] = "images/"  # no split: all of images/
            else:
                found.update((p.name, f"images/{p.name}/") for p in held if p.is_dir() and not p.name.startswith("."))
        with contextlib.suppress(OSError):  # Roboflow's <split>/images/
            for p in sorted(self.src.iterdir()):
                if p.is_dir() and (p / "images").is_dir() and p.name != "images":
                    found.setdefault(p.name, f"{p.name}/images/")
        # a split folder without an image is no split (the layout finds none there): a few listings each
        return {name: where for name, where in found.items() if not name or first_file(self.src / where, is_image)}


def ultralytics_data(
    path: PathLike,
    split: Union[str, Sequence[str], None] = None,
    *,
    mirrors: Optional[PathLike] = None,
    to: str = "auto",
    relist: bool = False,
    progress: bool = True,
) -> Path:
    """The path of a ``data.yaml`` on local storage that ``ultralytics.YOLO(...).train(data=...)``
    trains from without reading Drive, made from a YOLO export (Ultralytics' or Roboflow's) on Drive.

    Each split is packed once into a mirror (as :func:`colabfast.open_dataset` packs it), staged, and
    written out as a YOLO tree on local disk whose YAML points at it; a later runtime checks the export
    against a small record beside the mirrors and packs only what changed. Training reads local files
    only. How it works (the record, what is noticed, the tree, what Ultralytics reads):
    [How opening works](../how-opening-works.md#ultralytics_data).

    Examples:
        >>> import colabfast as cf
        >>> drive = cf.mount()
        Mounted at /content/drive
        >>> data = cf.ultralytics_data(drive / "pets-yolo", progress=False)
        >>> print(data.read_text(), end="")  # the export's YAML, its paths on local disk
        path: .../ultralytics/pets-yolo-...
        train: images/train
        nc: 2
        names:
        - cat
        - dog
        >>> # from ultralytics import YOLO; YOLO("yolov8n.pt").train(data=str(data))

    Args:
        path: the export's ``data.yaml`` (or ``.yml``), its folder, or a ``.zip`` of it (Roboflow's
            "YOLOv5/v8/v11" download, Ultralytics' export).
        split: the YAML's split key(s) to write (``"train"``, ``["train", "val"]``); None: every split
            key the YAML names. Keys not asked for are removed from the written YAML.
        mirrors: the folder of the mirrors (:func:`colabfast.open_dataset`'s ``mirrors``).
        to: where each mirror is staged: ``"auto"``, ``"disk"`` or ``"ram"``, as :func:`colabfast.stage`.
            The tree itself is on local disk.
        relist: list the export (each file's size and time) instead of checking it against its record's
            names: notices a file rewritten under its name; what changed is packed again.
        progress: show progress bars and print what was done.

    Returns:
        pathlib.Path: the written ``data.yaml``: ``YOLO("yolov8n.pt").train(data=str(returned))``.

    Raises:
        ExportRefused: (a ``colabfast.Error`` and ``ValueError``) a YAML with no split key, a split key
            naming a folder outside the dataset, a list of folders or a ``.txt`` list of images, or a
            folder the export does not hold, or not ``images/<split>`` / ``<split>/images``; a ``split``
            the YAML does not name; an export of keypoints (``kpt_shape``: pose is not read yet); a folder
            or zip without a dataset YAML (a classification export: use :func:`colabfast.open_dataset`);
            a zip of another layout (COCO, VOC, ...) or an archive that is not a zip. Each is raised before
            anything is packed or written.
        LayoutError: (a ``colabfast.Error``) a YAML that is not UTF-8, not valid, uses tags
            ``yaml.safe_load`` refuses or expands past a bound through its aliases, as
            `colabfast.layouts.Yolo` refuses it; a label file the layout refuses.
        FileNotFoundError: nothing at ``path``.
        StageRefused: a ``to`` that is not ``"auto"``, ``"disk"`` or ``"ram"``.
        OSError, MirrorError, PackError, StageError: as :func:`colabfast.open_dataset` raises them.
    """
    said = _Account()  # from the call's start: its times add up to the call's
    if to not in ("auto", "disk", "ram"):
        from colabfast.errors import StageRefused

        raise StageRefused(f"to must be 'auto', 'disk' or 'ram', not {to!r}")
    given = Path(os.path.abspath(os.path.expanduser(path)))
    root = given.parent if given.suffix.lower() in (".yaml", ".yml") else given  # the export's folder or zip
    from colabfast.opening.exportrecord import record_path
    from colabfast.opening.mirrors import default_mirrors

    folder = Path(os.path.abspath(mirrors)) if mirrors is not None else default_mirrors(root)
    selection = split if split is None or isinstance(split, str) else list(split)
    record = record_path(folder, root, selection)
    for module in ("colabfast.opening.opener", "colabfast.packing", "colabfast.datasets"):  # torch, torchvision
        importlib.import_module(module)
    said.lap("imports")
    with _refusals_said(given, folder):
        data = None if relist else _by_record(record, given, folder, to, progress, said)
        if not relist:
            said.lap("the mirrors staged and the tree written (or found)" if data else "the record read")
        if data is None:
            data = _by_listing(given, split, folder, record, to, progress, said)
            said.lap("the export's record written")
    if progress:
        print(f"ultralytics_data: {'; '.join(said)}; train with data={str(data)!r} ({said.timed()})")
    return data


class _Account(list[str]):
    """What :func:`ultralytics_data` did (its lines) and where its time went: each part timed from the
    end of the one before, the first from the call's start, so that the parts add up to the call's time."""

    def __init__(self) -> None:
        super().__init__()
        self.start = self.last = time.perf_counter()
        self.times: list[tuple[str, float]] = []

    def lap(self, what: str) -> None:
        now = time.perf_counter()
        self.times.append((what, now - self.last))
        self.last = now

    def timed(self) -> str:
        """``"<total> s: <part> <s> s, ..., other <s> s"``."""
        self.lap("other")
        parts = ", ".join(f"{what} {seconds:.2f} s" for what, seconds in self.times)
        return f"{self.last - self.start:.2f} s: {parts}"


@contextlib.contextmanager
def _refusals_said(given: Path, folder: Path) -> Iterator[None]:
    """A staged copy that staging a mirror of ``folder`` would replace (one of a mirror of another mirrors
    folder, staged by :func:`colabfast.open_dataset`), refused in what :func:`ultralytics_data` takes."""
    from colabfast.errors import StageRefused

    try:
        yield
    except StageRefused as exc:
        target, source = getattr(exc, "target", None), getattr(exc, "staged_from", None)
        if target is None:
            raise
        use = (f"call {CALL}({str(given)!r}, mirrors={str(Path(source).parent)!r}) to use the mirrors staged from "
               "there, or " if source else "")
        whose = f"was staged from {source}" if source else "is a file colabfast did not stage"
        raise StageRefused(f"{target} {whose}: staging the mirror of {given} in {folder} would replace it, so "
                           f"nothing was written; {use}delete {target} (a new runtime has none)") from None


def _by_listing(given: Path, split: Union[str, Sequence[str], None], folder: Path, record: Path, to: str,
                progress: bool, said: _Account) -> Path:
    """:func:`ultralytics_data` the first time (or after a change): the export read and listed, each
    split's mirror found by its fingerprint or packed (:func:`colabfast.open_dataset`), the tree written,
    and the export's record written beside the mirrors."""
    from colabfast.packing.unpacked import read_once

    with read_once(given):  # a zip listed and extracted once for all its splits
        return _listed(given, split, folder, record, to, progress, said)


def _listed(given: Path, split: Union[str, Sequence[str], None], folder: Path, record: Path, to: str,
            progress: bool, said: _Account) -> Path:
    from colabfast.opening.exportrecord import stamps, write_record
    from colabfast.opening.opener import open_dataset

    export = _export(given)
    keys = _split_keys(export, split)  # YAML key -> the export's split ("" for images/ alone)
    splits = list(dict.fromkeys(keys.values()))
    found = stamps(export.src, export.kind, export.yaml_rel, [export.splits()[s] for s in splits])
    folder_ok = given == export.src or (export.yaml_rel in YAML_NAMES and not any(  # what the folder would name
        (export.src / other).exists() for other in YAML_NAMES if other != export.yaml_rel))
    said.lap(f"the export's YAML read and its {'zip' if export.kind == 'archive' else 'folders'} listed")
    datasets: dict[str, Any] = {}
    for name in splits:
        datasets[name] = open_dataset(export.src, split=name or None, mirrors=folder, to=to,
                                      progress=progress, output="bytes", layout="yolo")
        said.lap(f"split {name or 'all'} by open_dataset (listing/extraction/packing/staging as needed)")
    fingerprints = {name: _fingerprint(ds.path) for name, ds in datasets.items()}
    tree = _tree_path(export.stem, export.doc, keys, fingerprints)
    _written(tree, export.doc, str(export.src), keys, datasets.items(), said)
    said.lap("the tree written")
    mirrors = {}
    for name, ds in datasets.items():  # the staged copy has the mirror's name (colabfast.stage's default)
        size, head = ds.path.stat().st_size, ds.reader.index.header
        with contextlib.suppress(OSError):
            if (folder / ds.path.name).stat().st_size == size:
                mirrors[name] = {"name": ds.path.name, "fingerprint": fingerprints[name], "size": size,
                                 "source": head.source, "split": head.split}
    if len(mirrors) < len(datasets) or found.get(export.yaml_rel if export.kind == "folder" else "") != export.stamp:
        said.append("no record of the export kept (it changed while read, or a mirror is not in the mirrors folder): "
                    "the next runtime lists it again")
        return tree / "data.yaml"
    try:
        if write_record(record, export.src, export.kind, export.yaml_rel, folder_ok, export.text, keys, found,
                        mirrors):
            said.append(f"kept a record of the export in {record}: the next runtime checks the export against it "
                        "(no per-file work) and stages the mirrors it names")
    except OSError as exc:
        said.append(f"no record of the export kept ({exc.strerror or exc}): the next runtime lists it again")
    return tree / "data.yaml"


def _by_record(record: Path, given: Path, folder: Path, to: str, progress: bool, said: _Account) -> Optional[Path]:
    """:func:`ultralytics_data` from the export's record (:mod:`colabfast.opening.exportrecord`): the
    export checked against it (a stat of the YAML or zip, a listing of each folder; no file opened)
    while its mirrors are staged (a copy cancelled if the check fails), and the tree written, or found
    complete; None (``said`` says why) where the record is missing, says another export, the export
    changed, or a mirror it names is gone or not what it recorded."""
    import threading
    from concurrent.futures import ThreadPoolExecutor, as_completed

    from colabfast.errors import Error, MirrorError
    from colabfast.layouts.yolo import load_yaml
    from colabfast.opening.exportrecord import changed, read_record

    rec = read_record(record, given.parent if given.suffix.lower() in (".yaml", ".yml") else given)
    if rec is None or not (rec["yaml_rel"] == given.name if rec["src"] != str(given) else rec["folder_ok"]):
        return None  # none, or of the export's other YAML
    src = Path(rec["src"])
    try:
        doc = load_yaml(rec["yaml"], src / rec["yaml_rel"])
    except Error:
        doc = None
    if not isinstance(doc, dict):
        said.append(f"the export's record {record.name} holds no dataset YAML: listing the export")
        return None
    keys, mirrors = rec["keys"], rec["mirrors"]
    stem = _Export(src, rec["kind"], rec["yaml_rel"], doc).stem
    tree = _tree_path(stem, doc, keys, {name: m["fingerprint"] for name, m in mirrors.items()})
    complete = (tree / COMPLETE).is_file()  # written before in this runtime: nothing to stage
    cancel = threading.Event()
    with ThreadPoolExecutor(len(mirrors), thread_name_prefix="colabfast-yolo-stage") as pool:
        staging = {} if complete else {name: pool.submit(_staged_mirror, folder / m["name"], m, to, progress, cancel)
                                       for name, m in mirrors.items()}
        try:
            why = changed(src, rec["stamps"])
        except OSError as exc:
            why = f"{src} cannot be read ({exc.strerror or exc})"
        said.lap("the export checked against its record")
        if why is not None:
            cancel.set()  # the copies stop; waited for as the pool closes
            said.append(f"{why} since the export's record ({record.name}): listing it")
            return None
        listed = sum(k.endswith("/") for k in rec["stamps"])
        said.append(f"the export as its record says ({listed} folder{'s' * (listed != 1)} listed once, no file "
                    "of it opened: no per-file work on it)")
        if complete:
            said.append(f"found {tree}, written before in this runtime: nothing staged or written")
            return tree / "data.yaml"
        said.append(f"staged its mirrors {', '.join(m['name'] for m in mirrors.values())}")
        names = {future: name for name, future in staging.items()}
        try:  # each split written as soon as its mirror is staged, while the others still copy
            _written(tree, doc, rec["src"], keys, ((names[f], f.result()) for f in as_completed(names)), said)
        except (FileNotFoundError, MirrorError) as exc:
            cancel.set()
            said[-1] = f"{exc}: listing the export"
            return None
    return tree / "data.yaml"


def _staged_mirror(mirror: Path, m: dict, to: str, progress: bool, cancel: Any) -> Any:
    """The mirror the record names (``m``), staged (or where it is: local and ``to="auto"``) and
    opened (``output="bytes"``).

    Raises:
        FileNotFoundError: it is gone. MirrorError: not the mirror recorded (its fingerprint, source,
            split or layout). OSError: ``errno.ECANCELED`` once ``cancel`` is set, as
            :func:`colabfast.stage` raises it.
    """
    from concurrent.futures import ThreadPoolExecutor

    from colabfast.errors import MirrorError
    from colabfast.mirror.safety import trust
    from colabfast.opening.early import vetted_version
    from colabfast.opening.mirrors import drop_in
    from colabfast.staging.pipeline import stage
    from colabfast.where._fileio import file_version

    if to == "auto" and env.storage(mirror) in ("disk", "ram"):
        local = mirror
    else:  # the copy on Drive vetted while it is copied, as open_dataset's early staging does
        before = file_version(os.stat(mirror))
        with ThreadPoolExecutor(1, thread_name_prefix="colabfast-yolo-vet") as one:
            vetting = one.submit(vetted_version, mirror, before)
            local = stage(mirror, to=to, progress=progress, cancel=cancel)
            if vetting.result() is not None and file_version(os.stat(mirror)) == before:
                trust(local)  # the same bytes as the vetted copy on Drive
    ds = drop_in(local, output="bytes")
    head = ds.reader.index.header
    if (head.fingerprint, head.source, head.split, head.layout) != (m["fingerprint"], m["source"], m["split"], "yolo"):
        raise MirrorError(f"{mirror} is not the mirror the export's record names (another fingerprint, source or "
                          "split)")
    return ds


def _written(tree: Path, doc: dict, source: str, keys: dict[str, str], datasets: Iterable[tuple[str, Any]],
             said: _Account) -> None:
    """The tree at ``tree`` written from ``datasets`` (split name, mirror's dataset: taken as they come)
    unless it is complete already (said in ``said``)."""
    start = time.perf_counter()
    with locked(env.cache_dir() / "locks" / f"ultralytics-{tree.name}.lock", f"writing {tree}"):
        if (tree / COMPLETE).is_file():
            said.append(f"found {tree}, written before in this runtime: nothing written")
        else:
            count = _write_tree(tree, doc, source, keys, datasets)
            said.append(f"wrote {count} images and their labels to {tree} in {time.perf_counter() - start:.1f} s")


def _export(src: Path) -> _Export:
    """The export at ``src`` (a YAML, a folder, a zip), its YAML read and checked.

    Raises:
        ExportRefused, LayoutError, FileNotFoundError: see :func:`ultralytics_data`.
    """
    from colabfast.layouts._untrusted import MAX_YAML_BYTES, load_yaml
    from colabfast.opening.kinds import what_is
    from colabfast.staging.extract import archive_suffix

    if src.suffix.lower() in (".yaml", ".yml"):
        if not src.is_file():
            raise SourceNotFound(f"nothing to read: {src} does not exist")
        if not Path(os.path.realpath(src)).is_relative_to(os.path.realpath(src.parent)):
            raise ExportRefused(f"{src} is a link to {os.path.realpath(src)}, outside the export's folder: pass the "
                                f"export's own dataset YAML, {CALL}('<export folder>/data.yaml')")
        st = src.stat()
        if st.st_size > MAX_YAML_BYTES:
            raise ExportRefused(f"{src} has over {MAX_YAML_BYTES} bytes: not a dataset YAML")
        data = src.read_bytes()
        doc = load_yaml(data, src)  # a LayoutError where it is not UTF-8
        return _checked(_Export(src.parent, "folder", src.name, doc, text=data.decode("utf-8-sig"),
                                stamp=[st.st_size, st.st_mtime_ns]))
    kind = what_is(src)
    if kind == "folder":
        names = {p.name: p for p in src.iterdir() if p.is_file()}
        found = [n for n in YAML_NAMES if n in names] or sorted(
            n for n in names if n.lower().endswith((".yaml", ".yml")))
        if len(found) != 1:
            raise ExportRefused(_no_yaml(src, found))
        return _export(names[found[0]])
    if kind != "archive" or archive_suffix(src) != ".zip":
        what = "mirror" if kind == "mirror" else f"{archive_suffix(src)} archive"
        raise ExportRefused(f"{src} is a {what}, not a "
                            f"YOLO export's folder, data.yaml or .zip: unzip it and call {CALL}('<folder>/data.yaml')")
    from colabfast.packing.unpacked import archive_layout

    st = src.stat()
    with zipfile.ZipFile(src) as z:
        infos = {i.filename: i for i in z.infolist() if not i.is_dir()}
        names_all = list(infos)
        tops = {n.split("/", 1)[0] for n in names_all if not n.startswith(".")}
        prefix = f"{next(iter(tops))}/" if len(tops) == 1 and all(
            "/" in n for n in names_all if not n.startswith(".")) else ""
        members = [n[len(prefix):] for n in names_all if n.startswith(prefix)]
        found = [n for n in YAML_NAMES if n in members]
        layout = archive_layout(src, "auto")
        if layout != "yolo" or not found:
            what = f"a {layout} export" if layout else "no YOLO export"
            raise ExportRefused(f"{src} holds {what} (no {prefix}data.yaml beside labels/): {CALL} reads YOLO "
                                f"exports; call colabfast.open_dataset({str(src)!r}) for other layouts")
        info = infos[prefix + found[0]]
        if info.file_size > MAX_YAML_BYTES:
            raise ExportRefused(f"{src}'s {info.filename} has over {MAX_YAML_BYTES} bytes: not a dataset YAML")
        data = z.read(info)
    doc = load_yaml(data, src / info.filename)
    return _checked(_Export(src, "archive", found[0], doc, members, data.decode("utf-8-sig"),
                            [st.st_size, st.st_mtime_ns]))


def _no_yaml(src: Path, found: list[str]) -> str:
    if found:
        return (f"{src} holds several dataset YAMLs ({', '.join(found)}): pass the one to train from, "
                f"{CALL}('{src / found[0]}')")
    classify = any((src / s).is_dir() for s in ("train", "val", "valid")) and not any(
        (src / s / "images").is_dir() for s in ("train", "val", "valid"))
    if classify:
        return (f"{src} holds no data.yaml but split folders of class folders: a classification export, which "
                f"Ultralytics reads from the folder itself; {CALL} reads detection and segment exports: call "
                f"colabfast.open_dataset({str(src)!r}, split='train') for a fast dataset of it")
    return f"{src} holds no data.yaml (Ultralytics' dataset YAML): pass the folder of a YOLO export, or its data.yaml"


def _checked(export: _Export) -> _Export:
    """``export`` once its YAML is one this writes: a mapping, not of keypoints."""
    where = export.src / export.yaml_rel
    if not isinstance(export.doc, dict):
        raise ExportRefused(f"{where} is not a mapping of keys (names:, train:, val:): not a dataset YAML")
    if "kpt_shape" in export.doc:
        raise ExportRefused(f"{where} has kpt_shape: a pose (keypoints) export, which {CALL} does not write yet; "
                            f"call colabfast.open_dataset({str(export.src)!r}, split='train') to read its images")
    return export


def _split_keys(export: _Export, split: Union[str, Sequence[str], None]) -> dict[str, str]:
    """The YAML's split keys to write (``split``, or all it names) -> the export's split each names.

    Raises:
        ExportRefused: see :func:`ultralytics_data`.
    """
    doc, where = export.doc, export.src / export.yaml_rel
    named = [k for k in SPLIT_KEYS if doc.get(k)]
    if not named:
        raise ExportRefused(f"{where} names no split (train:, val:): add train: and val: with the images' folders, "
                            f"then call {CALL}({str(where)!r})")
    wanted = named if split is None else [split] if isinstance(split, str) else list(split)
    for key in wanted:
        if key not in named:
            raise ExportRefused(f"{where} has no {key}: split (it has {', '.join(named)}): call "
                                f"{CALL}({str(where)!r}, split={[k for k in wanted if k in named] or named!r})")
    base = posixpath.dirname(export.yaml_rel) or "."
    given = doc.get("path")
    if isinstance(given, str) and given and not posixpath.isabs(given):
        inside = posixpath.normpath(posixpath.join(base, given))
        if not inside.startswith("../") and inside != ".." and export.holds(inside):
            base = inside
    return {key: _split_of(export, key, doc[key], base, where) for key in wanted}


def _split_of(export: _Export, key: str, value: Any, base: str, where: Path) -> str:
    """The export's split that ``key: value`` names, resolved as Ultralytics' ``check_det_dataset``."""
    there = export.splits()
    held = ", ".join(f"{n or 'no split'} ({p})" for n, p in sorted(there.items())) or "no images/ folder"
    shown = excerpt(value)  # a value from the YAML, in at most 200 characters
    if not isinstance(value, str) or value.lower().endswith(".txt"):
        raise ExportRefused(f"{where}'s {key}: is {shown}, a list of image folders or files, which {CALL} does not "
                            f"read: name one folder (the export holds {held}), then call {CALL}({str(where)!r})")
    rel = posixpath.normpath(posixpath.join(base, value))
    if not export.holds(rel) and value.startswith("../"):  # Roboflow's ../train/images, as Ultralytics reads it
        rel = posixpath.normpath(posixpath.join(base, value[3:]))
    folder = excerpt(rel + "/")
    if posixpath.isabs(value) or rel == ".." or rel.startswith("../"):
        raise ExportRefused(f"{where}'s {key}: {shown} is outside the dataset folder {export.src}: {CALL} reads "
                            f"only the export (it holds {held}); name its folder relative to the YAML, e.g. "
                            f"{key}: images/{key}")
    if not export.holds(rel):
        raise ExportRefused(f"{where}'s {key}: {shown} names {folder}, which {export.src} does not hold (it holds "
                            f"{held}): fix the YAML, or call {CALL}({str(where)!r}, split=[...]) without {key!r}")
    parts = rel.split("/")
    name = "" if parts == ["images"] else parts[1] if len(parts) == 2 and parts[0] == "images" else \
        parts[0] if len(parts) == 2 and parts[1] == "images" else None
    if name is not None and name not in there:
        raise ExportRefused(f"{where}'s {key}: {shown} names {folder}, which holds no image (the export's splits: "
                            f"{held}): fix the YAML, or call {CALL}({str(where)!r}, split=[...]) without {key!r}")
    if name is None:
        raise ExportRefused(f"{where}'s {key}: {shown} names {folder}, not an images/<split> nor <split>/images "
                            f"folder of the export (it holds {held}); point {key}: at one of those")
    return name


def _fingerprint(mirror: Path) -> str:
    from colabfast.mirror.safety import read_h5

    return read_h5(mirror, lambda f: str(f.attrs.get("fingerprint", "")))


def _tree_path(stem: str, doc: Any, keys: dict[str, str], fingerprints: dict[str, str]) -> Path:
    """Where the tree of these mirrors (their fingerprints) and this YAML goes: one name per export
    version and options."""
    import yaml

    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)  # any keys (json sorts only str ones)
    key = json.dumps({"writer": WRITER, "yaml": text, "keys": keys, "mirrors": fingerprints}, sort_keys=True,
                     default=str)
    return env.work_dir() / TREE_FOLDER / f"{stem}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def _write_tree(tree: Path, export_doc: dict, source: str, keys: dict[str, str],
                datasets: Iterable[tuple[str, Any]]) -> int:
    """Write the tree in a temporary folder beside ``tree``, then rename it into place; the number of
    images written. A failure leaves nothing."""
    import yaml

    tmp = tree.with_name(f".{tree.name}.partial-{os.getpid()}")
    for stale in tree.parent.glob(f".{tree.name}.partial-*"):  # a killed runtime's (this one holds the lock)
        shutil.rmtree(stale, ignore_errors=True)
    try:
        count = 0
        for name, ds in datasets:
            count += _write_split(tmp, name or "all", ds)
        doc: dict = {"path": str(tree)}
        doc.update((k, v) for k, v in export_doc.items() if k != "path" and (k not in SPLIT_KEYS or k in keys))
        for key, name in keys.items():
            doc[key] = f"images/{name or 'all'}"
        (tmp / "data.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), "utf-8")
        (tmp / COMPLETE).write_text(json.dumps({"source": source, "images": count}) + "\n")
        if tree.exists():  # a tree without its marker: an interrupted write by an older colabfast
            shutil.rmtree(tree)
        os.rename(tmp, tree)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return count


WRITERS = 8  # threads writing files: creating a file is a round trip to the kernel, overlapped


def _write_split(tmp: Path, folder: str, ds: Any) -> int:
    """Write the mirror ``ds`` (an :class:`colabfast.H5Dataset` of layout yolo, ``output="bytes"``) as
    ``images/<folder>/`` and ``labels/<folder>/`` under ``tmp``: the mirror read in order, the files
    written by ``WRITERS`` threads."""
    from collections import deque
    from concurrent.futures import Future, ThreadPoolExecutor

    from colabfast.errors import MirrorError

    head = ds.reader.index.header
    source, split = head.source, head.split or ""
    made: set[str] = set()

    def write(below: str, raw: bytes, target: dict, path: str) -> None:
        image = tmp / "images" / folder / below
        image.write_bytes(raw)
        text = _label_text(raw, target, path)
        if text:  # img2label_paths' rule: images/ -> labels/, the extension -> .txt
            (tmp / "labels" / folder / (below.rsplit(".", 1)[0] + ".txt")).write_text(text, "utf-8")

    pending: deque[Future] = deque()
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="colabfast-yolo-write") as pool:
        try:
            for k, path in enumerate(ds.source_paths):
                rel = path[len(source) + 1:]
                below = _below_split(rel, split)
                if below is None or posixpath.normpath(below) != below or below.startswith(("../", "/")) \
                        or below == "..":
                    raise MirrorError(f"{ds.path} holds the image {rel!r}, not a file below the split's images "
                                      "folder: not a mirror colabfast wrote for a YOLO export")
                parent = posixpath.dirname(below)
                if parent not in made:
                    for top in ("images", "labels"):
                        (tmp / top / folder / parent).mkdir(parents=True, exist_ok=True)
                    made.add(parent)
                data, target = ds[k]
                pending.append(pool.submit(write, below, bytes(data.numpy()), target, path))
                while len(pending) > 4 * WRITERS:
                    pending.popleft().result()
            while pending:
                pending.popleft().result()
        finally:
            for f in pending:
                f.cancel()
    return len(ds)


def _below_split(rel: str, split: str) -> Optional[str]:
    """The path of the image ``rel`` (relative to the export) below its split's images folder."""
    for prefix in ((f"images/{split}/", f"{split}/images/") if split else ("images/",)):
        if rel.startswith(prefix):
            return rel[len(prefix):]
    return None


# float32 of Ultralytics' limits (verify_image_label): a value rounded past them would drop the image
LOW, HIGH = -0.01, 1.01


def _label_text(image: bytes, target: dict, where: str) -> str:
    """The YOLO label file of an image (its encoded bytes, upright) and its mirror's target: boxes
    ``x1 y1 x2 y2`` in pixels (or ``segments`` in pixels) normalised by the image's size; "" for none."""
    import numpy as np

    from colabfast.layouts.yolo import _upright_size

    labels = target["labels"].tolist()
    if not labels:
        return ""
    width, height = _upright_size(image, Path(where))  # from the header: a PNG is not decoded
    scale = np.array([width, height], np.float64)
    lines = []
    if "segments" in target:
        for cls, polygon in zip(labels, target["segments"]):
            points = np.clip(np.asarray(polygon, np.float64).reshape(-1, 2) / scale, LOW, HIGH)
            lines.append(" ".join([str(cls), *(f"{v:.9g}" for v in points.reshape(-1))]))
    else:
        boxes = target["boxes"].numpy().astype(np.float64).reshape(-1, 4) / np.tile(scale, 2)
        x1, y1, x2, y2 = boxes.T
        rows = np.clip(np.stack([(x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1], 1), LOW, HIGH)
        lines = [" ".join([str(cls), *(f"{v:.9g}" for v in row)]) for cls, row in zip(labels, rows)]
    return "\n".join(lines) + "\n"
