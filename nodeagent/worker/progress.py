"""`beat(step)`: tell the agent this rank made progress (enables hang detection for it).
`compute()`: mark the part of a step that waits for no peer, so the job's leader can tell a
slow rank from ranks that wait for it (docs/slow-nodes.md). `finished()`: tell the agent this
rank's training reached its end (what follows is the process's exit)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nodeagent.channel.beats import BeatWriter

ENV = "NODEAGENT_PROGRESS_FILE"


class _Default:
    """The process's writer, opened on first use from the environment the agent set."""

    writer: BeatWriter | None = None
    resolved = False


def _writer() -> BeatWriter | None:
    if not _Default.resolved:
        _Default.resolved = True
        path = os.environ.get(ENV)
        if path and Path(path).exists():
            _Default.writer = BeatWriter(Path(path))
            if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
                faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    return _Default.writer


@contextmanager
def compute() -> Iterator[None]:
    """Time the block as this rank's own work in the step: a section with no collective in it
    (the forward pass and the loss, up to `loss.item()` on a GPU, before DDP's backward starts
    its all-reduce). The time is handed to the agent at once, as a store into the beat file:
    a rank whose compute moved on since its last beat waits on its peers, so a hung job's
    agents know which ranks wait and which one they wait for (docs/worker.md). Two clock
    reads and a store: cheap enough for every step. A no-op outside nodeagent.

        with progress.compute():
            loss = model(batch).sum()
            loss.item()
        loss.backward()
    """
    writer = _writer()
    started = time.perf_counter()
    try:
        yield
    finally:
        if writer is not None:
            writer.computed(time.perf_counter() - started)


def beat(step: int) -> None:
    """Record progress at `step`. A no-op outside nodeagent (e.g. under plain torchrun).

    Beating opts this rank into hang detection, so the first beat also makes SIGUSR1 dump the
    stacks (faulthandler) unless the program handles SIGUSR1 itself: that is how the agent asks
    a hung rank what it is doing when py-spy cannot.
    """
    writer = _writer()
    if writer is not None:
        writer.beat(step)


def finished() -> None:
    """Tell the agent this rank's training reached its end. What follows is only the process's
    exit: if it dies of a signal then (a library's destructor aborting at interpreter exit,
    say: "terminate called without an active exception"), the agent counts the rank as
    finished, not failed, and neither charges the job a restart nor re-forms it (an exit
    status is still the script's failure); and a rank waiting after it for its
    peers to end is not taken for a hung one. A no-op outside nodeagent. The integrations
    (nodeagent.integrations) and `elastic.run` call it for you."""
    writer = _writer()
    if writer is not None:
        writer.finish()
