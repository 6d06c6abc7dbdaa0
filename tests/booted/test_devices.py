"""Issues 66 and 80: the device cgroup, and the jobs' own cgroups with their limits, under the
shipped unit and a real systemd (tests/booted/conftest.py).

n1 is set up as `nodeagent_constrain_devices: true` sets a node up: the unit's drop-in
(systemd/nodeagent.service.d/constrain-devices.conf) and `health.constrain_devices` in its
config, here with two fake GPUs (`health.fake_gpus`) whose device nodes are minors 6 and 7.
The nodes run systemd on this machine's cgroup v1/v2 hybrid, with the unified hierarchy and the
v1 memory, pids and cpu hierarchies writable, CAP_BPF and CAP_NET_ADMIN, and bpf(2) allowed
to CAP_BPF (tests/helpers/booted.py `_device_control`).
Stand-ins for the GPUs' device nodes are made with mknod (tests/helpers/devicenodes.py: an
allowed one fails to open with ENXIO, no driver; a refused one with EPERM).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.helpers.booted import CHECKOUT, BootedPool, Node
from tests.helpers.bootedjobs import rank_lines, status
from tests.helpers.cluster import wait_for
from tests.helpers.gpus import gpu

pytestmark = [pytest.mark.booted, pytest.mark.timeout(600)]
PYTHON = CHECKOUT / ".venv" / "bin" / "python"
CONFIG = "/etc/nodeagent/config.yaml"
DROP_IN = "/etc/systemd/system/nodeagent.service.d/constrain-devices.conf"
GPUS = "/etc/nodeagent/gpus.yaml"
DEVICES = "/dev/nodeagent-test"  # the node's /dev is a tmpfs that holds device nodes
MINOR = 6  # GPU i's device node is nvidia<6 + i>: NVML's minor, not the index


def offered(pool: BootedPool, node: str) -> list[dict[str, Any]] | None:
    """The GPU units `node` offers the pool (None: it is not in the pool now)."""
    rows = json.loads(pool.ctl("nodes", "--json"))["nodes"]
    return next((list(row["gpus"]) for row in rows if row["name"] == node), None)


def constrain(node: Node) -> None:
    """What the role does with nodeagent_constrain_devices (tests/integration/test_ansible.py
    checks it does), plus two fake GPUs, and the agent restarted."""
    gpus = [{**gpu(i), "name": "NVIDIA H100 80GB HBM3", "minor": MINOR + i} for i in range(2)]
    edit = (
        "import sys, yaml; d = yaml.safe_load(open(sys.argv[1])); "
        "d['health'] = {**(d.get('health') or {}), 'constrain_devices': True, "
        "'fake_gpus': sys.argv[2]}; open(sys.argv[1], 'w').write(yaml.safe_dump(d))"
    )
    node.sh(
        f"cp -p {CONFIG} {CONFIG}.before"
        f" && echo {shlex.quote(yaml.safe_dump({'gpus': gpus}))} > {GPUS} && chmod 644 {GPUS}"
        f" && {PYTHON} -c {shlex.quote(edit)} {CONFIG} {GPUS}"
        f" && mkdir -p {DROP_IN.rsplit('/', 1)[0]}"
        f" && cp {CHECKOUT}/systemd/nodeagent.service.d/constrain-devices.conf {DROP_IN}"
        f" && mkdir -m 755 {DEVICES}"
        + "".join(
            f" && mknod -m 666 {DEVICES}/nvidia{m} c 195 {m}" for m in (MINOR, MINOR + 1, 255)
        )
        + " && systemctl daemon-reload && systemctl restart nodeagent"
    )


def unconstrain(node: Node) -> None:
    node.sh(
        f"mv {CONFIG}.before {CONFIG} && rm -rf {DROP_IN} {GPUS} {DEVICES}"
        " && systemctl daemon-reload && systemctl restart nodeagent"
    )


@pytest.fixture(scope="module")
def n1(pool: BootedPool) -> Iterator[Node]:
    """n1 constrained, with two fake GPUs, for this module's tests."""
    node = pool.node("n1")
    constrain(node)
    try:
        wait_for(lambda: len(offered(pool, "n1") or ()) == 2, 120, "n1 to offer 2 GPUs")
        yield node
    finally:
        unconstrain(node)
    wait_for(lambda: offered(pool, "n1") == [], 120, "n1 back in the pool without GPUs")


def test_a_jobs_worker_opens_only_its_gpus_device_node_under_the_unit(
    pool: BootedPool, n1: Node
) -> None:
    """alice's one-GPU job on n1: its worker, as alice, in `job-n1.<job>` below the unit's
    delegated cgroup, opens its own GPU's node and nvidiactl, and is refused the other GPU's;
    the agent under the unit with the drop-in made that cgroup and loaded the program."""
    job = "devices-alice"
    try:
        unit = n1.systemctl("show", "-p", "Delegate,ProtectControlGroups", "nodeagent").stdout
        assert "Delegate=yes" in unit and "ProtectControlGroups=no" in unit, unit
        pool.ctl(
            *("submit", f"--name={job}", "--nodes=1", "--gpus-per-node=1"),
            f"--env=PYTHONPATH={CHECKOUT}",  # what it runs: which of DEVICES it may open
            *("--", str(PYTHON), "-m", "tests.helpers.devicenodes", DEVICES),
            user="alice",
        )

        def said() -> dict[str, Any] | None:
            return next((x for x in rank_lines([n1], job) if "opened" in x), None)

        found = wait_for(said, 180, f"{job}'s worker to say what it opened")
        own = f"nvidia{MINOR + int(found['cuda'].removeprefix('GPU-fake-'))}"
        other = ({f"nvidia{MINOR}", f"nvidia{MINOR + 1}"} - {own}).pop()
        assert found["opened"] == {own: "ENXIO", other: "EPERM", "nvidia255": "ENXIO"}, found
        assert found["cgroup"].endswith(f"/system.slice/nodeagent.service/job-n1.{job}"), found
    finally:
        pool.ctl("cancel", job, user="alice", check=False)


# bytes * n writes every page it takes: the kernel charges them to the job's cgroup
GROW = (
    "import time\nheld = []\nwhile True:\n    held.append(b'x' * (32 << 20))\n    time.sleep(0.05)"
)
SLEEP = "import time; time.sleep(3600)"


def test_a_jobs_oom_under_the_unit_kills_only_its_worker(pool: BootedPool, n1: Node) -> None:
    """Two of alice's one-GPU jobs on n1; one grows past its `--mem`. The kernel kills its
    worker inside its job's cgroup, the job says so (worker_oom), and neither the neighbour nor
    the agent (OOMPolicy=continue) is touched."""
    neighbour, hog = "oom-neighbour", "oom-hog"
    unit = n1.systemctl("show", "-p", "OOMPolicy,Delegate", "nodeagent").stdout
    assert "OOMPolicy=continue" in unit and "Delegate=yes" in unit, unit
    agent = n1.main_pid()
    try:
        pool.ctl(
            *("submit", f"--name={neighbour}", "--nodes=1", "--gpus-per-node=1"),
            *("--", str(PYTHON), "-c", SLEEP),
            user="alice",
        )
        wait_for(lambda: status(pool, neighbour)["state"] == "running", 180, "the neighbour")
        pool.ctl(
            *("submit", f"--name={hog}", "--nodes=1", "--gpus-per-node=1", "--mem=256MiB"),
            *("--max-restarts=1", "--", str(PYTHON), "-c", GROW),
            user="alice",
        )

        def ended() -> dict[str, Any] | None:
            doc: dict[str, Any] = json.loads(pool.ctl("show", hog, "--json"))
            return doc if doc["state"] == "failed" else None

        doc = wait_for(ended, 180, f"{hog} to fail")
        assert doc["restarts_by_cause"].get("worker_oom") == 1, doc
        assert "rank 0 on n1 ran out of memory (its job's limit there: 256 MiB" in doc["detail"]
        held = status(pool, neighbour)
        assert held["state"] == "running" and held["generation"] == 1, held
        assert held["restart_count"] == 0, held
        assert n1.main_pid() == agent  # the unit was not stopped for its job's OOM
    finally:
        for job in (neighbour, hog):
            pool.ctl("cancel", job, user="alice", check=False)
