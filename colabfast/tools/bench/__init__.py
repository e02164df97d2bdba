"""``colabfast bench``: colabfast against what users would do instead, measured in one run.

One module per scenario, each a ``run(size, repeats, ...)`` function returning :class:`Result` rows:
``staging`` (Drive to local disk), ``epoch`` (images/s of an epoch, local and from Drive),
``packing`` (pack throughput and mirror size), ``gpufeed`` (data wait of ResNet-18 training, CUDA
only). ``peers`` holds the alternatives (WebDataset, LitData, MosaicML Streaming, Efficio, FFCV, SPDL),
each prepared and read the way its documentation shows. :mod:`colabfast.tools.bench.timing` times things
the same way everywhere (median of repeats, min, max); :mod:`colabfast.tools.bench.report` turns rows into
Markdown, JSON and a PNG chart with ratios measured within the run; :mod:`colabfast.tools.bench.cli` is the
``colabfast bench`` command.
"""
