"""The pool leader's serving of signed requests, on a thread of its own.

Served from the node's loop, a request waited for the leader's round (read, schedule, commit):
at 10,000 pending jobs a round took 0.3-0.7 s here, and a submission that came during one was
answered only after it (bench/api.py: submit p99 0.7 s). On its own thread the leader answers
while it rounds. They share the pool as the CLI under pool.auth none and the pool leader always
have: the requests write what a round reads at its next read, and a round writes only the
statuses of jobs that have not ended, which no request can replace (a submission takes an id
only from an ended job, and only a round ends one).

The thread blocks on the requests stream (XREAD) between batches, so a request is taken when it
comes, not at a heartbeat; nothing else wakes the leader for one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from nodeagent.errors import CoordinationError, FencedError
from nodeagent.model.credential import MungeUnavailable
from nodeagent.pool.requests import BATCH, Requests

log = logging.getLogger(__name__)
WAIT_S = 1.0  # the longest wait for a request before the thread looks at its term again


class Serving(Protocol):
    """What the pool member asks of whatever serves the requests: a RequestServer on a thread
    of the agent, or one in a process of its own (runtime/servechild.py)."""

    @property
    def taken_at(self) -> float: ...

    def lead(self, token: str | None) -> None: ...

    def stop(self) -> None: ...


class RequestServer:
    """Serves the pool's requests while this node leads the pool (`lead(token)`), from a daemon
    thread started at the first term. `taken_at`: when it last took a request (the clock's
    time; the leader's rounds wait while a burst lasts, pool/member.py)."""

    def __init__(
        self,
        requests: Requests,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 1.0,
        took: Callable[[float], None] | None = None,
    ) -> None:
        """`retry_s`: the pause after a failure (Redis, munged) before it serves again;
        `took`: told the clock's time after each batch that took a request."""
        self._requests = requests
        self._took = took
        self._clock = clock
        self._retry_s = retry_s
        self._token: str | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: str | None = None  # the failure said last (said once while it lasts)
        self.taken_at = -float("inf")
        self.fenced: str | None = None  # the term a write was refused in (another leads now)

    def lead(self, token: str | None) -> None:
        """Serve as the pool leader whose lease value is `token` (None: this node does not lead
        the pool). A term refused once (FencedError) is not served again."""
        if token == self._token or (token is not None and token == self.fenced):
            return
        self._token = token
        if token is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="pool-requests", daemon=True)
            self._thread.start()
        self._wake.set()

    def stop(self, timeout_s: float = WAIT_S + 5.0) -> None:
        """Stop serving and wait for the thread (up to `timeout_s`: a call in flight ends)."""
        self._token = None
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _run(self) -> None:
        while not self._stopped.is_set():
            token = self._token
            if token is None:
                self._wake.wait()
                self._wake.clear()
                continue
            try:
                self._serve(token)
            except FencedError as exc:
                log.info("pool requests: %s; serving stops for this term", exc)
                self.fenced = token
                if self._token == token:
                    self._token = None
            except (CoordinationError, MungeUnavailable) as exc:
                self._failed(f"pool requests: {exc}")
            except Exception:  # a bug must not end the serving for the agent's lifetime
                log.exception("pool requests: serving failed")
                self._failed("pool requests: serving failed (logged above)")
            else:
                if self._said is not None:
                    log.info("pool requests: served again")
                self._said = None

    def _serve(self, token: str) -> None:
        """One batch, then a wait for the next request when the batch was not full."""
        taken = self._requests.serve(token)
        if taken:
            self.taken_at = self._clock()
            if self._took is not None:
                self._took(self.taken_at)
        if len(taken) < BATCH:
            self._requests.more(WAIT_S)

    def _failed(self, why: str) -> None:
        if why != self._said:
            log.warning("%s", why)
        self._said = why
        self._stopped.wait(self._retry_s)
