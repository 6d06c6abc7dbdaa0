"""Reads shared by every caller for a moment (limits.read_cache, default 0.5 s): a listing
of the pool costs the same at 1 reader and at 100 (one of them reads Redis and renders, the
others take its bytes: they wait for the first answer, and while a later one is being read
they get the one before, at most twice read_cache old). What a caller may read does not depend
on who asks (as `nodeagentctl`, every user reads the pool), except logs and tokens, which are
never kept.
An error is shared as the answer would have been: a Redis outage is every waiter's 503."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

MAX_KEPT = 10_000  # distinct reads kept at once; past it the oldest are forgotten


def read_key(scope: Mapping[str, Any]) -> str:
    """A read's key: its path as sent (still percent-encoded, so no '?' of a name can pass for
    the query's) and its query."""
    path: bytes = scope.get("raw_path") or scope["path"].encode()
    return f"{path.decode('latin-1')}?{scope['query_string'].decode('latin-1')}"


@dataclass
class _Flight:
    done: threading.Event = field(default_factory=threading.Event)
    value: bytes = b""
    error: BaseException | None = None


class Fresh:
    def __init__(self, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl = ttl
        self._clock = clock
        self._kept: dict[str, tuple[float, bytes]] = {}
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()

    def peek(self, key: str) -> bytes | None:
        """What `get` would answer at once without reading (fresh, or the last answer while
        it is being read again); None: `get` must read (or wait for a read)."""
        with self._lock:
            kept = self._kept.get(key)
            if kept is None:
                return None
            if self._clock() - kept[0] < self._ttl or key in self._flights:
                return kept[1]
            return None

    def get(self, key: str, compute: Callable[[], bytes]) -> bytes:
        """What `compute()` gave for `key` less than `ttl` seconds ago, else its answer now
        (computed once however many ask at the same time).

        Raises:
            whatever `compute` raised, to everyone who waited for it.
        """
        if self._ttl <= 0:
            return compute()
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and self._clock() - kept[0] < self._ttl:
                return kept[1]
            flight = self._flights.get(key)
            leading = flight is None
            if flight is None:
                flight = self._flights[key] = _Flight()
            elif kept is not None:
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
                del self._flights[key]
                if flight.error is None:
                    if len(self._kept) >= MAX_KEPT:
                        self._kept.clear()
                    self._kept[key] = (self._clock(), flight.value)
            flight.done.set()
        return flight.value
