"""Decision 1: Redis Sentinel and TLS (rediss://) URLs work, against real servers."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, free_port, local_cluster, wait_for
from tests.helpers.rediscluster import self_signed


def daemon(args: list[str], directory: Path, name: str) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    assert binary is not None
    log = directory / f"{name}.log"
    return subprocess.Popen([binary, *args, "--logfile", str(log)], cwd=directory)


@pytest.fixture
def sentinel_url(redis_server: RedisServer, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(
        f"port {port}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {redis_server.port} 1\n"
    )
    proc = daemon([str(conf), "--sentinel"], tmp_path, "sentinel")
    try:
        import redis

        client = redis.Redis(port=port)
        wait_for(lambda: _ping(client), 10, "sentinel up")
        yield f"redis+sentinel://127.0.0.1:{port}/mymaster/0"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def tls_url(tmp_path: Path) -> Iterator[str]:
    made = self_signed(tmp_path)
    cert, key = made.cert, made.key
    port = free_port()
    proc = daemon(
        [
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--tls-cert-file",
            str(cert),
            "--tls-key-file",
            str(key),
            "--tls-ca-cert-file",
            str(cert),
            "--tls-auth-clients",
            "no",
            "--save",
            "",
        ],
        tmp_path,
        "tls",
    )
    url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}"
    try:
        import redis

        client = redis.Redis.from_url(url, socket_timeout=1)
        wait_for(lambda: _ping(client), 10, "TLS redis up")
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _ping(client: object) -> bool:
    import redis

    try:
        return bool(client.ping())  # type: ignore[attr-defined]
    except redis.RedisError:
        return False


@pytest.mark.parametrize("url_fixture", ["sentinel_url", "tls_url"])
def test_a_job_runs_through(
    url_fixture: str, request: pytest.FixtureRequest, job_id: str, tmp_path: Path
) -> None:
    url = request.getfixturevalue(url_fixture)
    with local_cluster(url, tmp_path / "job", job=job_id, max_nodes=2) as cluster:
        cluster.start("a", "b")
        doc = cluster.wait_running(2)
        assert doc["leader"] in ("a", "b")
        status = cluster.ctl("status", "--json")
        assert status.returncode == 0 and '"world_size": 2' in status.stdout
