"""A job's life in the pool with real agents and a real redis-server: ids made for it, an id
used again once its job has ended, ended jobs pruned after pool.keep_ended."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import WORKER, RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster, pool_keys

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


def job_keys(redis_server: RedisServer, job: str) -> list[str]:
    client = redis_server.client()
    try:
        return sorted(client.scan_iter(match=f"nodeagent:{{{job}}}:*"))
    finally:
        client.close()


def succeeded(pool: PoolCluster, name: str) -> dict[str, Any]:
    """Run job `name` on one node until every worker exits 0; its row while it ran."""
    pool.submit(name, "1")
    formed = pool.wait_job(name, "running", world=1)
    (pool.job_records(name) / f"exit-{formed['generation']}").write_text("0")
    pool.wait_job(name, "succeeded")
    (pool.job_records(name) / f"exit-{formed['generation']}").unlink()
    return formed


def events(pool: PoolCluster, job: str) -> str:
    result = pool.ctl("--job", job, "events", "--json")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_submission_without_a_name_gets_an_id_and_parsable_prints_only_it(
    pool: PoolCluster,
) -> None:
    pool.start("a")
    pool.wait_nodes(1)
    records = pool.job_records("anon")
    command = ("--nodes", "1", "--env", f"RECORD_DIR={records}", "--", sys.executable, str(WORKER))
    said = pool.ctl("submit", *command)
    assert said.returncode == 0, said.stderr
    words = said.stdout.split()
    assert words[:2] == ["Submitted", "job"] and words[2].startswith("job-"), said.stdout
    first = words[2]
    pool.wait_job(first, "running", world=1)
    quiet = pool.ctl("submit", "--parsable", *command)
    assert quiet.returncode == 0, quiet.stderr
    second = quiet.stdout.strip()
    assert second.startswith("job-") and second != first and "\n" not in second
    assert pool.jobs()[second]["state"] == "pending"


def test_an_id_is_used_again_once_its_job_has_ended(
    pool: PoolCluster, redis_server: RedisServer, job_id: str
) -> None:
    name = f"{job_id}-again"[:63]
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(f"{name}-x", "1")
    pool.wait_job(f"{name}-x", "running", world=1)
    before = pool_keys(redis_server, pool.pool)
    refused = pool.ctl("submit", "--name", f"{name}-x", "--nodes", "1", "--", "true")
    assert refused.returncode == 2, refused.stderr
    assert f"job {name}-x exists in pool {pool.pool} and has not ended (running)" in refused.stderr
    assert pool_keys(redis_server, pool.pool) == before  # nothing changed
    assert pool.ctl("cancel", f"{name}-x").returncode == 0
    pool.wait_job(f"{name}-x", "cancelled")
    first = succeeded(pool, name)
    wait_for(lambda: "job_succeeded" in events(pool, name), 10, "the job's own end event")
    pool.submit(name, "1")
    # The new job forms anew (its own record, not the ended one's) and runs.
    again = pool.wait_job(name, "running", world=1)
    starts = [
        json.loads(line)
        for line in (pool.job_records(name) / "records.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "start"
    ]
    assert len(starts) == 2, starts  # one worker per run
    assert again["restarts"] == 0
    history = pool_keys(redis_server, pool.pool)["history"]
    assert sorted(history) == [f"{name}:{first['seq']}"]
    assert json.loads(history[f"{name}:{first['seq']}"])["status"]["state"] == "succeeded"
    assert "job_succeeded" not in events(pool, name)  # the ended job's went with its keys


def test_ended_jobs_are_pruned_after_keep_ended_with_their_keys(
    pool: PoolCluster, redis_server: RedisServer, job_id: str
) -> None:
    name, reused = f"{job_id}-pruned"[:63], f"{job_id}-reused"[:63]
    pool.scheduling = {"keep_ended": "4s"}
    pool.start("a")
    pool.wait_nodes(1)
    succeeded(pool, name)
    assert any(key.endswith(":job") for key in job_keys(redis_server, name))  # its record
    succeeded(pool, reused)
    pool.submit(reused, "2")  # again, to wait (one node): the first one goes to the history
    assert list(pool_keys(redis_server, pool.pool)["history"]) == [f"{reused}:2"]
    wait_for(lambda: name not in pool.jobs(), 30, f"job {name} pruned (keep_ended 4s)")
    state = pool_keys(redis_server, pool.pool)
    assert name not in state["specs"] and name not in state["jobs"]
    assert not job_keys(redis_server, name)  # its own keys went first
    wait_for(lambda: not pool_keys(redis_server, pool.pool)["history"], 30, "the history pruned")
    assert pool.jobs()[reused]["state"] == "pending"  # the job of the reused id stays


def test_a_time_limit_sends_its_signal_then_ends_the_job_as_timeout(
    pool: PoolCluster, job_id: str
) -> None:
    name = f"{job_id}-limited"[:63]
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit(name, "2", "--time", "16s", "--signal", "USR1@8s")
    pool.wait_job(name, "running", world=2)
    row = pool.wait_job(name, "timeout", timeout=60)
    assert row["reason"] == "time limit of 16s reached", row
    lines = (pool.job_records(name) / "records.jsonl").read_text().splitlines()
    life: dict[int, list[str]] = {}
    for entry in map(json.loads, lines):
        life.setdefault(entry["pid"], []).append(entry["event"])
    assert sorted(life.values()) == [["start", "signal", "stop"]] * 2, life  # warned, then TERM
    wait_for(lambda: not any(pool.placements().values()), 10, "its nodes back in the pool")
    assert pool.jobs()[name]["state"] == "timeout"  # not failed, not cancelled


def test_hold_keeps_a_pending_job_out_until_release_and_refusals_change_nothing(
    pool: PoolCluster, redis_server: RedisServer, job_id: str
) -> None:
    name, other = f"{job_id}-held"[:63], f"{job_id}-run"[:63]
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(name, "1", "--hold")
    wait_for(lambda: "held by" in pool.jobs()[name]["reason"], 15, "the hold said")
    pool.submit(other, "1")  # behind it, not held back by it
    pool.wait_job(other, "running", world=1)
    assert pool.jobs()[name]["state"] == "pending"
    before = pool_keys(redis_server, pool.pool)
    refusals = [
        (("hold", other), 2, f"job {other} is running: hold keeps a pending job"),
        (("hold", name), 2, f"job {name} is held already"),
        (("requeue", name), 2, f"job {name} is pending: it is in the queue already"),
        (("hold", "ghost"), 3, "no job 'ghost' in pool"),  # 3: no such job
        (("release", other), 2, f"job {other} is not held"),
    ]
    for args, code, message in refusals:
        refused = pool.ctl(*args)
        assert (refused.returncode, refused.stdout) == (code, ""), (args, refused.stderr)
        assert message in refused.stderr, (args, refused.stderr)
    assert pool_keys(redis_server, pool.pool) == before  # nothing changed
    assert pool.ctl("cancel", other).returncode == 0
    pool.wait_job(other, "cancelled")
    assert pool.jobs()[name]["state"] == "pending"  # a free node, but held
    released = pool.ctl("release", name)
    assert released.returncode == 0 and "released" in released.stdout, released.stderr
    pool.wait_job(name, "running", world=1)


CHECKPOINTING = """
import json, os, signal, time
from pathlib import Path
from nodeagent.worker import beat

records = Path(os.environ["RECORD_DIR"])
checkpoint = records / f"step-{os.environ['RANK']}"
step = int(checkpoint.read_text()) if checkpoint.exists() else 0
generation = int(os.environ["NODEAGENT_GENERATION"])

def log(**fields):
    line = json.dumps({"rank": int(os.environ["RANK"]), "gen": generation, **fields})
    with open(records / "steps.jsonl", "a") as out:
        out.write(line + "\\n")

stopping = False
def on_term(signum, frame):
    global stopping
    stopping = True

signal.signal(signal.SIGTERM, on_term)
log(event="resumed", step=step)
while not stopping:
    step += 1
    beat(step)
    time.sleep(0.02)
checkpoint.write_text(str(step))
log(event="saved", step=step)
"""


def test_requeue_checkpoints_and_runs_the_job_again_in_its_place_under_its_id(
    pool: PoolCluster, job_id: str
) -> None:
    name, behind = f"{job_id}-rq"[:63], f"{job_id}-behind"[:63]
    script = pool.directory / "checkpointing.py"
    script.write_text(CHECKPOINTING)
    records = pool.job_records(name)
    pool.start("a", "b")
    pool.wait_nodes(2)
    submitted = pool.ctl(
        *("submit", "--parsable", "--name", name, "--nodes", "2"),
        *("--env", f"RECORD_DIR={records}", "--", sys.executable, str(script)),
    )
    assert submitted.returncode == 0, submitted.stderr
    first = pool.wait_job(name, "running", world=2)
    pool.submit(behind, "2")  # waits behind it for the same two nodes

    def steps() -> list[dict[str, Any]]:
        path = records / "steps.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    wait_for(lambda: len(steps()) == 2, 30, "both ranks running")
    requeued = pool.ctl("requeue", name)
    assert requeued.returncode == 0 and "requeue requested" in requeued.stdout, requeued.stderr
    again = pool.wait_job(name, "running", world=2, timeout=60, after=first["generation"])
    assert again["seq"] == first["seq"]
    assert pool.jobs()[behind]["state"] == "pending"  # it kept its place ahead
    wait_for(lambda: len(steps()) == 6, 30, "both ranks resumed")
    saved = {s["rank"]: s["step"] for s in steps() if s["event"] == "saved"}
    resumed = {s["rank"]: s["step"] for s in steps()[4:] if s["event"] == "resumed"}
    assert len(saved) == 2 and resumed == saved and min(saved.values()) > 0, steps()
    restarts = pool.jobs()[name]["restarts"]
    assert restarts == 0  # a requeue is not a failure: no restart charged
    # Where its time went: pending again after the requeue is queued, not a re-form's.
    listed = pool.ctl("events", "--pool", "--json", "--last", "1000").stdout.splitlines()
    mine = [e for e in map(json.loads, listed) if e["data"].get("job") == name]
    requeued_at = next(e["at_ms"] for e in mine if e["type"] == "job_requeued")
    admitted_at = [e["at_ms"] for e in mine if e["type"] == "job_admitted"][-1]
    pending = (admitted_at - requeued_at) / 1000
    shown = json.loads(pool.ctl("show", name, "--json").stdout)["goodput"]
    assert shown["parts"]["queued"] >= pending > 0, (pending, shown)
    assert sum(shown["parts"].values()) == pytest.approx(shown["wall_s"], abs=0.01)


def test_submit_wait_returns_with_the_job_s_exit_code_and_wait_running_once_it_runs(
    pool: PoolCluster, job_id: str
) -> None:
    pool.start("a")
    pool.wait_nodes(1)

    def submit(name: str, *more: str) -> subprocess.CompletedProcess[str]:
        records = pool.job_records(name)
        return pool.ctl(
            *("submit", "--name", name, "--nodes", "1", "--max-restarts", "0", *more),
            *("--env", f"RECORD_DIR={records}", "--", sys.executable, str(WORKER)),
        )

    ok, failing = f"{job_id}-ok"[:63], f"{job_id}-three"[:63]
    (pool.job_records(ok) / "exit-1").write_text("0")
    done = submit(ok, "--wait")
    assert done.returncode == 0, done.stderr
    assert f"job {ok} succeeded" in done.stdout and "(exit code 0)" in done.stdout
    (pool.job_records(failing) / "exit-1").write_text("3")
    failed = submit(failing, "--wait")
    assert failed.returncode == 3, (failed.stdout, failed.stderr)  # its rank's exit code
    assert f"job {failing} failed" in failed.stdout
    runs, big = f"{job_id}-runs"[:63], f"{job_id}-big"[:63]
    running = submit(runs, "--wait-running")
    assert running.returncode == 0 and "runs: 1 ranks on 1 nodes" in running.stdout, running
    with ThreadPoolExecutor(1) as waiter:
        cancelled = waiter.submit(submit, big, "--wait")  # pending: the node is taken
        wait_for(lambda: big in pool.jobs(), 20, f"job {big} submitted")
        assert pool.ctl("cancel", big).returncode == 0
        result = cancelled.result(timeout=50)
    assert result.returncode == 1 and f"job {big} cancelled" in result.stdout, result
    timed = submit(f"{job_id}-late"[:63], "--wait", "--timeout", "2s")
    assert timed.returncode == 1 and "has not ended" in timed.stderr, timed
    both = submit(f"{job_id}-both"[:63], "--wait", "--wait-running")
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_show_and_history_account_for_a_job_s_runs(pool: PoolCluster, job_id: str) -> None:
    name, failing = f"{job_id}-acct"[:63], f"{job_id}-fails"[:63]
    pool.start("a", "b")
    pool.wait_nodes(2)
    pool.submit(name, "2", "--time", "1h", "--priority", "3")
    first = pool.wait_job(name, "running", world=2)
    (pool.job_records(name) / f"exit-{first['generation']}").write_text("1")  # a failure
    again = pool.wait_job(name, "running", timeout=60, after=first["generation"])
    shown = json.loads(pool.ctl("show", name, "--json").stdout)
    assert shown["version"] == 1 and shown["state"] == "running"
    assert (shown["priority"], shown["time_limit"], shown["queue"]) == (3, "1h", "default")
    assert shown["command"] == [sys.executable, str(WORKER)]
    assert sorted(shown["placed"]) == ["a", "b"] and shown["exit_code"] is None
    assert shown["restarts_by_cause"] == {"worker_failed": 1}
    # where its time went: queued, then a first start, a re-form for the failure, adding up
    spent = shown["goodput"]
    assert [r["reason"] for r in spent["reforms"]] == ["worker_failed"]
    assert sum(spent["parts"].values()) == pytest.approx(spent["wall_s"], abs=0.01)
    assert [g["generation"] for g in shown["generations"]] == [1, again["generation"]]
    assert all(sorted(g["nodes"]) == ["a", "b"] for g in shown["generations"])
    for key in ("submitted", "started"):
        assert datetime.fromisoformat(shown[key]).tzinfo is not None  # RFC 3339
    (pool.job_records(name) / f"exit-{again['generation']}").write_text("0")
    pool.wait_job(name, "succeeded")
    pool.submit(failing, "1", "--max-restarts", "0")
    ran = pool.wait_job(failing, "running", world=1)
    (pool.job_records(failing) / f"exit-{ran['generation']}").write_text("4")
    pool.wait_job(failing, "failed")
    text = pool.ctl("show", name)
    assert text.returncode == 0 and "exit code:" in text.stdout and "GENERATION" in text.stdout

    def history(*more: str) -> list[dict[str, Any]]:
        result = pool.ctl("history", "--json", *more)
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["version"] == 1
        return list(doc["jobs"])

    rows = {r["job"]: r for r in history()}
    assert (rows[name]["exit_code"], rows[failing]["exit_code"]) == (0, 4)
    assert rows[name]["nodes"] == 2 and rows[name]["node_hours"] > 0
    assert rows[name]["elapsed_s"] > 0 and rows[name]["user"] == shown["user"]
    # accounted by the pool leader as each ended: training (no beats: all of it) over wall time
    assert all(0 < rows[job]["ettr"] < 1 for job in (name, failing))
    assert [r["job"] for r in history("--state", "failed")] == [failing]
    assert history("--user", "nobody-at-all") == []
    assert {r["job"] for r in history("--since", "1h")} == {name, failing}
    assert history("--since", "2999-01-01T00:00:00Z") == []
    table = pool.ctl("history").stdout.splitlines()
    assert table[0].split()[:3] == ["JOB", "USER", "STATE"] and len(table) == 3
    assert table[0].split()[-1] == "ETTR" and table[1].endswith("%")
    for bad, code, message in (
        (("show", "ghost"), 3, "no job 'ghost'"),
        (("history", "--since", "x"), 2, "--since"),
    ):
        refused = pool.ctl(*bad)
        assert refused.returncode == code and message in refused.stderr, refused


def test_every_verb_on_a_job_takes_it_as_an_argument_and_stop_names_the_pool_s_verbs(
    pool: PoolCluster, redis_server: RedisServer, job_id: str
) -> None:
    name = f"{job_id}-pos"[:63]
    pool.start("a")
    pool.wait_nodes(1)
    pool.submit(name, "1")
    first = pool.wait_job(name, "running", world=1)
    status = pool.ctl("status", name, "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["job"] == name, status.stderr
    assert json.loads(status.stdout)["pool"]["state"] == "running"
    assert json.loads(status.stdout)["version"] == 1
    events = pool.ctl("events", name, "--json")
    assert events.returncode == 0 and "generation_started" in events.stdout
    for line in events.stdout.splitlines():  # each with its time in RFC 3339
        assert datetime.fromisoformat(json.loads(line)["at"]).tzinfo is not None
    row = pool.jobs()[name]
    assert datetime.fromisoformat(row["started"]) >= datetime.fromisoformat(row["submitted"])
    same = pool.ctl("--job", name, "events", name)  # both, the same job: fine
    assert same.returncode == 0, same.stderr
    before = pool_keys(redis_server, pool.pool)
    stop = pool.ctl("stop", name)
    assert stop.returncode == 2, stop
    assert f"`nodeagentctl cancel {name}` ends it" in stop.stderr
    assert f"`nodeagentctl requeue {name}`" in stop.stderr
    assert pool_keys(redis_server, pool.pool) == before
    restart = pool.ctl("restart", name)
    assert restart.returncode == 0, restart.stderr
    pool.wait_job(name, "running", timeout=60, after=first["generation"])
