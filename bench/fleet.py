"""Coordination at fleet scale: M simulated agents against one real redis-server (or a cluster).

The real coordination code, no workers. Job mode (the default): one job of M nodes. Its leader
runs in this process as an agent does: `JobStore.sync` every heartbeat, `Leadership.lead`
(leader.plan and the fenced COMMIT script), a wake-up at the earliest lease deadline, and a
re-read every 50 ms while a generation waits for its nodes (a real one is woken by node_ready).
The M-1 followers are spread over `--procs` worker processes, each owning a slice of the names
and heartbeating it spread evenly over the second: 20 batches a second, each batch one pipeline
(`Packed`), so Redis sees the steady load of a real fleet, not a burst. Each node's SYNC call
(`JobStore.sync_call`) is packed into RESP bytes once per generation it acknowledges and record
revision it holds, and its reply read and dropped: redis-py packs every command anew, most of
the ~100 µs a heartbeat cost the simulator before. One process polls the job hash's `rev`
every 100 ms (the record when it moved) and shares the generation and revision; each process
acknowledges a new generation at once, for all its nodes in one more round (they have no
workers to stop), and its heartbeats hold that revision, so their replies do not carry the
record, as a real follower's do not. After a warm-up, `--kill`
followers stop heartbeating.

Pool mode (`--pool-jobs J`): the M nodes are also members of one pool. J jobs are submitted
pinned (`PoolStore.submit`), node i serves job i mod J, so every job has its own leader (all J
in this process) and its own followers; every node also sends a pool heartbeat each second
(`PoolStore.sync_call`, packed once, in the same batches; a real member renews every lease/2
unless it leads the pool, so this is the heavier case), and node 0 holds the pool leader lease
and runs the real
pool leader round (`nodeagent.pool.leadership.lead`: read_view, schedule, commit) every heartbeat.
The nodes killed all serve job 0, whose events give the detection phases.

`--cluster`: the same against a real three-node Redis Cluster (tests/helpers/rediscluster.py);
each job's keys and the pool's have their own hash tag, so they spread over the servers. The
leaders use the cluster client (`connect` of the redis+cluster:// URL), as agents do; redis-py's
cluster pipelines refuse scripts, so each follower process sends a job's (or the pool's)
pipelined heartbeats to the server serving its slot with a plain client. The run reports how the
keys, the job records and the commands spread (`cluster_spread`); Redis figures are summed over
the three servers.

Measured per M over the steady window (whole seconds between formation and the kill):
- simulator_kept_up: every follower node beat at least 0.95 times a second in the window
  (counted per node, not assumed), no batch ran more than 0.5 s behind its schedule in the
  window (a process that fell behind and is catching up beats more than once a second, late),
  and every leader beat at most 1.5 s apart; per process its nodes, beats a second, how late
  its batches ran (in the window, and the most over the run), and its CPU;
- detection, in Redis server time from the job's events: a dead node's lease deadline ->
  node_lost, -> the next generation announced, -> started (every survivor acknowledged);
- the leaders' Redis time, client side: the SYNC call per heartbeat over the window (median,
  p99, max; it includes decoding the reply, and its max over the whole run), and the COMMIT
  call over every commit of the run (leaders commit only when the record changes: formation
  and re-formation); in pool mode the pool leader's heartbeat over the window and its round
  (read_view + schedule + commit, client side) over the run;
- server side: the longest single command or script in SLOWLOG over the window (threshold
  0.3 ms, reset at the window's start; its duration, the script's name for an EVALSHA, its first
  keys, and how many took over 0.3 ms), the leaders' SYNC calls among them (their server time:
  `leader_sync_server_ms`, with how many were logged), LATENCY LATEST (threshold 1 ms), and the
  average script time (INFO commandstats usec/calls of evalsha and eval over the window);
- Redis CPU %, commands per node per second (INFO commandstats, counting those inside Lua),
  network bytes per node per second (in and out), memory per node (used_memory delta / M).
A run whose simulator did not keep up says so and still reports what it measured.

    .venv/bin/python bench/fleet.py --nodes 100,1000,5000,10000
    .venv/bin/python bench/fleet.py --nodes 1000 --pool-jobs 100
    .venv/bin/python bench/fleet.py --nodes 1000 --pool-jobs 100 --cluster

The redis-servers run at nice -10 (redis_first): this machine has two cores for Redis and the
simulator together, and SLOWLOG should time Redis, not the simulator's share of the CPU.

Writes bench/results/fleet.json (--out).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import math
import multiprocessing
import os
import queue
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.crc import key_slot

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nodeagent.coord import poolscripts, scripts  # noqa: E402
from nodeagent.coord.client import connect  # noqa: E402
from nodeagent.coord.keys import JobKeys, PoolKeys  # noqa: E402
from nodeagent.coord.lua import Call, Script  # noqa: E402
from nodeagent.coord.pool import PoolStore  # noqa: E402
from nodeagent.coord.store import JobStore  # noqa: E402
from nodeagent.job.leadership import Leadership  # noqa: E402
from nodeagent.job.plan import Policy  # noqa: E402
from nodeagent.model.job import JobRecord, NodeReport  # noqa: E402
from nodeagent.model.pool import PoolNode  # noqa: E402
from nodeagent.model.spec import load_spec  # noqa: E402
from nodeagent.pool import leadership as pool_leadership  # noqa: E402
from nodeagent.pool.schedule import SchedulePolicy  # noqa: E402
from nodeagent.state import JobState, NodeState  # noqa: E402
from nodeagent.telemetry.metrics import AgentMetrics  # noqa: E402
from tests.helpers.cluster import RedisServer  # noqa: E402
from tests.helpers.rediscluster import RedisClusterServers  # noqa: E402

HEARTBEAT_S, LEASE_S = 1.0, 5.0
BATCHES = 20  # pipelines per process per heartbeat
WATCH_S = 0.1  # how often the watching process polls the jobs' revisions
PROBE_COMMANDS = {"SLOWLOG", "INFO", "CONFIG", "LATENCY"}  # this probe's own: not the fleet's
SLOWLOG_US = 300  # SLOWLOG's threshold: a follower's SYNC takes ~40 us, the leader's ~1-2 ms
MAX_LATE_S = 0.5  # a batch later than this in the steady window: not a 1 s heartbeat
PREFIX, POOL = "nodeagent", "fleet"
T = TypeVar("T")


@dataclass(frozen=True)
class Fleet:
    """Who is who: node i serves job i mod J; a job's leader is its first node."""

    nodes: int
    jobs: tuple[str, ...]
    pool: bool
    kill: int

    @staticmethod
    def of(nodes: int, pool_jobs: int, kill: int) -> Fleet:
        if pool_jobs:
            jobs = tuple(f"fleet{nodes}-j{j:03d}" for j in range(pool_jobs))
        else:
            jobs = (f"fleet{nodes}",)
        return Fleet(nodes, jobs, pool_jobs > 0, kill)

    def name(self, i: int) -> str:
        return f"n{i:05d}"

    def job(self, i: int) -> str:
        return self.jobs[i % len(self.jobs)]

    def size(self, job: str) -> int:
        j = self.jobs.index(job)
        return len(range(j, self.nodes, len(self.jobs)))

    @property
    def leaders(self) -> range:
        return range(min(len(self.jobs), self.nodes))

    @property
    def dead(self) -> list[str]:
        """Followers of job 0."""
        step = len(self.jobs)
        return [self.name(i) for i in range(step, self.nodes, step)][: self.kill]


@dataclass(frozen=True)
class Clock:
    """The run's times (wall clock, shared by every process)."""

    start: float
    window: tuple[float, float]  # the steady window: whole seconds after start
    kill_at: float
    end: float

    @staticmethod
    def of(seconds: float) -> Clock:
        start = time.time() + 1.0  # the processes are started by then
        first = math.ceil(seconds / 4)
        last = max(first + 1, math.floor(seconds / 2))
        return Clock(start, (start + first, start + last), start + seconds / 2, start + seconds)


class CachedNodeReport(NodeReport):
    """A NodeReport whose JSON is built once: the simulator re-sends each node's report every
    second until the node acknowledges another generation, and 10,000 json.dumps(asdict())
    a second cost a core this machine does not have. (A subclass only for that cache.)"""

    @functools.cached_property
    def cached_json(self) -> str:
        return NodeReport.to_json(self)

    def to_json(self) -> str:
        return self.cached_json


class CachedPoolNode(PoolNode):
    """A PoolNode whose JSON is built once (as CachedNodeReport)."""

    @functools.cached_property
    def cached_json(self) -> str:
        return PoolNode.to_json(self)

    def to_json(self) -> str:
        return self.cached_json


def job_report(name: str, acked: int) -> NodeReport:
    return CachedNodeReport(
        name=name,
        address="10.0.0.1",
        state=NodeState.READY,
        acked_generation=acked,
        free_port=29500,
        lease_ttl_ms=int(LEASE_S * 1000),
    )


def pool_report(name: str, job: str) -> PoolNode:
    return CachedPoolNode(
        name=name,
        address="10.0.0.1",
        lease_ttl_ms=int(LEASE_S * 1000),
        labels={"gpu": "h100"},
        pinned=job,
        serving=job,
        metrics="10.0.0.1:9410",
        version="bench",
    )


def stats(values: Sequence[float], scale: float = 1000.0) -> dict[str, float | None]:
    """Median, p99 and max (in ms for seconds)."""
    if not values:
        return {"median": None, "p99": None, "max": None}
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return {
        "median": round(statistics.median(ordered) * scale, 2),
        "p99": round(p99 * scale, 2),
        "max": round(ordered[-1] * scale, 2),
    }


# ---- the followers: worker processes ----------------------------------------------------------


@dataclass
class Slice:
    """One process's nodes (grouped by job, so a batch touches few jobs) and what it counted."""

    names: list[str]
    jobs: dict[str, str]  # node -> job
    counts: dict[str, int] = field(default_factory=dict)  # job beats in the steady window
    late: list[float] = field(default_factory=list)  # how late each batch ran, in the window
    latest: float = 0.0  # the latest one in the whole run
    pool_beats: int = 0
    acked: dict[str, int] = field(default_factory=dict)  # job -> generation acknowledged
    held: dict[str, int] = field(default_factory=dict)  # job -> the record revision read
    reports: dict[str, NodeReport] = field(default_factory=dict)  # for that generation

    def report(self, name: str) -> NodeReport:
        found = self.reports.get(name)
        acked = self.acked.get(self.jobs[name], 0)
        if found is None or found.acked_generation != acked:
            found = self.reports[name] = job_report(name, acked)
        return found


@dataclass(frozen=True)
class Target:
    """The Redis under test: one server, or a cluster's nodes (`ports`, more than one)."""

    url: str
    ports: tuple[int, ...]

    def routes(self) -> Callable[[str], Any]:
        """The client a simulated node uses for a key. On a cluster, a plain client to the node
        serving the key's slot: every key of a job (or of the pool) shares one hash tag, and
        redis-py's cluster pipelines refuse scripts, so the followers' pipelined heartbeats go
        straight to that node (the leaders use the cluster client, as agents do)."""
        if len(self.ports) == 1:
            client = connect(self.url, 30.0)
            return lambda key: client
        clients = {p: redis.Redis(port=p, decode_responses=True) for p in self.ports}
        owner = [0] * 16384
        for start, end, primary, *_ in clients[self.ports[0]].cluster("SLOTS"):
            owner[int(start) : int(end) + 1] = [int(primary[1])] * (int(end) - int(start) + 1)
        return lambda key: clients[owner[key_slot(key.encode())]]


def follow(
    target: Target, fleet: Fleet, mine: list[int], clock: Clock, watch: bool, seen: Any, out: Any
) -> None:
    """Heartbeat this process's nodes: BATCHES pipelines a second, each a slice of them."""
    route, client = target.routes(), connect(target.url, 30.0)
    stores, senders = {}, {}
    packers: dict[tuple[int, str], Packed] = {}  # one connection per server and script

    def packer(client: Any, script: Script) -> Packed:
        key = (id(client), script.name)
        if key not in packers:
            packers[key] = Packed(client, script)
        return packers[key]

    for job in fleet.jobs:
        keys = JobKeys(PREFIX, job)
        stores[job] = JobStore(route(keys.record), keys)
        senders[job] = packer(route(keys.record), scripts.SYNC)
    pool_keys = PoolKeys(PREFIX, POOL)
    pool = PoolStore(route(pool_keys.leases), pool_keys) if fleet.pool else None
    pool_sender = packer(route(pool_keys.leases), poolscripts.POOL_SYNC) if pool else None
    leaders = {fleet.name(i) for i in fleet.leaders}
    names = [fleet.name(i) for i in sorted(mine, key=lambda i: (i % len(fleet.jobs), i))]
    work = Slice(names, {fleet.name(i): fleet.job(i) for i in mine})
    pool_reports = {n: pool_report(n, work.jobs[n]) for n in names} if pool else {}
    size = math.ceil(len(names) / BATCHES)
    batches = [names[b * size : (b + 1) * size] for b in range(BATCHES)]
    watcher = Watcher(client, fleet.jobs) if watch else None
    dead, cpu0, beats = set(fleet.dead), time.process_time(), 0
    for k in range(int((clock.end - clock.start) * BATCHES / HEARTBEAT_S)):
        due = clock.start + k * HEARTBEAT_S / BATCHES
        while True:  # polled when behind too: stale revisions make every reply carry the record
            if watcher is not None:
                watcher.poll(seen)
            if (now := time.time()) >= due:
                break
            time.sleep(min(due - now, WATCH_S))
        alive = now < clock.kill_at
        known = seen[:]
        for j, job in enumerate(fleet.jobs):  # a new generation: acknowledged at once
            work.held[job] = known[2 * j + 1]
            if known[2 * j] != work.acked.get(job, 0):
                work.acked[job] = known[2 * j]
                acks = [n for n in names if work.jobs[n] == job and n not in leaders]
                alive_acks = [n for n in acks if alive or n not in dead]
                send(stores[job], senders[job], work, alive_acks, ())
        batch = [n for n in batches[k % BATCHES] if alive or n not in dead]
        if pool is not None and pool_sender is not None:
            pooled = [pool_reports[n] for n in batch if n != fleet.name(0)]
            pool_sender.send([((r.name,), functools.partial(pool.sync_call, r)) for r in pooled])
            work.pool_beats += len(pooled)
        counted = clock.window[0] <= now < clock.window[1]
        for job in dict.fromkeys(work.jobs[n] for n in batch):
            ours = [n for n in batch if work.jobs[n] == job and n not in leaders]
            beats += send(stores[job], senders[job], work, ours, ours if counted else ())
        if counted:
            work.late.append(time.time() - due)
        work.latest = max(work.latest, time.time() - due)
    out.put(summary(work, names, leaders, clock, beats, time.process_time() - cpu0))


class Packed:
    """One connection that sends pipelined calls of one script as RESP bytes packed once per
    key (what a call's KEYS and ARGV depend on), and reads their replies and drops them."""

    def __init__(self, client: Any, script: Script) -> None:
        self.conn = client.connection_pool.get_connection()
        self.script = script
        self.sha = client.script_load(script.source)
        self.packed: dict[tuple[Any, ...], bytes] = {}

    def send(self, calls: Sequence[tuple[tuple[Any, ...], Callable[[], Call]]]) -> None:
        """`calls`: (key, a function giving the call); a reply that is an error raises."""
        chunks = []
        for key, call in calls:
            packed = self.packed.get(key)
            if packed is None:
                keys, args = self.script.call_args(call())
                parts = self.conn.pack_command("EVALSHA", self.sha, len(keys), *keys, *args)
                packed = self.packed[key] = b"".join(parts)
            chunks.append(packed)
        if not chunks:
            return
        self.conn.send_packed_command([b"".join(chunks)])
        for _ in chunks:
            self.conn.read_response()


def send(
    store: JobStore, sender: Packed, work: Slice, names: list[str], counted: Sequence[str]
) -> int:
    """Heartbeats of `names`, holding the record revision last read (so the replies do not
    carry the record, as a real follower's do not)."""
    if names:
        held = str(work.held.get(store.keys.job, 0) or "-")
        calls = []
        for name in names:
            report = work.report(name)
            key = (name, report.acked_generation, held)
            calls.append((key, functools.partial(store.sync_call, report, (), held)))
        sender.send(calls)
    for name in counted:
        work.counts[name] = work.counts.get(name, 0) + 1
    return len(names)


def summary(
    work: Slice, names: list[str], leaders: set[str], clock: Clock, beats: int, cpu: float
) -> dict[str, Any]:
    window = clock.window[1] - clock.window[0]
    followers = [n for n in names if n not in leaders]
    rates = [work.counts.get(n, 0) / window for n in followers]
    return {
        "nodes": len(followers),
        "min_node_beats_per_s": round(min(rates), 3) if rates else None,
        "beats_per_s": round(beats / (clock.end - clock.start), 1),
        "batch_late_ms": stats(work.late),
        "batch_late_ms_max_whole_run": round(work.latest * 1000, 1),
        "cpu_percent": round(cpu / (clock.end - clock.start) * 100, 1),
        "cpu_us_per_beat": round(cpu / max(1, beats + work.pool_beats) * 1e6, 1),  # job or pool
    }


class Watcher:
    """Polls every job's `rev` (one pipeline); reads the record of a job whose rev moved, with
    its rev (one HMGET: the pair is consistent)."""

    def __init__(self, client: Any, jobs: Sequence[str]) -> None:
        self.client = client
        self.jobs = [JobKeys(PREFIX, job) for job in jobs]
        self.revs: list[str | None] = [None] * len(jobs)
        self.next = 0.0

    def poll(self, seen: Any) -> None:
        """Share each job's generation and revision: seen[2j], seen[2j + 1]."""
        if time.monotonic() < self.next:
            return
        self.next = time.monotonic() + WATCH_S
        pipe = self.client.pipeline(transaction=False)
        for keys in self.jobs:
            pipe.hget(keys.record, "rev")
        revs = pipe.execute()
        moved = [j for j, rev in enumerate(revs) if rev is None or rev != self.revs[j]]
        if not moved:
            return
        pipe = self.client.pipeline(transaction=False)
        for j in moved:
            pipe.hmget(self.jobs[j].record, ["rev", "record"])
        for j, (rev, raw) in zip(moved, pipe.execute(), strict=True):
            if rev and raw:
                generation = JobRecord.from_json(raw).generation
                with seen.get_lock():
                    seen[2 * j], seen[2 * j + 1] = generation, int(rev)
                self.revs[j] = rev


# ---- the leaders: this process -----------------------------------------------------------------


class Timed:
    """A CallRunner that times each call (the leader's COMMIT)."""

    def __init__(self) -> None:
        self.spent = 0.0

    def __call__(self, fn: Callable[[], T], what: str) -> T:
        began = time.monotonic()
        try:
            return fn()
        finally:
            self.spent += time.monotonic() - began


class JobLeader:
    """One job's leader, stepped by this process's loop as the agent's would be."""

    def __init__(self, client: Any, job: str, name: str, nodes: int) -> None:
        self.store = JobStore(client, JobKeys(PREFIX, job))
        self.name = name
        policy = Policy(
            min_nodes=1,
            max_nodes=nodes,
            target_nodes=nodes,
            nproc_per_node=8,
            max_restarts=3,
            join_settle_ms=0,
            rendezvous_timeout_ms=600_000,
        )
        self.timed = Timed()
        metrics = AgentMetrics(job)
        self.leadership = Leadership(
            self.store, policy, metrics, LEASE_S, time.monotonic, self.timed
        )
        self.acked, self.next_beat, self.wake = 0, 0.0, 0.0
        self.steps: list[tuple[float, float, float]] = []  # (wall time, sync s, commit s)

    def step(self) -> None:
        began, spent = time.monotonic(), self.timed.spent
        snapshot = self.store.sync(job_report(self.name, self.acked))
        rtt = time.monotonic() - began
        if snapshot.record is not None:
            self.acked = snapshot.record.generation
        if began >= self.next_beat:
            self.next_beat = began + HEARTBEAT_S
        again = False
        if snapshot.leader and snapshot.leader_name == self.name:
            again = self.leadership.lead(snapshot.leader, snapshot).again
        self.steps.append((time.time(), rtt, self.timed.spent - spent))
        wake = min(self.next_beat, self.leadership.next_expiry or self.next_beat)
        if snapshot.record is not None and snapshot.record.state is JobState.RESTARTING:
            wake = min(wake, time.monotonic() + 0.05)  # the real one is woken by each node_ready
        self.wake = time.monotonic() if again else wake


class PoolLeader:
    """Node 0's pool membership: a pool heartbeat and, holding the lease, a round each second."""

    def __init__(self, client: Any, fleet: Fleet) -> None:
        self.store = PoolStore(client, PoolKeys(PREFIX, POOL))
        self.views = pool_leadership.NodeViews()
        self.report = pool_report(fleet.name(0), fleet.job(0))
        self.wake = 0.0
        self.steps: list[tuple[float, float, float]] = []  # (wall time, sync s, round s)

    def step(self) -> None:
        self.wake = time.monotonic() + HEARTBEAT_S
        began = time.monotonic()
        beat = self.store.sync(self.report)
        rtt, round_s = time.monotonic() - began, 0.0
        if beat.leader is not None and beat.leader_name == self.report.name:
            began = time.monotonic()
            pool_leadership.lead(self.store, beat.leader, SchedulePolicy(), self.views)
            round_s = time.monotonic() - began
        self.steps.append((time.time(), rtt, round_s))


def submit(client: Any, fleet: Fleet) -> None:
    store = PoolStore(client, PoolKeys(PREFIX, POOL))
    for job in fleet.jobs:
        spec = load_spec(
            {
                "id": job,
                "entrypoint": ["python", "train.py"],
                "user": "bench",
                "nproc_per_node": 8,
                "min_nodes": 1,
                "max_nodes": fleet.size(job),
                "target_nodes": fleet.size(job),
            }
        )
        store.submit(spec, pinned=True)


def steps_of(
    steps: list[tuple[float, float, float]], window: tuple[float, float], names: tuple[str, str]
) -> dict[str, Any]:
    """The first figure of each step over the steady window (and its max over the run); the
    second over the steps that made one (a leader commits only when the record changes)."""
    inside = [s for s in steps if window[0] <= s[0] < window[1]]
    made = [s[2] for s in steps if s[2] > 0]
    return {
        names[0]: stats([s[1] for s in inside]),
        f"{names[0]}_max_whole_run": round(max((s[1] for s in steps), default=0) * 1000, 2),
        names[1]: {"count": len(made), **stats(made)},
    }


def max_gap(steps: list[tuple[float, float, float]], window: tuple[float, float]) -> float:
    times = [s[0] for s in steps if window[0] - HEARTBEAT_S <= s[0] < window[1]]
    return max((b - a for a, b in itertools.pairwise(times)), default=math.inf)


# ---- Redis's side ------------------------------------------------------------------------------


class RedisProbe:
    """INFO, SLOWLOG and LATENCY of every server (one, or a cluster's three), summed."""

    def __init__(self, ports: Sequence[int]) -> None:
        self.clients = [redis.Redis(port=p, decode_responses=True) for p in ports]
        for c in self.clients:
            c.config_set("slowlog-log-slower-than", SLOWLOG_US)
            c.config_set("slowlog-max-len", 10_000)
            c.config_set("latency-monitor-threshold", 1)
        self.names = {
            hashlib.sha1(v.source.encode()).hexdigest(): f"{module.__name__.rsplit('.', 1)[1]}.{k}"
            for module in (scripts, poolscripts)
            for k, v in vars(module).items()
            if isinstance(v, Script)
        }

    def reset(self) -> None:
        for c in self.clients:
            c.slowlog_reset()
            c.latency_reset()

    def totals(self) -> dict[str, float]:
        found: dict[str, float] = {}

        def add(key: str, value: Any) -> None:
            found[key] = found.get(key, 0.0) + float(value)

        for c in self.clients:
            info = c.info("everything")
            add("cpu", float(info["used_cpu_sys"]) + float(info["used_cpu_user"]))
            add("memory", info["used_memory"])
            add("net_in", info["total_net_input_bytes"])
            add("net_out", info["total_net_output_bytes"])
            for name, v in c.info("commandstats").items():
                add("calls", v["calls"])
                if name.removeprefix("cmdstat_") in ("evalsha", "eval"):
                    add("script_calls", v["calls"])
                    add("script_usec", v["usec"])
        return found

    def slowest(self, leaders: Sequence[str]) -> dict[str, Any] | None:
        """The longest call in SLOWLOG, how many took over SLOWLOG_US, and the leaders' SYNC
        calls among them (server time: what the leaders cost Redis, their client-side time
        includes decoding in a process that shares two cores)."""
        named = [
            (int(e["duration"]), words)
            for c in self.clients
            for e in c.slowlog_get(10_000)
            if (words := self._words(e["command"]))[0].upper() not in PROBE_COMMANDS
        ]
        if not named:
            return None
        usec, words = max(named, key=lambda entry: entry[0])
        keys = {f":node:{name}" for name in leaders}
        mine = [
            d / 1000
            for d, w in named
            if w[1:2] == ["scripts.SYNC"] and len(w) > 3 and any(w[3].endswith(k) for k in keys)
        ]
        return {
            "usec": usec,
            "command": " ".join(words)[:160],
            f"slower_than_{SLOWLOG_US}us": len(named),
            "leader_sync_server_ms": {"count": len(mine), **stats(mine, 1.0)},
        }

    def _words(self, command: Any) -> list[str]:
        words = (command.decode() if isinstance(command, bytes) else str(command)).split(" ")
        if words[0].upper() == "EVALSHA" and len(words) > 1:
            words[1] = self.names.get(words[1], words[1])
        return words

    def latency(self) -> list[dict[str, Any]]:
        """LATENCY LATEST of each server (by index): event, its latest and highest spike (ms)."""
        return [
            {"server": i, "event": e[0], "latest_ms": int(e[2]), "max_ms": int(e[3])}
            for i, c in enumerate(self.clients)
            for e in c.latency_latest()
        ]

    def spread(self, fleet: Fleet) -> list[dict[str, Any]]:
        """Per server: keys held, the jobs whose records it holds, commands served."""
        out = []
        for c in self.clients:
            calls = sum(int(v["calls"]) for v in c.info("commandstats").values())
            jobs = sum(1 for _ in c.scan_iter(match=f"{PREFIX}:*:job", count=1000))
            out.append({"keys": c.dbsize(), "jobs": jobs, "commands": calls})
        return out


# ---- one run -----------------------------------------------------------------------------------


def run(target: Target, fleet: Fleet, procs: int, seconds: float) -> dict[str, Any]:
    client = connect(target.url, 30.0)
    probe = RedisProbe(target.ports)
    if fleet.pool:
        submit(client, fleet)
    leaders = [
        JobLeader(client, fleet.job(i), fleet.name(i), fleet.size(fleet.job(i)))
        for i in fleet.leaders
    ]
    actors: list[JobLeader | PoolLeader] = [*leaders]
    pooled = PoolLeader(client, fleet) if fleet.pool else None
    if pooled is not None:
        actors.append(pooled)
    memory0 = probe.totals()["memory"]
    clock = Clock.of(seconds)
    context = multiprocessing.get_context("fork")
    seen, out = context.Array("q", 2 * len(fleet.jobs)), context.Queue()
    workers = [
        context.Process(
            target=follow,
            args=(target, fleet, list(range(p, fleet.nodes, procs)), clock, p == 0, seen, out),
        )
        for p in range(procs)
    ]
    for worker in workers:
        worker.start()
    window: list[tuple[float, dict[str, float], Any, Any]] = []
    deadlines: dict[str, float] = {}
    while time.time() < clock.end:
        if len(window) < 2 and time.time() >= clock.window[len(window)]:
            slow = probe.slowest([fleet.name(i) for i in fleet.leaders])
            window.append((time.monotonic(), probe.totals(), slow, probe.latency()))
            if len(window) == 1:
                probe.reset()
        if not deadlines and time.time() > clock.kill_at + HEARTBEAT_S + 0.5:
            deadlines = lease_deadlines(leaders[0].store, fleet.dead)
        actor = min(actors, key=lambda a: a.wake)
        time.sleep(max(0.0, min(actor.wake - time.monotonic(), 0.05)))
        if time.monotonic() >= actor.wake:
            actor.step()
    memory1 = probe.totals()["memory"]
    try:
        processes = [out.get(timeout=60) for _ in workers]
    except queue.Empty:
        codes = [worker.exitcode for worker in workers]
        raise RuntimeError(f"a follower process failed (exit codes {codes})") from None
    for worker in workers:
        worker.join()
    row = figures(fleet, clock, window, processes, leaders, pooled)
    row["redis_bytes_per_node"] = round((memory1 - memory0) / fleet.nodes)
    if len(target.ports) > 1:
        row["cluster_spread"] = probe.spread(fleet)
    if fleet.dead:
        row.update(phases(leaders[0].store, deadlines, clock.kill_at))
    return row


def lease_deadlines(store: JobStore, dead: list[str]) -> dict[str, float]:
    """The dead nodes' last lease deadlines (final once they stopped, before the reap)."""
    scores = {n: store.client.zscore(store.keys.leases, n) for n in dead}
    return {n: float(v) / 1000 for n, v in scores.items() if v is not None}


def figures(
    fleet: Fleet,
    clock: Clock,
    window: list[Any],
    processes: list[dict[str, Any]],
    leaders: list[JobLeader],
    pooled: PoolLeader | None,
) -> dict[str, Any]:
    (t0, totals0, _, _), (t1, totals1, slowest, latency) = window
    elapsed = t1 - t0

    def delta(key: str) -> float:
        return float(totals1.get(key, 0.0) - totals0.get(key, 0.0))

    rates = [p["min_node_beats_per_s"] for p in processes if p["min_node_beats_per_s"] is not None]
    gaps = [max_gap(leader.steps, clock.window) for leader in leaders]
    if pooled is not None:
        gaps.append(max_gap(pooled.steps, clock.window))
    late = max((p["batch_late_ms"]["max"] or 0.0) / 1000 for p in processes)
    beats_ok = min(rates, default=1.0) >= 0.95 and late <= MAX_LATE_S
    kept_up = beats_ok and max(gaps) <= 1.5 * HEARTBEAT_S

    per_node_s = elapsed * fleet.nodes
    scripts_n = delta("script_calls")
    row: dict[str, Any] = {
        "nodes": fleet.nodes,
        "jobs": len(fleet.jobs),
        "pool": fleet.pool,
        "killed": len(fleet.dead),
        "simulator_kept_up": kept_up,
        "min_node_beats_per_s": min(rates, default=None),
        "leader_max_beat_gap_s": round(max(gaps), 2),
        "procs": processes,
        "steady_window_s": round(elapsed, 1),
        "leader": steps_of(
            [s for leader in leaders for s in leader.steps], clock.window, ("sync_ms", "commit_ms")
        ),
        "redis_cpu_percent": round(delta("cpu") / elapsed * 100, 1),
        "redis_commands_per_s_incl_lua": round(delta("calls") / elapsed),
        "redis_commands_per_node_per_s": round(delta("calls") / per_node_s, 2),
        "redis_net_in_bytes_per_node_per_s": round(delta("net_in") / per_node_s),
        "redis_net_out_bytes_per_node_per_s": round(delta("net_out") / per_node_s),
        "redis_script_usec_per_call": round(delta("script_usec") / scripts_n, 1)
        if scripts_n
        else None,
        "redis_slowest": slowest,
        "redis_latency_latest": latency,
        "report_bytes": len(job_report(fleet.name(fleet.nodes - 1), 1).to_json()),
    }
    if pooled is not None:
        row["pool_leader"] = steps_of(pooled.steps, clock.window, ("sync_ms", "round_ms"))
        row["pool_report_bytes"] = len(pool_report(fleet.name(0), fleet.jobs[0]).to_json())
    return row


def phases(store: JobStore, deadlines: dict[str, float], kill_at: float) -> dict[str, Any]:
    """Deadline -> noticed, -> next generation announced, -> started (server time)."""
    events = [e for e in store.events("-", count=100_000) if (e.at_ms or 0) / 1000 >= kill_at]
    first = min(deadlines.values(), default=0.0)
    lost = {e.node: (e.at_ms or 0) / 1000 for e in events if e.type == "node_lost"}
    detections = [lost[n] - d for n, d in deadlines.items() if n in lost]

    def after(kind: str) -> float | None:
        at = [(e.at_ms or 0) / 1000 for e in events if e.type == kind]
        return round(min(at) - first, 3) if at and deadlines else None

    return {
        "detected": f"{len(detections)}/{len(deadlines)}",
        "detection_after_deadline_s": {
            "median": round(statistics.median(detections), 3) if detections else None,
            "max": round(max(detections), 3) if detections else None,
        },
        "announced_after_deadline_s": after("generation_announced"),
        "started_after_deadline_s": after("generation_started"),
    }


def redis_first(servers: RedisServer | RedisClusterServers) -> None:
    """Give the redis-servers the CPU first (nice -10). In a fleet Redis has a host of its own;
    here it shares two cores with the simulator, and a script Redis was preempted in would show
    in SLOWLOG as the simulator's CPU, not as Redis time."""
    procs = servers.procs if isinstance(servers, RedisClusterServers) else [servers.proc]
    for proc in procs:
        if proc is not None:
            os.setpriority(os.PRIO_PROCESS, proc.pid, -10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="100,1000,5000,10000")
    parser.add_argument("--kill", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument(
        "--procs",
        type=int,
        default=0,
        help="follower processes (0: one per 2,500 beats/s, 1-4)",
    )
    parser.add_argument("--pool-jobs", type=int, default=0, help="pool mode with this many jobs")
    parser.add_argument("--cluster", action="store_true", help="a real 3-node Redis Cluster")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "fleet.json"))
    args = parser.parse_args()
    runs: list[dict[str, Any]] = []
    results = {"heartbeat_s": HEARTBEAT_S, "lease_s": LEASE_S, "batches": BATCHES, "runs": runs}
    with tempfile.TemporaryDirectory() as tmp:
        servers = RedisClusterServers(Path(tmp)) if args.cluster else RedisServer(Path(tmp))
        servers.start()
        try:
            redis_first(servers)
            ports = servers.ports if isinstance(servers, RedisClusterServers) else [servers.port]
            target = Target(servers.url, tuple(ports))
            for nodes in (int(n) for n in args.nodes.split(",")):
                load = nodes * (2 if args.pool_jobs else 1)  # heartbeats a second
                procs = args.procs or min(4, max(1, math.ceil(load / 2500)))
                fleet = Fleet.of(nodes, args.pool_jobs, args.kill)
                row = {"cluster": args.cluster, **run(target, fleet, procs, args.seconds)}
                print(json.dumps(row), flush=True)
                runs.append(row)
        finally:
            servers.stop()
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
