"""systemd's notify protocol (sd_notify), without libsystemd: one datagram per message.

READY=1 once the agent has joined Redis, WATCHDOG=1 from its loop at half of WatchdogSec (a
wedged loop stops pinging and systemd restarts the agent), STATUS= lines with the node's state,
STOPPING=1 on shutdown. A no-op when NOTIFY_SOCKET is unset (not run by systemd).
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping

log = logging.getLogger(__name__)


class Notifier:
    def __init__(
        self,
        socket_path: str | None,
        watchdog_usec: str | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._address: str | bytes | None = None
        if socket_path:
            # "@name" is a socket in the abstract namespace: a leading NUL byte.
            self._address = (
                b"\0" + socket_path[1:].encode() if socket_path.startswith("@") else socket_path
            )
        usec = int(watchdog_usec) if watchdog_usec and watchdog_usec.isdigit() else 0
        self.watchdog_interval_s = usec / 2_000_000 if usec else None  # ping at half the timeout
        self._last_ping = float("-inf")
        self._clock = clock or time.monotonic
        self._last_status = ""
        self.is_ready = False  # READY=1 sent (once per process: a pool node serves many jobs)
        self._stopping = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> Notifier:
        return cls(environ.get("NOTIFY_SOCKET"), environ.get("WATCHDOG_USEC"))

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def send(self, *assignments: str) -> bool:
        """Send "KEY=value" lines in one datagram; False if there is no socket or it failed."""
        if self._address is None:
            return False
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
                sock.sendto("\n".join(assignments).encode(), self._address)
            return True
        except OSError as exc:
            log.debug("sd_notify failed: %s", exc)
            return False

    def ready(self, status: str) -> None:
        """READY=1, the first time only."""
        if self.is_ready:
            return
        self.send("READY=1", f"STATUS={status}")
        self._last_status = status
        self.is_ready = True

    def report(self, status: str, stopping: bool) -> None:
        """Each pass of a loop, once ready (so READY=1 comes before any WATCHDOG=1): WATCHDOG=1
        (a wedged loop stops pinging: systemd's watchdog restarts the agent), STATUS when it
        changed, or STOPPING=1 once."""
        if not self.is_ready:
            return
        self.ping()
        if not stopping:
            self.status(status)
        elif not self._stopping:
            self.stopping()
            self._stopping = True

    def status(self, status: str) -> None:
        if status != self._last_status:
            self.send(f"STATUS={status}")
            self._last_status = status

    def ping(self) -> None:
        """WATCHDOG=1, at most once per half WatchdogSec."""
        if self.watchdog_interval_s is None:
            return
        now = self._clock()
        if now - self._last_ping >= self.watchdog_interval_s:
            self.send("WATCHDOG=1")
            self._last_ping = now

    def next_ping(self) -> float | None:
        if self.watchdog_interval_s is None:
            return None
        return self._last_ping + self.watchdog_interval_s

    def stopping(self) -> None:
        self.send("STOPPING=1", "STATUS=stopping workers and leaving the job")
