"""The mistakes a converted script (nanoGPT's train.py, by the docs) could make silently are caught or
impossible: a mean loss scaled per micro-step, a forgotten ckpt.resume(), a forgotten sync_gradients, a
save still in flight at shutdown, a wrong `ctx`, a plain `python train.py`; dropout resumes exactly and
extra state (a GradScaler, a best loss) travels with the checkpoint."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.utils.data import TensorDataset

from resilient_contract import completion, dcp_metadata, environment, storage
from resilient_trainer import parallel
from resilient_trainer.checkpointer import Checkpointer, ResumeNotLoadedError
from resilient_trainer.data import GlobalBatchLoader, LossScaleError
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState
from tests.trainer.harness import REPO, Launcher, base_env, parse
from tests.trainer.test_checkpointer import ctx, make  # noqa: F401 (ctx: a fixture)
from tests.trainer.test_readme import code_block, rel_diff, section

PROBE = "tests.trainer.conversion_probe"


def loader(world: int = 1, rank: int = 0, **kw: Any) -> tuple[GlobalBatchLoader, TrainState]:
    state = TrainState(seed=3, global_batch=7)
    data = TensorDataset(torch.arange(40, dtype=torch.float32).unsqueeze(1))
    return GlobalBatchLoader(data, state, world_size=world, rank=rank, micro_batch=2, **kw), state


# ---- issue 24.4: the mean loss ---------------------------------------------------------------------------
def test_a_mean_loss_divided_by_the_micro_steps_is_caught() -> None:
    """nanoGPT's `loss / grad_accum` never touches the micro-batch: the next step refuses to start."""
    loop, state = loader()
    mbs = list(loop.micro_batches())
    for mb in mbs:
        _ = mb.data[0].mean() / len(mbs)
    state.advance()
    with pytest.raises(LossScaleError, match=r"step 0, micro-batch 0: .*mb\.scale_mean\(loss\)"):
        next(loop.micro_batches())


def test_scale_mean_gives_the_sum_over_the_global_batch_at_any_split() -> None:
    """Micro-batches of 2, 2, 2, 1 and empty slots: the scaled means add up to sum / B at every world size,
    where nanoGPT's `mean / accumulation` does not (it weighs a 1-sample micro-batch like a 2-sample one)."""
    totals, naive = {}, {}
    for world in (1, 2, 3):
        totals[world], naive[world] = 0.0, 0.0
        for rank in range(world):
            loop, _ = loader(world, rank, check_scaling=False)
            mbs = list(loop.micro_batches())
            for mb in mbs:
                values = mb.data[0].squeeze(1)
                totals[world] += float(mb.scale_mean(values.mean()))
                naive[world] += float(values.mean()) * mb.weight / (len(mbs) * world)
    assert totals[1] == pytest.approx(totals[2], rel=1e-6) and totals[1] == pytest.approx(totals[3], rel=1e-6)
    assert naive[1] != pytest.approx(naive[3], rel=1e-3), "the mistake the helper avoids"
    loop, _ = loader()
    mb = next(loop.micro_batches())
    with pytest.raises(LossScaleError, match="0-dim"):
        mb.scale_mean(torch.ones(2))
    with pytest.raises(LossScaleError, match=r"shape \(2,\)"):
        mb.scale_per_sample(torch.ones(()))
    assert float(mb.scale_per_sample(torch.ones(2))) == pytest.approx(2 / 7)
    assert float(mb.scale_mean(torch.ones(())) + mb.scale_mean(torch.ones(()))) == pytest.approx(4 / 7)  # + aux
    assert len(list(loop.micro_batches())) == 4  # asking again checks the ones handed out: all were scaled


# ---- issue 24.4: the forgotten ckpt.resume() ------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_save_without_loading_the_injected_resume_point_is_refused(
    ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    Checkpointer(str(tmp_path), *make(), ctx=ctx, async_save=False).save(4)
    source = str(tmp_path / storage.step_dir_name(4))
    monkeypatch.setenv(environment.RESUME_FROM, source)  # what --resume latest or the operator injects
    forgetful = Checkpointer(str(tmp_path), *make(), ctx=ctx, async_save=False)
    with pytest.raises(ResumeNotLoadedError, match=rf"resume from {source} .*call ckpt\.resume\(\)"):
        forgetful.save(1)
    assert not (tmp_path / storage.step_dir_name(1)).exists(), "nothing written over the root"
    assert forgetful.resume() == source
    assert forgetful.save(5) == str(tmp_path / storage.step_dir_name(5))
    forgetful.close()


# ---- issue 30.4: extra state ----------------------------------------------------------------------------
class BestLoss:
    def __init__(self, best: float = float("inf")) -> None:
        self.best = best

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best = state["best"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("async_save", [True, False])
def test_extra_state_round_trips(ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                 async_save: bool) -> None:
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))  # as after its first scaled step
    scaler.update(new_scale=96.0)
    before = scaler.state_dict()
    ckpt = Checkpointer(str(tmp_path), *make(), ctx=ctx, async_save=async_save,
                        extra={"scaler": scaler, "best": BestLoss(1.25)})
    path = ckpt.save(3)
    ckpt.close()
    fresh_scaler, fresh_best = torch.amp.GradScaler("cpu"), BestLoss()
    loaded = Checkpointer(str(tmp_path), *make(seed=1), ctx=ctx, extra={"scaler": fresh_scaler, "best": fresh_best})
    assert path is not None and loaded.load(path) == 0
    assert fresh_best.best == 1.25
    assert fresh_scaler.state_dict() == before and fresh_scaler.get_scale() == 96.0
    loaded.close()
    with pytest.raises(TypeError, match="no state_dict"):
        Checkpointer(str(tmp_path), *make(), ctx=ctx, extra={"lr": 0.1})


# ---- issue 30.2: sync_gradients -------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_forgotten_sync_gradients_is_caught_before_the_optimizer_step(
    ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    """DDP all-reduces the accumulated .grad: summed on every micro-step, earlier micro-steps count W times
    (3.7e-2 off at W=2 in the nanoGPT conversion). Caught at W=1 already, so the first local run says so."""
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    torch.manual_seed(0)
    model = parallel.replicate_model(nn.Linear(4, 4), ctx)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    ckpt = Checkpointer(str(tmp_path), model, optim, ctx=ctx)
    for _ in range(2):  # two micro-steps, no sync_gradients
        model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(parallel.GradientSyncError, match=r"all-reduced 2 times.*sync_gradients\(model, mb\.last\)"):
        optim.step()
    optim.zero_grad()
    for _ in range(2):  # never reduced at all: sync_gradients(model, False) on the last micro-step too
        with parallel.sync_gradients(model, False):
            model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(parallel.GradientSyncError, match="without any gradient all-reduce"):
        optim.step()
    optim.zero_grad()
    for m in range(3):  # the documented loop
        with parallel.sync_gradients(model, m == 2):
            model(torch.randn(3, 4)).sum().backward()
    optim.step()
    ckpt.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("order", ["replicate_then_compile", "compile_then_replicate"])
def test_torch_compile_in_either_order(ctx: DistContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
                                       order: str) -> None:
    """The guard and the checkpoint see through torch.compile's wrapper (nanoGPT compiles, then wraps in DDP)."""
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.1), nn.Linear(4, 2))
    model = (torch.compile(parallel.replicate_model(plain, ctx), backend="eager") if order == "replicate_then_compile"
             else parallel.replicate_model(torch.compile(plain, backend="eager"), ctx))
    optim = torch.optim.AdamW(model.parameters())
    ckpt = Checkpointer(str(tmp_path), model, optim, ctx=ctx)
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
    with pytest.raises(parallel.GradientSyncError):
        optim.step()
    optim.zero_grad()
    for last in (False, True):
        with parallel.sync_gradients(model, last):
            model(torch.randn(3, 4)).sum().backward()
    optim.step()
    path = ckpt.save(1, blocking=True)
    ckpt.close()
    keys = FileSystemReader(str(path)).read_metadata().state_dict_metadata.keys()
    assert {k for k in keys if k.startswith("model.")} == {"model.0.weight", "model.0.bias", "model.2.weight",
                                                          "model.2.bias"}


# ---- issue 30.5: friction -------------------------------------------------------------------------------
@pytest.mark.timeout(60)
def test_a_wrong_ctx_says_what_was_expected(ctx: DistContext, tmp_path: Path) -> None:  # noqa: F811
    wrong = contextlib.nullcontext()
    model, optim = make()
    for call in (lambda: Checkpointer(str(tmp_path), model, optim, ctx=wrong),  # type: ignore[arg-type]
                 lambda: parallel.replicate_model(model, wrong),  # type: ignore[arg-type]
                 lambda: parallel.shard_model(model, wrong),  # type: ignore[arg-type]
                 lambda: GlobalBatchLoader(TensorDataset(torch.ones(4, 1)), TrainState(global_batch=2), wrong,  # type: ignore[arg-type]
                                           micro_batch=1)):
        with pytest.raises(TypeError, match=r"ctx must be the resilient_trainer\.dist\.DistContext that "
                                            r"resilient_trainer\.dist\.init\(\) returns, not contextlib\.nullcontext"):
            call()


@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_plain_python_train_py_runs_as_one_process(tmp_path: Path) -> None:
    """The README's script, `python train.py` with no launcher: W=1, and one line saying how to launch."""
    script = tmp_path / "train.py"
    script.write_text(code_block(section((REPO / "README.md").read_text(), "Make your training script resilient"),
                                 "python"))
    env = {k: v for k, v in base_env(tmp_path).items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR",
                                                                     "MASTER_PORT", "LOCAL_RANK")}
    env[environment.CHECKPOINT_ROOT] = str(tmp_path / "ckpt")
    done = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "running as one process (W=1); for more, python -m resilient_trainer.launch --nproc-per-node N" in \
        done.stderr
    latest = storage.scan(storage.open_store(str(tmp_path / "ckpt")), storage.UNBOUNDED_SCAN).latest
    assert latest is not None and latest.step == 20
    assert completion.read_completed_marker(str(tmp_path / "ckpt"))["world_size"] == "1"  # type: ignore[index]


# ---- issue 30.1: the shutdown race ----------------------------------------------------------------------
@pytest.mark.multiproc
@pytest.mark.timeout(150)
def test_no_save_outlives_its_process_group(launcher: Launcher, tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    run = launcher.run(2, ["shutdown-race", str(root)], module=PROBE,
                       env={"PYTHONPATH": f"{REPO / 'trainer_image'}:{REPO}"}, timeout=120)
    cases = {c.pop("case"): c for c in parse(run.output(), "RTJ_PROBE")}
    assert cases["record_success"]["pending_before"] == "True", "the save was still in flight"
    assert cases["record_success"]["pending_after"] == "False", "record_success waited for it"
    assert cases["shutdown"]["pending_after"] == "False", "shutdown finished the save before the group went"
    store = storage.open_store(str(root))
    for step in (1, 2):  # real 2-rank checkpoints: both ranks' shards, committed by rank 0
        name = storage.step_dir_name(step)
        assert storage.check_step(store, name).complete, name
        entries = dcp_metadata.storage_entries((root / name / storage.METADATA_FILE).read_bytes())
        assert {e.relative_path.split("_")[2] for e in entries} == {"0", "1"}, name
    marker = root / completion.COMPLETED_MARKER_FILE
    assert marker.stat().st_mtime_ns >= (root / storage.step_dir_name(1) / storage.METADATA_FILE).stat().st_mtime_ns
    # The group destroyed behind the Checkpointer's back: the save is refused, nothing to hand out.
    assert cases["destroyed"]["verdict"] == "refused", cases
    assert not (root / storage.step_dir_name(3) / storage.METADATA_FILE).exists()
    assert not list((root / storage.step_dir_name(3)).glob("*.distcp")), "no single-process shards"
    assert storage.scan(store, storage.UNBOUNDED_SCAN).latest.step == 2  # type: ignore[union-attr]


# ---- issue 30.3: randomness -----------------------------------------------------------------------------
@pytest.mark.multiproc
@pytest.mark.timeout(400)
def test_dropout_resumes_bitwise_at_the_same_world_size(launcher: Launcher, tmp_path: Path) -> None:
    """DDP, dropout 0.1, a mean loss via mb.scale_mean, extra state: 2 ranks for 7 steps, against 2 ranks
    for 3 steps then resumed at 2 (bitwise) and at 1 (within 1e-5: the same dropout masks, other rounding)."""
    env = {"PYTHONPATH": f"{REPO / 'trainer_image'}:{REPO}"}

    def train(world: int, root: Path, steps: int, out: Path | None = None, resume: Path | None = None) -> str:
        extra = {environment.CHECKPOINT_ROOT: str(root), **({environment.RESUME_FROM: str(resume)} if resume else {})}
        run = launcher.run(world, ["train", "--steps", str(steps), *(["--out", str(out)] if out else [])],
                           module=PROBE, env={**env, **extra}, timeout=120)
        return run.output()

    train(2, tmp_path / "ref", 7, tmp_path / "ref.pt")
    train(2, tmp_path / "first", 3)
    source = tmp_path / "first" / storage.step_dir_name(3)
    results = {}
    for world in (2, 1):
        out = train(world, tmp_path / f"r{world}", 7, tmp_path / f"r{world}.pt", resume=source)
        resumed = parse(out, "RTJ_RESUMED")[0]
        assert resumed["updates"] == "3" and resumed["best"] != "inf", "extra state came back"
        results[world] = torch.load(tmp_path / f"r{world}.pt", weights_only=True)
    reference = torch.load(tmp_path / "ref.pt", weights_only=True)
    for key, value in reference["model"].items():
        assert torch.equal(value.view(torch.uint8), results[2]["model"][key].view(torch.uint8)), key
    assert results[2]["best"] == reference["best"]
    diff = rel_diff(reference["model"], results[1]["model"])
    print(f"dropout run, 2 -> 1 ranks: relative parameter difference {diff:.2e}")
    assert diff <= 1e-5


def test_mb_rng_keys_dropout_by_the_samples_not_the_rank() -> None:
    """The same micro-batch draws the same dropout mask at any world size, and the global RNG is restored."""
    masks: dict[int, dict[int, torch.Tensor]] = {}
    for world in (1, 2, 3):
        masks[world] = {}
        for rank in range(world):
            loop, _ = loader(world, rank, check_scaling=False)
            for mb in loop.micro_batches():
                before = torch.random.get_rng_state()
                with mb.rng():
                    mask = nn.functional.dropout(torch.ones(16), 0.5)
                assert torch.equal(torch.random.get_rng_state(), before)
                if mb.size:
                    masks[world][mb.positions.start] = mask
                    assert torch.equal(torch.rand(4, generator=mb.generator()),
                                       torch.rand(4, generator=mb.generator()))
    assert masks[1].keys() == masks[2].keys() == masks[3].keys()
    for start, mask in masks[1].items():
        assert torch.equal(mask, masks[2][start]) and torch.equal(mask, masks[3][start]), start
    assert len({tuple(m.tolist()) for m in masks[1].values()}) > 1, "different micro-batches, different masks"


def test_evaluation_batches_do_not_depend_on_the_global_rng() -> None:
    """The eval loop's draws come from generator(seed, EVAL, i): the same after a resume, whatever ran before."""
    from resilient_trainer.state import generator

    first = [torch.randint(1000, (4,), generator=generator(5, 0xE7A1, i)) for i in range(3)]
    torch.rand(100)  # the training loop consumed the global RNG differently after a resume
    again = [torch.randint(1000, (4,), generator=generator(5, 0xE7A1, i)) for i in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], first[1])
