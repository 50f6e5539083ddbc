"""Feed any map-style `torch.utils.data.Dataset` by global sample position, so resume works at any size.

`DistributedSampler` splits the data by rank: after a resume at another world size the ranks' shares
change, and the epoch/offset bookkeeping repeats or skips samples. Here every step takes the global
samples [p, p+B) where p = `TrainState.samples_seen` and B = `TrainState.global_batch`; global position
q maps to dataset index `order(q)` (epoch q // len(dataset) visits the dataset in a permutation seeded
by (seed, epoch), or in order), and `state.slots_at` splits the step into micro-batches per rank. So
what a step trains on is a function of (seed, position) only, never of rank, world size or history:

    loader = GlobalBatchLoader(dataset, state, ctx, micro_batch=4)   # after ckpt.resume() or before
    for mb in loader.micro_batches():                                # this rank's share of this step
        with sync_gradients(model, mb.last), mb.rng():               # dropout keyed by the samples
            mb.scale_mean(model(mb.data).loss).backward()            # a loss that is a mean over mb
            # or: mb.scale_per_sample(per_sample_losses).backward()  # a vector, one loss per sample
    optim.step(); optim.zero_grad(); state.advance()

The loss: `mb.scale_mean(loss)` for a loss averaged over the micro-batch (nanoGPT's, Hugging Face
models'), `mb.scale_per_sample(losses)` for one loss per sample; both give sum(per-sample loss) / B
however the step was split. When the next step's micro-batches are asked for, the loader checks that
each micro-batch of the step before had its loss scaled through it (a helper, or a read of
`mb.loss_scale`, which multiplies a *sum* of per-sample losses), so `loss / grad_accum` raises
`LossScaleError` at once instead of training a run whose update depends on the world size (micro-batches
differ in size at another W). `check_scaling=False` turns the check off (e.g. a loop that only reads data).

Randomness: `mb.rng()` seeds the global RNG (CPU and the context's device) for the micro-step from
(seed, the micro-batch's first global sample position), and restores it after, so dropout masks are
the same after a resume and at any world size (micro-batches are the same sample groups at every W for a
fixed micro_batch). `mb.generator()` is a torch.Generator with that seed for explicit draws.

Streaming data (an `IterableDataset`) is refused: its position is a per-rank iterator state, which
cannot be replayed at another world size (the README's "Convert your script" says what to do instead).

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

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from resilient_trainer.dist import DistContext, require_context
from resilient_trainer.state import TrainState, mix_seed, slots_at

RNG_TAG = 0x52544A  # separates micro-batch randomness from the shuffle's (seed, epoch) stream


class LossScaleError(RuntimeError):
    """A micro-batch's loss was not scaled through it (or twice): the update would depend on the split."""


SCALE_FIX = ("scale each micro-batch's loss through it: mb.scale_mean(loss) for a loss that is a mean over "
             "the micro-batch (e.g. F.cross_entropy's default, nanoGPT's and Hugging Face models' loss), "
             "mb.scale_per_sample(losses) for one loss per sample, or sum(per-sample losses) * mb.loss_scale")


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


@dataclass
class MicroBatch:
    """One micro-step of this rank.

    `data`: what the DataLoader's collate_fn made of this micro-batch's samples (default collate: a batch
    of `micro_batch` rows, or 1 row for an empty slot; on the CPU unless `pin_memory`/your code moves it:
    `mb.data.to(ctx.device)`). `positions`: the global sample positions (empty for an empty slot).
    `weight`: 1, or 0 for an empty slot. `last`: reduce gradients in this backward
    (`sync_gradients(model, mb.last)`). Scale the loss with `scale_mean` / `scale_per_sample`, or multiply
    a *sum* of per-sample losses by `loss_scale` (= weight / global batch)."""

    data: Any
    positions: range
    weight: float
    _loss_scale: float
    last: bool
    seed: int = 0  # mix_seed(state seed, RNG_TAG, first position): this micro-batch's randomness
    device: torch.device | None = None
    _scaled: list[int] = field(default_factory=lambda: [0, 0], repr=False, compare=False)  # helpers, reads

    @property
    def loss_scale(self) -> float:
        """weight / global batch: multiplies a SUM of per-sample losses (use scale_mean for a mean)."""
        self._scaled[1] += 1
        return self._loss_scale

    @property
    def size(self) -> int:
        """Real samples in this micro-batch (0 for an empty slot, whose data holds one filler row)."""
        return len(self.positions)

    def scale_mean(self, loss: torch.Tensor) -> torch.Tensor:
        """`loss` averaged over this micro-batch's samples -> its share of sum(per-sample loss) / B."""
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise LossScaleError(f"scale_mean takes the micro-batch's mean loss (a 0-dim tensor), got "
                                 f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss)}; "
                                 "for one loss per sample use mb.scale_per_sample(losses)")
        self._scaled[0] += 1
        return loss * (self.size * self._loss_scale)

    def scale_per_sample(self, losses: torch.Tensor) -> torch.Tensor:
        """One loss per sample (a vector of len(data) rows) -> sum(per-sample loss) / B (0 for an empty slot)."""
        rows = max(self.size, 1)
        if not isinstance(losses, torch.Tensor) or losses.dim() != 1 or losses.shape[0] != rows:
            raise LossScaleError(f"scale_per_sample takes one loss per sample (shape ({rows},)), got "
                                 f"{tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses)}; "
                                 "for a loss averaged over the micro-batch use mb.scale_mean(loss)")
        self._scaled[0] += 1
        return losses.sum() * self._loss_scale

    def generator(self, device: torch.device | str | None = None) -> torch.Generator:
        """A generator seeded for this micro-batch: the same draws at any world size and after a resume."""
        return torch.Generator(device=device or "cpu").manual_seed(self.seed)

    @contextlib.contextmanager
    def rng(self) -> Iterator[None]:
        """Seed the global RNG (CPU and this rank's device) for this micro-step, restore it after: dropout
        and other draws from the global RNG are keyed by the samples, not by the rank or the history."""
        devices = [self.device.index or 0] if self.device is not None and self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(self.seed)
            yield


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
        check_scaling: bool = True,
        **loader_kwargs: Any,
    ) -> None:
        if ctx is not None:
            require_context(ctx, "GlobalBatchLoader")
        if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__"):
            raise TypeError("GlobalBatchLoader needs a map-style dataset (__len__ and __getitem__): a stream's "
                            "position is per-rank iterator state that cannot be replayed at another world size; "
                            "see the README's 'Convert your script', streaming data")
        if state.global_batch < 1:
            raise ValueError("set TrainState.global_batch before building the loader")
        self.dataset, self.state, self.micro_batch = dataset, state, micro_batch
        self.world_size = world_size if world_size is not None else (ctx.world_size if ctx else 1)
        self.rank = rank if rank is not None else (ctx.rank if ctx else 0)
        self.shuffle, self.collate_fn, self.loader_kwargs = shuffle, collate_fn, loader_kwargs
        self.check_scaling = check_scaling
        self.device = ctx.device if ctx is not None else None
        self._previous: tuple[list[MicroBatch], int] | None = None
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
        if self.check_scaling and self._previous:  # the step before: its micro-batches are all used by now
            check_scaled(*self._previous)
        yielded: list[MicroBatch] = []
        self._previous = (yielded, self.state.step)
        for m, positions in enumerate(plan):
            data = next(self._iter)
            weight = 1.0 if len(positions) else 0.0
            mb = MicroBatch(data, positions, weight, weight / batch, m == len(plan) - 1,
                            mix_seed(self.state.seed, RNG_TAG, positions.start), self.device)
            yielded.append(mb)
            yield mb
        self._next_position = position + batch


def check_scaled(micro_batches: list[MicroBatch], step: int) -> None:
    """Every micro-batch of the step had its loss scaled through it (LossScaleError). More than one helper
    call is fine: a main and an auxiliary loss are each scaled."""
    for m, mb in enumerate(micro_batches):
        helpers, reads = mb._scaled
        if helpers == 0 and reads == 0:
            raise LossScaleError(
                f"step {step}, micro-batch {m}: its loss was never scaled through the micro-batch. Dividing a "
                "mean loss by the number of micro-steps (`loss / grad_accum`) trains correctly only while "
                "every micro-batch has the same size, which a resume at another world size breaks; "
                f"{SCALE_FIX} (GlobalBatchLoader(check_scaling=False) turns this check off)")
