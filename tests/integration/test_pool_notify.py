"""Notifications (issue 67) with real agents, a real redis-server and a webhook endpoint the test
runs: the pool leader posts what each job's submitter asked for (`submit --notify`) to the
endpoint the operator named (pool.notify), signed with the operator's key; a job that did not
ask is not told of; a user names no URL."""

from __future__ import annotations

import hmac
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from hashlib import sha256
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)


class Hook:
    """An HTTP endpoint that keeps what it is posted: (headers, body, when)."""

    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes, float]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802: http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                hook.got.append((dict(self.headers), body, time.time()))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/nodeagent"

    def notices(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body, _ in self.got]


@pytest.fixture
def hook() -> Iterator[Hook]:
    found = Hook()
    yield found
    found.server.shutdown()
    found.server.server_close()  # its listening socket too: left to the GC, it warns


@pytest.fixture
def key(tmp_path: Path) -> bytes:
    path = tmp_path / "notify.key"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(os.urandom(32).hex() + "\n")
    return path.read_bytes().strip()


@pytest.fixture
def pool(
    redis_server: RedisServer, tmp_path: Path, job_id: str, hook: Hook, key: bytes
) -> Iterator[PoolCluster]:
    told = {"notify": {"endpoints": [hook.url], "key_file": str(tmp_path / "notify.key")}}
    with pool_cluster(redis_server.url, tmp_path, pool=job_id, scheduling=told) as cluster:
        cluster.start("a")
        cluster.wait_nodes(1)
        yield cluster


def test_a_submitter_is_told_of_what_they_asked_signed_with_the_operators_key(
    pool: PoolCluster, hook: Hook, key: bytes, job_id: str
) -> None:
    told, quiet, failing = (f"{job_id}-{x}"[:63] for x in ("told", "quiet", "fail"))
    pool.submit(told, "1", "--notify", "BEGIN,END")
    generation = pool.wait_job(told, "running", world=1)["generation"]
    wait_for(lambda: [n["kinds"] for n in hook.notices()] == [["BEGIN"]], 30, "BEGIN told")
    (pool.job_records(told) / f"exit-{generation}").write_text("0")
    pool.wait_job(told, "succeeded")
    wait_for(lambda: len(hook.got) == 2, 30, "END told")
    begin, end = hook.notices()
    assert (end["job"], end["kinds"], end["state"]) == (told, ["END"], "succeeded")
    assert end["user"] == begin["user"] and end["user"]  # whom to tell
    for headers, body, _ in hook.got:  # signed with the operator's key
        expected = "sha256=" + hmac.new(key, body, sha256).hexdigest()
        assert headers["X-Nodeagent-Signature"] == expected
        assert headers["X-Nodeagent-Delivery"] == json.loads(body)["delivery"]

    pool.submit(quiet, "1")  # asked for nothing
    pool.submit(failing, "1", "--notify", "FAIL", "--max-restarts", "0")
    quiet_gen = pool.wait_job(quiet, "running", world=1)["generation"]
    (pool.job_records(quiet) / f"exit-{quiet_gen}").write_text("0")
    failing_gen = pool.wait_job(failing, "running", world=1, timeout=60)["generation"]
    (pool.job_records(failing) / f"exit-{failing_gen}").write_text("3")
    pool.wait_job(failing, "failed")
    wait_for(lambda: len(hook.got) == 3, 30, "FAIL told")
    failed = hook.notices()[2]
    assert (failed["job"], failed["kinds"], failed["state"]) == (failing, ["FAIL"], "failed")
    assert quiet not in {n["job"] for n in hook.notices()}
    print(f"told {1000 * (hook.got[2][2] - failed['at_ms'] / 1000):.0f} ms after the change")


def test_a_user_names_no_endpoint_and_a_wrong_kind_is_refused(pool: PoolCluster) -> None:
    said = pool.ctl("submit", "--notify", "END,LUNCH", "--", "true")
    assert said.returncode == 2 and "'LUNCH' is not a kind to be told of" in said.stderr
    said = pool.ctl("submit", "--notify", "http://evil.example/", "--", "true")
    assert said.returncode == 2 and "is not a kind to be told of" in said.stderr


class Hanging:
    """An endpoint that takes connections and never answers; when each came."""

    def __init__(self) -> None:
        self.accepted: list[float] = []
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hangs"
        self._held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.time())
            self._held.append(conn)  # open, unread, unanswered


def test_a_refused_and_a_hanging_endpoint_delay_no_notice_to_a_live_one(
    redis_server: RedisServer, tmp_path: Path, job_id: str, hook: Hook, key: bytes
) -> None:
    """Named first, a refused endpoint and one that hangs until each try's timeout: the live
    endpoint named after them is told at once, while the hanging one still waits for its first
    try to time out (one thread for all told it only after both had given up, 2 to 10 s)."""
    closed = socket.create_server(("127.0.0.1", 0))
    refused = f"http://127.0.0.1:{closed.getsockname()[1]}/refuses"
    closed.close()  # nothing listens there: refused at once
    hanging = Hanging()
    told = {
        "notify": {
            "endpoints": [refused, hanging.url, hook.url],
            "key_file": str(tmp_path / "notify.key"),
        }
    }
    try:
        with pool_cluster(redis_server.url, tmp_path, pool=job_id, scheduling=told) as pool:
            pool.start("a")
            pool.wait_nodes(1)
            pool.submit(job_id, "1", "--notify", "BEGIN")
            pool.wait_job(job_id, "running", world=1)
            wait_for(lambda: len(hook.got) == 1, 60, "BEGIN told to the live endpoint")
            wait_for(lambda: len(hanging.accepted) >= 2, 60, "the hanging endpoint tried again")
            assert hook.got[0][2] < hanging.accepted[1], (hook.got, hanging.accepted)
            port = refused.rsplit(":", 1)[1].split("/")[0]

            def given_up() -> str | None:
                said = pool.agents["a"].log()
                return said if f"not told to http://127.0.0.1:{port}" in said else None

            said = wait_for(given_up, 60, "the refused endpoint given up, in the log")
            line = next(x for x in said.splitlines() if f"127.0.0.1:{port}" in x)
            assert f"job={job_id}" in line and f"of job {job_id}" in line, line
            assert "/refuses" not in line  # a webhook's path may be its secret
    finally:
        hanging.sock.close()
