"""Makes notebooks/conftest.py import as ``notebooks.conftest``, so it does not take the place of
``tests/conftest.py`` (which tests import as ``conftest``) when pytest runs ``tests notebooks`` together."""
