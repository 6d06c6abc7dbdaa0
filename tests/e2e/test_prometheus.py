"""A real Prometheus scraping real agents: restarts are counted, every dashboard query works."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, free_port, local_cluster, wait_for

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "nodeagent-dashboard.json"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


class Prometheus:
    def __init__(self, directory: Path, targets: list[str]) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is missing: apt-get install prometheus (.ci/setup does)")
        self.port = free_port()
        shutil.copy(ROOT / "config" / "prometheus" / "nodeagent-alerts.yml", directory)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(directory / "nodeagent-alerts.yml")],
            "scrape_configs": [{"job_name": "nodeagent", "static_configs": [{"targets": targets}]}],
        }
        (directory / "prometheus.yml").write_text(json.dumps(config))
        with (directory / "prometheus.log").open("w") as log:
            self.proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={directory / 'prometheus.yml'}",
                    f"--storage.tsdb.path={directory / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    def query(self, expr: str) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as err:  # a bad query answers 400 with the reason
            body = err.read()
            try:
                return dict(json.loads(body))
            except ValueError:  # still starting: a plain-text 503
                return {"status": "starting", "error": body.decode(errors="replace")}
        except OSError as err:
            return {"status": "unreachable", "error": str(err)}

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)


@pytest.fixture
def setup(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> Iterator[tuple[LocalCluster, Prometheus]]:
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        max_nodes=3,
        timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
    ) as cluster:
        cluster.start("a", "b", "c")
        cluster.wait_running(3)

        def all_targets() -> list[str] | None:
            found = [n["metrics"] for n in cluster.status()["nodes"] if n["metrics"]]
            return found if len(found) == 3 else None

        targets = wait_for(all_targets, 20, "every agent's metrics address")
        prometheus = Prometheus(tmp_path, targets)
        try:
            yield cluster, prometheus
        finally:
            prometheus.stop()


def values(result: dict[str, Any]) -> list[float]:
    return [float(r["value"][1]) for r in result.get("data", {}).get("result", [])]


def dashboard_queries(job: str, pool: str = "default") -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    variables = {"$job_id": job, "$pool": pool, "$__rate_interval": "10s"}
    queries = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):  # a row has none
            expr = target["expr"]
            for name, value in variables.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


def test_restarts_counted_and_dashboard_queries_answer(
    setup: tuple[LocalCluster, Prometheus],
) -> None:
    cluster, prometheus = setup

    def all_up() -> bool:
        return values(prometheus.query('up{job="nodeagent"}')) == [1.0, 1.0, 1.0]

    wait_for(all_up, 60, "Prometheus to scrape all three agents")
    before = cluster.status()["generation"]
    os.kill(cluster.worker_pids("b")[0], signal.SIGKILL)
    cluster.wait_running(3, after_generation=before)
    restarts = 'max(nodeagent_restarts_total{reason="worker_failed", job_id="JOB"})'.replace(
        "JOB", cluster.job
    )
    wait_for(lambda: values(prometheus.query(restarts)) == [1.0], 30, "restarts_total to reach 1")
    wait_for(
        lambda: (
            values(
                prometheus.query(f'max(nodeagent_recovery_seconds_count{{job_id="{cluster.job}"}})')
            )
            == [1.0]
        ),
        30,
        "recovery",
    )
    # the leader accounts the job's goodput at each new generation (and every 30 s)
    ettr = f'max(nodeagent_job_effective_training_ratio{{job_id="{cluster.job}"}})'
    wait_for(lambda: values(prometheus.query(ettr)), 30, "the goodput after the re-form")
    expected_empty = {"GPU health", "GPU temperatures", "GPU XIDs"}  # no GPUs on this machine
    for title, expr in dashboard_queries(cluster.job):
        result = prometheus.query(expr)
        assert result["status"] == "success", (title, expr, result)
        rows = result["data"]["result"]
        if title in expected_empty:
            assert rows == [], (title, rows)
        else:
            assert rows, f"panel {title!r}: {expr} returned no data"
