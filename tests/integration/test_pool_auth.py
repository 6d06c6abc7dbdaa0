"""Who is who in the pool (pool.auth: munge): a real munged with a key the tests generate, real
agents and redis-server, two Unix users the tests create. alice's job runs as alice; alice
cannot submit as bob, cancel or scale bob's job, go above a queue's priority ceiling, drain a
node or create a queue; root (an operator) can. A request replayed, expired, signed with another
key, or written into Redis by hand is refused, and nothing of the pool changes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from nodeagent.coord.keys import PoolKeys
from nodeagent.coord.lua import Call
from nodeagent.coord.pool import PoolStore
from nodeagent.coord.poolscripts import submit_call, submitted
from nodeagent.coord.requests import RequestStore, Taking
from nodeagent.errors import FencedError
from nodeagent.model.request import Reply, Request, Verb
from nodeagent.model.spec import load_spec
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import PoolCluster, munge_pool, pool_keys
from tests.helpers.users import User, reachable_dir, unix_users

pytestmark = pytest.mark.timeout(240)

EX_CONFIG = 78


@pytest.fixture(scope="module")
def users() -> Iterator[dict[str, User]]:
    with unix_users("alice", "bob") as made:
        yield made


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory alice's and bob's workers reach (tmp_path is under a 0700 directory)."""
    with reachable_dir("na-auth-") as path:
        yield path


@pytest.fixture
def pool(
    redis_server: RedisServer,
    shared: Path,
    job_id: str,
    munged: MungeDaemon,
    users: dict[str, User],
) -> Iterator[PoolCluster]:
    names = [users["alice"].name, users["bob"].name]
    with munge_pool(redis_server.url, shared, job_id, munged.socket, names) as cluster:
        yield cluster


def ctl(
    pool: PoolCluster, munged: MungeDaemon, user: User | None, *args: str
) -> subprocess.CompletedProcess[str]:
    where = ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]
    if user is None:  # root: an operator
        return pool.ctl("--munge-socket", munged.socket, *args)
    return user.nodeagentctl(*where, *args)


def submit(
    pool: PoolCluster, munged: MungeDaemon, user: User | None, name: str, *more: str
) -> subprocess.CompletedProcess[str]:
    marks = pool.directory / "marks"
    marks.mkdir(exist_ok=True)
    marks.chmod(0o777)
    command = f"id -un > {marks}/{name}; exec sleep 600"
    return ctl(
        pool, munged, user, "submit", "--name", name, "--nodes", "1", *more,
        "--workdir", str(pool.directory), "--", "/bin/sh", "-c", command,
    )  # fmt: skip


def test_alice_acts_as_alice_and_on_her_own_jobs_only(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User], redis_server: RedisServer
) -> None:
    alice, bob = users["alice"], users["bob"]
    pool.start("a", "b")
    pool.wait_nodes(2)
    done = submit(pool, munged, alice, "mine")
    assert done.returncode == 0 and done.stdout.strip() == "Submitted job mine", done.stderr
    pool.wait_job("mine", "running", world=1)
    marks = pool.directory / "marks" / "mine"
    wait_for(lambda: marks.exists() and marks.read_text().strip() == alice.name, 30, "whoami")
    spec = json.loads(pool_keys(redis_server, pool.pool)["specs"]["mine"])
    assert (spec["user"], spec["submitted_by"]) == (alice.name, alice.name)
    check_logs(pool, munged, users, redis_server)

    before = pool_keys(redis_server, pool.pool)
    as_bob = submit(pool, munged, alice, "hers-as-bob", "--user", bob.name)
    assert as_bob.returncode == 2
    assert f"{alice.name} may not submit as {bob.name}" in as_bob.stderr
    image = submit(pool, munged, alice, "in-an-image", "--container-image", "localhost/t:1")
    assert image.returncode == 2  # the pool leader checks a signed submit as submit does
    assert "no node that could run it takes its container: containers are off" in image.stderr
    for args in (("cancel", "mine"), ("scale", "mine", "2")):
        refused = ctl(pool, munged, bob, *args)
        assert refused.returncode == 2, refused
        assert f"{bob.name} may not {args[0]} job mine of {alice.name}" in refused.stderr
    drain = ctl(pool, munged, alice, "drain", "a")
    assert drain.returncode == 2 and "only operators manage cordons" in drain.stderr
    queue = ctl(pool, munged, alice, "queue", "create", "research", "--max-priority", "10")
    assert queue.returncode == 2 and "only operators manage queues" in queue.stderr
    assert pool_keys(redis_server, pool.pool) == before  # nothing of the refused changed

    made = ctl(pool, munged, None, "queue", "create", "research", "--max-priority", "10")
    assert made.returncode == 0, made.stderr
    high = submit(pool, munged, alice, "urgent", "--queue", "research", "--priority", "11")
    assert high.returncode == 2
    assert "priority 11 is above queue research's ceiling of 10" in high.stderr
    ok = submit(pool, munged, alice, "fine", "--queue", "research", "--priority", "10")
    assert ok.returncode == 0, ok.stderr
    busy = ctl(pool, munged, None, "queue", "delete", "research")
    assert busy.returncode == 2 and "queue research has 1 jobs that have not ended" in busy.stderr
    theirs = submit(pool, munged, None, "for-bob", "--user", bob.name)  # an operator may
    assert theirs.returncode == 0, theirs.stderr
    assert json.loads(pool_keys(redis_server, pool.pool)["specs"]["for-bob"])["user"] == bob.name
    scaled = ctl(pool, munged, alice, "scale", "mine", "1", "--wait", "--timeout", "60s")
    assert scaled.returncode == 0 and "runs on 1 nodes" in scaled.stdout, scaled.stderr
    restart = ctl(pool, munged, bob, "--job", "mine", "restart")
    assert restart.returncode == 2 and f"{bob.name} may not restart job mine" in restart.stderr
    inside = ctl(pool, munged, alice, "--job", "mine", "cordon", "a")
    assert inside.returncode == 2 and "only operators manage cordons" in inside.stderr
    restarted = ctl(pool, munged, alice, "--job", "mine", "restart")
    assert restarted.returncode == 0 and "restart requested by" in restarted.stdout
    cancel = ctl(pool, munged, alice, "cancel", "mine")
    assert cancel.returncode == 0, cancel.stderr
    pool.wait_job("mine", "cancelled")
    drained = ctl(pool, munged, None, "drain", "b")
    assert drained.returncode == 0 and "drained by root" in drained.stdout, drained.stderr

    hers = json.loads(ctl(pool, munged, bob, "jobs", "--json", "--user", alice.name).stdout)["jobs"]
    assert sorted(r["job"] for r in hers) == ["fine", "mine"]
    assert {(r["user"], r["submitted_by"]) for r in hers} == {(alice.name, alice.name)}
    ended = json.loads(ctl(pool, munged, bob, "jobs", "--json", "--state", "cancelled").stdout)[
        "jobs"
    ]
    assert [r["job"] for r in ended] == ["mine"]
    table = ctl(pool, munged, bob, "jobs").stdout.splitlines()
    assert table[0].split()[:2] == ["JOB", "USER"]
    assert any(line.split()[:2] == ["for-bob", bob.name] for line in table)
    audit = ctl(pool, munged, bob, "events", "--pool", "--json", "--last", "200")
    entries = [json.loads(line) for line in audit.stdout.splitlines()]
    who = [
        (e["data"]["user"], e["data"]["verb"], e["type"]) for e in entries if "verb" in e["data"]
    ]
    assert (alice.name, "submit", "request_done") in who
    assert (alice.name, "submit", "request_refused") in who  # as bob, and above the ceiling
    assert (bob.name, "cancel", "request_refused") in who
    assert (alice.name, "cancel", "request_done") in who
    assert ("root", "queue", "request_done") in who and ("root", "cordon", "request_done") in who


def test_hold_release_requeue_are_signed_and_only_the_owner_s(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User], redis_server: RedisServer
) -> None:
    alice, bob = users["alice"], users["bob"]
    pool.start("a")
    pool.wait_nodes(1)
    held = submit(pool, munged, alice, "kept", "--hold")
    assert held.returncode == 0, held.stderr
    wait_for(lambda: "held by" in pool.jobs()["kept"]["reason"], 20, "the hold said")
    assert pool.jobs()["kept"]["reason"].startswith(f"held by {alice.name}")
    before = pool_keys(redis_server, pool.pool)
    for verb in ("release", "requeue", "hold"):
        refused = ctl(pool, munged, bob, verb, "kept")
        assert refused.returncode == 2, refused
        assert f"{bob.name} may not {verb} job kept of {alice.name}" in refused.stderr
    ghost = ctl(pool, munged, alice, "hold", "ghost")
    assert ghost.returncode == 3 and "no job 'ghost'" in ghost.stderr, ghost  # no such job
    again = ctl(pool, munged, alice, "hold", "kept")
    assert again.returncode == 2 and "job kept is held already" in again.stderr
    assert pool_keys(redis_server, pool.pool) == before
    released = ctl(pool, munged, alice, "release", "kept")
    assert released.returncode == 0 and f"released by {alice.name}" in released.stdout
    first = pool.wait_job("kept", "running", world=1)
    stop = ctl(pool, munged, alice, "stop", "kept")  # a pool job: cancel or requeue it
    assert stop.returncode == 2 and "`nodeagentctl cancel kept` ends it" in stop.stderr, stop
    requeued = ctl(pool, munged, None, "requeue", "kept")  # an operator may
    assert requeued.returncode == 0 and "requeue requested by root" in requeued.stdout
    pool.wait_job("kept", "running", timeout=60, after=first["generation"])


def check_logs(
    pool: PoolCluster, munged: MungeDaemon, users: dict[str, User], redis_server: RedisServer
) -> None:
    """alice reads her job's log on the node and over HTTP; bob neither; root (an operator)
    over HTTP; nobody without a credential. The same for its stacks."""
    alice, bob = users["alice"], users["bob"]
    log = pool.directory / "logs" / "mine" / "rank-0.log"
    wait_for(log.exists, 20, "the rank's log")
    mine = alice.run(["cat", str(log)])
    assert mine.returncode == 0 and "=== nodeagent: generation" in mine.stdout, mine.stderr
    denied = bob.run(["cat", str(log)])
    assert denied.returncode != 0 and "Permission denied" in denied.stderr, denied
    hers = ctl(pool, munged, alice, "logs", "mine")
    assert hers.returncode == 0 and "=== nodeagent: generation" in hers.stdout, hers.stderr
    operator = ctl(pool, munged, None, "logs", "mine")
    assert operator.returncode == 0 and "=== nodeagent: generation" in operator.stdout
    theirs = ctl(pool, munged, bob, "logs", "mine")
    assert theirs.returncode == 2 and "403" in theirs.stderr
    assert f"{bob.name} may not read this log" in theirs.stderr
    assert "reachable" not in theirs.stderr  # it answered: the refusal alone (issue 52)
    node = next(n for n, j in pool.placements().items() if j == "mine")
    client = redis_server.client()
    try:
        report = json.loads(str(client.get(PoolKeys("nodeagent", pool.pool).node(node))))
    finally:
        client.close()
    for target in ("/logs/mine/0", "/stacks/mine"):
        with pytest.raises(urllib.error.HTTPError) as anonymous:
            urllib.request.urlopen(f"http://{report['metrics']}{target}", timeout=10)
        anonymous.value.close()
        assert anonymous.value.code == 401
    # Stacks: alice's and an operator's, never bob's, though he may read the log's group.
    # Rank 0 runs `sleep`, not Python: py-spy says so, and the rank is listed (exit 1).
    for caller in (alice, None):
        stacks = ctl(pool, munged, caller, "stacks", "mine")
        assert stacks.returncode == 1, stacks
        assert "=== rank 0 on " in stacks.stdout and "(no stacks: py-spy" in stacks.stdout
    theirs = ctl(pool, munged, bob, "stacks", "mine")
    assert theirs.returncode == 2 and "403" in theirs.stderr
    assert f"{bob.name} may not: the job is another user's" in theirs.stderr


def _reply(store: RequestStore, request_id: str) -> Reply:
    found: Reply = wait_for(lambda: store.reply(request_id), 20, f"reply to {request_id}")
    return found


def test_replayed_expired_foreign_and_hand_written_requests_change_nothing(
    pool: PoolCluster, munged: MungeDaemon, redis_server: RedisServer, job_id: str
) -> None:
    pool.start("a")
    pool.wait_nodes(1)
    client = redis_server.client()
    store = RequestStore(client, PoolKeys("nodeagent", pool.pool))
    try:
        wait_for(lambda: store.auth() == "munge", 20, "the pool leader to say munge")
        munge = munged.program()
        cordon = Request(pool.pool, Verb.CORDON, {"action": "cordon", "node": "a", "reason": "x"})
        signed = replace(cordon, credential=munge.encode(cordon.payload))
        first_id = store.send(signed)
        first = _reply(store, first_id)
        assert first.ok and first.user == "root", first
        before = pool_keys(redis_server, pool.pool)
        assert "a" in before["cordons"]

        uncordon = Request(pool.pool, Verb.CORDON, {"action": "uncordon", "node": "a"})
        expiring = replace(uncordon, credential=munge.encode(uncordon.payload, ttl_s=1))
        time.sleep(2.2)
        other = MungeDaemon().start()
        try:
            foreign = replace(uncordon, credential=other.program().encode(uncordon.payload))
        finally:
            other.stop()
        fresh = replace(uncordon, credential=munge.encode(uncordon.payload))
        rebound = replace(uncordon, nonce="another", credential=fresh.credential)
        cases = {
            "credential replayed": signed,
            "credential expired": expiring,
            "credential invalid": foreign,
            "not signed": uncordon,
            "credential signed for another request": rebound,
        }
        refused_ids = set()
        for why, request in cases.items():
            request_id = store.send(request)
            refused_ids.add(request_id)
            reply = _reply(store, request_id)
            assert not reply.ok and why in reply.message, (why, reply)
        garbage = str(client.xadd(store.keys.requests, {"request": '{"verb": "cancel"}'}))
        assert "refused: request" in _reply(store, garbage).message
        assert pool_keys(redis_server, pool.pool) == before

        # A cursor that is not nodeagent's: the leader reads the stream from its start again;
        # what it took before is refused as replayed or expired, never done twice.
        client.set(store.keys.request_cursor, "not an entry id")
        again = replace(uncordon, nonce="again")
        again = replace(again, credential=munge.encode(again.payload))
        again_id = store.send(again)
        assert _reply(store, again_id).ok
        assert pool_keys(redis_server, pool.pool) == {**before, "cordons": {}}

        # A spec written by hand (as one holding the operators' Redis password could) is
        # never placed: no agent signed it.
        spec = {"id": "forged", "entrypoint": ["/bin/true"], "user": "root"}
        client.hset(store.keys.specs, "forged", json.dumps(spec))
        client.hset(
            store.keys.jobs,
            "forged",
            '{"reason":"x","seq":99,"state":"pending","submitted_ms":1}',
        )
        pool.wait_job("forged", "failed")
        assert "not signed" in pool.jobs()["forged"]["reason"]
        assert pool.placements() == {"a": None}
        audit = pool.ctl("events", "--pool", "--json", "--last", "100").stdout.splitlines()
        taken = [json.loads(e) for e in audit if '"request_' in e]
        done = [e["data"]["request"] for e in taken if e["type"] == "request_done"]
        assert sorted(done) == sorted([first_id, again_id])  # each done once, and only they
        refused = {e["data"]["request"] for e in taken if e["type"] == "request_refused"}
        assert refused == refused_ids | {garbage, first_id}  # first: refused when read again
        messages = [e["message"] for e in taken]
        assert "root: refused: credential replayed: it was used before" in messages
    finally:
        client.close()


def test_an_agent_whose_munged_cannot_be_reached_exits_78(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    config = {
        "node": {"name": "a", "address": "127.0.0.1"},
        "redis": {"url": redis_server.url},
        "pool": {"auth": "munge", "munge_socket": "/tmp/no-munged-here/socket"},
        "log_dir": str(tmp_path / "logs"),
        "state_dir": str(tmp_path / "state"),
        "metrics": {"listen": "off"},
    }
    path = tmp_path / "a.yaml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run(
        [sys.executable, "-m", "nodeagent", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == EX_CONFIG, done.stderr
    assert "pool.auth" in done.stderr and "/tmp/no-munged-here/socket" in done.stderr


def test_a_credential_is_taken_once_whichever_leader_sees_it(
    redis_server: RedisServer, job_id: str
) -> None:
    """munged remembers replays on its own host only: the pool remembers every credential it
    took (POOL_CLAIM) until it expires, so a new pool leader on another host refuses it too;
    a deposed leader takes nothing."""
    client = redis_server.client()
    keys = PoolKeys("nodeagent", job_id)
    store = RequestStore(client, keys)
    try:
        later = int(time.time() * 1000) + 60_000
        client.set(keys.leader, "a 1", px=5000)
        assert store.claim(Taking("a 1", "1-0", "credential-x", later))
        client.set(keys.leader, "b 2", px=5000)  # b took over
        assert not store.claim(Taking("b 2", "2-0", "credential-x", later))
        assert store.claim(Taking("b 2", "3-0", "credential-y", later))
        with pytest.raises(FencedError):
            store.claim(Taking("a 1", "4-0", "credential-z", later))
        assert client.get(keys.request_cursor) == "3-0"
        assert store.claim(Taking("b 2", "5-0", "credential-old", 1))  # expired already: kept 1 ms
        time.sleep(0.01)
        assert store.claim(Taking("b 2", "6-0", "credential-w", later))  # drops the expired ones
        remembered = set(client.zrange(keys.seen, 0, -1))
        assert remembered == {"credential-x", "credential-y", "credential-w"}
    finally:
        client.close()


def test_a_submission_is_taken_with_its_job_or_not_at_all(
    redis_server: RedisServer, job_id: str
) -> None:
    """POOL_TAKE_SUBMIT: the request taken and the job stored in one script; a replayed
    credential or a deposed leader stores nothing and moves no cursor."""
    client = redis_server.client()
    keys = PoolKeys("nodeagent", job_id)
    store, pool = RequestStore(client, keys), PoolStore(client, keys)
    later = int(time.time() * 1000) + 60_000

    def submission(name: str) -> Call:
        spec = load_spec({"id": name, "entrypoint": ["true"], "user": "alice"})
        return submit_call(keys, spec, False, "", submitted(spec))

    try:
        client.set(keys.leader, "a 1", px=5000)
        taken = store.take_submit(Taking("a 1", "1-0", "credential-x", later), submission("one"))
        assert taken is not None and taken[0] and client.get(keys.request_cursor) == "1-0"
        replayed = Taking("a 1", "2-0", "credential-x", later)
        assert store.take_submit(replayed, submission("two")) is None
        with pytest.raises(FencedError):
            store.take_submit(Taking("b 2", "3-0", "credential-y", later), submission("three"))
        assert set(pool.read().jobs) == {"one"} and client.get(keys.request_cursor) == "2-0"
        again = store.take_submit(Taking("a 1", "4-0", "credential-z", later), submission("one"))
        assert again is not None and not again[0]  # the id in use: taken, refused
        assert client.get(keys.request_cursor) == "4-0"
    finally:
        client.close()
