"""The in-place restart plan: what the operator hands a surviving pod's agent, signed so only it can.

When a recovery keeps a pod (`spec.restartStrategy: InPlace`), the operator POSTs a `Plan` to the agent
(`resilient_trainer.launch`) listening on `$RTJ_AGENT_PORT` in that pod. The agent stops its workers,
confirms they are gone, and starts the next attempt's workers with the plan's environment. One definition,
read by both sides; nothing here imports torch.

Authentication is a signature, not a shared secret: the operator signs with an Ed25519 key only it holds (a
Secret in its own namespace); every worker pod gets the public key in `$RTJ_PLAN_PUBLIC_KEY`. Reading a pod
spec, or copying one into an impostor pod, gives no power to forge a plan. A plan names the job's uid and
the target pod's uid (`$RTJ_POD_UID`, from the downward API), so a plan for one pod or job steers no other;
and an agent accepts only an attempt newer than the one it runs, so a replayed plan changes nothing.

Wire format: `POST /plan` with the JSON body `{"plan": {...}, "signature": "<base64>"}`; the signature is
over `canonical(plan)`. The agent answers 200 with `{"attempt": N, "state": "started"}` once the previous
workers are gone and the new ones were started (the operator's acknowledgement), 200 as well for the plan
of the attempt already running (a retry), 403 for a bad signature or another pod's/job's plan, 409 for an
older attempt, 400 for a malformed body.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from resilient_contract import environment

AGENT_PORT_ENV = "RTJ_AGENT_PORT"  # the agent listens here (the operator injects it; 0 or absent: no agent)
PUBLIC_KEY_ENV = "RTJ_PLAN_PUBLIC_KEY"  # base64 of the operator's raw 32-byte Ed25519 public key
POD_UID_ENV = "RTJ_POD_UID"  # this pod's metadata.uid (downward API): a plan must name it
# After its workers failed, the agent waits this long for a plan before it ends the pod as before (a worker
# that lost a peer fails too, and its pod is the one the operator wants to keep).
LINGER_ENV = "RTJ_AGENT_LINGER_SECONDS"
DEFAULT_AGENT_PORT = 29401
PATH = "/plan"
MAX_BODY_BYTES = 16 * 1024  # a plan is a few hundred bytes; anything bigger is refused unread
STARTED = "started"


class PlanError(ValueError):
    """A plan this agent must not act on; the message says why (and becomes the HTTP answer: 400)."""


class NotForUs(PlanError):
    """Well formed, but not signed by the operator or not for this job or pod (HTTP 403)."""


@dataclass(frozen=True)
class Plan:
    """One pod's part in the next attempt. Every field becomes the worker environment of that attempt."""

    job_uid: str
    pod_uid: str
    attempt: int
    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    resume_from: str  # "" = from scratch
    # The rendezvous host's agent port (0: unknown). An agent of another rank starts its torchrun only once
    # that agent runs this attempt: until then an old generation's store may still listen on master_port.
    master_agent_port: int = 0

    def environ(self) -> dict[str, str]:
        """The variables this plan overrides in the pod's injected environment (environment.py's names)."""
        return {
            environment.ATTEMPT: str(self.attempt),
            environment.NNODES: str(self.nnodes),
            environment.NODE_RANK: str(self.node_rank),
            environment.MASTER_ADDR: self.master_addr,
            environment.MASTER_PORT: str(self.master_port),
            environment.RESUME_FROM: self.resume_from,
        }

    @classmethod
    def from_dict(cls, raw: Any) -> Plan:
        if not isinstance(raw, Mapping):
            raise PlanError("plan: not an object")
        try:
            plan = cls(
                job_uid=_text(raw, "job_uid"), pod_uid=_text(raw, "pod_uid"), attempt=_int(raw, "attempt", 1),
                nnodes=_int(raw, "nnodes", 1), node_rank=_int(raw, "node_rank", 0),
                master_addr=_text(raw, "master_addr"), master_port=_int(raw, "master_port", 1),
                resume_from=_text(raw, "resume_from", empty=True),
                master_agent_port=_int(raw, "master_agent_port", 0) if "master_agent_port" in raw else 0)
        except KeyError as exc:
            raise PlanError(f"plan: missing {exc.args[0]}") from None
        if plan.node_rank >= plan.nnodes:
            raise PlanError(f"plan: node_rank {plan.node_rank} >= nnodes {plan.nnodes}")
        return plan


def _text(raw: Mapping[str, Any], key: str, empty: bool = False) -> str:
    value = raw[key]
    if not isinstance(value, str) or (not value and not empty) or len(value) > 1024:
        raise PlanError(f"plan: {key} must be a {'' if empty else 'non-empty '}string")
    return value


def _int(raw: Mapping[str, Any], key: str, minimum: int) -> int:
    value = raw[key]
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value < 2**31:
        raise PlanError(f"plan: {key} must be an integer >= {minimum}")
    return value


def canonical(plan: Plan) -> bytes:
    """The signed bytes: sorted keys, no spaces, so both sides agree byte for byte."""
    return json.dumps(asdict(plan), sort_keys=True, separators=(",", ":")).encode()


def _ed25519() -> Any:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return ed25519


def new_private_key() -> bytes:
    """A fresh raw 32-byte Ed25519 private key (the operator's; kept in a Secret in its namespace)."""
    from cryptography.hazmat.primitives import serialization

    key = _ed25519().Ed25519PrivateKey.generate()
    return bytes(key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                   serialization.NoEncryption()))


def public_key(private: bytes) -> str:
    """The base64 public key for `$RTJ_PLAN_PUBLIC_KEY`."""
    from cryptography.hazmat.primitives import serialization

    pub = _ed25519().Ed25519PrivateKey.from_private_bytes(private).public_key()
    return base64.b64encode(pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)).decode()


def sign(plan: Plan, private: bytes) -> bytes:
    """The request body for `POST /plan`."""
    signature = _ed25519().Ed25519PrivateKey.from_private_bytes(private).sign(canonical(plan))
    return json.dumps({"plan": asdict(plan), "signature": base64.b64encode(signature).decode()}).encode()


def verify(body: bytes, public: str, job_uid: str, pod_uid: str) -> Plan:
    """The plan in `body` if the operator signed it for this job and this pod; otherwise PlanError."""
    from cryptography.exceptions import InvalidSignature

    if len(body) > MAX_BODY_BYTES:
        raise PlanError(f"plan: body over {MAX_BODY_BYTES} bytes")
    try:
        envelope = json.loads(body)
        raw, signature = envelope["plan"], base64.b64decode(envelope["signature"], validate=True)
        key = _ed25519().Ed25519PublicKey.from_public_bytes(base64.b64decode(public, validate=True))
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise PlanError(f"plan: malformed ({type(exc).__name__})") from None
    plan = Plan.from_dict(raw)
    try:
        key.verify(signature, canonical(plan))
    except InvalidSignature:
        raise NotForUs("plan: signature is not the operator's") from None
    if plan.job_uid != job_uid:
        raise NotForUs("plan: for another job")
    if plan.pod_uid != pod_uid:
        raise NotForUs("plan: for another pod")
    return plan
