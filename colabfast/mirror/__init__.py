"""The HDF5 mirror format: what :func:`colabfast.pack` writes and the datasets read, and its checks.

A mirror is one HDF5 file holding a whole dataset, so Drive serves one big file instead of thousands
of small ones: version 2, a sample table (imagefolder, kitti, files), and versions 3 and 4, a mirror
of columns (any dataset, the layouts of :mod:`colabfast.layouts`; 4 where a column holds None), every
dataset contiguous, unfiltered and checksummed. The format is specified once, in
``docs/mirror-format.md`` (the groups, datasets and attributes of each version, the checksums, and
what is checked before a mirror from a stranger is trusted); this module is its implementation:
:class:`Header` reads and writes the root attributes, :func:`load_columns` a mirror of columns,
:func:`colabfast.images.decode.check_encoded` an encoded image's header. Any problem is one
:class:`MirrorError` naming the file (and the sample)."""

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
