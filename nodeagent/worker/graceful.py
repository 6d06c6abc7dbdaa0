"""Emergency checkpoints on SIGTERM (the "graceful exit" pattern), done safely.

The handler only sets a flag: the training loop asks `should_stop()` between steps, saves a
checkpoint at the current step and exits 0 before the agent's grace period ends
(NODEAGENT_STOP_GRACE_S). In a distributed job `should_stop_all()` agrees across ranks with one
tiny all-reduce, so every rank stops at the same step and rank 0 saves it: no step is lost.

Also registers faulthandler on SIGUSR1, so the agent can ask a hung worker for its stacks.

A process asked to stop whose training then fails (a peer is gone: its collective raises)
exits without the slow end of Python's finalization (`exit_at_once_when_failing`).
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import sys
import time
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any

from nodeagent.worker.agree import any_rank

DEFAULT_GRACE_S = 30.0
FAILED_EXIT = 1  # a worker that failed after it was asked to stop: as an uncaught exception's

_asked: list[Callable[[], bool]] = []  # exit_at_once_when_failing's questions, in this process
_failed: list[BaseException] = []  # the exception that ended the main thread after a stop
_installed = False  # the excepthook and the atexit handler are in place (once a process)


def exit_at_once_when_failing(asked: Callable[[], bool]) -> None:
    """From now on, when an exception ends this process's main thread and `asked()` (or the
    question of an earlier call) says the agent asked it to stop, the process exits with
    status 1 once its exception is printed, its other threads are done (a `Checkpointer`'s
    save being written, say) and the atexit handlers registered after the first call have
    run: the rest of Python's finalization is skipped.

    Why: the agent stops a failed generation's workers with SIGTERM and kills them after
    `timing.failure_stop_grace_period` (1 s); the next generation waits for them. A worker that
    handles SIGTERM (to save on a drain) goes on until its next collective raises (a peer is
    gone) and then, with torch 2.13 and gloo, spends about a second in finalization after its
    atexit handlers (measured here, a peer SIGKILLed: tests/integration/test_failing_exit.py),
    so it was killed at the grace. A worker that leaves SIGTERM alone dies at the signal.

    The exit is an atexit handler of its own, not the excepthook: torch's process group
    wraps the excepthook (to prefix the traceback with the rank) and writes what it printed
    only once it returns. atexit runs its handlers last registered first, so those registered
    before the first call (torch's, at its import) are the ones skipped."""
    global _installed
    if not _installed:  # not `not _asked`: every question may have been forgotten since
        _installed = True
        previous = sys.excepthook

        def hook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
            previous(kind, value, tb)
            if any(question() for question in _asked):
                _failed.append(value)

        sys.excepthook = hook
        atexit.register(_exit_if_failed)
    if asked not in _asked:  # a bound method asked again (a second fit) is the same question
        _asked.append(asked)


def no_longer_exit_at_once(asked: Callable[[], bool]) -> None:
    """Forget `asked` (the stop it answered for is over: its handler was uninstalled)."""
    with contextlib.suppress(ValueError):
        _asked.remove(asked)


def _exit_if_failed() -> None:
    if not _failed:
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write("nodeagent: asked to stop, then failed: exiting now\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, a broken pipe: nothing to say
            stream.flush()
    os._exit(FAILED_EXIT)


class GracefulExit:
    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        self.signals = signals
        self.requested = False
        self.signal: signal.Signals | None = None
        self.received_at: float | None = None
        self._previous: dict[signal.Signals, Any] = {}
        grace = os.environ.get("NODEAGENT_STOP_GRACE_S", "")
        try:
            self.grace_s = float(grace) if grace else DEFAULT_GRACE_S
        except ValueError:
            self.grace_s = DEFAULT_GRACE_S

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True
        self.signal = signal.Signals(signum)
        self.received_at = time.monotonic()

    def install(self) -> GracefulExit:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        exit_at_once_when_failing(self.should_stop)
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        return self

    def uninstall(self) -> None:
        no_longer_exit_at_once(self.should_stop)
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous.clear()

    def __enter__(self) -> GracefulExit:
        return self.install()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def should_stop(self) -> bool:
        return self.requested

    def should_stop_all(self) -> bool:
        """True on every rank as soon as any rank was asked to stop (one all-reduce)."""
        return any_rank(self.requested)

    def time_left(self) -> float:
        """Seconds until the agent sends SIGKILL (the whole grace period before a signal)."""
        if self.received_at is None:
            return self.grace_s
        return max(0.0, self.grace_s - (time.monotonic() - self.received_at))
