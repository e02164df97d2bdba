"""What a source holds, as the layouts see it when they decide what it is: a :class:`Tree` of names.

A folder and an archive of it give the same tree, so they resolve to the same layout and splits: a
folder is listed lazily, each sub-folder at most once (on Drive each listing is a round trip); a zip's
tree is its central directory (read once, no member read); a tar has no index, so its tree is
unlisted but for its first member (reading the rest means reading it whole). An archive whose members
all lie in one top folder is rooted there, as ``unzip`` leaves the folder that was zipped.
"""

from __future__ import annotations

import os
import tarfile
import zipfile
import zlib
from pathlib import Path
from typing import Callable, Optional, Union

from colabfast.errors import ArchiveReadError
from colabfast.staging.extract import archive_suffix, decompressed, open_tar, safe_relpath
from colabfast.where._fileio import PathLike, retry
from colabfast.where.env import MIRRORS_FOLDER

__all__ = ["Tree", "tree_of", "split_folders", "SPLIT_FOLDERS"]


class Tree:
    """The names under a source (a folder, or an archive), relative to its root (POSIX).

    Attributes:
        path: the folder or the archive.
        archive: True for an archive.
        listed: False for a tar (only :attr:`first` is known).
        first: a tar's first file member (its path from the tree's root); None otherwise.
        prefix: the folder inside the archive the tree is rooted at (``"flowers/"``), ``""`` for none.
    """

    archive = False
    listed = True
    first: Optional[str] = None
    prefix = ""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def name(self) -> str:
        """The name of the tree's root folder (for an archive rooted at its top: its name)."""
        return self.prefix.rstrip("/").rsplit("/", 1)[-1] if self.prefix else self.path.name

    def entries(self, rel: str = "") -> dict[str, bool]:
        """The entries of the folder ``rel`` (``""``: the root), name -> is a folder, hidden names left
        out; empty for a folder that is not there or cannot be listed."""
        raise NotImplementedError

    def is_dir(self, rel: str) -> bool:
        parent, _, name = rel.rstrip("/").rpartition("/")
        return self.entries(parent).get(name) is True

    def is_file(self, rel: str) -> bool:
        parent, _, name = rel.rstrip("/").rpartition("/")
        return self.entries(parent).get(name) is False

    def first_file(self, rel: str, match: Callable[[str], bool]) -> Optional[str]:
        """The first file name under the folder ``rel`` (depth first, sorted) that ``match``es, or None;
        the walk stops there, so a hit costs a few listings."""
        stack = [rel.rstrip("/")]
        while stack:
            top = stack.pop()
            held = self.entries(top)
            names = sorted(held)
            for name in names:
                if not held[name] and match(name):
                    return name
            stack.extend(f"{top}/{name}" if top else name for name in reversed(names) if held[name])
        return None

    def sub(self, rel: str) -> Tree:
        """The tree of the folder ``rel`` (a split's folder)."""
        return _Sub(self, rel.strip("/"))

    def where(self, rel: str = "") -> str:
        """``rel`` as a user finds it: a path on disk, or ``archive!member``."""
        inside = self.prefix + rel
        return f"{self.path}!{inside}" if self.archive else os.path.join(self.path, rel) if rel else str(self.path)


def _hidden(name: str) -> bool:
    """A hidden name, or the ``__MACOSX`` folder of resource forks that macOS's zip adds beside a zipped folder."""
    return name.startswith(".") or name == "__MACOSX"


class _Folder(Tree):
    def __init__(self, path: Path, retries: int = 5) -> None:
        super().__init__(path)
        self._retries = retries
        self._listed: dict[str, dict[str, bool]] = {}

    def entries(self, rel: str = "") -> dict[str, bool]:
        rel = rel.strip("/")
        if rel not in self._listed:
            try:
                with retry(lambda: os.scandir(self.path / rel), self._retries) as it:
                    self._listed[rel] = {e.name: e.is_dir() for e in it if not _hidden(e.name)}
            except OSError:
                self._listed[rel] = {}
        return self._listed[rel]


class _Names(Tree):
    """An archive's tree from its members' names."""

    archive = True

    def __init__(self, path: Path, names: list[str]) -> None:
        super().__init__(path)
        visible = [n for n in names if n and not any(_hidden(part) for part in n.split("/"))]
        tops = {n.split("/", 1)[0] for n in visible}
        if len(tops) == 1 and all("/" in n for n in visible):
            self.prefix = f"{next(iter(tops))}/"
            visible = [n[len(self.prefix):] for n in visible]
        self.names = sorted(n for n in visible if n and not n.endswith("/"))
        self._folders: dict[str, dict[str, bool]] = {"": {}}
        for name in (*visible, *self.names):
            parts = name.rstrip("/").split("/")
            for k, part in enumerate(parts):
                folder = "/".join(parts[:k])
                is_dir = k < len(parts) - 1 or name.endswith("/")
                self._folders.setdefault(folder, {})
                self._folders[folder][part] = self._folders[folder].get(part, False) or is_dir
                if is_dir:
                    self._folders.setdefault("/".join(parts[: k + 1]), {})

    def entries(self, rel: str = "") -> dict[str, bool]:
        return self._folders.get(rel.strip("/"), {})


class _Tar(Tree):
    """A tar: only its first file member is known without reading it whole."""

    archive = True
    listed = False

    def __init__(self, path: Path, retries: int = 5) -> None:
        super().__init__(path)
        with retry(lambda: open(path, "rb"), retries) as f, decompressed(f) as stream:
            try:
                member = next((m for m in open_tar(path, stream) if m.isfile()), None)
            except (tarfile.TarError, EOFError, zlib.error) as exc:
                raise ArchiveReadError(path, "(the first member)", f"{type(exc).__name__}: {exc}") from exc
        self.first = None if member is None else safe_relpath(path, member.name)

    def entries(self, rel: str = "") -> dict[str, bool]:
        return {}


class _Sub(Tree):
    def __init__(self, tree: Tree, rel: str) -> None:
        super().__init__(tree.path)
        self.base, self.rel = tree, rel
        self.archive, self.listed = tree.archive, tree.listed
        self.prefix = f"{tree.prefix}{rel}/"
        if isinstance(tree, _Names):
            self.names = [n[len(rel) + 1:] for n in tree.names if n.startswith(f"{rel}/")]

    def entries(self, rel: str = "") -> dict[str, bool]:
        return self.base.entries(f"{self.rel}/{rel}".rstrip("/"))

    def where(self, rel: str = "") -> str:
        return self.base.where(f"{self.rel}/{rel}".rstrip("/"))


def tree_of(path: Union[PathLike, Tree], retries: int = 5) -> Tree:
    """The :class:`Tree` of a folder or an archive (a ``Tree`` is returned as it is).

    Raises:
        ArchiveReadError: a zip whose central directory, or a tar whose first member, cannot be read.
        UnsafeArchiveError: a member name that is absolute or climbs out with ``..``.
    """
    if isinstance(path, Tree):
        return path
    path = Path(os.path.abspath(path))
    suffix = archive_suffix(path)
    if suffix is None or path.is_dir():
        return _Folder(path, retries)
    if suffix != ".zip":
        return _Tar(path, retries)
    key = zip_key(path) if LISTED else None
    if key in LISTED and LISTED[key] is not None:
        return _Names(path, list(LISTED[key] or ()))
    try:
        with retry(lambda: zipfile.ZipFile(path), retries) as z:
            names = [safe_relpath(path, info.filename) + ("/" if info.is_dir() else "") for info in z.infolist()]
    except zipfile.BadZipFile as exc:
        raise ArchiveReadError(path, "(the central directory at its end)", str(exc)) from exc
    if key in LISTED:
        LISTED[key] = names
    return _Names(path, list(names))


# The zips listed once (colabfast.packing.unpacked.read_once): (path, size, mtime_ns) -> their names once read
LISTED: dict[tuple, Optional[list[str]]] = {}


def zip_key(path: PathLike) -> Optional[tuple]:
    """What a zip's listing is kept by in :data:`LISTED`: its path, size and time (None: no such file)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.path.abspath(path), st.st_size, st.st_mtime_ns


SPLIT_FOLDERS = ("train", "val", "valid", "test")  # a folder holding only these holds splits, not classes


def split_folders(tree: Union[PathLike, Tree]) -> Optional[list[str]]:
    """The split folders of a tree of splits: every folder in it (hidden ones and colabfast's mirrors
    folder aside) named one of ``SPLIT_FOLDERS`` in any case, as PyTorch's transfer-learning tutorial's
    ``hymenoptera/train/{ants,bees}`` and ``val/``
    (https://pytorch.org/tutorials/beginner/transfer_learning_tutorial.html) or a Kaggle folder's
    ``train/`` and ``test/``. torchvision's ``ImageFolder`` would take those splits for classes. None
    for any other folder, or one that cannot be listed. One listing."""
    folders = sorted(name for name, is_dir in tree_of(tree).entries().items() if is_dir and name != MIRRORS_FOLDER)
    if not folders or any(name.lower() not in SPLIT_FOLDERS for name in folders):
        return None
    return folders
