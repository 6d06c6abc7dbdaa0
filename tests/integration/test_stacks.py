"""`nodeagentctl stacks JOB`: a live job's stacks, every rank's, each dumped by py-spy on its
node by the agent that started it (GET /stacks/JOB, handed off by the metrics server to a thread
of its own), with real agents and real Python workers; the route's request parsing as a table.
Who may ask under pool.auth: munge is tested with real users in test_pool_auth.py."""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from nodeagent.telemetry.stacks import JobHere, RankHere, StacksRequest, StacksRoute, parse
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)

# A loop a user would read in a stack: its step function is in every rank's dump.
TRAINER = """
import os, time
def train_step(step):
    time.sleep(0.05)
    return step + 1
def main():
    print(f"rank {os.environ['RANK']} up", flush=True)
    step = 0
    while True:
        step = train_step(step)
main()
"""


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        yield cluster


def test_every_rank_s_stack_shows_its_training_loop(pool: PoolCluster) -> None:
    script = pool.directory / "trainer.py"
    script.write_text(TRAINER)
    pool.start("a", "b")
    pool.wait_nodes(2)
    submitted = pool.ctl(
        "submit", "--name", "loop", "--nodes", "2", "--nproc-per-node", "2",
        "--", sys.executable, str(script),
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    pool.wait_job("loop", "running", world=4)

    def every_rank() -> dict[str, object] | None:
        taken = pool.ctl("stacks", "loop", "--json")
        doc: dict[str, object] = json.loads(taken.stdout) if taken.returncode == 0 else {}
        ranks = doc.get("ranks", [])
        return doc if isinstance(ranks, list) and len(ranks) == 4 else None

    doc = wait_for(every_rank, 60, "four ranks' stacks")
    ranks = doc["ranks"]
    assert isinstance(ranks, list)
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert {r["node"] for r in ranks} == {"a", "b"}
    for rank in ranks:
        assert rank["error"] == "" and "train_step" in rank["stacks"], rank
        assert "main" in rank["stacks"] and str(script) in rank["stacks"]
    assert doc["unreachable"] == []

    one = pool.ctl("stacks", "loop", "--rank", "3")
    assert one.returncode == 0, one.stderr
    headers = [line for line in one.stdout.splitlines() if line.startswith("=== rank")]
    assert len(headers) == 1 and headers[0].startswith("=== rank 3 on ")
    assert "train_step" in one.stdout

    native = pool.ctl("stacks", "loop", "--rank", "0", "--native")
    assert native.returncode == 0 and "train_step" in native.stdout, native

    out_of_range = pool.ctl("stacks", "loop", "--rank", "9")
    assert out_of_range.returncode == 2 and "rank 9 is out of range" in out_of_range.stderr
    ghost = pool.ctl("stacks", "ghost")
    assert ghost.returncode == 3 and "no such job 'ghost'" in ghost.stderr
    assert pool.ctl("cancel", "loop").returncode == 0


class _Slow:
    """A dump that waits until it is let go: the metrics must be served meanwhile."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.asked: list[tuple[int, bool]] = []

    def __call__(self, pid: int, native: bool) -> str:
        self.asked.append((pid, native))
        self.go.wait(30)
        return f"Thread {pid}: train_step\n"


def test_a_dump_in_progress_does_not_hold_the_scrapes() -> None:
    from prometheus_client import CollectorRegistry

    from nodeagent.telemetry.httpd import SlowRoutes
    from nodeagent.telemetry.metrics import MetricsServer

    dump = _Slow()
    jobs = {"j": JobHere(1000, (RankHere(0, 11), RankHere(1, 12)), dump)}
    route = StacksRoute("n1", jobs.get)
    server = MetricsServer(
        "127.0.0.1:0",
        CollectorRegistry(),
        lambda: (True, "ok"),
        handoff=SlowRoutes({"/stacks/": route}),
    )
    server.start()
    try:
        got: list[bytes] = []
        asking = threading.Thread(
            target=lambda: got.append(
                urllib.request.urlopen(f"http://{server.address}/stacks/j", timeout=30).read()
            )
        )
        asking.start()
        wait_for(lambda: len(dump.asked) == 2, 10, "both ranks' dumps begun")
        with urllib.request.urlopen(f"http://{server.address}/healthz", timeout=5) as r:
            assert r.read() == b"ok\n"  # answered while both dumps wait
        dump.go.set()
        asking.join(30)
        body = json.loads(got[0])
        assert body["node"] == "n1"
        assert [(r["rank"], r["pid"]) for r in body["ranks"]] == [(0, 11), (1, 12)]
        assert sorted(dump.asked) == [(11, False), (12, False)]
    finally:
        dump.go.set()
        server.stop()


def test_a_rank_of_no_job_here_and_a_failed_dump_are_said() -> None:
    def failing(pid: int, native: bool) -> str:
        raise OSError("py-spy: Failed to find python version from target process")

    route = StacksRoute("n1", {"j": JobHere(1000, (RankHere(4, 40),), failing)}.get)
    status, body, _ = route("/stacks/j")
    assert status == 200
    assert json.loads(body)["ranks"] == [
        {"rank": 4, "pid": 40, "error": "py-spy: Failed to find python version from target process"}
    ]
    assert route("/stacks/j?rank=5")[:2] == (404, b"node n1 runs no rank 5 of job j\n")
    assert route("/stacks/other")[:2] == (404, b"node n1 runs no job other\n")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/stacks/j", StacksRequest("j")),
        ("/stacks/j?rank=3&native=1", StacksRequest("j", 3, True)),
        ("/stacks/j?as_uid=1001", StacksRequest("j", as_uid=1001)),
        ("/stacks/../etc", "expected /stacks/JOB with a valid job id"),
        ("/stacks/j/0", "expected /stacks/JOB with a valid job id"),
        ("/stacks/j?pid=1", "bad parameter 'pid=1': expected rank=R, native=1, as_uid=U"),
        ("/stacks/j?rank=-1", "bad parameter 'rank=-1': expected rank=R, native=1, as_uid=U"),
        ("/stacks/j?rank=1&rank=2", "bad parameter 'rank=2': expected rank=R, native=1, as_uid=U"),
        ("/stacks/j?credential=x", "bad credential: expected a MUNGE credential or an API token's"),
    ],
)
def test_parse(target: str, expected: StacksRequest | str) -> None:
    assert parse(target) == expected
    if isinstance(expected, StacksRequest):
        assert parse(expected.target) == expected
