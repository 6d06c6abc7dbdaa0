"""The command-line entry points as a user runs them: exit codes and messages."""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nodeagent.coord import embedded
from nodeagent.errors import ConfigError
from tests.helpers.cluster import RedisServer, free_port, local_cluster, wait_for
from tests.helpers.runas import AS_TESTER

EX_CONFIG = 78


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=60)


def test_version() -> None:
    result = run("nodeagent", "--version")
    assert result.returncode == 0 and result.stdout.startswith("nodeagent ")


def test_config_check(tmp_path: Path) -> None:
    """The example is written for a GPU node (/opt/train...): checked without this node, but
    for its user database: the example's workers are the nodeagent user's, not on this node."""
    example = Path(__file__).resolve().parents[2] / "config" / "nodeagent.example.yaml"
    data = yaml.safe_load(example.read_text())
    data["job"].update(AS_TESTER)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(data))
    ok = run("nodeagent", "config", "check", "--syntax-only", str(good))
    assert ok.returncode == 0 and "OK" in ok.stdout
    bad = tmp_path / "bad.yaml"
    data["timing"]["lease_ttl"] = "1s"
    bad.write_text(yaml.safe_dump(data))
    result = run("nodeagent", "config", "check", "--syntax-only", str(bad))
    assert result.returncode == EX_CONFIG
    assert "timing.lease_ttl" in result.stderr and "twice heartbeat_interval" in result.stderr


def test_run_exits_78_on_a_bad_config_without_touching_redis(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "redis: {url: redis://127.0.0.1:1/0}\n"
        'job: {id: x, entrypoint: ["true"], min_nodes: 3, max_nodes: 2}\n'
    )
    result = run("nodeagent", "run", "--config", str(bad))
    assert result.returncode == EX_CONFIG and "job.min_nodes" in result.stderr
    missing = run("nodeagent", "run", "--config", str(tmp_path / "nope.yaml"))
    assert missing.returncode == EX_CONFIG and "cannot read config file" in missing.stderr


def test_ctl_errors() -> None:
    unreachable = run(
        "nodeagent.cli.ctl", "--redis", f"redis://127.0.0.1:{free_port()}/0", "--job", "x", "status"
    )
    assert unreachable.returncode == 69 and "cannot reach Redis" in unreachable.stderr
    nowhere = run("nodeagent.cli.ctl", "status")
    assert nowhere.returncode == 2 and "--config" in nowhere.stderr


def test_scale_before_the_job_formed(redis_server: RedisServer, job_id: str) -> None:
    result = run("nodeagent.cli.ctl", "--redis", redis_server.url, "--job", job_id, "scale", "2")
    assert result.returncode == 3 and "has not formed yet" in result.stderr  # no such job yet


def test_status_table_and_events(redis_server: RedisServer, job_id: str, tmp_path: Path) -> None:
    with local_cluster(redis_server.url, tmp_path, job=job_id, max_nodes=2) as cluster:
        cluster.start("a", "b")
        cluster.wait_running(2)
        table = cluster.ctl("status")
        assert table.returncode == 0
        assert f"job {job_id}: running" in table.stdout
        rows = [line.split()[:3] for line in table.stdout.splitlines()]
        # Ranks follow the order the nodes joined in, which a loaded machine may swap.
        ranks = {row[0]: row[2] for row in rows if row[1:2] == ["running"] and row[0] in ("a", "b")}
        assert sorted(ranks) == ["a", "b"] and sorted(ranks.values()) == ["0", "1"], rows
        events = cluster.ctl("events")
        assert "generation_started" in events.stdout
        assert re.search(r"world 2 on (a, b|b, a)\b", events.stdout), events.stdout
        via_config = run(
            "nodeagent.cli.ctl", "--config", str(cluster.config_path("a")), "status", "--json"
        )
        assert via_config.returncode == 0 and '"world_size": 2' in via_config.stdout
        follow = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "nodeagent.cli.ctl",
                "--redis",
                redis_server.url,
                "--job",
                job_id,
                "events",
                "--follow",
                "--last",
                "0",
                "--json",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            out = follow.stdout
            assert out is not None
            seen: list[str] = []

            def restart_seen() -> bool:
                cluster.ctl("restart")  # until the follower, started concurrently, sees one
                ready, _, _ = select.select([out], [], [], 1.0)
                if ready:
                    seen.append(out.readline())
                return any("restart_requested" in line for line in seen)

            wait_for(restart_seen, 30, "events --follow to print restart_requested")
            assert all("type" in json.loads(line) for line in seen)  # --json: one object a line
        finally:
            follow.kill()
            follow.wait()
            if follow.stdout:
                follow.stdout.close()


def test_standalone_with_embedded_redis(tmp_path: Path) -> None:
    """A one-node job with no Redis configured runs on a private redis-server, like
    torchrun --standalone, and the agent exits with the job's result once it ends."""
    job = f"standalone-{os.getpid()}"
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "solo", "address": "127.0.0.1"},
                "job": {
                    "id": job,
                    "entrypoint": [sys.executable, "-c", "print('trained')"],
                    **AS_TESTER,
                },
                "timing": {"heartbeat_interval": "200ms", "lease_ttl": "1s"},
                "log_dir": str(tmp_path / "logs"),
            }
        )
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "nodeagent", "run", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        output, _ = agent.communicate(timeout=60)  # ends by itself when the job succeeds
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert agent.returncode == 0, output[-2000:]
    assert "[rank 0]: trained" in output and "embedded redis-server" in output
    assert "job succeeded" in output
    assert not embedded.socket_path(job).exists()  # cleaned up with the agent


@pytest.mark.parametrize("code", [3, 1])
def test_standalone_exits_with_the_failing_ranks_code(tmp_path: Path, code: int) -> None:
    config = tmp_path / "one.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "solo", "address": "127.0.0.1"},
                "job": {
                    "id": f"fails-{os.getpid()}-{code}",
                    "entrypoint": [sys.executable, "-c", f"raise SystemExit({code})"],
                    "max_restarts": 0,
                    **AS_TESTER,
                },
                "timing": {"heartbeat_interval": "200ms", "lease_ttl": "1s"},
                "log_dir": str(tmp_path / "logs"),
                "metrics": {"listen": "off"},
            }
        )
    )
    result = run("nodeagent", "run", "--config", str(config))
    assert result.returncode == code, result.stderr[-2000:]
    assert "job failed" in result.stderr + result.stdout


def test_embedded_redis_is_refused_for_multi_node_jobs(tmp_path: Path) -> None:
    config = tmp_path / "multi.yaml"
    job = {"id": "x", "entrypoint": ["t"], "max_nodes": 2, **AS_TESTER}
    config.write_text(yaml.safe_dump({"redis": {"url": "embedded"}, "job": job}))
    result = run("nodeagent", "config", "check", str(config))
    assert result.returncode == EX_CONFIG and "serves one node" in result.stderr
    missing = tmp_path / "nourl.yaml"
    missing.write_text(yaml.safe_dump({"job": job}))
    result = run("nodeagent", "config", "check", str(missing))
    assert (
        result.returncode == EX_CONFIG
        and "required for a pool or a multi-node job" in result.stderr
    )


def test_embedded_redis_needs_the_binary() -> None:
    server = embedded.EmbeddedRedis("nobinary", binary="")
    server.binary = None
    with pytest.raises(ConfigError, match="apt-get install redis-server"):
        server.start()


def test_gpu_on_without_nvml_refuses_to_start(tmp_path: Path) -> None:
    """health.gpu: on is a promise that GPUs are monitored; with no driver it is a config error."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    config = tmp_path / "gpu-on.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": {"name": "g", "address": "127.0.0.1"},
                "job": {"id": f"gpu-on-{os.getpid()}", "entrypoint": ["true"], **AS_TESTER},
                "health": {"gpu": "on"},
                "log_dir": str(tmp_path / "logs"),
            }
        )
    )
    result = run("nodeagent", "run", "--config", str(config))
    assert result.returncode == EX_CONFIG
    assert "health.gpu" in result.stderr and "NVIDIA driver" in result.stderr
