"""The exported metric families, read back with registry.get_sample_value."""

from __future__ import annotations

from dataclasses import replace

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from nodeagent.channel.beats import Beat
from nodeagent.gpu.classify import Thresholds, Verdict, classify
from nodeagent.gpu.readings import GpuReading, GpuSnapshot
from nodeagent.model.job import RestartReason, WorkerInfo
from nodeagent.runtime.jobrun import CurrentJobMetrics
from nodeagent.state import JobState, NodeState
from nodeagent.telemetry.httpd import answer, too_large
from nodeagent.telemetry.metrics import AgentMetrics, node_metrics
from tests.helpers.factories import make_record

J = {"job_id": "llama"}


def value(m: AgentMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, {**J, **labels})


def test_job_gauges_and_restarts_by_reason() -> None:
    m = AgentMetrics("llama")
    record = make_record(JobState.RUNNING, 4, ("a", "b"), nproc_per_node=8, restart_count=1)
    m.synced(0.003, record, leader=True, now=100.0)
    assert value(m, "nodeagent_generation") == 4
    assert value(m, "nodeagent_world_size") == 16
    assert value(m, "nodeagent_target_nodes") == 3
    assert value(m, "nodeagent_job_restart_count") == 1
    assert value(m, "nodeagent_job_max_restarts") == 3
    assert value(m, "nodeagent_is_leader") == 1
    assert value(m, "nodeagent_job_state", nodeagent_job_state="running") == 1
    assert value(m, "nodeagent_heartbeat_seconds_count") == 1
    assert value(m, "nodeagent_restarts_total", reason="worker_failed") == 0  # the first one seen
    assert value(m, "nodeagent_recovery_seconds_count") == 0  # exists before any recovery
    assert value(m, "nodeagent_worker_failures_total", kind="hang") == 0
    m.synced(0.004, replace(record, generation=5, reason="worker_failed"), leader=False, now=101.0)
    m.synced(0.004, replace(record, generation=5, reason="worker_failed"), leader=False, now=102.0)
    assert value(m, "nodeagent_restarts_total", reason="worker_failed") == 1  # once per generation
    assert value(m, "nodeagent_is_leader") == 0
    m.workers_started(5, now=104.5)
    assert value(m, "nodeagent_recovery_seconds_count") == 1
    assert value(m, "nodeagent_recovery_seconds_sum") == 3.5


def test_node_workers_failures_detection_progress() -> None:
    m = AgentMetrics("llama")
    m.state(NodeState.DRAINING)
    assert value(m, "nodeagent_node_state", nodeagent_node_state="draining") == 1
    assert value(m, "nodeagent_node_state", nodeagent_node_state="running") == 0
    m.worker_states(
        [
            WorkerInfo(0, 0, 1, "running"),
            WorkerInfo(1, 1, 2, "running"),
            WorkerInfo(2, 2, 3, "failed", 1),
        ]
    )
    assert value(m, "nodeagent_workers", state="running") == 2
    assert value(m, "nodeagent_workers", state="failed") == 1
    m.worker_failed("signal")
    m.worker_failed("hang")
    assert value(m, "nodeagent_worker_failures_total", kind="signal") == 1
    m.detected("node_lost", 5.2)
    assert value(m, "nodeagent_detection_seconds_sum", kind="node_lost") == 5.2
    m.sync_failed()
    assert value(m, "nodeagent_redis_errors_total") == 1
    m.beats({0: Beat(10, 99, 1700000000.5)})
    assert (
        value(m, "nodeagent_worker_last_progress_timestamp_seconds", local_rank="0") == 1700000000.5
    )


def node(
    snapshot: GpuSnapshot,
    verdicts: tuple[Verdict, ...] = (),
    xids: dict[tuple[int, int], int] | None = None,
    serving: list[str] | None = None,
) -> CollectorRegistry:
    """A registry with what every agent exports, serving `serving[0]` ("" for no job)."""
    registry = CollectorRegistry()
    held = serving if serving is not None else ["llama"]
    node_metrics(registry, "1.2.3", lambda: held[0], lambda: snapshot, lambda: verdicts,
                 lambda: xids or {})  # fmt: skip
    return registry


def test_gpu_families_and_no_created_series() -> None:
    hot = GpuReading(
        index=1,
        temperature_c=95,
        slowdown_temperature_c=90,
        power_w=410.5,
        ecc_uncorrected_volatile=2,
        remapped_rows_pending=True,
    )
    snap = GpuSnapshot(True, gpus=(GpuReading(index=0, temperature_c=50, power_w=300.0), hot))
    verdicts = tuple(classify(r, Thresholds()) for r in snap.gpus)
    registry = node(snap, verdicts, {(1, 79): 2})

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, {**J, **labels})

    assert value("nodeagent_gpu_monitoring_available") == 1
    assert value("nodeagent_gpu_healthy", gpu="0") == 1
    assert value("nodeagent_gpu_healthy", gpu="1") == 0
    assert value("nodeagent_gpu_temperature_celsius", gpu="1") == 95
    assert value("nodeagent_gpu_power_watts", gpu="1") == 410.5
    assert value("nodeagent_gpu_ecc_uncorrected_errors_total", gpu="1") == 2
    assert value("nodeagent_gpu_remapped_rows_pending", gpu="1") == 1
    assert value("nodeagent_gpu_xid_errors_total", gpu="1", xid="79") == 2
    assert registry.get_sample_value("nodeagent_build_info", {"version": "1.2.3"}) == 1
    text = (
        generate_latest(registry).decode()
        + generate_latest(AgentMetrics("llama").registry).decode()
    )
    assert "_created" not in text


def test_an_idle_node_exports_its_version_and_gpus() -> None:
    """Issue 62: a node serving no job exported only its pool's series. Its version and its
    GPUs are the node's, labelled with the job it serves at the scrape ("" for none)."""
    snap = GpuSnapshot(True, gpus=(GpuReading(index=0, temperature_c=50),))
    verdicts = tuple(classify(r, Thresholds()) for r in snap.gpus)
    serving = [""]
    registry = node(snap, verdicts, serving=serving)
    assert registry.get_sample_value("nodeagent_build_info", {"version": "1.2.3"}) == 1
    assert registry.get_sample_value("nodeagent_gpu_healthy", {"job_id": "", "gpu": "0"}) == 1
    serving[0] = "llama"
    assert registry.get_sample_value("nodeagent_gpu_healthy", {"job_id": "llama", "gpu": "0"}) == 1
    assert registry.get_sample_value("nodeagent_gpu_healthy", {"job_id": "", "gpu": "0"}) is None


def test_gpu_monitoring_unavailable() -> None:
    registry = node(GpuSnapshot(False, "no driver"))
    assert registry.get_sample_value("nodeagent_gpu_monitoring_available", J) == 0
    assert registry.get_sample_value("nodeagent_gpu_healthy", {**J, "gpu": "0"}) is None


def route(target: str) -> tuple[int, bytes, str]:
    if target == "/boom":
        raise RuntimeError("a collector failed")
    return 200, f"you asked for {target}".encode(), "text/plain"


@pytest.mark.parametrize(
    ("request_head", "status", "body"),
    [
        (b"GET /metrics HTTP/1.1\r\nHost: x", b"200 OK", b"you asked for /metrics"),
        (b"HEAD /metrics HTTP/1.0", b"200 OK", b""),
        (b"POST /metrics HTTP/1.1", b"405 Method Not Allowed", b"only GET and HEAD\n"),
        (b"GET /metrics", b"400 Bad Request", b"bad request\n"),
        (b"\x00\xff garbage", b"400 Bad Request", b"bad request\n"),
        (b"GET /boom HTTP/1.1", b"500 Internal Server Error", b"internal error\n"),
    ],
)
def test_http_answers(request_head: bytes, status: bytes, body: bytes) -> None:
    reply = answer(request_head, route)
    head, _, got = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 " + status) and b"Connection: close" in head
    assert got == body


@pytest.mark.parametrize(
    ("buffer", "status"),
    [
        (b"GET /" + b"x" * 9000, b"414"),  # no end of line yet, already too long
        (b"GET /" + b"x" * 9000 + b" HTTP/1.1\r\n", b"414"),
        (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * 10_000, b"431"),
        (b"GET / HTTP/1.1\r\nHost: x", None),
    ],
)
def test_http_limits(buffer: bytes, status: bytes | None) -> None:
    error = too_large(buffer)
    assert (error is None) if status is None else (error is not None and status in error[:20])


@pytest.mark.parametrize("reason", list(RestartReason))
def test_every_restart_reason_the_plan_gives_is_counted_by_its_own_name(
    reason: RestartReason,
) -> None:
    """The plan announces generations only with a RestartReason (job/plan.py `_begin` takes
    nothing else); the metrics know each one, none is counted as "other"."""
    m = AgentMetrics("llama")
    assert value(m, "nodeagent_restarts_total", reason=reason.value) == 0  # from the start
    record = make_record(JobState.RUNNING, 4, ("a",))
    m.synced(0.001, record, leader=False, now=1.0)
    m.synced(0.001, replace(record, generation=5, reason=reason.value), leader=False, now=2.0)
    assert value(m, "nodeagent_restarts_total", reason=reason.value) == 1
    assert value(m, "nodeagent_restarts_total", reason="other") is None  # never counted


def test_garbage_counts_by_kind_and_reasons_from_redis_are_no_labels() -> None:
    m = AgentMetrics("llama")
    assert value(m, "nodeagent_redis_garbage_total", key="leases") == 0  # exists from the start
    m.redis_garbage("leases")
    m.redis_garbage("no-such-kind")
    assert value(m, "nodeagent_redis_garbage_total", key="leases") == 1
    assert value(m, "nodeagent_redis_garbage_total", key="job") == 1
    record = make_record(JobState.RUNNING, 4, ("a",))
    m.synced(0.001, record, leader=False, now=1.0)
    m.synced(0.001, replace(record, generation=5, reason="x" * 200), leader=False, now=2.0)
    assert value(m, "nodeagent_restarts_total", reason="other") == 1
    assert "x" * 200 not in generate_latest(m.registry).decode()


def test_the_members_watch_suspects_now_and_suspicions_begun() -> None:
    m = AgentMetrics("llama")
    assert value(m, "nodeagent_peers_suspected") == 0  # the series exist from the start
    assert value(m, "nodeagent_peer_suspicions_total") == 0
    m.peers(2, 2)
    m.peers(2, 0)  # still the same two
    m.peers(1, 0)
    assert value(m, "nodeagent_peers_suspected") == 1
    assert value(m, "nodeagent_peer_suspicions_total") == 2


def test_a_ride_through_a_redis_outage_is_shown_while_it_lasts_and_counted_by_its_end() -> None:
    m = AgentMetrics("llama")
    assert value(m, "nodeagent_riding_through") == 0  # the series exist from the start
    assert value(m, "nodeagent_ride_throughs_total", outcome="resumed") == 0
    m.ride(True)
    assert value(m, "nodeagent_riding_through") == 1
    m.ride(False, "resumed")
    m.ride(True)
    m.ride(False, "fenced")
    assert value(m, "nodeagent_riding_through") == 0
    assert value(m, "nodeagent_ride_throughs_total", outcome="resumed") == 1
    assert value(m, "nodeagent_ride_throughs_total", outcome="fenced") == 1


def test_on_a_node_jobs_share_each_gpu_carries_its_holders_job_and_user() -> None:
    """Two jobs sharing a node: each GPU's series say the job holding it (and whom that job
    runs as), a free GPU the node's default ("" when it serves several), its XIDs too."""
    snap = GpuSnapshot(
        True,
        gpus=(
            GpuReading(index=0, uuid="GPU-0", temperature_c=40),
            GpuReading(index=1, uuid="GPU-1", temperature_c=41),
            GpuReading(index=2, uuid="GPU-2", temperature_c=42),
        ),
    )
    registry = CollectorRegistry()
    node_metrics(
        registry,
        "1.2.3",
        lambda: "",
        lambda: snap,
        lambda: (),
        lambda: {(1, 43): 1},
        users=lambda: {"eval": "alice", "tune": "bob"},
        holders=lambda: {"GPU-0": "eval", "GPU-1": "tune"},
    )

    def temperature(gpu: str, **labels: str) -> float | None:
        found = {"gpu": gpu, **labels}
        return registry.get_sample_value("nodeagent_gpu_temperature_celsius", found)

    assert temperature("0", job_id="eval", user="alice") == 40
    assert temperature("1", job_id="tune", user="bob") == 41
    assert temperature("2", job_id="") == 42  # free: no job, no user
    xid = {"job_id": "tune", "user": "bob", "gpu": "1", "xid": "43"}
    assert registry.get_sample_value("nodeagent_gpu_xid_errors_total", xid) == 1


def test_a_node_exports_each_job_it_serves_with_its_user_until_it_leaves_it() -> None:
    """Two jobs sharing a node: both jobs' series, each with whom it runs as; the series of a
    job the node left go with it (runtime/jobrun.CurrentJobMetrics)."""
    current = CurrentJobMetrics()
    eval_job, tune_job = AgentMetrics("eval"), AgentMetrics("tune")
    for metrics in (eval_job, tune_job):
        metrics.restarts.labels(metrics.job_id, "worker_failed").inc()
    current.serve("eval", eval_job.registry, "alice")
    current.serve("tune", tune_job.registry, "bob")
    registry = CollectorRegistry()
    registry.register(current)

    def restarts(job: str, user: str) -> float | None:
        labels = {"job_id": job, "reason": "worker_failed", "user": user}
        return registry.get_sample_value("nodeagent_restarts_total", labels)

    assert (restarts("eval", "alice"), restarts("tune", "bob")) == (1, 1)
    assert current.users() == {"eval": "alice", "tune": "bob"}
    current.drop("eval")
    assert (restarts("eval", "alice"), restarts("tune", "bob")) == (None, 1)
