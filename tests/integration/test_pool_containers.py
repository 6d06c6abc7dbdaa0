"""A pool whose nodes say what containers they run: `submit` refuses an image or a mount no node
would take, with the reason, before anything is stored; a node that cannot pull the image
refuses the job once placed (real agents, a real redis-server, real podman)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.images import RUNC, podman_missing
from tests.helpers.pool import PoolCluster, pool_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    data = tmp_path / "data"
    data.mkdir()
    allows = {
        "allowed": True,
        "images": ["localhost/ok/"],
        "mount_sources": [str(data)],
        "oci_runtime": RUNC[0].split("=")[1] if RUNC else None,
        "pull_timeout": "30s",
    }
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as cluster:
        cluster.node_options = {"a": {"containers": allows}}  # b runs none (the default)
        cluster.start("a", "b")
        cluster.wait_nodes(2)
        yield cluster


def _submit(pool: PoolCluster, name: str, *container: str) -> tuple[int, str]:
    result = pool.ctl("submit", "--name", name, "--nodes", "1", *container, "--", "true")
    return result.returncode, result.stderr


def test_submit_refuses_an_image_or_a_mount_no_node_takes(pool: PoolCluster) -> None:
    code, said = _submit(pool, "bad-image", "--container-image", "localhost/bad:1")
    assert code == 2, said
    assert "job bad-image: no node that could run it takes its container: " in said
    assert "image localhost/bad:1 is not from an allowed image prefix (localhost/ok/)" in said
    assert "containers are off (containers.allowed)" in said  # b's reason
    mount = "/etc:/data"
    code, said = _submit(
        pool, "bad-mount", "--container-image", "localhost/ok/t:1", "--container-mounts", mount
    )
    assert code == 2 and "mount source /etc is not under an allowed directory" in said, said
    code, said = _submit(
        pool, "picky", "--container-image", "localhost/ok/t:1", "--selector", "gpu=h100"
    )
    assert code == 0, said  # no node carries the label: none said no, placement decides
    assert set(pool.jobs()) == {"picky"}  # the refused ones stored nothing


@pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing()))
def test_a_pull_that_fails_is_the_nodes_refusal(pool: PoolCluster) -> None:
    code, said = _submit(pool, "nowhere", "--container-image", "localhost/ok/absent:1")
    assert code == 0, said  # a allows it: stored, placed
    reason = "a: container: node a: pulling image localhost/ok/absent:1 failed"

    def refused() -> bool:
        return reason in pool.jobs()["nowhere"]["reason"]

    try:
        wait_for(refused, 60, "a's refusal")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{pool.diagnostics()}") from None
    assert "b: container: node b: containers are off" in pool.jobs()["nowhere"]["reason"]
    row = pool.jobs()["nowhere"]
    assert row["state"] == "pending" and row["world_size"] == 0, row
