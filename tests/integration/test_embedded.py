"""The embedded redis-server's socket directory: the agent's own, 0700, or refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import yaml

from nodeagent.coord import embedded
from nodeagent.errors import ConfigError
from tests.helpers.cluster import wait_for
from tests.helpers.runas import AS_TESTER

EX_CONFIG = 78
NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown to another uid")


def sockdir(base: Path) -> Path:
    return base / f"nodeagent-{os.geteuid()}"


def foreign_0777(base: Path) -> str:
    directory = sockdir(base)
    directory.mkdir()
    os.chown(directory, NOBODY, NOBODY)
    directory.chmod(0o777)
    return "belongs to uid 65534"


def ours_0755(base: Path) -> str:
    sockdir(base).mkdir()
    sockdir(base).chmod(0o755)
    return "has mode 0755; it must be 0700"


def ours_0770(base: Path) -> str:
    sockdir(base).mkdir()
    sockdir(base).chmod(0o770)
    return "has mode 0770"


def symlink_to_ours(base: Path) -> str:
    target = base / "elsewhere"
    target.mkdir(mode=0o700)
    sockdir(base).symlink_to(target)
    return "is a symbolic link"


def a_file(base: Path) -> str:
    sockdir(base).write_text("x")
    return "is not a directory"


def open_parent(base: Path) -> str:
    base.chmod(0o777)  # world-writable without the sticky bit
    return "without the sticky bit"


UNSAFE: list[Callable[[Path], str]] = [ours_0755, ours_0770, symlink_to_ours, a_file, open_parent]


def entries(base: Path) -> list[str]:
    directory = sockdir(base)
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


@needs_root
def test_a_directory_another_user_made_first_is_refused_and_never_used(tmp_path: Path) -> None:
    words = foreign_0777(tmp_path)
    server = embedded.EmbeddedRedis("evil", base=tmp_path)
    with pytest.raises(ConfigError) as err:
        server.start()
    assert err.value.key == "redis.url" and words in str(err.value)
    assert "remove it" in str(err.value)
    assert entries(tmp_path) == []  # no socket, no redis-server files
    assert sockdir(tmp_path).stat().st_uid == NOBODY  # left as it was, not "fixed"


@pytest.mark.parametrize("make", UNSAFE, ids=[f.__name__ for f in UNSAFE])
def test_unsafe_socket_directories_are_refused(tmp_path: Path, make: Callable[[Path], str]) -> None:
    base = tmp_path / "base"
    base.mkdir()
    words = make(base)
    server = embedded.EmbeddedRedis("unsafe", base=base)
    with pytest.raises(ConfigError) as err:
        server.start()
    assert err.value.key == "redis.url" and words in str(err.value)
    assert not server.socket.exists()
    assert server._proc is None  # no redis-server was started


def test_the_agent_makes_its_own_private_directory(tmp_path: Path) -> None:
    server = embedded.EmbeddedRedis("mine", base=tmp_path)
    server.start()
    try:
        info = sockdir(tmp_path).stat()
        assert info.st_uid == os.geteuid() and info.st_mode & 0o777 == 0o700
        assert redis.Redis(unix_socket_path=str(server.socket)).ping()
        assert embedded.embedded_url("mine", bases=(tmp_path,)) == f"unix://{server.socket}"
    finally:
        server.stop()
    assert not server.socket.exists()
    again = embedded.EmbeddedRedis("mine", base=tmp_path)  # the directory it left is reused
    again.start()
    again.stop()


@needs_root
def test_clients_refuse_a_socket_in_a_directory_that_is_not_ours(tmp_path: Path) -> None:
    """nodeagentctl --config finds the socket through embedded_url: never in a foreign place."""
    foreign_0777(tmp_path)
    (sockdir(tmp_path) / "job.redis.sock").write_text("")  # what the other user put there
    with pytest.raises(ConfigError, match="belongs to uid 65534"):
        embedded.embedded_url("job", bases=(tmp_path / "none", tmp_path))
    assert embedded.embedded_url("other", bases=(tmp_path,)).endswith("other.redis.sock")


def run_standalone(tmp_path: Path, job: str, runtime: Path) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "solo", "address": "127.0.0.1"},
                "job": {"id": job, "entrypoint": [sys.executable, "-c", "pass"], **AS_TESTER},
                "metrics": {"listen": "off"},
                "log_dir": str(tmp_path / "logs"),
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RUNTIME_DIRECTORY": str(runtime)},
    )


@pytest.fixture
def runtime() -> Iterator[Path]:
    """A runtime directory with a short path: under pytest's tmp_path (longer under xdist) the
    socket's path would pass the 107 bytes a unix socket's address holds."""
    directory = Path(tempfile.mkdtemp(prefix="run-"))
    yield directory
    shutil.rmtree(directory)


@needs_root
def test_the_agent_exits_78_on_a_foreign_runtime_socket_directory(
    tmp_path: Path, runtime: Path
) -> None:
    words = foreign_0777(runtime)
    result = run_standalone(tmp_path, "evil-run", runtime)
    assert result.returncode == EX_CONFIG, result.stderr[-2000:]
    assert "redis.url: embedded: refusing the socket directory" in result.stderr
    assert words in result.stderr
    assert entries(runtime) == []


def test_the_agent_uses_the_services_runtime_directory(tmp_path: Path, runtime: Path) -> None:
    config = tmp_path / "one.yaml"
    job = f"runtime-{os.getpid()}"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "solo", "address": "127.0.0.1"},
                "job": {
                    "id": job,
                    "entrypoint": [sys.executable, "-c", "import time; time.sleep(60)"],
                    **AS_TESTER,
                },
                "metrics": {"listen": "off"},
                "log_dir": str(tmp_path / "logs"),
                "state_dir": str(tmp_path / "state"),
            }
        )
    )
    log = tmp_path / "agent.log"
    with log.open("w") as out:
        agent = subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RUNTIME_DIRECTORY": f"{runtime}:{tmp_path / 'second'}"},
        )
    socket = sockdir(runtime) / f"{job}.redis.sock"
    try:
        wait_for(lambda: "agent started" in log.read_text(), 30, "the agent to start")
        assert socket.exists() and sockdir(runtime).stat().st_mode & 0o777 == 0o700
    finally:
        agent.terminate()
        agent.wait(30)
    assert agent.returncode == 0, log.read_text()[-2000:]
    assert not socket.exists()


def test_a_socket_path_too_long_for_a_unix_socket_is_a_config_error(tmp_path: Path) -> None:
    base = tmp_path / ("d" * 90)
    base.mkdir()
    server = embedded.EmbeddedRedis("a-job-with-a-long-enough-id", base=base)
    with pytest.raises(ConfigError, match=r"bytes, more than the 107 a unix socket's") as caught:
        server.start()
    assert "shorter RUNTIME_DIRECTORY" in str(caught.value)
    assert not sockdir(base).exists()  # refused before anything was made


def test_why_the_embedded_server_exited_is_told(tmp_path: Path) -> None:
    """redis-server logs to its own file (not to a pipe nobody reads while it runs): the
    reason it exited reaches the agent's error."""
    fake = tmp_path / "redis-server"
    fake.write_text(
        '#!/bin/sh\nwhile [ "$1" != --logfile ]; do shift; done\n'
        'echo "# Failed opening Unix socket: fake reason" > "$2"\nexit 1\n'
    )
    fake.chmod(0o755)
    server = embedded.EmbeddedRedis("exits", binary=str(fake), base=tmp_path)
    with pytest.raises(ConfigError, match="exited: # Failed opening Unix socket: fake reason"):
        server.start()
