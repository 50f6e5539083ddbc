"""Status conditions the Kubernetes way: lastTransitionTime changes only when status changes."""

from __future__ import annotations

from typing import Any


def set_condition(
    status: dict[str, Any], ctype: str, value: bool, reason: str, message: str, now: str, generation: int
) -> bool:
    """Upsert one condition in `status`; returns True when its status flipped (a transition)."""
    conds: list[dict[str, Any]] = status.setdefault("conditions", [])
    new_status = "True" if value else "False"
    for cond in conds:
        if cond.get("type") == ctype:
            flipped = cond.get("status") != new_status
            if flipped:
                cond["lastTransitionTime"] = now
            cond.update(status=new_status, reason=reason, message=message, observedGeneration=generation)
            return flipped
    conds.append(
        {
            "type": ctype,
            "status": new_status,
            "reason": reason,
            "message": message,
            "lastTransitionTime": now,
            "observedGeneration": generation,
        }
    )
    return True


def get_condition(status: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond
    return None
