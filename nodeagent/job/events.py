"""The events an agent appends about its own workers (the job's event stream). Pure."""

from __future__ import annotations

from collections.abc import Sequence

from nodeagent.model.job import Event
from nodeagent.supervisor.status import Started, WorkerExit


def started(node: str, generation: int, ranks: Sequence[int], how: Started) -> Event:
    notes = [f"{how.kept} kept running in place"] if how.kept else []
    notes += [f"{how.preloaded} in preloaded interpreters"] if how.preloaded else []
    notes += [f"{how.warmed} warmed up ahead"] if how.warmed else []
    return Event(
        "workers_started",
        generation=generation,
        node=node,
        message=f"ranks {ranks[0]}-{ranks[-1]}" + (f" ({', '.join(notes)})" if notes else ""),
        data={
            "ranks": list(ranks),
            "preloaded": how.preloaded,
            "kept": how.kept,
            "warmed": how.warmed,
        },
    )


def exited(node: str, ended: WorkerExit) -> Event:
    """A worker's exit: worker_failed (not asked to stop, non-zero) or worker_exited."""
    how = f"signal {ended.signal}" if ended.signal else f"exit code {ended.exit_code}"
    return Event(
        "worker_failed" if ended.failed else "worker_exited",
        generation=ended.generation,
        node=node,
        message=f"rank {ended.rank} ended with {how}"
        + (" (stopped by agent)" if ended.expected else "")
        + (" after it finished (its training returned)" if ended.finished else "")
        + (f": {ended.cause}" if ended.cause else ""),
        data={
            "rank": ended.rank,
            "local_rank": ended.local_rank,
            "exit_code": ended.exit_code,
            "signal": ended.signal,
            "expected": ended.expected,
            "finished": ended.finished,
        },
    )
