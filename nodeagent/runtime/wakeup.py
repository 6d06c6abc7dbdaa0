"""Wake the agent's loop from other threads and from signals, without polling.

A socket pair: `wake()` writes a byte (from any thread), `wait()` selects on the other end.
The write end doubles as `signal.set_wakeup_fd`, so a signal also ends the wait at once while
the Python-level handler only sets a flag.
"""

from __future__ import annotations

import contextlib
import select
import socket


class Waker:
    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    @property
    def signal_fd(self) -> int:
        return self._writer.fileno()

    def wake(self) -> None:
        # A full buffer means a wake-up is already pending.
        with contextlib.suppress(BlockingIOError, OSError):
            self._writer.send(b"\0")

    def wait(self, timeout_s: float) -> bool:
        """Block up to `timeout_s`; True when woken. Drains every pending wake-up."""
        ready, _, _ = select.select([self._reader], [], [], max(0.0, timeout_s))
        if not ready:
            return False
        try:
            while self._reader.recv(4096):
                pass
        except (BlockingIOError, OSError):
            pass
        return True

    def close(self) -> None:
        self._reader.close()
        self._writer.close()
