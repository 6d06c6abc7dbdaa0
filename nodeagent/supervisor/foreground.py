"""A command run on this host in the foreground, for a user at a terminal (nodeagentctl
alloc's shell): started with the environment it is given, waited for, passed the signals its
caller is sent, and ended as a hang-up ends a shell (SIGHUP, SIGTERM, then SIGKILL after a
grace)."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping, Sequence


class Foreground:
    """One command, started at once.

    Raises:
        OSError: it cannot be started (not found, not executable).
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str]) -> None:
        self._popen = subprocess.Popen(list(argv), env=dict(env))

    def wait(self, timeout: float) -> int | None:
        """Its exit code once it exits (128+N for signal N, as a shell says), else None after
        `timeout` seconds."""
        try:
            code = self._popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        return code if code >= 0 else 128 - code

    def send(self, sig: int) -> None:
        if self._popen.poll() is None:
            self._popen.send_signal(sig)

    def end(self, grace: float) -> None:
        """SIGHUP (a terminal's hang-up), SIGTERM, then SIGKILL after `grace` seconds."""
        for sig in (signal.SIGHUP, signal.SIGTERM):
            self.send(sig)
        if self.wait(grace) is None:
            self._popen.kill()
            self._popen.wait()
