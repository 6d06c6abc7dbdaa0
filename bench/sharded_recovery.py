"""A sharded job's recovery from a killed worker: restart against in place, both with the
checkpoint tiers (issue 25).

    .venv/bin/python bench/sharded_recovery.py [--reps 3]

Three agents on this machine and a real redis-server, one worker each, run
examples/train_fsdp.py (FSDP2, gloo, CPU, a save into the memory tier every 2 steps, 0.15 s of
extra step time), with the timing of the end-to-end tests (heartbeat 250 ms, lease 3 s):
- `restart`: `recovery: restart` (the default): every worker of the job is stopped and started
  again, and every rank restores the chosen step;
- `in_place`: `recovery: in_place`, the script under `elastic.run` (--in-place): survivors keep
  their processes, rebuild the model on the new group and restore the chosen step; only the
  killed rank starts anew.
Each repetition is a fresh job: train to step 10, SIGKILL the worker of the node that does not
hold rank 0, and measure on one clock from the workers' own lines:
- recovery: kill -> every rank of the new generation finished a step;
- restore:  kill -> every rank of the new generation printed "restored" (its load included);
- steps lost: the newest step trained before the kill minus the step restored;
- survivors kept: workers alive before the kill still running in the new generation.
Writes bench/results/sharded-recovery.json and prints medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.cluster import LocalCluster, RedisServer, wait_for  # noqa: E402
from tests.helpers.fsdp import fsdp_cluster, lines  # noqa: E402

SYSTEMS = ("restart", "in_place")
TRAIN_TO = 10


def _generation_after(cluster: LocalCluster, before: int) -> int:
    cluster.wait_status(
        lambda d: d["generation"] > before and d["state"] == "running", 120, "a new generation"
    )
    generation: int = cluster.status()["generation"]
    return generation


def _stepped(cluster: LocalCluster, generation: int, world: int) -> list[dict[str, Any]] | None:
    """Each rank's first step line in `generation`, once every rank has one."""
    first: dict[int, dict[str, Any]] = {}
    for x in lines(cluster, generation):
        if x["event"] == "step" and x["rank"] not in first:
            first[x["rank"]] = x
    return list(first.values()) if len(first) == world else None


def one(system: str, redis: RedisServer, directory: Path, rep: int) -> dict[str, Any]:
    shm = Path(tempfile.mkdtemp(prefix="nodeagent-bench-", dir="/dev/shm"))
    shm.chmod(0o700)
    job = f"bench-{system.replace('_', '-')}-{rep}"
    with fsdp_cluster(
        redis, job, directory, shm, steps=100_000, in_place=system == "in_place"
    ) as cluster:
        cluster.start("a", "b", "c")
        wait_for(
            lambda: any(x["event"] == "step" and x["step"] >= TRAIN_TO for x in lines(cluster, 1)),
            180,
            f"step {TRAIN_TO}",
        )
        alive = {x["pid"] for x in lines(cluster, 1) if x["event"] == "restored"}
        victim = psutil.Process(cluster.worker_pids("b")[0])
        killed_at = time.time()
        victim.kill()
        victim.wait(10)
        trained = max(x["step"] for x in lines(cluster, 1) if x["event"] == "step")
        generation = _generation_after(cluster, 1)
        firsts = wait_for(lambda: _stepped(cluster, generation, 3), 180, "every rank to step")
        restored = [x for x in lines(cluster, generation) if x["event"] == "restored"]
        result = {
            "system": system,
            "recovery_s": round(max(x["t"] for x in firsts) - killed_at, 3),
            "restore_s": round(max(x["t"] for x in restored) - killed_at, 3),
            "steps_lost": trained - restored[0]["step"],
            "survivors_kept": len(alive & {x["pid"] for x in restored}),
        }
        cluster.ctl("stop")
    shutil.rmtree(shm, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis = RedisServer(Path(tmp))
        redis.start()
        try:
            for rep in range(args.reps):
                for system in SYSTEMS:
                    directory = Path(tmp) / f"{system}-{rep}"
                    directory.mkdir()
                    runs.append(one(system, redis, directory, rep))
                    print(json.dumps(runs[-1]), flush=True)
        finally:
            redis.stop()
    medians = {
        system: {
            key: statistics.median(r[key] for r in runs if r["system"] == system)
            for key in ("recovery_s", "restore_s", "steps_lost", "survivors_kept")
        }
        for system in SYSTEMS
    }
    ratio = medians["restart"]["recovery_s"] / medians["in_place"]["recovery_s"]
    results = {"reps": args.reps, "runs": runs, "medians": medians, "restart_over_in_place": ratio}
    path = ROOT / "bench" / "results" / "sharded-recovery.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({"medians": medians, "restart_over_in_place": round(ratio, 2)}, indent=1))
    print(f"written to {path}")


if __name__ == "__main__":
    main()
