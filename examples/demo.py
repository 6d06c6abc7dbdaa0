"""nodeagent demo: a pool of four local agents, three DDP jobs submitted, a fault recovered.

    bash examples/demo.sh          # sets everything up, then runs this

What happens (about two minutes on two cores):
1. a private redis-server and agents a, b, c, d start: a pool of four nodes, no job yet;
2. `nodeagentctl submit` of job alpha (2 nodes) and job beta (elastic, 1 to 2 nodes): each is
   admitted as a gang on two nodes of its own;
3. job gamma (2 nodes) is submitted: no node is free, so it waits, and says why;
4. a worker of alpha is killed with SIGKILL: alpha re-forms and resumes from its checkpoint;
   beta is not disturbed (its generation stays 1);
5. alpha finishes: its two nodes go back to the pool and gamma is admitted on them at once.
Then it prints the pool's events, alpha's recovery split into phases, and each job's result,
and cleans up every process it started.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import yaml

from nodeagent.coord.client import connect
from nodeagent.coord.embedded import EmbeddedRedis
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.store import JobStore
from nodeagent.job.timeline import recovery
from nodeagent.supervisor.spares import SPARE_MODULE
from nodeagent.views.status import status_document

ROOT = Path(__file__).resolve().parents[1]
NODES = ("a", "b", "c", "d")
USER = pwd.getpwuid(os.geteuid()).pw_name  # the workers are yours, as under torchrun


class Demo:
    def __init__(self, workdir: Path, steps: int) -> None:
        self.workdir = workdir
        self.steps = steps
        self.redis = EmbeddedRedis(f"demo-{os.getpid()}")
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.started = time.time()
        self.stores: dict[str, JobStore] = {}

    # -- plumbing ----------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.started:6.1f}s] {text}", flush=True)

    def config(self, name: str) -> Path:
        """A pool node: no job: section; jobs come from `nodeagentctl submit`."""
        path = self.workdir / f"{name}.yaml"
        config = {
            "node": {"name": name, "address": "127.0.0.1"},
            "redis": {"url": self.redis.url},
            # Whom this node runs jobs as: you (and root only because you may be root here).
            # auth none: the demo needs no munged (a shared pool should: docs/pool.md, "Who is who")
            "pool": {
                "name": "demo",
                "users": [USER],
                "allow_root": True,
                "labels": {"rack": "r1"},
                "auth": "none",
            },
            "timing": {
                "heartbeat_interval": "500ms",
                "lease_ttl": "3s",
                "stop_grace_period": "15s",
                "hang_timeout": "30s",
            },
            "metrics": {"listen": "127.0.0.1:0"},  # four agents, one machine
            "log_dir": str(self.workdir / "logs"),
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def start_agent(self, name: str) -> None:
        with open(self.workdir / f"agent-{name}.log", "ab") as log:
            self.agents[name] = subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "run", "--config", str(self.config(name))],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def ctl(self, *args: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeagent.cli.ctl",
                "--redis",
                self.redis.url,
                "--pool",
                "demo",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if result.returncode != 0:
            raise SystemExit(f"demo: nodeagentctl {' '.join(args)} failed: {result.stderr}")
        return result.stdout

    def submit(self, job: str, nodes: str, steps: int) -> None:
        train = [
            sys.executable,
            str(ROOT / "examples" / "train_ddp.py"),
            "--steps",
            str(steps),
            "--checkpoint-every",
            "10",
            "--step-time",
            "0.05",
            "--checkpoint-dir",
            str(self.workdir / job / "checkpoints"),
            "--final-dir",
            str(self.workdir / job / "final"),
        ]
        low, _, high = nodes.partition(":")
        spec = {
            "id": job,
            "entrypoint": train,
            "nproc_per_node": 1,
            "min_nodes": int(low),
            "max_nodes": int(high or low),
            "env": {"OMP_NUM_THREADS": "1"},
            # Restarts run in interpreters that imported these already.
            "preload": ["torch", "torch._dynamo"],
        }
        path = self.workdir / f"{job}.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = self.ctl("submit", str(path))
        self.stores[job] = JobStore(connect(self.redis.url, 5.0), JobKeys("nodeagent", job))
        self.say(f"$ nodeagentctl submit {job}.yaml   (nodes {nodes})  -> {out.strip()}")

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {row["job"]: row for row in json.loads(self.ctl("jobs", "--json"))["jobs"]}

    def status(self, job: str) -> dict[str, Any]:
        return status_document(self.stores[job].snapshot(), job)

    def steps_by_generation(self, job: str) -> dict[int, list[dict[str, Any]]]:
        lines: dict[int, list[dict[str, Any]]] = {}
        for log in (self.workdir / "logs" / job).glob("*/rank-*.log"):
            for text in log.read_text(errors="replace").splitlines():
                if text.startswith("{"):
                    lines.setdefault(int(log.parent.name), []).append(json.loads(text))
        return lines

    def first_steps(self, job: str) -> dict[int, float]:
        """Per generation: when every rank had done its first step."""
        firsts: dict[int, float] = {}
        for gen, lines in self.steps_by_generation(job).items():
            per_rank: dict[int, float] = {}
            for line in sorted(lines, key=lambda x: x["t"]):
                if line.get("event") == "step":
                    per_rank.setdefault(line["rank"], line["t"])
            worlds = {line["world"] for line in lines}
            if per_rank and len(per_rank) == max(worlds):
                firsts[gen] = max(per_rank.values())
        return firsts

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.2)
        raise SystemExit(f"demo: timed out waiting for {what}; logs are in {self.workdir}")

    def wait_training(self, job: str, world: int, after_generation: int = 0) -> int:
        def ok() -> bool:
            doc = self.status(job)
            gen = doc["generation"]
            if doc["state"] != "running" or doc["world_size"] != world or gen <= after_generation:
                return False
            lines = self.steps_by_generation(job).get(gen, [])
            return len({line["step"] for line in lines if line.get("event") == "step"}) >= 3

        self.wait(f"{job} training at world {world}", ok)
        doc = self.status(job)
        self.say(f"{job}: training, generation {doc['generation']}, world {world}")
        return int(doc["generation"])

    def worker_of(self, job: str) -> psutil.Process:
        """A running worker of `job` (its node's agent started it)."""
        doc = self.status(job)
        pids = [w["pid"] for n in doc["nodes"] for w in n["workers"] if w["state"] == "running"]
        return psutil.Process(pids[-1])

    def wait_preloaded(self, job: str) -> None:
        """Until each node of `job` has its spare interpreter (job.preload) ready, idle: a
        restarted worker then runs in one that has imported torch already."""

        def ready() -> bool:
            members = self.status(job)["members"]
            workers = {w["pid"] for n in self.status(job)["nodes"] for w in n["workers"]}
            spares = []
            for name in members:
                for child in psutil.Process(self.agents[name].pid).children():
                    with contextlib.suppress(psutil.Error):
                        if child.pid not in workers and SPARE_MODULE in child.cmdline():
                            spares.append(child)
            try:
                return len(spares) == len(members) and all(c.cpu_percent(0.2) < 5 for c in spares)
            except psutil.Error:
                return False

        self.wait(f"{job}'s preloaded interpreters", ready)

    def kill_tree(self, name: str) -> None:
        proc = psutil.Process(self.agents[name].pid)
        for p in [proc, *proc.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                p.kill()
        self.agents[name].wait()

    # -- the story ---------------------------------------------------------------------------

    def run(self) -> int:
        self.say(f"starting a private redis-server; work directory {self.workdir}")
        self.redis.start()
        for name in NODES:
            self.start_agent(name)
        self.say("agents a, b, c, d started: a pool of four nodes, no job yet")
        self.wait("four nodes in the pool", lambda: self.ctl("nodes").count("(free)") == 4)
        print(self.ctl("nodes"), flush=True)

        self.submit("alpha", "2", self.steps // 2)
        self.submit("beta", "1:2", self.steps)
        alpha_gen = self.wait_training("alpha", world=2)
        self.wait_training("beta", world=2)
        self.submit("gamma", "2", self.steps // 3)
        self.wait("gamma to wait", lambda: "0 free" in self.jobs()["gamma"]["reason"])
        print(self.ctl("jobs"), flush=True)

        self.wait_preloaded("alpha")
        worker = self.worker_of("alpha")
        fault_at = time.time()
        self.say(f"FAULT: kill -9 a worker of alpha (pid {worker.pid})")
        worker.kill()
        self.wait_training("alpha", world=2, after_generation=alpha_gen)
        beta = self.status("beta")
        self.say(f"beta meanwhile: generation {beta['generation']}, state {beta['state']}")

        self.wait("alpha to finish", lambda: self.jobs()["alpha"]["state"] == "succeeded", 300)
        self.say("alpha succeeded: its nodes go back to the pool")
        self.wait_training("gamma", world=2)
        gamma_admitted = self.admitted_ms("gamma") / 1000
        print(self.ctl("jobs"), flush=True)
        self.wait(
            "beta and gamma to finish",
            lambda: all(self.jobs()[j]["state"] == "succeeded" for j in ("beta", "gamma")),
            300,
        )
        print(self.ctl("jobs"), flush=True)
        return self.report(fault_at, gamma_admitted, beta["generation"])

    def pool_status(self, job: str) -> dict[str, Any]:
        raw = self.stores[job].client.hget(PoolKeys("nodeagent", "demo").jobs, job)
        return dict(json.loads(str(raw)))

    def admitted_ms(self, job: str) -> int:
        return int(self.pool_status(job)["admitted_ms"])

    def report(self, fault_at: float, gamma_admitted: float, beta_gen: int) -> int:
        events = self.stores["alpha"].events("-", count=10_000)
        row = recovery(
            "kill -9 a worker of alpha",
            fault_at,
            events,
            self.first_steps("alpha"),
            "worker_failed",
        )
        print("\nAlpha's recovery (seconds, until every rank of the new generation stepped):")
        print(
            f"  detect {_s(row.detection_s)}  stop {_s(row.stopping_s)}  rendezvous "
            f"{_s(row.rendezvous_s)}  start-up {_s(row.startup_s)}  total {_s(row.total_s)}"
        )
        alpha_ended = int(self.pool_status("alpha")["ended_ms"]) / 1000
        print(
            f"Gamma admitted {gamma_admitted - alpha_ended:.2f}s after alpha ended "
            f"(it waited {gamma_admitted - self.submitted('gamma'):.1f}s in the queue)"
        )
        ok = beta_gen == 1
        print(f"Beta through alpha's fault: generation {beta_gen} (undisturbed: {ok})")
        for job in ("alpha", "beta", "gamma"):
            finals = [
                json.loads(p.read_text()) for p in (self.workdir / job / "final").glob("*.json")
            ]
            same = len({f["sha256"] for f in finals}) == 1
            doc = self.status(job)
            print(
                f"{job}: {doc['state']}, step {finals[0]['step'] if finals else '?'} on "
                f"{len(finals)} ranks, identical models: {same}, restarts charged "
                f"{doc['restart_count']} of {doc['max_restarts']}"
            )
            ok = ok and same and doc["state"] == "succeeded"
        return 0 if ok else 1

    def submitted(self, job: str) -> float:
        return int(self.pool_status(job)["submitted_ms"]) / 1000

    def cleanup(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.agents.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_tree(name)
        for store in self.stores.values():
            store.client.close()
        self.redis.stop()


def _s(value: float | None, width: int = 5) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="beta's training steps")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="nodeagent-demo-"))
    demo = Demo(workdir, args.steps)
    try:
        return demo.run()
    finally:
        demo.cleanup()
        if args.keep:
            print(f"logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
