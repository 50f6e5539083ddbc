"""What the local tier ($RTJ_LOCAL_CHECKPOINT_DIR) costs the training loop: checkpoint_bench.py's windows with
two more variants, interleaved with the others in the same run and the same state.

    python bench/two_tier_bench.py --sizes-mb 300 --world-sizes 1 --reps 3 --steps 15 --skip-load \
        --step-models device --variants ckpt_thread,ckpt_thread_tier,ckpt_process,ckpt_process_tier

- ckpt_thread_tier / ckpt_process_tier: the Checkpointer with `local_dir=` (shards written to a local
  directory, then uploaded to the root by the thread or the writer process, `.metadata` last on the root).
The local directory is a sibling of the root under the bench's workdir: on one disk, as on this machine;
on a node, it is an emptyDir on NVMe or memory and the root is a network volume or a bucket.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import checkpoint_bench as cb  # bench/ is the script's directory, first on sys.path (also in spawned ranks)
from torch import nn
from torch.optim import Optimizer

from resilient_trainer import dist as rdist
from resilient_trainer.checkpointer import Checkpointer
from resilient_trainer.state import TrainState

TIERED = {"ckpt_thread_tier": "thread", "ckpt_process_tier": "process"}


class TierSaver(cb.Saver):
    """checkpoint_bench's Saver, plus the Checkpointer with a local tier."""

    def __init__(self, kind: str, model: nn.Module, opt: Optimizer, ctx: rdist.DistContext, root: Path) -> None:
        if kind not in TIERED:
            super().__init__(kind, model, opt, ctx, root)
            return
        super().__init__("none", model, opt, ctx, root)
        self.kind = kind
        self.ckpt = Checkpointer(str(root / kind), model, opt, ctx=ctx, train_state=TrainState(), keep_last=1,
                                 upload_in=TIERED[kind], local_dir=str(root / f"local-{kind}-rank{ctx.rank}"))
        self.ckpt._hook.remove()  # the bench's loop calls before_step() itself, for every variant alike


# At import, so that the spawned ranks (which import this script as __mp_main__) see the same variants.
cb.VARIANTS = (*cb.VARIANTS, *TIERED)
cb.LABELS.update({"ckpt_thread_tier": "Checkpointer + local tier, thread upload",
                  "ckpt_process_tier": "Checkpointer + local tier, writer process"})
cb.Saver = TierSaver  # type: ignore[misc]


def main() -> Any:
    return cb.main()


if __name__ == "__main__":
    sys.exit(main())
