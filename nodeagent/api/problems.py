"""Errors as problem details (RFC 9457): `application/problem+json` with a status, a title and
a detail a person can act on. Whatever a client sent wrong is a 4xx, never a 500; a Redis
outage is a 503 with Retry-After; a pool leader that does not answer, a 504."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from nodeagent.errors import (
    AccountingError,
    CoordinationError,
    NotFoundError,
    RefusedError,
    UsageError,
)
from nodeagent.model.request import UNACKNOWLEDGED, Reply

log = logging.getLogger(__name__)
MEDIA_TYPE = "application/problem+json"
RETRY_AFTER_S = 5
TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
# The pool leader's refusal kinds (model/request.Reply.kind) as statuses; other refusals are
# conflicts with the pool's state (a job that has ended, a queue that exists).
REPLY_STATUS = {
    "missing": 404,
    "forbidden": 403,
    "invalid": 422,
    "unauthenticated": 401,
    UNACKNOWLEDGED: 503,  # done, not yet on the replicas: the same Idempotency-Key again
}


class Problem(Exception):
    def __init__(self, status: int, detail: str, headers: Mapping[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = dict(headers or {})


def unauthorized(detail: str) -> Problem:
    return Problem(401, detail, {"WWW-Authenticate": 'Bearer realm="nodeagent"'})


def refused(reply: Reply) -> Problem:
    """The pool leader's refusal, with the status its kind says."""
    status = REPLY_STATUS.get(reply.kind, 404 if reply.missing else 409)
    if status == 401:
        return unauthorized(reply.message)
    if reply.unacknowledged:
        return Problem(status, reply.message, {"Retry-After": "1"})
    return Problem(status, reply.message)


def document(status: int, detail: str, instance: str = "") -> dict[str, Any]:
    doc: dict[str, Any] = {
        "type": "about:blank",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
    }
    if instance:
        doc["instance"] = instance
    return doc


def response(status: int, detail: str, instance: str = "", headers: Any = None) -> JSONResponse:
    return JSONResponse(
        document(status, detail, instance), status, headers=headers, media_type=MEDIA_TYPE
    )


def answer(exc: Exception, method: str, path: str) -> JSONResponse:
    """The problem document for `exc`, raised answering `method` `path`: what the app's
    handlers send (`install`), and api/quick.py's."""
    if isinstance(exc, Problem):
        return response(exc.status, exc.detail, path, exc.headers)
    if isinstance(exc, NotFoundError):
        return response(404, str(exc), path)
    if isinstance(exc, RefusedError):  # a node's own 401 or 403, as it said it
        return response(exc.status, str(exc), path)
    if isinstance(exc, UsageError):
        return response(409, str(exc), path)
    if isinstance(exc, CoordinationError):
        if isinstance(exc, AccountingError):
            log.warning("accounting: %s", exc)
            detail = f"the accounting database cannot be read now: {exc}"
        else:
            log.warning("Redis: %s", exc)
            detail = f"the pool's Redis cannot be reached now: {exc}"
        return response(503, detail, path, {"Retry-After": str(RETRY_AFTER_S)})
    if isinstance(exc, RequestValidationError):
        return response(422, _said(exc.errors()), path)
    if isinstance(exc, StarletteHTTPException):
        return response(exc.status_code, str(exc.detail), path, exc.headers)
    log.error("%s %s failed", method, path, exc_info=exc)
    return response(500, f"the API service failed: {type(exc).__name__}", path)


def install(app: FastAPI) -> None:
    """Every error the app can meet, as problem details."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return answer(exc, request.method, request.url.path)

    for kind in (
        Problem,
        NotFoundError,
        UsageError,
        CoordinationError,
        RequestValidationError,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(kind, handle)


def _said(errors: Any) -> str:
    """pydantic's errors in one line: where, and what is wrong."""
    parts = []
    for error in list(errors)[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body")
        parts.append(f"{where or 'body'}: {error.get('msg', 'invalid')}")
    return "; ".join(parts)
