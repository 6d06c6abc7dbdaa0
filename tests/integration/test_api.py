"""The pool from anywhere (issue 63): the API service as it runs on a login host, against real
parts. A real munged (the tests' key), redis-server, two pool agents, three Unix users the tests
create (alice and bob submit; apisvc is the service's own account, the agents' pool.api_users),
`nodeagent api` as apisvc on a Unix socket and on HTTPS with a self-signed certificate, and the
Python client (nodeagent.client).

alice mints a token with `nodeagentctl token`, and through the client over HTTPS submits a job
that runs on the agents as alice, follows its log across a worker's kill and the restart that
follows, reads the recovery in `show`, scales and cancels it. bob's token, an expired token, a
forged one, a revoked one and none at all are refused, and the pool's audit trail names who
asked. On the socket the kernel names the caller: alice submits with no token."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodeagent.client import ApiError, Client
from nodeagent.config.keyfile import read_token_key
from nodeagent.model.token import new_claims, secret_of, token_text
from nodeagent.pool import holders
from tests.helpers.api import ApiService, api_beside, api_service, token_key, token_pool
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster
from tests.helpers.users import User, reachable_dir, unix_users

pytestmark = pytest.mark.timeout(300)
TICKING = 'echo "started gen=$NODEAGENT_GENERATION"; while :; do echo tick; sleep 0.3; done'


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users("alice", "bob", "apisvc") as made:
        yield made


@pytest.fixture(scope="module")
def shared() -> Iterator[Path]:
    with reachable_dir("na-api-") as path:
        yield path


@pytest.fixture(scope="module")
def key_file(shared: Path) -> Path:
    return token_key(shared / "token.key")


@pytest.fixture(scope="module")
def pool(
    redis_server: RedisServer,
    shared: Path,
    munged: MungeDaemon,
    users: dict[str, User],
    key_file: Path,
) -> Iterator[PoolCluster]:
    with token_pool(redis_server.url, shared, munged.socket, users, key_file, "api") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def api(
    pool: PoolCluster, shared: Path, munged: MungeDaemon, users: dict[str, User]
) -> Iterator[ApiService]:
    with api_beside(pool, shared, munged.socket, users["apisvc"]) as service:
        yield service


def mint(pool: PoolCluster, munged: MungeDaemon, user: User, lifetime: str = "10m") -> str:
    where = ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]
    done = user.nodeagentctl(*where, "token", "--lifetime", lifetime)
    assert done.returncode == 0, done.stderr
    assert f"for {user.name}, valid" in done.stderr
    return done.stdout.strip()


def client(api: ApiService, token: str) -> Client:
    return Client(api.url, token=token, verify=str(api.certificate.cert))


def refused(call: Any, status: int, words: str) -> None:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == status and words in caught.value.detail, caught.value


def test_a_token_holder_submits_follows_recovers_scales_and_cancels_as_herself(
    pool: PoolCluster,
    api: ApiService,
    munged: MungeDaemon,
    users: dict[str, User],
    key_file: Path,
    shared: Path,
) -> None:
    alice, bob = users["alice"], users["bob"]
    token = mint(pool, munged, alice)
    assert token.startswith("nat1.")
    with client(api, token) as mine:
        job = mine.submit(
            ["/bin/sh", "-c", TICKING], name="ticking", nodes="1:2", workdir=str(shared)
        )
        assert job == "ticking"
        wait_for(lambda: _has_rank_0(mine, job), 60, "rank 0 running")
        assert mine.show(job)["user"] == alice.name  # judged by her own identity
        lines: list[str] = []
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                lines.extend(mine.logs(job, rank=0, tail=5, follow=True))
            except BaseException as exc:  # said by the assertions below, not lost in a thread
                failed.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        wait_for(lambda: "tick" in lines or failed, 60, "rank 0's log followed")
        assert not failed, failed
        # on both nodes (on a loaded machine the second may join a generation later: 1:2)
        status = wait_for(lambda: _on_nodes(mine, job, 2), 90, "both ranks running")
        generation = int(status["generation"])
        stacks = mine.stacks(job)  # `sh` is no Python: each rank is listed with py-spy's words
        assert sorted(r["rank"] for r in stacks) == [0, 1], stacks
        assert all("py-spy" in r["error"] and not r["stacks"] for r in stacks), stacks
        os.kill(_worker_pid(status), signal.SIGKILL)
        restarted = f"started gen={generation + 1}"
        wait_for(lambda: restarted in lines, 90, "the restarted generation followed")
        shown = mine.show(job)
        assert shown["restarts"] == 1 and shown["restarts_by_cause"], shown
        generations = [g["generation"] for g in shown["generations"]]
        assert generations[-2:] == [generation, generation + 1], shown
        assert shown["goodput"]["reforms"], shown["goodput"]

        with client(api, mint(pool, munged, bob)) as theirs:
            refused(lambda: theirs.cancel(job), 403, f"{bob.name} may not cancel job ticking")
            # not bob's to read: the node's own 403, not a conflict (docs/api.md)
            refused(lambda: list(theirs.logs(job, rank=0, tail=5)), 403, "it answered 403")
            refused(lambda: theirs.stacks(job), 403, "the job is another user's")
            assert [r["job"] for r in theirs.jobs(user=alice.name)] == [job]  # reads: as the CLI

        for _ in range(5):  # her status under load: kept for everyone, made again in turn
            mine.status(job)
        assert "target" in mine.scale(job, 1)
        # ... and read back at once, not from before her change (issue 81)
        assert mine.status(job)["target_nodes"] == 1
        assert f"cancel requested by {alice.name}" in mine.cancel(job)
        assert mine.wait(job, timeout=60)["state"] == "cancelled"
        follower.join(30)
        assert not follower.is_alive(), "the follow did not end with the job"
        assert not failed, failed

        # its record, in the accounting database the service reads as its own user
        wait_for(lambda: mine.report("user", since="1h"), 30, "the report of its record")
        (usage,) = mine.report("user", since="1h")
        assert (usage["key"], usage["jobs"], usage["failed"]) == (alice.name, 1, 1), usage
        assert [r["job"] for r in mine.history(user=alice.name)] == [job]

        (mine_id,) = [t["id"] for t in mine.tokens()]
        assert "revoked by" in mine.revoke(mine_id)
        refused(lambda: mine.hold(job), 401, f"token {mine_id} revoked")

    key = read_token_key(str(key_file))
    now = int(time.time())
    old = new_claims(pool.pool, alice.name, alice.uid, alice.gid, now - 7200, 3600)
    with client(api, token_text(old, secret_of(key, old))) as expired:
        refused(expired.jobs, 401, "expired")
    made = new_claims(pool.pool, alice.name, alice.uid, alice.gid, now, 3600)
    with client(api, token_text(made, os.urandom(32))) as forged:
        refused(forged.jobs, 401, "token forged or altered")
    with Client(api.url, verify=str(api.certificate.cert)) as anonymous:
        refused(anonymous.jobs, 401, "Authorization: Bearer")

    with client(api, mint(pool, munged, bob)) as theirs:
        audit = theirs.events(last=200)
    who = {(e["data"].get("user"), e["data"].get("verb"), e["type"]) for e in audit}
    assert (alice.name, "submit", "request_done") in who
    assert (bob.name, "cancel", "request_refused") in who
    assert (None, "hold", "request_refused") in who  # a revoked token names no one


def test_a_crashed_service_comes_back_and_loses_nothing(
    pool: PoolCluster, api: ApiService, munged: MungeDaemon, users: dict[str, User], shared: Path
) -> None:
    """The service keeps no state but a short read cache: SIGKILLed mid-follow, a follower's
    stream ends with an error instead of hanging, the job never notices, and the service started
    again (its stale socket file left behind) serves alice's token minted before the crash, on
    the same client, to read and to change."""
    token = mint(pool, munged, users["alice"])
    with client(api, token) as mine:
        # A name no other test submits: job ids share one namespace per Redis key prefix, so
        # this job's stopped record would end another pool's job of the same name.
        job = mine.submit(
            ["/bin/sh", "-c", TICKING], name="survives-crash", nodes="1", workdir=str(shared)
        )
        wait_for(lambda: _has_rank_0(mine, job), 60, "rank 0 running")
        pid = _worker_pid(mine.status(job))
        lines: list[str] = []
        ended: list[BaseException] = []

        def follow() -> None:
            try:
                lines.extend(mine.logs(job, rank=0, tail=5, follow=True))
            except BaseException as exc:
                ended.append(exc)

        follower = threading.Thread(target=follow, daemon=True)
        follower.start()
        wait_for(lambda: "tick" in lines or ended, 60, "rank 0's log followed")
        assert not ended, ended
        api.crash()
        follower.join(30)
        assert not follower.is_alive(), "the follow hung on a dead service"
        assert len(ended) == 1 and isinstance(ended[0], httpx.TransportError), ended
        assert Path(api.socket).exists()  # what a crash leaves: replaced at the next start
        api.start()

        shown = mine.show(job)  # the same client: its kept connection died with the service
        assert shown["state"] == "running" and shown["restarts"] == 0, shown
        assert _worker_pid(mine.status(job)) == pid  # the job never noticed
        assert "tick" in list(mine.logs(job, rank=0, tail=5))
        with Client(socket=api.socket) as root:
            assert {n["name"] for n in root.nodes()} == {"a", "b"}
        assert f"cancel requested by {users['alice'].name}" in mine.cancel(job)
        assert mine.wait(job, timeout=60)["state"] == "cancelled"


def test_on_the_socket_the_kernel_names_the_caller(
    pool: PoolCluster, api: ApiService, users: dict[str, User], shared: Path
) -> None:
    """No token: alice's process on the API host is alice (SO_PEERCRED), and the pool takes the
    service's word for it because the service runs as an account of pool.api_users."""
    alice = users["alice"]
    script = (
        "import json, sys\n"
        "from nodeagent.client import Client\n"
        f"with Client(socket={api.socket!r}) as c:\n"
        f"    job = c.submit(['/bin/sleep', '600'], name='socketed', workdir={str(shared)!r})\n"
        "    print(json.dumps([job, c.cancel(job)]))\n"
    )
    done = alice.run([sys.executable, "-c", script], reach=True)
    assert done.returncode == 0, done.stderr
    job, said = json.loads(done.stdout)
    assert job == "socketed" and f"cancel requested by {alice.name}" in said
    with Client(socket=api.socket) as root:  # root is an operator: the service vouches not
        refused(lambda: root.hold("socketed"), 403, "does not act for operators")


def test_what_a_client_sends_wrong_is_a_problem_not_a_500(
    api: ApiService, pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    headers = {"Authorization": f"Bearer {mint(pool, munged, users['alice'])}"}
    trust = ssl.create_default_context(cafile=str(api.certificate.cert))
    with httpx.Client(base_url=api.url, verify=trust, headers=headers) as h:
        cases = [
            h.post("/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}),
            h.post("/v1/jobs", json={"spec": {"entrypoint": ["x"]}, "colour": "red"}),
            h.post("/v1/jobs", json={"spec": {"entrypoint": "x", "nproc_per_node": "many"}}),
            h.post("/v1/jobs", content=b"x" * (300 * 1024)),
            h.get("/v1/jobs/nope"),
            h.get("/v1/jobs/../../etc/passwd"),
            h.post("/v1/jobs/ticking/scale", json={"target": "lots"}),
        ]
    statuses = [r.status_code for r in cases]
    assert statuses == [422, 422, 422, 413, 404, 404, 422], [r.text for r in cases]
    for response in cases:
        assert response.headers["content-type"] == "application/problem+json", response.text
        doc = response.json()
        assert doc["status"] == response.status_code and doc["detail"], doc
    assert "refused: invalid job spec" in cases[2].json()["detail"]  # the pool leader's words


def test_an_allocation_is_held_for_its_caller_until_cancelled(
    api: ApiService, pool: PoolCluster, munged: MungeDaemon, users: dict[str, User]
) -> None:
    """POST /v1/allocations (issue 82): admitted as alice's job of kind allocation, held by
    its nodes until she cancels it; a key an allocation does not take is refused, naming it."""
    with client(api, mint(pool, munged, users["alice"])) as mine:
        job = mine.allocate(1, name="api-alloc", time_limit="1h")
        assert job == "api-alloc"
        wait_for(lambda: mine.show(job)["state"] == "running", 60, "the allocation held")
        shown = mine.show(job)
        assert (shown["user"], shown["kind"], shown["command"]) == (
            users["alice"].name,
            "allocation",
            ["sleep", "infinity"],
        )
        mine.cancel(job)
        wait_for(lambda: mine.show(job)["state"] == "cancelled", 60, "the allocation ended")
        refused(
            lambda: mine.allocate(1, spec={"entrypoint": ["rm", "-rf", "/"]}),
            409,
            "an allocation does not take entrypoint",
        )
    # nodeagentctl alloc as alice in this munge pool: signed, and ended by a signed cancel.
    where = ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]
    # Its shell runs past the holder's lease (pool/holders.TTL_MS): only its signed
    # renewals keep it, and it ends by her exit, not by the lease.
    shell = f"sleep {holders.TTL_MS / 1000 + 5:g}; echo in $NODEAGENT_JOB_ID"
    said = users["alice"].nodeagentctl(
        *where, "alloc", "--name", "cli-alloc", "--", "sh", "-c", shell
    )
    assert said.returncode == 0 and said.stdout.strip() == "in cli-alloc", said.stderr
    assert "relinquishing job allocation cli-alloc" in said.stderr
    with client(api, mint(pool, munged, users["alice"])) as mine:
        wait_for(lambda: mine.show("cli-alloc")["state"] == "cancelled", 60, "its end")
        assert "stopped renewing" not in mine.show("cli-alloc")["reason"]


def test_a_submission_sent_again_with_its_idempotency_key_is_the_job_it_made(
    api: ApiService, pool: PoolCluster, munged: MungeDaemon, users: dict[str, User], shared: Path
) -> None:
    """The same POST twice with one Idempotency-Key (a client that lost the first answer): the
    same job, 201 both times, and one job in the pool; a key that is no request id: 400."""
    headers = {"Authorization": f"Bearer {mint(pool, munged, users['alice'])}"}
    trust = ssl.create_default_context(cafile=str(api.certificate.cert))
    body = {
        "spec": {"id": "keyed", "entrypoint": ["/bin/sleep", "600"], "working_dir": str(shared)}
    }
    with httpx.Client(base_url=api.url, verify=trust, headers=headers) as h:
        keyed = {"Idempotency-Key": "6b3c1f0e-2d4a-4f8e-9a57-0c1d2e3f4a5b"}
        first, second = (h.post("/v1/jobs", json=body, headers=keyed) for _ in range(2))
        bad = h.post("/v1/jobs", json=body, headers={"Idempotency-Key": "a b"})
        h.delete("/v1/jobs/keyed")
    assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)
    assert first.json()["job"] == second.json()["job"] == "keyed"
    assert bad.status_code == 400 and "Idempotency-Key" in bad.json()["detail"], bad.text
    assert "keyed" in pool.jobs()


def _has_rank_0(client: Client, job: str) -> bool:
    """The job formed and rank 0's worker started (the pool's `running` comes first: admitted,
    its nodes not joined yet; before it formed, its status is a 404)."""
    try:
        status = client.status(job)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return any(w["rank"] == 0 and w["pid"] for n in status["nodes"] for w in n["workers"])


def _on_nodes(client: Client, job: str, count: int) -> dict[str, Any] | None:
    """The job's status once `count` nodes run workers of its current generation."""
    status = client.status(job)
    running = [
        n
        for n in status["nodes"]
        if n["generation"] == status["generation"] and any(w["pid"] for w in n["workers"])
    ]
    return status if len(running) == count else None


def _worker_pid(status: dict[str, Any]) -> int:
    workers = [w for n in status["nodes"] for w in n["workers"] if w["rank"] == 0]
    assert workers and workers[0]["pid"], status
    return int(workers[0]["pid"])


def test_a_redis_outage_is_a_503_and_clients_are_bounded(
    shared: Path, munged: MungeDaemon, users: dict[str, User]
) -> None:
    """The service keeps nothing of its own: Redis away is 503 with Retry-After (once a read
    kept is past its stale window), Redis back is served again without a restart. A user
    past their rate gets 429 with Retry-After, and connections that never send a request are
    closed after `idle`, serving the others meanwhile."""
    directory = shared / "bounded"
    directory.mkdir()
    directory.chmod(0o755)
    redis_server = RedisServer(directory)
    redis_server.start()
    limits = {"requests_per_second": 0.5, "burst": 3, "idle": "1s"}
    try:
        with api_service(
            directory, redis_server.url, "p", munged.socket, users["apisvc"], limits
        ) as api:
            with httpx.Client(transport=httpx.HTTPTransport(uds=api.socket)) as h:
                assert h.get("http://api/v1/nodes").json()["nodes"] == []
                redis_server.stop()
                time.sleep(1.6)  # past 3 read_caches (cache.STALE_READS): not given stale
                away = h.get("http://api/v1/nodes")
                assert away.status_code == 503 and away.headers["retry-after"], away.text
                assert "cannot be reached" in away.json()["detail"]
                redis_server.start()
                back = h.get("http://api/v1/queues")
                assert back.status_code == 200, back.text
                # 3 at once and 1 every 2 s: the burst is spent within 3 more requests, 4 if
                # Redis took its time to start (CI: one request was served as the 4th)
                tries = [h.get("http://api/v1/nodes") for _ in range(6)]
                limited = tries[-1]
                assert limited.status_code == 429, [t.status_code for t in tries]
                assert int(limited.headers["retry-after"]) >= 1

            port = int(api.url.rsplit(":", 1)[1])
            silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(200)]
            try:
                answered = httpx.get(f"{api.url}/healthz", verify=False)
                assert answered.status_code == 200
                time.sleep(3)  # idle 1 s: every silent connection closed by now
                for sock in silent:
                    sock.settimeout(5)
                    assert sock.recv(1) == b"", "a silent connection was kept open"
            finally:
                for sock in silent:
                    sock.close()
    finally:
        redis_server.stop()
