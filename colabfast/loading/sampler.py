"""Shuffle an h5 mirror in blocks of consecutively stored items: :class:`BlockShuffleSampler`.

Cold random reads are slow; blocks keep one block's reads close in the file (FFCV's quasi-random order,
WebDataset's shard shuffle). How it works: [Feeding the GPU](../gpu-feed.md#how-it-works).
"""

from __future__ import annotations

import math
from typing import Iterator, Optional, Sized

import numpy as np
import torch
from numpy.typing import NDArray
from torch.utils.data import Sampler

from colabfast.datasets.dropins import read_order
from colabfast.errors import SamplerRefused

__all__ = ["BlockShuffleSampler", "block_shuffle", "replica_share", "check_shares", "world", "shared_seed",
           "SamplerRefused"]


def world() -> tuple[int, int]:
    """``(num_replicas, rank)`` of ``torch.distributed``'s default group when initialised, else ``(1, 0)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


def shared_seed(generator: Optional[torch.Generator] = None) -> int:
    """A sampler's seed drawn from ``generator`` (else torch's global RNG) as ``RandomSampler`` draws its own.

    Under ``torch.distributed`` every rank draws and takes rank 0's seed (``broadcast_object_list``, a
    collective: every rank must call this in the same order).

    Returns:
        an int in ``[-2**63, 2**63)``, the same on every rank.
    """
    seed = int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())
    if world()[0] > 1:
        seeds = [seed]
        torch.distributed.broadcast_object_list(seeds, src=0)
        seed = int(seeds[0])
    return seed


def block_shuffle(num_samples: int, block_size: int, seed: int, epoch: int) -> NDArray[np.int64]:
    """One epoch's order: blocks of ``block_size`` consecutive indices in random order, each shuffled.

    Args:
        num_samples: indices ``0 .. num_samples - 1`` are ordered; the last block may be shorter.
        block_size: consecutive indices per block (1 gives a plain random permutation).
        seed: the sampler's seed, any int64 (taken modulo 2**64); with ``epoch`` it fixes the order.
        epoch: the epoch (at least 0); each epoch gets an independent order.

    Returns:
        int64 array of shape ``[num_samples]``, a permutation of ``arange(num_samples)``.
    """
    if block_size < 1:
        raise SamplerRefused(f"block_size must be at least 1, got {block_size}")
    rng = np.random.default_rng([seed % 2**64, epoch])  # NumPy takes no negative seed
    num_blocks = math.ceil(num_samples / block_size)
    block_rank = np.empty(num_blocks, dtype=np.int64)
    block_rank[rng.permutation(num_blocks)] = np.arange(num_blocks)
    # Sort items by (rank of their block, a random key): blocks in random order, items shuffled in each.
    items_block = np.arange(num_samples, dtype=np.int64) // block_size
    return np.lexsort((rng.random(num_samples), block_rank[items_block])).astype(np.int64)


def replica_share(order: NDArray[np.int64], num_replicas: int, rank: int, drop_last: bool = False) -> NDArray[np.int64]:
    """The contiguous share of ``order`` that replica ``rank`` of ``num_replicas`` reads.

    Padded by repeating its start (or, with ``drop_last``, truncated) to a multiple of ``num_replicas``, as
    ``torch/utils/data/distributed.py`` does, but each replica gets a contiguous slice, so it reads whole blocks.

    Returns:
        int64 array of ``ceil(len(order) / num_replicas)`` indices (``floor`` with ``drop_last``).
    """
    n = len(order)
    if drop_last:
        per_replica = n // num_replicas
        order = order[: per_replica * num_replicas]
    else:
        per_replica = math.ceil(n / num_replicas) if n else 0
        padding = per_replica * num_replicas - n
        if padding:
            order = np.concatenate([order, np.resize(order, padding)])
    return order[rank * per_replica : (rank + 1) * per_replica]


def check_shares(num_samples: int, num_replicas: int, rank: int, drop_last: bool) -> None:
    """Refuse replica shares that make no epoch.

    Raises:
        SamplerRefused: ``rank`` outside ``0 .. num_replicas - 1``, or ``drop_last`` with fewer than
            ``num_replicas`` samples.
    """
    if num_replicas < 1 or not 0 <= rank < num_replicas:
        raise SamplerRefused(f"need 0 <= rank < num_replicas, got rank={rank}, num_replicas={num_replicas}")
    if drop_last and 0 < num_samples < num_replicas:
        raise SamplerRefused(f"drop_last=True shares {num_samples} samples among {num_replicas} replicas, which "
                             f"leaves every replica none: pass drop_last=False (the shares are then padded by "
                             f"repeating samples, as DistributedSampler pads them), or use fewer replicas")


class BlockShuffleSampler(Sampler[int]):
    """Sampler that shuffles blocks of consecutively stored samples, and the samples in each block.

    Batches mix about ``batch_size / block_size`` blocks: on a class-sorted mirror, pack with ``shuffle=True``
    or keep ``block_size`` well below the batch size (:class:`colabfast.DataLoader` does one or the other).

    Args:
        data_source: the dataset; for a mirror or a ``Subset`` of one, blocks follow its stored order
            (:func:`colabfast.datasets.dropins.read_order`), else consecutive indices.
        block_size: consecutive stored samples per block.
        shuffle: False reads in stored order, front to back (each replica its contiguous share).
        seed: fixes every epoch's order together with the epoch; every replica must use the same.
        num_replicas: processes sharing the epoch; default the ``torch.distributed`` world size, else 1.
        rank: which share this process reads; default this process's rank, else 0.
        drop_last: truncate the order to a multiple of ``num_replicas`` instead of padding it.

    Call :meth:`set_epoch` before each epoch (as with ``DistributedSampler``); if it is never called,
    each new iteration advances the epoch.

    Raises:
        SamplerRefused: ``block_size < 1``; ``rank`` outside ``0 .. num_replicas - 1``; ``drop_last`` with
            fewer samples than replicas.
    """

    def __init__(
        self,
        data_source: Sized,
        block_size: int = 64,
        *,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: Optional[int] = None,
        rank: Optional[int] = None,
        drop_last: bool = False,
    ) -> None:
        replicas, this_rank = world()
        num_replicas = replicas if num_replicas is None else num_replicas
        rank = this_rank if rank is None else rank
        if block_size < 1:
            raise SamplerRefused(f"block_size must be at least 1, got {block_size}")
        check_shares(len(data_source), num_replicas, rank, drop_last)
        self.data_source = data_source
        self.stored = read_order(data_source)  # the dataset's indices in stored order; None: 0..n-1
        self.block_size = block_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.drop_last = drop_last
        self.epoch = 0
        self._epoch_set = False

    def set_epoch(self, epoch: int) -> None:
        """Use ``epoch``'s order for the next iterations (same epoch, same order)."""
        self.epoch = epoch
        self._epoch_set = True

    def order(self, epoch: int) -> NDArray[np.int64]:
        """This replica's indices for ``epoch``, as an int64 array."""
        n = len(self.data_source)
        full = block_shuffle(n, self.block_size, self.seed, epoch) if self.shuffle else np.arange(n, dtype=np.int64)
        if self.stored is not None:  # ranks in stored order -> the dataset's indices
            full = self.stored[full]
        return replica_share(full, self.num_replicas, self.rank, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        epoch = self.epoch
        if not self._epoch_set:
            self.epoch += 1
        return iter(self.order(epoch).tolist())

    def __len__(self) -> int:
        n = len(self.data_source)
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def __repr__(self) -> str:
        replicas = f", rank={self.rank}/{self.num_replicas}" if self.num_replicas > 1 else ""
        return f"BlockShuffleSampler(n={len(self.data_source)}, block_size={self.block_size}{replicas})"
