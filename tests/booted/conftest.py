"""The booted-node suite: three nodes with systemd as PID 1 (tests/helpers/booted.py), Redis
and nodeagent installed on them by the Ansible role over SSH, as a site installs them. Booted
once for the session; each test acts as an operator would and reads what an operator reads.

Run alone with `pytest -m booted`. The nodes share this machine's root filesystem (an overlay),
so Debian's packages the tests need are the host's: .ci/setup installs them (openssh-server for
Ansible, munge, redis-server, podman). MUNGE's key and service are the role's
(nodeagent_munge_install, with a key the fixture makes): each node's own are removed first.
n2 is also the pool's API host (nodeagent_api_install, with a certificate the fixture makes;
every node has the pool's token key and names the service's account in pool.api_users).

Not here: a job in its own image. podman cannot run containers inside these nodes: they are
unprivileged containers without /dev/fuse (fuse-overlayfs; a kernel overlay mount needs
CAP_SYS_ADMIN), /dev/net/tun (slirp4netns) or a writable /proc/sys, and the host's
podman.service is masked in them (tests/helpers/booted.py MASKED), so podman.socket refuses to
start. Nodes started --privileged would have all that and would no longer keep the suite apart
from this machine (docs/operations.md, "Tested on nodes booted with systemd").
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.helpers.booted import BootedPool, booted_missing, booted_pool
from tests.helpers.cluster import wait_for

ENDED = {"succeeded", "failed", "cancelled", "timeout"}


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BootedPool]:
    missing = booted_missing()
    if missing:
        pytest.skip(missing)
    with booted_pool(tmp_path_factory.mktemp("booted")) as made:
        yield made


@pytest.fixture(autouse=True)
def cancel_what_is_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """After each test that used the pool, cancel (as an operator) every job it left live, and
    wait until they have ended: a test that failed before its own cancel would otherwise keep
    the nodes, and every later test would wait on "nodes are held" (CI: one failure made six)."""
    yield
    made = request.node.funcargs.get("pool")  # absent when the pool was skipped
    if not isinstance(made, BootedPool):
        return

    def live() -> list[str]:
        rows = json.loads(made.ctl("jobs", "--json"))["jobs"]
        return [r["job"] for r in rows if r["state"] not in ENDED]

    for job in live():
        made.ctl("cancel", job, check=False)
    wait_for(lambda: not live() or None, 180, "the jobs a test left live to end")
