"""A script failing at import: the leader spaces the restarts by the crash-loop backoff."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cluster import LocalCluster, RedisServer


def test_a_crash_loop_waits_longer_before_each_generation(
    redis_server: RedisServer, workdir: Path, job_id: str
) -> None:
    script = workdir / "broken.py"
    script.write_text("import no_such_module_nodeagent_test\n")
    cluster = LocalCluster(
        redis_server.url,
        workdir,
        job=job_id,
        max_nodes=1,
        max_restarts=3,
        entrypoint=["python", str(script)],
        timing={"restart_backoff": "500ms", "restart_backoff_max": "1s"},
    )
    try:
        cluster.start("a")
        doc = cluster.wait_status(lambda d: d["state"] == "failed", 60, "the job to fail")
    finally:
        cluster.stop()
    # 3 restarts used, then the 4th failure ends it: the count is the restarts, as the
    # job_failed event says (it used to count the failure that was not restarted too).
    assert doc["restart_count"] == 3, cluster.diagnostics()
    assert doc["detail"].endswith("3 restarts used"), doc["detail"]
    events = cluster.events()
    announced = {e["generation"]: e["at_ms"] for e in events if e["type"] == "generation_announced"}
    started = {e["generation"]: e["at_ms"] for e in events if e["type"] == "generation_started"}
    waits = [e["message"] for e in events if e["type"] == "restart_backoff"]
    # Failures 2 and 3 in a row wait 0.5 s and 1 s; the 4th exhausts max_restarts (no wait).
    assert [w.rsplit("waiting ", 1)[1].split(" before")[0] for w in waits] == ["0.5s", "1s"], waits
    restarted = sorted(g for g in started if g in announced)[-3:]
    gaps = [started[g] - announced[g] for g in restarted]
    # The backoff counts from the generation's since_ms, the server time of the leader's read;
    # its announcement is appended by the write after it, a few ms later: allow 20 ms of that.
    assert gaps[1] >= 480 and gaps[2] >= 980, (gaps, cluster.diagnostics())
