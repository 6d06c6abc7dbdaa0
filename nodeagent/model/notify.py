"""What a job's submitter asked to be told of (`submit --notify`, Slurm's --mail-type), and the
signed body the pool leader posts to the operator's endpoints (pool/notify.py). Pure.

    BEGIN       admitted
    END         ended, however (succeeded, failed, cancelled, timeout)
    FAIL        ended failed
    REQUEUE     put back in its queue (requeued, or evicted by a preemption)
    TIME_LIMIT  stopped at its time limit (ends as timeout)
    ALL         each of these

The body is JSON; `X-Nodeagent-Signature: sha256=HEX` is HMAC-SHA256 of its bytes under the
operator's key, and `X-Nodeagent-Delivery` the pool event's id, the same on a delivery made
again (a receiver drops a repeat by it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass

from nodeagent.model.pool import PoolJobState

KINDS = ("BEGIN", "END", "FAIL", "REQUEUE", "TIME_LIMIT")
SIGNATURE = "X-Nodeagent-Signature"
DELIVERY = "X-Nodeagent-Delivery"


class NotifyError(ValueError):
    """A --notify that is not one (said in words a user can act on)."""


def parse(text: str) -> tuple[str, ...]:
    """Raises: NotifyError."""
    found: dict[str, None] = {}
    for part in (p.strip().upper() for p in text.split(",")):
        if part == "ALL":
            found.update(dict.fromkeys(KINDS))
        elif part in KINDS:
            found[part] = None
        else:
            raise NotifyError(
                f"{part!r} is not a kind to be told of: expected any of "
                f"{', '.join(KINDS)} or ALL, comma-separated"
            )
    return tuple(k for k in KINDS if k in found)


def kinds_of(event_type: str, state: PoolJobState | None) -> frozenset[str]:
    """What a pool event says of its job, in these kinds (`state`: the job's state after it)."""
    if event_type == "job_admitted":
        return frozenset({"BEGIN"})
    if event_type in ("job_requeued", "job_evicted"):
        return frozenset({"REQUEUE"})
    if event_type != "job_ended":
        return frozenset()
    kinds = {"END"}
    if state is PoolJobState.FAILED:
        kinds.add("FAIL")
    if state is PoolJobState.TIMEOUT:
        kinds.add("TIME_LIMIT")
    return frozenset(kinds)


@dataclass(frozen=True)
class Notice:
    """One notification: which event, of which job, for whom, of what kinds."""

    delivery: str  # the pool event's id
    pool: str
    job: str
    user: str
    kinds: tuple[str, ...]
    state: str
    reason: str
    at_ms: int

    def body(self) -> bytes:
        doc = {
            "version": 1,
            "delivery": self.delivery,
            "pool": self.pool,
            "job": self.job,
            "user": self.user,
            "kinds": list(self.kinds),
            "state": self.state,
            "reason": self.reason,
            "at_ms": self.at_ms,
        }
        return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def signature(key: bytes, body: bytes) -> str:
    return "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
