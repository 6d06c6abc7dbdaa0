"""A worker that trains a few beaten steps, says its training reached its end
(nodeagent.worker.progress.finished), waits for every rank to have said so (files under
$RECORD_DIR), and then, on the rank named by $ABORT_AT_EXIT_RANK, dies by SIGABRT, as a
library's destructor does at interpreter exit ("terminate called without an active
exception"). Appends `{"rank", "gen", "event": "final"}` to $RECORD_DIR/records.jsonl first."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from nodeagent.worker import progress

STEPS = 5


def main() -> None:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    generation = int(os.environ["NODEAGENT_GENERATION"])
    records = Path(os.environ["RECORD_DIR"])
    for step in range(STEPS):
        progress.beat(step)
        time.sleep(0.1)
    progress.finished()
    line = json.dumps({"rank": rank, "gen": generation, "event": "final", "step": STEPS - 1})
    with open(records / "records.jsonl", "a") as f:
        f.write(line + "\n")
    (records / f"ended-{generation}-{rank}").write_text("")
    while len(list(records.glob(f"ended-{generation}-*"))) < world:
        time.sleep(0.05)
    if str(rank) == os.environ.get("ABORT_AT_EXIT_RANK"):
        os.abort()


if __name__ == "__main__":
    main()
