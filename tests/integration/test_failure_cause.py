"""A rank's root cause reaches the job's failure, its status and its events, as torchrun
prints it: the exception a `@record`-decorated main raised, or an early crash's last lines."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster

RECORDED = textwrap.dedent(
    """
    from torch.distributed.elastic.multiprocessing.errors import record

    @record
    def main() -> None:
        raise ValueError("bad batch size 0")

    main()
    """
)


@contextmanager
def failing(
    redis_server: RedisServer, workdir: Path, job_id: str, script: str, max_restarts: int
) -> Iterator[tuple[LocalCluster, dict[str, Any]]]:
    """One agent runs `script` until the job fails; the cluster and its failed status."""
    (workdir / "train.py").write_text(script)
    with local_cluster(
        redis_server.url,
        workdir,
        job=job_id,
        max_nodes=1,
        max_restarts=max_restarts,
        entrypoint=[sys.executable, str(workdir / "train.py")],
    ) as cluster:
        cluster.start("a")
        yield cluster, cluster.wait_status(lambda d: d["state"] == "failed", 60, "the job to fail")


@pytest.mark.parametrize(
    ("script", "cause"),
    [
        (RECORDED, "ValueError: bad batch size 0"),
        ("print('args')\nimport no_such_module_x7\n", "No module named 'no_such_module_x7'"),
    ],
    ids=["record", "import-error"],
)
def test_the_failing_ranks_cause_is_in_status_and_events(
    redis_server: RedisServer, workdir: Path, job_id: str, script: str, cause: str
) -> None:
    pytest.importorskip("torch")
    with failing(redis_server, workdir, job_id, script, max_restarts=0) as (cluster, doc):
        assert cause in doc["detail"] and "rank-0.log" in doc["detail"]
        failed = [e for e in cluster.events() if e["type"] == "worker_failed"]
        assert failed and cause in failed[0]["message"]


def test_a_failure_that_repeats_says_so_in_status_and_events(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    """The script fails the same way at every start (a world size it fixed, say): the job's
    failure, once its restart is spent, says the error repeats."""
    script = "import sys\nprint('setting up')\nsys.exit('ValueError: the product (1 * 3)')\n"
    with failing(redis_server, workdir, job_id, script, max_restarts=1) as (cluster, doc):
        assert "the same error as the failure before it" in doc["detail"], doc["detail"]
        announced = [e for e in cluster.events() if e["type"] == "generation_announced"]
        assert any("the same error" in e["message"] for e in announced[1:]), announced
