"""``colabfast.Error``: the base of every error colabfast raises on purpose.

Each colabfast error also keeps the standard base it always had (``MirrorError`` is a
``ValueError``, ``StageError`` an ``OSError``, ``DriveError`` a ``RuntimeError``, ...), so
``except OSError`` and friends still catch what they caught; ``except colabfast.Error`` catches all
of colabfast's own, and the ``colabfast`` command prints any of them as one line.
"""

from __future__ import annotations

__all__ = ["Error"]


class Error(Exception):
    """Base class of colabfast's errors; see :mod:`colabfast.errors`."""
