"""Checkpoints in object storage: a real SeaweedFS S3 server, real DCP over s3fs, real gloo process groups.

The trainer reaches the store only through the standard AWS environment (the fixture sets it, as a pod's
Secret would); nothing passes an endpoint or a key to the checkpointer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from resilient_contract import completion, environment, lineage
from resilient_contract.storage import StoreReader, check_step, discover, open_store, s3
from resilient_trainer import retention, storage
from resilient_trainer.checkpointer import TEST_HOLD_METADATA_ENV, Checkpointer, FencedError
from resilient_trainer.dist import DistContext
from resilient_trainer.state import TrainState
from tests.trainer.conftest import S3Root
from tests.trainer.harness import SMALL_MODEL, Launcher, parse
from tests.trainer.test_checkpointer import ctx, fenced_env, make, snapshot  # noqa: F401 (ctx: a fixture)
from tests.trainer.test_reshard import assert_bitwise_equal

STEPS = 3
COMMON = [*SMALL_MODEL, "--global-batch", "12", "--micro-batch", "2", "--steps", str(STEPS),
          "--checkpoint-every", "0"]


def store(root: S3Root) -> StoreReader:
    return open_store(root.uri)  # fresh per question: an S3Store caches its listings


@pytest.mark.timeout(60)
def test_only_one_writer_claims_a_step_prefix(s3_root: S3Root) -> None:
    """Object stores have no mkdir: the conditional PUT of the writer token decides, even for racing claims."""
    from concurrent.futures import ThreadPoolExecutor

    roots = [storage.open_root(s3_root.uri) for _ in range(8)]
    with ThreadPoolExecutor(len(roots)) as pool:
        won = list(pool.map(lambda i: roots[i].claim_step("step-0000000005", lineage.format_writer("job-1", i + 1)),
                            range(len(roots))))
    assert won.count(True) == 1, won
    token = s3_root.fs().cat_file(f"{s3_root.uri[5:]}/step-0000000005/{lineage.WRITER_FILE}")
    assert lineage.parse_writer(token) == ("job-1", won.index(True) + 1)  # the winner's token, not overwritten
    assert roots[0].claim_step("step-0000000005", None) is False  # a tokenless writer never shares it either


@pytest.mark.parametrize(("path", "parts"), [
    ("s3://b/p/step-0000000001", ("s3://b/p", "step-0000000001")),
    ("s3://b/p/step-0000000001/", ("s3://b/p", "step-0000000001")),
    ("s3://bkt/step-0000000002", ("s3://bkt", "step-0000000002")),
    ("/ck/./a/../step-0000000003", ("/ck", "step-0000000003")),
    ("file:///ck/step-0000000004", ("/ck", "step-0000000004")),
])
def test_split_checkpoint_paths(path: str, parts: tuple[str, str]) -> None:
    assert storage.split(path) == parts


def test_a_lost_conditional_put_is_recognised() -> None:
    from botocore.exceptions import ClientError

    def err(code: str, status: int) -> ClientError:
        return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
                           "PutObject")

    assert s3.precondition_failed(err("PreconditionFailed", 412))
    assert s3.precondition_failed(err("ConditionalRequestConflict", 409))
    try:  # s3fs re-raises botocore's error as an OSError; the cause chain still says why
        raise OSError("translated") from err("PreconditionFailed", 412)
    except OSError as exc:
        assert s3.precondition_failed(exc)
    assert not s3.precondition_failed(err("AccessDenied", 403))
    assert not s3.precondition_failed(OSError("connection refused"))


@pytest.mark.timeout(60)
def test_async_save_to_s3_and_load_back(ctx: DistContext, s3_root: S3Root) -> None:  # noqa: F811
    """async_save (staging, THREAD upload) into a new step prefix, `.metadata` committed, loaded back exactly."""
    model, opt = make()
    ts = TrainState(step=7, samples_seen=70, seed=1, global_batch=10)
    ckpt = Checkpointer(s3_root.uri, model, opt, ctx=ctx, train_state=ts)
    before = snapshot(model)
    path = ckpt.save(7)
    assert path == f"{s3_root.uri}/step-0000000007"
    assert ckpt.wait() == path
    ckpt.close()
    keys = s3_root.keys("step-0000000007")
    assert "step-0000000007/.metadata" in keys and any(k.endswith(".distcp") for k in keys), keys
    assert not [k for k in keys if k.endswith(".tmp")], keys
    assert check_step(store(s3_root), "step-0000000007").complete

    fresh_model, fresh_opt = make(seed=1)
    fresh_ts = TrainState()
    loader = Checkpointer(s3_root.uri, fresh_model, fresh_opt, ctx=ctx, train_state=fresh_ts, async_save=False)
    assert loader.load(path) == 7 and fresh_ts == TrainState(7, 70, 1, 10)
    assert_bitwise_equal(before, snapshot(fresh_model), "model")
    assert loader.save(7) is None  # complete already: not rewritten
    loader.close()


@pytest.mark.timeout(60)
def test_a_fenced_gang_on_s3_is_refused(ctx: DistContext, s3_root: S3Root,  # noqa: F811
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The fencing rules on S3: marks and tokens are objects written with a conditional PUT; a mark of a newer
    attempt stops the old gang's save before `.metadata`, and its step prefix is never shared."""
    uri = s3_root.uri
    fenced_env(monkeypatch, 1)
    old = Checkpointer(uri, *make(), ctx=ctx, async_save=False)
    old.save(10)
    assert lineage.marker_name("job-1", 1) in s3_root.keys("")
    token = s3_root.fs().cat_file(f"{uri[5:]}/step-0000000010/{lineage.WRITER_FILE}")
    assert token == lineage.format_writer("job-1", 1)
    assert storage.open_root(uri).create_exclusive(lineage.marker_name("job-1", 1), b"{}") is False  # If-None-Match

    # Attempt 1 is caught between its shards and the commit (held); attempt 2 starts from step 10 meanwhile.
    release = Path(s3_root.server.workdir) / f"release-{uri.rsplit('/', 2)[1]}"
    monkeypatch.setenv(TEST_HOLD_METADATA_ENV, str(release))
    held = Checkpointer(uri, *make(), ctx=ctx)
    path = held.save(20)
    assert path == f"{uri}/step-0000000020"
    monkeypatch.delenv(TEST_HOLD_METADATA_ENV)
    fenced_env(monkeypatch, 2, f"{uri}/step-0000000010")
    new = Checkpointer(uri, *make(), ctx=ctx, async_save=False)  # attempt 2's rank 0 marks the root
    release.touch()
    with pytest.raises(FencedError, match="attempt 2 of this job has started"):
        held.wait()
    keys = s3_root.keys("step-0000000020")
    assert "step-0000000020/.metadata" not in keys and f"step-0000000020/{lineage.REFUSED_FILE}" in keys, keys
    with pytest.raises(FencedError):  # and the cut-off gang's next save is refused up front
        old.save(30)
    found = discover(uri, job="job-1")  # what the operator sees
    assert found.latest is not None and found.latest.step == 10, found

    assert new.resume() == f"{uri}/step-0000000010"  # attempt 2 loads what it was started from, then saves
    assert new.save(20) == f"{uri}/step-0000000020.a2"  # the cut-off gang's prefix is never shared
    found = discover(uri, job="job-1")
    assert found.latest is not None and found.latest.path.endswith("step-0000000020.a2")
    for c in (old, held, new):
        c.close()


@pytest.mark.timeout(60)
def test_retention_on_s3_keeps_newest_and_resume_source(ctx: DistContext, s3_root: S3Root,  # noqa: F811
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """keep_last=1: the newest complete and the resume source stay; the rest is gone, `.metadata` first."""
    uri = s3_root.uri
    monkeypatch.delenv(environment.RESUME_FROM, raising=False)
    first = Checkpointer(uri, *make(), ctx=ctx, keep_last=5, async_save=False)
    for step in (1, 2):
        first.save(step)
    first.close()
    ckpt = Checkpointer(uri, *make(), ctx=ctx, keep_last=1, async_save=False)
    ckpt.load(f"{uri}/step-0000000001")
    fs = s3_root.fs()
    fs.pipe(f"{uri[5:]}/step-0000000000/__0_0.distcp", b"a save that died mid-way")
    deleted: list[list[str]] = []  # each DeleteObjects request: "step-.../name" keys
    fs_used = s3.filesystem()  # the checkpointer's client: one per set of credentials (the environment's)
    real_call = fs_used.call_s3

    def spy(op: str, *args: object, **kwargs: object) -> object:  # records the real deletions' order
        if op == "delete_objects":
            objects = kwargs["Delete"]["Objects"]  # type: ignore[index]
            deleted.append(sorted("/".join(o["Key"].rsplit("/", 2)[1:]) for o in objects))
        return real_call(op, *args, **kwargs)

    monkeypatch.setattr(fs_used, "call_s3", spy)
    ckpt.save(3)
    ckpt.close()
    # Object keys, not listed prefixes: SeaweedFS drops an emptied prefix from listings a few minutes later
    # (asynchronously); until then discovery sees an empty step prefix, i.e. an incomplete one.
    left = sorted({key.split("/", 1)[0] for key in s3_root.keys("") if key.startswith("step-")})
    assert left == ["step-0000000001", "step-0000000003"], left
    assert all(check_step(store(s3_root), name).complete for name in left)
    of_step_2 = [batch for batch in deleted if batch[0].startswith("step-0000000002/")]
    assert of_step_2[0] == ["step-0000000002/.metadata"], deleted  # no longer complete before anything else goes
    assert len(of_step_2) > 1, deleted
    later = retention.plan(store(s3_root), keep_last=1)  # once nobody resumes step 1, it goes too
    assert "step-0000000001" in later.delete and "step-0000000003" in later.keep


@pytest.mark.multiproc
@pytest.mark.timeout(240)
def test_reshard_through_s3_is_bitwise(launcher: Launcher, s3_root: S3Root) -> None:
    """The example trainer saves at W=2 into the bucket; a W=1 run loads it (2 -> 1) and, with nothing left to
    train, saves it again under another prefix at W=1; a W=2 run loads that (1 -> 2). Each load's full state
    equals the saved one bit for bit (the reshard tests' criterion on files); the completed marker is an object."""
    dumps = [launcher.tmp / f"state-{i}.pt" for i in range(3)]
    roots = [s3_root.uri, f"{s3_root.uri}-w1", f"{s3_root.uri}-w2"]
    source = None
    for i, world in enumerate((2, 1, 2)):
        resume = ["--resume-from", source] if source else []
        run = launcher.run(world, [*COMMON, "--checkpoint-root", roots[i], *resume, "--dump-state", str(dumps[i])],
                           env=s3_root.env, timeout=120)
        if source:
            assert parse(run.output(), "RTJ_RESUMED") == [{"from": source, "step": str(STEPS)}]
            assert not parse(run.output(), "RTJ_STEP"), "nothing left to train: the load alone is compared"
            assert_bitwise_equal(torch.load(dumps[0], weights_only=False), torch.load(dumps[i], weights_only=False),
                                 f"state after the load at W={world}")
        latest = discover(roots[i]).latest
        assert latest is not None and latest.step == STEPS and latest.path == f"{roots[i]}/step-{STEPS:010d}"
        source = latest.path
    marker = s3_root.fs().cat_file(f"{s3_root.uri[5:]}/{completion.COMPLETED_MARKER_FILE}")
    assert b'"step": "3"' in marker
