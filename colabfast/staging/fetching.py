"""Download files and folders shared on Google Drive, by link or id, cached and verified.

Only what gdown 5.2.2 (Colab's) and 6.x share is called: ``gdown.download(id=, output=, quiet=,
use_cookies=)`` and ``gdown.download_folder(...)``; links are parsed here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import shutil
import tempfile
import urllib.parse
from pathlib import Path
from typing import Optional

from colabfast.errors import FetchError, FetchRefused
from colabfast.staging.extract import ARCHIVE_SUFFIXES, archive_suffix, strip_archive_suffix
from colabfast.where import env
from colabfast.where._fileio import PathLike, locked, read_json, state_name, unchanged, write_json_atomic

__all__ = ["FetchError", "DriveLink", "fetch", "parse_link"]

DRIVE_HOSTS = ("drive.google.com", "docs.google.com", "drive.usercontent.google.com")
DOWNLOADING = ".colabfast-download-"  # a download in progress, in its destination folder (renamed from there)

_ID = re.compile(r"[-\w]{10,}")
_FILE_PATH = re.compile(r"/file(?:/u/\d+)?/d/([-\w]{10,})")
_DOC_PATH = re.compile(r"/(?:document|spreadsheets|presentation)(?:/u/\d+)?/d/([-\w]{10,})")
_FOLDER_PATH = re.compile(r"/drive(?:/u/\d+)?(?:/mobile)?/folders/([-\w]{10,})")


@dataclasses.dataclass(frozen=True)
class DriveLink:
    """A Google Drive file or folder, parsed from a share link or an id.

    Attributes:
        id: Drive's id of the file or folder.
        folder: True for a folder.
    """

    id: str
    folder: bool = False


def parse_link(url_or_id: str) -> DriveLink:
    """The file or folder a Drive share link (``/file/d/ID``, ``?id=ID``, ``/drive/folders/ID``,
    ``drive.usercontent.google.com``, Docs links) or bare id names.

    Raises:
        ValueError: not a Google Drive link or id.
    """
    text = url_or_id.strip()
    if _ID.fullmatch(text):
        return DriveLink(text)
    parsed = urllib.parse.urlparse(text)
    if parsed.hostname in DRIVE_HOSTS:
        folder = _FOLDER_PATH.match(parsed.path)
        if folder:
            return DriveLink(folder.group(1), folder=True)
        file = _FILE_PATH.match(parsed.path) or _DOC_PATH.match(parsed.path)
        if file:
            return DriveLink(file.group(1))
        ids = urllib.parse.parse_qs(parsed.query).get("id", [])
        if len(ids) == 1 and _ID.fullmatch(ids[0]):
            return DriveLink(ids[0], folder=parsed.path.rstrip("/") == "/embeddedfolderview")
    raise FetchRefused(
        f"not a Google Drive link or file id: {url_or_id!r}; use the share link "
        f"(https://drive.google.com/file/d/<id>/view) or the id in it"
    )


def fetch(
    url_or_id: str,
    dst: Optional[PathLike] = None,
    *,
    hash: Optional[str] = None,
    extract: bool = False,
    quiet: bool = False,
) -> Path:
    """Download a file or folder shared on Google Drive, once.

    Downloaded to a temporary name, checked against ``hash``, then renamed; a record in colabfast's cache
    folder makes the next call with the same link and destination make no request.

    Args:
        url_or_id: a Drive share link or id (see :func:`parse_link`), shared as "Anyone with the link".
        dst: where it goes. None: ``colabfast.where.env.cache_dir()/fetch/<id>/<name on Drive>``; an
            existing folder, or a path ending in ``/``: into it; else that path.
        hash: ``"md5:<hex>"``, ``"sha256:<hex>"`` (any ``hashlib`` algorithm) the file must have; files only.
        extract: unpack an archive next to it, into a folder named after it, with :func:`colabfast.stage`.
        quiet: no progress output.

    Returns:
        The downloaded file or folder, or the extracted folder with ``extract=True``.

    Raises:
        FetchError: Drive refused or failed (see ``FetchError.reason``), or the hash does not match
            (the download is discarded).
        ValueError: not a Drive link, a malformed ``hash``, ``hash``/``extract`` for a folder,
            ``extract`` for a file that is not an archive, or an extraction folder colabfast did not make.
        FileExistsError: the destination is a folder colabfast did not fetch.
        colabfast.staging.extract.UnsafeArchiveError: a hostile archive (``extract=True``); nothing was extracted.
    """
    link = parse_link(url_or_id)
    want = _parse_hash(hash) if hash is not None else None
    if link.folder and (want or extract):
        raise FetchRefused(f"{url_or_id} is a Drive folder: hash= and extract=True apply to one file")
    folder, name = _destination(dst, link)
    folder.mkdir(parents=True, exist_ok=True)
    state = env.cache_dir() / "fetch-state" / state_name(folder)
    state.mkdir(parents=True, exist_ok=True)
    with locked(state / f"{link.id}.lock", f"fetching {link.id} into {folder}"):  # two fetches wait in turn
        record = _Record.load(state, link.id)
        path = _cached(folder, name, record, want, link)
        if path is None:
            path = _download(link, url_or_id, folder, name, want, quiet)
        if record is None or (record.name, record.folder) != (path.name, link.folder):
            record = _Record(link.id, link.folder, path.name)
        if path.is_file():
            record.stamp(path, want)
        write_json_atomic(state / f"{link.id}.json", dataclasses.asdict(record))
    if extract:
        if archive_suffix(path) is None:
            raise FetchRefused(
                f"extract=True, but {path} is not an archive ({', '.join(ARCHIVE_SUFFIXES)}); it was downloaded "
                f"and kept"
            )
        from colabfast.staging.pipeline import stage

        return stage(path, path.parent / strip_archive_suffix(path.name), progress=not quiet)
    return path


@dataclasses.dataclass
class _Record:
    """What was fetched into a folder: written after a download is complete, verified and in place."""

    id: str
    folder: bool
    name: str
    hash: Optional[str] = None  # "algo:hex" the file was verified against
    size: int = -1
    mtime_ns: int = -1

    @classmethod
    def load(cls, state: Path, id: str) -> Optional[_Record]:
        try:
            return cls(**(read_json(state / f"{id}.json") or {}))
        except TypeError:  # missing, unreadable, or from another version
            return None

    def unchanged(self, path: Path) -> bool:
        """True if the file at ``path`` still has the size and time noted by :meth:`stamp`."""
        return unchanged(path.stat(), self.size, self.mtime_ns)

    def stamp(self, path: Path, want: Optional[tuple]) -> None:
        """Note the file's size and time, and the hash it was just verified against, if any."""
        if want is not None:
            self.hash = f"{want[0]}:{want[1]}"
        elif not self.unchanged(path):
            self.hash = None  # changed since it was verified
        st = path.stat()
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns


def _parse_hash(hash: str) -> tuple:
    algo, _, hexdigest = hash.partition(":")
    algo, hexdigest = algo.strip().lower(), hexdigest.strip().lower()
    if algo not in hashlib.algorithms_guaranteed:
        raise FetchRefused(f"hash={hash!r}: write it as 'md5:<hex>' or 'sha256:<hex>' (any hashlib algorithm)")
    size = hashlib.new(algo).digest_size
    if not size or not re.fullmatch(f"[0-9a-f]{{{2 * size}}}", hexdigest):
        raise FetchRefused(f"hash={hash!r}: a {algo} digest is {2 * size} hex digits")
    return algo, hexdigest


def _file_hash(path: Path, algo: str) -> str:
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _destination(dst: Optional[PathLike], link: DriveLink) -> tuple:
    """(folder to put it in, its name there or None for the name on Drive)."""
    if dst is None:
        return env.cache_dir() / "fetch" / link.id, None
    text = os.path.expanduser(os.fspath(dst))
    if text.endswith(("/", os.sep)) or os.path.isdir(text):
        return Path(text), None
    path = Path(text).absolute()
    return path.parent, path.name


def _cached(folder: Path, name: Optional[str], record: Optional[_Record], want, link: DriveLink):
    """The destination if a download is not needed, else None."""
    if record is not None and record.folder == link.folder and name in (None, record.name):
        path = folder / record.name
        if link.folder:
            return path if path.is_dir() else None
        if path.is_file():
            if want is None or (record.hash == f"{want[0]}:{want[1]}" and record.unchanged(path)):
                return path
            if _file_hash(path, want[0]) == want[1]:
                return path
        return None
    # A file put there by other means counts if it has the hash asked for.
    if name is not None and want is not None and (folder / name).is_file():
        if _file_hash(folder / name, want[0]) == want[1]:
            return folder / name
    return None


def _download(link, url_or_id, folder: Path, name: Optional[str], want, quiet: bool) -> Path:
    for stale in folder.glob(f"{DOWNLOADING}{link.id}-*"):  # a killed download of this link (we hold its lock)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{DOWNLOADING}{link.id}-", dir=folder))  # same disk: a rename
    try:
        if link.folder:
            _gdown_folder(link, url_or_id, tmp, quiet)
            (got,) = tmp.iterdir()  # gdown made tmp/<folder name>
        else:
            got = Path(_gdown_file(link, url_or_id, tmp, quiet))
            if want is not None:
                actual = _file_hash(got, want[0])
                if actual != want[1]:
                    raise FetchError(
                        f"{url_or_id}: the downloaded {got.name} has {want[0]}:{actual}, not the "
                        f"{want[0]}:{want[1]} asked for; it was discarded. The file on Drive changed, or "
                        f"the hash is wrong",
                        "hash",
                    )
        final = folder / (name or got.name)
        if final.is_dir() and not final.is_symlink():
            raise FileExistsError(
                f"{final} is a folder colabfast did not fetch; remove it or pass another dst to fetch()"
            )
        os.replace(got, final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# --- gdown ----------------------------------------------------------------------------------------


def _gdown_errors(gdown) -> tuple:
    """The exception types by which gdown (5.x or 6.x) reports a failed download."""
    import requests

    names = ("DownloadError", "FileURLRetrievalError", "FolderContentsMaximumLimitError")
    found = tuple(getattr(gdown.exceptions, n) for n in names if hasattr(gdown.exceptions, n))
    # 5.x raises RuntimeError when a folder page cannot be parsed.
    return (*found, requests.RequestException, RuntimeError)


def _gdown_file(link: DriveLink, url_or_id: str, out: Path, quiet: bool) -> str:
    import gdown

    try:
        # Trailing separator: gdown names the file as Drive does. No cookies: fetch neither reads
        # nor writes gdown's cookie jar in ~/.cache/gdown.
        path = gdown.download(id=link.id, output=str(out) + os.sep, quiet=quiet, use_cookies=False)
    except _gdown_errors(gdown) as e:
        raise _fetch_error(e, link, url_or_id, gdown.__version__) from e
    if path is None:  # 5.x gives up this way in a few cases, having printed why
        raise FetchError(f"gdown could not download {url_or_id} (see its message above)", "failed")
    return str(path)


def _gdown_folder(link: DriveLink, url_or_id: str, out: Path, quiet: bool) -> None:
    import gdown

    try:
        files = gdown.download_folder(id=link.id, output=str(out) + os.sep, quiet=quiet, use_cookies=False)
    except _gdown_errors(gdown) as e:
        raise _fetch_error(e, link, url_or_id, gdown.__version__) from e
    if files is None:  # 5.x: the folder page or one of its files failed, reported on stderr
        raise _fetch_error(RuntimeError("gdown could not list or download the folder"), link, url_or_id, "")


def _fetch_error(error: BaseException, link: DriveLink, url_or_id: str, version: str) -> FetchError:
    """One FetchError with the reason, from whatever gdown or requests raised."""
    import requests

    what = "folder" if link.folder else "file"
    text = " ".join(str(error).split())
    if isinstance(error, requests.RequestException):
        return FetchError(
            f"could not reach Google Drive for {url_or_id} ({text}); check the internet connection and retry",
            "network",
        )
    if type(error).__name__ == "FolderContentsMaximumLimitError":
        return FetchError(
            f"gdown {version} lists at most 50 files per Drive folder and {url_or_id} has more. Upgrade "
            f"gdown (pip install -U gdown: 6.x has no limit), or share the folder as one .zip and fetch "
            f"that with extract=True",
            "folder_limit",
        )
    if re.search(r"too many users|quota", text, re.IGNORECASE):
        return FetchError(
            f"Google Drive's download quota for {url_or_id} is used up ({text}). Wait (up to 24 hours), or "
            f"add the {what} to your own Drive, mount it (colabfast.mount()) and colabfast.stage() it",
            "quota",
        )
    if re.search(r"cannot retrieve|permission|failed to retrieve|could not list", text, re.IGNORECASE):
        if _probe(link) == "not_found":
            return FetchError(
                f"Google Drive has no {what} with id {link.id} ({url_or_id}): the link is wrong or the "
                f"{what} was deleted",
                "not_found",
            )
        return FetchError(
            f"Google Drive refused the {what} {url_or_id}: it is not shared as 'Anyone with the link' (or "
            f"it was deleted). Ask its owner to share it that way, or add it to your Drive and mount that",
            "permission",
        )
    return FetchError(f"gdown could not download {url_or_id}: {text}", "failed")


def _probe(link: DriveLink) -> Optional[str]:
    """Ask Drive once more, to tell a missing file from a private one (gdown reports both alike):
    Drive answers 404 for an id that does not exist. ``"not_found"`` or None."""
    import requests

    url = (
        f"https://drive.google.com/drive/folders/{link.id}"
        if link.folder
        else f"https://drive.google.com/uc?id={link.id}&export=download"
    )
    try:
        with requests.get(url, timeout=30, stream=True) as res:
            return "not_found" if res.status_code == 404 else None
    except requests.RequestException:
        return None
