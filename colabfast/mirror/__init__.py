"""The HDF5 mirror format: what :func:`colabfast.pack` writes and the datasets read, and its checks.

Specified in ``docs/mirror-format.md``: version 2, a sample table (imagefolder, kitti, files), and
versions 3 and 4, a mirror of columns. Any problem is one :class:`MirrorError` naming the file (and sample).
"""

from __future__ import annotations

from colabfast.errors import MirrorError
from colabfast.mirror.format import Header, attrs_crc32, header, header_crc32
from colabfast.mirror.index import Index, Stored, load_columns, load_index, read_order, read_paths, runs, write_array
from colabfast.mirror.safety import open_h5, read_h5, trust, vet
from colabfast.mirror.verify import MirrorInfo, check_columns, info, verify
from colabfast.where._fileio import file_version

__all__ = [
    "MirrorError",
    "MirrorInfo",
    "Index",
    "Stored",
    "info",
    "verify",
    "load_index",
    "load_columns",
    "check_columns",
    "read_paths",
    "read_order",
    "open_h5",
    "read_h5",
    "vet",
    "trust",
    "write_array",
    "Header",
    "header",
    "header_crc32",
    "attrs_crc32",
    "file_version",
    "runs",
]
