"""The API service's application: the routes of the verb table (api/routes.py), the web UI
under /ui/ (api/ui.py), who calls
(api/identity.py), problem details for every error (api/problems.py), and a bound on bodies
(api/limits.py). `make_app(service)` builds it around a Service; nothing else is kept, so a
restart loses nothing the pool does not keep."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from nodeagent import __version__
from nodeagent.api import problems, routes, ui
from nodeagent.api.identity import Tokens
from nodeagent.api.kept import KeptReads
from nodeagent.api.limits import BodyLimit, RateLimiter
from nodeagent.api.quick import QuickSubmit
from nodeagent.api.service import Service

DESCRIPTION = """The pool from anywhere (docs/api.md): what `nodeagentctl` does, over HTTP.

Authenticate with an API token (`nodeagentctl token`) as `Authorization: Bearer <token>`, or
connect to the service's Unix socket, where the kernel names you. Every change is judged by the
pool's agents by your own identity, as `nodeagentctl`'s are. Errors are problem details (RFC
9457)."""


def make_app(service: Service | None) -> FastAPI:
    """The app around `service` (None: the app alone, for its OpenAPI document)."""
    app = FastAPI(
        title="nodeagent",
        version=__version__,
        description=DESCRIPTION,
        docs_url=None,  # no page that loads scripts from a CDN
        redoc_url=None,
        openapi_url="/v1/openapi.json",
    )
    if service is not None:
        app.state.service = service
        app.state.tokens = Tokens(service)
        limits = service.settings.limits
        app.state.limiter = RateLimiter(limits.requests_per_second, limits.burst)
    problems.install(app)
    routes.install(app)
    ui.install(app)

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    return app


def asgi(service: Service) -> Any:
    """The app behind its body limit, with kept reads and known callers' submissions
    answered before it (api/kept.py, api/quick.py): what the server runs."""
    app = make_app(service)
    tokens, limiter = app.state.tokens, app.state.limiter
    kept = KeptReads(app, service.reads, tokens, limiter)
    quick = QuickSubmit(kept, service, tokens, limiter)
    return BodyLimit(quick, service.settings.limits.body_bytes)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document (docs/openapi.json is this, committed:
    `nodeagent api --openapi > docs/openapi.json`)."""
    document: dict[str, Any] = make_app(None).openapi()
    return document
