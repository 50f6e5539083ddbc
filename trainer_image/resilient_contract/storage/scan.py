"""Discovery: the newest complete checkpoint under a root, and what was skipped on the way.

Bounded on hostile roots: only the newest K step directories are examined (the listing is streamed, so memory
stays O(K)), at most a few skipped verdicts are kept, and every failure becomes a `Listing.error` with a reason.
`discover(uri, area)` refuses a root outside its namespace's storage area before touching storage. Torch-free:
the operator runs it in a sandboxed worker.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from resilient_contract import dcp_metadata, lineage
from resilient_contract.storage import roots
from resilient_contract.storage.base import Kind, StoreReader
from resilient_contract.storage.completeness import check_step
from resilient_contract.storage.errors import REASON_DISCOVERY_FAILED, RootMissing, StorageError, UnsafeEntry
from resilient_contract.storage.listing import Listing, Verdict
from resilient_contract.storage.names import parse_step_dir, step_dir_attempt
from resilient_contract.storage.s3 import S3Credentials


@dataclass(frozen=True)
class ScanLimits:
    """How much of a root one discovery looks at, and how much of what it skipped it reports."""

    max_steps: int | None = 32  # only the newest K step directories are examined
    max_skipped: int = 5  # skipped verdicts kept in the Listing (all are counted)
    metadata: dcp_metadata.Limits = field(default_factory=dcp_metadata.Limits)


DEFAULT_SCAN = ScanLimits()
UNBOUNDED_SCAN = ScanLimits(max_steps=None, max_skipped=1 << 30)


def step_dirs(store: StoreReader) -> list[tuple[int, str]]:
    """(step, name) of every step directory, oldest first (symlinks are not step directories)."""
    found = []
    for name in store.list_dirs():
        step = parse_step_dir(name)
        if step is not None:
            found.append((step, name))
    found.sort()
    return found


def newest_step_entries(store: StoreReader, limit: int | None) -> tuple[list[tuple[int, str, Kind]], int]:
    """The newest `limit` (step, name, kind) step entries, newest first, and how many there are in all.

    Symlinks named like a step directory are kept (kind "symlink") so they can be reported as skipped.
    Streams the listing: memory stays O(limit) however many entries the root holds.
    """
    total = 0

    def steps() -> Iterator[tuple[int, str, Kind]]:
        nonlocal total
        for name, kind in store.iter_entries():
            if kind in ("dir", "symlink") and (step := parse_step_dir(name)) is not None:
                total += 1
                yield step, name, kind

    # Newest first; within one step the plain name before `.a<attempt>` ones: a cut-off gang usually holds
    # the plain name, and looking at it first lets discovery report it before the newer attempt's copy wins.
    def order(entry: tuple[int, str, Kind]) -> tuple[int, bool, str]:
        return entry[0], step_dir_attempt(entry[1]) is None, entry[1]

    if limit is None:
        return sorted(steps(), key=order, reverse=True), total
    return heapq.nlargest(limit, steps(), key=order), total


def read_lineage(store: StoreReader, job: str) -> list[tuple[int, int | None]]:
    """(attempt, resumed step) from the job's fence marks in the root: the newest `lineage.MAX_MARKS`."""
    names = heapq.nlargest(lineage.MAX_MARKS, (
        (parsed[1], name) for name, kind in store.iter_entries()
        if kind in ("file", "other") and (parsed := lineage.parse_marker_name(name)) and parsed[0] == job))
    out = []
    for attempt, name in names:
        try:
            mark = lineage.parse_marker(store.read_bytes(name, lineage.MAX_TOKEN_BYTES))
        except UnsafeEntry:
            continue
        if mark and mark[0] == job and mark[1] == attempt:
            out.append((attempt, mark[2]))
    return out


def discover(uri: str, area: str | None = None, limits: ScanLimits = DEFAULT_SCAN, job: str | None = None,
             starts: Iterable[tuple[int, int | None]] = (), s3: S3Credentials | None = None,
             refused: Iterable[str] = ()) -> Listing:
    """Find the latest complete checkpoint under a root. Never raises: every failure is `Listing.error`.

    With `area` (the operator always passes its namespace's area), a root outside it is refused
    before any storage access, and a local root's path below the area must hold no symlink.
    With `job` (its uid), directories a fenced attempt of that job wrote are refused: the lineage is the
    job's fence marks in the root merged with `starts` (the operator's record: attempt, resumed step).
    An `s3://` root is checked against an `s3://bucket/prefix` area lexically and read with `s3`
    (the operator's read-only keys for that bucket). Step directories named in `refused` (those a trainer
    reported corrupt: the operator's status.badCheckpoints) are never the latest, whatever they hold.
    """
    store: StoreReader | None = None
    try:
        store = roots.open_store(uri, s3, area)
        rule = None
        if job is not None:
            jid = lineage.job_id(job)
            starts = list(starts)  # marks and tokens past the operator's newest attempt are not believed
            newest = max((a for a, _ in starts), default=None)
            rule = lineage.Lineage.merge(jid, read_lineage(store, jid), starts, newest=newest)
        return scan(store, limits, rule, uri, frozenset(refused))
    except RootMissing as exc:
        return Listing(uri, None, (), str(exc), missing=True, reason=exc.reason)
    except StorageError as exc:
        return Listing(uri, None, (), str(exc), reason=exc.reason)
    except MemoryError:
        return Listing(uri, None, (), "checkpoint discovery ran out of memory", reason=REASON_DISCOVERY_FAILED)
    except Exception as exc:  # RecursionError, OSError from a strange filesystem, ...: a reason, not a crash
        return Listing(uri, None, (), f"checkpoint discovery failed ({type(exc).__name__})",
                       reason=REASON_DISCOVERY_FAILED)  # fmt: skip
    finally:
        if store is not None:
            store.close()


def scan(store: StoreReader, limits: ScanLimits = DEFAULT_SCAN, rule: lineage.Lineage | None = None,
         uri: str | None = None, refused: frozenset[str] = frozenset()) -> Listing:
    """`discover`'s scan of an opened store (a benchmark or test can count its requests). A store failure
    (StorageError) propagates: `discover` turns it into `Listing.error`."""
    uri = store.uri if uri is None else uri
    entries, total = newest_step_entries(store, limits.max_steps)
    skipped: list[Verdict] = []
    count = 0
    for step, name, kind in entries:
        if kind == "symlink":
            verdict = Verdict(step, store.join(name), False, "the step directory is a symlink (not followed)")
        elif name in refused:
            verdict = Verdict(step, store.join(name), False, "a trainer found its content does not match its "
                              "checksums (recorded in status.badCheckpoints)", corrupt=True)
        else:
            verdict = check_step(store, name, limits.metadata, rule)
        if verdict.complete:
            return Listing(uri, verdict, tuple(skipped), skipped_total=count)
        count += 1
        if len(skipped) < limits.max_skipped:
            skipped.append(verdict)
    return Listing(uri, None, tuple(skipped), skipped_total=count, unexamined=total - len(entries))
