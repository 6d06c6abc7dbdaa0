"""What a neighbour on a shared node does to a job's step time, with the jobs' limits on and off.

    sudo .venv/bin/python bench/isolation.py [--phase 20] [--gpus 8] [--out FILE]

One agent (root, the unit's capabilities, in a cgroup of its own as the unit's, that cgroup
held to --node-memory as the issue's reporters held their pool), a real redis-server, a fake
node of --gpus GPUs (8: more than this machine's cores, the jobs share the CPUs by weight; 2 on
two cores: each job holds a core of its own, its cpuset, model/cores.py). A one-GPU "steady"
job does a fixed amount of Python work a step (one CPU) and writes each step's time; beside
it, one antagonist at a time, each one-GPU too:

- cpu: a worker and 3 children that spin;
- memory: a worker that writes 64 MiB more every 0.2 s (up to 3 GiB), with `--mem 512MiB`
  (its limit when limits are on);
- forks: a worker that forks sleeping children as fast as it can, up to 2,000 (the bench stops
  there for the machine's sake; pids_max 512 when limits are on).

The steady job holds 1.6 GiB (`--mem 2GiB` when limits are on): the node's largest process, as
the neighbour the issue saw killed for another job's memory.

Each phase (alone, then each antagonist) runs --phase seconds; the steady job's step times in
it give a median and a p99, and a ratio to its own baseline. Limits on: `isolation.cgroups:
required` (the default); off: `isolation.cgroups: off`. Also what became of the steady job
(its restarts) and of the antagonist (its restarts, and the failure named). Writes
bench/results/isolation.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402
from tests.helpers.gpus import gpu  # noqa: E402
from tests.helpers.pool import PoolCluster, pool_cluster  # noqa: E402
from tests.helpers.unitcgroup import remove_all, unit_cgroups  # noqa: E402

STEADY = """
import os, sys, time
held = b"x" * (1600 << 20)  # a neighbour that holds memory, the node's largest process
out = open(os.path.join(os.environ["STEPS_DIR"], "steps"), "a", buffering=1)
while True:
    began = time.perf_counter()
    sum(i * i for i in range(200_000))
    out.write(f"{time.time():.3f} {time.perf_counter() - began:.6f}\\n")
"""
CPU_HOG = """
import multiprocessing, os
def spin():
    while True:
        pass
for _ in range(3):
    multiprocessing.Process(target=spin, daemon=True).start()
spin()
"""
MEMORY_HOG = """
import time
held = []
while sum(map(len, held)) < 3 << 30:
    held.append(b"x" * (64 << 20))
    time.sleep(0.2)
time.sleep(3600)
"""
FORK_BOMB = """
import os, time
children = 0
while children < 2000:
    try:
        if os.fork() == 0:
            time.sleep(3600)
            os._exit(0)
        children += 1
    except OSError:  # EAGAIN at pids.max: it keeps trying, as a fork bomb does
        time.sleep(0.001)
time.sleep(3600)
"""
ANTAGONISTS = {
    "cpu": (CPU_HOG, ()),
    "memory": (MEMORY_HOG, ("--mem", "512MiB")),
    "forks": (FORK_BOMB, ()),
}


def submit(pool: PoolCluster, name: str, program: str, *more: str) -> None:
    said = pool.ctl(
        *("submit", "--parsable", "--name", name, "--nodes", "1", "--gpus-per-node", "1"),
        *("--max-restarts", "100", *more, "--", sys.executable, "-c", program),
    )
    assert said.returncode == 0, said.stderr


def steps_between(path: Path, start: float, end: float) -> list[float]:
    found = []
    for line in path.read_text().splitlines():
        at, took = line.split()
        if start <= float(at) <= end:
            found.append(float(took))
    return found


def figures(times: list[float], baseline: float | None) -> dict[str, Any]:
    ordered = sorted(times)
    median = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return {
        "steps": len(ordered),
        "median_ms": round(median * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
        "median_ratio": round(median / baseline, 3) if baseline else 1.0,
    }


def one_mode(
    limits: bool, phase: float, node_memory: int, directory: Path, units: int
) -> dict[str, Any]:
    redis = RedisServer(directory)
    redis.start()
    try:
        with pool_cluster(redis.url, directory, pool=f"bench-{limits}") as pool:
            gpus = directory / "gpus.yaml"
            gpus.write_text(yaml.safe_dump({"gpus": [gpu(i) for i in range(units)]}))
            isolation = {"pids_max": 512} if limits else {"cgroups": "off", "shm": "shared"}
            pool.node_options["a"] = {
                "health": {"gpu": "on", "interval": "1s", "fake_gpus": str(gpus)},
                "isolation": isolation,
            }
            for cgroup in unit_cgroups("a", directory):  # the pool's machine, as the issue's
                name = "memory.max" if "unified" in str(cgroup) else "memory.limit_in_bytes"
                if (cgroup / name).exists():
                    (cgroup / name).write_text(str(node_memory))
            pool.start("a")
            pool.wait_nodes(1, 60)
            steps_dir = directory / "steady"
            steps_dir.mkdir()
            steady = ("--mem", "2GiB", "--env", f"STEPS_DIR={steps_dir}")
            submit(pool, "steady", STEADY, *(steady if limits else steady[2:]))
            steps = steps_dir / "steps"
            wait_for(lambda: steps.exists() and len(steps.read_text().splitlines()) > 20, 60, "")
            phases: dict[str, Any] = {}
            began = time.time()
            time.sleep(phase)
            phases["alone"] = figures(steps_between(steps, began, time.time()), None)
            baseline = phases["alone"]["median_ms"] / 1000
            for name, (program, more) in ANTAGONISTS.items():
                submit(pool, name, program, *(more if limits else ()))
                began = time.time()
                time.sleep(phase)
                taken = steps_between(steps, began, time.time())
                shown = pool.show(name)
                assert pool.ctl("cancel", name).returncode == 0
                pool.wait_job(name, "cancelled", timeout=120)
                phases[name] = {
                    **figures(taken, baseline),
                    "antagonist_restarts": shown.get("restarts"),
                    "antagonist_detail": shown.get("detail") or "",
                }
                time.sleep(2)  # what it left settles
            return {"phases": phases, "steady_restarts": pool.show("steady").get("restarts")}
    finally:
        redis.stop()
        remove_all()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--phase", type=float, default=20.0, help="seconds a phase")
    parser.add_argument("--node-memory", default=str(3 << 30), help="the pool's memory (bytes)")
    parser.add_argument("--gpus", type=int, default=8, help="the fake node's GPUs")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "isolation.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/isolation.py needs root (the jobs' cgroups)", file=sys.stderr)
        return 2
    result: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "kernel": platform.release()},
        "phase_s": args.phase,
        "node_memory": int(args.node_memory),
        "gpus": args.gpus,
    }
    for limits in (True, False):
        with tempfile.TemporaryDirectory(prefix="bench-isolation-") as tmp:
            found = one_mode(limits, args.phase, int(args.node_memory), Path(tmp), args.gpus)
        result["on" if limits else "off"] = found
        print(json.dumps({"limits": "on" if limits else "off", **found}, indent=1), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
