"""Whether the job's checkpoint root can be trusted this pass, and what the user should do if not.

Discovery (the shell's sandboxed workers) reads the root into a `Listing`; this judges it. A root that is
not readable never makes the job restart from scratch: the launch waits (see `launchable`) and the read is
retried on a timer, since a fix to a volume sends no event.
"""

from __future__ import annotations

from dataclasses import dataclass

from resilient_contract.storage import errors
from resilient_contract.storage.listing import Listing
from resilient_operator import constants as c

# An unreadable checkpoint root is retried this often; a fix to a volume sends no event either.
STORAGE_RETRY_SECONDS = 15.0
# The operator's own discovery workers were busy or still starting: nothing is known of the root, ask again soon.
DISCOVERY_BUSY_RETRY_SECONDS = 1.0
# What a user should do about a checkpoint root discovery refused, by the reason it gave.
ADVICE = {
    errors.REASON_ROOT_OUTSIDE_AREA: "no pods are created; set spec.checkpoint.root inside the namespace's area",
    errors.REASON_INVALID_ROOT: "no pods are created; spec.checkpoint.root must be a plain absolute path",
    errors.REASON_ROOT_SYMLINK: "no pods are created; spec.checkpoint.root must not pass through a symlink",
    errors.REASON_DISCOVERY_TIMED_OUT: "reading the checkpoint root took too long (a hung volume, or a file that "
    "is too costly to check); it is retried, and the job does not restart from scratch meanwhile",
    errors.REASON_DISCOVERY_FAILED: "checking the checkpoint root failed (a file too large or malformed to "
    "check within the operator's limits); it is retried, and the job does not restart from scratch meanwhile",
}
DEFAULT_ADVICE = ("the job will not restart until the checkpoint root is readable by the operator (check the "
                  "volume mount and its permissions; for s3://, the object store's endpoint, the bucket and the "
                  "operator's keys for it)")


@dataclass(frozen=True)
class RootState:
    """The storage condition to set (`ready` None: leave it as it is), the event on a transition, the retry."""

    ready: bool | None
    reason: str = ""
    message: str = ""
    event: str = ""
    retry: float | None = None


def judge(listing: Listing, root: str, in_use_by: str | None, seen_before: bool) -> RootState | None:
    """The root's state; None when the listing was not read this pass (nothing new is known)."""
    if listing.reason == c.DISCOVERY_SKIPPED:
        return None
    if in_use_by:  # two gangs writing one root would resume from each other's saves
        message = (f"checkpoint root {root} is already used by live job {in_use_by}; no pods are created: give "
                   "this job its own spec.checkpoint.root, or set spec.checkpoint.shareRoot: true on both jobs "
                   "to share it on purpose")
        return RootState(False, c.REASON_ROOT_IN_USE, message, message, STORAGE_RETRY_SECONDS)
    if listing.reason == errors.REASON_DISCOVERY_BUSY:  # not the storage's doing: its condition stays as it is
        return RootState(None, retry=DISCOVERY_BUSY_RETRY_SECONDS)
    if listing.error and not listing.missing:
        reason = listing.reason or c.REASON_STORAGE_UNREADABLE
        advice = ADVICE.get(reason, DEFAULT_ADVICE)
        return RootState(False, reason, f"{listing.error}; {advice}", listing.error, STORAGE_RETRY_SECONDS)
    if listing.missing and seen_before:
        return RootState(False, c.REASON_STORAGE_UNREADABLE,
                         f"{listing.error}, but checkpoints were seen there before; is the volume mounted?",
                         f"{listing.error} (it held checkpoints before)", STORAGE_RETRY_SECONDS)
    return RootState(True, c.REASON_STORAGE_OK, f"checkpoint root {listing.root} is readable")


def launchable(listing: Listing, in_use_by: str | None, seen_before: bool) -> tuple[bool, float | None]:
    """Whether a launch may use this listing, and when to look again if it may not because it was not read."""
    if in_use_by:
        return False, None
    if listing.reason == c.DISCOVERY_SKIPPED:  # capacity came back after all: read the root, then launch
        return False, DISCOVERY_BUSY_RETRY_SECONDS
    return not (listing.error and (not listing.missing or seen_before)), None
