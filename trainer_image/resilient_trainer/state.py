"""Training state beyond model/optimizer, and the constant-global-batch schedule.

Everything a different world size needs to replay the same run is defined *globally*:
- a step consumes global samples [p, p+B) where p = `samples_seen`, the global sample position
  (= step*B while B never changed; B = global batch, recorded in every checkpoint);
- with W ranks and micro-batch b, each step runs accumulation = ceil(B / (W*b)) micro-steps; micro-step
  m on rank r takes slot m*W + r, i.e. positions p + [slot*b, slot*b + b) clipped to B (a slot past B
  is *empty*: the rank still runs forward/backward, with weight 0, so collectives stay matched);
- the loss is sum(per-sample loss) / B and gradients are summed across micro-steps and ranks;
- randomness is a pure function of (seed, global sample index) or (seed, step), never of rank or of a
  generator's history, so there is no RNG state to checkpoint beyond the seed.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

_MIX = 0x9E3779B97F4A7C15  # splitmix64 increment
_MASK = (1 << 63) - 1  # torch.Generator.manual_seed wants a non-negative int64


@dataclass
class TrainState:
    """Saved with every checkpoint (DCP stores the ints as bytes items); implements DCP's Stateful."""

    step: int = 0  # optimizer steps completed
    samples_seen: int = 0  # global sample position: step * global_batch
    seed: int = 0
    global_batch: int = 0

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("step", "samples_seen", "seed", "global_batch"):
            setattr(self, key, int(state[key]))

    def advance(self) -> None:
        """One optimizer step done: the step count and the global sample position move together."""
        if self.global_batch < 1:
            raise ValueError("TrainState.global_batch must be set (>= 1) before training")
        self.step += 1
        self.samples_seen += self.global_batch


def mix_seed(*parts: int) -> int:
    """A splitmix64-style hash of integers: independent streams per (seed, index) without rank."""
    x = 0
    for p in parts:
        x = (x + _MIX + (p & ((1 << 64) - 1))) & ((1 << 64) - 1)
        x ^= x >> 30
        x = (x * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
        x ^= x >> 27
        x = (x * 0x94D049BB133111EB) & ((1 << 64) - 1)
        x ^= x >> 31
    return x & _MASK


def generator(*keys: int, device: Any = "cpu") -> Any:
    """A torch.Generator seeded by `mix_seed(*keys)`, e.g. `generator(state.seed, EVAL, i)` for the i-th
    evaluation batch: draws that do not depend on what the global RNG did before (a resume, the world size)."""
    import torch  # this module stays importable without torch

    return torch.Generator(device=device).manual_seed(mix_seed(*keys))


def accumulation_steps(global_batch: int, world_size: int, micro_batch: int) -> int:
    if global_batch < 1 or world_size < 1 or micro_batch < 1:
        raise ValueError("global batch, world size and micro batch must be >= 1")
    return math.ceil(global_batch / (world_size * micro_batch))


def micro_batches(
    step: int, global_batch: int, world_size: int, rank: int, micro_batch: int
) -> list[range]:
    """Global sample indices for each micro-step of `rank` in `step` (possibly empty ranges), for a run
    whose global batch never changed (position = step * B)."""
    return slots_at(step * global_batch, global_batch, world_size, rank, micro_batch)


def slots_at(position: int, global_batch: int, world_size: int, rank: int, micro_batch: int) -> list[range]:
    """Global sample indices for each micro-step of `rank` in the step that starts at global sample
    `position`. Every micro-step gets a range, possibly empty (a slot past B: run it with weight 0);
    over all ranks the ranges tile [position, position + B) exactly once, whatever the world size."""
    accum = accumulation_steps(global_batch, world_size, micro_batch)
    base = position
    out = []
    for m in range(accum):
        start = (m * world_size + rank) * micro_batch
        end = min(start + micro_batch, global_batch)
        out.append(range(base + min(start, global_batch), base + max(end, min(start, global_batch))))
    return out
