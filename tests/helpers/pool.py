"""A pool of agents on this machine: job-less configs, jobs submitted with nodeagentctl."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodeagent.coord.keys import PoolKeys
from tests.helpers.cluster import (
    NETNS_ISOLATION,
    WORKER,
    AgentProcess,
    RedisServer,
    nodeagentctl,
    start_agent,
    wait_for,
)
from tests.helpers.runas import AS_TESTER

# A lease that survives a loaded CI machine. An agent fences its workers when it has not renewed
# for half a lease, so with 1 s a 300 ms stall of an agent (a load average of 5 on two cores)
# re-formed a job that nothing had happened to (test_pool's shared-queue test, three times).
# 3 s tolerates a 1.25 s stall; it costs 2 s only where a test waits for a killed node's lease.
TIMING = {
    "heartbeat_interval": "250ms",
    "lease_ttl": "3s",
    "stop_grace_period": "3s",
    "join_settle": "300ms",
    "rendezvous_timeout": "2m",
}


@dataclass
class PoolCluster:
    redis_url: str
    directory: Path
    pool: str = "default"
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    timing: dict[str, str] = field(default_factory=lambda: dict(TIMING))
    scheduling: dict[str, Any] = field(default_factory=dict)  # more of the pool: section
    node_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # node -> more sections
    prefixes: dict[str, list[str]] = field(default_factory=dict)  # node -> a command prefix
    caps: dict[str, list[str]] = field(default_factory=dict)  # node -> a drop-in's capabilities

    @property
    def records_dir(self) -> Path:
        path = self.directory / "records"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def job_records(self, job: str) -> Path:
        path = self.records_dir / job
        path.mkdir(parents=True, exist_ok=True)
        return path

    def starts(self, job: str) -> int:
        """How many workers of `job` wrote their "start" record (tests/helpers/worker.py)."""
        path = self.job_records(job) / "records.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return sum(1 for line in lines if '"start"' in line)

    def wait_started(self, job: str, count: int, timeout: float = 60.0) -> int:
        """Waits until `job`'s workers wrote `count` start records. A job's row says running at
        its world once its generation is placed, before its workers are up: a count taken then
        and compared later sees the first starts as a restart (CI, the sentinel chaos test)."""
        wait_for(lambda: self.starts(job) >= count, timeout, f"{count} workers of {job} started")
        return self.starts(job)

    def config(
        self, name: str, job: dict[str, Any] | None = None, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        config: dict[str, Any] = {
            "node": {"name": name, "address": "127.0.0.1"},
            "redis": {"url": self.redis_url},
            "pool": {
                "name": self.pool,
                "users": [str(AS_TESTER["user"])],
                "allow_root": True,
                "labels": labels or {},
                "auth": "none",  # the pool tests of before; tests/integration/test_pool_auth.py
                **self.scheduling,
            },
            "timing": self.timing,
            "metrics": {"listen": "127.0.0.1:0"},
            "log_dir": str(self.directory / "logs"),
            "state_dir": str(self.directory / "state"),
        }
        if job is not None:
            config["job"] = job
        config.update(self.node_options.get(name, {}))
        if self.prefixes.get(name):
            config.setdefault("isolation", NETNS_ISOLATION)
        return config

    def start(
        self,
        *names: str,
        job: dict[str, Any] | None = None,
        labels: dict[str, str] | None = None,
    ) -> None:
        for name in names:
            path = self.directory / f"{name}.yaml"
            path.write_text(yaml.safe_dump(self.config(name, job, labels)))
            prefix, caps = self.prefixes.get(name), self.caps.get(name, [])
            self.agents[name] = start_agent(name, path, self.directory, prefix, caps=caps)

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return nodeagentctl("--redis", self.redis_url, "--pool", self.pool, *args)

    def wait_nodes(self, count: int, timeout: float = 30.0) -> None:
        """Until `count` nodes hold a live pool lease."""
        wait_for(lambda: len(self.placements()) == count, timeout, f"{count} nodes in the pool")

    def submit(self, name: str, nodes: str, *more: str) -> None:
        result = self.ctl(
            "submit",
            "--parsable",
            "--name",
            name,
            "--nodes",
            nodes,
            "--env",
            f"RECORD_DIR={self.job_records(name)}",
            *more,
            "--",
            sys.executable,
            str(WORKER),
        )
        assert result.returncode == 0 and result.stdout.strip() == name, result.stderr

    def show(self, job: str) -> dict[str, Any]:
        """`nodeagentctl show JOB --json`."""
        said = self.ctl("show", job, "--json")
        assert said.returncode == 0, said.stderr
        found: dict[str, Any] = json.loads(said.stdout)
        return found

    def jobs(self) -> dict[str, dict[str, Any]]:
        result = self.ctl("jobs", "--json")
        assert result.returncode == 0, result.stderr
        return {row["job"]: row for row in json.loads(result.stdout)["jobs"]}

    def placements(self) -> dict[str, str | None]:
        result = self.ctl("nodes", "--json")
        assert result.returncode == 0, result.stderr
        return {
            row["name"]: row["job"] for row in json.loads(result.stdout)["nodes"] if row["alive"]
        }

    def wait_job(
        self,
        job: str,
        state: str,
        world: int | None = None,
        timeout: float = 30,
        after: int | None = None,
    ) -> dict[str, Any]:
        """Until `job` is in `state` (with `world` ranks; in a generation after `after`: it
        restarted, was requeued); its row."""

        def probe() -> dict[str, Any] | None:
            row = self.jobs().get(job)
            if row is None or row["state"] != state:
                return None
            if after is not None and (row["generation"] or 0) <= after:
                return None
            return row if world is None or row["world_size"] == world else None

        try:
            return wait_for(probe, timeout, f"job {job} {state} (world {world})")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def diagnostics(self) -> str:
        logs = "\n".join(f"--- {a.name}\n{a.log()[-3000:]}" for a in self.agents.values())
        return f"jobs: {self.ctl('jobs').stdout}\nnodes: {self.ctl('nodes').stdout}\n{logs}"

    def kill_tree(self, name: str) -> None:
        agent = self.agents[name]
        with suppress(ProcessLookupError):
            os.killpg(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait(10)

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.alive():
                agent.proc.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            try:
                agent.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(agent.proc.pid, signal.SIGKILL)
                agent.proc.wait(10)


def pool_keys(redis_server: RedisServer, pool: str) -> dict[str, Any]:
    """What a request could change: every key of the pool but its nodes' heartbeats."""
    keys = PoolKeys("nodeagent", pool)
    client = redis_server.client()
    try:
        return {
            "specs": client.hgetall(keys.specs),
            "jobs": client.hgetall(keys.jobs),
            "placements": client.hgetall(keys.placements),
            "cancels": client.hgetall(keys.cancels),
            "cordons": client.hgetall(keys.cordons),
            "queues": client.hgetall(keys.queues),
            "history": client.hgetall(keys.history),
            "ended": client.zrange(keys.ended, 0, -1, withscores=True),
            "seq": client.get(keys.seq),
        }
    finally:
        client.close()


@contextmanager
def pool_cluster(redis_url: str, directory: Path, **options: Any) -> Iterator[PoolCluster]:
    cluster = PoolCluster(redis_url, directory, **options)
    try:
        yield cluster
    finally:
        cluster.stop()


@contextmanager
def munge_pool(
    redis_url: str, directory: Path, pool: str, munge_socket: str, users: Sequence[str]
) -> Iterator[PoolCluster]:
    """A pool under pool.auth: munge whose `users` may submit (the tests' Unix users)."""
    auth = {"auth": "munge", "munge_socket": munge_socket, "users": list(users)}
    with pool_cluster(redis_url, directory, pool=pool, scheduling=auth) as cluster:
        yield cluster
