"""The booted-node suite: three nodes with systemd as PID 1 (tests/helpers/booted.py), Redis
and nodeagent installed on them by the Ansible role over SSH, as a site installs them. Booted
once for the session; each test acts as an operator would and reads what an operator reads.

Run alone with `pytest -m booted`. The nodes share this machine's root filesystem (an overlay),
so Debian's packages the tests need are the host's: .ci/setup installs them (openssh-server for
Ansible, munge, redis-server, podman).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.booted import BootedPool, booted_missing, booted_pool


@pytest.fixture(scope="session")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BootedPool]:
    missing = booted_missing()
    if missing:
        pytest.skip(missing)
    with booted_pool(tmp_path_factory.mktemp("booted")) as made:
        yield made
