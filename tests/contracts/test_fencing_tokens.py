"""The fencing-token rule on hand-made trees of real DCP checkpoints: which directory counts after a partition."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from resilient_contract import lineage
from resilient_contract.storage.completeness import check_step
from resilient_contract.storage.listing import Listing
from resilient_contract.storage.local import LocalStore
from resilient_contract.storage.names import METADATA_FILE, parse_step_dir, step_dir_name
from resilient_contract.storage.scan import discover

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")

JOB = "job-uid-1"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "ckpt"
    with pytest.warns(UserWarning):  # single-process save warns that no process group exists
        dcp.save({"w": torch.randn(16, 16)}, storage_writer=dcp.FileSystemWriter(str(path)))
    return path


def put(root: Path, template: Path, step: int, writer: int | None, name_attempt: int | None = None,
        complete: bool = True, job: str = JOB) -> Path:
    path = root / step_dir_name(step, name_attempt)
    shutil.copytree(template, path)
    if writer is not None:
        (path / lineage.WRITER_FILE).write_bytes(lineage.format_writer(job, writer))
    if not complete:
        (path / METADATA_FILE).unlink()
    return path


def mark(root: Path, attempt: int, resumed: int | None, job: str = JOB) -> None:
    (root / lineage.marker_name(job, attempt)).write_bytes(lineage.format_marker(job, attempt, resumed))


def latest(root: Path, starts: tuple[tuple[int, int | None], ...] = ()) -> Listing:
    return discover(str(root), job=JOB, starts=starts)


def test_a_fenced_attempts_late_metadata_is_refused(tmp_path: Path, template: Path) -> None:
    """Attempt 1 lost a node after step 20; attempt 2 resumed from 20; attempt 1's cut-off rank 0 then
    committed step 30. Without the rule, step 30 (a dead branch) would be the resume source."""
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=1)
    mark(tmp_path, 1, None)
    mark(tmp_path, 2, 20)
    found = latest(tmp_path)
    assert found.latest is not None and found.latest.step == 20
    assert found.skipped[0].step == 30 and found.skipped[0].fenced_writer == 1
    assert "fenced" in found.skipped[0].reason
    assert discover(str(tmp_path)).latest.step == 30  # type: ignore[union-attr]  # the rule off: the bug


def test_the_operators_record_fences_before_the_new_gang_wrote_its_mark(tmp_path: Path, template: Path) -> None:
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=1)
    mark(tmp_path, 1, None)
    assert latest(tmp_path).latest.step == 30  # type: ignore[union-attr]  # nothing says attempt 1 was fenced
    assert latest(tmp_path, starts=((2, 20),)).latest.step == 20  # type: ignore[union-attr]


def test_same_step_by_two_attempts_never_shares_a_directory(tmp_path: Path, template: Path) -> None:
    """Both gangs saved step 30: the cut-off one took the plain name first, the new one used `.a2`."""
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=1)
    put(tmp_path, template, 30, writer=2, name_attempt=2)
    mark(tmp_path, 2, 20)
    found = latest(tmp_path)
    assert found.latest is not None and found.latest.path.endswith("step-0000000030.a2")
    mark(tmp_path, 3, 30)  # a later restart from the new gang's step 30
    assert latest(tmp_path).latest.path.endswith("step-0000000030.a2")  # type: ignore[union-attr]


def test_a_reserved_name_without_its_writer_is_refused(tmp_path: Path, template: Path) -> None:
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=1, name_attempt=2)  # named for attempt 2, written by 1: a mix
    found = latest(tmp_path)
    assert found.latest.step == 20 and "reserved for attempt 2" in found.skipped[0].reason  # type: ignore[union-attr]


def test_incomplete_dirs_of_a_fenced_attempt_are_not_blamed(tmp_path: Path, template: Path) -> None:
    """A save in flight when the node died is incomplete, not a late write: no fenced writer reported."""
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=1, complete=False)
    mark(tmp_path, 2, 20)
    found = latest(tmp_path)
    assert found.latest.step == 20 and found.skipped[0].fenced_writer is None  # type: ignore[union-attr]


def test_other_incarnations_and_untokened_dirs_follow_the_other_rules(tmp_path: Path, template: Path) -> None:
    put(tmp_path, template, 20, writer=None)  # written before tokens existed
    put(tmp_path, template, 30, writer=5, job="an-earlier-job")  # the job was deleted and recreated
    mark(tmp_path, 2, None)
    mark(tmp_path, 9, 0, job="an-earlier-job")
    assert latest(tmp_path).latest.step == 30  # type: ignore[union-attr]


def test_hostile_marks_do_not_break_discovery(tmp_path: Path, template: Path) -> None:
    put(tmp_path, template, 20, writer=1)
    (tmp_path / lineage.marker_name(JOB, 2)).write_bytes(b"\x80" * 100)
    (tmp_path / lineage.marker_name(JOB, 3)).mkdir()
    (tmp_path / lineage.marker_name(JOB, 4)).symlink_to("/etc/passwd")
    (tmp_path / "step-0000000020" / lineage.WRITER_FILE).unlink()
    (tmp_path / "step-0000000020" / lineage.WRITER_FILE).symlink_to("/etc/hostname")
    found = latest(tmp_path)
    assert found.error is None and found.latest is not None and found.latest.step == 20


def test_an_unchanged_metadata_is_parsed_once(tmp_path: Path, template: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls of a big, unchanged checkpoint re-check its shards only (parsing is the costly part)."""
    from resilient_contract import dcp_metadata

    calls = []
    real = dcp_metadata.storage_entries
    monkeypatch.setattr(dcp_metadata, "storage_entries", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = put(tmp_path, template, 20, writer=1)
    store = LocalStore(str(tmp_path))
    assert check_step(store, path.name).complete and check_step(store, path.name).complete
    assert len(calls) == 1
    shard = next(path.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])  # a shard cut short later is still caught from the cache
    assert "truncated" in check_step(store, path.name).reason and len(calls) == 1
    (path / METADATA_FILE).write_bytes((path / METADATA_FILE).read_bytes())  # rewritten: parse again
    check_step(store, path.name)
    assert len(calls) == 2


# ---- spoofing (issue 25, item 5) ----------------------------------------------------------------------------
def test_a_forged_mark_past_the_operators_newest_attempt_is_ignored(tmp_path: Path, template: Path) -> None:
    """A mark naming attempt 9 "from scratch" used to fence every directory, making the job restart from scratch."""
    put(tmp_path, template, 20, writer=1)
    mark(tmp_path, 1, None)
    mark(tmp_path, 9, None)  # the operator launched attempt 1 only
    found = latest(tmp_path, starts=((1, None),))
    assert found.latest is not None and found.latest.step == 20


def test_a_lying_writer_token_cannot_unfence_a_dead_gangs_directory(tmp_path: Path, template: Path) -> None:
    """Attempt 1's cut-off gang saves step 30 after attempt 2 resumed from 20, and writes `attempt=99` in its
    token to escape the fence: no attempt 99 was ever launched, so the directory is refused."""
    put(tmp_path, template, 20, writer=1)
    put(tmp_path, template, 30, writer=99)
    found = latest(tmp_path, starts=((1, None), (2, 20)))
    assert found.latest is not None and found.latest.step == 20
    assert found.skipped[0].step == 30 and "never launched" in found.skipped[0].reason


def test_step_and_mark_names_take_ascii_digits_only() -> None:
    arabic = "\u0660" * 9 + "\u0661"  # Arabic-Indic 0000000001: re's \d and int() accept it
    assert parse_step_dir(f"step-{arabic}") is None
    assert parse_step_dir("step-0000000001.a\u0661") is None
    assert parse_step_dir("step-0000000001") == 1
    assert lineage.parse_marker_name(f"{lineage.MARKER_PREFIX}{JOB}-{arabic}") is None
    assert lineage.parse_writer(f"attempt=\u0661 job={JOB}".encode()) is None
