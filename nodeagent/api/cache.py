"""Reads shared by every caller for a moment (limits.read_cache, default 0.5 s): a listing
of the pool costs the same at 1 reader and at 100 (one of them reads Redis and renders, the
others take its bytes). Past read_cache an answer is stale. A key asked for within the last
read_cache (one under load) is then made again in the background by the first caller to find
it stale, who is given the stale answer, as is everyone until the next is made
(stale-while-revalidate, RFC 5861): under load no caller waits on a read, and the event loop is
not held up by a crowd of callers hopping through worker threads while one reads. A key asked
for less often is read again for its caller, who waits for it. A change made through the
service (a submission, a cancel, any verb) drops every answer kept and every read under way
(`changed`): a client that changes something reads the change in its next read. What a caller
may read does not depend on who asks (as `nodeagentctl`, every user reads the pool), except
logs and tokens, which are never kept.
An error is shared as the answer would have been: a Redis outage is every waiter's 503; a read
made in the background that fails drops its key, so the next caller reads (and fails) itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_KEPT = 10_000  # distinct reads kept at once; past it the oldest are forgotten
STALE_READS = 3  # an answer is given while the next is read until it is this many ttls old


def read_key(scope: Mapping[str, Any]) -> str:
    """A read's key: its path as sent (still percent-encoded, so no '?' of a name can pass for
    the query's) and its query."""
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    return f"{path.decode('latin-1')}?{scope['query_string'].decode('latin-1')}"


@dataclass
class _Flight:
    epoch: int = 0  # Fresh's when it began: an answer read before a change is not kept
    done: threading.Event = field(default_factory=threading.Event)
    value: bytes = b""
    error: BaseException | None = None


class Fresh:
    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._kept: dict[str, tuple[float, bytes]] = {}
        self._asked: dict[str, float] = {}  # when each key's answer was last given
        self._flights: dict[str, _Flight] = {}
        self._epoch = 0  # changed() counts up: what was read before is not kept
        self._lock = threading.Lock()

    def changed(self) -> None:
        """A change was made through this service: every answer kept, and every read under
        way, may be from before it. The next caller of each key reads again, and no caller
        joins a read begun before (read-your-writes: a client that cancelled a job reads it
        cancelling at once, not an answer kept from before its cancel)."""
        with self._lock:
            self._epoch += 1
            self._kept.clear()
            self._asked.clear()
            self._flights.clear()  # (those under way still answer their own waiters)

    def _landed(self, key: str, flight: _Flight) -> None:
        """A read ended (under the lock): it is no longer under way, and its answer is kept
        if it began after the last change."""
        if self._flights.get(key) is flight:
            del self._flights[key]
        if flight.error is not None:
            if flight.epoch == self._epoch:
                self._kept.pop(key, None)
            return
        if flight.epoch != self._epoch:
            return
        if len(self._kept) >= MAX_KEPT:
            self._kept.clear()
            self._asked.clear()
        self._kept[key] = (self._clock(), flight.value)

    def peek(self, key: str) -> bytes | None:
        """What a caller may be given at once without reading: the answer if fresh, or while
        the next is being read; None: go through `claim`."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            now = self._clock()
            age = now - kept[0]
            if age < self._ttl or (key in self._flights and age < STALE_READS * self._ttl):
                self._asked[key] = now
                return kept[1]
            return None

    def claim(self, key: str) -> tuple[bytes | None, bool]:
        """(answer, refresh): the answer to give at once (None: none to give, call `get`),
        and whether this caller must make the next in the background (`refresh`): it found
        the answer stale, nobody reading it again, and the key under load."""
        if self._ttl <= 0:
            return None, False
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None, False
            now = self._clock()
            age = now - kept[0]
            hot = now - self._asked.get(key, kept[0]) < self._ttl
            if age >= STALE_READS * self._ttl or (age >= self._ttl and not hot):
                return None, False
            self._asked[key] = now
            if age < self._ttl or key in self._flights:
                return kept[1], False
            self._flights[key] = _Flight(self._epoch)
            return kept[1], True

    def refresh(self, key: str, compute: Callable[[], bytes]) -> None:
        """Make the next answer of `key` (the caller `claim` told to), in a worker thread. A
        failure drops the key: the next caller reads, and is told the error, itself."""
        with self._lock:
            flight = self._flights.get(key)
        if flight is None:  # a change dropped it since: the next caller reads
            return
        try:
            flight.value = compute()
        except BaseException as exc:  # Redis away, say: said to the next caller by its own read
            flight.error = exc
        finally:
            with self._lock:
                self._landed(key, flight)
            flight.done.set()

    def abandon(self, key: str, why: BaseException) -> None:
        """The read `claim` handed out will not be made (its task never ran): whoever waits
        for it is told `why`, and the next caller reads."""
        with self._lock:
            flight = self._flights.pop(key, None)
            self._kept.pop(key, None)
        if flight is not None:
            flight.error = why
            flight.done.set()

    def get(self, key: str, compute: Callable[[], bytes]) -> bytes:
        """What `compute()` gave for `key` less than `ttl` seconds ago, else its answer now
        (computed once however many ask at the same time; while it is computed again, the
        last answer if not STALE_READS ttls old).

        Raises:
            whatever `compute` raised, to everyone who waited for it.
        """
        if self._ttl <= 0:
            return compute()
        with self._lock:
            kept = self._kept.get(key)
            age = self._clock() - kept[0] if kept is not None else 0.0
            if kept is not None and age < self._ttl:
                return kept[1]
            flight = self._flights.get(key)
            leading = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight(self._epoch)
            elif kept is not None and age < STALE_READS * self._ttl:
                return kept[1]  # being read again: the last answer meanwhile, not a wait
        if not leading:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value
        try:
            flight.value = compute()
        except BaseException as exc:
            flight.error = exc
            raise
        finally:
            with self._lock:
                self._landed(key, flight)
            flight.done.set()
        return flight.value
