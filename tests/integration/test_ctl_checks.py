"""nodeagentctl checks every argument before it writes: a bad one exits 2 with a message that
names it, and Redis is left exactly as it was. Against a real redis-server and real agents."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from nodeagent.coord.keys import PoolKeys
from tests.helpers.cluster import LocalCluster, RedisServer, local_cluster, wait_for
from tests.helpers.cluster import nodeagentctl as ctl
from tests.helpers.fingerprint import fingerprint

# One worker runs this module's tests in file order: they share one cluster, and the last one
# changes its job (a drain), which the others' before-and-after comparisons must not see.
pytestmark = pytest.mark.xdist_group("ctl-checks")
DB = 11  # this module's own database of the session's redis-server: every key in it is ours
EX_USAGE = 2
EX_NOT_FOUND = 3
URL_ENV = "NODEAGENT_REDIS_URL"


@pytest.fixture(scope="module")
def db_url(redis_server: RedisServer) -> Iterator[str]:
    url = f"redis://127.0.0.1:{redis_server.port}/{DB}"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture(scope="module")
def db(db_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(db_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture(scope="module")
def cluster(db_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Nodes a and b running job `checks`; nobody else writes to this database."""
    with local_cluster(
        db_url, tmp_path_factory.mktemp("checks"), job="checks", max_nodes=2
    ) as running:
        running.start("a", "b")
        running.wait_running(2, timeout=60)
        # Their pool (they are pinned nodes of `default`) settles too before any test compares
        # the database: the pool leader places both on their job, at most half a lease later.
        placements = PoolKeys("nodeagent", "default").placements
        wait_for(lambda: running.store.client.hlen(placements) == 2, 30, "both pinned nodes placed")
        yield running


def where(cluster: LocalCluster) -> list[str]:
    return ["--redis", cluster.redis_url, "--job", cluster.job]


# (id, arguments after --redis URL --job checks, the message's fragments)
BAD_REQUESTS = [
    ("drain-unknown-wait", ["drain", "ghost", "--wait", "--timeout", "5s"], ["'ghost'", "not in"]),
    ("drain-unknown", ["drain", "ghost"], ["'ghost'", "known nodes: a, b"]),
    ("cordon-unknown", ["cordon", "ghost"], ["'ghost'", "known nodes: a, b"]),
    ("uncordon-unknown", ["uncordon", "ghost"], ["'ghost'", "known nodes: a, b"]),
    ("cordon-empty", ["cordon", ""], ["argument node", "'' must be 1-63 letters"]),
    ("uncordon-empty", ["uncordon", ""], ["argument node", "'' must be 1-63 letters"]),
    ("drain-empty", ["drain", "", "--wait"], ["argument node", "'' must be 1-63 letters"]),
    ("cordon-braces", ["cordon", "a}"], ["argument node", "must be 1-63 letters"]),
    ("health-unknown", ["health", "--node", "ghost"], ["ghost", "not in job"]),
    (
        "drain-timeout-abc",
        ["drain", "a", "--wait", "--timeout", "abc"],
        ["argument --timeout", "abc"],
    ),
    (
        "drain-timeout-negative",
        ["drain", "a", "--wait", "--timeout=-5s"],
        ["argument --timeout", "-5s"],
    ),
    (
        "scale-timeout-abc",
        ["scale", "2", "--wait", "--timeout", "abc"],
        ["argument --timeout", "abc"],
    ),
    ("scale-timeout-abc-nowait", ["scale", "1", "--timeout", "abc"], ["argument --timeout", "abc"]),
    ("scale-fraction", ["scale", "2.9"], ["scale: expected N, +N or -N, got '2.9'"]),
    ("scale-above-max", ["scale", "9"], ["[min_nodes, max_nodes] = [1, 2]"]),
    ("scale-zero", ["scale", "0"], ["[min_nodes, max_nodes] = [1, 2]"]),
    ("scale-relative-bad", ["scale", "+x"], ["scale: expected N, +N or -N, got '+x'"]),
    ("scale-relative-below", ["scale", "-5"], ["[min_nodes, max_nodes] = [1, 2]"]),
    ("scale-three-args", ["scale", "a", "b", "1"], ["give [JOB] N"]),
    ("scale-pool-unknown-job", ["scale", "typo", "1"], ["job 'typo' does not exist"]),
    ("cancel-unknown-job", ["cancel", "typo"], ["no job 'typo' in pool default"]),
    ("submit-nothing", ["submit", "--name", "x"], ["give a job spec file, or the command"]),
    ("submit-time-bare", ["submit", "--time", "90", "--", "true"], ["'90' has no unit", "90m"]),
    ("submit-time-bad", ["submit", "--time", "5x", "--", "true"], ["argument --time", "'5x'"]),
    ("submit-time-clock", ["submit", "--time", "1:75", "--", "true"], ["argument --time"]),
    (
        "submit-signal-kill",
        ["submit", "--time", "1h", "--signal", "KILL@10", "--", "true"],
        ["signal: expected SIGNAL[@TIME] with a signal a worker can catch", "'KILL@10'"],
    ),
    (
        "submit-signal-without-time",
        ["submit", "--signal", "USR1@10", "--", "true"],
        ["signal: is sent before the time limit: give a time_limit (--time)"],
    ),
    (
        "submit-signal-after-start",
        ["submit", "--time", "1m", "--signal", "USR1@2m", "--", "true"],
        ["120s before the end of a time limit of 60s"],
    ),
    (
        "submit-min-above-max",
        ["submit", "--name", "x", "--nodes", "3:1", "--", "true"],
        ["(3) > max_nodes (1)"],
    ),
    (
        "submit-nodes-abc",
        ["submit", "--name", "x", "--nodes", "a:b", "--", "true"],
        ["--nodes: expected MIN:MAX"],
    ),
    (
        "submit-nproc-zero",
        ["submit", "--name", "x", "--nproc-per-node", "0", "--", "true"],
        ["must be >= 1"],
    ),
    ("submit-bad-id", ["submit", "--name", "a b", "--", "true"], ["argument --name"]),
    (
        "submit-bad-env",
        ["submit", "--name", "x", "--env", "NOEQ", "--", "true"],
        ["--env: expected K=V"],
    ),
    ("events-last-negative", ["events", "--last", "-5"], ["--last", "whole number >= 0"]),
    ("events-last-abc", ["events", "--last", "abc"], ["--last", "whole number >= 0"]),
    ("events-last-fraction", ["events", "--last", "2.5"], ["--last", "whole number >= 0"]),
    ("stop-unknown-job", ["--job", "typo", "stop"], ["job 'typo' does not exist", "--job"]),
    ("stop-unknown-job-positional", ["stop", "typo"], ["two jobs given", "typo"]),
    ("restart-two-jobs", ["restart", "other"], ["two jobs given: --job", "other; give one"]),
    ("restart-unknown-job", ["--job", "typo", "restart"], ["job 'typo' does not exist"]),
    ("scale-unknown-job", ["--job", "typo", "scale", "1"], ["job 'typo' does not exist"]),
    ("cordon-unknown-job", ["--job", "typo", "cordon", "a"], ["job 'typo' does not exist"]),
    ("drain-unknown-job", ["--job", "typo", "drain", "a", "--wait"], ["'typo' does not exist"]),
    ("uncordon-unknown-job", ["--job", "typo", "uncordon", "a"], ["'typo' does not exist"]),
    ("stop-other-prefix", ["--key-prefix", "other", "stop"], ["prefix 'other'", "--key-prefix"]),
    ("job-empty", ["--job", "", "stop"], ["argument --job", "'' must be 1-63 letters"]),
    ("job-space", ["--job", "a b", "stop"], ["argument --job", "'a b' must be 1-63 letters"]),
    (
        "prefix-braces",
        ["--key-prefix", "x{y}", "stop"],
        ["argument --key-prefix", "must be 1-63 letters"],
    ),
    (
        "password-file-missing",
        ["--redis-password-file", "/nonexistent/pw", "stop"],
        [
            "--redis-password-file",
            "cannot read /nonexistent/pw",
        ],
    ),
    (
        "password-file-empty-name",
        ["--redis-password-file", "", "stop"],
        [
            "--redis-password-file",
            "cannot read",
        ],
    ),
]

# (id, --redis value, the message's fragments); the job and command are valid
BAD_URLS = [
    ("http", "http://127.0.0.1:6379/0", ["--redis", "must start with one of redis://"]),
    ("no-scheme", "127.0.0.1:6379", ["--redis", "must start with one of"]),
    ("port-abc", "redis://127.0.0.1:abc/0", ["--redis", "port", "1 to 65535"]),
    ("port-too-big", "redis://127.0.0.1:99999/0", ["--redis", "port", "1 to 65535"]),
    ("port-zero", "redis://127.0.0.1:0/0", ["--redis", "port", "not 0"]),
    ("no-host", "redis:///0", ["--redis", "names no host"]),
    ("db-abc", "redis://127.0.0.1:6379/abc", ["--redis", "database must be a number"]),
    ("db-query", "redis://127.0.0.1:6379?db=x", ["--redis", "database must be a number"]),
    ("sentinel-no-service", "redis+sentinel://127.0.0.1:26379", ["--redis", "names its service"]),
    ("sentinel-bad-port", "redis+sentinel://h:x/mymaster", ["--redis", "bad sentinel address"]),
    ("sentinel-db-abc", "redis+sentinel://h:26379/m/abc", ["--redis", "database must be a"]),
    ("unix-no-path", "unix://", ["--redis", "names its socket"]),
    ("empty", "", ["--redis", "empty"]),
    ("bad-query", "redis://127.0.0.1:6379/0?socket_timeout=soon", ["--redis", "socket_timeout"]),
]


# The requests of BAD_REQUESTS that name a job or node that does not exist: exit 3, not 2
NOT_FOUND = frozenset(
    {
        "drain-unknown-wait",
        "drain-unknown",
        "cordon-unknown",
        "uncordon-unknown",
        "health-unknown",
        "scale-pool-unknown-job",
        "cancel-unknown-job",
        "stop-unknown-job",
        "restart-unknown-job",
        "scale-unknown-job",
        "cordon-unknown-job",
        "drain-unknown-job",
        "uncordon-unknown-job",
        "stop-other-prefix",
    }
)


@pytest.mark.parametrize(
    ("case", "args", "fragments"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS]
)
def test_a_bad_request_exits_2_or_3_and_writes_nothing(
    cluster: LocalCluster, db: redis.Redis, case: str, args: list[str], fragments: list[str]
) -> None:
    before = fingerprint(db)
    result = ctl(*where(cluster), *args)
    code = EX_NOT_FOUND if case in NOT_FOUND else EX_USAGE
    assert (result.returncode, result.stdout) == (code, ""), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert fingerprint(db) == before


@pytest.mark.parametrize(
    ("url", "fragments"), [c[1:] for c in BAD_URLS], ids=[c[0] for c in BAD_URLS]
)
def test_a_bad_url_exits_2_without_a_traceback(
    cluster: LocalCluster, db: redis.Redis, url: str, fragments: list[str]
) -> None:
    before = fingerprint(db)
    result = ctl("--redis", url, "--job", cluster.job, "stop")
    assert result.returncode == EX_USAGE, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert fingerprint(db) == before


def test_a_password_in_the_url_and_a_file_is_refused(
    cluster: LocalCluster, db: redis.Redis, tmp_path: Path
) -> None:
    secret = tmp_path / "pw"
    secret.write_text("hunter2\n")
    url = cluster.redis_url.replace("redis://", "redis://:hunter2@")
    before = fingerprint(db)
    result = ctl("--redis", url, "--redis-password-file", str(secret), "--job", cluster.job, "stop")
    assert result.returncode == EX_USAGE and "given twice" in result.stderr
    assert "hunter2" not in result.stderr
    assert fingerprint(db) == before


def test_a_bad_redis_url_in_the_config_is_a_config_error(
    cluster: LocalCluster, db: redis.Redis, tmp_path: Path
) -> None:
    path = cluster.config_path("a")
    bad = tmp_path / "bad.yaml"
    bad.write_text(path.read_text().replace(cluster.redis_url, "redis://127.0.0.1:6379/abc"))
    before = fingerprint(db)
    result = ctl("--config", str(bad), "stop")
    if result.returncode == 78:  # read_config itself may reject it
        assert "redis.url" in result.stderr
    else:
        assert result.returncode == EX_USAGE and "redis.url" in result.stderr
    assert "Traceback" not in result.stderr
    assert fingerprint(db) == before


def test_uncordon_of_a_node_that_is_not_cordoned_writes_nothing(
    cluster: LocalCluster, db: redis.Redis
) -> None:
    before = fingerprint(db)
    result = ctl(*where(cluster), "uncordon", "b")
    assert result.returncode == 0 and "was not cordoned" in result.stdout
    assert fingerprint(db) == before


def test_events_print_entries_as_they_are(db_url: str, db: redis.Redis) -> None:
    """An event whose `data` is not an object, or an entry that is no event at all, is printed
    with what it holds (as a decoded event, or as a corrupt_event with the entry as `raw`)."""
    stream = "nodeagent:{odd-events}:events"
    stored: list[Any] = [
        {"type": "t", "message": "m", "data": data} for data in ([1, 2], "text", 7, None)
    ]
    stored += [{"type": "fine", "message": "m", "data": {"k": "v"}}, "not json {", [1]]
    for document in stored:
        text = document if isinstance(document, str) else json.dumps(document)
        db.xadd(stream, {"event": text})
    db.xadd(stream, {"event": json.dumps({"type": "far"})}, id="99999999999999999-0")
    result = ctl("--redis", db_url, "--job", "odd-events", "events", "--json", "--last", "20")
    assert result.returncode == 0, result.stderr
    printed = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(printed) == len(stored) + 1
    assert {shown["version"] for shown in printed} == {1}  # each line a document of its own
    for document, shown in zip(stored, printed, strict=False):
        if shown["type"] == "corrupt_event":
            assert shown["raw"] == document and shown["message"]
        else:
            assert shown["data"] == (document["data"] or {})
    assert printed[4]["type"] == "fine" and printed[4]["data"] == {"k": "v"}
    assert printed[5]["type"] == printed[6]["type"] == "corrupt_event"
    assert printed[-1]["type"] == "far"
    table = ctl("--redis", db_url, "--job", "odd-events", "events")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert len(lines) == len(stored) + 1 and "not json {" in lines[5]
    assert lines[-1].startswith("99999999999999999-0 gen=- far")


def test_a_key_of_the_wrong_type_is_not_called_unreachable(db_url: str, db: redis.Redis) -> None:
    """A job whose leases key is a string: Redis answers WRONGTYPE, it is not unreachable."""
    db.set("nodeagent:{wrong-type}:leases", "garbage")
    before = fingerprint(db)
    for command in (["status"], ["stop"], ["cordon", "a"]):
        result = ctl("--redis", db_url, "--job", "wrong-type", *command)
        assert "cannot reach Redis" not in result.stderr and "Traceback" not in result.stderr
        if command == ["status"] and result.returncode == 0:
            continue  # a store that reads around the garbage may show the status
        assert result.returncode in (EX_USAGE, EX_NOT_FOUND, 69), result.stderr
        if result.returncode == 69:
            assert "Redis answered with an error" in result.stderr
            assert "WRONGTYPE" in result.stderr
    assert fingerprint(db) == before


@pytest.mark.parametrize(
    ("spec", "fragments"),
    [
        ({"id": "x", "entrypoint": ["t"], "colour": "red"}, ["colour: unknown key"]),
        ({"id": "x", "entrypoint": ["t"], "min_nodes": 3, "max_nodes": 1}, ["(3) > max_nodes"]),
        ({"id": "x", "entrypoint": ["t"], "nproc_per_node": 0}, ["nproc_per_node: must be >= 1"]),
        ({"id": "x", "entrypoint": []}, ["entrypoint: required: a non-empty list"]),
        ({"id": "bad id", "entrypoint": ["t"]}, ["id: 'bad id' must be 1-63"]),
        ({"id": "x", "entrypoint": ["t"], "timing": {"lease_ttl": "9s"}}, ["the node's"]),
        ("- just\n- a list\n", ["expected a mapping of spec keys"]),
        ("id: [unclosed\n", ["cannot read the job spec"]),
    ],
    ids=["unknown-key", "min-above-max", "nproc-zero", "empty-entrypoint", "bad-id", "lease",
         "a-list", "not-yaml"],
)  # fmt: skip
def test_a_bad_spec_file_exits_2_naming_the_key_and_writes_nothing(
    cluster: LocalCluster, db: redis.Redis, tmp_path: Path, spec: object, fragments: list[str]
) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(spec if isinstance(spec, str) else yaml.safe_dump(spec))
    before = fingerprint(db)
    result = ctl(*where(cluster), "submit", str(path))
    assert (result.returncode, result.stdout) == (EX_USAGE, ""), result.stderr
    for fragment in fragments:
        assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert fingerprint(db) == before


def test_the_url_from_the_environment_version_and_ctrl_c(
    cluster: LocalCluster, db_url: str, db: redis.Redis
) -> None:
    status = ctl("--job", cluster.job, "status", "--json", env={URL_ENV: db_url})
    assert status.returncode == 0 and json.loads(status.stdout)["job"] == cluster.job, status
    before = fingerprint(db)
    bad = ctl("--job", cluster.job, "stop", env={URL_ENV: "redis://127.0.0.1:6379/abc"})
    assert bad.returncode == EX_USAGE and URL_ENV in bad.stderr, bad
    version = ctl("--version")
    assert version.returncode == 0 and version.stdout.split()[0] == "nodeagentctl"
    where = ("--redis", db_url, "--job", cluster.job)
    follow = subprocess.Popen(
        [sys.executable, "-m", "nodeagent.cli.ctl", *where, "events", "--follow"],
        stdout=subprocess.PIPE,
        text=True,
        # as from a terminal: pytest started in the background (`... &` in a script) ignores
        # SIGINT, its children inherit that, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert follow.stdout is not None and follow.stdout.readline()  # it printed, and follows
        follow.send_signal(signal.SIGINT)
        assert follow.wait(20) == 130  # interrupted, as shells report it
    finally:  # a failure must not leave it running into the next test
        follow.kill()
        follow.communicate()
    assert fingerprint(db) == before


def test_nodeagentctl_s_own_file_gives_what_flags_do_not(
    cluster: LocalCluster, db_url: str, db: redis.Redis, tmp_path: Path
) -> None:
    rc = tmp_path / "nodeagentctl.yaml"
    rc.write_text(yaml.safe_dump({"redis": db_url, "key_prefix": "nodeagent"}))
    env = {"NODEAGENT_CTL_CONFIG": str(rc)}
    status = ctl("--job", cluster.job, "status", "--json", env=env)
    assert status.returncode == 0 and json.loads(status.stdout)["job"] == cluster.job, status
    before = fingerprint(db)
    bad_env = {**env, URL_ENV: "redis://127.0.0.1:6379/abc"}  # the variable wins over the file
    shadowed = ctl("--job", cluster.job, "stop", env=bad_env)
    assert shadowed.returncode == EX_USAGE and URL_ENV in shadowed.stderr, shadowed
    flag = ctl("--redis", db_url, "--job", cluster.job, "status", env=bad_env)  # a flag wins
    assert flag.returncode == 0, flag.stderr
    rc.write_text(yaml.safe_dump({"redis": "redis://127.0.0.1:6379/abc"}))
    wrong = ctl("--job", cluster.job, "stop", env=env)
    assert wrong.returncode == EX_USAGE and f"redis in {rc}" in wrong.stderr, wrong
    rc.write_text(yaml.safe_dump({"redis": db_url, "colour": "blue"}))
    unknown = ctl("--job", cluster.job, "status", env=env)
    assert unknown.returncode == EX_USAGE and "unknown key 'colour'" in unknown.stderr
    assert str(rc) in unknown.stderr
    assert fingerprint(db) == before


def test_the_commands_still_work_on_known_nodes(cluster: LocalCluster, db: redis.Redis) -> None:
    """Last in this module (the others compare the database before and after): it changes
    the job."""
    cordon = ctl(*where(cluster), "cordon", "a", "--reason", "test")
    assert cordon.returncode == 0 and "node a: cordoned (test)" in cordon.stdout
    assert "a" in db.hgetall(f"nodeagent:{{{cluster.job}}}:cordons")
    uncordon = ctl(*where(cluster), "uncordon", "a")
    assert uncordon.returncode == 0 and "node a: uncordoned" in uncordon.stdout
    assert "a" not in db.hgetall(f"nodeagent:{{{cluster.job}}}:cordons")
    generation = cluster.status()["generation"]
    drain = ctl(*where(cluster), "drain", "b", "--wait", "--timeout", "60s")
    assert drain.returncode == 0, drain.stderr
    assert "node b: workers stopped, out of the job" in drain.stdout
    doc = cluster.wait_running(1, timeout=60, after_generation=generation)
    assert [n["name"] for n in doc["nodes"] if n["group_rank"] is not None] == ["a"]


def test_a_pool_drain_takes_a_pinned_node_out_of_its_job(
    cluster: LocalCluster, db: redis.Redis
) -> None:
    """Issue 62: `drain NODE` without --job on a node its config pins to a job said "drained"
    and the node trained on (the pool does not place a pinned node, so its cordon moved
    nothing). Now it drains the node in its job too, and `uncordon` lifts both. Last too: it
    changes the job."""
    job_cordons, pool_cordons = (
        f"nodeagent:{{{cluster.job}}}:cordons",
        PoolKeys("nodeagent", "default").cordons,
    )
    assert ctl(*where(cluster), "uncordon", "b").returncode == 0  # back from the test before
    generation = cluster.wait_running(2, timeout=90)["generation"]
    drain = ctl("--redis", cluster.redis_url, "drain", "b", "--wait", "--timeout", "60s")
    assert drain.returncode == 0, drain.stderr
    assert drain.stdout.startswith(
        "node b: drained in pool default, and in job checks, which its job: section pins it to"
    ), drain.stdout
    doc = cluster.wait_running(1, timeout=60, after_generation=generation)
    assert [n["name"] for n in doc["nodes"] if n["group_rank"] is not None] == ["a"]
    assert "b" in db.hgetall(job_cordons) and "b" in db.hgetall(pool_cordons)
    lifted = ctl("--redis", cluster.redis_url, "uncordon", "b")
    assert lifted.returncode == 0 and "node b: uncordoned in pool default" in lifted.stdout
    assert "b" not in db.hgetall(job_cordons) and "b" not in db.hgetall(pool_cordons)
    cluster.wait_running(2, timeout=90, after_generation=doc["generation"])
