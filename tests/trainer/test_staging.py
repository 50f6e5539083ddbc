"""The staging copy: exact bytes, buffers reused across saves, and the GIL released while it copies."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from resilient_trainer import staging


def test_staged_copy_is_exact_and_reuses_its_buffers() -> None:
    stager = staging.ReusingStager(staging.options(torch.device("cpu")))
    try:
        weight = torch.randn(1000, 10)
        state = {"model": {"w": weight, "row": weight[3]}, "step": 7, "empty": torch.empty(0)}
        first = staging.stage(stager, state)
        assert torch.equal(first["model"]["w"], weight) and torch.equal(first["model"]["row"], weight[3])
        assert first["step"] == 7 and first["empty"].numel() == 0
        # one buffer per source storage: the view shares the weight's
        assert first["model"]["row"].untyped_storage().data_ptr() == first["model"]["w"].untyped_storage().data_ptr()
        buffer = first["model"]["w"].untyped_storage().data_ptr()
        weight.add_(1.0)
        second = staging.stage(stager, state)
        assert torch.equal(second["model"]["w"], weight)
        assert second["model"]["w"].untyped_storage().data_ptr() == buffer  # reused, not reallocated
        assert stager.cached_bytes() == weight.nbytes
    finally:
        stager.close()


def test_shared_staging_buffers_live_in_shared_memory() -> None:
    stager = staging.ReusingStager(staging.options(torch.device("cpu"), share=True))
    try:
        out = staging.stage(stager, {"w": torch.ones(100)})
        assert out["w"].is_shared() and torch.equal(out["w"], torch.ones(100))
    finally:
        stager.close()


def test_cuda_options_pin_and_do_not_block() -> None:
    """The CUDA path's configuration (no GPU here: the copies themselves are not exercised)."""
    opts = staging.options(torch.device("cuda"))
    assert opts.use_pinned_memory and opts.use_non_blocking_copy and opts.use_async_staging
    cpu = staging.options(torch.device("cpu"))
    assert not cpu.use_pinned_memory and not cpu.use_non_blocking_copy


@pytest.mark.timeout(60)
def test_the_copy_lets_the_training_thread_run() -> None:
    """Python work in another thread keeps most of its pace while 5 large copies run (GIL released)."""
    src = torch.randn(25_000_000).untyped_storage()
    dst = torch.UntypedStorage(src.nbytes())
    staging.copy_storage(dst, src)  # fault the pages in first

    def rate(during: bool) -> float:
        stop, count = threading.Event(), [0]

        def spin() -> None:
            while not stop.is_set():
                count[0] += 1

        thread = threading.Thread(target=spin)
        thread.start()
        t0 = time.perf_counter()
        if during:
            for _ in range(5):
                staging.copy_storage(dst, src)
        else:
            time.sleep(0.2)
        elapsed = time.perf_counter() - t0
        stop.set()
        thread.join()
        return count[0] / elapsed

    solo, during = rate(False), rate(True)
    assert during > 0.3 * solo, (solo, during)
    assert torch.equal(torch.empty(0, dtype=torch.uint8).set_(dst), torch.empty(0, dtype=torch.uint8).set_(src))
