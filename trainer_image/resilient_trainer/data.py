"""Feed any map-style `torch.utils.data.Dataset` by global sample position, so resume works at any size.

`DistributedSampler` splits the data by rank: after a resume at another world size the ranks' shares
change, and the epoch/offset bookkeeping repeats or skips samples. Here every step takes the global
samples [p, p+B) where p = `TrainState.samples_seen` and B = `TrainState.global_batch`; global position
q maps to dataset index `order(q)` (epoch q // len(dataset) visits the dataset in a permutation seeded
by (seed, epoch), or in order), and `state.slots_at` splits the step into micro-batches per rank. So
what a step trains on is a function of (seed, position) only, never of rank, world size or history:

    loader = GlobalBatchLoader(dataset, state, ctx, micro_batch=4)   # after ckpt.resume() or before
    for mb in loader.micro_batches():                                # this rank's share of this step
        with sync_gradients(model, mb.last):
            (per_sample_loss(model, mb.data).sum() * mb.loss_scale).backward()
    optim.step(); optim.zero_grad(); state.advance()

An *empty* micro-batch (a slot past B, when B is not a multiple of world size * micro batch) carries
one real sample and `weight == loss_scale == 0`: run forward/backward anyway so every rank issues the
same collectives. The plumbing is a plain `DataLoader` (batch_sampler = `StepSampler`), so
`num_workers`, `pin_memory` and `collate_fn` work as usual; its iterator is kept across steps and
rebuilt when the position jumps (a resume). Workers are forked by default, and a worker forked while
another thread holds a lock (an async checkpoint upload, a metrics exporter) can hang for good: pass
`multiprocessing_context="forkserver"` (the dataset and collate_fn must then pickle). Shuffling holds
one permutation of len(dataset) int64s per rank (8 bytes per sample); pass `shuffle=False` for a
dataset that is already shuffled on disk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState, mix_seed, slots_at


class GlobalOrder:
    """Global sample position -> dataset index: one permutation per epoch, seeded by (seed, epoch)."""

    def __init__(self, size: int, seed: int, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError("the dataset is empty")
        self.size, self.seed, self.shuffle = size, seed, shuffle
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def __call__(self, position: int) -> int:
        epoch, offset = divmod(position, self.size)
        if not self.shuffle:
            return offset
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(mix_seed(self.seed, epoch))
            self._epoch, self._perm = epoch, torch.randperm(self.size, generator=g)
        return int(self._perm[offset])


class StepSampler(Sampler[list[int]]):
    """A DataLoader `batch_sampler`: this rank's micro-batches of dataset indices, step after step from
    global position `start`, without end. An empty slot yields the step's first sample as filler."""

    def __init__(
        self, order: GlobalOrder, start: int, global_batch: int, world_size: int, rank: int, micro_batch: int
    ) -> None:
        self.order, self.start, self.global_batch = order, start, global_batch
        self.world_size, self.rank, self.micro_batch = world_size, rank, micro_batch

    def plan(self, position: int) -> list[range]:
        return slots_at(position, self.global_batch, self.world_size, self.rank, self.micro_batch)

    def __iter__(self) -> Iterator[list[int]]:
        position = self.start
        while True:
            for positions in self.plan(position):
                yield [self.order(q) for q in positions] or [self.order(position)]
            position += self.global_batch


@dataclass(frozen=True)
class MicroBatch:
    """One micro-step of this rank: `data` as collated; `positions` the global sample positions (empty
    for an empty slot); scale the summed per-sample loss by `loss_scale` (= weight / global batch)."""

    data: Any
    positions: range
    weight: float
    loss_scale: float
    last: bool  # reduce gradients in this backward (sync_gradients(model, mb.last))


class GlobalBatchLoader:
    """This rank's micro-batches of the step at `state.samples_seen`; B and the seed come from `state`."""

    def __init__(
        self,
        dataset: Dataset,
        state: TrainState,
        ctx: DistContext | None = None,
        *,
        micro_batch: int,
        world_size: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **loader_kwargs: Any,
    ) -> None:
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError("GlobalBatchLoader needs a map-style dataset (__len__ and __getitem__)")
        if state.global_batch < 1:
            raise ValueError("set TrainState.global_batch before building the loader")
        self.dataset, self.state, self.micro_batch = dataset, state, micro_batch
        self.world_size = world_size if world_size is not None else (ctx.world_size if ctx else 1)
        self.rank = rank if rank is not None else (ctx.rank if ctx else 0)
        self.shuffle, self.collate_fn, self.loader_kwargs = shuffle, collate_fn, loader_kwargs
        self._iter: Iterator[Any] | None = None
        self._next_position: int | None = None
        self._key: tuple[int, int] | None = None

    def _restart(self, position: int) -> None:
        order = GlobalOrder(len(self.dataset), self.state.seed, self.shuffle)
        sampler = StepSampler(
            order, position, self.state.global_batch, self.world_size, self.rank, self.micro_batch
        )
        loader = DataLoader(self.dataset, batch_sampler=sampler, collate_fn=self.collate_fn, **self.loader_kwargs)
        self._iter = iter(loader)
        self._key = (self.state.global_batch, self.state.seed)

    def micro_batches(self) -> Iterator[MicroBatch]:
        """Yield this rank's micro-batches for the step starting at `state.samples_seen` (call once per
        step, then `state.advance()`); a jump in position restarts the underlying DataLoader."""
        position, batch = self.state.samples_seen, self.state.global_batch
        if position != self._next_position or self._key != (batch, self.state.seed):
            self._restart(position)
        self._next_position = None  # until the step is fully consumed
        assert self._iter is not None
        plan = slots_at(position, batch, self.world_size, self.rank, self.micro_batch)
        for m, positions in enumerate(plan):
            data = next(self._iter)
            weight = 1.0 if len(positions) else 0.0
            yield MicroBatch(data, positions, weight, weight / batch, m == len(plan) - 1)
        self._next_position = position + batch
