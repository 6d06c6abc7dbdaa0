"""The API's routes: one handler per route of the verb table (views/table.py), each only
turning its request into a call of views/ or a signed request, and the result into JSON.
`install` registers exactly the table's routes, and fails at start on one without a handler
or a handler without a route."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from nodeagent.accounting.ledger import opened
from nodeagent.api import bodies, session
from nodeagent.api.cache import read_key
from nodeagent.api.connections import PEER_KEY
from nodeagent.api.identity import Tokens, identify, limited
from nodeagent.api.problems import Problem
from nodeagent.api.service import Identity, Service
from nodeagent.coord import eventlog
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.coord.tokens import TokenStore
from nodeagent.errors import NotFoundError
from nodeagent.model.pool import PoolJobState
from nodeagent.model.request import Verb
from nodeagent.model.spec import new_job_id
from nodeagent.telemetry.logserve import MAX_TAIL_LINES
from nodeagent.views import (
    accounting,
    fairshare,
    jobs,
    logs,
    nodes,
    queues,
    show,
    stacks,
    status,
)
from nodeagent.views.allocation import allocation_doc
from nodeagent.views.documents import JSON_VERSION, event_doc, listing
from nodeagent.views.table import ROUTES

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
Who = Annotated[Identity, Depends(identify)]
Job = Annotated[str, Path(pattern=NAME)]
Node = Annotated[str, Path(pattern=NAME)]
EVENTS_BLOCK_MS = 2000  # a follower's wait for new events between keep-alives
SSE = "text/event-stream"
JSON = "application/json"


async def _service(request: Request) -> Service:
    """The service (a coroutine: FastAPI runs a plain function dependency in a worker thread,
    a thread hop per request for an attribute read)."""
    service: Service = request.app.state.service
    return service


Svc = Annotated[Service, Depends(_service)]


def _jobs(service: Service, job: str) -> JobStore:
    return JobStore(service.client, JobKeys(service.settings.key_prefix, job))


async def _done(service: Service, who: Identity, verb: Verb, args: dict[str, Any]) -> bodies.Done:
    reply = await service.change(who, verb, args)
    return bodies.Done(message=reply.message, user=reply.user)


# -- reads ---------------------------------------------------------------------------------


_REFRESHING: set[asyncio.Task[None]] = set()  # reads made again in the background, held


async def _kept(svc: Service, request: Request, document: Callable[[], Any]) -> Response:
    """The document, read once for every caller of the same read within limits.read_cache
    (api/cache.py): a read kept is answered on the event loop; a stale one too, its next read
    started in a worker thread; only one never made (or long unasked) waits for its read."""
    key = read_key(request.scope)
    render = lambda: json.dumps(document(), default=str).encode()  # noqa: E731
    body, refresh = svc.reads.claim(key)
    if body is None:
        body = await run_in_threadpool(svc.reads.get, key, render)
    elif refresh:
        task = asyncio.create_task(run_in_threadpool(svc.reads.refresh, key, render))
        _REFRESHING.add(task)

        def done(task: asyncio.Task[None]) -> None:
            _REFRESHING.discard(task)
            if task.cancelled() or task.exception() is not None:  # refresh itself never raises
                svc.reads.abandon(key, RuntimeError(f"the read of {key} was not made"))

        task.add_done_callback(done)
    return Response(body, media_type=JSON)


async def list_jobs(
    svc: Svc,
    who: Who,
    request: Request,
    user: str | None = None,
    state: PoolJobState | None = None,
    queue: str | None = None,
    array: str | None = None,
) -> Response:
    value = state.value if state is not None else None

    def document() -> dict[str, Any]:
        found = jobs.jobs(svc.store, user, value, queue, array, svc.views)
        return listing("jobs", svc.pool, found)

    return await _kept(svc, request, document)


async def show_job(svc: Svc, who: Who, request: Request, job: Job) -> Response:
    def document() -> dict[str, Any]:
        return show.show(svc.store, svc.settings.key_prefix, job, svc.pool_events)

    return await _kept(svc, request, document)


async def job_status(svc: Svc, who: Who, request: Request, job: Job) -> Response:
    def document() -> dict[str, Any]:
        store = _jobs(svc, job)
        if store.snapshot().record is None:
            raise NotFoundError(f"no job {job!r} in pool {svc.pool} nor outside it (GET /v1/jobs)")
        return status.job_status(store, svc.store)

    return await _kept(svc, request, document)


async def node_health(svc: Svc, who: Who, request: Request, job: Job, node: Node) -> Response:
    return await _kept(svc, request, lambda: status.node_health(_jobs(svc, job), node))


async def list_history(
    svc: Svc,
    who: Who,
    request: Request,
    since: str | None = None,
    user: str | None = None,
    state: PoolJobState | None = None,
    limit: Annotated[int, Query(ge=0)] = accounting.HISTORY_LIMIT,
) -> Response:
    value = state.value if state is not None else None

    def document() -> dict[str, Any]:
        with opened(svc.ledger()) as ledger:
            rows = accounting.history(svc.store, ledger, since, user, value, limit)
        return listing("jobs", svc.pool, rows)

    return await _kept(svc, request, document)


async def usage_report(
    svc: Svc,
    who: Who,
    request: Request,
    by: Literal["user", "queue", "day"] = "user",
    since: str | None = None,
    until: str | None = None,
    user: str | None = None,
) -> Response:
    def document() -> dict[str, Any]:
        with opened(svc.ledger()) as ledger:
            doc = accounting.report(svc.store, ledger, by, since, until, user)
        return {"version": JSON_VERSION, "pool": svc.pool, **doc}

    return await _kept(svc, request, document)


async def fair_share(svc: Svc, who: Who, request: Request) -> Response:
    return await _kept(svc, request, lambda: fairshare.share(svc.store))


async def list_nodes(svc: Svc, who: Who, request: Request) -> Response:
    return await _kept(svc, request, lambda: listing("nodes", svc.pool, nodes.nodes(svc.store)))


async def list_queues(svc: Svc, who: Who, request: Request) -> Response:
    return await _kept(svc, request, lambda: listing("queues", svc.pool, queues.queues(svc.store)))


def list_tokens(svc: Svc, who: Who) -> dict[str, Any]:
    mine = TokenStore(svc.client, svc.store.keys).listing()
    rows = [{"id": i, **entry} for i, entry in sorted(mine.items()) if entry["user"] == who.user]
    return listing("tokens", svc.pool, rows)


async def job_events(
    svc: Svc,
    who: Who,
    request: Request,
    job: Job,
    last: Annotated[int, Query(ge=0, le=10_000)] = 50,
    follow: bool = False,
) -> Response:
    return await _events(svc, request, _jobs(svc, job), last, follow)


async def pool_events(
    svc: Svc,
    who: Who,
    request: Request,
    last: Annotated[int, Query(ge=0, le=10_000)] = 50,
    follow: bool = False,
) -> Response:
    return await _events(svc, request, svc.store, last, follow)


async def _events(
    svc: Service, request: Request, store: JobStore | PoolStore, last: int, follow: bool
) -> Response:
    if not follow:
        return await _kept(svc, request, lambda: _events_document(store, last))
    entries = await run_in_threadpool(lambda: eventlog.tail(store, last) if last > 0 else [])
    cursor = entries[-1][0] if entries else store.last_event_id()

    def stream() -> Iterator[str]:
        nonlocal cursor
        for entry_id, fields in entries:
            yield _sse(event_doc(entry_id, fields), entry_id)
        while True:
            got = store.wait_events({store.keys.events: cursor}, EVENTS_BLOCK_MS)
            if not got:
                yield ": idle\n\n"  # a reader gone is found at this write
            for _, entry_id, fields in got:
                cursor = entry_id
                yield _sse(event_doc(entry_id, fields), entry_id)

    return StreamingResponse(stream(), media_type=SSE)


def _events_document(store: JobStore | PoolStore, last: int) -> dict[str, Any]:
    entries = eventlog.tail(store, last) if last > 0 else []
    return {"version": 1, "events": [event_doc(i, f) for i, f in entries]}


def rank_log(
    svc: Svc,
    who: Who,
    job: Job,
    rank: Annotated[int, Path(ge=0, le=1_000_000)],
    tail: Annotated[int, Query(ge=0, le=MAX_TAIL_LINES)] = 20,
    follow: bool = False,
) -> Any:
    """The rank's last `tail` lines as {"lines": [...]}; with follow, a stream of server-sent
    events ({"line": text} and {"notice": text}) until the job ends."""
    sign, as_uid = svc.signer(who)
    munge = svc.requests.auth() == "munge"
    ranks = logs.RankLogs(
        svc.client, svc.settings.key_prefix, svc.pool, job, sign if munge else None, as_uid
    )
    items = logs.read(ranks, rank, tail, follow)  # refusals raise here, before any byte
    if not follow:
        lines = [i.text for i in items if isinstance(i, logs.Line)]
        return {"version": 1, "job": job, "rank": rank, "lines": lines}

    def stream() -> Iterator[str]:
        for item in items:
            if isinstance(item, logs.Line):
                yield _sse({"line": item.text})
            elif isinstance(item, logs.Notice):
                yield _sse({"notice": item.text})
            else:
                yield ": idle\n\n"
        # The stream ends with the job: a listing read next must not say it runs (an answer
        # kept from before its end did, issue 81).
        svc.reads.changed()

    return StreamingResponse(stream(), media_type=SSE)


def job_stacks(
    svc: Svc,
    who: Who,
    job: Job,
    rank: Annotated[int | None, Query(ge=0, le=1_000_000)] = None,
    native: bool = False,
) -> Any:
    """Every rank's Python stacks now (`rank`: that one), as py-spy dumps them on its node;
    `native`: with native frames. Only the job's user and operators may ask."""
    sign, as_uid = svc.signer(who)
    munge = svc.requests.auth() == "munge"
    ranks = logs.RankLogs(
        svc.client, svc.settings.key_prefix, svc.pool, job, sign if munge else None, as_uid
    )
    return stacks.document(stacks.take(ranks, rank, native))


def _sse(doc: Any, entry_id: str | None = None) -> str:
    head = f"id: {entry_id}\n" if entry_id else ""
    return f"{head}data: {json.dumps(doc, default=str)}\n\n"


# -- changes -------------------------------------------------------------------------------


async def submit(svc: Svc, who: Who, body: bodies.Submit, response: Response) -> bodies.Submitted:
    """The pool leader checks the spec as it checks nodeagentctl's (and says what is wrong in
    the same words); a spec without an id gets one, as `submit` without --name."""
    done = await submitting(svc, who, body)
    response.status_code = 201
    response.headers["Location"] = location(done.job)
    return done


async def submitting(svc: Service, who: Identity, body: bodies.Submit) -> bodies.Submitted:
    """What `submit` does, and api/quick.py for a caller known already."""
    spec = {**body.spec, "id": body.spec.get("id") or new_job_id()}
    args: dict[str, Any] = {"spec": spec, **({"hold": True} if body.hold else {})}
    reply = await svc.change(who, Verb.SUBMIT, args)
    return bodies.Submitted(message=reply.message, user=reply.user, job=str(spec["id"]))


async def allocate(
    svc: Svc, who: Who, body: bodies.Allocate, response: Response
) -> bodies.Submitted:
    """An allocation of the shape `spec` says (views/allocation.py), admitted as a job is; it
    runs until cancelled (POST /v1/jobs/{job}/cancel) or its time limit."""
    spec = allocation_doc(body.spec)
    spec["id"] = spec.get("id") or new_job_id()
    reply = await svc.change(who, Verb.SUBMIT, {"spec": spec})
    response.status_code = 201
    response.headers["Location"] = location(str(spec["id"]))
    return bodies.Submitted(message=reply.message, user=reply.user, job=str(spec["id"]))


def location(job: str) -> str:
    return f"/v1/jobs/{job}"


async def scale(svc: Svc, who: Who, job: Job, body: bodies.Scale) -> bodies.Done:
    return await _done(svc, who, Verb.SCALE, {"job": job, "target": body.target})


def _job_verb(
    verb: Verb, extra: dict[str, str] | None = None
) -> Callable[..., Awaitable[bodies.Done]]:
    async def handler(svc: Svc, who: Who, job: Job) -> bodies.Done:
        return await _done(svc, who, verb, {"job": job, **(extra or {})})

    return handler


def _cordon(action: str) -> Callable[..., Awaitable[bodies.Done]]:
    async def handler(
        svc: Svc, who: Who, node: Node, body: bodies.Cordon | None = None
    ) -> bodies.Done:
        body = body or bodies.Cordon()
        args: dict[str, Any] = {"action": action, "node": node, "reason": body.reason}
        if body.job is not None:
            args["job"] = body.job
        return await _done(svc, who, Verb.CORDON, args)

    return handler


async def create_queue(svc: Svc, who: Who, body: bodies.QueueNew) -> bodies.Done:
    args = {"action": "create", **body.model_dump()}
    return await _done(svc, who, Verb.QUEUE, args)


async def change_queue(
    svc: Svc, who: Who, body: bodies.QueueChange, queue: Annotated[str, Path(pattern=NAME)]
) -> bodies.Done:
    given = {k: v for k, v in body.model_dump().items() if k in body.model_fields_set}
    return await _done(svc, who, Verb.QUEUE, {"action": "set", "name": queue, **given})


async def delete_queue(
    svc: Svc, who: Who, queue: Annotated[str, Path(pattern=NAME)]
) -> bodies.Done:
    return await _done(svc, who, Verb.QUEUE, {"action": "delete", "name": queue})


async def revoke_token(
    svc: Svc, who: Who, token: Annotated[str, Path(pattern=r"^(all|[0-9a-f]{16})$")]
) -> bodies.Done:
    return await _done(svc, who, Verb.TOKEN, {"action": "revoke", "id": token})


# -- a browser's session (api/session.py) -------------------------------------------------


def sign_in(svc: Svc, request: Request, response: Response, body: bodies.SignIn) -> bodies.Session:
    where = request.client.host if request.client else "the socket"
    limited(request.app.state.limiter, f"sign-ins from {where}")
    tokens: Tokens = request.app.state.tokens
    open_now = session.cookie_token(request.cookies, request.scope.get(PEER_KEY) is not None)
    if open_now is not None:  # a page of another site must not swap this browser's user
        try:
            user = tokens.user(open_now)
        except Problem:
            user = None  # revoked, expired: replaced
        if user is not None:
            raise Problem(409, f"this browser is signed in as {user} already: sign out first")
    return session.sign_in(svc, request, response, body.code, tokens.remember)


def who_signed_in(who: Who, request: Request) -> bodies.Session:
    if who.token is None:  # the Unix socket's caller: no session, no token
        return bodies.Session(user=who.user, operator=False, expires=None, csrf=None)
    tokens: Tokens = request.app.state.tokens
    on_socket = request.scope.get(PEER_KEY) is not None
    cookie = session.cookie_token(request.cookies, on_socket) == who.token
    return session.document(who.token, who.user, tokens.operator(who.token), with_csrf=cookie)


async def sign_out(svc: Svc, who: Who, request: Request, response: Response) -> bodies.Done:
    session.sign_out(response)
    if who.token is None:
        return bodies.Done(message="no session on the socket", user=who.user)
    done = await _done(
        svc, who, Verb.TOKEN, {"action": "revoke", "id": session.token_id(who.token)}
    )
    tokens: Tokens = request.app.state.tokens
    tokens.forget(who.token)
    return done


HANDLERS: dict[tuple[str, str], Callable[..., Any]] = {
    ("GET", "/v1/jobs/{job}/status"): job_status,
    ("POST", "/v1/jobs/{job}/scale"): scale,
    ("GET", "/v1/jobs/{job}/events"): job_events,
    ("GET", "/v1/events"): pool_events,
    ("POST", "/v1/jobs/{job}/restart"): _job_verb(Verb.COMMAND, {"kind": "restart"}),
    ("POST", "/v1/jobs/{job}/stop"): _job_verb(Verb.COMMAND, {"kind": "stop"}),
    ("POST", "/v1/nodes/{node}/cordon"): _cordon("cordon"),
    ("POST", "/v1/nodes/{node}/drain"): _cordon("drain"),
    ("POST", "/v1/nodes/{node}/uncordon"): _cordon("uncordon"),
    ("GET", "/v1/jobs/{job}/nodes/{node}/health"): node_health,
    ("GET", "/v1/jobs/{job}/logs/{rank}"): rank_log,
    ("GET", "/v1/jobs/{job}/stacks"): job_stacks,
    ("POST", "/v1/jobs"): submit,
    ("POST", "/v1/allocations"): allocate,
    ("GET", "/v1/jobs"): list_jobs,
    ("GET", "/v1/nodes"): list_nodes,
    ("POST", "/v1/jobs/{job}/cancel"): _job_verb(Verb.CANCEL),
    ("POST", "/v1/jobs/{job}/hold"): _job_verb(Verb.HOLD),
    ("POST", "/v1/jobs/{job}/release"): _job_verb(Verb.RELEASE),
    ("POST", "/v1/jobs/{job}/requeue"): _job_verb(Verb.REQUEUE),
    ("GET", "/v1/jobs/{job}"): show_job,
    ("GET", "/v1/history"): list_history,
    ("GET", "/v1/report"): usage_report,
    ("GET", "/v1/share"): fair_share,
    ("GET", "/v1/queues"): list_queues,
    ("POST", "/v1/queues"): create_queue,
    ("PATCH", "/v1/queues/{queue}"): change_queue,
    ("DELETE", "/v1/queues/{queue}"): delete_queue,
    ("GET", "/v1/tokens"): list_tokens,
    ("DELETE", "/v1/tokens/{token}"): revoke_token,
    ("POST", "/v1/session"): sign_in,
    ("GET", "/v1/session"): who_signed_in,
    ("DELETE", "/v1/session"): sign_out,
}


def install(app: FastAPI) -> None:
    """Register the table's routes, each under its verb (its OpenAPI tag).

    Raises:
        RuntimeError: a route of the table without a handler, or a handler without a route.
    """
    table = {(r.method, r.path): (verb, r) for verb, routes in ROUTES.items() for r in routes}
    if set(table) != set(HANDLERS):
        raise RuntimeError(
            f"routes without handlers: {sorted(set(table) - set(HANDLERS))}; handlers without "
            f"routes: {sorted(set(HANDLERS) - set(table))}"
        )
    for key, (verb, route) in table.items():
        app.add_api_route(
            route.path,
            HANDLERS[key],
            methods=[route.method],
            summary=route.summary,
            tags=[verb],
            operation_id=f"{verb}_{route.method.lower()}_{_slug(route.path)}",
        )


def _slug(path: str) -> str:
    return "_".join(p.strip("{}") for p in path.split("/")[2:]) or "root"
