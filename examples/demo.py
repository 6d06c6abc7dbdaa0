"""nodeagent demo: a local Redis, three agents, real DDP training, faults injected and recovered.

    bash examples/demo.sh          # sets everything up, then runs this

What happens (about two minutes on two cores):
1. agents a, b, c start; the job's target is 2 nodes, so the last to join is a standby;
2. a worker is killed with SIGKILL          -> the job re-forms at world 2 (restart 1 of 3);
3. the node holding rank 0 is SIGKILLed     -> its lease expires, the standby is promoted;
4. node d joins and `nodeagentctl scale 3`  -> the job grows to world 3 and finishes.
Then it prints a timeline of each recovery, split into phases, and cleans up every process.
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
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.preload import SPARE_MODULE
from nodeagent.status import status_document
from nodeagent.timeline import Recovery, recovery

ROOT = Path(__file__).resolve().parents[1]
JOB = "demo"


class Demo:
    def __init__(self, workdir: Path, steps: int) -> None:
        self.workdir = workdir
        self.steps = steps
        self.redis = EmbeddedRedis(f"{JOB}-{os.getpid()}")
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.faults: list[tuple[str, float, str]] = []  # label, time, the event it causes
        self.started = time.time()
        self.store: JobStore | None = None

    # -- plumbing ----------------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.started:6.1f}s] {text}", flush=True)

    def config(self, name: str) -> Path:
        path = self.workdir / f"{name}.yaml"
        path.write_text(
            yaml.safe_dump(
                {
                    "node": {"name": name, "address": "127.0.0.1"},
                    "redis": {"url": self.redis.url},
                    "job": {
                        "id": JOB,
                        "entrypoint": [
                            sys.executable,
                            str(ROOT / "examples" / "train_ddp.py"),
                            "--steps",
                            str(self.steps),
                            "--checkpoint-every",
                            "10",
                            "--step-time",
                            "0.05",
                            "--checkpoint-dir",
                            str(self.workdir / "checkpoints"),
                            "--final-dir",
                            str(self.workdir / "final"),
                        ],
                        "nproc_per_node": 1,
                        "min_nodes": 1,
                        "max_nodes": 3,
                        "target_nodes": 2,
                        "max_restarts": 3,
                        "env": {"OMP_NUM_THREADS": "1"},
                        # Restarts run in interpreters that imported these already.
                        "preload": ["torch", "torch._dynamo"],
                        # The workers are yours, as under torchrun; if you are root, say so:
                        # a root agent otherwise runs them as the nodeagent system user.
                        "user": pwd.getpwuid(os.geteuid()).pw_name,
                        "allow_root": True,
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
            )
        )
        return path

    def start_agent(self, name: str) -> None:
        with open(self.workdir / f"agent-{name}.log", "ab") as log:
            self.agents[name] = subprocess.Popen(
                [sys.executable, "-m", "nodeagent", "run", "--config", str(self.config(name))],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.say(f"agent {name} started (pid {self.agents[name].pid})")

    def ctl(self, *args: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "nodeagent.cli.ctl",
                "--redis",
                self.redis.url,
                "--job",
                JOB,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return result.stdout + result.stderr

    def status(self) -> dict[str, Any]:
        assert self.store is not None
        return status_document(self.store.snapshot(), JOB)

    def steps_by_generation(self) -> dict[int, list[dict[str, Any]]]:
        lines: dict[int, list[dict[str, Any]]] = {}
        for log in (self.workdir / "logs" / JOB).glob("*/rank-*.log"):
            for text in log.read_text(errors="replace").splitlines():
                if text.startswith("{"):
                    lines.setdefault(int(log.parent.name), []).append(json.loads(text))
        return lines

    def first_steps(self) -> dict[int, float]:
        """Per generation: when every rank had done its first step."""
        firsts: dict[int, float] = {}
        for gen, lines in self.steps_by_generation().items():
            per_rank: dict[int, float] = {}
            for line in sorted(lines, key=lambda x: x["t"]):
                if line.get("event") == "step":
                    per_rank.setdefault(line["rank"], line["t"])
            worlds = {line["world"] for line in lines}
            if per_rank and len(per_rank) == max(worlds):
                firsts[gen] = max(per_rank.values())
        return firsts

    def latest_step(self) -> int:
        steps = [
            line["step"]
            for lines in self.steps_by_generation().values()
            for line in lines
            if line.get("event") == "step"
        ]
        return max(steps, default=0)

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            time.sleep(0.1)
        raise SystemExit(f"demo: timed out waiting for {what}; logs are in {self.workdir}")

    def wait_training(self, world: int, after_generation: int, min_steps: int = 3) -> int:
        def ok() -> bool:
            doc = self.status()
            gen = doc["generation"]
            if doc["state"] != "running" or doc["world_size"] != world or gen <= after_generation:
                return False
            lines = self.steps_by_generation().get(gen, [])
            return len({line["step"] for line in lines if line.get("event") == "step"}) >= min_steps

        self.wait(f"training at world {world}", ok)
        doc = self.status()
        self.say(
            f"training: generation {doc['generation']}, world {world}, step {self.latest_step()}"
        )
        return int(doc["generation"])

    def inject(self, label: str, cause: str, action: Callable[[], None]) -> None:
        self.say(f"FAULT: {label}")
        self.faults.append((label, time.time(), cause))
        action()

    def children(self, name: str, preloaded: bool) -> list[psutil.Process]:
        """The agent's workers, or its spare interpreters (job.preload). A worker that runs in
        a spare keeps the spare's command line, so workers are told apart by the agent's pids."""
        workers = {
            w["pid"] for n in self.status()["nodes"] if n["name"] == name for w in n["workers"]
        }
        found = []
        for child in psutil.Process(self.agents[name].pid).children():
            with contextlib.suppress(psutil.Error):  # one may exit meanwhile
                spare = child.pid not in workers and SPARE_MODULE in child.cmdline()
                if (spare if preloaded else child.pid in workers) and child.is_running():
                    found.append(child)
        return found

    def wait_preloaded(self) -> None:
        """Until every member has its spare interpreter (started a few seconds after workers)."""

        def ready() -> bool:
            members = self.status()["members"]
            spares = [c for name in members for c in self.children(name, preloaded=True)]
            try:
                return len(spares) == len(members) and all(c.cpu_percent(0.2) < 5 for c in spares)
            except psutil.Error:
                return False

        self.wait("the preloaded interpreters", ready)

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
        self.store = JobStore(connect(self.redis.url, 5.0), JobKeys("nodeagent", JOB))
        for name in ("a", "b", "c"):
            self.start_agent(name)
        gen = self.wait_training(world=2, after_generation=0, min_steps=10)
        print(self.ctl("status"), flush=True)
        self.wait_preloaded()

        last = self.status()["members"][-1]
        worker = self.children(last, preloaded=False)[0]
        self.inject(
            f"kill -9 the worker on node {last} (pid {worker.pid})", "worker_failed", worker.kill
        )
        gen = self.wait_training(world=2, after_generation=gen)
        self.wait_preloaded()

        rank0 = self.status()["members"][0]
        self.inject(
            f"kill -9 node {rank0} (agent and workers; it holds rank 0)",
            "node_lost",
            lambda: self.kill_tree(rank0),
        )
        gen = self.wait_training(world=2, after_generation=gen)
        print(self.ctl("status"), flush=True)

        self.start_agent("d")
        self.wait(
            "d to join as standby",
            lambda: any(
                n["name"] == "d" and n["state"] == "standby" for n in self.status()["nodes"]
            ),
        )
        self.inject(
            "nodeagentctl scale 3",
            "scale_requested",
            lambda: self.say(self.ctl("scale", "3").strip()),
        )
        self.wait_training(world=3, after_generation=gen)

        self.wait("the job to finish", lambda: self.status()["state"] == "succeeded", timeout=300)
        self.say("job succeeded")
        print(self.ctl("status"), flush=True)
        return self.report()

    def report(self) -> int:
        assert self.store is not None
        events = self.store.events("-", count=10_000)
        print("\nEvents:")
        for event in events:
            if event.type in ("node_ready", "workers_started", "worker_exited"):
                continue
            at = (event.at_ms or 0) / 1000 - self.started
            print(
                f"  {at:7.2f}s  gen {event.generation if event.generation is not None else '-':>2}"
                f"  {event.type:<21} {event.node or '':<3} {event.message}"
            )
        firsts = self.first_steps()
        rows = [recovery(label, t0, events, firsts, cause) for label, t0, cause in self.faults]
        print("\nRecoveries (seconds, until every rank of the new generation made its first step):")
        print(
            f"  {'fault':<52} {'detect':>7} {'stop':>6} {'rendez':>7} {'start-up':>9} "
            f"{'total':>6} {'world':>5} {'lost':>5}"
        )
        for row in rows:
            print(
                f"  {row.fault:<52} {_s(row.detection_s)} {_s(row.stopping_s, 6)} "
                f"{_s(row.rendezvous_s)} {_s(row.startup_s, 9)} {_s(row.total_s, 6)} "
                f"{row.world_size or '-':>5} {self.steps_lost(row):>5}"
            )
        finals = [json.loads(p.read_text()) for p in (self.workdir / "final").glob("rank-*.json")]
        same = len({f["sha256"] for f in finals}) == 1
        doc = self.status()
        print(
            f"\nFinal: step {finals[0]['step'] if finals else '?'} on {len(finals)} ranks, "
            f"identical models: {same}; restarts charged {doc['restart_count']} of "
            f"{doc['max_restarts']} (only the worker crash counts)"
        )
        return 0 if same and doc["state"] == "succeeded" else 1

    def steps_lost(self, row: Recovery) -> str:
        if row.generation is None:
            return "-"
        by_gen = self.steps_by_generation()
        resumed = [
            line["step"]
            for line in by_gen.get(row.generation, [])
            if line.get("event") == "resumed"
        ]
        before = [
            line["step"]
            for gen, lines in by_gen.items()
            if gen < row.generation
            for line in lines
            if line.get("event") == "step"
        ]
        return str(max(before) - resumed[0]) if resumed and before else "-"

    def cleanup(self) -> None:
        for proc in self.agents.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in self.agents.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_tree(name)
        self.redis.stop()


def _s(value: float | None, width: int = 7) -> str:
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="training steps (default 600)")
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
