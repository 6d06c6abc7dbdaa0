"""Test harness: a real redis-server on a free port and real agent processes on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil
import redis
import yaml

from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys
from nodeagent.coord.store import JobStore
from nodeagent.runtime.servechild import MODULE as SERVING_MODULE
from nodeagent.supervisor.fence import KEEPER_MODULE
from nodeagent.views.status import status_document
from tests.helpers.runas import AS_TESTER
from tests.helpers.unitcaps import unit_prefix
from tests.helpers.unitcgroup import enter, unit_cgroups

WORKER = Path(__file__).with_name("worker.py")
# An agent in a network namespace of the chaos suite (`ip netns exec`: a /sys of its own, with
# no cgroup hierarchy) keeps no job cgroups and shares the node's /dev/shm: the suite tests
# the network's faults, tests/integration/test_isolation.py the isolation.
NETNS_ISOLATION = {"cgroups": "off", "shm": "shared"}
T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server on a free loopback port, no persistence; `extra`: more of its
    command line (--replicaof 127.0.0.1 PORT: a replica)."""

    def __init__(self, directory: Path, extra: tuple[str, ...] = ()) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.directory = directory
        self.extra = extra
        self.binary = binary
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        for _ in range(5):
            self.port = self.port or free_port()
            self.proc = subprocess.Popen(
                [
                    self.binary,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.directory),
                    *self.extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._ready():
                return
            self.stop()
            self.port = 0
        raise RuntimeError("redis-server did not start")

    def _ready(self) -> bool:
        with redis.Redis(port=self.port, socket_timeout=0.5) as client:
            for _ in range(100):
                if self.proc is not None and self.proc.poll() is not None:
                    return False
                with contextlib.suppress(redis.RedisError):
                    if client.ping():
                        return True
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, decode_responses=True)


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll until `predicate` returns something truthy; fail with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


@dataclass
class AgentProcess:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_agent(
    name: str,
    config: Path,
    directory: Path,
    prefix: list[str] | None = None,
    env: dict[str, str] | None = None,
    caps: Sequence[str] = (),
) -> AgentProcess:
    """`nodeagent run --config CONFIG` in a session of its own (a command `prefix` such as
    `ip netns exec NS` first), its output appended to DIRECTORY/agent-NAME.log.

    Run as root, the agent has what its shipped unit gives it, not more: the unit's capability
    bounding set (no CAP_DAC_OVERRIDE) and the `caps` a drop-in adds, no new privileges, its
    umask (tests/helpers/unitcaps.py), in a cgroup of its own as the unit's systemd delegates
    (tests/helpers/unitcgroup.py). What only works as full root would not work on a node."""
    log_path = directory / f"agent-{name}.log"
    entered, unit = [], []
    if os.geteuid() == 0:  # its cgroup entered first: `ip netns exec` hides the hierarchies
        entered, unit = enter(unit_cgroups(name, directory)), unit_prefix(extra=caps)
    argv = [sys.executable, "-m", "nodeagent", "run", "--config", str(config)]
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [*entered, *(prefix or []), *unit, *argv],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    return AgentProcess(name, proc, log_path)


@dataclass
class LocalCluster:
    """Several agents of one job on this machine, each with its own config file."""

    redis_url: str
    directory: Path
    job: str
    nproc: int = 1
    min_nodes: int = 1
    max_nodes: int = 3
    target_nodes: int | None = None
    max_restarts: int = 3
    timing: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=lambda: [sys.executable, str(WORKER)])
    job_options: dict[str, Any] = field(default_factory=dict)  # more of the job section
    agents: dict[str, AgentProcess] = field(default_factory=dict)
    # Nodes in network namespaces (tests/chaos): each node's address and command prefix, and
    # the URL the test itself reaches Redis by (a unix socket) when it differs from the agents'.
    addresses: dict[str, str] = field(default_factory=dict)
    prefixes: dict[str, list[str]] = field(default_factory=dict)
    control_url: str | None = None
    pool: dict[str, Any] = field(default_factory=dict)  # a pool: section (munge_socket, say)
    node_options: dict[str, Any] = field(default_factory=dict)  # more sections (containers:)

    def __post_init__(self) -> None:
        self.records_dir = self.directory / "records"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.connect_control(self.control_url or self.redis_url)

    def connect_control(self, url: str) -> None:
        """Read the job through `url` from now on (after a failover, say)."""
        old = getattr(self, "store", None)
        self.store = JobStore(connect(url, 5.0), JobKeys("nodeagent", self.job))
        if old is not None:
            old.client.close()

    def config(self, name: str) -> dict[str, Any]:
        timing = {
            "heartbeat_interval": "200ms",
            "lease_ttl": "1s",
            "stop_grace_period": "3s",
            "join_settle": "300ms",
            "rendezvous_timeout": "2m",
            **self.timing,
        }
        return {
            "node": {"name": name, "address": self.addresses.get(name, "127.0.0.1")},
            "redis": {"url": self.redis_url},
            "job": {
                "id": self.job,
                "entrypoint": self.entrypoint,
                "nproc_per_node": self.nproc,
                "min_nodes": self.min_nodes,
                "max_nodes": self.max_nodes,
                "target_nodes": self.target_nodes or self.max_nodes,
                "max_restarts": self.max_restarts,
                "env": {"RECORD_DIR": str(self.records_dir), "PYTHONUNBUFFERED": "1"},
                **AS_TESTER,
                **self.job_options,
            },
            "timing": timing,
            **({"pool": self.pool} if self.pool else {}),
            **self.node_options,
            "metrics": {"listen": "127.0.0.1:0"},  # several agents on one machine
            "log_dir": str(self.directory / "logs"),
            "state_dir": str(self.directory / "state"),
        }

    def config_path(self, name: str) -> Path:
        path = self.directory / f"{name}.yaml"
        config = self.config(name)
        if self.prefixes.get(name):
            config.setdefault("isolation", NETNS_ISOLATION)
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self, *names: str, env: dict[str, str] | None = None) -> None:
        for name in names:
            self.agents[name] = start_agent(
                name, self.config_path(name), self.directory, self.prefixes.get(name, []), env
            )

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return nodeagentctl("--redis", self.redis_url, "--job", self.job, *args)

    def status(self) -> dict[str, Any]:
        return status_document(self.store.snapshot(), self.job)

    def wait_status(
        self, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            doc = self.status()
            return doc if check(doc) else None

        try:
            return wait_for(probe, timeout, what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnostics()}") from None

    def wait_running(
        self, world: int, timeout: float = 30.0, after_generation: int = 0
    ) -> dict[str, Any]:
        """Wait until the job runs at `world` and every member's workers have started."""

        def ok(doc: dict[str, Any]) -> bool:
            if doc["state"] != "running" or doc["world_size"] != world:
                return False
            if doc["generation"] <= after_generation:
                return False
            if self.entrypoint[-1] != str(WORKER):  # not the test worker: trust the agents
                members = set(doc["members"])  # not a lost node's, whose lease may still hold
                nodes = [n for n in doc["nodes"] if n["name"] in members]
                running = [w for n in nodes for w in n["workers"] if w["state"] == "running"]
                return len(running) == world
            return len(self.starts(doc["generation"])) == world

        return self.wait_status(ok, timeout, f"world {world} running after gen {after_generation}")

    def records(self) -> list[dict[str, Any]]:
        path = self.records_dir / "records.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def starts(self, generation: int) -> list[dict[str, Any]]:
        return [
            r for r in self.records() if r["event"] == "start" and r["generation"] == generation
        ]

    def exit_generation(self, generation: int, code: int) -> None:
        (self.records_dir / f"exit-{generation}").write_text(str(code))

    def worker_pids(self, name: str) -> list[int]:
        """The agent's children but its fence keeper and its requests' serving."""
        agent = psutil.Process(self.agents[name].proc.pid)
        return [p.pid for p in agent.children() if not is_keeper(p) and not is_serving(p)]

    def keeper_pid(self, name: str) -> int | None:
        """The agent's fence keeper, None while it has none (e.g. it just died)."""
        agent = psutil.Process(self.agents[name].proc.pid)
        keepers = [p.pid for p in agent.children() if is_keeper(p)]
        return keepers[0] if keepers else None

    def kill_tree(self, name: str, sig: signal.Signals = signal.SIGKILL) -> None:
        """Send `sig` to an agent and every process under it, like a node losing power."""
        agent = psutil.Process(self.agents[name].proc.pid)
        procs = [agent, *agent.children(recursive=True)]
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        if sig is signal.SIGKILL:
            self.agents[name].proc.wait(10)

    def events(self) -> list[dict[str, Any]]:
        return [
            {
                "type": e.type,
                "generation": e.generation,
                "node": e.node,
                "at_ms": e.at_ms,
                "message": e.message,
                "data": dict(e.data),
            }
            for e in self.store.events("-", count=10_000)
        ]

    def diagnostics(self) -> str:
        """The job's status, its agents' logs and its last events: the events last, where a
        report that keeps only the tail of a failure (CI's) still shows them."""
        lines = ["--- status", json.dumps(self.status(), indent=1)[:3000]]
        for agent in self.agents.values():
            lines += [f"--- agent {agent.name} (alive={agent.alive()})", agent.log()[-3000:]]
        lines.append("--- events")
        lines += [
            f"{e['type']} gen={e['generation']} node={e['node']} {e['message']}"
            for e in self.events()[-40:]
        ]
        return "\n".join(lines)

    def stop(self) -> None:
        for agent in self.agents.values():
            if agent.alive():
                agent.proc.send_signal(signal.SIGTERM)
        for agent in self.agents.values():
            try:
                agent.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill_tree(agent.name)
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if str(
                    WORKER
                ) in proc.cmdline() and self.records_dir.as_posix() in proc.environ().get(
                    "RECORD_DIR", ""
                ):
                    proc.kill()
        self.store.client.close()  # or its socket is left for the garbage collector to warn of


@contextlib.contextmanager
def local_cluster(redis_url: str, directory: Path, **options: Any) -> Iterator[LocalCluster]:
    cluster = LocalCluster(redis_url, directory, **options)
    try:
        yield cluster
    finally:
        cluster.stop()


def nodeagentctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run nodeagentctl as a user would, with no password from this process' environment."""
    environ = {k: v for k, v in os.environ.items() if k != "NODEAGENT_REDIS_PASSWORD"}
    return subprocess.run(
        [sys.executable, "-m", "nodeagent.cli.ctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**environ, **(env or {})},
    )


def is_keeper(proc: psutil.Process) -> bool:
    try:
        return KEEPER_MODULE in proc.cmdline()
    except psutil.Error:
        return False


def is_serving(proc: psutil.Process) -> bool:
    """The pool leader's requests' serving (runtime/servechild.py), not a worker."""
    try:
        return SERVING_MODULE in proc.cmdline()
    except psutil.Error:
        return False


def env_without_pythonpath() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


class LeaseSampler:
    """Reads a job's lease deadlines (Redis server time) every `period_s` on a thread.

    `deadline_at(node, t)` is the deadline of the node's lease as last seen at or before time
    `t` (this machine's clock, the one Redis uses too): a worker of that node must be dead
    before it, or it ran while the server could already hand its place to someone else.
    """

    def __init__(self, client: redis.Redis, keys: JobKeys, period_s: float = 0.05) -> None:
        self._client = client
        self._keys = keys
        self._period = period_s
        self._stop = threading.Event()
        self.history: list[tuple[float, str, float]] = []  # (seen at, node, deadline), seconds
        self._thread = threading.Thread(target=self._run, name="lease-sampler", daemon=True)

    def __enter__(self) -> LeaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._client.close()

    def _run(self) -> None:
        last: dict[str, float] = {}
        while not self._stop.wait(self._period):
            with contextlib.suppress(redis.RedisError):
                leases: Any = self._client.zrange(self._keys.leases, 0, -1, withscores=True)
                seen = time.time()
                for name, raw_score in leases:
                    node = name.decode() if isinstance(name, bytes) else str(name)
                    score = float(raw_score)
                    if last.get(node) != score:
                        last[node] = score
                        self.history.append((seen, node, score / 1000))

    def deadline_at(self, node: str, t: float) -> float | None:
        """The latest deadline of `node` seen at or before `t`, None if none was."""
        seen = [deadline for at, name, deadline in self.history if name == node and at <= t]
        return max(seen) if seen else None


def check_records(cluster: LocalCluster) -> None:
    records = cluster.records()
    assert not [r for r in records if r["event"] == "overlap"], "two generations overlapped"
    assert not [r for r in records if r["event"] == "bad_env"], "a worker saw a bad environment"
    stops = {}
    for r in records:
        if r["event"] in ("stop", "exit"):
            stops[(r["generation"], r["pid"])] = r["time"]
    for start in (r for r in records if r["event"] == "start"):
        older = [t for (gen, _), t in stops.items() if gen < start["generation"]]
        assert all(t <= start["time"] for t in older), (
            "a newer worker started before an older stopped"
        )
