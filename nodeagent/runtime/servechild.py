"""The pool leader's requests served in a process of its own, beside the agent's.

On a thread of the agent, the serving shared the GIL with the leader's rounds, which compute
for 0.1-0.2 s each at 10,000 pending jobs: a batch of requests that took 5 ms of CPU between
rounds took 35-110 ms during one (bench/api.py at 500 submissions a second, 8,000-10,000 jobs:
the pool leader's part of a submission p99 202-250 ms on the thread, 114-124 ms in a process of
its own). Here the serving has an interpreter of its own, and a core of its own where the node
has one to spare; the rounds and the serving still share only Redis, as they did.

The agent starts the process the first time its node leads the pool, and tells it each term
(`lead`). After each batch that took a request, the process tells the agent when (the rounds
wait while requests keep coming: pool/member.py) and which specs it stored, so that the rounds
take them without decoding them again and vouch for them without checking their signature
again. The process (`python -m nodeagent.runtime.servechild`, supervisor/program.py) ends when
told to stop, and when the agent is gone however it went: the agent's end of their socket pair
closes, and a SIGKILLed agent leaves no serving behind. One that dies is started again at the
next heartbeat that leads, at most once every RESTART_S.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

from nodeagent.config.settings import NodeSettings
from nodeagent.coord.client import connect
from nodeagent.coord.durable import Durability
from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import ConfigError
from nodeagent.model.spec import JobSpec
from nodeagent.pool.authority import pool_authority
from nodeagent.pool.requests import Requests
from nodeagent.pool.serving import WAIT_S, RequestServer
from nodeagent.runtime import tuning
from nodeagent.supervisor import program
from nodeagent.telemetry import logs

log = logging.getLogger(__name__)
MODULE = "nodeagent.runtime.servechild"
RESTART_S = 5.0  # the least time between two starts of the process
STOP_S = WAIT_S + 5.0  # how long a stop waits for the process before it is killed
Stored = Callable[[JobSpec, str], None]


class ServingProcess:
    """pool/serving.Serving over a child process that runs a RequestServer. `stored`: told, in
    the agent, of each spec the process stored, and the text it stored."""

    def __init__(
        self,
        settings: NodeSettings,
        stored: Stored,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._stored = stored
        self._clock = clock
        self._process: program.Program | None = None
        self._started_at = -float("inf")
        self._token: str | None = None  # the term the process was told
        self._said_dead = False
        self.taken_at = -float("inf")  # when it last took a request (the clock's time)

    def lead(self, token: str | None) -> None:
        """Serve as the pool leader whose lease value is `token` (None: this node does not lead
        the pool); the process is started at the first term, and again if it died."""
        if self._process is None and token is None:
            return
        if (self._process is None or self._process.exit_code() is not None) and not self._start():
            return
        if token != self._token:
            self._send(("lead", token))
            self._token = token

    def stop(self, timeout_s: float = STOP_S) -> None:
        """Stop the process: told, then killed if it has not ended within `timeout_s`."""
        process = self._process
        if process is None:
            return
        self._send(("stop", None))
        self._process = None
        if not process.stop(timeout_s):
            log.warning("pool requests: the serving process did not stop; killed")

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def _start(self) -> bool:
        if self._process is not None:
            if not self._said_dead:
                log.warning(
                    "pool requests: the serving process ended (exit code %s); started again "
                    "within %.0f s",
                    self._process.exit_code(),
                    RESTART_S,
                )
                self._said_dead = True
            if self._clock() - self._started_at < RESTART_S:
                return False
            self._process.conn.close()
        try:
            process = program.start(MODULE)
        except OSError as exc:
            log.warning("pool requests: the serving process cannot start: %s", exc)
            self._started_at = self._clock()
            return False
        level = logging.getLevelName(logging.getLogger().getEffectiveLevel())
        self._process = process
        self._started_at, self._token, self._said_dead = self._clock(), None, False
        self._send(("settings", (self._settings, level)))
        threading.Thread(
            target=self._read, args=(process.conn,), name="pool-requests-told", daemon=True
        ).start()
        log.info("pool requests: served by process %s", process.pid)
        return True

    def _send(self, message: tuple[str, Any]) -> None:
        # the process gone: started again at the next term's heartbeat
        with contextlib.suppress(OSError):
            if self._process is not None:
                self._process.conn.send(message)

    def _read(self, conn: Connection) -> None:
        """What the process tells, until it ends."""
        while True:
            try:
                _, taken_at, specs = conn.recv()
            except (EOFError, OSError):
                return
            for spec, raw in specs:
                self._stored(spec, raw)
            self.taken_at = taken_at


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m nodeagent.runtime.servechild FD`: FD, its end of the agent's socket pair,
    which first sends the node's settings and the log level."""
    conn = program.connection(sys.argv if argv is None else argv)
    try:
        _, (settings, level) = conn.recv()
    except (EOFError, OSError):  # the agent went before it said anything
        return 0
    serve(settings, level, conn)
    return 0


def serve(settings: NodeSettings, level: str, conn: Connection) -> None:
    """Serve each term the agent tells, until told to stop or the agent is gone."""
    tuning.tune()
    logs.configure(settings.logging.format, level, logs.LogContext(settings.node.name, "-"))
    try:
        server = _server(settings, conn)
    except ConfigError as exc:  # munged went away since the agent started: it starts again
        log.error("pool requests: %s", exc)
        return
    try:
        while True:
            try:
                verb, token = conn.recv()
            except (EOFError, OSError):  # the agent is gone
                break
            if verb == "stop":
                break
            server.lead(token)
    finally:
        server.stop()


def _server(settings: NodeSettings, conn: Connection) -> RequestServer:
    """Raises: ConfigError: munged cannot be reached."""
    authority = pool_authority(settings.pool)
    assert authority is not None  # started only where pool.auth is munge
    url, name = settings.redis.url, settings.node.name
    timeout = settings.timing.redis_timeout
    keys = PoolKeys(settings.redis.key_prefix, settings.pool.name)
    store = PoolStore(connect(url, timeout, f"nodeagent-{name}-requests"), keys)
    # Its client blocks in XREAD for a request, and in WAIT for the replicas (retries.py).
    durable = settings.pool.durability
    durability = Durability(durable.replicas, int(durable.timeout * 1000))
    blocks = max(WAIT_S, durable.timeout) + timeout
    waiting = RequestStore(connect(url, blocks, f"nodeagent-{name}-requests"), keys)
    made: list[tuple[JobSpec, str]] = []

    def took(taken_at: float) -> None:
        told: tuple[str, float, list[Any]] = ("took", taken_at, made[:])
        made.clear()
        with contextlib.suppress(OSError):  # the agent is gone: the main thread stops
            conn.send(told)

    requests = Requests(
        store,
        authority,
        waiting=waiting,
        stored=lambda s, r: made.append((s, r)),
        durability=durability,
    )
    return RequestServer(requests, took=took)


if __name__ == "__main__":
    raise SystemExit(main())
