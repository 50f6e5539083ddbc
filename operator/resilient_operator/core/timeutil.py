"""RFC 3339 timestamps as Kubernetes writes them; the core never reads a clock."""

from __future__ import annotations

from datetime import UTC, datetime


def parse(value: str | None) -> datetime | None:
    """A timestamp, or None when absent or not one (a pod's times and conditions are not ours to trust)."""
    if not value or not isinstance(value, str) or len(value) > 64:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def fmt(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
