"""Soak: random faults against a running job for N minutes. Did the promise hold every time?

    sudo .venv/bin/python bench/soak.py --minutes 30 [--lease 3] [--seed 1]

Three agents, each in a network namespace, run probe workers (tests/chaos/probe.py) against
redis-server in a hub namespace, exactly as the chaos suite sets them up. Every 15-30 s one
fault, drawn at random: a worker SIGKILLed, a worker that stops beating (hang detection), an
agent SIGKILLed and restarted 5 s later without systemd, an agent SIGSTOPped for 1.5-3 leases,
redis-server killed and restarted empty, a node's link cut for 1.5-3 leases. After each, the
soak waits for the job to run at full size again. `training_again_s` is the fault to the first
generation whose ranks all started (maybe without the victim), `recovery_s` to the first at
full size (after the victim is back: for a freeze or a partition that includes its length).

Prints and writes bench/results/soak.json: faults by kind, how many recovered and how fast,
the longest time without training, overlaps between generations (from the probes' own
records), agent crashes, generation numbers reused, and for the nodes fenced by a partition
or a freeze, their lease deadline minus their worker's death and the grace the worker got.
Needs root (network namespaces).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.chaos import netns
from tests.chaos.harness import ChaosJob, Life, RedisInHub, network, overlaps

NODES = ("a", "b", "c")
FAULTS = ("worker_kill", "worker_hang", "agent_kill", "agent_freeze", "redis_restart", "partition")
RECOVERY_LIMIT_S = 120.0


class Soak:
    def __init__(self, job: ChaosJob, server: RedisInHub, rng: random.Random) -> None:
        self.job, self.server, self.rng = job, server, rng
        self.killed_agents: set[int] = set()  # pids we killed on purpose
        self.crashes: list[str] = []

    def current(self, generation: int) -> list[Life]:
        return [life for life in self.job.lives() if life.generation == generation]

    def worker_kill(self, gen: int) -> dict[str, Any]:
        life = self.rng.choice(self.current(gen))
        os.kill(life.pid, signal.SIGKILL)
        return {"node": life.node}

    def worker_hang(self, gen: int) -> dict[str, Any]:
        life = self.rng.choice(self.current(gen))
        (self.job.probes / f"hang-{life.pid}").write_text("")
        return {"node": life.node}

    def agent_kill(self, gen: int) -> dict[str, Any]:
        node = self.rng.choice(NODES)
        agent = self.job.cluster.agents[node].proc
        self.killed_agents.add(agent.pid)
        agent.kill()
        agent.wait(10)
        time.sleep(5.0)
        self.job.cluster.start(node)
        return {"node": node}

    def agent_freeze(self, gen: int) -> dict[str, Any]:
        node = self.rng.choice(NODES)
        seconds = self.rng.uniform(1.5, 3.0) * self.job.lease_s
        pid = self.job.agent_pid(node)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
        return {"node": node, "seconds": round(seconds, 2), "fenced": node}

    def redis_restart(self, gen: int) -> dict[str, Any]:
        self.server.kill()
        down = self.rng.uniform(0.5, 2.0)
        time.sleep(down)
        self.server.start()
        return {"down_s": round(down, 2)}

    def partition(self, gen: int) -> dict[str, Any]:
        node = self.rng.choice(NODES)
        seconds = self.rng.uniform(1.5, 3.0) * self.job.lease_s
        self.job.net.cut(node)
        time.sleep(seconds)
        self.job.net.heal(node)
        return {"node": node, "seconds": round(seconds, 2), "fenced": node}

    def check_agents(self) -> None:
        for name, agent in self.job.cluster.agents.items():
            code = agent.proc.poll()
            if code is not None and agent.proc.pid not in self.killed_agents:
                self.crashes.append(f"{name} (pid {agent.proc.pid}) exited {code}")
                self.killed_agents.add(agent.proc.pid)
                self.job.cluster.start(name)

    def recovered_at(self, gen: int, full: bool) -> tuple[int, float] | None:
        """The first generation after `gen` all of whose ranks started (at full size, three
        nodes, when `full`), and when the last of them did; None if there is none yet."""
        by_gen: dict[int, list[Life]] = {}
        for life in self.job.lives():
            if life.generation > gen:
                by_gen.setdefault(life.generation, []).append(life)
        for generation in sorted(by_gen):
            lives = by_gen[generation]
            world = len(NODES) if full else lives[0].world
            if len(lives) == world == lives[0].world:
                return generation, max(life.start for life in lives)
        return None


def training_gaps(lives: list[Life], start: float, end: float) -> float:
    """The longest stretch within [start, end] when no generation had all its ranks running."""
    by_gen: dict[int, list[Life]] = {}
    for life in lives:
        by_gen.setdefault(life.generation, []).append(life)
    spans = sorted(
        (max(life.start for life in group), min(life.end for life in group))
        for group in by_gen.values()
    )
    longest, covered = 0.0, start
    for begin, finish in spans:
        if finish <= covered:
            continue
        longest = max(longest, begin - covered)
        covered = max(covered, finish)
    return max(longest, end - covered)


def reused_generations(lives: list[Life]) -> list[int]:
    """Generations that started again after a newer one had started (numbers reused)."""
    reused = set()
    for life in lives:
        if any(o.generation > life.generation and o.start < life.start for o in lives):
            reused.add(life.generation)
    return sorted(reused)


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "min": round(min(values), 3),
        "median": round(statistics.median(values), 3),
        "max": round(max(values), 3),
    }


def run(
    minutes: float, lease: float, seed: int, directory: Path, kinds: tuple[str, ...] = FAULTS
) -> dict[str, Any]:
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    with network() as net:
        server = RedisInHub(net, directory)
        server.start()
        # Worker kills and hangs are charged to max_restarts, as they should be: the soak's job
        # has budget for all of them.
        job = ChaosJob(
            net,
            directory,
            server.url,
            server.control_url,
            lease,
            hang_timeout_s=5.0,
            max_restarts=10_000,
        )
        soak = Soak(job, server, rng)
        try:
            gen = job.start()
            began = time.time()
            end = began + minutes * 60
            while time.time() < end:
                time.sleep(min(rng.uniform(15, 30), max(0.0, end - time.time())))
                if time.time() >= end:
                    break
                soak.check_agents()
                kind = rng.choice(kinds)
                inject: Callable[[int], dict[str, Any]] = getattr(soak, kind)
                at = time.time()
                detail = inject(gen)
                record: dict[str, Any] = {"fault": kind, "at": round(at - began, 1), **detail}
                deadline = time.time() + RECOVERY_LIMIT_S
                found = None
                while time.time() < deadline and found is None:
                    soak.check_agents()
                    found = soak.recovered_at(gen, full=True)
                    time.sleep(0.1)
                if found is None:
                    record["recovered"] = False
                    record["diagnostics"] = job.cluster.diagnostics().splitlines()
                    print(f"{record['at']:7.1f}s {kind}: NOT recovered", flush=True)
                    records.append(record)
                    break
                new_gen, started = found
                first = soak.recovered_at(gen, full=False)
                assert first is not None  # the full generation is one
                record.update(
                    recovered=True,
                    training_again_s=round(first[1] - at, 3),
                    recovery_s=round(started - at, 3),
                    generation=new_gen,
                )
                if "fenced" in detail:
                    fenced = [
                        life
                        for life in job.lives()
                        if life.generation == gen and life.node == detail["fenced"]
                    ]
                    if fenced:
                        grace = fenced[0].grace
                        record["margin_s"] = round(job.margin(fenced[0]), 3)
                        record["grace_s"] = None if grace is None else round(grace, 3)
                print(
                    f"{record['at']:7.1f}s {kind:13s} {detail.get('node', ''):2s} training again "
                    f"in {record['training_again_s']:.2f}s, generation {new_gen} at full size "
                    f"in {record['recovery_s']:.2f}s"
                    + (f", margin {record['margin_s']:.3f}s" if "margin_s" in record else ""),
                    flush=True,
                )
                records.append(record)
                gen = new_gen
            ended = time.time()
            lives = job.lives()
            logs = "".join(agent.log() for agent in job.cluster.agents.values())
        finally:
            job.close()
            server.kill()
    found_overlaps = overlaps(lives)
    fenced_records = [r for r in records if "margin_s" in r]
    return {
        "minutes": minutes,
        "lease_s": lease,
        "heartbeat_s": job.heartbeat_s,
        "seed": seed,
        "faults": dict(Counter(r["fault"] for r in records)),
        "recovered": sum(1 for r in records if r.get("recovered")),
        "not_recovered": [r for r in records if not r.get("recovered")],
        "training_again_s": {
            kind: _stats(
                [
                    r["training_again_s"]
                    for r in records
                    if r["fault"] == kind and r.get("recovered")
                ]
            )
            for kind in FAULTS
        },
        "recovery_s": {
            kind: _stats(
                [r["recovery_s"] for r in records if r["fault"] == kind and r.get("recovered")]
            )
            for kind in FAULTS
        },
        "longest_without_training_s": round(training_gaps(lives, began, ended), 3),
        "overlaps": len(found_overlaps),
        "overlap_details": [
            f"{o.node} gen {o.generation} ran {d:.3f}s after {n.node} gen {n.generation} started"
            for o, n, d in found_overlaps
        ],
        "agent_crashes": soak.crashes,
        "tracebacks_in_agent_logs": logs.count("Traceback"),
        "generations_reused": reused_generations(lives),
        "fenced_deadline_minus_death_s": _stats([r["margin_s"] for r in fenced_records]),
        "fenced_grace_s": _stats(
            [r["grace_s"] for r in fenced_records if r.get("grace_s") is not None]
        ),
        "records": records,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--lease", type=float, default=3.0, help="lease_ttl in seconds")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "soak.json"))
    parser.add_argument("--faults", default=",".join(FAULTS), help="the kinds to draw from")
    args = parser.parse_args()
    kinds = tuple(args.faults.split(","))
    if not kinds or any(kind not in FAULTS for kind in kinds):
        parser.error(f"--faults takes a comma-separated list of {', '.join(FAULTS)}")
    why_not = netns.unavailable()
    if why_not:
        print(f"soak: {why_not}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        result = run(args.minutes, args.lease, args.seed, Path(tmp), kinds)
    summary = {k: v for k, v in result.items() if k != "records"}
    print(json.dumps(summary, indent=1))
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"written to {args.out}")
    ok = (
        not result["not_recovered"]
        and result["overlaps"] == 0
        and not result["agent_crashes"]
        and not result["generations_reused"]
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
