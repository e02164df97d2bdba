"""Tools beside the data path: ``colabfast demo`` and ``colabfast bench``. Nothing in the library imports them."""
