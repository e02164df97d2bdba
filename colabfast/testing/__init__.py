"""Tools for testing and demonstrating colabfast without Colab: a FUSE simulator of Google Drive
(:mod:`colabfast.testing.drivesim`), a stand-in for ``google.colab`` (:func:`colab_shim`) and small
real datasets (:mod:`colabfast.testing.data`)."""

from colabfast.testing.colab import colab_shim

__all__ = ["colab_shim"]
