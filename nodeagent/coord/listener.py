"""A thread that blocks on Redis streams (a job's events and commands, a pool's events) and
wakes the agent's loop.

This is what makes re-forming take milliseconds instead of a heartbeat: every write that matters
(a worker failure, an acknowledgement, a new generation, an operator command) appends to a stream,
and every agent is woken by it. A missed wake-up only costs one heartbeat, since the agent also
syncs on its own schedule.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from nodeagent.errors import CoordinationError

log = logging.getLogger(__name__)


class StreamReader(Protocol):
    """What the listener reads streams with (JobStore, PoolStore)."""

    def last_event_id(self, stream: str | None = None) -> str: ...
    def wait_events(self, after: dict[str, str], block_ms: int) -> list[tuple[str, str, Any]]: ...


class StreamListener:
    def __init__(
        self,
        store: StreamReader,
        streams: Sequence[str] | Callable[[], Sequence[str]],
        on_entry: Callable[[], None],
        block_ms: int = 5000,
        retry_s: float = 0.5,
    ) -> None:
        """`streams`: the keys of the streams to watch (a job's events and commands, a pool's
        events), or what gives them before each read (a job's follower watches only its wake
        stream, its leader the events and commands too)."""
        self._store = store
        self._streams = streams if callable(streams) else (lambda: tuple(streams))
        self._on_entry = on_entry
        self._block_ms = block_ms
        self._retry_s = retry_s
        self._stopped = threading.Event()
        self._ready = threading.Event()  # its first cursors are read
        self._thread = threading.Thread(target=self._run, name="stream-listener", daemon=True)

    def start(self, ready_within: float = 0.0) -> None:
        """Start listening; wait up to `ready_within` seconds for the first cursors, so that
        whatever is appended after this returns wakes the loop (what came before, the caller's
        first read of the state sees)."""
        self._thread.start()
        if ready_within > 0:
            self._ready.wait(ready_within)

    def stop(self) -> None:
        """Ask the thread to end; it exits after its current blocking read (a daemon thread)."""
        self._stopped.set()

    def _cursors(self, known: dict[str, str] | None) -> dict[str, str]:
        """A cursor per stream watched now: the one it had; for a stream added, the millisecond
        before the newest entry read (what woke it to switch: what came after is not missed);
        at the start, each stream's last entry."""
        known = known or {}
        since = max((int(c.split("-")[0]) for c in known.values() if c != "0-0"), default=0)
        cursors = {}
        for stream in self._streams():
            if stream in known:
                cursors[stream] = known[stream]
            elif since:
                cursors[stream] = f"{since - 1}-0"
            else:
                cursors[stream] = self._store.last_event_id(stream)
        return cursors

    def _run(self) -> None:
        cursors: dict[str, str] | None = None
        while not self._stopped.is_set():
            try:
                if cursors is None or set(cursors) != set(self._streams()):
                    cursors = self._cursors(cursors)
                    self._ready.set()
                entries = self._store.wait_events(cursors, self._block_ms)
            except CoordinationError as exc:  # also a stream key of the wrong type (garbage)
                log.debug("stream listener: %s; retrying in %.1fs", exc, self._retry_s)
                cursors = None  # the streams may be gone after a Redis restart
                self._stopped.wait(self._retry_s)
                continue
            except Exception:  # whatever Redis held, the wake-ups must go on
                log.exception("stream listener: unexpected error; retrying in %.1fs", self._retry_s)
                cursors = None
                self._stopped.wait(self._retry_s)
                continue
            for stream, entry_id, _ in entries:
                cursors[stream] = entry_id
            if entries:
                self._on_entry()
