"""The chart's objectStorage.areas: rendered, then parsed exactly as the operator parses its environment, with
each area's Secret mounted read-only where the operator reads its keys (one format, one source of truth)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from resilient_operator.settings import DiscoverySettings, ObjectStoreArea, SettingsError, object_areas
from tests.chart.test_chart import (
    CHART,
    KUBE_VERSION,
    RELEASE,
    container,
    env_of,
    helm,  # noqa: F401  (fixture)
    pod_spec,
    render,
    run_helm,
)  # fmt: skip

AREAS = [
    {"uri": "s3://ckpt/team-a", "namespaces": ["team-a"], "secret": "ckpt-ro", "endpoint": "http://10.0.0.5:8333"},
    {"uri": "s3://ckpt/team-b/", "namespaces": ["team-b", "team-c"], "secret": "ckpt-ro"},
    {"uri": "s3://other-bucket", "namespaces": ["team-a"], "secret": "other-ro", "region": "eu-west-1"},
    {"uri": "s3://irsa-bucket/x", "namespaces": ["team-d"]},  # the operator pod's own identity
]


def operator_settings(docs: list[dict[str, Any]]) -> DiscoverySettings:
    env = {k: v for k, v in env_of(docs).items() if isinstance(v, str)}
    return DiscoverySettings.from_environ(env)


def test_no_areas_by_default(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path)
    assert operator_settings(docs).object_areas == ()
    assert not [v for v in pod_spec(docs)["volumes"] if "secret" in v]


def test_areas_reach_the_operator_as_values_say(helm: str, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, tmp_path, {"objectStorage": {"areas": AREAS}})
    config = operator_settings(docs)
    assert config.object_areas == (
        ObjectStoreArea("s3://ckpt/team-a", ("team-a",), "ckpt-ro", "http://10.0.0.5:8333"),
        ObjectStoreArea("s3://ckpt/team-b", ("team-b", "team-c"), "ckpt-ro"),
        ObjectStoreArea("s3://other-bucket", ("team-a",), "other-ro", region="eu-west-1"),
        ObjectStoreArea("s3://irsa-bucket/x", ("team-d",)),
    )
    assert [a.uri for a in config.object_areas_for("team-a")] == ["s3://ckpt/team-a", "s3://other-bucket"]
    assert config.object_areas_for("team-x") == []
    # Every named Secret is mounted read-only, once, where the operator will read that area's keys.
    mounts = {m["mountPath"]: m for m in container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    for secret in ("ckpt-ro", "other-ro"):
        mount = mounts[f"{config.object_secrets_dir}/{secret}"]
        assert mount["readOnly"] is True
        source = volumes[mount["name"]]["secret"]
        assert source["secretName"] == secret
        assert {i["key"] for i in source["items"]} == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert sum("secret" in v for v in volumes.values()) == 2


def test_keys_are_read_from_the_mounted_secret(tmp_path: Path) -> None:
    area = ObjectStoreArea("s3://ckpt/team-a", ("team-a",), "ckpt-ro", "http://s3.local:8333")
    secret = tmp_path / "ckpt-ro"
    secret.mkdir()
    (secret / "AWS_ACCESS_KEY_ID").write_text("AKIDEXAMPLE\n")
    (secret / "AWS_SECRET_ACCESS_KEY").write_text("c2VjcmV0")
    creds = area.credentials(str(tmp_path), timeout_s=1.25)
    assert (creds.access_key, creds.secret_key, creds.endpoint_url, creds.timeout_s) == \
        ("AKIDEXAMPLE", "c2VjcmV0", "http://s3.local:8333", 1.25)  # fmt: skip


BAD = [
    ("not an s3 uri", {"uri": "gs://b/x", "namespaces": ["a"]}),
    ("bad bucket", {"uri": "s3://B_ad/x", "namespaces": ["a"]}),
    ("dot-dot", {"uri": "s3://ckpt/a/../b", "namespaces": ["a"]}),
    ("no namespaces", {"uri": "s3://ckpt/a", "namespaces": []}),
    ("bad namespace", {"uri": "s3://ckpt/a", "namespaces": ["Team_A"]}),
    ("bad secret", {"uri": "s3://ckpt/a", "namespaces": ["a"], "secret": "Not/A/Name"}),
    ("bad endpoint", {"uri": "s3://ckpt/a", "namespaces": ["a"], "endpoint": "ftp://x"}),
    ("unknown key", {"uri": "s3://ckpt/a", "namespaces": ["a"], "accessKey": "AKIA"}),
]


@pytest.mark.parametrize(("case", "area"), BAD, ids=[b[0] for b in BAD])
def test_schema_and_settings_both_refuse_a_bad_area(helm: str, tmp_path: Path, case: str,  # noqa: F811
                                                    area: dict[str, Any]) -> None:  # fmt: skip
    """The chart refuses it at install; were it set by hand, the operator refuses to start (never guesses)."""
    result = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                      values={"objectStorage": {"areas": [area]}}, tmp=tmp_path)  # fmt: skip
    assert result.returncode != 0, case
    with pytest.raises(SettingsError):
        object_areas(json.dumps([area]))
