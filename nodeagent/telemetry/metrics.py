"""Prometheus metrics of one agent: one object owning its own CollectorRegistry.

Names follow Prometheus' conventions (base units, `_total` on counters, no `_created` series).
The training job's id is the label `job_id`: Prometheus' own `job` label names the scrape
job, and the node is the scrape's `instance`. GPU metrics are collected at scrape time from the
monitor's cached snapshot, so a scrape never waits on a wedged GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Enum,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from nodeagent.channel.beats import Beat
from nodeagent.errors import ConfigError
from nodeagent.gpu.classify import Verdict
from nodeagent.gpu.readings import GpuSnapshot
from nodeagent.model.garbage import KINDS as GARBAGE_KINDS
from nodeagent.model.job import WORKER_STATES, JobRecord, RestartReason, WorkerInfo
from nodeagent.state import JobState, NodeState
from nodeagent.telemetry.checkpoints import CheckpointMetrics
from nodeagent.telemetry.httpd import Handoff, HttpServer, Route

FAILURE_KINDS = ("exit_code", "signal", "hang", "xid", "oom")
DETECTION_KINDS = ("node_lost", "hang")
RIDE_OUTCOMES = ("resumed", "fenced")  # how a ride through a Redis outage ended
RECOVERY_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
DETECTION_BUCKETS = (0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900)
HEARTBEAT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


def with_user(families: Iterable[Metric], user: str) -> Iterator[Metric]:
    """Each per-job sample (one with a job_id) labelled with `user`, whom the job runs as, too,
    so that an alert can be routed to its submitter (config/prometheus/nodeagent-alerts.yml
    keeps it); "" labels nothing."""
    return with_users(families, lambda job: user)


def with_users(families: Iterable[Metric], user_of: Callable[[str], str]) -> Iterator[Metric]:
    """with_user, each sample's user the one its job_id runs as (a node several jobs share)."""
    for family in families:
        samples = []
        for sample in family.samples:
            job = sample.labels.get("job_id")
            user = user_of(job) if job is not None else ""
            samples.append(
                sample._replace(labels={**sample.labels, "user": user}) if user else sample
            )
        family.samples = samples
        yield family


class _GpuCollector(Collector):
    """The node's GPUs, from the monitor's cache, each labelled with the job that holds it at
    the scrape (on a node jobs share, its holder), else the job the node serves ("" while it
    serves none: an idle node's GPUs are watched too), and whom that job runs as."""

    def __init__(
        self,
        job_id: Callable[[], str],
        snapshot: Callable[[], GpuSnapshot],
        verdicts: Callable[[], Sequence[Verdict]],
        xids: Callable[[], Mapping[tuple[int, int], int]],
        users: Callable[[], Mapping[str, str]],
        holders: Callable[[], Mapping[str, str]],
    ) -> None:
        self._job_id = job_id
        self._users = users
        self._holders = holders
        self._snapshot = snapshot
        self._verdicts = verdicts
        self._xids = xids

    def collect(self) -> Iterable[Metric]:
        users = self._users()
        return with_users(self._families(), lambda job: users.get(job, ""))

    def _families(self) -> Iterable[Metric]:
        snap = self._snapshot()
        self._job = self._job_id()
        holders = self._holders()  # a GPU's UUID -> the job holding it
        job_of = {r.index: holders.get(r.uuid, self._job) for r in snap.gpus}
        available = GaugeMetricFamily(
            "nodeagent_gpu_monitoring_available", "1 if NVML works on this node", labels=["job_id"]
        )
        available.add_metric([self._job], 1.0 if snap.available else 0.0)
        yield available
        if not snap.available:
            return
        labels = ["job_id", "gpu"]
        healthy = GaugeMetricFamily(
            "nodeagent_gpu_healthy",
            "1 if the GPU is usable (its verdict drains nothing)",
            labels=labels,
        )
        temperature = GaugeMetricFamily(
            "nodeagent_gpu_temperature_celsius", "GPU temperature", labels=labels
        )
        power = GaugeMetricFamily("nodeagent_gpu_power_watts", "GPU power draw", labels=labels)
        ecc = CounterMetricFamily(
            "nodeagent_gpu_ecc_uncorrected_errors",
            "Volatile uncorrected ECC errors (since the driver loaded)",
            labels=labels,
        )
        remap = GaugeMetricFamily(
            "nodeagent_gpu_remapped_rows_pending",
            "1 if a row remap waits for a GPU reset",
            labels=labels,
        )
        drains = {v.index for v in self._verdicts() if v.drains}
        for r in snap.gpus:
            gpu = [job_of[r.index], str(r.index)]
            healthy.add_metric(gpu, 0.0 if r.index in drains else 1.0)
            if r.temperature_c is not None:
                temperature.add_metric(gpu, float(r.temperature_c))
            if r.power_w is not None:
                power.add_metric(gpu, float(r.power_w))
            if r.ecc_uncorrected_volatile is not None:
                ecc.add_metric(gpu, float(r.ecc_uncorrected_volatile))
            if r.remapped_rows_pending is not None:
                remap.add_metric(gpu, 1.0 if r.remapped_rows_pending else 0.0)
        xid = CounterMetricFamily(
            "nodeagent_gpu_xid_errors", "XIDs seen, by GPU and XID", labels=["job_id", "gpu", "xid"]
        )
        for (gpu_index, code), count in sorted(self._xids().items()):
            xid.add_metric([job_of.get(gpu_index, self._job), str(gpu_index), str(code)], count)
        yield from (healthy, temperature, power, ecc, remap, xid)


def node_metrics(
    registry: CollectorRegistry,
    version: str,
    serving: Callable[[], str],
    snapshot: Callable[[], GpuSnapshot],
    verdicts: Callable[[], Sequence[Verdict]],
    xids: Callable[[], Mapping[tuple[int, int], int]],
    users: Callable[[], Mapping[str, str]] = dict,
    holders: Callable[[], Mapping[str, str]] = dict,
) -> None:
    """What every agent exports whether it serves a job or not (issue 62: an idle pool node
    exported only its pool's series, so no dashboard or alert saw its version or its GPUs):
    `nodeagent_build_info{version}`, and its GPUs (read from the monitor's cache at scrape
    time, each labelled with the job `holders()` names for its UUID, else the one `serving()`
    names, "" for none, and whom that job runs as: `users()`, job -> user)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    Info("nodeagent_build", "nodeagent's version", registry=registry).info({"version": version})
    registry.register(_GpuCollector(serving, snapshot, verdicts, xids, users, holders))


class AgentMetrics:
    """The agent's metrics; the agent calls the update methods, a scrape reads the registry."""

    def __init__(self, job_id: str, registry: CollectorRegistry | None = None) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.job_id = job_id
        r = self.registry = registry or CollectorRegistry()
        j = ["job_id"]
        self.restarts = Counter(
            "nodeagent_restarts", "Generations started, by reason", ["job_id", "reason"], registry=r
        )
        self.worker_failures = Counter(
            "nodeagent_worker_failures",
            "This node's worker failures, by kind (exit_code, signal, hang, xid, oom)",
            ["job_id", "kind"],
            registry=r,
        )
        self.generation = Gauge(
            "nodeagent_generation", "The job's current generation", j, registry=r
        )
        self.world_size = Gauge(
            "nodeagent_world_size", "Worker processes in the running generation", j, registry=r
        )
        self.target_nodes = Gauge(
            "nodeagent_target_nodes", "The job's target size in nodes", j, registry=r
        )
        self.restart_count = Gauge(
            "nodeagent_job_restart_count", "Worker failures charged to the job", j, registry=r
        )
        self.max_restarts = Gauge(
            "nodeagent_job_max_restarts", "The job's restart budget", j, registry=r
        )
        self.node_state = Enum(
            "nodeagent_node_state",
            "This node's state",
            j,
            states=[s.value for s in NodeState],
            registry=r,
        )
        self.job_state = Enum(
            "nodeagent_job_state",
            "The job's state as last read",
            j,
            states=[s.value for s in JobState],
            registry=r,
        )
        self.is_leader = Gauge(
            "nodeagent_is_leader", "1 while this agent leads the job", j, registry=r
        )
        self.workers = Gauge(
            "nodeagent_workers",
            "This node's worker processes, by state",
            ["job_id", "state"],
            registry=r,
        )
        self.recovery = Histogram(
            "nodeagent_recovery_seconds",
            "New generation announced -> this node's workers running",
            j,
            buckets=RECOVERY_BUCKETS,
            registry=r,
        )
        self.detection = Histogram(
            "nodeagent_detection_seconds",
            "Fault -> noticed, by kind",
            ["job_id", "kind"],
            buckets=DETECTION_BUCKETS,
            registry=r,
        )
        self.heartbeat = Histogram(
            "nodeagent_heartbeat_seconds",
            "Heartbeat round trips to Redis",
            j,
            buckets=HEARTBEAT_BUCKETS,
            registry=r,
        )
        self.redis_errors = Counter("nodeagent_redis_errors", "Failed Redis calls", j, registry=r)
        self.image_pull = Gauge(
            "nodeagent_container_pull_seconds",
            "How long this node took to make the job's image ready before its workers started "
            "(0: it was present)",
            ["job_id", "image"],
            registry=r,
        )
        self.garbage = Counter(
            "nodeagent_redis_garbage",
            "Values read from Redis that nodeagent did not write, by kind of key (each counted "
            "once while it stays)",
            ["job_id", "key"],
            registry=r,
        )
        self.last_heartbeat = Gauge(
            "nodeagent_last_heartbeat_timestamp_seconds",
            "When this agent last renewed its lease",
            j,
            registry=r,
        )
        self.progress = Gauge(
            "nodeagent_worker_last_progress_timestamp_seconds",
            "When each local rank last beat (nodeagent.worker.beat)",
            ["job_id", "local_rank"],
            registry=r,
        )
        self.goodput_seconds = Gauge(
            "nodeagent_job_goodput_seconds",
            "The job's wall time by part (docs/observability.md, Goodput), as its leader last "
            "accounted it from the job's events",
            ["job_id", "part"],
            registry=r,
        )
        self.ettr = Gauge(
            "nodeagent_job_effective_training_ratio",
            "Productive training time / wall time (ETTR), as the job's leader last accounted it",
            j,
            registry=r,
        )
        self.steps_lost = Gauge(
            "nodeagent_job_steps_lost",
            "Steps the job's re-forms lost (trained again), as its leader last accounted it",
            j,
            registry=r,
        )
        self.work = Gauge(
            "nodeagent_node_step_work_seconds",
            "This node's slowest local rank over its last speed window, seconds a step: `step` "
            "(the job's step time), `busy` (on a CPU or waiting for one), `cpu`, `delay` "
            "(waiting for a CPU), `compute` (the script's marked sections; docs/slow-nodes.md)",
            ["job_id", "figure"],
            registry=r,
        )
        self.slow_ratio = Gauge(
            "nodeagent_node_slow_ratio",
            "A node the job's leader names slow: its own work a step over its peers' median "
            "(only the leader exports it, one series per node named slow)",
            ["job_id", "node"],
            registry=r,
        )
        self.slow_nodes = Gauge(
            "nodeagent_job_slow_nodes",
            "Members the job's leader names slow (docs/slow-nodes.md)",
            j,
            registry=r,
        )
        self.peers_suspected = Gauge(
            "nodeagent_peers_suspected",
            "Members of the job this node's watch suspects lost now (docs/design.md, "
            '"Fast detection")',
            j,
            registry=r,
        )
        self.peer_suspicions = Counter(
            "nodeagent_peer_suspicions",
            "Members this node's watch began to suspect lost",
            j,
            registry=r,
        )
        self.riding = Gauge(
            "nodeagent_riding_through",
            "1 while this node trains on without Redis past its fence point, every member "
            'heard (docs/design.md, "Riding through a Redis outage")',
            j,
            registry=r,
        )
        self.rides = Counter(
            "nodeagent_ride_throughs",
            "Rides through a Redis outage, by how they ended: resumed (Redis reached again, "
            "the generation went on) or fenced",
            [*j, "outcome"],
            registry=r,
        )
        self.checkpoints = CheckpointMetrics(job_id, r)
        # Every series exists from the start, at zero: rate() and increase() need a sample
        # before the first event to see it.
        for reason in RestartReason:
            self.restarts.labels(job_id, reason.value)
        for kind in FAILURE_KINDS:
            self.worker_failures.labels(job_id, kind)
        for kind in DETECTION_KINDS:
            self.detection.labels(job_id, kind)
        self.peers_suspected.labels(job_id)
        self.peer_suspicions.labels(job_id)
        self.riding.labels(job_id)
        for outcome in RIDE_OUTCOMES:
            self.rides.labels(job_id, outcome)
        for kind in GARBAGE_KINDS:
            self.garbage.labels(job_id, kind)
        for metric in (self.recovery, self.heartbeat, self.redis_errors, self.is_leader):
            metric.labels(job_id)
        self._generation_seen = 0
        self._announced_at: dict[int, float] = {}

    # -- updates from the agent's loop ------------------------------------------------------

    def synced(self, seconds: float, record: JobRecord | None, leader: bool, now: float) -> None:
        j = self.job_id
        self.heartbeat.labels(j).observe(seconds)
        self.last_heartbeat.labels(j).set(time.time())
        self.is_leader.labels(j).set(1 if leader else 0)
        if record is None:
            return
        self.generation.labels(j).set(record.generation)
        self.world_size.labels(j).set(record.world_size)
        self.target_nodes.labels(j).set(record.target_nodes)
        self.restart_count.labels(j).set(record.restart_count)
        self.max_restarts.labels(j).set(record.max_restarts)
        self.job_state.labels(j).state(record.state.value)
        if record.generation > self._generation_seen:
            if self._generation_seen:  # not the first one this agent saw: a re-form
                # The reason is read from Redis: only known ones become label values.
                why = RestartReason.of(record.reason)
                self.restarts.labels(j, why.value if why is not None else "other").inc()
                self._announced_at.setdefault(record.generation, now)
            self._generation_seen = record.generation

    def goodput(
        self, parts: Mapping[str, float] | None, ettr: float | None = None, steps_lost: int = 0
    ) -> None:
        """The leader's accounting of the job's time (model/goodput.py); None: this agent does
        not lead, or there is nothing to account (its series go: only the leader's are
        current)."""
        for gauge in (self.goodput_seconds, self.ettr, self.steps_lost):
            gauge.clear()
        if parts is None:
            return
        j = self.job_id
        for part, seconds in parts.items():
            self.goodput_seconds.labels(j, part).set(seconds)
        if ettr is not None:
            self.ettr.labels(j).set(ettr)
        self.steps_lost.labels(j).set(steps_lost)

    def node_work(self, figures: Mapping[str, float | None]) -> None:
        """This node's last speed window (job/speed.py); a figure it has not: no series."""
        self.work.clear()
        for figure, seconds in figures.items():
            if seconds is not None:
                self.work.labels(self.job_id, figure).set(seconds)

    def slow(self, named: Mapping[str, float] | None) -> None:
        """The leader's slow verdicts (node -> ratio); None: this agent does not lead (its
        series go)."""
        self.slow_ratio.clear()
        self.slow_nodes.clear()
        if named is None:
            return
        for node, ratio in named.items():
            self.slow_ratio.labels(self.job_id, node).set(ratio)
        self.slow_nodes.labels(self.job_id).set(len(named))

    def peers(self, suspected: int, new: int) -> None:
        """This node's watch: how many members it suspects now, `new` of them since the last."""
        self.peers_suspected.labels(self.job_id).set(suspected)
        if new:
            self.peer_suspicions.labels(self.job_id).inc(new)

    def sync_failed(self) -> None:
        self.redis_errors.labels(self.job_id).inc()

    def ride(self, riding: bool, ended: str | None = None) -> None:
        """Riding through now, or not; `ended`: how a ride ended (RIDE_OUTCOMES)."""
        self.riding.labels(self.job_id).set(1 if riding else 0)
        if ended is not None:
            self.rides.labels(self.job_id, ended).inc()

    def redis_garbage(self, kind: str) -> None:
        """A value of this kind of key in Redis is garbage (garbage.KINDS)."""
        self.garbage.labels(self.job_id, kind if kind in GARBAGE_KINDS else "job").inc()

    def state(self, state: NodeState) -> None:
        self.node_state.labels(self.job_id).state(state.value)

    def worker_states(self, workers: Sequence[WorkerInfo]) -> None:
        counts = dict.fromkeys(WORKER_STATES, 0)
        for w in workers:
            counts[w.state] = counts.get(w.state, 0) + 1
        for state, count in counts.items():
            self.workers.labels(self.job_id, state).set(count)

    def worker_failed(self, kind: str) -> None:
        self.worker_failures.labels(self.job_id, kind).inc()

    def workers_started(self, generation: int, now: float) -> None:
        announced = self._announced_at.pop(generation, None)
        if announced is not None:
            self.recovery.labels(self.job_id).observe(max(0.0, now - announced))
        self._announced_at = {g: t for g, t in self._announced_at.items() if g > generation}

    def detected(self, kind: str, seconds: float) -> None:
        self.detection.labels(self.job_id, kind).observe(max(0.0, seconds))

    def beats(self, beats: Mapping[int, Beat]) -> None:
        for local_rank, beat in beats.items():
            self.progress.labels(self.job_id, str(local_rank)).set(beat.wall_time)


class MetricsServer:
    """/metrics and /healthz on `listen` ("host:port"; port 0 picks a free one), `logs`
    (nodeagent.telemetry.logserve.LogRoute) answers /logs/... where given, and `handoff` the
    requests it wants, in threads of their own (/stacks/..., /run/...).

    Served by nodeagent.telemetry.httpd: one thread, a deadline per connection, a cap on
    connections, and
    out-of-descriptors handled as a retry, so slow or idle clients cannot exhaust the agent.
    """

    def __init__(
        self,
        listen: str,
        registry: CollectorRegistry,
        health: Callable[[], tuple[bool, str]],
        max_connections: int = 64,
        timeout: float = 5.0,
        logs: Route | None = None,
        handoff: Handoff | None = None,
    ) -> None:
        host, _, port = listen.rpartition(":")

        def route(target: str) -> tuple[int, bytes, str]:
            if target.split("?")[0] == "/metrics":
                return 200, generate_latest(registry), CONTENT_TYPE_LATEST
            if target == "/healthz":
                ok, reason = health()
                return (200 if ok else 503), (reason + "\n").encode(), "text/plain"
            if logs is not None and target.startswith("/logs/"):
                return logs(target)
            return 404, b"try /metrics, /healthz or /logs/JOB/RANK\n", "text/plain"

        try:
            self._server = HttpServer(
                (host or "0.0.0.0", int(port)), route, max_connections, timeout, handoff=handoff
            )
        except OSError as exc:
            raise ConfigError(
                "metrics.listen", f"cannot listen on {listen}: {exc.strerror or exc}"
            ) from exc

    @property
    def address(self) -> str:
        host, port = self._server.address
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"

    @property
    def open_connections(self) -> int:
        return self._server.open_connections

    def start(self) -> None:
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
