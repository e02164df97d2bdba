"""Images labelled by a CSV table, as Kaggle competitions ship them (``train.csv`` beside ``train/``).

Named ``table``: a module ``csv.py`` shadows the standard library's. The table's rules (which file,
which column, how paths match, numbers or classes) are in
[Layouts and mirrors](../layouts.md#how-layouts-read-a-strangers-files).
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import os
from pathlib import Path
from typing import Any, Iterator, Optional, Union

from colabfast.layouts._folder import check_on_error, list_files, read_file, reject, stem
from colabfast.layouts._untrusted import Skipped, read_limited
from colabfast.layouts.base import ImageFile, Layout, LayoutError
from colabfast.layouts.images import IMG_EXTENSIONS, is_image
from colabfast.layouts.registry import register
from colabfast.layouts.tree import tree_of
from colabfast.where._fileio import FileEntry, PathLike, human_bytes, retry

__all__ = ["Csv", "PATH_COLUMNS", "MAX_TABLE_BYTES"]

PATH_COLUMNS = ("path", "file", "filename", "file_name", "image", "image_id", "id", "fname", "name")
MAX_TABLE_BYTES = 256_000_000  # refused before parsing: Python holds a parsed table in ~10x its size
MAX_LINE_CHARS = 1 << 20  # one line (a row of labels is far less; csv's own limit is 128 kB a field)
DELIMITERS = ",\t;|"  # in the order of preference where several split the table alike (csv.Sniffer's)
SNIFF_LINES = 20  # the lines the delimiter is found from
Label = Union[int, float]


@register
class Csv(Layout):
    """Images under ``root`` labelled by a CSV table, as a map-style dataset in the table's row order.

    ``table[i]`` is ``(ImageFile, target)``: the label (an ``int`` class index or number, or a ``float``),
    or a tuple of them, one per label column.

    Args:
        root: the folder the table's paths are relative to.
        labels: the CSV file (comma, semicolon, tab or ``|`` separated, UTF-8); None: found at ``root``'s top.
        on_error: ``"raise"``: a bad row raises :class:`LayoutError`; ``"skip"``: the row is left out
            and listed in ``skipped`` (as ``(table, "line N: why")``).
        retries: retries of each file read on Drive's transient errors.

    Raises:
        LayoutError: the table is over ``MAX_TABLE_BYTES``, not UTF-8 CSV, has no label column, or
            (``on_error="raise"``) a row with the wrong number of fields, an empty label, a NaN or
            infinite number, a path that is absolute, has ``..`` or names no single image, names a FIFO,
            a device or a symlink leading out of ``root``, or the same image as an earlier row; each names
            the table and line. Also a table that is not a regular file or has a line over ``MAX_LINE_CHARS``.
        FileNotFoundError: ``root`` or the table does not exist.
    """

    name = "csv"
    labels_suffixes = (".csv",)

    def __init__(self, root: PathLike, labels: Optional[PathLike] = None, *, on_error: str = "raise",
                 retries: int = 5):
        check_on_error(on_error)
        self.root, self.on_error, self.retries = Path(root), on_error, retries
        self.skipped: Skipped = Skipped()
        files, refused = list_files(self.root, retries)
        self.guesses: list[str] = []  # what was chosen by a rule of thumb, for describe()
        if labels is not None:
            self.table = Path(labels)
        else:
            self.table, guess = _find_table(self.root, [*files, *map(_unlisted, refused)])
            self.guesses += [guess] if guess else []
        header, rows = self._read_table()
        self.path_column = _path_column(header)
        if header[self.path_column].lower() not in PATH_COLUMNS:
            self.guesses.append(f"paths taken from the first column, {header[0]!r} (no column is named "
                                f"{', '.join(PATH_COLUMNS)})")
        columns = [c for k, c in enumerate(header) if k != self.path_column]
        if not columns:
            raise LayoutError(self.table, f"one column ({header[0]!r}), no label column",
                              fix="add a column of labels")
        finder = _Finder(files, refused, self.root)
        chosen: list[tuple[int, FileEntry, list[str]]] = []
        first_row: dict[str, int] = {}  # an image's path -> the line that named it
        for line, row in rows:
            try:
                entry = finder.find(row[self.path_column].strip(), self.table, line)
                if entry.rel in first_row:
                    raise LayoutError(self.table, f"{row[self.path_column]!r} names {entry.rel}, as line "
                                      f"{first_row[entry.rel]} does", line, fix="keep one row per image")
                values = [v.strip() for k, v in enumerate(row) if k != self.path_column]
                for column, v in zip(columns, values):
                    if not v or not _finite(v):
                        raise LayoutError(self.table, f"column {column!r} has " + (
                            f"{v!r}, not a finite number" if v else "no value"), line, fix="fix or delete the row")
            except LayoutError as exc:
                reject(exc, on_error, self.skipped)
                continue
            first_row[entry.rel] = line
            chosen.append((line, entry, values))
        self.paths = [entry.rel for _, entry, _ in chosen]
        classes: dict[str, list[str]] = {}
        by_column = []
        for k, column in enumerate(columns):
            numbers, names = self._column([values[k] for _, _, values in chosen])
            if names is not None:
                classes[column] = names
            by_column.append(numbers)
        self.targets: list[tuple[Label, ...]] = list(zip(*by_column))
        self.files = sorted({entry for _, entry, _ in chosen} | {self._table_entry()})
        self.info: dict[str, Any] = {"columns": columns, "classes": classes}

    def _read_table(self) -> tuple[list[str], list[tuple[int, list[str]]]]:
        """The header and each non-empty row's ``(line, fields)``. Raises LayoutError as the class says."""
        size = retry(lambda: os.stat(self.table), self.retries).st_size
        if size > MAX_TABLE_BYTES:
            raise LayoutError(self.table, f"{human_bytes(size)}, over the limit of {human_bytes(MAX_TABLE_BYTES)}",
                              fix="split the table, or raise colabfast.layouts.table.MAX_TABLE_BYTES")
        data = read_limited(self.table, MAX_TABLE_BYTES, self.retries)  # a FIFO or a device is refused, unread
        try:
            data.decode("utf-8-sig")  # Excel writes a BOM; checked whole for the line of a bad byte, then dropped
        except UnicodeDecodeError as exc:
            raise LayoutError(self.table, f"not UTF-8 text (byte {exc.start})",
                              data[: exc.start].count(b"\n") + 1, fix="save the table as UTF-8 CSV") from None
        lines = self._lines(data)
        head = list(itertools.islice(lines, SNIFF_LINES))
        reader = csv.reader(itertools.chain(head, lines), delimiter=_delimiter(head), strict=True)
        rows: list[tuple[int, list[str]]] = []
        header: Optional[list[str]] = None
        try:
            for row in reader:
                if not any(field.strip() for field in row):
                    continue
                if header is None:
                    header = [field.strip() for field in row]
                elif len(row) != len(header):
                    reject(LayoutError(self.table, f"{len(row)} fields, the header has {len(header)}",
                                       reader.line_num), self.on_error, self.skipped)
                else:
                    rows.append((reader.line_num, row))
        except csv.Error as exc:  # a field over csv.field_size_limit(), a NUL, an unclosed quote
            raise LayoutError(self.table, f"not CSV ({exc})", reader.line_num) from None
        if header is None:
            raise LayoutError(self.table, "an empty table", fix="the first row names the columns")
        return header, rows

    def _lines(self, data: bytes) -> Iterator[str]:
        """The table's lines for ``csv.reader``, one over ``MAX_LINE_CHARS`` refused before it is split."""
        f = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8-sig", newline="")
        number = 0
        while line := f.readline(MAX_LINE_CHARS + 1):
            number += 1
            if len(line) > MAX_LINE_CHARS:
                raise LayoutError(self.table, f"a line of more than {MAX_LINE_CHARS} characters", number,
                                  fix="a row names one image and its labels; check that it is the right file")
            yield line

    @staticmethod
    def _column(cells: list[str]) -> tuple[list[Label], Optional[list[str]]]:
        """A label column's values, and its class names (None when they are numbers)."""
        try:
            floats = [float(v) for v in cells]
        except ValueError:
            names = sorted(set(cells))  # ImageFolder's find_classes: sorted(names)
            index = {name: k for k, name in enumerate(names)}
            return [index[v] for v in cells], names
        if all(x.is_integer() for x in floats):
            return [int(v) if _is_int(v) else int(x) for v, x in zip(cells, floats)], None
        return list(floats), None

    def _table_entry(self) -> FileEntry:
        """The table as a file the mirror depends on, by its path relative to ``root`` (``../train.csv``
        when it is beside the image folder)."""
        rel = Path(os.path.relpath(self.table, self.root)).as_posix()
        st = os.stat(self.table)
        return FileEntry(rel, st.st_size, st.st_mtime_ns)

    def __getitem__(self, index: int) -> tuple[ImageFile, Union[Label, tuple[Label, ...]]]:
        """Sample ``index``: ``(ImageFile, label)``, or ``(ImageFile, (label, ...))`` for several label columns.

        Raises:
            OSError: the file cannot be read (after ``retries`` on transient errors).
        """
        rel = self.paths[index]
        target = self.targets[index]
        return ImageFile(read_file(self.root, rel, self.retries), rel), target[0] if len(target) == 1 else target

    def describe(self) -> str:
        """E.g. ``"csv layout, 4 images, labels from train.csv, column 'breed' (2 classes)"``, and the
        guesses made (which table, which path column)."""
        classes = self.info["classes"]
        columns = ", ".join(repr(c) + (f" ({len(classes[c])} classes)" if c in classes else "")
                            for c in self.info["columns"])
        guessed = f" (guessed: {'; '.join(self.guesses)})" if self.guesses else ""
        column = "column" if len(self.info["columns"]) == 1 else "columns"
        return f"{super().describe()}, labels from {self.table.name}, {column} {columns}{guessed}"

    @classmethod
    def detect(cls, tree: Any, *, labels: Optional[PathLike] = None, split: Optional[str] = None) -> bool:
        """True if the folder holds images and a label table found by the rules of :func:`_find_table`."""
        tree = tree_of(tree)
        top = tree.entries()
        tables = [name for name, is_dir in top.items() if name.lower().endswith(".csv") and not is_dir]
        folders = [name for name, is_dir in top.items() if is_dir]
        if len(tables) > 1:
            named = [name for name in folders if f"{name.lower()}.csv" in map(str.lower, tables)]
            if len(named) == 1:
                return tree.first_file(named[0], _is_image_name) is not None
            return len(_labelling(tables)) == 1 and tree.first_file("", _is_image_name) is not None
        return len(tables) == 1 and tree.first_file("", _is_image_name) is not None


def _is_image_name(name: str) -> bool:
    return name.lower().endswith(IMG_EXTENSIONS)


def _delimiter(lines: list[str]) -> str:
    """The delimiter of ``DELIMITERS`` by which most rows are as wide as the first (``","`` where none
    splits it); ``csv.Sniffer`` backtracks for minutes on hostile tables.
    """
    best, score = ",", 0
    for delimiter in DELIMITERS:
        widths = []
        try:
            for row in csv.reader(lines, delimiter=delimiter):
                if any(field.strip() for field in row):
                    widths.append(len(row))
        except csv.Error:  # a quoted field running past the lines read: judged by the rows before it
            pass
        if widths and widths[0] > 1 and widths.count(widths[0]) > score:
            best, score = delimiter, widths.count(widths[0])
    return best


def _finite(text: str) -> bool:
    """False for a number that is NaN or infinite (``nan``, ``inf``, ``-Infinity``); True for any other text."""
    try:
        return math.isfinite(float(text))
    except ValueError:
        return True


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def _find_table(root: Path, files: list[FileEntry]) -> tuple[Path, str]:
    """The label table at ``root``'s top, and the guess made, in words ("" where there was one table).

    Raises:
        LayoutError: no table, or several and neither exactly one named after a folder of images nor
            exactly one that is not a Kaggle submission template.
    """
    tables = [f.rel for f in files if "/" not in f.rel and f.rel.lower().endswith(".csv")]
    if len(tables) == 1:
        return root / tables[0], ""
    # Kaggle's train.csv beside train/ (and sample_submission.csv beside test/, which has no labels to give)
    imaged = {f.rel.split("/", 1)[0].lower(): f.rel.split("/", 1)[0] for f in files if "/" in f.rel and is_image(f.rel)}
    named = [t for t in tables if t[: -len(".csv")].lower() in imaged]
    if len(named) == 1:
        others = ", ".join(t for t in tables if t != named[0])
        return root / named[0], (f"the table {named[0]}, named after the folder {imaged[named[0][:-4].lower()]}/, "
                                 f"not {others}: pass labels= to use another")
    labelling = _labelling(tables)
    if len(labelling) == 1:
        others = ", ".join(t for t in tables if t != labelling[0])
        return root / labelling[0], (f"the table {labelling[0]}, not {others} (Kaggle's submission template: the "
                                     f"test images' ids, no labels): pass labels= to use another")
    found = f"found {', '.join(tables)}" if tables else "found none"
    raise LayoutError(root, f"expected one .csv table at the top ({found})", fix="pass labels= the table")


def _labelling(tables: list[str]) -> list[str]:
    """``tables`` that may hold labels: all but Kaggle's submission templates (``sample_submission*.csv``)."""
    return [t for t in tables if not t.lower().startswith("sample_submission")]


def _path_column(header: list[str]) -> int:
    """The first column named one of PATH_COLUMNS (any case), else the first."""
    lowered = [name.lower() for name in header]
    return next((k for k, name in enumerate(lowered) if name in PATH_COLUMNS), 0)


def _unlisted(rel: str) -> FileEntry:
    """A file that :func:`list_files` refused, as an entry to be found by its path (and then refused)."""
    return FileEntry(rel, 0, 0)


class _Finder:
    """Finds the image a table's cell names among the files listed under the root (nothing else is read);
    a name that finds one of ``refused`` (a FIFO, a link out of the root) is refused with its reason."""

    def __init__(self, files: list[FileEntry], refused: dict[str, str], root: Path):
        self.refused, self.root = refused, root
        files = sorted([*files, *map(_unlisted, refused)])
        self.by_rel = {f.rel: f for f in files}
        # Every image under each end of its path, with and without extension: train/x/a.jpg under
        # a.jpg, x/a.jpg, a, x/a and train/x/a.
        self.by_end: dict[str, list[FileEntry]] = {}
        for f in files:
            if is_image(f.rel):
                parts = f.rel.split("/")
                for k in range(len(parts)):
                    end = "/".join(parts[k:])
                    for key in (end, stem(end)) if k else (stem(end),):
                        self.by_end.setdefault(key, []).append(f)

    def find(self, value: str, table: Path, line: int) -> FileEntry:
        """The one image ``value`` names.

        Raises:
            LayoutError: ``value`` is empty, absolute, has ``..``, names no image or several, or one that is
                not a regular file or that a symlink leads out of the root.
        """
        path = value.replace("\\", "/")
        if not path or path.startswith("/") or (len(path) > 1 and path[1] == ":") or "\0" in path:
            raise LayoutError(table, f"path {value!r} is empty or absolute", line,
                              fix="paths are relative to the image folder")
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise LayoutError(table, f"path {value!r} has a '..' part, which leaves the image folder", line)
        path = "/".join(parts)
        if path in self.by_rel:
            entry = self.by_rel[path]
            if not is_image(entry.rel):
                raise LayoutError(table, f"{value!r} is not an image file ({', '.join(IMG_EXTENSIONS)})", line)
            return self._readable(entry, value, table, line)
        found = self.by_end.get(path, [])
        if len(found) != 1:
            why = (f"{value!r} names no image under the folder" if not found else
                   f"{value!r} names {len(found)} images: {', '.join(f.rel for f in found[:5])}")
            raise LayoutError(table, why, line, fix="give the image's path relative to the folder, with extension")
        return self._readable(found[0], value, table, line)

    def _readable(self, entry: FileEntry, value: str, table: Path, line: int) -> FileEntry:
        if entry.rel in self.refused:
            raise LayoutError(table, f"{value!r} names {self.root / entry.rel}, which {self.refused[entry.rel]}", line,
                              fix="replace it with a regular file inside the folder, or delete the row")
        return entry
