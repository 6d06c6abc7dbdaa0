"""What an acknowledgement costs, and what a Redis failover costs a running job (issue 79).

    .venv/bin/python bench/failover.py [--clients 8] [--seconds 10] [--reps 1]

On this machine, Redis on loopback: a primary, its replica, and (for the failover) three
sentinels (tests/helpers/sentinel.py; down-after 1 s, BENCH_DOWN_AFTER_MS: the tests ask 3 s for
a loaded machine, a bench runs on an idle one).

- `ack`: --clients threads submit held jobs as fast as they can for --seconds each, as
  nodeagentctl does under pool.auth none without its start-up (the submit script, then the
  confirmation: coord/durable.py), with pool.durability replicas 0 and then 1. Submissions a
  second, and each one's latency (median, p99), in ms.
- `failover`: a pool of two agents (the tests' timing: heartbeat 250 ms, lease 3 s) on the
  sentinels' URL runs one 2-node job of examples/train_ddp.py (a checkpoint every 20 steps, 50
  ms a step); the primary is SIGKILLed, a sentinel promotes the replica, the old primary is
  started again at once and rejoins as its replica (as systemd restarts it). With
  timing.ride_through 60 s, and off: the job's generation after, its steps lost (the newest
  step its generation trained minus the step the next generation resumed from: 0 when it never
  re-formed), the longest pause between two of rank 0's steps from a second before the kill
  on, and from the kill: the replica named primary, the first submission stored (on the new
  primary), the first answered done (confirmed on the rejoined replica).

Everything shares this machine's cores. Writes bench/results/failover.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.durable import Durability, NotAcknowledged  # noqa: E402
from nodeagent.coord.keys import PoolKeys  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.model.spec import load_spec  # noqa: E402
from tests.helpers.cluster import nodeagentctl, wait_for  # noqa: E402
from tests.helpers.pool import TIMING, PoolCluster  # noqa: E402
from tests.helpers.sentinel import SentinelSet  # noqa: E402

BENCH_DOWN_AFTER_MS = 1000  # what bench/results/failover.json was measured at

RESULTS = ROOT / "bench" / "results" / "failover.json"
TRAIN = ROOT / "examples" / "train_ddp.py"
POOL = "bench"


def ack(redis_set: SentinelSet, clients: int, seconds: float, replicas: int) -> dict[str, Any]:
    """Submissions a second and their latency with pool.durability `replicas`."""
    url = redis_set.url
    durable = Durability(replicas, 1000)
    latencies: list[float] = []
    failed: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def client(index: int) -> None:
        store = PoolStore(connect(url, 5.0, "bench"), PoolKeys("nodeagent", POOL))
        count = 0
        while time.monotonic() < end:
            count += 1
            name = f"ack{replicas}-{index}-{count}"
            doc = {"id": name, "entrypoint": ["true"], "user": "root", "min_nodes": 1000}
            spec = replace(load_spec(doc, default_user="root"), request=f"r-{name}")
            began = time.perf_counter()
            try:
                store.submit(spec, held_by="bench")
                durable.confirm(store.client, store.keys.acks, name)
            except NotAcknowledged as exc:
                with lock:
                    failed.append(str(exc))
                continue
            took = time.perf_counter() - began
            with lock:
                latencies.append(took)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ordered = sorted(latencies)
    return {
        "replicas": replicas,
        "submissions": len(latencies),
        "per_s": round(len(latencies) / seconds, 1),
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p99_ms": round(ordered[int(0.99 * (len(ordered) - 1))] * 1000, 2),
        "not_acknowledged": len(failed),
    }


def _steps(pool: PoolCluster, job: str) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for path in sorted((pool.directory / "logs" / job).glob("rank-0*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    continue
    return sorted(lines, key=lambda x: x.get("t", 0))


def failover(directory: Path, ride: str) -> dict[str, Any]:
    """One job through a killed primary, with ride_through `ride`."""
    with_sets = SentinelSet(directory / "redis", BENCH_DOWN_AFTER_MS)
    with_sets.start()
    pool = PoolCluster(
        with_sets.url,
        directory,
        pool=POOL,
        timing={**TIMING, "ride_through": ride},
        scheduling={"durability": {"replicas": 1, "timeout": "1s"}},
    )
    try:
        pool.start("a", "b")
        pool.wait_nodes(2, 60)
        checkpoints = directory / "ck"
        submitted = pool.ctl(
            *("submit", "--name", "train", "--nodes", "2", "--", sys.executable, str(TRAIN)),
            *("--steps", "100000", "--checkpoint-dir", str(checkpoints)),
            *("--checkpoint-every", "20", "--step-time", "0.05"),
        )
        assert submitted.returncode == 0, submitted.stderr
        before = pool.wait_job("train", "running", world=2, timeout=120)["generation"]
        wait_for(
            lambda: len([x for x in _steps(pool, "train") if x["event"] == "step"]) > 60,
            120,
            "steps",
        )
        assert with_sets.primary.proc is not None
        killed = time.time()
        with_sets.primary.proc.kill()
        with_sets.promoted()
        promoted = time.time() - killed
        # systemd starts the old primary again (Restart=always): it rejoins as the replica
        rejoining = threading.Thread(target=with_sets.rejoined)
        rejoining.start()
        stored = acknowledged = None
        keys = PoolKeys("nodeagent", POOL)
        for attempt in range(600):  # until the pool stores, then acknowledges, a submission
            name = f"probe-{attempt}"
            done = nodeagentctl(
                *("--redis", with_sets.url, "--pool", POOL, "submit", "--name", name),
                *("--hold", "--nodes", "1", "--", "true"),
            )
            new = with_sets.promoted().client()
            if stored is None and new.hexists(keys.specs, name):
                stored = time.time() - killed
            if done.returncode == 0:
                acknowledged = time.time() - killed
                break
        rejoining.join()
        time.sleep(5.0)
        after = pool.jobs()["train"]
        steps = _steps(pool, "train")
        trained = max(x["step"] for x in steps if x["event"] == "step" and x["gen"] == before)
        resumed = [x for x in steps if x["event"] == "resumed" and x["t"] > killed]
        times = [x["t"] for x in steps if x["event"] == "step" and x["t"] > killed - 1.0]
        paused = max((b - a for a, b in itertools.pairwise(times)), default=0.0)
        return {
            "ride_through": ride,
            "generation_before": before,
            "generation_after": after["generation"],
            "steps_lost": trained - resumed[0]["step"] if resumed else 0,
            "paused_s": round(paused, 2),
            "promoted_s": round(promoted, 2),
            "stored_s": round(stored, 2) if stored is not None else None,
            "acknowledged_s": round(acknowledged, 2) if acknowledged is not None else None,
        }
    finally:
        pool.stop()
        with_sets.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--reps", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, Any] = {"machine": platform.node(), "when": time.strftime("%Y-%m-%d")}
    with tempfile.TemporaryDirectory() as tmp:
        redis_set = SentinelSet(Path(tmp) / "ack", BENCH_DOWN_AFTER_MS)
        redis_set.start()
        try:
            results["ack"] = [ack(redis_set, args.clients, args.seconds, r) for r in (0, 1)]
        finally:
            redis_set.stop()
        for row in results["ack"]:
            print(
                f"replicas {row['replicas']}: {row['per_s']} submissions/s, median "
                f"{row['median_ms']} ms, p99 {row['p99_ms']} ms ({args.clients} clients)"
            )
        runs = []
        for rep in range(args.reps):
            for ride in ("60s", "off"):
                found = failover(Path(tmp) / f"failover-{ride}-{rep}", ride)
                print(json.dumps(found))
                runs.append(found)
        results["failover"] = runs
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
