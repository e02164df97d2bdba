"""Staging an archive: extracted once, safely (:mod:`colabfast.staging.extract`), into a recorded folder."""

from __future__ import annotations

import errno
import functools
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Union

from colabfast.errors import StageRefused
from colabfast.staging.copy import _SourceChanged, same_identity, sha256_of  # noqa: I001
from colabfast.staging.destination import (
    RECORD,
    adopt_legacy_record,
    check_space,
    is_ours,
    manifest_path,
    new_manifest,
    say_up_to_date,
)
from colabfast.staging.extract import extract, extracted_size, links_under
from colabfast.where._fileio import (
    partial_path,
    read_json,
    retry,
    write_json_atomic,
)

if TYPE_CHECKING:
    from colabfast.staging.destination import StageOptions

__all__: list[str] = []  # internal to colabfast.staging: nothing here is public

# --- archives --------------------------------------------------------------------------------------


def stage_archive(archives: list[Path], dst: Path, opts: StageOptions) -> Path:
    """Extract ``archives`` (one, or several making one dataset) into ``.NAME.colabfast-partial`` beside the
    folder ``dst`` (resumable after an interrupt or a read error), renamed to ``dst`` when complete.
    """
    from tqdm.auto import tqdm

    retries = opts.retries
    stats = [retry(functools.partial(os.stat, a), retries) for a in archives]
    identity = [[str(a), st.st_size, st.st_mtime_ns] for a, st in zip(archives, stats)]
    source = str(archives[0]) if len(archives) == 1 else [str(a) for a in archives]
    adopt_legacy_record(dst)
    old = read_json(manifest_path(dst)) or {}
    mine = is_ours(old) and old.get("source") == source
    if mine and old.get("complete") and old.get("archive") == identity and dst.is_dir():
        if opts.verify != "sha256" or _hashes_match(dst, old.get("sha256") or {}):
            say_up_to_date(dst, opts)
            return _staged_root(dst, old)
    if not mine:
        _refuse_or_clear_archive(dst, source, old, opts)

    check_space(sum(retry(functools.partial(extracted_size, a), retries) for a in archives), dst, archives[0])
    work = partial_path(dst)
    progress_record = work / RECORD  # what the partial extraction holds
    if work.exists() and (read_json(progress_record) or {}).get("archive") != identity:
        shutil.rmtree(work)  # other archives, or another version of them: start over
    work.mkdir(parents=True, exist_ok=True)
    write_json_atomic(progress_record, new_manifest(source, False, archive=identity))
    done = 0
    with tqdm(total=sum(st.st_size for st in stats), unit="B", unit_scale=True,
              desc=f"extract {', '.join(a.name for a in archives)}", disable=not opts.progress) as bar:
        def advance(base: int, n: int) -> None:  # n bytes read of the archive that starts at base
            bar.update(base + n - bar.n)

        for archive, st in zip(archives, stats):
            try:
                extract(archive, work, allow_links=opts.allow_links, retries=retries,
                        on_progress=functools.partial(advance, done))
                if not same_identity(retry(functools.partial(os.stat, archive), retries), st):
                    raise _SourceChanged(archive, "extracted")  # what was extracted may be torn
            except BaseException as exc:
                if not _resumable(exc):
                    shutil.rmtree(work, ignore_errors=True)
                raise
            done += st.st_size
    # An archive holding one folder named like dst (other.tar.gz holding other/) becomes dst itself,
    # not dst/other; with links it stays as it is (a link may lead through that folder's name).
    top = _single_top_folder(work)
    hoist = top != work and top.name == dst.name and not (top / RECORD).exists() and \
        next(links_under(top), None) is None
    root = top if hoist else work
    hashes = None
    if opts.verify == "sha256":
        hashes = {p.relative_to(root).as_posix(): sha256_of(p) for p in sorted(root.rglob("*"))
                  if p.is_file() and not p.is_symlink() and p != progress_record}
    returned = "" if hoist or top == work else top.name
    write_json_atomic(root / RECORD, new_manifest(source, True, archive=identity, sha256=hashes, top=returned))
    if dst.exists():
        shutil.rmtree(dst)  # an older staged version of these archives
    os.replace(root, dst)
    if hoist:
        shutil.rmtree(work)  # now only its progress record
    return dst / returned


def _resumable(exc: BaseException) -> bool:
    """Whether a partial extraction ``exc`` stopped is kept for a re-run: after an interrupt or a read error only."""
    if isinstance(exc, KeyboardInterrupt):
        return True
    return isinstance(exc, OSError) and not isinstance(exc, _SourceChanged) and exc.errno != errno.ENOSPC


def _refuse_or_clear_archive(dst: Path, source: Union[str, list], old: dict, opts: StageOptions) -> None:
    names = source if isinstance(source, str) else ", ".join(source)
    if not dst.exists() or (dst.is_dir() and not any(dst.iterdir())):
        return
    if not opts.overwrite:
        if is_ours(old):
            raise StageRefused(f"{dst} was staged from {old.get('source')}, not {names}: staging there would mix "
                             f"two datasets. Pass another dst, or overwrite=True to replace it.")
        entries = sorted(os.listdir(dst)) if dst.is_dir() else []
        held = f", and it holds {', '.join(entries[:5])}" + (f" and {len(entries) - 5} more" if len(entries) > 5
                                                              else "") if entries else ""
        raise StageRefused(f"{dst} already exists and was not staged from {names}{held}: nothing was written. "
                         f"Remove it, pass another dst, or pass overwrite=True to replace it.")
    # overwrite: the finished extraction replaces dst as a whole (see stage_archive)


def _hashes_match(root: Path, hashes: dict[str, str]) -> bool:
    return all((root / rel).is_file() and sha256_of(root / rel) == digest for rel, digest in hashes.items())


def _staged_root(dst: Path, record: dict) -> Path:
    """The path a finished stage of archives to ``dst`` returned, as its record says."""
    top = record.get("top")
    if isinstance(top, str) and "/" not in top and top not in (".", "..") and (dst / top).is_dir():
        return dst / top
    return _single_top_folder(dst)  # recorded before colabfast said, or no longer there


def _single_top_folder(root: Path) -> Path:
    entries = [p for p in root.iterdir() if p.name != RECORD]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink() else root
