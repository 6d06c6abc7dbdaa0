"""A probe worker: records its own life so a test can tell whether two generations overlapped.

Appends a "start" line (generation, node, pid, time) to $PROBE_DIR/lives.jsonl, then writes the
time to $PROBE_DIR/alive-<pid> every 20 ms: the last value is when it was last seen running, so
its death lies within 20 ms after. SIGTERM is recorded ("term") and otherwise ignored, as by a
worker busy saving a checkpoint, so the grace a stop allows is measured to its end. Optionally
beats (`nodeagent.worker.beat`, PROBE_BEAT=1) so that hang detection sees progress, until a
file $PROBE_DIR/hang-<pid> appears: then it stops beating but keeps running, like a rank stuck
in a collective.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

PERIOD_S = 0.02


def main() -> int:
    directory = Path(os.environ["PROBE_DIR"])
    me = {
        "generation": int(os.environ.get("NODEAGENT_GENERATION", "0")),
        "node": os.environ.get("NODEAGENT_NODE", ""),
        "rank": int(os.environ.get("RANK", "-1")),
        "world": int(os.environ.get("WORLD_SIZE", "0")),
        "pid": os.getpid(),
    }

    def note(event: str) -> None:
        line = json.dumps({"event": event, "time": time.time(), **me}) + "\n"
        fd = os.open(directory / "lives.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    signal.signal(signal.SIGTERM, lambda *_: note("term"))
    beating = os.environ.get("PROBE_BEAT") == "1"
    if beating:
        from nodeagent.worker import beat
    alive = os.open(directory / f"alive-{os.getpid()}", os.O_WRONLY | os.O_CREAT, 0o644)
    note("start")
    step = 0
    while True:
        os.pwrite(alive, f"{time.time():20.6f}".encode(), 0)
        if beating and not (directory / f"hang-{os.getpid()}").exists():
            step += 1
            beat(step)
        time.sleep(PERIOD_S)


if __name__ == "__main__":
    sys.exit(main())
