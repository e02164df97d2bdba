"""The record :func:`colabfast.ultralytics_data` keeps of a YOLO export beside its mirrors, which lets a
later runtime find the mirrors without listing the export's files one by one on Drive.

Finding a mirror by its fingerprint (:func:`colabfast.open_dataset`) lists the source with each file's
size and time, and lists it again to detect its layout and splits: for a YOLO export on Drive, the
most of what a later runtime did there. The record says what the export was when its mirrors were
found or packed, in checks that open none of the export's files and stat none but the YAML:

- a zip export: the zip's size and modification time (ns);
- a folder export: its dataset YAML's size and time, and the names in each folder its splits' images
  and labels are in (``images/train/`` and its subfolders, ``labels/train/``, ...), as one listing of
  each folder gives them (a SHA-256 of the sorted names, a folder's name ending in ``/``), and of the
  export's own folder (where its YAML is).

A folder's modification time would save those listings, but Drive does not change a folder's time
when a file is added to it or removed (rclone/rclone#1460, plexdrive/plexdrive#361): the names are
what say that images were added. What the record misses, for a folder export: a file whose bytes
are rewritten under the same name (``relist=True`` lists the export as :func:`colabfast.open_dataset`
does and notices any change of a file's size or time).

It holds the YAML's text, which split each YAML key names, and each split's mirror (its file name in
the mirrors folder, fingerprint and size, and the source and split its header records).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional, Union

from colabfast.staging.extract import strip_archive_suffix
from colabfast.where._fileio import read_json, write_json_atomic

__all__: list[str] = []  # internal to colabfast.opening: nothing here is public

RECORD = 1  # the version of the record: another one is not read (the export is listed instead)
SUFFIX = ".json"
MAX_RECORD_BYTES = 2_000_000  # a record of an export of a few thousand folders is far less


def record_path(folder: Path, root: Path, split: Any) -> Path:
    """Where the record of the export at ``root`` (its folder or zip, absolute) called with ``split`` is
    kept: ``<folder>/<export's name>.yolo-<12 hex digits>.json``, one per export and split selection
    (the folder and its ``data.yaml`` share one)."""
    name = strip_archive_suffix(root.name)
    key = json.dumps([RECORD, str(root), split])
    return folder / f"{name}.yolo-{hashlib.sha256(key.encode()).hexdigest()[:12]}{SUFFIX}"


def label_folder(images: str) -> str:
    """The label folder of an images folder (POSIX, relative, with or without its last ``/``), by
    Ultralytics' ``img2label_paths``: the last ``images`` part replaced by ``labels``."""
    path = "/labels/".join(("/" + images.rstrip("/") + "/").rsplit("/images/", 1))
    return path.strip("/")


def _stamp(path: Path) -> Optional[list[int]]:
    """``[size, mtime_ns]`` of a file, None where nothing is.

    Raises:
        OSError: another error than nothing being there (Drive disconnected, ...).
    """
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return [st.st_size, st.st_mtime_ns]


def _listing(folder: Path) -> tuple[Optional[str], list[str]]:
    """One listing of ``folder``: the SHA-256 of its sorted names (a folder's ending in ``/``; the
    kind from the listing, no stat per entry) and its subfolders' names; ``(None, [])`` where it is gone.

    Raises:
        OSError: another error than the folder being gone.
    """
    try:
        with os.scandir(folder) as entries:
            names = sorted(e.name + "/" if e.is_dir(follow_symlinks=False) else e.name for e in entries)
    except (FileNotFoundError, NotADirectoryError):
        return None, []
    digest = hashlib.sha256("\n".join(names).encode("utf-8", "surrogateescape")).hexdigest()
    return digest, [n[:-1] for n in names if n.endswith("/")]


Stamp = Union[None, str, list[int]]


def stamps(root: Path, kind: str, yaml_rel: str, images: list[str]) -> dict[str, Stamp]:
    """What the record checks of the export at ``root`` (``kind`` ``"folder"`` or ``"archive"``),
    taken before it is listed, so that a change made meanwhile is a difference next time: for a zip
    its own stamp (key ``""``); for a folder the YAML's (key ``yaml_rel``) and the listing of each folder
    of ``images`` (the splits' image folders, relative to ``root``), of their label folders, and of
    every folder below them, and of ``root`` itself (where the YAML is: key ``"./"``; keys of listings
    end in ``/``).

    Raises:
        OSError: as ``os.stat`` and ``os.scandir`` raise it.
    """
    if kind == "archive":
        return {"": _stamp(root)}
    found: dict[str, Stamp] = {yaml_rel: _stamp(root / yaml_rel), "./": _listing(root)[0]}
    pending = list(dict.fromkeys(f for rel in images for f in (rel.rstrip("/"), label_folder(rel))))
    while pending:
        rel = pending.pop(0)
        digest, below = _listing(root / rel)
        found[rel + "/"] = digest
        pending.extend(f"{rel}/{name}" for name in below)
    return found


def changed(root: Path, recorded: dict[str, Stamp]) -> Optional[str]:
    """The first entry of ``recorded`` that differs now, in words; None when none does: a stat of the
    YAML (or the zip) and one listing of each recorded folder, at once (threads), nothing else.

    Raises:
        OSError: as ``os.stat`` and ``os.scandir`` raise it (Drive disconnected, ...).
    """
    from concurrent.futures import ThreadPoolExecutor

    def now(rel: str) -> Stamp:
        if rel.endswith("/"):
            return _listing(root if rel == "./" else root / rel[:-1])[0]
        return _stamp(root if rel == "" else root / rel)

    with ThreadPoolExecutor(min(LISTERS, len(recorded)) or 1, thread_name_prefix="colabfast-yolo-check") as pool:
        current = dict(zip(recorded, pool.map(now, recorded)))
    for rel, was in recorded.items():
        if current[rel] != was:
            what = "the zip" if rel == "" else "the export's folder" if rel == "./" else rel
            state = "is gone" if current[rel] is None else "is new" if was is None else "changed"
            return f"{what} {state}" + (" (a file added, removed or renamed in it)" if rel.endswith("/") and
                                        was is not None and current[rel] is not None else "")
    return None


LISTERS = 16  # folders listed at once: each listing is a round trip to Drive


def read_record(path: Path, root: Path) -> Optional[dict]:
    """The record at ``path`` of the export at ``root``, or None: none there, unreadable, another version
    of the record, another export, or not a record as :func:`write_record` writes it."""
    try:
        if os.stat(path).st_size > MAX_RECORD_BYTES:
            return None
    except OSError:
        return None
    rec = read_json(path)
    if rec is None or rec.get("record") != RECORD or rec.get("export") != str(root):
        return None
    try:
        ok = (rec["kind"] in ("folder", "archive") and isinstance(rec["src"], str) and isinstance(rec["yaml"], str)
              and isinstance(rec["yaml_rel"], str) and isinstance(rec["folder_ok"], bool) and _names(rec["keys"])
              and _stamps_ok(rec["stamps"])
              and _mirrors_ok(rec["mirrors"]) and set(rec["keys"].values()) == set(rec["mirrors"]))
    except (KeyError, TypeError, AttributeError):
        return None
    return rec if ok else None


def _names(keys: Any) -> bool:
    """YAML key -> split name: each split a plain folder name ("" for images/ alone)."""
    return isinstance(keys, dict) and all(isinstance(k, str) and isinstance(v, str) and _split_name(v)
                                          for k, v in keys.items())


def _split_name(name: str) -> bool:
    return name == "" or (name not in (".", "..") and "/" not in name and "\\" not in name and "\0" not in name)


def _stamps_ok(found: Any) -> bool:
    return isinstance(found, dict) and all(
        isinstance(k, str) and (v is None or (isinstance(v, str) and k.endswith("/"))
                                or (isinstance(v, list) and len(v) == 2 and all(isinstance(x, int) for x in v)))
        and ".." not in k.split("/") and not k.startswith("/") for k, v in found.items())


def _mirrors_ok(mirrors: Any) -> bool:
    """Split -> {"name", "fingerprint", "size", "source", "split"} (the last two as the mirror's header
    records them): a name of a mirror file in the mirrors folder itself."""
    return isinstance(mirrors, dict) and all(
        isinstance(split, str) and isinstance(m, dict) and isinstance(m.get("name"), str)
        and m["name"].endswith(".h5") and not m["name"].startswith(".") and "/" not in m["name"]
        and "\\" not in m["name"] and "\0" not in m["name"] and isinstance(m.get("fingerprint"), str)
        and isinstance(m.get("size"), int) and isinstance(m.get("source"), str)
        and (m.get("split") is None or isinstance(m["split"], str)) for split, m in mirrors.items())


def write_record(path: Path, root: Path, kind: str, yaml_rel: str, folder_ok: bool, yaml_text: str,
                 keys: dict[str, str], found: dict[str, Stamp], mirrors: dict[str, dict[str, Any]]) -> bool:
    """Write the record at ``path`` (whole: a temporary name, then a rename) unless the one there says
    the same; whether it was written. ``folder_ok``: the export's folder, given instead of its YAML,
    names that YAML (the only one there by :func:`colabfast.ultralytics_data`'s rule).

    Raises:
        OSError: it cannot be written.
    """
    rec = {"record": RECORD, "export": str(root), "src": str(root), "kind": kind, "yaml_rel": yaml_rel,
           "folder_ok": folder_ok, "yaml": yaml_text, "keys": keys, "stamps": found, "mirrors": mirrors}
    old = read_record(path, root)
    if old is not None and {k: v for k, v in old.items() if k != "made"} == rec:
        return False
    rec["made"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write_json_atomic(path, rec)
    return True
