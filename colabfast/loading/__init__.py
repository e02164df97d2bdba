"""A drop-in ``torch.utils.data.DataLoader`` that keeps the GPU fed: :class:`DataLoader`, :func:`plan`.

Change ``torch.utils.data.DataLoader`` to ``colabfast.DataLoader`` and the loader picks tuned defaults
for the machine (workers, pinned memory, persistent workers, prefetch depth, a block-shuffling sampler
for h5 mirrors), batches images as uint8, and, on a GPU, copies and normalises them ahead on
a side CUDA stream in a feeder thread (:mod:`colabfast.loading.prefetch`), decoding JPEG bytes with nvJPEG
(:mod:`colabfast.images.decode`), with the uint8 collate of :mod:`colabfast.loading.collate`. Every choice is made
by :func:`plan`, a pure function, from the dataset's facts (:func:`dataset_facts`, found once), and
kept as ``loader.plan``, listed in ``loader.choices`` and ``repr(loader)``; nothing overrides an
argument the caller passed. ``loader.stage_times()`` says where the loader's time goes (read,
decode+transform, collate, copy to the GPU, the training loop's wait: :mod:`colabfast.loading.stages`);
``loader.state_dict()`` where it stands mid-epoch, for a new runtime to resume from
(:mod:`colabfast.loading.resume`)."""

from __future__ import annotations

from colabfast.loading.loader import DataLoader
from colabfast.loading.planning import BlockPlan, DatasetFacts, Plan, ReaderPlan, ShardPlan, plan

__all__ = ["DataLoader", "plan", "Plan", "BlockPlan", "ShardPlan", "ReaderPlan", "DatasetFacts"]
