"""The pool leader tells of job state changes their submitters asked for (`submit --notify`,
model/notify.py) to the endpoints the operator names (pool.notify; docs/pool.md,
"Notifications").

After each round the leader reads the pool's events past the last one told of (the pool's
`notified` key), and queues what each tells (the event carries its job's user, state and the
kinds asked for) to every endpoint. Each endpoint has a lane of its own: a bounded queue and a
thread that posts from it, so a slow or dead endpoint never holds a round back nor delays
another endpoint's notices (one thread for all once made a live endpoint wait 2 to 10 s behind
a refused one). A delivery is tried again twice, then given up, said in the log with the
endpoint's host and port and the job. A lane that falls a whole queue behind (an endpoint that
hangs through a burst) drops its oldest notices, said in the log, rather than hold the others.
The `notified` key moves only past events whose deliveries are over in every lane: a new
leader tells again what the old one may not have (a receiver drops a repeat by its
X-Nodeagent-Delivery), and nothing is told twice by one leader. A new pool starts telling from
its newest event, not from its history.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping
from http.client import HTTPException
from typing import Any
from urllib.parse import urlsplit

from nodeagent.config.settings import Notify
from nodeagent.coord.errors import redis_errors
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import CorruptStateError
from nodeagent.model.job import Event
from nodeagent.model.notify import DELIVERY, KINDS, SIGNATURE, Notice, kinds_of, signature
from nodeagent.model.pool import PoolJobState

log = logging.getLogger(__name__)
BATCH = 1000  # events read at once
RETRIES_S = (0.5, 1.5)  # the waits before a delivery's second and third tries
Post = Callable[[str, bytes, Mapping[str, str], float], None]  # raises OSError when refused


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is a refusal: the operator named the URL, not its server


# No redirects; and no proxy from the agent's environment (the operator named the endpoint).
_OPENER = urllib.request.build_opener(_NoRedirect, urllib.request.ProxyHandler({}))


def http_post(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> None:
    """POST `body`; a status other than 2xx, or no answer in `timeout`, raises OSError."""
    request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
    with _OPENER.open(request, timeout=timeout) as reply:
        if not 200 <= reply.status < 300:
            raise OSError(f"{url} answered {reply.status}")


LANE_SIZE = 1000  # events a lane holds before it drops its oldest


class _Lane:
    """One endpoint's deliveries, in order, on a thread of their own. `over(entry_id)` is called
    once per event when the lane is done with it (told, given up, or dropped)."""

    def __init__(self, url: str, send: Callable[[str, Notice], None], over: Callable[[str], None]):
        self.url = url
        self._send = send
        self._over = over
        self._queue: queue.Queue[tuple[str, list[Notice]]] = queue.Queue(LANE_SIZE)
        self._thread: threading.Thread | None = None

    def put(self, entry_id: str, notices: list[Notice]) -> None:
        while True:
            try:
                self._queue.put_nowait((entry_id, notices))
                break
            except queue.Full:  # a whole queue behind: the oldest goes
                try:
                    dropped, lost = self._queue.get_nowait()
                except queue.Empty:
                    continue
                for notice in lost:
                    log.warning(
                        "notify: %s of job %s not told to %s: it is %d events behind (dropped)",
                        ",".join(notice.kinds), notice.job, _where(self.url), LANE_SIZE,
                        extra={"job": notice.job, "generation": 0},
                    )  # fmt: skip
                self._over(dropped)
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(
                target=self._run, name=f"notify {_where(self.url)}", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while True:
            entry_id, notices = self._queue.get()
            for notice in notices:
                try:
                    self._send(self.url, notice)
                except Exception:  # a bug here must not stop every later notice
                    log.exception("notify: %s to %s", notice.job, _where(self.url))
            self._over(entry_id)


class Webhooks:
    def __init__(
        self,
        store: PoolStore,
        config: Notify,
        key: bytes,
        post: Post = http_post,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._store = store
        self._config = config
        self._key = key
        self._post = post
        self._sleep = sleep
        self._lanes = [_Lane(url, self._send, self._over) for url in config.endpoints]
        self._term: str | None = None  # the leader term the events were read in
        self._read: str | None = None  # the newest event queued
        self._pending: dict[str, int] = {}  # queued events, in order -> lanes not over with it
        self._done: str | None = None  # the newest event whose deliveries are over
        self._said: str | None = None  # ... as written to the `notified` key
        self._lock = threading.Lock()

    def tick(self, term: str) -> None:
        """Record the events told of, and queue those that came since (on the pool leader,
        after its round; never waits for a delivery).

        Raises:
            CoordinationError: Redis.
        """
        client, keys = self._store.client, self._store.keys
        with self._lock:
            done = self._done
        if done is not None and done != self._said:
            with redis_errors("record the pool events told of"):
                client.set(keys.notified, done)
            self._said = done
        if term != self._term:  # a new term: from what the pool recorded, not this memory
            self._term, self._read = term, None
        if self._read is None:
            with redis_errors("read the pool events told of"):
                said: Any = client.get(keys.notified)
            if said is None:
                newest: Any = client.xrevrange(keys.events, "+", "-", count=1)
                said = str(newest[0][0]) if newest else "0-0"
                client.set(keys.notified, said)
            self._read = str(said)
        with redis_errors("read the pool's events"):
            entries: Any = client.xrange(keys.events, f"({self._read}", "+", count=BATCH)
        for entry_id, fields in entries:
            entry, notices = str(entry_id), self._notices(str(entry_id), fields)
            self._read = entry
            with self._lock:
                self._pending[entry] = len(self._lanes)
            for lane in self._lanes:
                lane.put(entry, notices)
            if not self._lanes:
                self._over(entry)

    def _notices(self, entry_id: str, fields: Mapping[str, str]) -> list[Notice]:
        """What the event tells, from the event alone: its job's user, state and the kinds it
        asked for are written into it as it happens (pool/schedule.py), so a notice told late
        goes to whom it concerned even when the id has been reused since."""
        try:
            event = Event.from_stream(entry_id, fields.get("event", ""))
        except CorruptStateError:
            return []
        data = event.data if isinstance(event.data, Mapping) else {}
        job, user, state, asked = (data.get(k) for k in ("job", "user", "state", "notify"))
        if not (isinstance(job, str) and isinstance(user, str) and isinstance(asked, list)):
            return []
        try:
            now = PoolJobState(state)
        except ValueError:
            return []
        kinds = tuple(k for k in KINDS if k in asked and k in kinds_of(event.type, now))
        if not kinds:
            return []
        reason = event.message.split(": ", 1)[-1]
        pool = self._store.keys.pool
        return [Notice(entry_id, pool, job, user, kinds, now.value, reason, event.at_ms or 0)]

    def _send(self, url: str, notice: Notice) -> None:
        """Post `notice` to `url` (on its lane's thread), tried again twice, then given up."""
        body = notice.body()
        headers = {
            "Content-Type": "application/json",
            SIGNATURE: signature(self._key, body),
            DELIVERY: notice.delivery,
            "User-Agent": "nodeagent",
        }
        for attempt, wait in enumerate((0.0, *RETRIES_S)):
            self._sleep(wait)
            try:
                self._post(url, body, headers, self._config.timeout)
                return
            except (OSError, ValueError, HTTPException) as exc:  # a garbled reply too
                if attempt == len(RETRIES_S):
                    log.warning(
                        "notify: %s of job %s not told to %s: %s (given up)",
                        ",".join(notice.kinds), notice.job, _where(url), _why(exc),
                        extra={"job": notice.job, "generation": 0},
                    )  # fmt: skip

    def _over(self, entry_id: str) -> None:
        """A lane is done with `entry_id`: the events every lane is done with, from the oldest
        on, are over."""
        with self._lock:
            if entry_id in self._pending:
                self._pending[entry_id] -= 1
            while self._pending:
                oldest = next(iter(self._pending))
                if self._pending[oldest] > 0:
                    break
                del self._pending[oldest]
                self._done = oldest


def _where(url: str) -> str:
    """A URL as the log may say it: scheme, host and port (a webhook's path may be its
    secret)."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}"


def _why(exc: BaseException) -> str:
    """What went wrong, in words that name no URL path (urllib's own errors may)."""
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        exc = reason
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return type(exc).__name__
