"""A 1,000-task array: how long it takes to go in, and what its pending tasks cost the pool
leader's round.

    .venv/bin/python bench/array.py [--tasks 1000] [--arrays 3] [--rounds 20]

On a real redis-server and nothing else running, the pool of bench/pool_round.py (1,000 nodes,
each pinned to one of 100 running jobs: no node is free, so every task stays pending, the
round's worst case for an array):
- store: the pool leader's part of a signed `submit --array 0-999%50` (pool/submission.py:
  the checks, one spec per task, one round trip), per array, for --arrays arrays;
- cli: `nodeagentctl submit --array 0-999%50` under pool.auth none, the whole command (its
  Python start included), per array;
- the round (`lead`: read, schedule, commit) and `schedule()` alone, medians and maxima of
  --rounds steady rounds, before the arrays and with their tasks pending.
Writes bench/results/array.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.pool_round import rounds, setup  # noqa: E402
from nodeagent.model.spec import load_spec  # noqa: E402
from nodeagent.pool.submission import store_array  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402

NODES, JOBS = 1000, 100


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--arrays", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "array.json"))
    args = parser.parse_args()
    indices = f"0-{args.tasks - 1}%50"
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            pool, leader = setup(server, NODES, JOBS)
            before = rounds(pool, leader, args.rounds)
            print(json.dumps({"pending_tasks": 0, **before}), flush=True)
            stored = []
            for a in range(args.arrays):
                doc = {"id": f"sweep{a}", "entrypoint": ["python", "t.py"], "user": "bench"}
                spec = replace(load_spec({**doc, "array": indices}), submitted_by="bench")
                began = time.perf_counter()
                store_array(pool, spec, "", lambda s: s)
                stored.append(time.perf_counter() - began)
            cli = []
            for a in range(args.arrays):
                command = [
                    sys.executable, "-m", "nodeagent.cli.ctl", "--redis", server.url,
                    "--pool", pool.keys.pool, "submit", "--parsable", "--name", f"cli{a}",
                    "--array", indices, "--", "python", "t.py",
                ]  # fmt: skip
                began = time.perf_counter()
                subprocess.run(command, check=True, capture_output=True)
                cli.append(time.perf_counter() - began)
            pending = 2 * args.arrays * args.tasks
            after = rounds(pool, leader, args.rounds)
            print(json.dumps({"pending_tasks": pending, **after}), flush=True)
        finally:
            server.stop()
    result: dict[str, Any] = {
        "pool": {"nodes": NODES, "running_jobs": JOBS},
        "array": indices,
        "store_s": {"median": round(statistics.median(stored), 3), "each": stored},
        "cli_s": {"median": round(statistics.median(cli), 3), "each": cli},
        "round_before": before,
        "round_with_tasks_pending": {"pending_tasks": pending, **after},
    }
    print(json.dumps({k: result[k] for k in ("store_s", "cli_s")}), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
