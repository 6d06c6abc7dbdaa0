"""`nodeagent config check` and `nodeagent run` as systemd runs them: exit codes and messages
for bad configs and refused credentials, and signals that must not kill the agent."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from nodeagent.cli.daemon import main
from nodeagent.runtime.signalwatch import SignalWatch
from nodeagent.supervisor.fence import start_ticks
from tests.helpers.cluster import RedisServer, free_port, local_cluster, wait_for
from tests.helpers.runas import AS_TESTER

EX_CONFIG = 78
NOBODY = 65534
NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a run that got this far would retry


def nodeagent(*args: str, **options: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nodeagent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **options,
    )


def running(config: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """`nodeagent run --config` in the background, its output in `log_path`."""
    with log_path.open("w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "nodeagent", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def document(tmp_path: Path, **changes: object) -> dict[str, Any]:
    data: dict[str, Any] = {
        "node": {"name": "d1", "address": "127.0.0.1"},
        "redis": {"url": NOWHERE},
        "job": {"id": "daemon", "entrypoint": [sys.executable, "-c", "pass"], **AS_TESTER},
        "metrics": {"listen": "127.0.0.1:0"},
        "log_dir": str(tmp_path / "logs"),
        "state_dir": str(tmp_path / "state"),
    }
    for path, value in changes.items():
        *parents, last = path.split("__")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return data


def text(tmp_path: Path, **changes: object) -> bytes:
    return yaml.safe_dump(document(tmp_path, **changes)).encode()


def raw(tmp_path: Path, extra: bytes) -> bytes:
    """The base document with `extra` appended at the top level."""
    return text(tmp_path) + extra


CASES = [
    ("not-utf8", lambda p: raw(p, b"# caf\xe9\n"), "", "not UTF-8 text"),
    (
        "duplicate",
        lambda p: raw(p, b"timing:\n  lease_ttl: 5s\n  lease_ttl: 1s\n"),
        "timing.lease_ttl",
        "given twice",
    ),
    ("port-abc", lambda p: text(p, redis__url="redis://127.0.0.1:abc/0"), "redis.url", "port"),
    ("port-99999", lambda p: text(p, redis__url="redis://127.0.0.1:99999/0"), "redis.url", "port"),
    (
        "sentinel-no-service",
        lambda p: text(p, redis__url="redis+sentinel://127.0.0.1:26379"),
        "redis.url",
        "names its service",
    ),
    ("db-abc", lambda p: text(p, redis__url="redis://127.0.0.1:6379/abc"), "redis.url", "number"),
    ("env-list", lambda p: text(p, job__env={"A": [1, 2]}), "job.env.A", "got list"),
    ("env-null", lambda p: text(p, job__env={"A": None}), "job.env.A", "got NoneType"),
    (
        "heartbeat-0",
        lambda p: text(p, timing__heartbeat_interval=0),
        "timing.heartbeat_interval",
        "50ms",
    ),
    ("lease-0", lambda p: text(p, timing__lease_ttl="0s"), "timing.lease_ttl", "more than 0"),
    (
        "grace-off",
        lambda p: raw(p, b"timing: {stop_grace_period: off}\n"),
        "timing.stop_grace_period",
        "cannot be off",
    ),
    (
        "metrics-unresolvable",
        lambda p: text(p, metrics__listen="no-such-host.invalid:9410"),
        "metrics.listen",
        "cannot resolve",
    ),
    (
        "metrics-not-here",
        lambda p: text(p, metrics__listen="192.0.2.1:9410"),
        "metrics.listen",
        "cannot listen",
    ),
    ("log-dir-file", lambda p: text(p, log_dir=str(p / "a-file")), "log_dir", "is not a directory"),
    (
        "state-dir-file",
        lambda p: text(p, state_dir=str(p / "a-file")),
        "state_dir",
        "is not a directory",
    ),
    (
        "program-missing",
        lambda p: text(p, job__entrypoint=["trainx-missing"]),
        "job.entrypoint",
        "not found",
    ),
    (
        "script-missing",
        lambda p: text(p, job__entrypoint=[sys.executable, str(p / "nope.py")]),
        "job.entrypoint",
        "not found",
    ),
    (
        "workdir-missing",
        lambda p: text(p, job__working_dir=str(p / "nowhere")),
        "job.working_dir",
        "does not exist",
    ),
]


@pytest.mark.parametrize("command", ["check", "run"])
@pytest.mark.parametrize(
    ("content", "key", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_check_and_run_refuse_the_same_configs(
    tmp_path: Path, command: str, content: Any, key: str, words: str
) -> None:
    (tmp_path / "a-file").write_text("x")
    path = tmp_path / "config.yaml"
    path.write_bytes(content(tmp_path))
    args = ("config", "check", str(path)) if command == "check" else ("run", "--config", str(path))
    result = nodeagent(*args)
    assert result.returncode == EX_CONFIG, result.stderr
    assert f"invalid configuration: {key}" in result.stderr and words in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "extra",
    [
        b"metrics: {listen: off}\n",  # as config/nodeagent.example.yaml documents it
        b"timing: {stop_grace_period: 0, failure_stop_grace_period: 0, hang_timeout: off}\n",
        b"health: {gpu: off}\n",
    ],
)
def test_check_accepts_what_the_docs_allow(tmp_path: Path, extra: bytes) -> None:
    data = document(tmp_path)
    data.pop("metrics")
    path = tmp_path / "config.yaml"
    path.write_bytes(yaml.safe_dump(data).encode() + extra)
    result = nodeagent("config", "check", str(path))
    assert result.returncode == 0 and "OK" in result.stdout, result.stderr


def test_check_creates_nothing_and_syntax_only_skips_this_node(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(text(tmp_path, job__working_dir="/opt/elsewhere/train"))
    result = nodeagent("config", "check", str(path))
    assert result.returncode == EX_CONFIG and "job.working_dir" in result.stderr
    portable = nodeagent("config", "check", "--syntax-only", str(path))
    assert portable.returncode == 0 and "OK" in portable.stdout, portable.stderr
    assert not (tmp_path / "logs").exists() and not (tmp_path / "state").exists()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can read (pytest's tmp_path is 0700, root's)."""
    directory = Path(tempfile.mkdtemp(prefix="nodeagent-test-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main_as(uid: int, args: list[str], stderr: Path) -> int:
    """`nodeagent ARGS` in a forked child that has become `uid` (this Python's files may be
    unreadable to that user, so it cannot exec a fresh interpreter); its exit code."""
    with warnings.catch_warnings():  # Python 3.12 warns of fork() with threads; the child
        warnings.simplefilter("ignore", DeprecationWarning)  # only calls main() and exits
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 99
        try:
            sys.stderr = stderr.open("w")
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            code = main(args)
        except BaseException as exc:
            print(f"child failed: {exc!r}", file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
@pytest.mark.parametrize("key", ["log_dir", "state_dir"])
@pytest.mark.parametrize("command", ["check", "run"])
def test_a_directory_this_user_cannot_write_is_refused(
    shared_dir: Path, tmp_path: Path, key: str, command: str
) -> None:
    """Root passes every permission check, so the agent runs as `nobody` here."""
    for name in ("logs", "state"):
        (shared_dir / name).mkdir()
        (shared_dir / name).chmod(0o777)
    (shared_dir / ("logs" if key == "log_dir" else "state")).chmod(0o755)  # root's, not nobody's
    path = shared_dir / "config.yaml"
    path.write_bytes(text(shared_dir, job__user=None))  # nobody's workers: nobody's own
    path.chmod(0o644)
    args = ["config", "check", str(path)] if command == "check" else ["run", "--config", str(path)]
    code = main_as(NOBODY, args, tmp_path / "stderr")
    stderr = (tmp_path / "stderr").read_text()
    assert code == EX_CONFIG, stderr
    assert f"invalid configuration: {key}: cannot write in" in stderr


# -- credentials ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def password_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real redis-server that requires the password s3cret; its port."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed"
    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--requirepass",
            "s3cret",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path_factory.mktemp("redis-auth")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, password="s3cret", socket_timeout=0.5)

    def up() -> bool:
        with contextlib.suppress(redis.RedisError):
            return bool(client.ping())
        return False

    try:
        wait_for(up, 10, "redis-server with a password")
        yield port
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(
    "auth", [":wrong@", "", "bob:s3cret@", "default:wrong@"], ids=["wrong", "none", "user", "acl"]
)
def test_refused_credentials_exit_78(tmp_path: Path, password_redis: int, auth: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(text(tmp_path, redis__url=f"redis://{auth}127.0.0.1:{password_redis}/0"))
    result = nodeagent("run", "--config", str(path))
    assert result.returncode == EX_CONFIG, result.stderr[-2000:]
    assert "redis.url: Redis refused the credentials" in result.stderr
    assert "s3cret" not in result.stderr and ":wrong@" not in result.stderr


def test_the_right_password_runs_the_job(tmp_path: Path, password_redis: int, job_id: str) -> None:
    url = f"redis://:s3cret@127.0.0.1:{password_redis}/0"
    path = tmp_path / "config.yaml"
    path.write_bytes(
        text(
            tmp_path,
            redis__url=url,
            job__id=job_id,
            job__entrypoint=[sys.executable, "-c", "print('trained')"],
            timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
        )
    )
    log_path = tmp_path / "agent.log"
    agent = running(path, log_path)
    try:
        wait_for(lambda: "[rank 0]: trained" in log_path.read_text(), 30, "the worker's output")
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    assert agent.returncode == 0, log_path.read_text()[-2000:]
    assert "s3cret" not in log_path.read_text()


def test_a_second_agent_of_the_same_node_and_job_is_refused(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    """It would take the first's running workers for a dead agent's leftovers and kill them."""
    path = tmp_path / "config.yaml"
    marker = tmp_path / "worker.pid"
    sleeper = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    path.write_bytes(
        text(
            tmp_path,
            redis__url=redis_server.url,
            job__id=job_id,
            job__entrypoint=[sys.executable, "-c", sleeper],
            # a lease a loaded machine does not lapse: a 1 s one could fence the worker this
            # test checks (CI's failure here was the sweep, supervisor/jobcgroup.py)
            timing={"heartbeat_interval": "500ms", "lease_ttl": "5s"},
        )
    )
    log_path = tmp_path / "agent.log"
    first = running(path, log_path)
    try:
        wait_for(lambda: marker.exists() and marker.read_text(), 30, "the first agent's worker")
        worker = int(marker.read_text())
        second = nodeagent("run", "--config", str(path))
        assert second.returncode == EX_CONFIG, second.stderr[-2000:]
        assert f"another nodeagent on this machine runs d1.{job_id}" in second.stderr
        assert "give this one another node.name or job id" in second.stderr
        os.kill(worker, 0)  # still running
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(30)
    assert first.returncode == 0, log_path.read_text()[-2000:]


def test_what_an_older_agent_left_under_the_nodes_record_is_killed(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    """Before records were per job a pinned agent's was `<node>.workers.json`."""
    left = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own process group
    state = tmp_path / "state"
    state.mkdir()
    legacy = state / "d1.workers.json"
    legacy.write_text(json.dumps({"groups": [[left.pid, start_ticks(left.pid)]]}))
    path = tmp_path / "config.yaml"
    path.write_bytes(text(tmp_path, redis__url=redis_server.url, job__id=job_id))
    log_path = tmp_path / "agent.log"
    agent = running(path, log_path)
    try:
        assert left.wait(30) == -signal.SIGKILL, log_path.read_text()[-2000:]
        # the record goes with the kill and the warning after it: wait for that line
        wait_for(lambda: "left by a previous agent" in log_path.read_text(), 30, "the warning")
        assert not legacy.exists()
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
        left.kill()
        left.wait()


def test_an_unreachable_redis_at_start_up_is_still_retried(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(text(tmp_path, redis__url=f"redis://:s3cret@127.0.0.1:{free_port()}/0"))
    log_path = tmp_path / "agent.log"
    agent = running(path, log_path)
    try:
        wait_for(lambda: "cannot reach Redis" in log_path.read_text(), 30, "a retry")
        assert agent.poll() is None, log_path.read_text()
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    assert "refused the credentials" not in log_path.read_text()


# -- signals -------------------------------------------------------------------------------


def test_sighup_and_sigusr1_never_kill_the_agent(
    redis_server: RedisServer, tmp_path: Path, job_id: str
) -> None:
    with local_cluster(redis_server.url, tmp_path, job=job_id, max_nodes=1) as cluster:
        cluster.start("a")
        before = cluster.wait_running(1)
        agent = cluster.agents["a"]
        workers = sorted(cluster.worker_pids("a"))
        said = {signal.SIGHUP: "SIGHUP received and ignored", signal.SIGUSR1: "SIGUSR1: the stacks"}
        for n, sig in enumerate((signal.SIGHUP, signal.SIGUSR1, signal.SIGHUP, signal.SIGUSR1)):
            os.kill(agent.proc.pid, sig)
            # One at a time, each seen before the next: two of a kind sent before the agent's
            # handler ran would be one delivery (the kernel and Python merge a pending signal).
            line, times = said[sig], n // 2 + 1
            wait_for(
                lambda line=line, times=times: agent.log().count(line) == times,  # type: ignore[misc]
                10,
                f"{sig.name} #{times}",
            )
        log = agent.log()
        # faulthandler's dump of the loop
        assert "Current thread" in log and "nodeagent/runtime/nodeloop.py" in log
        assert agent.alive() and sorted(cluster.worker_pids("a")) == workers
        after = cluster.status()
        assert after["generation"] == before["generation"] and after["state"] == "running"
        agent.proc.send_signal(signal.SIGTERM)
        assert agent.proc.wait(30) == 0


def test_sigusr1_logs_the_stacks_where_stderr_has_no_descriptor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """faulthandler needs a file descriptor; without one the stacks go through logging."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGUSR1)}
    watch = SignalWatch(stream=io.StringIO())
    watch.install()
    try:
        with caplog.at_level(logging.WARNING, logger="nodeagent.runtime.signalwatch"):
            os.kill(os.getpid(), signal.SIGUSR1)

            def dumped() -> str | None:
                found = [r.getMessage() for r in caplog.records if "SIGUSR1" in r.getMessage()]
                return found[0] if found else None

            message = wait_for(dumped, 10, "the stacks in the log")
    finally:
        watch.close()
    assert "the agent's threads" in message and "test_sigusr1_logs_the_stacks" in message
    assert {sig: signal.getsignal(sig) for sig in before} == before  # handlers restored
