"""Recovery of a real DDP training job (examples/train_ddp.py, gloo, CPU) from each kind of fault.

Three local agents and a real redis-server; each repetition is a fresh job. Measures, from the
job's events (Redis server time) and the workers' own step logs, the time from the fault to the
first training step of the new generation on every rank, split into detection, stopping,
rendezvous and worker start-up; the steps lost; the emergency checkpoint time.

    .venv/bin/python bench/training.py [--reps 3] [--faults worker_sigkill,node_sigterm]

Writes bench/results/training.json. Default timing: heartbeat 1s, lease 5s, hang_timeout 10s.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.timeline import recovery  # noqa: E402
from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for  # noqa: E402
from tests.helpers.training import generations, latest_step, training_entrypoint  # noqa: E402

TIMING = {
    "heartbeat_interval": "1s",
    "lease_ttl": "5s",
    "stop_grace_period": "30s",
    "hang_timeout": "10s",
}
EVERY = 10


def rank0_node(cluster: LocalCluster) -> str:
    return str(cluster.status()["members"][0])


def other_node(cluster: LocalCluster) -> str:
    return str(cluster.status()["members"][-1])


def worker(cluster: LocalCluster, node: str) -> psutil.Process:
    return psutil.Process(cluster.worker_pids(node)[0])


FAULTS: dict[str, tuple[int, int, str, Callable[[LocalCluster], None]]] = {
    # name: (initial world, world after, the event that identifies it, injection)
    "worker_sigkill": (3, 3, "worker_failed", lambda c: worker(c, other_node(c)).kill()),
    "worker_sigstop_hang": (3, 3, "worker_hung", lambda c: worker(c, other_node(c)).suspend()),
    "node_sigkill_rank0": (3, 2, "node_lost", lambda c: c.kill_tree(rank0_node(c))),
    "node_sigkill_other": (3, 2, "node_lost", lambda c: c.kill_tree(other_node(c))),
    "node_sigstop_other": (3, 2, "node_lost", lambda c: c.kill_tree(other_node(c), signal.SIGSTOP)),
    "node_sigterm": (
        3,
        2,
        "node_leaving",
        lambda c: c.agents[other_node(c)].proc.send_signal(signal.SIGTERM),
    ),
    "scale_up_join": (2, 3, "node_joined", lambda c: c.start("c")),
}


def one_run(server: RedisServer, tmp: Path, fault: str, rep: int) -> dict[str, Any]:
    before, after, cause, inject = FAULTS[fault]
    directory = tmp / f"{fault}-{rep}"
    job = f"bench-{fault}-{rep}-{os.getpid()}".replace("_", "-")
    with local_cluster(
        server.url,
        directory,
        job=job,
        max_nodes=3,
        target_nodes=3,
        max_restarts=10,
        timing=TIMING,
        entrypoint=training_entrypoint(directory, 100_000, EVERY, 0.03),
    ) as cluster:
        cluster.start(*["a", "b", "c"][:before])
        cluster.wait_running(before, timeout=120)
        wait_for(lambda: latest_step(cluster) >= 15, 120, "training")
        generation = cluster.status()["generation"]
        t0 = time.time()
        inject(cluster)
        cluster.wait_running(after, timeout=120, after_generation=generation)
        wait_for(
            lambda: any(
                g.number > generation and len({x["rank"] for x in g.of("step")}) == after
                for g in generations(cluster)
            ),
            120,
            "first step everywhere",
        )
        gens = {g.number: g for g in generations(cluster)}
        firsts = {n: g.first_step_time for n, g in gens.items() if g.of("step")}
        row = recovery(fault, t0, cluster.store.events("-", count=10_000), firsts, cause)
        new = gens.get(row.generation) if row.generation is not None else None
        old_last = max(
            (max(g.steps) for n, g in gens.items() if n <= generation and g.steps), default=0
        )
        emergency = [e["seconds"] for g in gens.values() for e in g.of("emergency_checkpoint")]
        if fault == "worker_sigstop_hang" or fault == "node_sigstop_other":
            for proc in psutil.process_iter():  # thaw what we froze so cleanup can proceed
                try:
                    if proc.status() == psutil.STATUS_STOPPED:
                        proc.resume()
                except psutil.Error:
                    pass
    return {
        "detection_s": row.detection_s,
        "stopping_s": row.stopping_s,
        "rendezvous_s": row.rendezvous_s,
        "startup_s": row.startup_s,
        "total_s": row.total_s,
        "world_after": row.world_size,
        "steps_lost": old_last - (new.resumed_from or 0) if new else None,
        "emergency_checkpoint_s": max(emergency) if emergency else None,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "recovered": f"{sum(r['total_s'] is not None for r in runs)}/{len(runs)}"
    }
    for key in runs[0]:
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            out[key] = {
                "min": round(min(values), 3),
                "median": round(statistics.median(values), 3),
                "max": round(max(values), 3),
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "training.json"))
    args = parser.parse_args()
    faults = args.faults.split(",")
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "date": time.strftime("%Y-%m-%d"),
        "timing": TIMING,
        "checkpoint_every": EVERY,
        "reps": args.reps,
        "faults": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp))
        server.start()
        try:
            for fault in faults:
                runs = []
                for rep in range(args.reps):
                    runs.append(one_run(server, Path(tmp), fault, rep))
                    print(f"{fault} {rep + 1}/{args.reps}: " + json.dumps(runs[-1]), flush=True)
                results["faults"][fault] = {"runs": runs, "summary": summarize(runs)}
        finally:
            server.stop()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    print(
        f"\n{'fault':<22} {'ok':>4} {'detect':>7} {'stop':>6} {'rendez':>7} {'start-up':>9} "
        f"{'total':>6} {'lost':>5} {'emerg.ckpt':>10}   (medians, seconds)"
    )
    for fault, data in results["faults"].items():
        s = data["summary"]

        def med(key: str, s: dict[str, Any] = s) -> str:
            return f"{s[key]['median']:.2f}" if key in s else "-"

        print(
            f"{fault:<22} {s['recovered']:>4} {med('detection_s'):>7} {med('stopping_s'):>6} "
            f"{med('rendezvous_s'):>7} {med('startup_s'):>9} {med('total_s'):>6} "
            f"{med('steps_lost'):>5} {med('emergency_checkpoint_s'):>10}"
        )


if __name__ == "__main__":
    main()
