"""Emergency checkpoints on SIGTERM (the "graceful exit" pattern), done safely.

The handler only sets a flag: the training loop asks `should_stop()` between steps, saves a
checkpoint at the current step and exits 0 before the agent's grace period ends
(NODEAGENT_STOP_GRACE_S). In a distributed job `should_stop_all()` agrees across ranks with one
tiny all-reduce, so every rank stops at the same step and rank 0 saves it: no step is lost.

Also registers faulthandler on SIGUSR1, so the agent can ask a hung worker for its stacks.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from types import FrameType, TracebackType
from typing import Any

from nodeagent.worker.agree import any_rank

DEFAULT_GRACE_S = 30.0


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
        if hasattr(signal, "SIGUSR1"):
            faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
        return self

    def uninstall(self) -> None:
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
