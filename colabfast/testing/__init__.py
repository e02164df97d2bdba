"""Tools for testing and demonstrating colabfast without Colab: a stand-in for ``google.colab``
(:func:`colab_shim`) and small real datasets (:mod:`colabfast.testing.data`). The FUSE simulator of
Google Drive they are used with is part of the package: :mod:`colabfast.drivesim.simulator`."""

from colabfast.testing.colab import colab_shim

__all__ = ["colab_shim"]
