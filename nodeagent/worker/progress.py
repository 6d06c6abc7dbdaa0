"""`beat(step)`: tell the agent this rank made progress (enables hang detection for it)."""

from __future__ import annotations

import os
from pathlib import Path

from nodeagent.progress import BeatWriter

ENV = "NODEAGENT_PROGRESS_FILE"


class _Default:
    """The process's writer, opened on first use from the environment the agent set."""

    writer: BeatWriter | None = None
    resolved = False


def beat(step: int) -> None:
    """Record progress at `step`. A no-op outside nodeagent (e.g. under plain torchrun)."""
    if not _Default.resolved:
        _Default.resolved = True
        path = os.environ.get(ENV)
        if path and Path(path).exists():
            _Default.writer = BeatWriter(Path(path))
    if _Default.writer is not None:
        _Default.writer.beat(step)
