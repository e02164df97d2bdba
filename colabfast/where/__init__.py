"""Where colabfast runs: the machine (:mod:`~colabfast.where.env`), its mount table, Drive's local stand-in,
a RAM disk (:mod:`~colabfast.where.tmpfs`), and file I/O that survives a flaky mount."""
