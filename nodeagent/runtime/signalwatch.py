"""SIGHUP and SIGUSR1 never kill the agent (their default action would, leaving its workers
running outside systemd).

- SIGUSR1 writes the stacks of all the agent's threads to its stderr (the journal) with
  faulthandler, from inside the signal handler and with async-signal-safe calls only, so it
  works even when the loop is wedged; a log line follows.
- SIGHUP is logged and otherwise ignored: the agent does not reload its config (restart it to
  apply a new one).

The Python-level handler only writes the signal's number to a pipe (os.write, async-signal-safe
and free of the locks that logging or a buffered stream take); a thread reads the pipe and logs.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import sys
import threading
from types import FrameType
from typing import TextIO

log = logging.getLogger(__name__)
WATCHED = (signal.SIGHUP, signal.SIGUSR1)
_STOP = 0  # not a signal number: tells the thread to end


class SignalWatch:
    """`install()` from the main thread; `close()` restores the previous handlers."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)  # a full pipe drops a report, never blocks
        self._previous: dict[int, object] = {}
        self._faulthandler = False
        self._thread = threading.Thread(target=self._report, name="signal-watch", daemon=True)

    def install(self) -> None:
        for signum in WATCHED:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        try:  # after signal.signal: faulthandler chains to the handler above when done
            faulthandler.register(signal.SIGUSR1, file=self._stream, all_threads=True, chain=True)
            self._faulthandler = True
        except (AttributeError, OSError, ValueError):  # a stream without a file descriptor
            self._faulthandler = False
        self._thread.start()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.write(self._write, bytes([signum]))

    def _report(self) -> None:
        while True:
            try:
                data = os.read(self._read, 64)
            except OSError:
                return
            for signum in data:
                if signum == _STOP:
                    return
                self._log(signum)
            if not data:
                return

    def _log(self, signum: int) -> None:
        if signum == signal.SIGHUP:
            log.warning(
                "SIGHUP received and ignored: nodeagent does not reload its config; "
                "restart it to apply a new one"
            )
        elif self._faulthandler:
            log.warning("SIGUSR1: the stacks of the agent's threads were written to stderr")
        else:
            frames = sys._current_frames()
            log.warning("SIGUSR1: the agent's threads:\n%s", _format_stacks(frames))

    def close(self) -> None:
        if self._faulthandler:
            faulthandler.unregister(signal.SIGUSR1)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
        if self._thread.is_alive():
            with contextlib.suppress(OSError):
                os.write(self._write, bytes([_STOP]))
            self._thread.join(5)
        os.close(self._write)
        os.close(self._read)


def _format_stacks(frames: dict[int, FrameType]) -> str:
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    return "\n".join(
        f"Thread {names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame))}"
        for ident, frame in frames.items()
    )
