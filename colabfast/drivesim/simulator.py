"""A FUSE filesystem that mirrors a local folder and behaves like Google Drive in Colab: :class:`DriveSim`,
and the ``colabfast drivesim`` command (``python -m colabfast.drivesim``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, Any, Optional

from colabfast.drivesim.fs import (
    ORPHAN_GRACE,
    REPLY_TIMEOUT,
    START_TIMEOUT,
    DriveSimParams,
    _is_mounted,
    _unmount,
    available,
    serve,
)
from colabfast.errors import DriveSimError
from colabfast.where._fileio import PathLike, python_child

__all__ = ["DriveSim", "main"]


class DriveSim:
    """A simulated Google Drive: ``source`` mounted at ``mountpoint`` with Drive's latency and faults.

    Use it as a context manager (or :meth:`start` / :meth:`stop`). The FUSE server runs in a child
    process, which unmounts and exits if this process dies.

    Args:
        source: the folder to mirror; reads and writes pass through to it.
        mountpoint: an existing empty directory, or None for a fresh temporary one (removed on stop).
        params: how the simulated Drive behaves (default: :class:`DriveSimParams`'s defaults, 100 ms
            per open, 2 ms per read request, 60 MB/s, no faults).
        **changes: :class:`DriveSimParams` fields by name, over ``params``, e.g.
            ``DriveSim(src, open_ms=5, mbps=None, eio_read=0.01)``.

    Attributes:
        mountpoint: where the simulated Drive is mounted (absolute).
        source: the mirrored folder (absolute).
        params: the :class:`DriveSimParams` in force (:meth:`set` replaces it).

    Raises:
        TypeError: a name in ``changes`` that is not a :class:`DriveSimParams` field.
        ValueError: a parameter out of range, or ``source`` not a directory.
        DriveSimError: from :meth:`start` when FUSE is unusable or the mount fails.
    """

    def __init__(
        self,
        source: PathLike,
        mountpoint: Optional[PathLike] = None,
        params: Optional[DriveSimParams] = None,
        **changes: Any,
    ) -> None:
        self.source = Path(source).resolve()
        if not self.source.is_dir():
            raise ValueError(f"DriveSim source {self.source} is not a directory")
        self.params = dataclasses.replace(params or DriveSimParams(), **changes)
        self._own_mountpoint = mountpoint is None
        self.mountpoint = Path(
            tempfile.mkdtemp(prefix="colabfast-drivesim-") if mountpoint is None else mountpoint
        ).absolute()
        self._proc: Optional[subprocess.Popen] = None
        self._stderr: Optional[IO[bytes]] = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "mounted" if self._proc is not None else "stopped"
        return f"DriveSim({str(self.source)!r} at {str(self.mountpoint)!r}, {state}, {self.params})"

    def __enter__(self) -> DriveSim:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _command(self) -> list[str]:
        """The server's command line: this module's CLI plus the hidden ``--control`` flag."""
        run = "import runpy; runpy.run_module('colabfast.drivesim.simulator', run_name='__main__', alter_sys=True)"
        module = [*python_child(run), str(self.source), str(self.mountpoint)]  # not `-m`: it imports from the cwd
        return [*module, *self.params.argv(), "--control", str(os.getpid())]

    def start(self) -> DriveSim:
        """Mount and return once the mount is live.

        Raises:
            DriveSimError: FUSE is unusable here (the reason from :func:`available`), the mountpoint
                is taken, or the server failed (its messages are in the error).
        """
        if self._proc is not None:
            return self
        ok, why = available()
        if not ok:
            raise DriveSimError(f"cannot start the Drive simulator: {why}")
        if not self.mountpoint.exists():
            self.mountpoint.mkdir(parents=True)  # as the CLI does; stop() removes what it made
            self._own_mountpoint = True
        if not self.mountpoint.is_dir():
            raise DriveSimError(f"mountpoint {self.mountpoint} is not a directory")
        if os.path.ismount(self.mountpoint):
            raise DriveSimError(f"{self.mountpoint} is already a mountpoint; unmount it or pick another")
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            self._command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,  # a terminal's Ctrl-C is for us, not it
        )
        try:
            ready = self._reply(START_TIMEOUT, "mount")
            if not ready.get("ready") or not _is_mounted(self.mountpoint):
                raise DriveSimError(f"the Drive simulator did not mount {self.mountpoint}: {ready}")
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def pid(self) -> Optional[int]:
        """The server process's id while it runs (its CPU time is the simulated client's cost), else None."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        """Unmount (lazily when files are still open) and stop the server. Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if _is_mounted(self.mountpoint) and not _unmount(self.mountpoint):
                _unmount(self.mountpoint, lazy=True)  # busy: detach now, finish when files close
            if proc.stdin:
                proc.stdin.close()
            try:
                proc.wait(timeout=ORPHAN_GRACE + 5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if _is_mounted(self.mountpoint):  # the server died without unmounting
                _unmount(self.mountpoint, lazy=True)
        finally:
            if proc.stdout:
                proc.stdout.close()
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            if self._own_mountpoint:
                try:
                    self.mountpoint.rmdir()
                except OSError:
                    pass  # still detaching or not empty: leave it

    def _server_errors(self) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()[-2000:]

    def _reply(self, timeout: float, what: str) -> dict:
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise DriveSimError("the Drive simulator is not running; call start() first")
        readable, _, _ = select.select([proc.stdout], [], [], timeout)
        line = proc.stdout.readline() if readable else ""
        if not line:
            if readable:  # end of file: the server is exiting
                try:
                    status = f"exited with status {proc.wait(timeout=5)}"
                except subprocess.TimeoutExpired:
                    status = "closed its control channel"
            else:
                status = f"did not answer within {timeout:g} s"
            raise DriveSimError(
                f"the Drive simulator {status} during {what} of {self.mountpoint}; "
                f"its messages: {self._server_errors() or '(none)'}"
            )
        return json.loads(line)

    def _request(self, op: str, **args: Any) -> dict:
        with self._lock:
            proc = self._proc
            if proc is None or proc.stdin is None:
                raise DriveSimError("the Drive simulator is not running; call start() first")
            try:
                proc.stdin.write(json.dumps({"op": op, **args}) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                raise DriveSimError(
                    f"the Drive simulator exited; its messages: {self._server_errors()}"
                ) from None
            reply = self._reply(REPLY_TIMEOUT, op)
        if not reply.get("ok"):
            raise DriveSimError(f"the Drive simulator refused {op}: {reply.get('error')}")
        return reply

    def set(self, **params: Any) -> None:
        """Change ``open_ms``, ``read_ms``, ``mbps``, ``eio_open`` or ``eio_read`` now (units as in
        the constructor); requests already sleeping keep their old latency.

        Raises:
            ValueError: an unknown name or a value out of range.
        """
        new = self.params.with_live(**params)
        if self._proc is not None:
            self._request("set", params=params)
        self.params = new

    def disconnect(self, seconds: float = 0.0, requests: int = 0) -> None:
        """Fail every request with ENOTCONN from now for ``seconds`` seconds, as Drive does after hours,
        or the next ``requests`` requests (a disconnect that heals after a known number of tries)."""
        if seconds < 0 or requests < 0:
            raise ValueError(f"disconnect needs seconds >= 0 and requests >= 0; got {seconds}, {requests}")
        self._request("disconnect", seconds=seconds, requests=requests)

    def stats(self) -> dict[str, int]:
        """Counters since mount or :meth:`reset_stats`: ``opens`` (file opens and creates),
        ``opendirs``, ``reads`` (read requests), ``bytes_read``, ``writes``, ``bytes_written``,
        ``eio`` (injected EIO faults), ``enotconn`` (requests failed by a disconnect window) and
        ``enoent`` (opens of files just written that failed, ``enoent_fresh``)."""
        return {k: int(v) for k, v in self._request("stats")["stats"].items()}

    def reset_stats(self) -> None:
        """Set every counter of :meth:`stats` to 0."""
        self._request("reset_stats")


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``drivesim`` command's arguments to ``parser`` and return it."""
    parser.description = (
        "Mount SRC at MOUNTPOINT as a simulated Google Drive: every open waits, reads share one slow "
        "link, and faults can be injected. Runs in the foreground; Ctrl-C or SIGTERM unmounts."
    )
    parser.add_argument("source", metavar="SRC", help="folder to mirror (reads and writes pass through)")
    parser.add_argument(
        "mountpoint", metavar="MOUNTPOINT", help="empty directory to mount on (created if missing)"
    )
    DriveSimParams.add_arguments(parser)
    parser.add_argument("--control", type=int, default=None, help=argparse.SUPPRESS)  # DriveSim's child
    return parser


def cli(args: argparse.Namespace) -> int:
    """Run ``colabfast drivesim`` with parsed ``args``; returns the exit status."""
    ok, why = available()
    if not ok:
        print(f"drivesim: {why}", file=sys.stderr)
        return 1
    if not os.path.isdir(args.source):
        print(f"drivesim: {args.source} is not a directory", file=sys.stderr)
        return 1
    try:
        params = DriveSimParams.from_args(args)
    except ValueError as e:
        print(f"drivesim: {e}", file=sys.stderr)
        return 2
    os.makedirs(args.mountpoint, exist_ok=True)
    code = serve(args.source, args.mountpoint, params, parent=args.control)
    if code:
        print(
            f"drivesim: mounting {args.mountpoint} failed (libfuse error {code}); see the messages above",
            file=sys.stderr,
        )
    return code


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m colabfast.drivesim SRC MOUNTPOINT [options]``."""
    parser = build_parser(argparse.ArgumentParser(prog="python -m colabfast.drivesim"))
    return cli(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
