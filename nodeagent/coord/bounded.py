"""Redis calls that never keep the agent's loop waiting past a deadline.

redis-py blocks for its socket timeout and retries the connect as well as the command, so one
call against a silently partitioned Redis measured about three timeouts: long enough for the
node's lease to lapse while the loop that must fence its workers sat in the call. Here every
call runs on one helper thread and the loop waits for it only until its deadline (the fence
point, a pending SIGKILL). A call that is still out then stays out: later calls fail at once
until it returns, so calls never pile up behind a dead connection.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from nodeagent.errors import CoordinationError

T = TypeVar("T")


class CallRunner(Protocol):
    """Runs a Redis call for the agent within the budget the agent allows (Agent._call)."""

    def __call__(self, fn: Callable[[], T], what: str) -> T: ...


def unbounded(fn: Callable[[], T], what: str) -> T:
    """A CallRunner that just calls (tools and benchmarks that have no lease to protect)."""
    return fn()


class _Call(Generic[T]):
    def __init__(self, fn: Callable[[], T]) -> None:
        self.fn = fn
        self.done = threading.Event()
        self.result: T | None = None
        self.error: BaseException | None = None

    def execute(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # handed to the caller, whatever it is
            self.error = exc
        finally:
            self.done.set()


class BoundedCalls:
    """Runs calls on one daemon thread; the caller waits at most until a deadline."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._queue: queue.SimpleQueue[_Call[Any]] = queue.SimpleQueue()
        self._outstanding: _Call[Any] | None = None
        threading.Thread(target=self._serve, name="redis-calls", daemon=True).start()

    def _serve(self) -> None:
        while True:
            self._queue.get().execute()

    def run(self, fn: Callable[[], T], deadline: float, what: str) -> T:
        """`fn()`'s result, or its exception, if it returns by `deadline` (the clock's time).

        Raises:
            CoordinationError: no reply by the deadline, or an earlier call is still out.
        """
        if self._outstanding is not None:
            if not self._outstanding.done.is_set():
                raise CoordinationError(f"{what}: an earlier Redis call has had no reply yet")
            self._outstanding = None
        call: _Call[T] = _Call(fn)
        budget = max(0.0, deadline - self._clock())
        self._queue.put(call)
        if not call.done.wait(budget):
            self._outstanding = call
            raise CoordinationError(f"{what}: no reply from Redis within {budget:.2f}s")
        if call.error is not None:
            raise call.error
        return call.result  # type: ignore[return-value]  # set when no error
