"""A request to change the pool (pool.auth: munge), its reply, and who made it. Pure.

`nodeagentctl` writes a request to the pool's requests stream: the verb, its arguments, the
pool, a nonce, and a MUNGE credential whose payload binds the digest of the other four
(model/credential.py). The pool leader takes each one, checks the credential (this request,
within its time to live, never seen before), decides what the caller may do (pool/requests.py)
and answers with a `Reply` under the request's id.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from nodeagent.errors import CorruptStateError
from nodeagent.model.credential import bound, digest_of
from nodeagent.model.decode import Reader

REQUEST_MAX_BYTES = 96 * 1024  # a spec (64 KiB at most) and the rest
# A request id: what makes a retry the same request (nodeagentctl makes one per command, the
# API takes a caller's Idempotency-Key); "" for none (an older client).
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{0,128}$")
UNACKNOWLEDGED = "unacknowledged"  # a Reply's kind: done, not confirmed on the replicas


def new_request_id() -> str:
    return secrets.token_hex(16)


class Verb(str, Enum):
    """What a request asks.

    SUBMIT   args {spec}: a new job (its user: the caller, unless the caller is an operator).
    CANCEL   args {job}: end a job (its owner or an operator).
    SCALE    args {job, target}: N, +N or -N nodes (its owner or an operator; a job pinned by
             its nodes' job: sections, operators only).
    COMMAND  args {job, kind: stop|restart}: through the job's command stream (as SCALE).
    QUEUE    args {action: create|set|delete, name, quota?, guaranteed?, max_priority?,
             gpu_quota?, gpu_guaranteed?} (operators only).
    CORDON   args {action: cordon|drain|uncordon, node, reason, job?}: a pool node, or with
             `job` a node inside that job (operators only).
    HOLD, RELEASE, REQUEUE  args {job}: keep a pending job from admission, let it go, put a
             running one back in the queue (its owner or an operator; pool/jobverbs.py).
    SUBMIT's args may hold `hold: true` (submit --hold).
    TOKEN    args {action: mint, lifetime_s} or {action: revoke, id} (an id, or "all": every
             token of the caller's): API tokens (model/token.py). Minted only for a MUNGE
             credential's own caller; the reply's `sealed` carries the token.
    WHOAMI   args {}: changes nothing; the reply names the caller (the API service asks it of
             a token it has not seen, since it cannot check one itself).
    KEEP     args {job}: an attended allocation's holder renews its lease (its owner or an
             operator; pool/holders.py).
    """

    SUBMIT = "submit"
    CANCEL = "cancel"
    SCALE = "scale"
    COMMAND = "command"
    QUEUE = "queue"
    CORDON = "cordon"
    HOLD = "hold"
    RELEASE = "release"
    REQUEUE = "requeue"
    TOKEN = "token"
    WHOAMI = "whoami"
    KEEP = "keep"


@dataclass(frozen=True)
class Request:
    """One request. `as_uid`: the uid of the caller on the API service's Unix socket (the
    kernel's SO_PEERCRED), for whom the service's own MUNGE credential vouches; taken only from
    the accounts of pool.api_users (pool/requests.py)."""

    pool: str
    verb: Verb
    args: Mapping[str, Any]
    nonce: str = field(default_factory=lambda: secrets.token_hex(8))
    credential: str = ""
    as_uid: int | None = None
    request_id: str = ""  # the same for every try of one change (REQUEST_ID)

    def canonical(self) -> bytes:
        """What the credential signs: everything but the credential, in one spelling."""
        body: dict[str, Any] = {
            "pool": self.pool,
            "verb": self.verb.value,
            "args": self.args,
            "nonce": self.nonce,
        }
        if self.as_uid is not None:
            body["as_uid"] = self.as_uid
        if self.request_id:
            body["request_id"] = self.request_id
        return json.dumps(body, separators=(",", ":"), sort_keys=True).encode()

    @property
    def digest(self) -> str:
        return digest_of(self.canonical())

    @property
    def payload(self) -> str:
        """The credential's payload (model/credential.bound)."""
        return bound(self.digest)

    def to_json(self) -> str:
        body = json.loads(self.canonical())
        body["credential"] = self.credential
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Request:
        """Raises: CorruptStateError naming what is wrong, and nothing else."""
        if len(raw) > REQUEST_MAX_BYTES:
            raise CorruptStateError(f"request: {len(raw)} bytes, more than {REQUEST_MAX_BYTES}")
        r = Reader.of(raw, "request")
        verbs = tuple(v.value for v in Verb)
        request_id = r.text("request_id", "", max_len=128)
        if not REQUEST_ID.match(request_id):
            raise CorruptStateError(f"request: request_id {request_id[:40]!r} is not an id")
        return cls(
            pool=r.name("pool"),
            verb=Verb(r.choice("verb", verbs)),
            args=dict(r.mapping("args")),
            nonce=r.text("nonce", max_len=64),
            credential=r.text("credential", "", max_len=4096),
            as_uid=r.opt_integer("as_uid", 0, 2**32 - 1),
            request_id=request_id,
        )


@dataclass(frozen=True)
class Reply:
    """The pool leader's answer to one request: done or refused, why, and who asked."""

    ok: bool
    message: str
    user: str = ""  # the authenticated caller ("" when the credential said nobody)
    missing: bool = False  # refused because the job or node named does not exist
    # why refused, for a face that says it in its own terms (HTTP's status): missing,
    # forbidden (the caller may not), invalid (the request is wrong), unauthenticated, or ""
    kind: str = ""
    sealed: str = ""  # TOKEN mint: a MUNGE credential only the caller's uid decodes

    @property
    def unacknowledged(self) -> bool:
        """Done, but not on the replicas pool.durability asks for (coord/durable.py): the pool
        may or may not keep it; the same request again (its request id) never doubles it."""
        return self.kind == UNACKNOWLEDGED

    def as_unacknowledged(self, why: str, request_id: str) -> Reply:
        again = f"; run it again with --request-id {request_id}" if request_id else ""
        return Reply(False, f"{why}{again}", self.user, kind=UNACKNOWLEDGED)

    def to_json(self) -> str:
        body: dict[str, Any] = {"ok": self.ok, "message": self.message, "user": self.user}
        if self.missing:
            body["missing"] = True
        if self.kind:
            body["kind"] = self.kind
        if self.sealed:
            body["sealed"] = self.sealed
        return json.dumps(body, separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Reply:
        """Raises: CorruptStateError, and nothing else."""
        r = Reader.of(raw, "reply")
        return cls(
            r.flag("ok", False),
            r.text("message", "", 2048),
            r.text("user", "", 256),
            r.flag("missing", False),
            r.text("kind", "", 32),
            r.text("sealed", "", 4096),
        )


@dataclass(frozen=True)
class Caller:
    """Who a credential says made a request, as the pool leader's host knows them."""

    uid: int
    gid: int
    name: str
    operator: bool = False

    def may_act_on(self, owner: str) -> bool:
        return self.operator or owner == self.name
