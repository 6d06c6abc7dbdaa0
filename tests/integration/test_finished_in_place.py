"""Issues 52 and 62: a job whose ranks all reached their end is never started again because
one of them died in its exit. Seen: after every rank printed its last step, a worker kept
through a re-form died with SIGABRT at exit ("terminate called without an active exception");
the agent counted worker_failed and started a new generation that trained from step 0.

Real agents, a real redis-server, real gloo training (tests/helpers/elastic_worker.py), whose
rank 1 aborts after its training returned; and a restart-mode job, whose worker says its end
through its progress file (tests/helpers/ends_then_aborts.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import RedisServer, local_cluster, wait_for
from tests.helpers.inplace import Lines

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(240)
SCRIPT = Path(__file__).resolve().parents[1] / "helpers" / "elastic_worker.py"
TIMING = {"heartbeat_interval": "250ms", "lease_ttl": "3s", "stop_grace_period": "5s"}


def assert_one_abort_counted_finished(events: list[dict[str, Any]], generation: int) -> None:
    """No worker failed: in the job's last generation, one rank's SIGABRT at exit, counted as
    finished. (An earlier generation's workers may have been stopped by SIGTERM when the second
    node joined a generation the first formed alone.)"""
    assert not [e for e in events if e["type"] == "worker_failed"], events
    last = [e for e in events if e["generation"] == generation]
    (aborted,) = [e for e in last if e["type"] == "worker_exited" and e["data"]["signal"]]
    assert aborted["data"]["signal"] == "SIGABRT" and aborted["data"]["finished"], aborted
    assert "after it finished" in aborted["message"]


def test_a_rank_that_aborts_after_it_finished_does_not_start_the_job_again(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        max_nodes=2,
        max_restarts=3,
        timing=TIMING,
        entrypoint=[sys.executable, str(SCRIPT)],
        job_options={
            "recovery": "in_place",
            "env": {"RECORD_DIR": str(tmp_path / "records"), "ABORT_AT_EXIT_RANK": "1"},
        },
    ) as cluster:
        lines = Lines(cluster.records_dir)
        cluster.start("a", "b")
        generation = int(cluster.wait_running(2, 90)["generation"])

        def stepping() -> bool:
            return {x["rank"] for x in lines.all("step") if x["gen"] == generation} == {0, 1}

        wait_for(stepping, 90, "both ranks stepping")
        stop_at = max(line["step"] for line in lines.all("step")) + 5
        (cluster.records_dir / "stop").write_text(str(stop_at))
        done = cluster.wait_status(lambda d: d["state"] != "running", 60, "the job to end")
        assert done["state"] == "succeeded", done
        assert done["generation"] == generation  # never started again
        assert sorted((x["rank"], x["step"]) for x in lines.all("final")) == [
            (0, stop_at),
            (1, stop_at),
        ]
        assert_one_abort_counted_finished(cluster.events(), generation)


def test_a_restart_mode_rank_that_aborts_after_it_finished_is_not_charged(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """Issue 62: a Trainer run logged its last step on every rank, then one rank died at exit
    (SIGABRT): the agent charged a restart and started another generation. A worker of a
    restart-mode job says its end through its progress file (progress.finished(), which the
    integrations call): the abort after it is counted as finished, the job succeeds in its
    generation, with no restart used."""
    records = tmp_path / "records"
    records.mkdir()
    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        max_nodes=2,
        max_restarts=3,
        timing=TIMING,
        entrypoint=[sys.executable, str(SCRIPT.parent / "ends_then_aborts.py")],
        job_options={"env": {"RECORD_DIR": str(records), "ABORT_AT_EXIT_RANK": "1"}},
    ) as cluster:
        cluster.start("a", "b")
        ended = ("succeeded", "failed")
        done = cluster.wait_status(lambda d: d["state"] in ended, 120, "the job to end")
        assert done["state"] == "succeeded", done
        finals = [json.loads(x) for x in (records / "records.jsonl").read_text().splitlines()]
        assert sorted((x["rank"], x["gen"]) for x in finals) == [
            (0, done["generation"]),
            (1, done["generation"]),
        ]
        assert_one_abort_counted_finished(cluster.events(), int(done["generation"]))
