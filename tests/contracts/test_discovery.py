"""Checkpoint discovery on real DCP checkpoints: only complete ones count, and `.metadata` never runs code."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

from resilient_contract import dcp_metadata  # noqa: E402
from resilient_contract.storage.completeness import check_step  # noqa: E402
from resilient_contract.storage.errors import REASON_INVALID_ROOT, REASON_ROOT_OUTSIDE_AREA, StorageError  # noqa: E402
from resilient_contract.storage.local import LocalStore  # noqa: E402
from resilient_contract.storage.names import parse_step_dir, step_dir_name  # noqa: E402
from resilient_contract.storage.roots import object_area  # noqa: E402
from resilient_contract.storage.scan import ScanLimits, discover  # noqa: E402


def save(root: Path, step: int, seed: int = 0) -> Path:
    """A real single-process DCP save, written as several shard files (thread_count=2)."""
    torch.manual_seed(seed)
    state = {"w": torch.randn(64, 64), "b": torch.randn(64), "extra": {"step": step}}
    path = root / step_dir_name(step)
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), thread_count=2))
    return path


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("template")
    with pytest.warns(UserWarning):  # single-process save warns that no process group exists
        return save(root, 1)


def clone(template: Path, root: Path, step: int) -> Path:
    dest = root / step_dir_name(step)
    shutil.copytree(template, dest)
    return dest


def shards(path: Path) -> list[Path]:
    return sorted(path.glob("*.distcp"))


def test_template_has_several_shards(template: Path) -> None:
    assert len(shards(template)) >= 2
    assert check_step(LocalStore(str(template.parent)), template.name).complete


def test_newest_complete_wins(tmp_path: Path, template: Path) -> None:
    for step in (10, 20, 30):
        clone(template, tmp_path, step)
    found = discover(str(tmp_path))
    assert found.latest is not None and found.latest.step == 30
    assert found.latest.path == str(tmp_path / "step-0000000030")


def break_no_metadata(path: Path) -> None:
    (path / ".metadata").unlink()


def break_truncated(path: Path) -> None:
    shard = shards(path)[-1]
    os.truncate(shard, shard.stat().st_size - 1)


def break_missing_shard(path: Path) -> None:
    shards(path)[0].unlink()


def break_garbage(path: Path) -> None:
    (path / ".metadata").write_bytes(b"\x80\x04not a pickle at all")


def break_not_metadata(path: Path) -> None:
    (path / ".metadata").write_bytes(pickle.dumps({"storage_data": {}}))


@pytest.mark.parametrize(
    ("breaker", "why"),
    [
        (break_no_metadata, "no .metadata"),
        (break_truncated, "truncated"),
        (break_missing_shard, "missing"),
        (break_garbage, "cannot read .metadata"),
        (break_not_metadata, "not a DCP Metadata"),
    ],
    ids=["partial", "truncated-shard", "missing-shard", "garbage-metadata", "foreign-pickle"],
)
def test_incomplete_newer_checkpoint_is_skipped(tmp_path: Path, template: Path, breaker, why: str) -> None:
    clone(template, tmp_path, 10)
    breaker(clone(template, tmp_path, 20))
    found = discover(str(tmp_path))
    assert found.latest is not None and found.latest.step == 10
    assert [v.step for v in found.skipped] == [20]
    assert why in found.skipped[0].reason


class _RunsCommand:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # what an attacker writes: unpickling calls os.system(...)
        return (os.system, (f"touch {self.marker}",))


def test_malicious_metadata_never_runs(tmp_path: Path, template: Path) -> None:
    marker = tmp_path / "pwned"
    clone(template, tmp_path, 10)
    evil = clone(template, tmp_path, 20)
    (evil / ".metadata").write_bytes(pickle.dumps(_RunsCommand(marker)))
    found = discover(str(tmp_path))
    assert not marker.exists()
    assert found.latest is not None and found.latest.step == 10
    assert "unsafe" in found.skipped[0].reason and "allow-list" in found.skipped[0].reason
    assert "system" not in found.skipped[0].reason, "no text from the file reaches the message"


def test_malicious_code_inside_real_metadata_never_runs(tmp_path: Path, template: Path) -> None:
    """A real Metadata object whose storage entry hides a payload is rejected as a whole."""
    marker = tmp_path / "pwned"
    meta = dcp.FileSystemReader(str(template)).read_metadata()
    key = next(iter(meta.storage_data))
    meta.storage_data[key] = _RunsCommand(marker)
    evil = clone(template, tmp_path, 20)
    (evil / ".metadata").write_bytes(pickle.dumps(meta))
    verdict = check_step(LocalStore(str(tmp_path)), evil.name)
    assert not verdict.complete and "unsafe" in verdict.reason
    assert not marker.exists()


def test_path_traversal_in_metadata_is_rejected(tmp_path: Path, template: Path) -> None:
    meta = dcp.FileSystemReader(str(template)).read_metadata()
    for info in meta.storage_data.values():
        info.relative_path = "../../etc/passwd"
    bad = clone(template, tmp_path, 20)
    (bad / ".metadata").write_bytes(pickle.dumps(meta))
    verdict = check_step(LocalStore(str(tmp_path)), bad.name)
    assert not verdict.complete and "outside the checkpoint" in verdict.reason


def test_reads_real_metadata_without_importing_torch(template: Path) -> None:
    """The operator's reader resolves only stand-ins: parse the real file, check the offsets add up."""
    entries = dcp_metadata.storage_entries((template / ".metadata").read_bytes())
    sizes = {p.name: p.stat().st_size for p in shards(template)}
    assert {e.relative_path for e in entries} == set(sizes)
    for name, size in sizes.items():
        assert max(e.offset + e.length for e in entries if e.relative_path == name) == size


def test_non_checkpoint_names_are_ignored(tmp_path: Path, template: Path) -> None:
    clone(template, tmp_path, 5)
    for name in ("step-12", "step-00000000100", "tmp", "step-000000001x"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-0000000099").write_text("a file, not a directory")
    assert discover(str(tmp_path)).latest.step == 5


def test_missing_root_is_not_an_error_but_is_flagged(tmp_path: Path) -> None:
    found = discover(str(tmp_path / "nope"))
    assert found.latest is None and found.missing and "does not exist" in found.error


def test_unreadable_root_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    found = discover(str(tmp_path / "file"))
    assert found.error and not found.missing and "not a directory" in found.error


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads through permission bits")
def test_permission_denied_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "locked"
    root.mkdir(mode=0o000)
    assert "permission denied" in discover(str(root)).error


def test_unsupported_scheme_says_so() -> None:
    found = discover("gs://bucket/ckpt")
    assert found.reason == REASON_INVALID_ROOT and "gs:// is not supported" in found.error


AREAS = ["s3://ckpt/team-a", "s3://shared", "s3://ckpt/team-b/nested"]


@pytest.mark.parametrize(("root", "area"), [
    ("s3://ckpt/team-a", "s3://ckpt/team-a"), ("s3://ckpt/team-a/job/", "s3://ckpt/team-a"),
    ("s3://shared/any/thing", "s3://shared"), ("s3://ckpt/team-b/nested/x", "s3://ckpt/team-b/nested"),
])  # fmt: skip
def test_an_s3_root_is_matched_to_its_area_lexically(root: str, area: str) -> None:
    assert object_area(root, AREAS) == area


@pytest.mark.parametrize(("root", "reason"), [
    ("s3://ckpt/team-ab/x", REASON_ROOT_OUTSIDE_AREA), ("s3://ckpt", REASON_ROOT_OUTSIDE_AREA),
    ("s3://ckpt/team-b/x", REASON_ROOT_OUTSIDE_AREA), ("s3://other/team-a", REASON_ROOT_OUTSIDE_AREA),
    ("s3://ckpt/team-a/../team-b", REASON_INVALID_ROOT), ("s3://ckpt/team-a//x", REASON_INVALID_ROOT),
    ("s3://CKPT/team-a", REASON_INVALID_ROOT), ("s3://a..b/x", REASON_INVALID_ROOT),
])  # fmt: skip
def test_an_s3_root_outside_every_area_is_refused_before_any_request(root: str, reason: str) -> None:
    with pytest.raises(StorageError) as caught:
        object_area(root, AREAS)
    assert caught.value.reason == reason
    found = discover(root, "s3://ckpt/team-a", s3=object())  # no store is ever built: no request
    assert found.reason == reason and found.error == str(caught.value) and not found.missing


def test_step_names_round_trip() -> None:
    assert step_dir_name(1200) == "step-0000001200"
    assert parse_step_dir("step-0000001200") == 1200
    with pytest.raises(ValueError, match="does not fit"):
        step_dir_name(10**10)


def test_many_step_directories(tmp_path: Path, template: Path) -> None:
    """Thousands of step directories: only the newest K are examined, and only a few verdicts are kept."""
    clone(template, tmp_path, 1)
    clone(template, tmp_path, 1900)
    for step in range(2, 2002):
        if step != 1900:
            (tmp_path / step_dir_name(step)).mkdir(exist_ok=True)
    found = discover(str(tmp_path), limits=ScanLimits(max_steps=200, max_skipped=3))
    assert found.latest.step == 1900 and found.skipped_total == 101 and len(found.skipped) == 3
    beyond = discover(str(tmp_path), limits=ScanLimits(max_steps=50))
    assert beyond.latest is None and not beyond.error and beyond.skipped_total == 50
    assert beyond.unexamined == 2001 - 50
