"""The pool leader's answers, as they come: one thread follows the pool's event stream (the
leader writes an event with every reply, in one MULTI/EXEC, naming the request:
coord/requests.RequestStore.answer), reads the replies of a batch of events in one pipelined
round trip, and hands each to the caller waiting for it. A hundred callers waiting cost one
blocking read, not a hundred polls, and a caller on the event loop holds no worker thread while
it waits. A wake missed (Redis away, the thread restarting) costs a caller one second, its
fallback poll; an answer that came before its caller asked is remembered (`SEEN`), so the
caller reads it at once."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import CoordinationError
from nodeagent.model.request import Reply
from nodeagent.views.waits import answered_request

log = logging.getLogger(__name__)
BLOCK_MS = 2000
RETRY_S = 1.0
SEEN = 4096  # answers nobody waited for yet, remembered: a caller that asks next reads it

Deliver = Callable[[Reply], None]


class Answers:
    def __init__(self, store: PoolStore, requests: RequestStore) -> None:
        self._store = store
        self._requests = requests
        self._waiting: dict[str, Deliver] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Follow the stream from where it ends now, if not yet following it: an answer to a
        request sent after this returns is not missed (called before sending; the first call
        reads the stream's end in the caller's thread). Following from a later point, the
        first answers of a service just started went by unseen, and their callers waited for
        their one-second poll.

        Raises:
            CoordinationError: Redis could not be read (nothing started).
        """
        with self._lock:
            if self._thread is None:
                self._follow(self._store.last_event_id())

    def _follow(self, cursor: str | None) -> None:
        self._thread = threading.Thread(
            target=self._run, args=(cursor,), name="answers", daemon=True
        )
        self._thread.start()

    def expect(self, request_id: str, deliver: Deliver) -> bool:
        """Call `deliver` with the reply to `request_id` once it is written (from this class's
        thread: it must not block). False when its answer went by before this was asked: read
        the reply now."""
        with self._lock:
            if self._thread is None:
                self._follow(None)
            if request_id in self._seen:
                return False
            self._waiting[request_id] = deliver
            return True

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiting.pop(request_id, None)

    def close(self) -> None:
        """Stop following (within one blocking read), as a service that ends."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self, cursor: str | None) -> None:
        while not self._stop.is_set():
            try:
                if cursor is None:
                    cursor = self._store.last_event_id()
                got = self._store.wait_events({self._store.keys.events: cursor}, BLOCK_MS)
                if got:
                    cursor = got[-1][1]
                    answered = [answered_request(entry_id, fields) for _, entry_id, fields in got]
                    self._deliver([request for request in answered if request is not None])
            except CoordinationError as exc:
                log.warning("following the pool's answers: %s", exc)
                cursor = None
                self._stop.wait(RETRY_S)

    def _deliver(self, answered: list[str]) -> None:
        """Each answered request's reply to its waiter, read in one round trip; the others
        remembered."""
        with self._lock:
            waiting = [(r, self._waiting[r]) for r in answered if r in self._waiting]
            for request_id in answered:
                if request_id not in self._waiting:
                    self._seen[request_id] = None
            while len(self._seen) > SEEN:
                self._seen.popitem(last=False)
        if not waiting:
            return
        replies = self._requests.replies([request_id for request_id, _ in waiting])
        for (_, deliver), reply in zip(waiting, replies, strict=True):
            if reply is not None:  # unreadable: the caller's poll says so in time
                deliver(reply)
