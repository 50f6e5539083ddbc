"""RTJ_OBJECT_STORE_AREAS and the mounted keys: parsed strictly (the operator refuses to start rather than guess),
read at each discovery, never guessed from a job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilient_operator import controller
from resilient_operator.settings import (
    MAX_SECRET_BYTES,
    OBJECT_STORE_SECRETS_DIR,
    DiscoverySettings,
    ObjectStoreArea,
    SettingsError,
    object_areas,
)  # fmt: skip
from tests.operator.builders import gang, job, running_status


def test_defaults_have_no_object_store() -> None:
    config = DiscoverySettings.from_environ({})
    assert config.object_areas == () and config.object_secrets_dir == OBJECT_STORE_SECRETS_DIR
    assert config.object_areas_for("team-a") == []


def test_areas_parse_and_normalize() -> None:
    env = {"RTJ_OBJECT_STORE_AREAS": json.dumps([
        {"uri": "s3://ckpt/team-a/", "namespaces": ["team-a", "team-b"], "secret": "ro", "endpoint": "", "region": ""},
        {"uri": "s3://shared", "namespaces": ["team-b"]},
    ]), "RTJ_OBJECT_STORE_SECRETS_DIR": "/keys/"}  # fmt: skip
    config = DiscoverySettings.from_environ(env)
    assert config.object_areas == (ObjectStoreArea("s3://ckpt/team-a", ("team-a", "team-b"), "ro"),
                                   ObjectStoreArea("s3://shared", ("team-b",)))  # fmt: skip
    assert [a.uri for a in config.object_areas_for("team-b")] == ["s3://ckpt/team-a", "s3://shared"]
    assert config.object_secrets_dir == "/keys"


@pytest.mark.parametrize("raw", [
    "{", "{}", "[1]", '[{"uri": "s3://ckpt/a"}]', '[{"uri": "s3://ckpt/a", "namespaces": "team-a"}]',
    '[{"uri": "/ckpt/a", "namespaces": ["a"]}]', '[{"uri": "s3://ckpt/../a", "namespaces": ["a"]}]',
    '[{"uri": "s3://ckpt/a", "namespaces": ["a"], "secret": "../etc"}]',
    '[{"uri": "s3://ckpt/a", "namespaces": ["a"], "endpoint": "file:///x"}]',
    '[{"uri": "s3://ckpt/a", "namespaces": ["a"], "secretKey": "x"}]',
])  # fmt: skip
def test_a_malformed_setting_refuses_to_start(raw: str) -> None:
    with pytest.raises(SettingsError, match="RTJ_OBJECT_STORE_AREAS"):
        object_areas(raw)


def test_keys_missing_empty_or_oversized_are_an_error_naming_the_secret(tmp_path: Path) -> None:
    area = ObjectStoreArea("s3://ckpt/a", ("a",), "ro")
    with pytest.raises(SettingsError, match="AWS_ACCESS_KEY_ID of Secret ro is not mounted"):
        area.credentials(str(tmp_path))
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "AWS_ACCESS_KEY_ID").write_text("AKID")
    (tmp_path / "ro" / "AWS_SECRET_ACCESS_KEY").write_text("  \n")
    with pytest.raises(SettingsError, match="empty or oversized"):
        area.credentials(str(tmp_path))
    (tmp_path / "ro" / "AWS_SECRET_ACCESS_KEY").write_text("x" * (MAX_SECRET_BYTES + 1))
    with pytest.raises(SettingsError, match="empty or oversized"):
        area.credentials(str(tmp_path))
    (tmp_path / "ro" / "AWS_SECRET_ACCESS_KEY").write_text("secret\n")
    assert area.credentials(str(tmp_path)).secret_key == "secret"  # re-read at each call: a rotation needs no restart


def test_an_area_without_a_secret_uses_the_pods_own_identity() -> None:
    creds = ObjectStoreArea("s3://ckpt/a", ("a",), endpoint="https://s3.example").credentials("/nowhere", 2.0)
    assert (creds.access_key, creds.secret_key, creds.endpoint_url, creds.timeout_s) == \
        (None, None, "https://s3.example", 2.0)  # fmt: skip


def test_no_progress_reads_under_an_s3_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Launcher reports are files on a shared volume: under an s3:// root the operator reads none (a relative
    `s3:/...` path would otherwise resolve against its working directory)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s3:").mkdir()  # what a relative read would have found
    assert controller.read_progress(job(running_status(), checkpoint={"root": "s3://ckpt/team-a/job"}),
                                    gang(1, 2)) == []  # fmt: skip
