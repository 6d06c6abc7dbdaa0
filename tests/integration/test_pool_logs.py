"""`nodeagentctl logs JOB` across the pool: a rank's log served by its node's agent (GET
/logs/JOB/RANK on the metrics server), with real agents that each keep their own log_dir; the
route's checks (no path out of log_dir, only jobs the node ran), table-tested on files."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import IO, Any

import pytest

from nodeagent.coord.client import connect
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.store import JobStore
from nodeagent.model.job import JobRecord
from nodeagent.telemetry.logserve import LogChunk, LogRequest, LogRoute, parse, read_from, read_tail
from nodeagent.telemetry.logserve import reachable as reachable_address
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster

pytestmark = pytest.mark.timeout(180)

# Prints 30 numbered lines, then each file say-<RANK>-<i> of RECORD_DIR as it appears.
WORKER = """
import os, pathlib, sys, time
rank, node = os.environ["RANK"], os.environ["NODEAGENT_NODE"]
gen = os.environ["NODEAGENT_GENERATION"]
for i in range(30):
    print(f"rank {rank} line {i} on {node} gen {gen}", flush=True)
said = 0
while True:
    path = pathlib.Path(os.environ["RECORD_DIR"]) / f"say-{rank}-{said}"
    if path.exists():
        print(path.read_text().strip(), flush=True)
        said += 1
    time.sleep(0.1)
"""


class OwnLogDirs(PoolCluster):
    """Every agent its own log_dir, as on separate machines: a log can only come from the
    agent of the node that ran the rank."""

    def config(
        self, name: str, job: dict[str, Any] | None = None, labels: dict[str, str] | None = None
    ) -> dict[str, Any]:
        config = super().config(name, job, labels)
        config["log_dir"] = str(self.log_dir(name))
        return config

    def log_dir(self, name: str) -> Path:
        return self.directory / "logs" / name


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[OwnLogDirs]:
    cluster = OwnLogDirs(redis_server.url, tmp_path, pool=job_id)
    try:
        yield cluster
    finally:
        cluster.stop()


def submit(pool: OwnLogDirs, job: str, nodes: str) -> None:
    script = pool.directory / "printer.py"
    script.write_text(WORKER)
    records = f"RECORD_DIR={pool.job_records(job)}"
    result = pool.ctl(
        "submit",
        "--name",
        job,
        "--nodes",
        nodes,
        "--env",
        records,
        "--",
        sys.executable,
        str(script),
    )
    assert result.returncode == 0, result.stderr


def record(redis_url: str, job: str) -> JobRecord:
    found = JobStore(connect(redis_url, 5.0), JobKeys("nodeagent", job)).snapshot().record
    assert found is not None
    return found


def agent_address(pool: OwnLogDirs, node: str) -> str:
    store = PoolStore(connect(pool.redis_url, 5.0), PoolKeys("nodeagent", pool.pool))
    address = store.read().nodes[node].metrics
    assert address is not None
    return address


def raw_get(address: str, target: str) -> tuple[int, bytes]:
    """One request sent as written: no client normalises the path."""
    host, _, port = address.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def tail_of(pool: OwnLogDirs, job: str, rank: int, count: int) -> list[str] | None:
    result = pool.ctl("logs", job, "--rank", str(rank), "--tail", str(count))
    lines = result.stdout.splitlines()
    return lines if result.returncode == 0 and len(lines) == count else None


def test_a_ranks_log_comes_from_its_nodes_agent(pool: OwnLogDirs) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    submit(pool, "printer", "2")
    pool.wait_job("printer", "running", world=2)
    running = record(pool.redis_url, "printer")
    (first, second), gen = running.members, running.generation
    lines = wait_for(lambda: tail_of(pool, "printer", 1, 5), 30, "rank 1's last lines")
    assert lines == [f"rank 1 line {i} on {second} gen {gen}" for i in range(25, 30)]
    # Only the second node has rank 1's log: the first node's agent could not have served it.
    assert (pool.log_dir(second) / "printer" / "rank-1.log").exists()
    assert not (pool.log_dir(first) / "printer" / "rank-1.log").exists()
    default = pool.ctl("logs", "printer", "--tail", "1")  # rank 0, on the first node
    assert default.stdout == f"rank 0 line 29 on {first} gen {gen}\n", default.stderr
    # Ask the first node's agent directly: it never ran rank 1.
    status, body = raw_get(agent_address(pool, first), "/logs/printer/1?tail=5")
    assert status == 404 and b"has no log of rank 1" in body
    status, body = raw_get(agent_address(pool, second), "/logs/printer/1?tail=2")
    got = json.loads(body)
    assert status == 200 and got["node"] == second and len(got["lines"]) == 2


@pytest.mark.parametrize(
    "target",
    [
        "/logs/../../etc/passwd",
        "/logs/printer/../../../etc/passwd",
        "/logs/..%2F..%2Fetc/0",
        "/logs/%2e%2e/0",
        "/logs/printer/0/../1",
        "/logs/printer/-1",
        "/logs/printer/1.log",
        "/logs/printer/0?generation=../1",
        "/logs/printer/0?tail=1&tail=2",
        "/logs/printer/0?path=/etc/passwd",
        "/logs/printer/0?tail=99999999",
    ],
)
def test_requests_outside_the_rank_logs_are_refused(tmp_path: Path, target: str) -> None:
    (tmp_path / "logs" / "printer").mkdir(parents=True)
    (tmp_path / "logs" / "printer" / "rank-0.log").write_text("hello\n")
    status, body, _ = LogRoute(tmp_path / "logs", "a")(target)
    assert status == 400, body


def test_only_rank_logs_of_jobs_this_node_ran_are_served(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    (logs / "printer" / "2").mkdir(parents=True)
    (logs / "printer" / "rank-0.log").write_text("a\nb\n")
    (logs / "printer" / "2" / "rank-0.log").write_text("b\n")
    (tmp_path / "secret").mkdir()
    (tmp_path / "secret" / "rank-0.log").write_text("secret\n")
    os.symlink(tmp_path / "secret", logs / "linked")  # a job directory that is a link
    os.symlink(tmp_path / "secret" / "rank-0.log", logs / "printer" / "rank-3.log")
    (logs / "printer" / "rank-4.log").mkdir()  # not a regular file
    route = LogRoute(logs, "a")
    for target in (
        "/logs/linked/0",
        "/logs/printer/3",
        "/logs/printer/4",
        "/logs/printer/1",
        "/logs/other/0",
        "/logs/printer/0?generation=7",
    ):
        status, body, _ = route(target)
        assert status == 404 and body.startswith(b"node a has no log of rank"), (target, body)
    status, body, content_type = route("/logs/printer/0?generation=2&tail=5")
    assert (status, content_type) == (200, "application/json")
    assert json.loads(body)["lines"] == ["b"]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/logs/j/0", LogRequest("j", 0)),
        ("/logs/j/3?tail=0", LogRequest("j", 3, tail=0)),
        ("/logs/j.v2_x-1/12?offset=500", LogRequest("j.v2_x-1", 12, tail=None, offset=500)),
        ("/logs/j/0?generation=4&offset=0", LogRequest("j", 0, None, 0, 4)),
        ("/logs/j/0?tail=5&offset=0", "tail and offset exclude each other"),
        ("/logs/j", "expected /logs/JOB/RANK"),
        ("/logs/j/0/", "expected /logs/JOB/RANK"),
        ("/logs/.hidden/0", "bad job id"),
        ("/logs/j/0x1", "bad rank: digits only"),
        ("/logs/j/0?credential=MUNGE:Aw+/=:", LogRequest("j", 0, credential="MUNGE:Aw+/=:")),
        ("/logs/j/0?tail=5&credential=MUNGE:A=:", LogRequest("j", 0, 5, credential="MUNGE:A=:")),
        ("/logs/j/0?credential=MUNGE:A%20B:", "bad credential: expected a MUNGE credential"),
        ("/logs/j/0?credential=MUNGE:AA:&tail=5", "bad parameter 'credential=MUNGE:AA:'"),
    ],
)
def test_parse(target: str, expected: LogRequest | str) -> None:
    got = parse(target)
    assert got == expected or (isinstance(got, str) and got.startswith(str(expected)))
    if isinstance(expected, LogRequest):
        # what the client sends, the server reads (the credential is not part of the target)
        assert parse(expected.target) == replace(expected, credential="")


def test_reading_whole_lines_within_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    lines = [f"{i:05d} " + "x" * 100 for i in range(3000)]  # 107 bytes each: several blocks
    path.write_text("\n".join(lines) + "\npartial")
    size = path.stat().st_size
    tail = read_tail(path, 10)
    assert tail == LogChunk(tuple(lines[-10:]), size - len("partial"), size)
    capped = read_tail(path, 3000, cap=10 * 107 + len("partial"))
    assert capped.lines == tuple(lines[-9:])  # the first line read could be the end of one
    assert read_tail(path, 0).lines == ()
    chunk = read_from(path, 0, cap=1000)
    assert chunk.lines == tuple(lines[:9]) and chunk.offset == 9 * 107
    rest = read_from(path, tail.offset)
    assert rest == LogChunk((), tail.offset, size)  # the partial line waits for its end
    path.write_text("short\n")  # truncated: from its start
    assert read_from(path, 5000) == LogChunk(("short",), 6, 6)
    path.write_text("y" * 50)  # one line longer than the cap comes in pieces
    assert read_from(path, 0, cap=20) == LogChunk(("y" * 20,), 20, 50)


@pytest.mark.parametrize(
    ("metrics", "node", "expected"),
    [
        ("127.0.0.1:9410", "10.0.0.5", "127.0.0.1:9410"),
        ("0.0.0.0:9410", "10.0.0.5", "10.0.0.5:9410"),
        ("[::]:9410", "fd00::5", "[fd00::5]:9410"),
        ("[fd00::7]:9410", "10.0.0.5", "[fd00::7]:9410"),
    ],
)
def test_a_wildcard_listen_address_is_reached_at_the_nodes_address(
    metrics: str, node: str, expected: str
) -> None:
    assert reachable_address(metrics, node) == expected


def test_errors_exit_2_or_3_and_say_which(pool: OwnLogDirs) -> None:
    pool.start("a", "b")
    pool.wait_nodes(2)
    submit(pool, "printer", "2")
    pool.wait_job("printer", "running", world=2)
    for args, code, words in [
        (("nosuch",), 3, "no such job 'nosuch'"),  # 3: what was named does not exist
        (("printer", "--rank", "2"), 2, "rank 2 is out of range: job printer has ranks 0-1"),
        (("printer", "--rank", "-1"), 2, "--rank must be >= 0"),
        (("printer", "--log-dir", "x"), 2, "--log-dir reads this node's files"),
    ]:
        result = pool.ctl("logs", *args)
        assert result.returncode == code and words in result.stderr, (args, result.stderr)


def read_until(stream: IO[str], last: str) -> list[str]:
    """Lines up to and including `last` (the test's timeout ends a wait that is too long)."""
    lines = [stream.readline()]
    while lines[-1] not in (last, ""):
        lines.append(stream.readline())
    return lines


def test_follow_goes_with_the_rank_to_its_new_node(pool: OwnLogDirs) -> None:
    pool.start("a", "b", "c")
    pool.wait_nodes(3)
    submit(pool, "printer", "2")
    pool.wait_job("printer", "running", world=2)
    wait_for(lambda: tail_of(pool, "printer", 1, 1), 30, "rank 1's log")
    argv = ["--redis", pool.redis_url, "--pool", pool.pool, "logs", "printer", "--rank", "1"]
    follow = subprocess.Popen(
        [sys.executable, "-m", "nodeagent.cli.ctl", *argv, "-f", "-n", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert follow.stdout is not None
        assert re.fullmatch(r"rank 1 line 29 on [abc] gen \d+\n", follow.stdout.readline())
        (pool.job_records("printer") / "say-1-0").write_text("said after the tail")
        assert read_until(follow.stdout, "said after the tail\n")[-1] == "said after the tail\n"
        before = record(pool.redis_url, "printer")
        pool.kill_tree(before.members[1])  # the job re-forms with the free node
        wait_for(
            lambda: (
                (r := record(pool.redis_url, "printer")).generation > before.generation
                and r.world_size == 2
            ),
            60,
            "the job running again on two nodes",
        )
        after = record(pool.redis_url, "printer")
        moved = after.members[1]
        first = f"rank 1 line 0 on {moved} gen {after.generation}\n"
        lines = read_until(follow.stdout, first)
        marker = f"=== nodeagentctl: generation {after.generation}, rank 1 on {moved} ===\n"
        assert lines[-2:] == [marker, first], lines
    finally:
        follow.terminate()
        follow.wait(10)
        if follow.stdout is not None:
            follow.stdout.close()
