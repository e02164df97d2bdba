"""Tools for testing and demonstrating colabfast without Colab: a FUSE simulator of Google Drive
(:mod:`colabfast.testing.drivesim`), a stand-in for ``google.colab`` and small real datasets
(:mod:`colabfast.testing.data`)."""
