"""The staging copy: exact bytes, buffers reused across saves, and the GIL released while it copies."""

from __future__ import annotations

import sys
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


def test_buffers_survive_dcp_closing_the_stager_after_each_stage() -> None:
    """torch 2.9-2.11's DefaultStager closes its state-dict stager after every stage; the second save of a
    reused stager then failed (`KeyError: <class 'type'>`, on an H200 with torch 2.11) and nothing was reused."""
    stager = staging.ReusingStager(staging.options(torch.device("cpu")))
    try:
        weight = torch.randn(100, 10)
        state = {"model": {"w": weight}, "step": 3, "names": ("a", int)}
        first = staging.stage(stager, state)
        stager._state_dict_stager.close()  # what those versions' _stage does after each copy
        weight.add_(1.0)
        second = staging.stage(stager, state)
        assert torch.equal(second["model"]["w"], weight) and second["names"] == ("a", int)
        assert second["model"]["w"].untyped_storage().data_ptr() == first["model"]["w"].untyped_storage().data_ptr()
    finally:
        stager.close()
    assert stager.cached_bytes() == 0  # close() does release them


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
    """Python work in another thread keeps going while large copies run (the GIL is released), unlike under a
    memcpy that holds the GIL (a memoryview slice assignment of the same bytes). Both are measured in the same
    run, so a loaded machine slows both sides alike."""
    src = torch.full((400_000_000,), 7, dtype=torch.uint8).untyped_storage()  # one copy outlasts a GIL switch
    dst = torch.UntypedStorage(src.nbytes())
    staging.copy_storage(dst, src)  # fault the pages in first

    def spins_during(copy: object) -> float:
        """Loop iterations another Python thread makes per second while the copies run."""
        stop, count = threading.Event(), [0]

        def spin() -> None:
            while not stop.is_set():
                count[0] += 1

        thread = threading.Thread(target=spin)
        thread.start()
        time.sleep(0.05)  # the spinner is running before the copies start
        before, t0 = count[0], time.perf_counter()
        copy()  # type: ignore[operator]
        spins, elapsed = count[0] - before, time.perf_counter() - t0
        stop.set()
        thread.join()
        return spins / elapsed

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)  # the spinner's slice between copies stays small beside a copy
    try:
        # Best of four against worst of four: on a loaded machine the OS, not the GIL, decides single copies.
        ours = max(spins_during(lambda: staging.copy_storage(dst, src)) for _ in range(4))
        plain_src, plain_dst = bytes(src.nbytes()), bytearray(src.nbytes())

        def gil_holding_copy() -> None:
            memoryview(plain_dst)[:] = plain_src

        holding = min(spins_during(gil_holding_copy) for _ in range(4))
    finally:
        sys.setswitchinterval(interval)
    assert ours > 3 * holding, (ours, holding)  # a GIL-holding copy lets the spinner make no step at all
    assert torch.equal(torch.empty(0, dtype=torch.uint8).set_(dst), torch.empty(0, dtype=torch.uint8).set_(src))
