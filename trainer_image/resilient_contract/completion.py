"""An explicit success signal the operator can trust more than an exit code.

A worker can finish all its work and still exit 1 at interpreter shutdown (seen with gloo:
`terminate called without an active exception`). So success is *recorded*, not inferred: local rank 0
of every pod writes a one-line message to the pod's termination-message file (Kubernetes copies it
into `status.containerStatuses[].state.terminated.message`), and global rank 0 also drops a marker file
in the checkpoint root. The launcher reads the message back and exits 0 if the run succeeded even
though a worker's exit code says otherwise.

Message format (one line, `key=value` fields, parse with `parse_message`):
    RTJ_SUCCEEDED step=120 attempt=2 world_size=4
    RTJ_PREEMPTED step=57 checkpoint=/ckpt/step-0000000057 attempt=2 world_size=4
    RTJ_HUNG step=41 rank=3 stalled_s=30.2 timeout_s=30 attempt=2     (the launcher's hang watchdog)
    RTJ_CHECKPOINT_REFUSED refused_checkpoint=step-0000000060 resumed_from=step-0000000040 attempt=2
                                          (the resume found a corrupt checkpoint and fell back: written at once)

After such a fallback every later message of the process carries `refused_checkpoint=` too (step directory
names, comma-separated: `refused_checkpoints(outcome)` parses them, bounded).

Torch-free: the operator imports these constants.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

TERMINATION_LOG_DEFAULT = "/dev/termination-log"  # Kubernetes' default terminationMessagePath
TERMINATION_LOG_ENV = "RTJ_TERMINATION_LOG"  # override (tests, or a pod spec with another path)
SUCCEEDED = "RTJ_SUCCEEDED"
PREEMPTED = "RTJ_PREEMPTED"
HUNG = "RTJ_HUNG"  # no step for the progress timeout: the launcher ended the pod (resilient_contract.progress)
CHECKPOINT_REFUSED = "RTJ_CHECKPOINT_REFUSED"  # a resume refused a corrupt checkpoint and fell back (see above)
KINDS = (SUCCEEDED, PREEMPTED, HUNG, CHECKPOINT_REFUSED)
REFUSED_CHECKPOINT_FIELD = "refused_checkpoint"  # step directory names the trainer refused as corrupt
MAX_REFUSED_NAMED = 8  # names of refused checkpoints a message may carry (and a parser believes)
COMPLETED_MARKER_FILE = "_RTJ_COMPLETED"  # in the checkpoint root; never matches a step directory
MAX_MESSAGE_BYTES = 4096  # Kubernetes truncates termination messages at 4096 bytes
MAX_STEP = 10**10 - 1  # the largest step the checkpoint layout can name (storage.names.STEP_DIGITS): within int64
MAX_SECONDS = 10.0**7  # ~116 days: longer "stalled" or "timeout" claims are not believed
_ASCII_INT = re.compile(r"[0-9]{1,18}", re.ASCII)
_ASCII_DECIMAL = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,9})?", re.ASCII)


@dataclass(frozen=True)
class Outcome:
    """A parsed completion message."""

    kind: str
    fields: dict[str, str]

    @property
    def succeeded(self) -> bool:
        return self.kind == SUCCEEDED

    def int_field(self, key: str, limit: int = MAX_STEP) -> int | None:
        """A field as an int in [0, limit], ASCII digits only; None when absent or not one (hostile input:
        the message is written by the tenant's container)."""
        return bounded_int(self.fields.get(key), limit)

    def seconds_field(self, key: str, limit: float = MAX_SECONDS) -> float | None:
        """A field as non-negative seconds (`12` or `12.5`, ASCII) no larger than `limit`, else None."""
        text = self.fields.get(key)
        if text is None or not _ASCII_DECIMAL.fullmatch(text):
            return None
        value = float(text)
        return value if value <= limit else None


def refused_checkpoints(outcome: Outcome | None) -> tuple[str, ...]:
    """The step directory names a message says the trainer refused as corrupt: only well-formed names
    (`step-<10 digits>[.a<attempt>]`), at most MAX_REFUSED_NAMED (tenant-written: anything else is dropped)."""
    from resilient_contract.storage.names import parse_step_dir

    text = outcome.fields.get(REFUSED_CHECKPOINT_FIELD) if outcome is not None else None
    if not text or len(text) > MAX_REFUSED_NAMED * 32:
        return ()
    names = [n for n in text.split(",")[:MAX_REFUSED_NAMED] if parse_step_dir(n) is not None]
    return tuple(dict.fromkeys(names))


def bounded_int(text: str | None, limit: int = MAX_STEP) -> int | None:
    """`text` as an int in [0, limit] if it is 1 to 18 ASCII digits (so within int64), else None."""
    if text is None or not _ASCII_INT.fullmatch(text):
        return None
    value = int(text)
    return value if value <= limit else None


def termination_log_path(environ: Mapping[str, str] | None = None) -> str | None:
    """`$RTJ_TERMINATION_LOG` if set; else Kubernetes' default path if it exists (the kubelet mounts
    that file into every container); else None: not in a pod, so there is nothing to write (never
    create a file in /dev on a workstation, even as root)."""
    env = os.environ if environ is None else environ
    override = env.get(TERMINATION_LOG_ENV)
    if override:
        return override
    return TERMINATION_LOG_DEFAULT if os.path.exists(TERMINATION_LOG_DEFAULT) else None


def format_message(kind: str, **fields: object) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown completion kind {kind!r}")
    parts = [kind]
    for key, value in fields.items():
        text = str(value)
        if any(c.isspace() for c in text) or "=" in key:
            raise ValueError(f"field {key}={text!r} must not contain whitespace")
        parts.append(f"{key}={text}")
    line = " ".join(parts)
    if len(line.encode()) > MAX_MESSAGE_BYTES:
        raise ValueError("completion message longer than a termination message may be")
    return line


def parse_message(text: str | None) -> Outcome | None:
    """The outcome in a termination message (the last line that carries one), or None."""
    if not text:
        return None
    text = text[-MAX_MESSAGE_BYTES:]  # the kubelet keeps at most this much; never parse more
    for line in reversed(text.strip().splitlines()):
        words = line.split()
        if words and words[0] in KINDS:
            fields = dict(w.split("=", 1) for w in words[1:] if "=" in w)
            return Outcome(words[0], fields)
    return None


def write_termination_message(kind: str, path: str | None = None, **fields: object) -> str:
    """Write the message atomically enough for one writer per pod (local rank 0); returns it. Outside
    a pod with no `$RTJ_TERMINATION_LOG` (see termination_log_path) nothing is written."""
    line = format_message(kind, **fields)
    target = path or termination_log_path()
    if target is None:
        return line
    with open(target, "w", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
    return line


def read_termination_message(path: str | None = None) -> Outcome | None:
    target = path or termination_log_path()
    if target is None:
        return None
    try:
        with open(target, encoding="utf-8") as f:
            return parse_message(f.read(MAX_MESSAGE_BYTES))
    except OSError:
        return None


def write_completed_marker(checkpoint_root: str, **fields: object) -> str:
    """Global rank 0 records the finished run in the checkpoint root (temp file + rename)."""
    target = os.path.join(checkpoint_root, COMPLETED_MARKER_FILE)
    tmp = f"{target}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"kind": SUCCEEDED, **{k: str(v) for k, v in fields.items()}}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, target)
    return target


def read_completed_marker(checkpoint_root: str) -> dict[str, str] | None:
    try:
        with open(os.path.join(checkpoint_root, COMPLETED_MARKER_FILE), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
