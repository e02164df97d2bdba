"""``colabfast bench``: colabfast against what users would do instead, measured in one run.

One module per scenario (``staging``, ...), each a function returning :class:`Result` rows;
:mod:`colabfast.bench.timing` times things the same way everywhere (median of repeats, min, max),
and every figure a scenario reports is a ratio against a baseline measured in the same run.
"""
