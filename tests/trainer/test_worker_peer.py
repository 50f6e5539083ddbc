"""A worker tells a lost peer from its own script's failure (the agent waits for a plan only after the first)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from resilient_trainer.worker import lost_a_peer

PEER = """
import os, sys, torch, torch.distributed as dist
from resilient_trainer.worker import lost_a_peer
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    dist.barrier()
    os._exit(9)  # the peer's machine dies: its sockets close under the collective
dist.barrier()
try:
    dist.all_reduce(torch.ones(4))
    print("NO ERROR")
except Exception as exc:
    print("PEER_LOST" if lost_a_peer(exc) else f"NOT_PEER {type(exc).__name__}: {exc}")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
def test_a_peer_killed_under_a_collective_reads_as_a_lost_peer(tmp_path: Path) -> None:
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    port = free_port()
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                                   "MASTER_PORT": str(port), "TORCH_CPP_LOG_LEVEL": "ERROR"})
             for r in range(2)]
    out, _ = procs[0].communicate(timeout=100)
    procs[1].wait(timeout=10)
    assert "PEER_LOST" in out, out


def test_a_script_error_is_not_a_lost_peer() -> None:
    assert not lost_a_peer(ValueError("bad batch"))
    assert not lost_a_peer(RuntimeError("CUDA out of memory"))
    assert not lost_a_peer(KeyError("model.weight"))
    assert lost_a_peer(RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:4567"))
