"""Reading a stranger's annotation files safely: size and nesting limits before parsing, a YAML's aliases
counted, annotated file names kept inside the source folder and stat'ed in parallel.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, TypeVar, Union

import numpy as np
import yaml

from colabfast.layouts.base import LayoutError, LayoutFileNotFoundError
from colabfast.where._fileio import FileEntry, PathLike, open_regular, retry

T = TypeVar("T")

# The largest annotation file (a COCO JSON, an image set list) read: COCO 2017's instances_train2017.json
# is 448 MB and takes about 8 GB of RAM once parsed; a larger file is refused before it is read.
MAX_ANNOTATION_BYTES = 512 << 20
MAX_XML_BYTES = 1 << 20  # one VOC XML (Pascal's are about 1 kB)
MAX_DEPTH = 64  # nesting of JSON arrays/objects or XML elements (COCO's JSON nests 5 deep, VOC's XML 4)
# Python spends 60 to 230 bytes on each parsed array or object: a JSON of empty arrays costs 24 times its
# size, a COCO file 7 times (it has one array or object per 30 to 100 bytes). Fewer bytes per container
# than this is refused before parsing (a few thousand containers allowed beyond it, for small files).
MIN_BYTES_PER_CONTAINER = 12
# The values (numbers, strings, arrays) in one entry of a top-level list: one image or annotation. COCO's
# have a few to a few thousand (a polygon's points, an RLE's counts); one entry is one sample's target,
# packed in one piece, so a larger one is refused before parsing.
MAX_ENTRY_VALUES = 1 << 20
MAX_YAML_BYTES = 1_000_000  # a dataset YAML (Ultralytics' are under 30 kB, ImageNet's 1000 names included)
# Nodes of a dataset YAML counted with every alias expanded, as walking or printing it would: a 1 MB
# YAML of 4 bytes a value holds as many; 9 levels of 9 aliases in 350 bytes would be 387 million.
MAX_YAML_NODES = MAX_YAML_BYTES // 4
MAX_LISTED = 1000  # problems listed one by one in a layout's ``skipped``; the rest are counted in one more
WORKERS = 32  # threads for per-file round trips (stat, read) on Drive


def read_limited(path: PathLike, limit: int, retries: int) -> bytes:
    """The bytes of the regular file ``path``, refused unread when it has more than ``limit`` bytes.

    Raises:
        LayoutFileNotFoundError: the file is missing (a ``FileNotFoundError`` too, as torchvision's).
        LayoutError: the file is larger than ``limit``, or not a regular file (a FIFO, a folder).
        OSError: it cannot be read (a transient error after ``retries`` retries, a permission).
    """

    def attempt() -> bytes:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise LayoutError(path, f"is {size} bytes, more than colabfast reads in one annotation "
                                  f"file ({limit} bytes)", fix="Split it, or check that it is the right file")
            data = f.read(limit + 1)  # it may have grown since fstat
            if len(data) > limit:
                raise LayoutError(path, f"is more than {limit} bytes, more than colabfast reads in one "
                                  "annotation file", fix="Split it, or check that it is the right file")
            return data

    try:
        return retry(attempt, retries)
    except FileNotFoundError as exc:
        raise LayoutFileNotFoundError(path, "is missing", fix="Check the path") from exc
    except OSError as exc:
        if exc.errno == errno.EINVAL and "not a regular file" in str(exc.strerror):
            raise LayoutError(path, str(exc.strerror)) from exc
        raise


def load_yaml(text: Union[str, bytes], path: PathLike) -> Any:
    """The dataset YAML ``text`` parsed as ``yaml.safe_load``, as Ultralytics' ``YAML.load`` does
    (``ultralytics/utils/__init__.py``), its nodes counted with aliases expanded (an alias bomb is refused).

    Raises:
        LayoutError: not UTF-8, not valid YAML, a refused tag (``!!python/object``), an alias inside its
            own anchor, more than ``MAX_DEPTH`` levels or ``MAX_YAML_NODES`` nodes; naming the line.
    """
    if isinstance(text, bytes):
        data = text
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise LayoutError(path, f"not UTF-8 text (byte {exc.start})", data[: exc.start].count(b"\n") + 1,
                              fix="save it as UTF-8, as Ultralytics reads it") from None
    loader = _CountingLoader(text, path)
    try:
        return loader.get_single_data()
    except LayoutError:
        raise
    except (yaml.YAMLError, ValueError, OverflowError) as exc:  # ValueError: an int of 5000 digits, a 13th month
        mark = getattr(exc, "problem_mark", None)
        raise LayoutError(path, f"not valid YAML ({str(getattr(exc, 'problem', None) or exc)[:200]})",
                          mark.line + 1 if mark is not None else None) from None
    finally:
        loader.dispose()


class _CountingLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` counting its nodes (aliases expanded) and depth as it composes, refusing past
    ``MAX_YAML_NODES`` or ``MAX_DEPTH`` and any recursive alias.
    """

    def __init__(self, text: str, path: PathLike) -> None:
        super().__init__(text)
        self.path, self.expanded, self.depth = path, 0, 0
        self.sizes: dict[str, int] = {}  # anchor -> the nodes it stands for, once composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and event.anchor in self.anchors:  # else PyYAML refuses it
            if event.anchor not in self.sizes:
                self._refuse(event, f"the alias *{event.anchor} is inside its own anchor: a recursive document",
                             "write the values out")
            self._count(self.sizes[event.anchor], event)
            return super().compose_node(parent, index)
        before = self.expanded
        self._count(1, event)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            self._refuse(event, f"nests more than {MAX_DEPTH} levels deep", "a dataset YAML nests a few levels")
        node = super().compose_node(parent, index)
        self.depth -= 1
        anchor = getattr(event, "anchor", None)
        if anchor is not None:
            self.sizes[anchor] = self.expanded - before
        return node

    def _count(self, nodes: int, event: Any) -> None:
        self.expanded += nodes
        if self.expanded > MAX_YAML_NODES:
            self._refuse(event, f"holds more than {MAX_YAML_NODES} values with its aliases expanded (an alias bomb: "
                         "9 levels of 9 aliases in 350 bytes are 387 million)",
                         "write the values out; a dataset YAML holds names, folders and a few numbers")

    def _refuse(self, event: Any, why: str, fix: str) -> None:
        raise LayoutError(self.path, why, event.start_mark.line + 1, fix=fix)


@dataclasses.dataclass(frozen=True)
class JsonShape:
    """What :func:`json_shape` finds: nesting depth, container count, and the largest top-level entry's values."""

    depth: int
    containers: int
    largest_entry: int


def json_shape(data: bytes) -> JsonShape:
    """The :class:`JsonShape` of the JSON text ``data``, found without parsing it.

    Escapes are removed, so a bracket or comma is inside a string where an odd number of quotes precede
    it; all in C (``bytes.replace``, numpy): a fortieth of ``json.loads``'s time.
    """
    text = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    text = text.translate(None, _NOT_STRUCTURE)
    # in slices, so that numpy's arrays (about 20 bytes a character) stay a few MB, carrying from one
    # slice to the next: the quote parity, the depth, and the value count of the entry going on
    odd, depth, deepest, containers, current, biggest = 0, 0, 0, 0, 0, 0
    for at in range(0, len(text), _SLICE):
        chars = np.frombuffer(text, np.uint8, min(_SLICE, len(text) - at), at)
        quote = chars == ord('"')
        inside = ((np.cumsum(quote, dtype=np.uint8) + odd) & 1).astype(bool)  # a uint8 sum wraps: parity kept
        odd = int(inside[-1])
        steps = _STEPS[chars[~(inside | quote)]]  # what lies outside strings: brackets +1/-1, commas 0
        if not steps.size:
            continue
        depths = np.cumsum(steps, dtype=np.int64) + depth  # after each character
        depth = int(depths[-1])
        containers += int(np.count_nonzero(steps == 1))
        deepest = max(deepest, int(depths.max()))
        value = (depths >= 3) & (steps >= 0)  # a comma or an opening bracket inside an entry
        entry = np.cumsum(depths <= 2)  # each comma of a depth-2 container starts an entry; 0: the one going on
        counts = np.bincount(entry[value], minlength=int(entry[-1]) + 1)
        counts[0] += current
        current = int(counts[-1])
        biggest = max(biggest, int(counts.max()))
    return JsonShape(deepest, containers, biggest)


_SLICE = 1 << 20
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{},')
_STEPS = np.zeros(256, np.int8)
_STEPS[list(b"[{")], _STEPS[list(b"]}")] = 1, -1


def safe_rel(name: object) -> Union[str, None]:
    """``name`` from an annotation as a POSIX path inside the source folder, or None: not a string, empty,
    absolute, with ``..`` or a NUL, or hidden.
    """
    if not isinstance(name, str) or "\0" in name or name.startswith("/"):
        return None
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or any(p.startswith(".") for p in parts):
        return None
    return "/".join(parts)


def inside(root_real: str, path: str) -> bool:
    """True if ``path`` (resolved) is ``root_real`` or below it."""
    return path == root_real or path.startswith(root_real.rstrip(os.sep) + os.sep)


def stat_files(root: Path, rels: Iterable[str], retries: int) -> dict[str, Union[FileEntry, str]]:
    """Each of ``rels`` below ``root`` as a :class:`FileEntry`, or why not (``"is missing"``, ``"is not a
    regular file"``, ``"resolves outside ..."``, ``"cannot be looked up (...)"``); in ``WORKERS`` threads.
    """
    rels = list(dict.fromkeys(rels))
    root_real = os.path.realpath(root)

    def folder_ok(folder: str) -> bool:
        return inside(root_real, retry(lambda: os.path.realpath(root / folder), retries))

    def one(rel: str) -> Union[FileEntry, str]:
        path = root / rel
        try:
            st = retry(lambda: os.lstat(path), retries)
            if stat.S_ISLNK(st.st_mode):
                if not inside(root_real, retry(lambda: os.path.realpath(path), retries)):
                    return f"resolves outside {root}"
                st = retry(lambda: os.stat(path), retries)
        except FileNotFoundError:
            return "is missing"
        except NotADirectoryError:
            return "is missing (a folder on its way is a file)"
        except OSError as exc:  # what the name itself causes: a part over 255 bytes, a loop of links
            if exc.errno in (errno.ENAMETOOLONG, errno.ELOOP):
                return f"cannot be looked up ({os.strerror(exc.errno)})"
            raise
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        return FileEntry(rel, st.st_size, st.st_mtime_ns)

    with ThreadPoolExecutor(WORKERS, thread_name_prefix="colabfast-layout") as pool:
        folders = sorted({rel.rpartition("/")[0] for rel in rels} - {""})
        bad = {f for f, ok in zip(folders, pool.map(folder_ok, folders)) if not ok}
        found: dict[str, Union[FileEntry, str]] = {}
        todo = []
        for rel in rels:
            parts = rel.split("/")
            if any("/".join(parts[:k]) in bad for k in range(1, len(parts))):
                found[rel] = f"resolves outside {root} (through a symlinked folder)"
            else:
                todo.append(rel)
        found.update(zip(todo, pool.map(one, todo)))
    return found


def parallel(fn: Callable[[str], T], items: list[str]) -> list[T]:
    """``[fn(x) for x in items]`` in ``WORKERS`` threads (reads on Drive are round trips)."""
    with ThreadPoolExecutor(WORKERS, thread_name_prefix="colabfast-layout") as pool:
        return list(pool.map(fn, items))


class Skipped(list[tuple[str, str]]):
    """A layout's ``skipped``: at most ``MAX_LISTED`` ``(path, why)`` records, then one counting the rest."""

    more = 0

    def add(self, path: str, why: str) -> None:
        if len(self) < MAX_LISTED:
            self.append((path, why))
            return
        self.more += 1
        record = (path, f"... and {self.more} more problems (only the first {MAX_LISTED} are listed)")
        if self.more == 1:
            self.append(record)
        else:
            self[-1] = record


class Problems:
    """What a layout's constructor found wrong, raised at once (``on_error="raise"``) or listed in
    ``skipped`` (``on_error="skip"``)."""

    def __init__(self, on_error: str):
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.raising = on_error == "raise"
        self.skipped = Skipped()

    def add(self, path: str, why: str, line: Optional[int] = None, fix: str = "") -> None:
        if self.raising:
            raise LayoutError(path, why, line, fix or 'Fix or remove it, or pass on_error="skip" to leave it out')
        self.skipped.add(path, why if line is None else f"line {line}: {why}")
