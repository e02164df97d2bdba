"""``colabfast.Error`` and every error colabfast raises on purpose, in one module.

Each colabfast error also keeps the standard base it always had (``MirrorError`` is a
``ValueError``, ``StageError`` an ``OSError``, ``DriveError`` a ``RuntimeError``, ...), so
``except OSError`` and friends still catch what they caught; ``except colabfast.Error`` catches all
of colabfast's own, and the ``colabfast`` command prints any of them as one line. Each is
``colabfast.errors.<name>``; those a user catches to act on are ``colabfast.<name>`` too (``Error``,
``DriveError``, ``FetchError``, ``StageError``, ``NotEnoughSpace``, ``PackError``, ``SplitRefused``,
``ArchiveReadError``, ``MirrorError``, ``LayoutError``, ``LoaderStateError``, ``CacheLimitError``), while
the refusals of bad arguments (``*Refused``) and the finer classes stay here. This module imports
nothing from colabfast at import time, so any module can import it.

The classes, by the stage that raises them (bases in brackets)::

    Error (Exception)
    where the data is: Drive, its stand-in and simulator, shared links:
        DriveError (Error, RuntimeError)
        DriveSimError (Error, RuntimeError)
        FetchError (Error, RuntimeError)
        FetchRefused (Error, ValueError)
    staging:
        StageError (Error, OSError)
        StageRefused (Error, ValueError)
        NotEnoughSpace (Error, OSError)
    archives:
        UnsafeArchiveError (Error, ValueError)
        ArchiveReadError (Error, ValueError)
    packing:
        PackError (Error, ValueError)
        PackRefused (PackError)
        SplitRefused (PackRefused)
        SourceNotFound (Error, FileNotFoundError)
        SourceNotAFolder (Error, NotADirectoryError)
        FieldError (Error, ValueError)
    mirrors:
        MirrorError (Error, ValueError)
        ImageSizeError (Error, ValueError)
        MountError (Error, OSError)
    layouts:
        LayoutError (Error, ValueError)
        LayoutFileNotFoundError (LayoutError, FileNotFoundError)
        LayoutNotFoundError (LayoutError, RuntimeError)
    opening, datasets and loading:
        NothingToOpen (Error, FileNotFoundError)
        OpenRefused (Error, TypeError)
        IndexTypeError (Error, TypeError, AttributeError)
        LoaderStateError (Error, ValueError)
        SamplerRefused (Error, ValueError)
        ExportRefused (Error, ValueError)
        CacheLimitError (Error, ValueError)
"""

from __future__ import annotations

import errno
import os
import reprlib
from pathlib import Path
from typing import Any, Optional, Union

__all__ = ["Error", "DriveError", "DriveSimError", "FetchError", "FetchRefused", "StageError", "StageRefused",
           "NotEnoughSpace", "NotWritable", "UnsafeArchiveError", "ArchiveReadError", "PackError", "PackRefused",
           "SplitRefused",
           "SourceNotFound", "SourceNotAFolder", "FieldError", "MirrorError", "ImageSizeError", "LayoutError",
           "LayoutFileNotFoundError", "LayoutNotFoundError", "NothingToOpen", "OpenRefused", "IndexTypeError",
           "MountError", "LoaderStateError", "SamplerRefused", "ExportRefused", "CacheLimitError"]


class Error(Exception):
    """Base class of colabfast's errors; see :mod:`colabfast.errors`."""


# --- where the data is: Drive, its stand-in and simulator, shared links ---------------------------


class DriveError(Error, RuntimeError):
    """Mounting, refreshing or flushing Drive failed; the message names the path and the next step.

    Raised by :mod:`colabfast.drive` and the stand-in (:mod:`colabfast.drive.exposing`); exported as
    ``colabfast.DriveError`` and ``colabfast.drive.DriveError``."""


class DriveSimError(Error, RuntimeError):
    """The simulator could not start, stop or answer (FUSE unusable, mount failed, server died)."""


class FetchError(Error, RuntimeError):
    """A download from Google Drive failed.

    Attributes:
        reason: ``"permission"`` (not shared as "Anyone with the link"), ``"not_found"`` (no such file,
            or deleted), ``"quota"`` (Drive's download quota for the file is used up: "too many
            users"), ``"folder_limit"`` (gdown 5.x cannot list over 50 files per folder),
            ``"network"``, ``"hash"`` (the download does not match ``hash``) or ``"failed"``.
    """

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


class FetchRefused(Error, ValueError):
    """:func:`colabfast.fetch` refused its arguments (not a Drive link, a malformed ``hash=``, ``hash=``
    or ``extract=True`` for a folder, ``extract=True`` for a file that is no archive); the message names
    what and the fix. A ``ValueError``, as these refusals always were."""


# --- staging --------------------------------------------------------------------------------------


def _describe(exc: BaseException) -> str:
    """A file's failure in :class:`StageError`'s message, with the attempts it took."""
    attempts = getattr(exc, "attempts", 1)
    folder = " (a folder: nothing under it was staged)" if getattr(exc, "folder", False) else ""
    return f"{exc}{folder}" + (f" (after {attempts} attempts)" if attempts > 1 else "")


class StageError(Error, OSError):
    """Some files could not be staged; the others are staged and stay.

    Attributes:
        failures: source path (relative to the staged root) -> the exception that stopped it.
        dst: where the successful files are.

    ``advice``: what to do about the failures, where Drive's state says more than "run stage() again"
    (:func:`colabfast.drive.mounting.failure_advice`, which stage passes).
    """

    def __init__(self, src: Path, dst: Path, failures: dict[str, BaseException], total: int,
                 advice: Optional[str] = None):
        self.failures, self.dst = failures, dst
        shown = sorted(failures.items())[:20]
        lines = "".join(f"\n  {rel}: {_describe(exc)}" for rel, exc in shown)
        more = f"\n  ... and {len(failures) - len(shown)} more" if len(failures) > len(shown) else ""
        what = "files or folders" if any(rel.endswith("/") for rel in failures) else "files"
        super().__init__(
            errno.EIO,
            f"{len(failures)} of {total} {what} could not be staged from {src} to {dst}:{lines}{more}\n"
            f"The other files are staged and stay; "
            + (f"{advice} A re-run copies only the missing ones." if advice else
               "run stage() again to retry only the missing ones."),
        )

    def __str__(self) -> str:
        return str(self.strerror)


class StageRefused(Error, ValueError):
    """stage (or :func:`colabfast.ramdisk`) refused its arguments, its source or its destination before
    writing anything; the message names what and the fix. A ``ValueError``, as these refusals always were."""


class NotEnoughSpace(Error, OSError):
    """The destination (local disk, a RAM disk, Drive's cache) has no room for what stage, pack or an
    extraction would write, checked before writing (or it filled up while writing): the message says
    what is needed, what is free and where. An ``OSError`` with ``errno.ENOSPC``, as it always was."""


class NotWritable(Error, OSError):
    """A folder pack or open_dataset would write a mirror into is read-only, not yours, full or over its
    quota (Kaggle's ``/kaggle/input``, a shared Drive folder): found before writing anything; the message
    names the folder and where to write instead. An ``OSError`` with the cause's errno."""


# --- archives -------------------------------------------------------------------------------------


QUOTED = 200  # characters of a name quoted in an error message


def quoted(name: str) -> str:
    """``name`` quoted for a message, cut to `QUOTED` characters: a hostile name may be megabytes."""
    return repr(name if len(name) <= QUOTED else name[:QUOTED] + "...")


def excerpt(value: Any) -> str:
    """``repr(value)`` for a message, on one line of at most `QUOTED` characters however large
    ``value`` is (a YAML alias bomb, a state of megabyte tensors): containers to 3 levels and 6 items
    each (``reprlib``), so it costs as little as it prints; arrays and tensors by their dtype and shape."""
    text = _Short().repr(value).replace("\n", " ")
    return text if len(text) <= QUOTED else text[: QUOTED - 3] + "..."


class _Short(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxstring, self.maxother = 3, QUOTED, QUOTED
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = 6

    def repr1(self, x: Any, level: int) -> str:
        if hasattr(x, "dtype") and hasattr(x, "shape"):
            return f"<{str(x.dtype).removeprefix('torch.')} {type(x).__name__} of shape {list(x.shape)}>"
        return super().repr1(x, level)


_UNSAFE_FIX = ("The archive is unsafe (or was made with absolute paths); nothing outside the destination "
               "was written. Re-create it with relative paths inside one folder.")


class UnsafeArchiveError(Error, ValueError):
    """An archive entry would land outside the destination, is a link, or is a device file.

    Attributes:
        archive: the archive's path.
        member: the offending entry's name.
    """

    def __init__(self, archive: Union[str, os.PathLike], member: str, why: str, fix: str = _UNSAFE_FIX):
        self.archive, self.member = str(archive), member
        super().__init__(f"refusing to extract {archive}: entry {quoted(member)} {why}. {fix}")


class ArchiveReadError(Error, ValueError):
    """The archive ends early or is corrupt at a member; what was packed before it is kept.

    Attributes:
        archive: the archive's path.
        member: the member being read (``outer.tar/inner.JPEG`` inside a per-class tar).
    """

    def __init__(self, archive: Union[str, os.PathLike], member: str, why: str):
        self.archive, self.member = str(archive), member
        super().__init__(
            f"{archive}: cannot read member {quoted(member)}: {why}. The archive is truncated or corrupt (an "
            "interrupted upload or download?). The images packed before it are kept: put the complete archive "
            "at the same path and run pack() again to continue from there."
        )


# --- packing --------------------------------------------------------------------------------------


class PackError(Error, ValueError):
    """Source images (or folders) could not be read or decoded; nothing final was written.

    Attributes:
        failures: ``(path, error message)`` for every bad file.
    """

    def __init__(self, failures: list[tuple[str, str]]):
        self.failures = failures
        shown = "".join(f"\n  {p}: {e}" for p, e in failures[:20])
        more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
        super().__init__(
            f"{len(failures)} source files or folders cannot be read:{shown}{more}\n"
            "Nothing was written to the destination. Fix or delete them and run pack() again "
            "(the images already processed are kept and reused), or pass on_error='skip' to leave them out."
        )


class PackRefused(PackError):
    """pack (or :func:`colabfast.open_dataset`, which packs) refused an argument or its destination
    before reading a sample or writing anything; the message names what and the fix. A ``ValueError``
    (through :class:`PackError`), as these refusals always were; ``failures`` is empty."""

    def __init__(self, message: str):
        self.failures = []
        ValueError.__init__(self, message)


class SplitRefused(PackRefused):
    """A source of several splits (an export's ``train/``, ``valid/``, ``test/``; a tree of split
    folders) given no ``split=``, or one it lacks: the message lists its splits (``found``: name ->
    where it is) and the call to make (``call``: ``"pack"`` or ``"open_dataset"``), in the words a
    YOLO export's splits are refused with (:mod:`colabfast.layouts.yolo`). ``expr``: how the call names
    the source, where it is not a path (``"dataset_dict"`` for a Hugging Face ``DatasetDict``)."""

    def __init__(self, source: Any, found: dict[str, str], split: Optional[str], call: str = "pack",
                 expr: Optional[str] = None):
        self.source, self.found, self.split, self.expr = os.fspath(source), found, split, expr
        listed = ", ".join(f"{name!r} ({where})" for name, where in sorted(found.items()))
        if split is not None:
            why = f"no split {split!r}: there are {listed}"
        else:
            why = f"{'several splits' if len(found) > 1 else 'one split'}: {listed}"
        first = "train" if "train" in found else sorted(found)[0]
        named = expr if expr is not None else repr(self.source)
        make = (f"open_dataset({named}, split={first!r})" if call == "open_dataset" else
                f"pack({named}, dst, split={first!r})")
        super().__init__(f"{self.source}: {why}. Pass split= one of them: {make}")

    def to(self, call: str) -> SplitRefused:
        """The same refusal, naming the call ``call`` (``"open_dataset"``) to make."""
        return SplitRefused(self.source, self.found, self.split, call, self.expr)


class SourceNotFound(Error, FileNotFoundError):
    """stage, pack or :func:`ultralytics_data` found no source to read: the folder or archive does not
    exist, or holds no images (no class folders, no KITTI tree, no annotation file, no folder of the
    split it was told to read, no devkit in ``labels=``); the message names what is missing and the
    fix. A ``FileNotFoundError``, as it always was."""


class SourceNotAFolder(Error, NotADirectoryError):
    """pack was given a file that is neither a folder nor an archive it reads. A ``NotADirectoryError``,
    as it always was."""


class FieldError(Error, ValueError):
    """A sample does not fit the columns the earlier samples made (or holds a value no column can
    hold): the message names the sample's index, the field and the fix."""


# --- mirrors --------------------------------------------------------------------------------------


class MirrorError(Error, ValueError):
    """A file is not a complete colabfast mirror that this version can read; the message says why."""


class MountError(Error, OSError):
    """Reading a mirror on a mount (Drive) failed after the retries :func:`colabfast.stage` makes (a
    disconnect that outlasts them); the message names the file, the byte offset and the next step. An
    ``OSError`` with the errno of the last failure, as it always was."""


class ImageSizeError(Error, ValueError):
    """An image's header declares more pixels than ``PIL.Image.MAX_IMAGE_PIXELS``, or a size other
    than the one it was expected to have (a mirror's ``image_shapes``). A ``ValueError``, as it always was."""


# --- layouts --------------------------------------------------------------------------------------


class LayoutError(Error, ValueError):
    """An annotation file (or the folder's layout) is malformed: the message names the file, the line
    where there is one, what is wrong and the fix."""

    def __init__(self, path: Union[str, os.PathLike], why: str, line: Optional[int] = None, fix: str = ""):
        self.path, self.line, self.why = os.fspath(path), line, why
        where = f"{self.path}, line {line}" if line is not None else self.path
        super().__init__(f"{where}: {why}" + (f". {fix}" if fix else ""))


class LayoutFileNotFoundError(LayoutError, FileNotFoundError):
    """A file the layout reads by name (an annotation file, an image set list) is missing: also a
    ``FileNotFoundError``, as torchvision's datasets raise for it (``CocoDetection``'s ``annFile``,
    ``VOCDetection``'s image set file, from ``open``)."""


class LayoutNotFoundError(LayoutError, RuntimeError):
    """The folder holds no tree of the layout (no ``VOCdevkit/VOC<year>``): also a ``RuntimeError``, as
    torchvision's ``VOCDetection`` raises ("Dataset not found or corrupted")."""


# --- opening, datasets and loading ----------------------------------------------------------------


class NothingToOpen(Error, FileNotFoundError):
    """:func:`open_dataset` found nothing to open: the path does not exist, is an empty folder (or one
    of hidden files only), or holds nothing it reads (the message lists what it holds). A
    ``FileNotFoundError``, as it always was."""


class OpenRefused(Error, TypeError):
    """:func:`open_dataset` was given an object that is neither a path nor a Hugging Face dataset (a
    torch ``Dataset``, say): the message names it and what to call instead. A ``TypeError``, as
    ``os.fspath`` of it was before. Also pack options it does not take, a ``TypeError`` as Python's
    for an unexpected keyword argument."""


class IndexTypeError(Error, TypeError, AttributeError):
    """``dataset[i]`` of a VOC drop-in with an ``i`` that is not an int (a slice): a ``TypeError``, and an
    ``AttributeError`` as torchvision's ``VOCDetection`` and ``VOCSegmentation`` raise for it (their
    ``__getitem__`` hands ``self.images[index]``, a list, to ``PIL.Image.open``)."""


class LoaderStateError(Error, ValueError):
    """:meth:`colabfast.DataLoader.load_state_dict` was given a state this loader cannot resume (of
    another version, or saved by a loader of another dataset length, batch size, ``num_workers`` or
    number of reader threads): the message says what differs and what to build."""


class SamplerRefused(Error, ValueError):
    """A sampler that cannot make an epoch (:class:`colabfast.BlockShuffleSampler`, or the one
    :class:`colabfast.DataLoader` builds): ``block_size`` below 1, a ``rank`` outside ``0 ..
    num_replicas - 1``, or ``drop_last`` with fewer samples than replicas (every rank would get none).
    A ``ValueError``, as it always was; the message says what to pass."""


class ExportRefused(Error, ValueError):
    """:func:`ultralytics_data` was given something it does not turn into a local YOLO tree (a YAML
    naming folders outside the dataset or a split the export lacks, an archive of another layout, a
    pose or classification export): the message names what was found and the call to make."""


class CacheLimitError(Error, ValueError):
    """A mirror streamed through a local cache (``open_dataset(..., to="stream", cache_limit=...)``,
    :mod:`colabfast.datasets.stream`) was given a ``cache_limit`` too small to hold what one batch of
    the epoch reads (the message gives the smallest limit that works), or more than the local disk's
    free space (the most that fits), or ``LOCAL_WORLD_SIZE`` is not a whole number."""
