"""Staging that starts before the fingerprint is known: :class:`_Early` copies the likeliest mirror while
the source is listed, and keeps the copy only if the fingerprint agrees.
"""

from __future__ import annotations

import contextlib
import glob
import os
import threading
import time
from pathlib import Path
from typing import Any, Optional

from colabfast.opening.mirrors import _look_at, _seconds
from colabfast.staging.extract import strip_archive_suffix
from colabfast.where import env
from colabfast.where._fileio import (
    file_version,
    human_bytes,
    retry,
    unchanged,
)

__all__: list[str] = []  # internal to colabfast.opening: nothing here is public


class _Early:
    """Stages the newest mirror of a source in its mirrors folder while :func:`open_dataset` lists the
    source, which is what says whether that mirror is still the source's: in a new runtime the mirror
    usually is, and its copy then starts a listing's time earlier (on the Drive simulator, 0.4 s of
    2000 images in 10 folders). The copy on Drive is vetted (:func:`colabfast.mirror.safety.vet`) at the same
    time, so its staged copy, the same bytes (stage copies a file again when it changes during the
    copy), needs no second vetting. When the listing names another mirror (the source changed, or
    other options), the copy is cancelled before anything is packed.
    """

    def __init__(self, src: Path, folder: Path, to: str, progress: bool, split: Optional[str] = None,
                 layout: Optional[str] = None):
        self.candidate: Optional[Path] = None
        self.local: Optional[Path] = None
        self.vetted: Optional[tuple[int, ...]] = None  # the version of the Drive copy that was vetted
        self.error: Optional[BaseException] = None
        self.seconds = 0.0
        self.copied: Optional[int] = None  # files the stage copied (colabfast.staging.copy.copied_last)
        self.before: Any = None  # _before_staging's, for the account
        self.chosen, self.cancel = threading.Event(), threading.Event()
        self.copying = threading.Event()  # set once the copy is under way (or there is none)
        self.imported = threading.Event()  # set once this thread imported what it uses (see _run)
        self._thread = threading.Thread(target=self._run, args=(src, folder, to, progress, split, layout),
                                        daemon=True, name="colabfast-open-stage")
        self._thread.start()

    @classmethod
    def start(cls, src: Path, folder: Path, to: str, progress: bool, split: Optional[str] = None,
              layout: Optional[str] = None) -> Optional[_Early]:
        """Start staging the newest mirror of ``src`` in ``folder`` (of ``split`` and ``layout``, where
        given: see :meth:`_fits`), where that is a slow mount (a mirror on local disk is opened where
        it is); None where there is nothing to start."""
        if to == "stream" or (env.drive_kind(folder) is None and not env.is_fuse(folder)):
            return None
        early = cls(src, folder, to, progress, split, layout)
        early.imported.wait()  # the caller imports more next (see _run)
        return early

    MAX_LOOKED_AT = 4  # headers read (a round trip or more each on Drive) to find the mirror of a split

    def _run(self, src: Path, folder: Path, to: str, progress: bool, split: Optional[str],
             layout: Optional[str]) -> None:
        # Imported before the caller imports anything more: two threads importing the same package at
        # once can deadlock in importlib (a _DeadlockError in one of them, seen under load), so the
        # caller waits for `imported`, and the vetting thread finds these loaded.
        try:
            import colabfast.mirror  # noqa: F401 (the vetting's: colabfast.mirror.safety)
            from colabfast.staging.copy import copied_last
            from colabfast.staging.pipeline import stage
        finally:
            self.imported.set()
        try:
            stem = glob.escape(strip_archive_suffix(src.name))
            found = sorted(((p.stat().st_mtime_ns, p) for p in folder.glob(f"{stem}-*.h5")), reverse=True)
            if split is None and layout is None:  # the newest, as its name says nothing more (one listing)
                self.candidate = found[0][1] if found else None
            else:  # the source's other splits and layouts are siblings in this folder: not staged
                self.candidate = next((p for _, p in found[: self.MAX_LOOKED_AT]
                                       if not self.cancel.is_set() and self._fits(p, split, layout)), None)
            self.chosen.set()
            if self.candidate is None or self.cancel.is_set():
                return
            start = time.perf_counter()
            candidate = self.candidate
            before = file_version(os.stat(candidate))
            vetting = threading.Thread(target=self._vet, args=(candidate, before), daemon=True,
                                       name="colabfast-open-vet")
            vetting.start()  # a child process reading the metadata, while the bytes are copied
            try:
                self.before = _before_staging(candidate, to)
                self.copying.set()
                self.local = stage(candidate, to=to, progress=progress, cancel=self.cancel)
                self.seconds, self.copied = time.perf_counter() - start, copied_last()
            finally:
                vetting.join()
        except BaseException as exc:  # noqa: BLE001 (reported by take(), or the normal path raises it again)
            self.error = exc
        finally:
            self.chosen.set()
            self.copying.set()

    @staticmethod
    def _fits(path: Path, split: Optional[str], layout: Optional[str]) -> bool:
        """Whether the mirror at ``path`` may be the one asked for: of ``layout`` (None: any), and of
        ``split`` or of no recorded split (KITTI's, whose mirror holds both, or one made before
        colabfast recorded splits)."""
        m = _look_at(path)
        return (m is not None and m.header is not None and m.header.split in (None, split)
                and layout in (None, m.header.layout))

    def _vet(self, candidate: Path, before: tuple[int, ...]) -> None:
        self.copying.wait()  # reading the metadata holds the GIL at times: the copy starts first
        self.vetted = vetted_version(candidate, before)

    def expect(self, mirror: Path) -> None:
        """The listing says the mirror is ``mirror``: a copy of any other stops now."""
        self.chosen.wait()
        self.wanted = self.candidate == mirror
        self.stop()

    wanted = False  # the listing named the mirror this stages

    def stop(self) -> None:
        """Cancel the copy and wait for the thread, unless the listing named the mirror it stages."""
        if not self.wanted:
            self.cancel.set()
            self._thread.join()

    def take(self, mirror: Path, steps: list[str]) -> Optional[Path]:
        """The staged copy of ``mirror`` if this is what it staged (trusted when the Drive copy it was
        copied from is the version vetted), else None (the caller stages it)."""
        from colabfast.mirror.safety import trust

        if not self.wanted or self.candidate != mirror:
            self.stop()
            return None
        self._thread.join()
        if self.error is not None or self.local is None:
            return None  # staging it again says what is wrong, as it would have without this
        try:
            if self.vetted is not None and file_version(os.stat(mirror)) == self.vetted:
                trust(self.local)  # the same bytes as the vetted copy on Drive
        except OSError:
            return None
        steps.append(_staging_words(self.local, self.before, self.seconds, ", begun while the source was listed",
                                    self.copied))
        return self.local




def vetted_version(mirror: Path, before: tuple[int, ...]) -> Optional[tuple[int, ...]]:
    """``before`` (a :func:`~colabfast.where._fileio.file_version`) where the mirror at ``mirror`` passes
    :func:`colabfast.mirror.safety.vet` and is still that version afterwards, else None. Run while the
    mirror is staged: a staged copy of that version holds the same bytes (stage copies a file again when
    it changes during the copy), so it can be trusted (:func:`colabfast.mirror.safety.trust`) instead of
    vetted again after the copy, in a child process on the critical path (0.3-0.5 s on 2 CPUs)."""
    from colabfast.errors import MirrorError
    from colabfast.mirror.safety import vet

    try:
        vet(mirror)
        return before if file_version(os.stat(mirror)) == before else None
    except (MirrorError, OSError):
        return None  # not vetted: the staged copy is vetted when it is opened, and fails there


def _before_staging(mirror: Path, to: str) -> tuple[os.stat_result, Any, Optional[os.stat_result]]:
    """What :func:`_staging_words` compares with: the mirror's stat, where stage will put it and why,
    and what is there now."""
    from colabfast.staging.destination import default_destination

    st = retry(lambda: os.stat(mirror), 5)
    chosen = default_destination(mirror.name, st.st_size, to, single=True)
    there = None
    if chosen.path is not None:
        with contextlib.suppress(FileNotFoundError):
            there = os.stat(chosen.path)
    return st, chosen, there


def _staging_words(local: Path, before: tuple[os.stat_result, Any, Optional[os.stat_result]], took: float,
                   extra: str = "", copied: Optional[int] = None) -> str:
    """The account's line for a stage of the mirror to ``local``; ``copied``: the files that stage copied
    (:func:`colabfast.staging.copy.copied_last`), None where unknown."""
    st, chosen, there = before
    place = "the RAM disk" if env.is_ram(local) else "local disk"
    there_before = chosen.path == local and unchanged(there, st.st_size, st.st_mtime_ns)
    if there_before or (copied == 0 and chosen.path != local):
        return f"already staged to {place} at {local}: nothing copied"
    if copied == 0:  # not there before, up to date once the stage lock was this process's: another staged it
        return (f"staged to {place} at {local} by another process (another rank under torchrun) while this one "
                f"waited {_seconds(took)} for its lock: nothing copied")
    rate = f", {st.st_size / took / 1e6:.0f} MB/s" if took > 0.1 else ""
    return f"staged to {place} at {local} in {_seconds(took)} ({human_bytes(st.st_size)}{rate}; {chosen.why}){extra}"
