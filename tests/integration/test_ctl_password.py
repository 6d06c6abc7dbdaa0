"""nodeagentctl against a real redis-server started with --requirepass: the password can come
from a file or the environment instead of argv, and a refused one says so (exit 78) and changes
nothing."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis

from nodeagent.coord.keys import JobKeys
from tests.helpers.cluster import free_port, local_cluster, wait_for
from tests.helpers.cluster import nodeagentctl as ctl
from tests.helpers.fingerprint import fingerprint

PASSWORD = "s3cret pass/word@1"  # a space, a slash and an @: it must survive URL encoding
EX_CONFIG = 78
JOB = "secured"
KEYS = JobKeys("nodeagent", JOB)


@dataclass(frozen=True)
class Secured:
    port: int
    admin: redis.Redis
    directory: Path

    def url(self, auth: str = "") -> str:
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def password_file(self, password: str) -> str:
        path = self.directory / f"pw-{abs(hash(password))}"
        path.write_text(f"{password}\n")
        path.chmod(0o600)
        return str(path)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """A redis-server that wants PASSWORD, a real agent n1 running job JOB through it (its
    config carries the password in the URL), and a user `viewer` (password `viewpw`) that may
    read everything and write nothing."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (apt-get install redis-server)"
    directory = tmp_path_factory.mktemp("secured")
    port = free_port()
    options = {"port": str(port), "bind": "127.0.0.1", "save": "", "appendonly": "no"}
    options |= {"dir": str(directory), "requirepass": PASSWORD}
    proc = subprocess.Popen(
        [binary, *(part for name, value in options.items() for part in (f"--{name}", value))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    admin = redis.Redis(port=port, password=PASSWORD, decode_responses=True)
    try:

        def up() -> bool:
            with contextlib.suppress(redis.ConnectionError):
                return bool(admin.ping())
            return False

        wait_for(up, 10, "redis-server with --requirepass")
        admin.acl_setuser(
            "viewer", enabled=True, passwords=["+viewpw"], keys=["*"], commands=["+@all", "-@write"]
        )
        url = f"redis://:{quoted(PASSWORD)}@127.0.0.1:{port}/0"
        # A lease a loaded machine cannot lapse: a re-formed job would change what the refused
        # commands are shown not to have changed (seen in CI with the 1 s default).
        timing = {"heartbeat_interval": "1s", "lease_ttl": "10s"}
        with local_cluster(url, directory / "job", job=JOB, max_nodes=1, timing=timing) as cluster:
            cluster.start("n1")
            cluster.wait_running(1, timeout=60)
            yield Secured(port, admin, directory)
    finally:
        admin.close()
        proc.terminate()
        proc.wait(10)


def quoted(password: str) -> str:
    return quote(password, safe="")


# (id, how the password is given, the message's fragments). `url` is the URL's user part;
# `file` and `env` the password in --redis-password-file and NODEAGENT_REDIS_PASSWORD.
REFUSED = [
    ("none-given", {}, ["Redis refused the credentials", "no password was given"]),
    ("wrong-in-url", {"url": ":wrong-pw@"}, ["Redis refused the credentials"]),
    ("wrong-in-file", {"file": "wrong-pw"}, ["Redis refused the credentials"]),
    ("wrong-in-env", {"env": "wrong-pw"}, ["Redis refused the credentials"]),
    ("unknown-user", {"url": "nobody@", "file": PASSWORD}, ["Redis refused the credentials"]),
    ("url-beats-env", {"url": ":wrong-pw@", "env": PASSWORD}, ["refused the credentials"]),
    ("file-beats-env", {"file": "wrong-pw", "env": PASSWORD}, ["refused the credentials"]),
]


def invocation(secured: Secured, how: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    args = ["--redis", secured.url(how.get("url", ""))]
    if "file" in how:
        args += ["--redis-password-file", secured.password_file(how["file"])]
    env = {"NODEAGENT_REDIS_PASSWORD": how["env"]} if "env" in how else {}
    return [*args, "--job", JOB], env


@pytest.mark.parametrize("command", [["status"], ["stop"], ["cordon", "n1"]])
@pytest.mark.parametrize(
    ("how", "fragments"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_a_refused_password_exits_78_and_writes_nothing(
    secured: Secured, how: dict[str, str], fragments: list[str], command: list[str]
) -> None:
    before = fingerprint(secured.admin)
    args, env = invocation(secured, how)
    result = ctl(*args, *command, env=env)
    assert result.returncode == EX_CONFIG, result.stderr
    for fragment in fragments:
        assert fragment in result.stderr
    assert "cannot reach Redis" not in result.stderr
    assert PASSWORD not in result.stderr and "wrong-pw" not in result.stderr
    assert fingerprint(secured.admin) == before


ACCEPTED = [
    ("in-file", {"file": PASSWORD}),
    ("in-env", {"env": PASSWORD}),
    ("in-url", {"url": f":{quoted(PASSWORD)}@"}),
    ("file-beats-env", {"file": PASSWORD, "env": "wrong-pw"}),
    ("url-beats-env", {"url": f":{quoted(PASSWORD)}@", "env": "wrong-pw"}),
    ("user-in-url-password-in-file", {"url": "default@", "file": PASSWORD}),
]


@pytest.mark.parametrize("how", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_the_password_from_a_file_the_environment_or_the_url(
    secured: Secured, how: dict[str, str]
) -> None:
    args, env = invocation(secured, how)
    status = ctl(*args, "status", "--json", env=env)
    assert status.returncode == 0, status.stderr
    assert '"name": "n1"' in status.stdout


def test_a_write_with_the_password_from_a_file(secured: Secured) -> None:
    args, _ = invocation(secured, {"file": PASSWORD})
    cordon = ctl(*args, "cordon", "n1", "--reason", "password test")
    assert cordon.returncode == 0, cordon.stderr
    assert "n1" in secured.admin.hgetall(KEYS.cordons)
    uncordon = ctl(*args, "uncordon", "n1")
    assert uncordon.returncode == 0 and "uncordoned" in uncordon.stdout
    assert "n1" not in secured.admin.hgetall(KEYS.cordons)


def test_a_user_without_write_permission_is_told_so(secured: Secured) -> None:
    args, _ = invocation(secured, {"url": "viewer:viewpw@"})
    assert ctl(*args, "status").returncode == 0  # reading is allowed
    before = fingerprint(secured.admin)
    result = ctl(*args, "cordon", "n1")
    assert result.returncode == EX_CONFIG, result.stderr
    assert "Redis refused the command for this user (ACL)" in result.stderr
    assert "cannot reach Redis" not in result.stderr
    assert fingerprint(secured.admin) == before
