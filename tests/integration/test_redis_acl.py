"""The Ansible Redis role's ACL users and TLS, against a real redis-server started with the
configuration rendered from the role's own template (by Ansible's template module).

An agent authenticated as nodeagent-agent runs a job; nodeagentctl as nodeagent-operator reads
the status, scales, cordons; neither can touch a key outside the prefix or run FLUSHALL, SCRIPT
FLUSH or CONFIG, and the operator cannot write the job's record, leases or node keys. Redis's
ACL LOG must stay empty while they work: every command nodeagent sends is allowed.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from nodeagent.coord import ended, poolscripts, scripts
from nodeagent.coord.client import connect
from nodeagent.coord.durable import Durability
from nodeagent.coord.keys import JobKeys, PoolKeys
from nodeagent.coord.lua import Script
from nodeagent.coord.store import JobStore
from tests.helpers.cluster import free_port, local_cluster, nodeagentctl, wait_for
from tests.helpers.munge import MungeDaemon
from tests.helpers.pool import pool_cluster
from tests.helpers.sentinel import DOWN_AFTER_MS

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "ansible" / "roles" / "redis"
BIN = Path(sys.executable).parent
PASSWORDS = {
    "redis_agent_password": "agent-password-0123456789",
    "redis_operator_password": "operator-password-0123456789",
    "redis_admin_password": "admin-password-0123456789",
    "redis_submitter_password": "submitter-password-0123456789",
}
AGENT, OPERATOR, SUBMITTER = "nodeagent-agent", "nodeagent-operator", "nodeagent-submitter"
# redis-py sends CLIENT SETINFO on connect and ignores a refusal; Redis 7.0 has no such command,
# 7.2 refuses it (and logs it) for users not allowed it. Not something nodeagent needs.
IGNORED_DENIALS = {"client|setinfo"}


def command(client: redis.Redis, *args: object) -> Any:
    """Any Redis command (redis-py leaves execute_command untyped)."""
    return client.execute_command(*args)  # type: ignore[no-untyped-call]


def render(
    tmp_path: Path,
    template: str = "nodeagent.conf.j2",
    dest_name: str = "redis.conf",
    **variables: Any,
) -> Path:
    """One of the role's templates as Ansible renders it, with the role's defaults and vars."""
    ansible = BIN / "ansible"
    if not ansible.exists():
        pytest.fail("ansible is missing: pip install -e '.[test]' (.ci/setup does)")
    extra = tmp_path / f"{dest_name}.vars.json"
    extra.write_text(json.dumps(variables))
    dest = tmp_path / dest_name
    result = subprocess.run(
        [
            str(ansible),
            *("localhost", "-i", "localhost,", "-c", "local"),
            *("-e", f"ansible_python_interpreter={sys.executable}"),
            *("-e", f"@{ROLE / 'defaults/main.yml'}", "-e", f"@{ROLE / 'vars/main.yml'}"),
            *("-e", f"@{extra}"),
            *("-m", "ansible.builtin.template"),
            *("-a", f"src={ROLE / 'templates' / template} dest={dest}"),
        ],
        cwd=ROOT / "ansible",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return dest


@dataclass
class RoleRedis:
    port: int
    proc: subprocess.Popen[bytes]
    admin: redis.Redis

    def url(self, user: str, password: str | None = None, scheme: str = "redis") -> str:
        auth = f"{user}:{password}" if password else user
        return f"{scheme}://{auth}@127.0.0.1:{self.port}/0"

    def denials(self) -> list[dict[str, Any]]:
        log: list[dict[str, Any]] = command(self.admin, "ACL", "LOG")
        return [e for e in log if e["object"] not in IGNORED_DENIALS]


def start(tmp_path: Path, conf: Path, port: int, admin: redis.Redis, *more: str) -> RoleRedis:
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed (apt-get install redis-server)")
    log_path = tmp_path / f"{conf.name}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            # the rendered file as it is; the test only keeps its data out of the way
            [binary, str(conf), "--dir", str(tmp_path), "--appendonly", "no", "--save", "", *more],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def up() -> bool:
        assert proc.poll() is None, log_path.read_text()
        try:
            return bool(admin.ping())
        except redis.ConnectionError:
            return False

    wait_for(up, 10, "the role's Redis to start")
    return RoleRedis(port, proc, admin)


@pytest.fixture
def role_redis(tmp_path: Path) -> Iterator[RoleRedis]:
    port = free_port()
    conf = render(tmp_path, redis_port=port, **PASSWORDS)
    admin = redis.Redis(
        port=port,
        username="admin",
        password=PASSWORDS["redis_admin_password"],
        decode_responses=True,
        socket_timeout=5,
    )
    server = start(tmp_path, conf, port, admin)
    yield server
    server.proc.terminate()
    server.proc.wait(10)
    admin.close()


def ctl(
    server: RoleRedis, tmp_path: Path, job: str, *args: str
) -> subprocess.CompletedProcess[str]:
    """nodeagentctl as the operator, its password from a file (not in argv)."""
    password = tmp_path / "operator-password"
    password.write_text(PASSWORDS["redis_operator_password"] + "\n")
    password.chmod(0o600)
    return subprocess.run(
        [
            *(sys.executable, "-m", "nodeagent.cli.ctl"),
            *("--redis", server.url(OPERATOR), "--redis-password-file", str(password)),
            *("--job", job, *args),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def refused(call: Callable[[], object]) -> None:
    """Redis refuses `call` by its ACL; fails the test if Redis carried it out."""
    with pytest.raises(redis.ResponseError) as caught:
        call()
    denied = isinstance(caught.value, redis.exceptions.NoPermissionError) or str(
        caught.value
    ).startswith("The user executing the script can't")  # a script's call (no NOPERM prefix)
    assert denied, caught.value


def test_agents_and_operators_work_within_their_acl(
    role_redis: RoleRedis, tmp_path: Path, job_id: str
) -> None:
    agent_url = role_redis.url(AGENT, PASSWORDS["redis_agent_password"])
    with local_cluster(
        agent_url,
        tmp_path / "cluster",
        job=job_id,
        max_nodes=2,
        timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
    ) as cluster:
        cluster.start("a", "b")
        before = cluster.wait_running(2)
        status = ctl(role_redis, tmp_path, job_id, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["generation"] == before["generation"]
        scaled = ctl(role_redis, tmp_path, job_id, "scale", "1", "--wait", "--timeout", "60s")
        assert scaled.returncode == 0, scaled.stderr
        cluster.wait_running(1, after_generation=before["generation"])
        pool_job = f"{job_id}-queued"  # the pool's nodes are all pinned: it stays pending
        for args in (
            ("cordon", "b"),
            ("uncordon", "b"),
            ("events", "--last", "5"),
            ("submit", "--name", pool_job, "--nodes", "1:2", "--hold", "--", "true"),
            ("scale", pool_job, "2"),  # pending: its spec replaced, the change noted
            ("jobs", "--json"),
            ("nodes",),
            ("release", pool_job),
            ("hold", pool_job),
            ("show", pool_job),
            ("cancel", pool_job),
            ("history",),
        ):
            result = ctl(role_redis, tmp_path, job_id, *args)
            assert result.returncode == 0, (args, result.stderr)

        def state() -> str:
            found = ctl(role_redis, tmp_path, job_id, "jobs", "--json")
            rows = json.loads(found.stdout)["jobs"]
            return str({r["job"]: r["state"] for r in rows}.get(pool_job, ""))

        wait_for(lambda: state() == "cancelled", 20, f"{pool_job} cancelled")
        again = ("submit", "--name", pool_job, "--nodes", "1", "--", "true")  # its id again
        assert ctl(role_redis, tmp_path, job_id, *again).returncode == 0
        wait_for(lambda: state() == "pending", 20, f"{pool_job} pending again")
        assert ctl(role_redis, tmp_path, job_id, "cancel", pool_job).returncode == 0
        assert all(agent.alive() for agent in cluster.agents.values())
    assert role_redis.denials() == []  # nothing nodeagent did was refused


def test_a_submitter_sends_signed_requests_and_writes_nothing_else(
    role_redis: RoleRedis, tmp_path: Path, job_id: str, munged: MungeDaemon
) -> None:
    """pool.auth: munge: nodeagent-submitter submits, lists and cancels through signed requests
    (the pool leader, as nodeagent-agent, does the writes), and Redis refuses it every write
    but a request."""
    agent_url = role_redis.url(AGENT, PASSWORDS["redis_agent_password"])
    password = tmp_path / "submitter-password"
    password.write_text(PASSWORDS["redis_submitter_password"] + "\n")
    password.chmod(0o600)
    auth = {"auth": "munge", "munge_socket": munged.socket}
    with pool_cluster(agent_url, tmp_path, pool=job_id, scheduling=auth) as pool:
        pool.start("a")
        pool.wait_nodes(1)
        keys = PoolKeys("nodeagent", job_id)
        wait_for(lambda: role_redis.admin.get(keys.auth) == "munge", 20, "the leader's auth")
        for args in (
            ("submit", "--name", "work", "--nodes", "1", "--", "/bin/sleep", "600"),
            ("jobs", "--json"),
            ("nodes",),
            ("cancel", "work"),
            ("events", "--pool", "--last", "20"),
        ):
            result = nodeagentctl(
                *("--redis", role_redis.url(SUBMITTER), "--redis-password-file", str(password)),
                *("--pool", job_id, "--munge-socket", munged.socket, *args),
            )
            assert result.returncode == 0, (args, result.stderr)
        pool.wait_job("work", "cancelled")
        assert role_redis.denials() == []  # nothing nodeagent did was refused
        submitter = redis.Redis.from_url(
            role_redis.url(SUBMITTER, PASSWORDS["redis_submitter_password"]),
            decode_responses=True,
        )
        try:
            assert submitter.xadd(keys.requests, {"request": "{}"})  # the one write it has
            refused(lambda: submitter.hset(keys.specs, "x", "{}"))
            refused(lambda: submitter.hset(keys.jobs, "x", "{}"))
            refused(lambda: submitter.hset(keys.cancels, "work", "me"))
            refused(lambda: submitter.hset(keys.cordons, "a", "{}"))
            refused(lambda: submitter.hset(keys.queues, "q", "{}"))
            refused(lambda: submitter.hset(keys.placements, "a", "x"))
            refused(lambda: submitter.set(keys.auth, "none"))
            refused(lambda: submitter.xadd(keys.events, {"event": "{}"}))
            refused(lambda: submitter.xadd(keys.job("work").commands, {"command": "{}"}))
        finally:
            submitter.close()


def test_neither_user_can_leave_its_keys_or_administer(role_redis: RoleRedis, job_id: str) -> None:
    keys = JobKeys("nodeagent", job_id)
    agent = redis.Redis.from_url(role_redis.url(AGENT, PASSWORDS["redis_agent_password"]))
    operator = redis.Redis.from_url(role_redis.url(OPERATOR, PASSWORDS["redis_operator_password"]))
    outside = "other-app:secret"
    role_redis.admin.set(outside, "x")
    for client in (agent, operator):
        refused(lambda c=client: c.get(outside))  # type: ignore[misc]
        refused(lambda c=client: c.set("nodeagent-x", "1"))  # type: ignore[misc]
        for admin in (("FLUSHALL",), ("SCRIPT", "FLUSH"), ("CONFIG", "GET", "*"), ("KEYS", "*")):
            refused(lambda c=client, x=admin: command(c, *x))  # type: ignore[misc]
        # a script runs with its caller's rights: no way out through Lua either
        sha = client.script_load(f"return redis.call('SET', '{outside}', 'pwned')")
        refused(lambda c=client, s=sha: c.evalsha(s, 0))  # type: ignore[misc]
    assert role_redis.admin.get(outside) == "x"
    agent.set(keys.leader, "a 1", px=1000)  # the agents' keys are theirs
    # the operator reads the job but writes only commands, cordons and events
    assert operator.get(keys.leader) == b"a 1"
    for write in (
        lambda: operator.hset(keys.record, "record", "{}"),
        lambda: operator.set(keys.node("a"), "{}"),
        lambda: operator.delete(keys.leader),
        lambda: command(operator, "ZADD", keys.leases, 1, "evil"),
    ):
        refused(write)
    sha = operator.script_load("return redis.call('HSET', KEYS[1], 'record', 'forged')")
    refused(lambda: operator.evalsha(sha, 1, keys.record))
    operator.hset(keys.cordons, "b", "{}")  # what nodeagentctl cordon writes
    operator.xadd(keys.commands, {"command": "{}"})
    assert role_redis.denials() != []  # each refusal above was logged
    agent.close()
    operator.close()


def acl_commands(*lists: str) -> set[str]:
    variables = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    return {command for name in lists for command in variables[name]}


def test_every_command_the_scripts_send_is_granted(role_redis: RoleRedis) -> None:
    """The Lua in nodeagent/coord/scripts.py, poolscripts.py, ended.py: every command it names is in
    the agents' list, so a new call cannot be added without the ACL that lets it run (Redis
    checks script calls against the caller's ACL)."""
    source = "\n".join(
        value.source
        for module in (scripts, poolscripts, ended)
        for value in vars(module).values()
        if isinstance(value, Script)
    )
    words = set(re.findall(r"'([A-Z]+)'", source))
    known = {str(name).lower() for name in role_redis.admin.command_list()}
    commands = {w.lower() for w in words} & known
    found = {"time", "hmget", "zrangebyscore", "zscan", "xadd"}
    assert found <= commands  # the parse found the scripts' calls
    granted = acl_commands("redis_acl_connection", "redis_acl_scripts", "redis_acl_agent")
    assert commands - granted == set()


def test_tls_only_with_the_role_template(tmp_path: Path, job_id: str) -> None:
    """redis_tls: the plain port is closed, and the users work over rediss:// with the CA."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate (apt-get install openssl)")
    tls = tmp_path / "tls"
    tls.mkdir()
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(tls / "redis.key"), "-out", str(tls / "redis.crt")),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    shutil.copy(tls / "redis.crt", tls / "ca.crt")
    port = free_port()
    conf = render(
        tmp_path, redis_tls=True, redis_tls_port=port, redis_tls_dir=str(tls), **PASSWORDS
    )
    assert "\nport 0\n" in conf.read_text()  # no plain-text port
    ca = f"?ssl_ca_certs={tls / 'ca.crt'}"
    admin = redis.Redis.from_url(
        f"rediss://admin:{PASSWORDS['redis_admin_password']}@127.0.0.1:{port}/0{ca}",
        decode_responses=True,
        socket_timeout=5,
    )
    server = start(tmp_path, conf, port, admin)
    try:
        url = server.url(AGENT, PASSWORDS["redis_agent_password"], scheme="rediss") + ca
        store = JobStore(connect(url, 5.0), JobKeys("nodeagent", job_id))
        assert store.snapshot().record is None  # the agents' user reads its job over TLS
        plain = redis.Redis(port=port, socket_timeout=2)
        with pytest.raises(redis.ConnectionError):  # TLS port, plain-text client
            plain.ping()
        plain.close()
        store.client.close()
        time.sleep(0.1)
        assert server.denials() == []
    finally:
        server.proc.terminate()
        server.proc.wait(10)
        admin.close()


def test_the_rendered_config_holds_no_password(tmp_path: Path) -> None:
    text = render(tmp_path, redis_port=6379, **PASSWORDS).read_text()
    assert not any(password in text for password in PASSWORDS.values())
    assert "user default off" in text and "+@all" not in text.split("user admin")[0]


@pytest.mark.parametrize(
    ("agent", "operator"),
    [
        ("", "operator-password-0123456789"),  # none given (the role's default)
        ("change-me", "operator-password-0123456789"),  # the old shared default
        ("short", "operator-password-0123456789"),
        ("same-password-0123456789", "same-password-0123456789"),
    ],
)
def test_the_redis_role_refuses_bad_passwords(tmp_path: Path, agent: str, operator: str) -> None:
    inventory = tmp_path / "hosts.yml"
    host = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    inventory.write_text(json.dumps({"redis": {"hosts": {"localhost": host}}}))
    extra = {"redis_agent_password": agent, "redis_operator_password": operator}
    result = subprocess.run(
        [
            *(str(BIN / "ansible-playbook"), "-i", str(inventory), "redis.yml", "--check"),
            *("-e", json.dumps(extra)),
        ],
        cwd=ROOT / "ansible",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "Set redis_agent_password" in result.stdout, result.stdout
    assert operator not in result.stdout  # the passwords are not echoed


SENTINEL_PASSWORDS = {
    "redis_replication_password": "replication-password-0123456789",
    "redis_sentinel_password": "sentinel-password-0123456789",
}


def test_the_role_s_primary_replica_and_sentinels_fail_over_with_their_users(
    tmp_path: Path, job_id: str
) -> None:
    """The role's templates for a primary, a replica (its first primary written once) and three
    sentinels, started as rendered: nodeagent's users find the primary through the sentinels
    and confirm their writes on the replica (WAIT); the primary killed, a sentinel promotes the
    replica, the old primary started again comes back as its replica through the replication
    user, and writes are confirmed there again. Nothing refused by an ACL anywhere."""
    ports = [free_port() for _ in range(5)]
    primary_port, replica_port, sentinel_ports = ports[0], ports[1], ports[2:]
    common: dict[str, Any] = {
        **PASSWORDS,
        **SENTINEL_PASSWORDS,
        "redis_sentinel_down_after_ms": DOWN_AFTER_MS,
    }
    dirs = {name: tmp_path / name for name in ("primary", "replica", "s0", "s1", "s2")}
    for directory in dirs.values():
        directory.mkdir()
    primary_conf = render(dirs["primary"], redis_port=primary_port, **common)
    replica_conf = render(dirs["replica"], redis_port=replica_port, **common)
    first = render(
        dirs["replica"],
        "replication.conf.j2",
        "replication.conf",
        redis_replica_of=f"127.0.0.1 {primary_port}",
        **common,
    )
    assert f"replicaof 127.0.0.1 {primary_port}" in first.read_text()

    def admin(port: int) -> redis.Redis:
        return redis.Redis(
            port=port, username="admin", password=PASSWORDS["redis_admin_password"],
            decode_responses=True, socket_timeout=5,
        )  # fmt: skip

    servers = [start(dirs["primary"], primary_conf, primary_port, admin(primary_port))]
    servers.append(
        start(
            dirs["replica"],
            replica_conf,
            replica_port,
            admin(replica_port),
            "--include",
            str(first),
        )
    )
    sentinels = []
    try:
        wait_for(
            lambda: servers[1].admin.info("replication")["master_link_status"] == "up",
            20,
            "the replica to sync as the replication user",
        )
        for index, port in enumerate(sentinel_ports):
            conf = render(
                dirs[f"s{index}"],
                "sentinel.conf.j2",
                "sentinel.conf",
                redis_sentinel_port=port,
                redis_sentinel_primary="127.0.0.1",
                redis_port=primary_port,
                **common,
            )
            sentinels.append(start(dirs[f"s{index}"], conf, port, admin(port), "--sentinel"))
        hosts = ",".join(f"127.0.0.1:{p}" for p in sentinel_ports)
        agent_url = (
            f"redis+sentinel://{AGENT}:{PASSWORDS['redis_agent_password']}@{hosts}/nodeagent/0"
        )
        agent = connect(agent_url, 5.0)
        keys = PoolKeys("nodeagent", job_id)
        durable = Durability(1, 2000)
        agent.set(keys.durability, durable.to_json())  # as a pool leader publishes it
        durable.confirm(agent, keys.acks)  # the agents' user: through the sentinels, WAIT

        password = tmp_path / "operator-password"
        password.write_text(PASSWORDS["redis_operator_password"] + "\n")
        password.chmod(0o600)
        operator_url = f"redis+sentinel://{OPERATOR}@{hosts}/nodeagent/0"

        def submit(name: str) -> subprocess.CompletedProcess[str]:
            return nodeagentctl(
                *("--redis", operator_url, "--redis-password-file", str(password)),
                *("--pool", job_id, "submit", "--name", name, "--hold", "--", "true"),
            )

        done = submit("before")
        assert done.returncode == 0, done.stderr  # the operator's write, confirmed (WAIT)

        servers[0].proc.kill()
        servers[0].proc.wait(10)
        wait_for(
            lambda: servers[1].admin.info("replication")["role"] == "master",
            30,
            "a sentinel to promote the replica",
        )
        servers[0] = start(dirs["primary"], primary_conf, primary_port, admin(primary_port))
        wait_for(
            lambda: servers[0].admin.info("replication").get("master_link_status") == "up",
            60,
            "the old primary to come back as the replica, as the replication user",
        )
        after = submit("after")
        assert after.returncode == 0, after.stderr
        assert set(servers[1].admin.hkeys(keys.jobs)) == {"before", "after"}
        assert [s.denials() for s in (*servers, *sentinels)] == [[]] * 5
        agent.close()
    finally:
        for server in (*servers, *sentinels):
            server.proc.terminate()
            server.proc.wait(10)
            server.admin.close()
