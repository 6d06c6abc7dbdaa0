"""Chaos harness: Redis and three agents in network namespaces, probe workers, and the checks.

`ChaosJob` runs a real job whose nodes each live in a namespace of their own, with redis-server
(or a Sentinel set) in the hub namespace. The test process reads Redis through unix sockets,
samples the leases in Redis time, and afterwards judges the probes' lives: no two generations
overlapping, every fenced worker dead before its node's lease deadline, and the grace it got.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import redis

from nodeagent.coord.keys import JobKeys
from tests.chaos.netns import Network
from tests.helpers.cluster import LeaseSampler, LocalCluster, wait_for
from tests.helpers.sentinel import sentinel_conf

PROBE = Path(__file__).with_name("probe.py")
RESOLUTION_S = 0.02  # how often a probe notes it is alive


@dataclass(frozen=True)
class Life:
    node: str
    generation: int
    pid: int
    start: float
    end: float  # last seen running: it died within RESOLUTION_S after
    term: float | None  # when SIGTERM reached it, if it did
    world: int = 0  # its generation's WORLD_SIZE

    @property
    def grace(self) -> float | None:
        return None if self.term is None else self.end - self.term


def read_lives(directory: Path) -> list[Life]:
    starts: dict[int, dict[str, Any]] = {}
    terms: dict[int, float] = {}
    path = directory / "lives.jsonl"
    for line in path.read_text().splitlines() if path.exists() else ():
        entry = json.loads(line)
        if entry["event"] == "start":
            starts[entry["pid"]] = entry
        elif entry["event"] == "term":
            terms.setdefault(entry["pid"], entry["time"])
    lives = []
    for pid, entry in starts.items():
        alive = directory / f"alive-{pid}"
        text = alive.read_text().strip() if alive.exists() else ""
        end = float(text) if text else entry["time"]
        lives.append(
            Life(
                entry["node"],
                entry["generation"],
                pid,
                entry["time"],
                end,
                terms.get(pid),
                entry.get("world", 0),
            )
        )
    return sorted(lives, key=lambda life: life.start)


def overlaps(lives: list[Life], held_out: Iterable[str] = ()) -> list[tuple[Life, Life, float]]:
    """Pairs (older, newer) where a worker of an older generation was seen running after one of
    a newer generation had started, with by how much. Not a worker of a node in `held_out`
    (its peers held it out before its lease lapsed: docs/design.md, "Fast detection") beside a
    generation it is no member of: such a worker may run on until its node reads the new
    generation or fences itself, and is in no process group with the new one."""
    held = set(held_out)
    members: dict[int, set[str]] = {}
    for life in lives:
        members.setdefault(life.generation, set()).add(life.node)
    found = []
    for old in lives:
        for new in lives:
            allowed = old.node in held and old.node not in members[new.generation]
            if old.generation < new.generation and old.end > new.start and not allowed:
                found.append((old, new, old.end - new.start))
    return found


class RedisInHub:
    """A redis-server in the hub namespace: TCP on the hub's address for the agents, a unix
    socket for the test. No persistence: a restart comes back empty."""

    def __init__(
        self, net: Network, directory: Path, port: int = 6379, extra: tuple[str, ...] = ()
    ):
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        self.binary, self.net, self.port, self.extra = binary, net, port, extra
        self.socket = directory / f"redis-{port}.sock"
        self.directory = directory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{self.net.hub_address}:{self.port}/0"

    @property
    def control_url(self) -> str:
        return f"unix://{self.socket}?db=0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                *self.net.prefix(self.net.hub),
                self.binary,
                "--bind",
                self.net.hub_address,
                "--port",
                str(self.port),
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--protected-mode",
                "no",
                *self.extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = self.client()
        wait_for(lambda: _pings(client), 10, f"redis-server on {self.socket}")

    def client(self) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=2)

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


class Sentinels:
    """Three redis-sentinel processes in the hub watching `primary` as service `chaos`."""

    def __init__(self, net: Network, directory: Path, primary: RedisInHub) -> None:
        self.net, self.directory, self.primary = net, directory, primary
        self.ports = (26379, 26380, 26381)
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"{self.net.hub_address}:{p}" for p in self.ports)
        return f"redis+sentinel://{hosts}/chaos/0"

    def start(self) -> None:
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server")
        assert binary is not None
        for port in self.ports:
            conf = self.directory / f"sentinel-{port}.conf"
            hub = self.net.hub_address
            conf.write_text(sentinel_conf(port, hub, self.primary.port, self.directory, "chaos"))
            with (self.directory / f"sentinel-{port}.log").open("wb") as log:  # what it decided
                self.procs.append(
                    subprocess.Popen(
                        [*self.net.prefix(self.net.hub), binary, str(conf), "--sentinel"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(10)


class ChaosJob:
    """Three agents (a, b, c) of one job, each in its own namespace, running probe workers."""

    def __init__(
        self,
        net: Network,
        directory: Path,
        redis_url: str,
        control_url: str,
        lease_s: float,
        hang_timeout_s: float = 0.0,
        max_restarts: int = 3,
        ride_through: str = "60s",
    ):
        self.net, self.directory, self.lease_s = net, directory, lease_s
        self.probes = directory / "probes"
        self.probes.mkdir(parents=True, exist_ok=True)
        names = ("a", "b", "c")
        addresses = {name: net.add_node(name) for name in names}
        self.heartbeat_s = 0.5 if lease_s <= 3 else 1.0  # the measurements: 3/0.5, 5/1
        self.cluster = LocalCluster(
            redis_url,
            directory,
            job="chaos",
            max_nodes=3,
            entrypoint=[sys.executable, str(PROBE)],
            max_restarts=max_restarts,
            job_options={
                "env": {"PROBE_DIR": str(self.probes), "PROBE_BEAT": "1" if hang_timeout_s else "0"}
            },
            timing={
                "heartbeat_interval": f"{self.heartbeat_s}s",
                "lease_ttl": f"{lease_s}s",
                "stop_grace_period": "3s",
                "failure_stop_grace_period": "1s",
                "hang_timeout": f"{hang_timeout_s}s",
                "ride_through": ride_through,
            },
            addresses=addresses,
            prefixes={name: net.prefix(net.nodes[name][0]) for name in names},
            control_url=control_url,
        )
        self.sampler = LeaseSampler(
            redis.Redis.from_url(control_url, socket_timeout=1),
            JobKeys("nodeagent", "chaos"),
            period_s=0.05,
        )

    @property
    def failure_grace_s(self) -> float:
        return 1.0

    def start(self) -> int:
        self.cluster.start("a", "b", "c")
        self.sampler.__enter__()
        return self.wait_world(3, after=0)

    def leader(self) -> str:
        leader = self.cluster.status()["leader"]
        assert leader, "no leader"
        return str(leader).split(" ", 1)[0]

    def follower(self) -> str:
        leader = self.leader()
        return next(n for n in ("a", "b", "c") if n != leader)

    def agent_pid(self, node: str) -> int:
        return self.cluster.agents[node].proc.pid

    def wait_world(self, world: int, after: int, timeout: float = 60) -> int:
        """Wait until a generation after `after` runs `world` probes that have recorded their
        start (the agents report workers running a little before that)."""
        doc = self.cluster.wait_running(world, timeout=timeout, after_generation=after)
        gen = int(doc["generation"])
        wait_for(
            lambda: len([life for life in self.lives() if life.generation == gen]) >= world,
            timeout,
            f"{world} probes of generation {gen} to start",
        )
        return gen

    def lives(self) -> list[Life]:
        return read_lives(self.probes)

    def wait_probe_dead(self, node: str, generation: int, timeout: float = 30) -> Life:
        def dead() -> Life | None:
            for life in self.lives():
                mine = life.node == node and life.generation == generation
                if mine and not _running(life.pid):
                    return read_life(self.probes, life.pid)
            return None

        return wait_for(dead, timeout, f"the probe of {node} (generation {generation}) to die")

    def check_no_overlap(self, held_out: Iterable[str] | None = None) -> None:
        """No two generations overlapped, but a held-out node's worker beside generations it
        is no member of (`overlaps`); `held_out` None: the nodes the job's events say were."""
        found = overlaps(self.lives(), self.held_out() if held_out is None else held_out)
        assert not found, (
            "generations overlapped: "
            + "; ".join(
                f"{o.node} gen {o.generation} ran {d:.3f}s after"
                f" {n.node} gen {n.generation} started"
                for o, n, d in found
            )
            + "\n"
            + self.cluster.diagnostics()
        )

    def held_out(self) -> set[str]:
        """The nodes the members held out before their leases lapsed (job/suspicion.py)."""
        return {
            e["node"]
            for e in self.cluster.events()
            if e["type"] == "node_lost" and "suspected lost" in e["message"]
        }

    def note(self, scenario: str, life: Life) -> None:
        """Append a fenced worker's figures to $CHAOS_RESULTS (JSON lines), when it is set."""
        path = os.environ.get("CHAOS_RESULTS")
        if not path:
            return
        entry = {
            "scenario": scenario,
            "lease_s": self.lease_s,
            "node": life.node,
            "margin_s": round(self.margin(life), 4),
            "grace_s": None if life.grace is None else round(life.grace, 4),
        }
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(entry) + "\n")

    def margin(self, life: Life, ride_s: float = 0.0) -> float:
        """The node's lease deadline (as last seen before the worker died), plus the ride a
        leader awaits it past it (`ride_s`: job/ridethrough.py), minus its death."""
        deadline = self.sampler.deadline_at(life.node, life.end)
        assert deadline is not None, f"no lease of {life.node} seen before {life.end}"
        return deadline + ride_s - (life.end + RESOLUTION_S)

    def undisturbed(self, generation: int, redis_up: bool = True) -> None:
        """Every probe of `generation` runs still, and none of a later one ever started: the
        job went on, nothing restarted (a ride through a Redis outage); with Redis up, its
        record says that generation runs."""
        lives = self.lives()
        later = [life for life in lives if life.generation > generation]
        assert not later, f"generation {generation} was replaced: {later}"
        probes = [life for life in lives if life.generation == generation]
        assert len(probes) == 3 and all(_running(life.pid) for life in probes), probes
        assert all(life.term is None for life in probes), "a probe was sent SIGTERM"
        if not redis_up:
            return
        status = self.cluster.status()
        assert (status["state"], status["generation"]) == ("running", generation), status

    def close(self) -> None:
        self.sampler.__exit__()
        for name, agent in self.cluster.agents.items():
            if agent.alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(agent.proc.pid, signal.SIGCONT)
                self.cluster.kill_tree(name)
        for life in self.lives():
            with contextlib.suppress(ProcessLookupError):
                os.kill(life.pid, signal.SIGKILL)
        self.cluster.store.client.close()


def read_life(directory: Path, pid: int) -> Life:
    (life,) = [life for life in read_lives(directory) if life.pid == pid]
    return life


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@contextlib.contextmanager
def network() -> Iterator[Network]:
    net = Network()
    try:
        yield net
    finally:
        net.close()
