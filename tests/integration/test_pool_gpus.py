"""GPUs in the pool (issue 66), with real agents, a real redis-server and fake NVML nodes of 8
GPUs each: every node advertises its units (UUID, model, memory); a job that asks for GPUs
goes only where enough are offered, its workers see only theirs, `nodes` says who holds each,
and its accounting record counts GPU-hours by what it held."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.gpus import gpu
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)
MODEL, MEMORY = "NVIDIA H100 80GB HBM3", 81559


def eight_gpus(path: Path) -> dict[str, Any]:
    gpus = [{**gpu(i), "name": MODEL, "memory_mib": MEMORY} for i in range(8)]
    path.write_text(yaml.safe_dump({"gpus": gpus}))
    return {"health": {"gpu": "on", "interval": "100ms", "fake_gpus": str(path)}}


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        for node in "ab":
            cluster.node_options[node] = eight_gpus(tmp_path / f"gpus-{node}.yaml")
        yield cluster


def units(pool: PoolCluster) -> dict[str, list[dict[str, Any]]]:
    result = pool.ctl("nodes", "--json")
    assert result.returncode == 0, result.stderr
    return {row["name"]: row["gpus"] for row in json.loads(result.stdout)["nodes"]}


def every_node_offers(pool: PoolCluster, count: int) -> dict[str, list[dict[str, Any]]] | None:
    found = units(pool)
    return found if all(len(offered) == count for offered in found.values()) else None


def started(pool: PoolCluster, job: str, count: int) -> list[dict[str, Any]] | None:
    path = pool.job_records(job) / "records.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    found = [r for r in map(json.loads, filter(None, lines)) if r["event"] == "start"]
    return found if len(found) >= count else None


def test_nodes_advertise_their_gpus_and_a_job_holds_what_it_asked_for(
    pool: PoolCluster, job_id: str, tmp_path: Path
) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    offered = wait_for(lambda: every_node_offers(pool, 8), 30, "8 GPUs a node")
    assert offered["a"][3] == {
        "uuid": "GPU-fake-3",
        "model": MODEL,
        "memory_mib": MEMORY,
        "job": None,
    }

    pair = f"{job_id}-pair"[:63]
    pool.submit(pair, "1", "--nproc-per-node", "2", "--gpus-per-node", "2")
    row = pool.wait_job(pair, "running", world=2)
    node = next(n for n, j in pool.placements().items() if j == pair)
    starts = wait_for(lambda: started(pool, pair, 2), 30, "its workers' starts")
    assert sorted(s["cuda"] for s in starts) == ["GPU-fake-0", "GPU-fake-1"]  # each its own
    held = wait_for(
        lambda: [u["uuid"] for u in units(pool)[node] if u["job"] == pair] or None, 30, "holders"
    )
    assert held == ["GPU-fake-0", "GPU-fake-1"]
    table = pool.ctl("nodes", "--gpus")
    assert table.returncode == 0 and "GPU-fake-1" in table.stdout and pair in table.stdout
    assert "2/8" in pool.ctl("nodes").stdout

    big = f"{job_id}-big"[:63]
    pool.submit(big, "1", "--gpus-per-node", "16")
    says = "2 offer fewer than 16 GPUs"
    wait_for(lambda: says in pool.jobs()[big]["reason"], 30, "why it waits")

    (pool.job_records(pair) / f"exit-{row['generation']}").write_text("0")
    pool.wait_job(pair, "succeeded")
    database = tmp_path / "state" / "accounting.sqlite"

    def record() -> tuple[Any, ...] | None:
        query = "SELECT nodes, node_hours, gpu_hours, record FROM nodeagent_jobs WHERE job = ?"
        try:
            with sqlite3.connect(database) as db:
                found: tuple[Any, ...] | None = db.execute(query, (pair,)).fetchone()
                return found
        except sqlite3.OperationalError:  # no table yet
            return None

    nodes, node_hours, gpu_hours, kept = wait_for(record, 30, "its accounting record")
    assert (nodes, json.loads(kept)["gpus"]) == (1, 2)
    assert node_hours > 0 and gpu_hours == pytest.approx(2 * node_hours)
