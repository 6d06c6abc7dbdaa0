"""A program of the agent's own in a process of its own, `python -m MODULE FD`, talked to over
a socket pair (Python objects, pickled: multiprocessing's Connection): the pool leader's
requests' serving (runtime/servechild.py). Not multiprocessing's processes: those bring a
resource tracker process along, and neither shows what it runs in `ps`."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Sequence
from multiprocessing.connection import Connection


class Program:
    """The agent's handle on one program it started: its process, and its end of their socket
    pair (`conn`)."""

    def __init__(self, proc: subprocess.Popen[bytes], conn: Connection) -> None:
        self._proc = proc
        self.conn = conn

    @property
    def pid(self) -> int:
        return self._proc.pid

    def exit_code(self) -> int | None:
        """None while it runs (one that ended is reaped here)."""
        return self._proc.poll()

    def stop(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for it to end, then kill it; whether it ended by itself."""
        try:
            self._proc.wait(timeout_s)
            ended = True
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
            ended = False
        self.conn.close()
        return ended


def start(module: str, python: str = sys.executable) -> Program:
    """`python -m module FD`, in a session of its own (a ^C meant for the agent does not reach
    it), with the agent's end of their socket pair: the program's end closes when the agent's
    process ends, however it ends.

    Raises:
        OSError: it could not be started.
    """
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [python, "-m", module, str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError:
        ours.close()
        raise
    finally:
        theirs.close()  # the program's alone now
    return Program(proc, Connection(ours.detach()))


def connection(argv: Sequence[str]) -> Connection:
    """In the program: its end of the socket pair, from its command line."""
    return Connection(int(argv[1]))
