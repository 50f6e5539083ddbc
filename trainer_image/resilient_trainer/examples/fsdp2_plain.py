"""A plain FSDP2 training script, the shape of pytorch/examples distributed/FSDP2/example.py, before
conversion: the README's "Convert your script" section is the diff that makes it resilient (a test
applies that diff to this file and checks resume at 2 -> 1 and 2 -> 2 ranks).

    torchrun --nproc-per-node 2 fsdp2_plain.py --data tokens.bin --steps 20
"""

import argparse
import itertools

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class TokenFile(Dataset):
    """Windows of seq_len + 1 tokens from a flat file of uint16 token ids."""

    def __init__(self, path: str, seq_len: int) -> None:
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r")
        self.seq_len = seq_len

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, i: int) -> torch.Tensor:
        window = self.tokens[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return torch.from_numpy(window.astype(np.int64))


class Block(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, vocab: int, dim: int, n_layers: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch-size", type=int, default=8, help="global batch")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--out", default=None, help="torch.save the full model here at the end")
    args = p.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Model(vocab=256, dim=32, n_layers=2)
    for layer in model.layers:
        fully_shard(layer)
    fully_shard(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)

    dataset = TokenFile(args.data, args.seq_len)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size // world_size, sampler=sampler, drop_last=True)
    step = 0
    for epoch in itertools.count():
        if step >= args.steps:
            break
        sampler.set_epoch(epoch)
        for batch in loader:
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            optim.step()
            optim.zero_grad()
            step += 1
            if rank == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
            if step >= args.steps:
                break

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0 and args.out:
        torch.save(full, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
