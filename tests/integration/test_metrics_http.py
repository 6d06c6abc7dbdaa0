"""/metrics and /healthz of real agents, scraped over HTTP as Prometheus would."""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for

TIMING = {"heartbeat_interval": "200ms", "lease_ttl": "1s"}


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def healthz(address: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def addresses(cluster: LocalCluster) -> dict[str, str]:
    return {n["name"]: n["metrics"] for n in cluster.status()["nodes"] if n["metrics"]}


def test_scrape_counts_a_restart(redis_server: RedisServer, job_id: str, tmp_path: Path) -> None:
    with local_cluster(
        redis_server.url, tmp_path, job=job_id, max_nodes=2, timing=TIMING
    ) as cluster:
        cluster.start("a", "b")
        before = cluster.wait_running(2)

        def both() -> dict[str, str] | None:
            found = addresses(cluster)
            return found if len(found) == 2 else None

        where = wait_for(both, 10, "both metrics addresses")
        samples = scrape(where["a"])
        job = {"job_id": cluster.job}
        assert sample(samples, "nodeagent_generation", **job) == before["generation"]
        assert sample(samples, "nodeagent_world_size", **job) == 2
        assert sample(samples, "nodeagent_node_state", nodeagent_node_state="running", **job) == 1
        assert sample(samples, "nodeagent_workers", state="running", **job) == 1
        assert sample(samples, "nodeagent_gpu_monitoring_available", **job) == 0  # no driver here
        assert healthz(where["a"])[0] == 200
        os.kill(cluster.worker_pids("b")[0], signal.SIGKILL)
        cluster.wait_running(2, after_generation=before["generation"])
        for name in ("a", "b"):

            def restarted(node: str = name) -> float | None:
                return sample(
                    scrape(where[node]), "nodeagent_restarts_total", reason="worker_failed", **job
                )

            assert wait_for(restarted, 10, f"{name} to count the restart") == 1
        assert (
            sample(scrape(where["b"]), "nodeagent_worker_failures_total", kind="signal", **job) == 1
        )
        assert sample(scrape(where["a"]), "nodeagent_recovery_seconds_count", **job) == 1


def test_healthz_fails_without_redis(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    server.start()
    try:
        with local_cluster(
            server.url, tmp_path, job="healthz", max_nodes=1, timing=TIMING
        ) as cluster:
            cluster.start("a")
            cluster.wait_running(1)
            where = wait_for(lambda: addresses(cluster).get("a"), 10, "address")
            assert healthz(where)[0] == 200
            server.stop()

            def unhealthy() -> str | None:
                code, reason = healthz(where)
                return reason if code == 503 else None

            assert "no lease renewal" in wait_for(unhealthy, 10, "/healthz to answer 503")
    finally:
        server.stop()
