"""What discovery says about a root: a `Verdict` per step directory and the `Listing` the operator's core reads.

Plain data with a checked JSON form (`to_dict`/`from_dict`): a Listing crosses the discovery sandbox's process
boundary. No imports from the rest of the package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """Whether one step directory is a complete checkpoint, and if not, why (for events and logs)."""

    step: int
    path: str
    complete: bool
    reason: str = ""
    fenced_writer: int | None = None  # refused by the lineage: the attempt whose cut-off gang wrote it
    corrupt: bool = False  # refused because a trainer found its content does not match its checksums


@dataclass(frozen=True)
class Listing:
    """What discovery reports to the operator's core: the newest complete checkpoint and what was skipped.

    `error` with `missing=False`: the job must not (re)start; `reason` names why in CamelCase.
    `skipped` keeps the first few skipped verdicts; `skipped_total` counts them all; `unexamined` is
    the number of older step directories beyond the scan limit that were not looked at.
    """

    root: str
    latest: Verdict | None
    skipped: tuple[Verdict, ...] = ()
    error: str | None = None
    missing: bool = False
    reason: str | None = None
    skipped_total: int = 0
    unexamined: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data: how a Listing crosses the sandbox's process boundary."""
        return {
            "root": self.root, "latest": _verdict_dict(self.latest),
            "skipped": [_verdict_dict(v) for v in self.skipped],
            "error": self.error, "missing": self.missing, "reason": self.reason,
            "skipped_total": self.skipped_total, "unexamined": self.unexamined,
        }  # fmt: skip

    @classmethod
    def from_dict(cls, data: Any) -> Listing:
        """The inverse of `to_dict`, checking every type (raises ValueError on anything else)."""
        if not isinstance(data, dict):
            raise ValueError("a listing must be an object")
        latest = data.get("latest")
        skipped = data.get("skipped")
        if not isinstance(skipped, list):
            raise ValueError("listing.skipped must be a list")
        return cls(
            root=_typed(data.get("root"), str),
            latest=None if latest is None else _verdict(latest),
            skipped=tuple(_verdict(v) for v in skipped),
            error=_typed(data.get("error"), str, optional=True),
            missing=_typed(data.get("missing"), bool),
            reason=_typed(data.get("reason"), str, optional=True),
            skipped_total=_typed(data.get("skipped_total"), int),
            unexamined=_typed(data.get("unexamined"), int),
        )


def _typed(value: Any, kind: type, optional: bool = False) -> Any:
    if (value is None and optional) or (type(value) is kind):
        return value
    raise ValueError(f"expected {kind.__name__}")


def _verdict_dict(v: Verdict | None) -> dict[str, Any] | None:
    return None if v is None else {"step": v.step, "path": v.path, "complete": v.complete, "reason": v.reason,
                                   "fenced_writer": v.fenced_writer, "corrupt": v.corrupt}


def _verdict(data: Any) -> Verdict:
    if not isinstance(data, dict):
        raise ValueError("a verdict must be an object")
    return Verdict(_typed(data.get("step"), int), _typed(data.get("path"), str), _typed(data.get("complete"), bool),
                   _typed(data.get("reason"), str), _typed(data.get("fenced_writer"), int, optional=True),
                   _typed(data.get("corrupt", False), bool))
