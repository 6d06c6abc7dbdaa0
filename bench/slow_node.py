"""A slow node: step time before, during and after one node's workers are throttled, the time to
name it and to replace it, beside the same job under torchrun (which keeps the slow node), and
how often a healthy job's windows would name a node (issue 42).

    .venv/bin/python bench/slow_node.py [--phase-s 30] [--share 0.15] [--window 5]
                                        [--healthy-minutes 10] [--out bench/results/slow-node.json]

The job: tests/helpers/elastic_worker.py (a DDP model and an FSDP2-sharded layer, gloo, CPU;
WORK=30 matrix products a step, no pause), three ranks, one a node.
- `nodeagent`: four agents and a real redis-server, `target_nodes: 3` (the fourth stands by),
  `recovery: in_place`, `slow_node: {policy: replace, window: --window, windows: 3}`;
- `torchrun`: three `torchrun --nnodes=3 --rdzv-backend=c10d` launchers, the same script.
Each runs --phase-s healthy, then one member's worker (not rank 0's) is capped at --share of one
CPU by the kernel's CPU controller (cgroup v1 cpu.cfs_quota_us or v2 cpu.max), and stays capped
to the end. nodeagent: from the throttle, the time to `node_slow` (its event) and until every
rank of the next generation stepped, then --phase-s more. torchrun: as long in all. Step time:
the median interval between rank 0's steps in each stretch, from the workers' own lines.

`--healthy-minutes` (0: skip): the nodeagent job, `policy: report`, nothing throttled, for that
long; the bench reads every node's speed once a window and computes each node's ratio as the
leader does (job/slowness.py `ratios`): the share of node-windows above the threshold, the
largest ratio, and the nodes named (the leader's events).

Prints the table and writes the results (--out).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.job.slowness import ratios  # noqa: E402
from nodeagent.model.speed import NodeSpeed  # noqa: E402
from tests.helpers import throttle  # noqa: E402
from tests.helpers.cluster import LocalCluster, RedisServer, wait_for  # noqa: E402
from tests.helpers.inplace import Lines, reformed  # noqa: E402
from tests.helpers.slowjob import NODES, SCRIPT, slow_node_job, workload_env  # noqa: E402

WINDOWS, THRESHOLD = 3, 1.5


def step_time(lines: Lines, since: float, until: float, generation: int | None = None) -> float:
    times = sorted(
        float(line["t"])
        for line in lines.all("step")
        if line["rank"] == 0
        and since <= line["t"] <= until
        and (generation is None or line["gen"] == generation)
    )
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if len(gaps) < 5:
        raise RuntimeError(f"only {len(gaps)} steps of rank 0 in [{since:.1f}, {until:.1f}]")
    return float(statistics.median(gaps))


@contextlib.contextmanager
def nodeagent_job(
    redis: RedisServer, directory: Path, policy: str, window: float
) -> Iterator[LocalCluster]:
    with slow_node_job(redis.url, directory, f"slow-{policy}", policy, window, WINDOWS) as cluster:
        cluster.start(*NODES)
        yield cluster


def run_nodeagent(redis: RedisServer, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    with nodeagent_job(redis, directory, "replace", args.window) as cluster:
        lines = Lines(cluster.records_dir)
        gen = reformed(cluster, 3, 0)
        members = cluster.status()["members"]
        victim = members[1]
        pid = cluster.worker_pids(victim)[0]
        time.sleep(args.phase_s)
        before = step_time(lines, time.time() - args.phase_s + 2, time.time(), gen)
        throttled_at = time.time()
        with throttle.throttled("nodeagent-bench-slow", [pid], args.share):
            slow = wait_for(
                lambda: [e for e in cluster.events() if e["type"] == "node_slow"],
                (WINDOWS + 2) * args.window + 60,
                "the slow node named",
            )
            named_at = slow[0]["at_ms"] / 1000
            during = step_time(lines, throttled_at + args.window, named_at)
            gen = reformed(cluster, 3, gen)
            stepping = time.time()
            time.sleep(args.phase_s)
            after = step_time(lines, stepping + 2, time.time(), gen)
        events = cluster.events()
        return {
            "members": members,
            "throttled": victim,
            "named": [e["node"] for e in events if e["type"] == "node_slow"],
            "step_s": {"before": before, "during": during, "after": after},
            "detect_s": named_at - throttled_at,
            "replaced_s": stepping - throttled_at,
            "during_s": stepping - throttled_at,
            "new_members": cluster.status()["members"],
        }


def run_torchrun(directory: Path, args: argparse.Namespace, throttled_s: float) -> dict[str, Any]:
    records = directory / "records"
    records.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, **workload_env(records), "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    argv = [
        torchrun,
        "--nnodes=3",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=slow",
        "--max-restarts=0",
        str(SCRIPT),
    ]
    launchers = [
        subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=(directory / f"torchrun-{i}.log").open("w"),
            start_new_session=True,
            env=env,
        )
        for i in range(3)
    ]
    lines = Lines(records)
    try:
        wait_for(lambda: {line["rank"] for line in lines.all("step")} == {0, 1, 2}, 120, "steps")
        time.sleep(args.phase_s)
        before = step_time(lines, time.time() - args.phase_s + 2, time.time())
        pid = next(line["pid"] for line in lines.all("step") if line["rank"] == 1)
        throttled_at = time.time()
        with throttle.throttled("nodeagent-bench-slow-torchrun", [pid], args.share):
            time.sleep(throttled_s)
            end = time.time()
        during = step_time(lines, throttled_at + args.window, end)
        after = step_time(lines, end - args.phase_s, end)
        return {"step_s": {"before": before, "during": during, "after": after}}
    finally:
        # torchrun starts its workers in sessions of their own: kill them by their parent
        workers = [child for launcher in launchers for child in _children(launcher.pid)]
        for launcher in launchers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(launcher.pid, 9)
            launcher.wait(10)
        for child in workers:
            with contextlib.suppress(psutil.Error):
                child.kill()


def run_healthy(redis: RedisServer, directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    with nodeagent_job(redis, directory, "report", args.window) as cluster:
        reformed(cluster, 3, 0)
        seen: dict[tuple[str, int], float] = {}
        deadline = time.time() + args.healthy_minutes * 60
        while time.time() < deadline:
            time.sleep(args.window / 2)
            speeds: dict[str, NodeSpeed] = cluster.store.speeds()
            found = ratios(speeds)
            for name, ratio in found.items():
                seen.setdefault((name, speeds[name].seq), ratio)
        values = sorted(seen.values())
        named = [e["node"] for e in cluster.events() if e["type"] == "node_slow"]
        return {
            "minutes": args.healthy_minutes,
            "node_windows": len(values),
            "above_threshold": sum(1 for v in values if v > THRESHOLD),
            "ratio_p50": statistics.median(values) if values else None,
            "ratio_p99": values[int(0.99 * (len(values) - 1))] if values else None,
            "ratio_max": values[-1] if values else None,
            "named": named,
        }


def _children(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-s", type=float, default=30.0)
    parser.add_argument("--share", type=float, default=0.15)
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--healthy-minutes", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/slow-node.json")
    parser.add_argument(
        "--healthy-only",
        action="store_true",
        help="run only the healthy job, keeping the other results already in --out",
    )
    args = parser.parse_args()
    why = throttle.available()
    if why is not None:
        sys.exit(f"cannot throttle here: {why}")
    kept = json.loads(args.out.read_text()) if args.healthy_only and args.out.exists() else {}
    results: dict[str, Any] = {
        **kept,
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {"cpus": psutil.cpu_count(), "python": platform.python_version()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = Path(tempfile.mkdtemp(prefix="slow-node-"))
    (tmp / "redis").mkdir()
    redis = RedisServer(tmp / "redis")
    redis.start()
    try:
        if not args.healthy_only:
            results["nodeagent"] = run_nodeagent(redis, tmp / "nodeagent", args)
            print(json.dumps(results["nodeagent"], indent=1))
            results["torchrun"] = run_torchrun(
                tmp / "torchrun", args, results["nodeagent"]["during_s"] + args.phase_s
            )
            print(json.dumps(results["torchrun"], indent=1))
        if args.healthy_minutes > 0:
            results["healthy"] = run_healthy(redis, tmp / "healthy", args)
            print(json.dumps(results["healthy"], indent=1))
    finally:
        redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    na, tr = results.get("nodeagent"), results.get("torchrun")
    if na is None or tr is None:
        print(json.dumps(results.get("healthy"), indent=1))
        return
    print(f"\n{'':<10} {'before':>8} {'during':>8} {'after':>8}   (median step, ms)")
    for name, got in (("nodeagent", na), ("torchrun", tr)):
        s = got["step_s"]
        print(
            f"{name:<10} {s['before'] * 1000:>8.1f} {s['during'] * 1000:>8.1f} "
            f"{s['after'] * 1000:>8.1f}"
        )
    print(
        f"nodeagent: named slow {na['detect_s']:.1f} s after the throttle, replaced (every rank "
        f"stepping in the new generation) {na['replaced_s']:.1f} s after it"
    )
    if "healthy" in results:
        h = results["healthy"]
        print(
            f"healthy {h['minutes']:g} min: {h['node_windows']} node-windows, "
            f"{h['above_threshold']} above {THRESHOLD}, ratio p50 {h['ratio_p50']}, "
            f"p99 {h['ratio_p99']}, max {h['ratio_max']}; named {h['named'] or 'none'}"
        )
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
