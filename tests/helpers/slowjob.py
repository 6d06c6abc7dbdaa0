"""The slow-node job of tests/e2e/test_slow_node.py and bench/slow_node.py: four agents in place
(target 3: one stands by), tests/helpers/elastic_worker.py doing CPU work each step (a DDP model
and an FSDP2-sharded layer), and the job's slow_node policy."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.helpers.cluster import LocalCluster, local_cluster

SCRIPT = Path(__file__).resolve().parent / "elastic_worker.py"
NODES = ("a", "b", "c", "d")


def workload_env(records: Path) -> dict[str, str]:
    """30 matrix products a step, no pause, an FSDP2-sharded layer beside the DDP model."""
    return {
        "RECORD_DIR": str(records),
        "PYTHONUNBUFFERED": "1",
        "WORK": "30",
        "STEP_TIME_S": "0",
        "SHARDED": "1",
    }


@contextlib.contextmanager
def slow_node_job(
    redis_url: str, directory: Path, job: str, policy: str, window_s: float, windows: int
) -> Iterator[LocalCluster]:
    """The cluster, not started yet."""
    with local_cluster(
        redis_url,
        directory,
        job=job,
        max_nodes=len(NODES),
        target_nodes=len(NODES) - 1,
        max_restarts=5,
        timing={
            "heartbeat_interval": "250ms",
            "lease_ttl": "6s",  # its fence point outlasts a loaded machine's stall (test_in_place)
            "stop_grace_period": "5s",
            "reform_timeout": "30s",
        },
        entrypoint=[sys.executable, str(SCRIPT)],
        job_options={
            "recovery": "in_place",
            "env": workload_env(directory / "records"),
            "slow_node": {"policy": policy, "window": f"{window_s:g}s", "windows": windows},
        },
    ) as cluster:
        yield cluster
