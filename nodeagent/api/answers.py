"""The pool leader's answers, as they come: one thread follows the pool's event stream (the
leader writes an event with every reply, naming the request: coord/requests.RequestStore.answer)
and wakes the caller waiting for that request, which then reads the reply once. A hundred
callers waiting cost one blocking read, not a hundred polls; a wake missed (Redis away, the
thread restarting) costs a caller one second, its fallback poll."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from nodeagent.coord.pool import PoolStore
from nodeagent.errors import CoordinationError
from nodeagent.views.documents import decode

log = logging.getLogger(__name__)
BLOCK_MS = 2000
RETRY_S = 1.0


class Answers:
    def __init__(self, store: PoolStore) -> None:
        self._store = store
        self._waiting: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def expect(self, request_id: str) -> threading.Event:
        """What is set once the answer to `request_id` is written (read the reply after
        registering, in case it came first)."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="answers", daemon=True)
                self._thread.start()
            return self._waiting.setdefault(request_id, threading.Event())

    def forget(self, request_id: str) -> None:
        with self._lock:
            self._waiting.pop(request_id, None)

    def _run(self) -> None:
        cursor: str | None = None
        stop = threading.Event()  # never set: the thread lives as long as the service
        while True:
            try:
                if cursor is None:
                    cursor = self._store.last_event_id()
                got = self._store.wait_events({self._store.keys.events: cursor}, BLOCK_MS)
            except CoordinationError as exc:
                log.warning("following the pool's answers: %s", exc)
                cursor = None
                stop.wait(RETRY_S)
                continue
            for _, entry_id, fields in got:
                cursor = entry_id
                self._wake(entry_id, fields)

    def _wake(self, entry_id: str, fields: Mapping[str, str]) -> None:
        event, _ = decode(entry_id, fields)
        data = event.data if isinstance(event.data, Mapping) else {}
        request_id = data.get("request")
        if isinstance(request_id, str):
            with self._lock:
                waiting = self._waiting.get(request_id)
            if waiting is not None:
                waiting.set()
