"""Benchmark of the elastic core: recovery times, agent overhead, Redis load.

Three local agents, a real redis-server, a trivial worker (tests/helpers/worker.py). Prints the
figures and writes bench/results/core.json. Run:  .venv/bin/python bench/core.py [--reps 5]

Figures:
- worker SIGKILL -> every new-generation worker started (the workers' own start records, so
  Python start-up of the worker is included), and -> generation started (agents only);
- agent SIGKILL (whole tree) -> the re-formed job's workers started, with the lease and
  heartbeat given (default timing: 1s heartbeat, 5s lease);
- agent overhead while a job runs, over --overhead seconds (default 60), with the trivial worker
  and with the DDP training job (examples/train_ddp.py, a progress beat every step, hang
  detection on, preload on): CPU % of one core and RSS per agent, the RSS of each preloaded
  interpreter, and Redis commands per node per second (INFO commandstats): those the agents
  send (EVALSHA, XREAD) and all executed, counting the ones inside the Lua scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.supervisor.spares import SPARE_MODULE  # noqa: E402
from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster  # noqa: E402
from tests.helpers.training import training_entrypoint  # noqa: E402


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def worker_kill(cluster: LocalCluster, reps: int) -> dict[str, Any]:
    doc = cluster.wait_running(3)
    to_workers, to_generation = [], []
    for _ in range(reps):
        pid = cluster.worker_pids("b")[0]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        doc = cluster.wait_running(3, after_generation=doc["generation"])
        starts = cluster.starts(doc["generation"])
        to_workers.append(max(s["time"] for s in starts) - killed)
        started = [
            e
            for e in cluster.events()
            if e["type"] == "generation_started" and e["generation"] == doc["generation"]
        ]
        to_generation.append(started[0]["at_ms"] / 1000 - killed)
    return {
        "to_all_workers_started_s": summary(to_workers),
        "to_generation_started_s": summary(to_generation),
    }


def agent_kill(cluster: LocalCluster, reps: int) -> dict[str, Any]:
    doc = cluster.wait_running(3)
    recovered = []
    for rep in range(reps):
        victim = "c"
        killed = time.time()
        cluster.kill_tree(victim)
        doc = cluster.wait_running(2, timeout=60, after_generation=doc["generation"])
        recovered.append(max(s["time"] for s in cluster.starts(doc["generation"])) - killed)
        cluster.start(victim)  # rejoins; the job grows back to 3 for the next repetition
        doc = cluster.wait_running(3, timeout=60, after_generation=doc["generation"])
        print(f"  agent kill {rep + 1}/{reps}: {recovered[-1]:.2f}s", flush=True)
    return {"to_all_workers_started_s": summary(recovered)}


ROUND_TRIPS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_xread")  # what agents send


def commands_total(client: redis.Redis) -> tuple[int, int]:
    """(commands agents send, every command executed including those inside Lua scripts)."""
    stats: Any = client.info("commandstats")
    sent = sum(int(stats[k]["calls"]) for k in ROUND_TRIPS if k in stats)
    return sent, sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def overhead(cluster: LocalCluster, server: RedisServer, seconds: float) -> dict[str, Any]:
    """The agents' own CPU, RSS and Redis commands while their job runs."""
    cluster.wait_running(3, timeout=120)
    time.sleep(10)  # let start-up settle (and preloaded interpreters finish their imports)
    agents = {name: psutil.Process(a.proc.pid) for name, a in cluster.agents.items()}
    client = server.client()
    cpu0 = {n: p.cpu_times() for n, p in agents.items()}
    calls0 = commands_total(client)
    t0 = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - t0
    calls1 = commands_total(client)
    cpu = {
        n: (sum(p.cpu_times()[:2]) - sum(cpu0[n][:2])) / elapsed * 100 for n, p in agents.items()
    }
    rss = {n: p.memory_info().rss / 2**20 for n, p in agents.items()}
    spares = [
        c.memory_info().rss / 2**20
        for p in agents.values()
        for c in p.children()
        if SPARE_MODULE in c.cmdline()
    ]
    sent, executed = ((b - a) / elapsed / len(agents) for a, b in zip(calls0, calls1, strict=True))
    return {
        "window_s": round(elapsed, 1),
        "agent_cpu_percent_of_one_core": {n: round(v, 3) for n, v in cpu.items()},
        "agent_rss_mib": {n: round(v, 1) for n, v in rss.items()},
        "redis_commands_sent_per_node_per_s": round(sent, 3),
        "redis_commands_executed_per_node_per_s_incl_lua": round(executed, 3),
        "preloaded_interpreter_rss_mib": [round(v, 1) for v in spares],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--overhead", type=float, default=60.0, help="seconds of overhead window")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "core.json"))
    parser.add_argument(
        "--peer-interval",
        help="timing.peer_interval (default the agents' own, 100ms; off: the members' watch off)",
    )
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "date": time.strftime("%Y-%m-%d"),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        results["machine"]["redis"] = server.client().info("server")["redis_version"]
        try:
            # The crash-loop backoff (restart_backoff, default 1 s, doubling) would space the
            # repeated kills below by design: off, so the figures are the recovery itself.
            fast = {
                "heartbeat_interval": "1s",
                "lease_ttl": "5s",
                "stop_grace_period": "10s",
                "restart_backoff": "off",
            }
            if args.peer_interval is not None:
                fast["peer_interval"] = args.peer_interval
            results["peer_interval"] = args.peer_interval or "100ms (default)"
            with local_cluster(
                server.url,
                Path(tmp) / "a",
                job="bench-core",
                max_nodes=3,
                max_restarts=1000,
                timing=fast,
            ) as cluster:
                cluster.start("a", "b", "c")
                print("worker SIGKILL ...", flush=True)
                results["worker_sigkill"] = worker_kill(cluster, args.reps)
                print(f"overhead, trivial worker, {args.overhead:.0f}s ...", flush=True)
                results["overhead_trivial_worker"] = overhead(cluster, server, args.overhead)
                print("agent SIGKILL (heartbeat 1s, lease 5s) ...", flush=True)
                results["agent_sigkill_hb1s_lease5s"] = agent_kill(cluster, args.reps)
            with local_cluster(
                server.url,
                Path(tmp) / "t",
                job="bench-training",
                max_nodes=3,
                timing={**fast, "hang_timeout": "10s"},
                entrypoint=training_entrypoint(Path(tmp) / "t", 10**6, 10, 0.03),
                job_options={"preload": ["torch", "torch._dynamo"]},
            ) as cluster:
                cluster.start("a", "b", "c")
                print(f"overhead, DDP training job, {args.overhead:.0f}s ...", flush=True)
                results["overhead_training"] = overhead(cluster, server, args.overhead)
        finally:
            server.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
