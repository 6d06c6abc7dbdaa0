"""False alarms: does a healthy job on a loaded machine ever see a hang or a frozen node?

The fast verdicts of issue 64 (a worker stopped by a signal found at `timing.stopped_timeout`,
500 ms; a silent peer suspected by the phi accrual detector, `timing.peer_phi` 8, from 500 ms)
are only worth having if they never fire on a job that is fine. This runs bench/recovery.py's
`nodeagent+inplace` job (three agents on a real redis-server, examples/train_elastic.py, a
commit every step, a checkpoint every 10 steps, ~30 ms a step, hang_timeout 10 s, the peers'
watch and stopped_timeout at their defaults) for --minutes with nothing wrong, while:
- load: --hogs processes spin on the CPUs (4 on this 2-core machine: a load average over 5, as
  CI's `pytest -n 2` running training tests makes it);
- saves: every --save-every seconds a 1 GiB file is written and fsynced beside the job (the
  disk and the page cache of a large checkpoint);
- a throttle: one node's worker held to --share of a CPU by the kernel's CPU controller (the
  slow-node bench's, tests/helpers/throttle.py), so its peers wait for it at every step.

It counts what a false alarm would leave: `peer_suspected` events (each suspicion a node
reports), `node_lost` and `worker_hung` events, failed workers, and generations past the first.
Every figure comes from the job's own events in Redis. Run as root (the throttle's cgroups):

    sudo .venv/bin/python bench/false_alarms.py --minutes 10 --out bench/results/false-alarms.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recovery import LIGHT, NODES, NodeagentLaunch, launched, training_process  # noqa: E402
from tests.helpers import throttle  # noqa: E402
from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402

SYSTEM = "nodeagent+inplace"
SAVE_BYTES = 1 << 30
CHUNK = os.urandom(64 << 20)  # written 16 times: a 1 GiB save the page cache cannot fold
ALARMS = ("peer_suspected", "node_lost", "worker_hung", "worker_failed", "node_reaped")


@contextlib.contextmanager
def hogs(count: int) -> Iterator[None]:
    """`count` processes spinning on the CPUs."""
    spin = [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(spin) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def saves(directory: Path, every: float, done: list[float]) -> Iterator[None]:
    """A 1 GiB file written and fsynced every `every` seconds (each save's seconds in `done`)."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            began = time.monotonic()
            path = directory / "save.bin"
            with open(path, "wb") as f:
                for _ in range(SAVE_BYTES // len(CHUNK)):
                    f.write(CHUNK)
                f.flush()
                os.fsync(f.fileno())
            path.unlink()
            done.append(time.monotonic() - began)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def alarms(launch: NodeagentLaunch, t0: float) -> dict[str, Any]:
    """What the job's events say happened after t0."""
    events = [
        e for e in launch.cluster.store.events("-", count=100_000) if (e.at_ms or 0) / 1000 >= t0
    ]
    counts = Counter(e.type for e in events)
    return {
        "counts": {kind: counts.get(kind, 0) for kind in ALARMS},
        "generations": launch.cluster.status()["generation"],
        "events": [  # the alarms, and what the job's leader named (job/stalls.py)
            {"type": e.type, "node": e.node, "message": e.message}
            for e in events
            if e.type in ALARMS or e.type == "ranks_waited_on"
        ][:50],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--hogs", type=int, default=4, help="processes spinning on the CPUs")
    parser.add_argument("--save-every", type=float, default=60.0, help="seconds between saves")
    parser.add_argument("--share", type=float, default=0.3, help="the throttled worker's CPU")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/false-alarms.json")
    parser.add_argument("--keep", type=Path, help="copy the run's files (agents' logs) here")
    args = parser.parse_args()
    if why := throttle.available():
        sys.exit(f"cannot throttle a worker here: {why}")
    loads: list[float] = []
    save_times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            job = f"bench-false-alarms-{os.getpid()}"
            with launched(SYSTEM, server, Path(tmp) / "run", job, LIGHT) as launch:
                assert isinstance(launch, NodeagentLaunch)
                launch.start(*NODES)
                launch.cluster.wait_running(3, 120)
                wait_for(lambda: len(launch.lines()) > 100, 120, "training")
                launch.settle()
                first = launch.cluster.status()["generation"]
                victim = training_process(launch, NODES[1]).pid
                t0 = time.time()
                with (
                    hogs(args.hogs),
                    saves(Path(tmp), args.save_every, save_times),
                    throttle.throttled("nodeagent-bench-alarms", [victim], args.share),
                ):
                    end = time.monotonic() + args.minutes * 60
                    while time.monotonic() < end:
                        time.sleep(5)
                        loads.append(os.getloadavg()[0])
                found = alarms(launch, t0)
                steps = [x for x in launch.lines() if x.get("event") == "step" and x["t"] >= t0]
                if args.keep is not None:  # the agents' logs, before the directory goes
                    shutil.copytree(Path(tmp) / "run", args.keep, dirs_exist_ok=True)
        finally:
            server.stop()
    result = {
        "minutes": args.minutes,
        "hogs": args.hogs,
        "save_every_s": args.save_every,
        "saves": len(save_times),
        "save_s_median": round(statistics.median(save_times), 2) if save_times else None,
        "throttled_share": args.share,
        "load_1m": {
            "min": min(loads),
            "median": statistics.median(loads),
            "max": max(loads),
        },
        "first_generation": first,
        "steps_taken": len(steps),
        **found,
        "reformed": found["generations"] - first,
        "at": time.strftime("%Y-%m-%d %H:%M"),
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "events"}, indent=2))


if __name__ == "__main__":
    main()
