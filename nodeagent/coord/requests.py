"""A pool's signed requests in Redis (pool.auth: munge): nodeagentctl sends them and reads the
answer; the pool leader takes them in order, once each (POOL_CLAIM, fenced), and answers."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import redis

from nodeagent.coord.durable import Durability
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.keys import EVENTS_MAXLEN, REPLY_TTL_S, REQUESTS_MAXLEN, PoolKeys
from nodeagent.coord.lua import Call
from nodeagent.coord.poolreplies import status_of
from nodeagent.coord.poolscripts import POOL_CLAIM, POOL_TAKE_SUBMIT
from nodeagent.errors import CorruptStateError
from nodeagent.model.decode import is_stream_id
from nodeagent.model.job import Event
from nodeagent.model.pool import PoolJob
from nodeagent.model.request import Reply, Request


class Taking(NamedTuple):
    """A request the pool leader takes: its lease value, the request, and its credential's id
    ('' for none) with when the credential expires."""

    leader: str
    request_id: str
    credential_id: str = ""
    expires_ms: int = 0


class RequestStore:
    """One pool's requests stream, its cursor and replay memory, the replies, and the pool
    leader's pool.auth (what tells nodeagentctl to sign)."""

    def __init__(self, client: redis.Redis, keys: PoolKeys) -> None:
        self.client = client
        self.keys = keys
        self._claim = POOL_CLAIM.bind(client)
        self._take_submit = POOL_TAKE_SUBMIT.bind(client)
        self.cursor: str | None = None  # the cursor `requests` last read (None: none stored)

    def auth(self) -> str | None:
        """The pool leader's pool.auth (None: no leader has said yet)."""
        with redis_errors("read the pool's auth"):
            found: Any = self.client.get(self.keys.auth)
        return str(found) if found is not None else None

    def publish_auth(self, mode: str, durability: Durability) -> None:
        """Say pool.auth (nodeagentctl signs its requests under munge) and pool.durability
        (what nodeagentctl confirms its own writes with under none: coord/durable.py)."""
        with redis_errors("publish the pool's auth"):
            pipe = self.client.pipeline(transaction=False)
            pipe.set(self.keys.auth, mode)
            pipe.set(self.keys.durability, durability.to_json())
            pipe.execute()

    def send(self, request: Request) -> str:
        """Append a request to the pool's requests stream; its id (the reply's name)."""
        with redis_errors("send the request"):
            found: Any = self.client.xadd(
                self.keys.requests,
                {"request": request.to_json()},
                maxlen=REQUESTS_MAXLEN,
                approximate=True,
            )
        return str(found)

    def reply(self, request_id: str) -> Reply | None:
        """The pool leader's answer (None: not yet, or unreadable)."""
        with redis_errors("read the reply"):
            raw: Any = self.client.get(self.keys.reply(request_id))
        return _reply(raw)

    def replies(self, request_ids: list[str]) -> list[Reply | None]:
        """The answers to several requests, in one round trip (each None: not yet, or
        unreadable)."""
        with redis_errors("read the replies"):
            found: Any = self.client.mget([self.keys.reply(r) for r in request_ids])
        return [_reply(raw) for raw in found]

    def done(self, request_ids: list[str]) -> dict[str, Reply]:
        """What each of these request ids was answered already (a retry's), in one round
        trip; an id answered nothing yet, or unreadable, is left out."""
        if not request_ids:
            return {}
        with redis_errors("read the answers given"):
            found: Any = self.client.mget([self.keys.done(r) for r in request_ids])
        answered = {r: _reply(raw) for r, raw in zip(request_ids, found, strict=True)}
        return {r: reply for r, reply in answered.items() if reply is not None}

    def requests(self, count: int = 64) -> list[tuple[str, str]]:
        """The requests after the last one taken, oldest first: (id, raw text)."""
        with redis_errors("read the requests"):
            try:
                cursor: Any = self.client.get(self.keys.request_cursor)
            except redis.ResponseError:  # WRONGTYPE: not nodeagent's; POOL_CLAIM rewrites it
                cursor = None
            if not is_stream_id(cursor):  # from the start: what was taken is refused again as
                cursor = None  # replayed or expired (PoolStore.claim), never done twice
            self.cursor = cursor
            entries: Any = self.client.xrange(
                self.keys.requests, f"({cursor}" if cursor else "-", "+", count=count
            )
        return [(str(i), str(fields.get("request", ""))[:200_000]) for i, fields in entries]

    def more_after(self, request_id: str, block_ms: int) -> bool:
        """Whether a request after `request_id` is in the stream, waiting up to `block_ms` for
        one (XREAD BLOCK: the pool leader's serving waits for the next request). The client's
        socket timeout must outlast `block_ms`."""
        with redis_errors("wait for requests"):
            found: Any = self.client.xread({self.keys.requests: request_id}, 1, block_ms)
        return bool(found)

    def claim(self, taking: Taking) -> bool:
        """Take a request (the cursor moves past it); False when its credential was taken
        before (a replay).

        Raises: FencedError when another node leads the pool."""
        with redis_errors("take a request"):
            found: Any = self._claim(self._claiming(taking))
        return str(found) == "ok"

    def take_submits(
        self, submissions: Sequence[tuple[Taking, Call]]
    ) -> list[tuple[bool, PoolJob | None] | None]:
        """Take each request and store the job it submits (PoolStore.submission's call), each
        in one script, all in one round trip, in order; for each as PoolStore.submit, or None
        when its credential was taken before (a replay: nothing stored).

        Raises: FencedError when another node leads the pool (those before it are done)."""
        if not submissions:
            return []
        with redis_errors("take the submissions"):
            pipe = self.client.pipeline(transaction=False)
            for taking, submission in submissions:
                claiming = self._claiming(taking)
                call = Call(
                    {**submission.keys, **claiming.keys}, {**submission.args, **claiming.args}
                )
                self._take_submit(call, client=pipe)
            found: list[Any] = pipe.execute(raise_on_error=False)
            for x in found:  # the first refusal as the script said it (FENCED), unannotated
                if isinstance(x, Exception):
                    raise x
        return [None if x == "replayed" else (bool(x[0]), status_of(x[1])) for x in found]

    def take_submit(self, taking: Taking, submission: Call) -> tuple[bool, PoolJob | None] | None:
        """One request taken and its job stored, as `take_submits`."""
        return self.take_submits([(taking, submission)])[0]

    def _claiming(self, taking: Taking) -> Call:
        k = self.keys
        return Call(
            {"leader": k.leader, "cursor": k.request_cursor, "seen": k.seen},
            {
                "leader_value": taking.leader,
                "request_id": taking.request_id,
                "credential_id": taking.credential_id,
                "expires_ms": taking.expires_ms,
            },
        )

    def answer(
        self,
        answers: list[tuple[str, Reply, Event | None]],
        done: Mapping[str, Reply] | None = None,
    ) -> None:
        """The replies to a batch of requests, and the events in the pool's stream that tell
        of them (each naming its request: what wakes a waiter, api/answers.py; None: none,
        its waiter polls the reply), in one MULTI/EXEC; `done`: what each request id of the
        batch came to, for its retries."""
        if not answers:
            return
        with redis_errors("answer the requests"):
            pipe = self.client.pipeline(transaction=True)
            for request_id, kept in (done or {}).items():
                pipe.set(self.keys.done(request_id), kept.to_json(), ex=REPLY_TTL_S)
            for request_id, reply, event in answers:
                pipe.set(self.keys.reply(request_id), reply.to_json(), ex=REPLY_TTL_S)
                if event is None:
                    continue
                pipe.xadd(
                    self.keys.events,
                    {"event": event.to_json()},
                    maxlen=EVENTS_MAXLEN,
                    approximate=True,
                )
            pipe.execute()


def _reply(raw: Any) -> Reply | None:
    try:
        return Reply.from_json(raw) if raw is not None else None
    except CorruptStateError:
        return None
