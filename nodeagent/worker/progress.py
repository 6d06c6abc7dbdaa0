"""`beat(step)`: tell the agent this rank made progress (enables hang detection for it)."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from pathlib import Path

from nodeagent.channel.beats import BeatWriter

ENV = "NODEAGENT_PROGRESS_FILE"


class _Default:
    """The process's writer, opened on first use from the environment the agent set."""

    writer: BeatWriter | None = None
    resolved = False


def beat(step: int) -> None:
    """Record progress at `step`. A no-op outside nodeagent (e.g. under plain torchrun).

    Beating opts this rank into hang detection, so the first beat also makes SIGUSR1 dump the
    stacks (faulthandler) unless the program handles SIGUSR1 itself: that is how the agent asks
    a hung rank what it is doing when py-spy cannot.
    """
    if not _Default.resolved:
        _Default.resolved = True
        path = os.environ.get(ENV)
        if path and Path(path).exists():
            _Default.writer = BeatWriter(Path(path))
            if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
                faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    if _Default.writer is not None:
        _Default.writer.beat(step)
