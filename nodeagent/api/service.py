"""What the API service does for every route: read the pool, and ask the pool leader for a
change as the caller. It holds no power of its own (docs/api.md): each change goes to the
pool's requests stream signed as the caller, which the pool leader judges as it judges
`nodeagentctl`'s:
- a caller with an API token: the request carries the token's proof (model/token.py; the
  token itself never goes into Redis);
- a caller on the Unix socket: the service's own MUNGE credential vouches for the uid the
  kernel gave it (Request.as_uid), which the pool takes only from pool.api_users' accounts.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from starlette.concurrency import run_in_threadpool

from nodeagent.accounting.databases import open_ledger
from nodeagent.accounting.ledger import Ledger
from nodeagent.api.answers import Answers
from nodeagent.api.cache import Fresh
from nodeagent.api.problems import RETRY_AFTER_S, Problem, refused
from nodeagent.config.api import ApiSettings
from nodeagent.config.hosts import Resolver
from nodeagent.config.keyfile import read_password
from nodeagent.coord.client import Redis
from nodeagent.coord.eventlog import DecodedTail
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.model.credential import PAYLOAD_PREFIX, Decoded, Munge, MungeUnavailable
from nodeagent.model.request import Reply, Request, Verb
from nodeagent.model.token import TokenError, credential, parse_token, unsealed
from nodeagent.pool.leadership import NodeViews
from nodeagent.telemetry.logserve import Sign
from nodeagent.views.show import EVENTS_READ

AUTH_KEPT_S = 10.0  # how long the pool leader's pool.auth is taken as read
POLL_S = 1.0  # a caller waiting for its answer reads it this often, should its wake be missed


@dataclass(frozen=True)
class Identity:
    """Who calls: `token`, a bearer's API token; `peer_uid`, the kernel's uid of a caller on
    the Unix socket without one; `request_id`, the caller's Idempotency-Key for the change this
    HTTP request asks (its every try the same change: pool/retries.py)."""

    user: str
    token: str | None = None
    peer_uid: int | None = None
    request_id: str = ""


class Service:
    def __init__(
        self,
        settings: ApiSettings,
        client: Redis,
        munge: Munge,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.client = client
        self.store = PoolStore(client, PoolKeys(settings.key_prefix, settings.pool))
        self.requests = RequestStore(client, self.store.keys)
        self.munge = munge
        self.clock = clock
        self._auth: tuple[float, str | None] = (-AUTH_KEPT_S, None)
        self.reads = Fresh(settings.limits.read_cache)
        self.pool_events = DecodedTail(EVENTS_READ)  # every show's requeues, decoded once
        # the jobs' views the listings keep between reads (two listings made at once in two
        # threads may each miss the other's: made again, never wrong)
        self.views = NodeViews()
        self._answers = Answers(self.store, self.requests)
        uid = os.geteuid()
        self.account = Resolver().name_of(uid) or f"uid {uid}"  # the service's own user
        self._accounting_password: str | None = None  # read once: a bad file stops the start
        if settings.accounting_password_file:
            path, key = settings.accounting_password_file, "accounting.password_file"
            self._accounting_password = read_password(path, key)

    @property
    def pool(self) -> str:
        return self.store.keys.pool

    def ledger(self) -> Ledger | None:
        """The accounting database, opened for one read (a connection per read: reads run in
        worker threads, and a connection is not shared between them); None: none configured."""
        database = self.settings.accounting
        if database is None:
            return None
        return open_ledger(database, self._accounting_password, writer=False)

    async def change(self, who: Identity, verb: Verb, args: dict[str, Any]) -> Reply:
        """Ask the pool leader for a change as `who`; its answer when done. The request is
        signed and sent in a worker thread; the answer is awaited on the event loop, holding
        no thread (api/answers.py hands it over).

        Raises:
            Problem: refused (its status from the refusal's kind), no answer (504), the pool
                takes no signed requests or munged is away (503).
            CoordinationError: Redis (503).
        """
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[Reply] = loop.create_future()

        def deliver(reply: Reply) -> None:
            loop.call_soon_threadsafe(_settle, answered, reply)

        # Its answer is expected here, on the loop, once it was sent: a caller gone during the
        # send (the coroutine cancelled at the await) leaves no waiter behind.
        request_id = await run_in_threadpool(self._send, who, verb, args)
        try:
            expected = self._answers.expect(request_id, deliver)
            reply = None if expected else await run_in_threadpool(self.requests.reply, request_id)
            deadline = self.clock() + self.settings.limits.answer_timeout
            while reply is None and (left := deadline - self.clock()) > 0:
                done, _ = await asyncio.wait({answered}, timeout=min(left, POLL_S))
                if done:
                    reply = answered.result()
                else:  # a wake missed: read it
                    reply = await run_in_threadpool(self.requests.reply, request_id)
        finally:
            self._answers.forget(request_id)
        if reply is None:
            raise self._unanswered(request_id)
        if not reply.ok:
            raise refused(reply)
        self.reads.changed()  # the caller's next read reads its change (api/cache.py)
        return reply

    def ask(self, who: Identity, verb: Verb, args: dict[str, Any]) -> Reply:
        """One signed request as `who`, and the pool leader's answer, whatever it is (blocking:
        from a worker thread)."""
        box: list[Reply] = []
        delivered = threading.Event()

        def deliver(reply: Reply) -> None:
            box.append(reply)
            delivered.set()

        request_id = self._send(who, verb, args)
        try:
            expected = self._answers.expect(request_id, deliver)
            reply = None if expected else self.requests.reply(request_id)
            deadline = self.clock() + self.settings.limits.answer_timeout
            while reply is None and (left := deadline - self.clock()) > 0:
                if delivered.wait(min(left, POLL_S)):
                    reply = box[0]
                else:  # a wake missed: read it
                    reply = self.requests.reply(request_id)
        finally:
            self._answers.forget(request_id)
        if reply is None:
            raise self._unanswered(request_id)
        if reply.ok:
            self.reads.changed()
        return reply

    def _send(self, who: Identity, verb: Verb, args: dict[str, Any]) -> str:
        """Sign a request as `who` and append it; its id. (An answer that comes before its
        caller expects it is remembered: api/answers.py, which follows the stream from before
        the first request is sent.)"""
        self._signed_pool()
        self._answers.start()
        as_uid = who.peer_uid if who.token is None else None
        request = Request(self.pool, verb, args, as_uid=as_uid, request_id=who.request_id)
        request = replace(
            request, credential=self._credential(who, request.digest, request.payload)
        )
        return self.requests.send(request)

    def _unanswered(self, request_id: str) -> Problem:
        return Problem(
            504,
            f"no pool leader answered request {request_id} within "
            f"{self.settings.limits.answer_timeout:g} s: are the agents of pool "
            f"{self.pool} running? (the request may still be taken: GET /v1/events)",
        )

    def signer(self, who: Identity) -> tuple[Sign, int | None]:
        """How a log request to a node's agent is signed as `who`, and the uid to name."""
        if who.token is not None:
            token = who.token
            return (
                lambda payload: credential(
                    token, payload.removeprefix(PAYLOAD_PREFIX), int(self.clock())
                )
            ), None
        return (lambda payload: self._munge(payload)), who.peer_uid

    def _credential(self, who: Identity, digest: str, payload: str) -> str:
        if who.token is None:
            return self._munge(payload)
        try:
            return credential(who.token, digest, int(self.clock()))
        except TokenError as exc:
            raise Problem(401, str(exc)) from None

    def unseal(self, sealed: str) -> str:
        """The token a pool leader's reply hands this service (sealed for its uid alone).

        Raises:
            Problem: 502, the reply does not decode here, is not an agent's, or holds no token.
        """
        try:
            found = self.munge.decode(sealed)
        except MungeUnavailable as exc:
            raise Problem(503, f"the API service cannot open the pool's answer: {exc}") from None
        if not isinstance(found, Decoded) or not found.status.signed or found.uid != 0:
            raise Problem(502, f"the pool's answer is not an agent's sealed token ({found})")
        try:
            return unsealed(found.payload)
        except TokenError as exc:
            raise Problem(502, str(exc)) from None

    def _munge(self, payload: str) -> str:
        try:
            return self.munge.encode(payload)
        except MungeUnavailable as exc:
            raise Problem(
                503,
                f"the API service cannot sign for its socket's callers: {exc}",
                {"Retry-After": str(RETRY_AFTER_S)},
            ) from None

    def _signed_pool(self) -> None:
        at, auth = self._auth
        now = self.clock()
        if now - at >= AUTH_KEPT_S:
            auth = self.requests.auth()
            self._auth = (now, auth)
        if auth != "munge":
            said = f"pool.auth: {auth}" if auth else "no pool leader has said its pool.auth yet"
            raise Problem(
                503,
                f"pool {self.pool} takes no signed requests ({said}): the API service changes "
                "only a pool whose agents judge who asks (pool.auth: munge)",
                {"Retry-After": str(RETRY_AFTER_S)},
            )


def _settle(future: asyncio.Future[Reply], reply: Reply) -> None:
    if not future.done():  # given up on (its wait timed out) or answered twice
        future.set_result(reply)


def token_user(text: str, pool: str, now_s: float) -> str:
    """The user a token names, if it can be one at all (its shape, pool and expiry; only the
    pool can say if it is genuine).

    Raises:
        Problem: 401, why not.
    """
    try:
        claims, _ = parse_token(text)
    except TokenError as exc:
        raise Problem(401, str(exc)) from None
    if claims.pool != pool:
        raise Problem(401, f"token made for pool {claims.pool}, not {pool}")
    if now_s >= claims.expires_s:
        raise Problem(401, f"token {claims.id} expired: mint another (nodeagentctl token)")
    return claims.user
