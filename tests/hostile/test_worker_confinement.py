"""Discovery workers cannot read the operator's secrets (issue 25, item 6).

They run under the operator's uid, so file permissions cannot tell them apart; each worker confines itself
with Landlock (no privilege needed) to reading the checkpoint storage and its own Python installation. The
ServiceAccount token and the mounted object-store keys of every area stay unreadable to it, even if a request
(or a bug in the parser) asked it to read them.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from resilient_contract.storage.errors import REASON_STORAGE_UNREADABLE
from resilient_operator.discovery import DiscoveryPool
from resilient_operator.settings import DiscoverySettings

pytestmark = pytest.mark.timeout(120)


def _landlock() -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.syscall(444, None, 0, 1) > 0)


@pytest.fixture(scope="module")
def tree() -> Iterator[Path]:
    if not _landlock():
        pytest.skip("this kernel has no Landlock: workers run unconfined here (the README says so)")
    base = Path(tempfile.mkdtemp(prefix="rtj-confine-"))
    base.chmod(0o755)
    (base / "mount" / "ml" / "job").mkdir(parents=True)
    (base / "mount" / "ml" / "job" / "readable.txt").write_text("checkpoint data\n")
    secrets = base / "var-run-secrets" / "serviceaccount"
    secrets.mkdir(parents=True)
    (secrets / "token").write_text("eyJhbGciOi-the-operators-token\n")
    keys = base / "object-store" / "team-b-keys"
    keys.mkdir(parents=True)
    (keys / "AWS_SECRET_ACCESS_KEY").write_text("team-b-secret\n")
    yield base
    shutil.rmtree(base)


def test_a_confined_worker_reads_the_storage_but_not_the_token_or_the_keys(tree: Path) -> None:
    script = (
        "import sys\n"
        "from resilient_operator.discovery import confine\n"
        f"assert confine([{str(tree / 'mount')!r}])\n"
        f"print(open({str(tree / 'mount' / 'ml' / 'job' / 'readable.txt')!r}).read().strip())\n"
        f"for secret in ({str(tree / 'var-run-secrets' / 'serviceaccount' / 'token')!r},\n"
        f"               {str(tree / 'object-store' / 'team-b-keys' / 'AWS_SECRET_ACCESS_KEY')!r}):\n"
        "    try:\n"
        "        open(secret).read()\n"
        "        print('READ', secret)\n"
        "    except PermissionError:\n"
        "        print('denied')\n"
        "import json, resilient_contract.storage  # the worker's own imports still work\n"
    )
    result = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["checkpoint", "data", "denied", "denied"], result.stdout


def test_the_pools_workers_are_confined(tree: Path) -> None:
    """A request for a directory outside the storage (one the operator never sends) finds it unreadable."""
    pool = DiscoveryPool(DiscoverySettings(checkpoint_mount=str(tree / "mount"), timeout_seconds=10.0, workers=1))
    try:
        pool.warm()
        inside = pool.discover(str(tree / "mount" / "ml" / "job"), "ml")
        assert inside.error is None, inside
        listing, _ = pool._call(None, str(tree / "var-run-secrets" / "serviceaccount"), "/")
        assert listing.error is not None and "EACCES" in listing.error, listing
        listing, _ = pool._call(None, str(tree / "object-store" / "team-b-keys"), str(tree / "object-store"))
        assert listing.error is not None and listing.reason == REASON_STORAGE_UNREADABLE, listing
    finally:
        pool.close()
