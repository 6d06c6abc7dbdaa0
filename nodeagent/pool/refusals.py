"""Why the pool leader refuses a request, and the reply that says it (pool/requests.py):
each kind of refusal with what the faces make of it (nodeagentctl's exit code, HTTP's
status)."""

from __future__ import annotations

from nodeagent.model.request import Reply
from nodeagent.pool.submission import Refused
from nodeagent.pool.tokens import TokenRefused


class Missing(Refused):
    """Refused: the job or node it names does not exist (nodeagentctl exits 3; HTTP 404)."""


class Forbidden(Refused):
    """Refused: the caller may not do this to what it names (HTTP 403)."""


class Invalid(Refused):
    """Refused: the request itself is wrong (a spec that does not load; HTTP 422)."""


class Replayed(Exception):
    """The request's credential was taken before: refused, nothing done."""


KINDS = {Missing: "missing", Forbidden: "forbidden", Invalid: "invalid", TokenRefused: "forbidden"}


def refused(exc: Refused | TokenRefused, user: str) -> Reply:
    kind = KINDS.get(type(exc), "")
    return Reply(False, f"refused: {exc}", user, kind == "missing", kind)


def submitted_message(job_id: str, runs_as: str) -> str:
    return f"job {job_id} submitted, runs as {runs_as}"


def replayed(user: str) -> Reply:
    return Reply(
        False, "refused: credential replayed: it was used before", user, kind="unauthenticated"
    )
