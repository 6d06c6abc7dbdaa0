"""A command run for a user in their job on this node (`nodeagentctl run`, as srun), as the
agent's relay of it sees it: its output's pipe, its input (a terminal's keys, or its stdin's
pipe: held until it takes them, never blocking the relay), its signals (to its whole session:
a shell's children too), its end, and its hang-up when its caller is gone (SIGHUP, SIGTERM,
then SIGKILL after a grace: as a terminal's hang-up ends a shell). Started by
Spawner.command, as a worker."""

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
MAX_PENDING = 1 << 20  # typed at its terminal, or sent to its stdin, and not yet taken


class Command:
    """One started command."""

    def __init__(self, popen: subprocess.Popen[bytes], terminal: int = -1) -> None:
        """`terminal`: the agent's end of its pseudo-terminal, if it runs on one (-1: its
        output is a pipe, and its stdin `popen.stdin`, a pipe, or none: closed)."""
        self._popen = popen
        self.terminal = terminal >= 0
        self._pending = b""  # typed or sent, not yet taken
        self.taken = 0  # bytes of its stdin it took (or that were dropped), in all
        self._ending = False  # its stdin ends once what is pending is taken
        if terminal >= 0:
            self.output = terminal  # what it writes, and where what it reads is written
            self.input = terminal
        else:
            assert popen.stdout is not None
            self.output = popen.stdout.fileno()  # stdout and stderr together
            self.input = popen.stdin.fileno() if popen.stdin is not None else -1
            if self.input >= 0:
                os.set_blocking(self.input, False)

    def write(self, data: bytes) -> None:
        """`data` for its terminal or its stdin (nothing without either): held until it takes
        it (`flush_input` when it may), at most MAX_PENDING bytes (beyond, while it reads
        nothing, dropped, as a full terminal's input queue drops it; a client of its stdin
        keeps within runwire.STDIN_WINDOW)."""
        if self.input < 0 or self._ending:
            self.taken += len(data)
            return
        kept = data[: max(0, MAX_PENDING - len(self._pending))]
        self.taken += len(data) - len(kept)
        self._pending += kept
        self.flush_input()

    def end_input(self) -> None:
        """Its stdin ends once what is held is taken (a terminal's has no end: nothing)."""
        if not self.terminal:
            self._ending = True
            self.flush_input()

    @property
    def input_closed(self) -> bool:
        """Its stdin's pipe is closed: it closed its end, or its end was asked for and came."""
        return not self.terminal and self.input < 0 and self._popen.stdin is not None

    @property
    def pending_input(self) -> bool:
        return bool(self._pending)

    def flush_input(self) -> None:
        """Write what is held, as much as it takes now (its end is non-blocking: the
        relay's); its stdin closed once it is all taken and its end was asked for."""
        try:
            while self._pending:
                wrote = os.write(self.input, self._pending)
                self._pending = self._pending[wrote:]
                self.taken += wrote
        except BlockingIOError:
            pass
        except OSError:  # it closed its stdin, or its terminal is gone: what is held goes
            self.taken += len(self._pending)
            self._pending = b""
            self._close_input()
        if self._ending and not self._pending:
            self._close_input()

    def _close_input(self) -> None:
        if not self.terminal and self.input >= 0:
            assert self._popen.stdin is not None
            with contextlib.suppress(OSError):
                self._popen.stdin.close()
            self.input = -1

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
            return
        self._close_input()
        if self._popen.stdout is not None:
            self._popen.stdout.close()
