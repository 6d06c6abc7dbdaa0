"""A command run for a user in their job on this node (`nodeagentctl run`, as srun), as the
agent's relay of it sees it: its output's pipe, its signals (to its whole session: a shell's
children too), its end, and its hang-up when its caller is gone (SIGHUP, SIGTERM, then SIGKILL
after a grace: as a terminal's hang-up ends a shell). Started by Spawner.command, as a worker."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import struct
import subprocess
import termios
import time

POLL_S = 0.05
MAX_PENDING = 1 << 20  # typed at its terminal and not yet taken


class Command:
    """One started command."""

    def __init__(self, popen: subprocess.Popen[bytes], terminal: int = -1) -> None:
        """`terminal`: the agent's end of its pseudo-terminal, if it runs on one (-1: its
        output is a pipe, its stdin closed)."""
        self._popen = popen
        self.terminal = terminal >= 0
        self._pending = b""  # typed, not yet taken by its terminal
        if terminal >= 0:
            self.output = terminal  # what it writes, and where what it reads is written
        else:
            assert popen.stdout is not None
            self.output = popen.stdout.fileno()  # stdout and stderr together

    def write(self, data: bytes) -> None:
        """Type `data` at its terminal (nothing without one): held until its terminal takes it
        (`flush_input` when it may), at most MAX_PENDING bytes (what is typed beyond, while it
        reads nothing, is dropped, as a full terminal's input queue drops it)."""
        if self.terminal:
            self._pending += data[: max(0, MAX_PENDING - len(self._pending))]
            self.flush_input()

    @property
    def pending_input(self) -> bool:
        return bool(self._pending)

    def flush_input(self) -> None:
        """Write what is held for its terminal, as much as it takes now (its end is
        non-blocking: the relay's)."""
        try:
            while self._pending:
                self._pending = self._pending[os.write(self.output, self._pending) :]
        except BlockingIOError:
            pass
        except OSError:  # its terminal is gone: its output's end says so
            self._pending = b""

    def resize(self, rows: int, columns: int) -> None:
        """Its terminal's new size (the kernel tells its foreground group: SIGWINCH)."""
        if self.terminal:
            with contextlib.suppress(OSError):
                fcntl.ioctl(
                    self.output, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0)
                )

    @property
    def pid(self) -> int:
        return self._popen.pid

    def signal(self, sig: signal.Signals) -> None:
        """Signal its session's process group (what it started too, as a terminal would), while
        it is not reaped."""
        if self._popen.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._popen.pid, sig)

    def wait(self, timeout: float) -> int | None:
        """Its exit status once it exits (-N: killed by signal N), else None after `timeout`.
        What it left running in its group is killed first, while its unreaped exit still holds
        its pid (so the group's id cannot be another's yet)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                ended = os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # reaped already
                return self._popen.returncode
            if ended is not None:
                self.signal(signal.SIGKILL)
                return self._popen.wait()
            if time.monotonic() >= deadline:
                return None
            time.sleep(POLL_S)

    def hang_up(self, grace: float) -> int:
        """SIGHUP and SIGTERM to its group, SIGKILL after `grace` seconds; its status."""
        for sig in (signal.SIGHUP, signal.SIGTERM):
            self.signal(sig)
        code = self.wait(grace)
        if code is None:
            self.signal(signal.SIGKILL)
            code = self.wait(60.0)
        return -signal.SIGKILL if code is None else code

    def close(self) -> None:
        if self.terminal:
            os.close(self.output)
        elif self._popen.stdout is not None:
            self._popen.stdout.close()
