"""A pool whose nodes say what containers they run: `submit` refuses an image or a mount no node
would take, with the reason, before anything is stored; a node that cannot pull the image
refuses the job once placed; two users' jobs run side by side, each in its own image (real
agents, a real redis-server, real podman, real Unix users)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.images import (
    MARKER,
    build_image,
    clean_containers,
    containers_section,
    podman_missing,
    remove_image,
    service_socket,
)
from tests.helpers.pool import PoolCluster, pool_cluster
from tests.helpers.users import unix_users

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def pool(redis_server: RedisServer, tmp_path: Path, job_id: str) -> Iterator[PoolCluster]:
    data = tmp_path / "data"
    data.mkdir()
    allows = {
        "allowed": True,
        "images": ["localhost/ok/"],
        "mount_sources": [str(data)],
        "socket": service_socket() if podman_missing() is None else "/run/podman/podman.sock",
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


TEAM_PATH = "/opt/teamb/bin:/usr/bin:/bin"


@pytest.mark.skipif(podman_missing() is not None, reason=str(podman_missing()))
def test_two_users_run_jobs_in_their_own_images_on_one_pool(
    redis_server: RedisServer, tmp_path: Path, job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the issue asked for: two teams' software side by side, each job in its own image,
    each as its submitter (the image's marker and the uid, read from inside). Issue 52: each
    worker sees its image's own ENV (alpha's PATH), none of the agent's environment but what
    the node's containers.env names."""
    monkeypatch.setenv("NODEAGENT_TEST_AGENT_ONLY", "leaked")  # the agents' environment
    monkeypatch.setenv("NODEAGENT_TEST_SITE", "site")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    images = {
        "alpha": build_image(f"{job_id}-alpha", env={"PATH": TEAM_PATH}),
        "beta": build_image(f"{job_id}-beta"),
    }
    try:
        with (
            unix_users("alice", "bob") as users,
            pool_cluster(
                redis_server.url,
                tmp_path,
                pool=job_id,
                scheduling={"users": [user.name for user in users.values()]},
                node_options={
                    name: {"containers": containers_section(shared, env=("NODEAGENT_TEST_SITE",))}
                    for name in ("a", "b")
                },
            ) as pool,
        ):
            pool.start("a", "b")
            pool.wait_nodes(2)
            owners = {"alpha": users["alice"], "beta": users["bob"]}
            for job, user in owners.items():
                mark = shared / job
                result = pool.ctl(
                    "submit", "--name", job, "--nodes", "1", "--user", user.name,
                    "--container-image", images[job],
                    "--container-mounts", f"/usr:/usr:ro,{shared}",
                    "--", "/bin/sh", "-c", f"cat {MARKER} > {mark}.part; id -u >> {mark}.part; "
                    f"echo $PATH ${{NODEAGENT_TEST_AGENT_ONLY:-absent}} $NODEAGENT_TEST_SITE "
                    f">> {mark}.part; mv {mark}.part {mark}; exec sleep 600",
                )  # fmt: skip
                assert result.returncode == 0, result.stderr
            for job, user in owners.items():
                mark = shared / job
                try:
                    wait_for(mark.exists, 60, f"{job}'s worker to say where it runs")
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{pool.diagnostics()}") from None
                found = mark.read_text().split()
                assert found[:2] == [images[job], str(user.uid)]
                assert found[3:] == ["absent", "site"], found  # nothing else of the agent's
                if job == "alpha":
                    assert found[2] == TEAM_PATH  # the image's ENV, not the agent's PATH
                assert found[2] != os.environ["PATH"]
            assert {pool.placements()[n] for n in ("a", "b")} == {"alpha", "beta"}
            for job in owners:
                assert pool.ctl("cancel", job).returncode == 0
            wait_for(lambda: not any(pool.placements().values()), 60, "the jobs to end")
    finally:
        for job, image in images.items():
            clean_containers(job)
            remove_image(image)
