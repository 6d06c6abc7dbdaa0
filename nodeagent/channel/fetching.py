"""The agent tells its workers that it is bringing a generation's saves from peers (issue 27).

A restore from memory at another world needs old ranks this node lacks. The agent fetches them
into its replica area while the workers start (importing torch, building the model, joining
the process group take longer than the fetch), instead of before: it writes `.fetching` into
the area, naming the generation and until when (the wall clock: the workers' clock), and
removes it when the fetches ended. A worker's restore waits while the note names its
generation, then reads what arrived. The area is the agent's (the workers read it only), so a
note there is the agent's; one it left behind (the agent died) stops counting at its time, and
a new agent removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

NOTE = ".fetching"
MOST_S = 900.0  # the longest a worker waits, whatever a note says


def begin(area: Path, generation: int, seconds: float) -> None:
    """Say that `generation`'s saves are being brought into `area`, for `seconds` at most."""
    note = {"generation": generation, "until": time.time() + max(0.0, seconds)}
    tmp = area / f".tmp{NOTE}.{os.getpid()}"
    tmp.write_text(json.dumps(note))
    os.replace(tmp, area / NOTE)


def end(area: Path) -> None:
    """The fetches ended (brought, or given up on): the workers read what is there."""
    with contextlib.suppress(FileNotFoundError):
        (area / NOTE).unlink()


def wait(
    area: Path,
    generation: int,
    poll: float = 0.05,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """Wait while the agent brings `generation`'s saves into `area` (until it says it is done,
    or the time it gave, MOST_S at most); the seconds waited. A note that cannot be read, or
    names another generation, is not waited for."""
    began = clock()
    while True:
        until = _until(area, generation)
        now = clock()
        if until is None or now >= min(until, began + MOST_S):
            return now - began
        sleep(poll)


def _until(area: Path, generation: int) -> float | None:
    try:
        note = json.loads((area / NOTE).read_text())
        if note["generation"] != generation:
            return None
        return float(note["until"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
