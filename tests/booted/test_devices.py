"""Issue 66: the device cgroup under the shipped unit and a real systemd (tests/booted/conftest.py).

n1 is set up as `nodeagent_constrain_devices: true` sets a node up: the unit's drop-in
(systemd/nodeagent.service.d/constrain-devices.conf) and `health.constrain_devices` in its
config, here with two fake GPUs (`health.fake_gpus`) whose device nodes are minors 6 and 7.
The nodes run systemd on this machine's cgroup v1/v2 hybrid, with the unified hierarchy, CAP_BPF
and CAP_NET_ADMIN, and bpf(2) allowed to CAP_BPF (tests/helpers/booted.py `_device_control`).
Stand-ins for the GPUs' device nodes are made with mknod (tests/helpers/devicenodes.py: an
allowed one fails to open with ENXIO, no driver; a refused one with EPERM).
"""

from __future__ import annotations

import json
import shlex
from typing import Any

import pytest
import yaml

from tests.helpers.booted import CHECKOUT, BootedPool, Node
from tests.helpers.bootedjobs import rank_lines
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


def test_a_jobs_worker_opens_only_its_gpus_device_node_under_the_unit(pool: BootedPool) -> None:
    """alice's one-GPU job on n1: its worker, as alice, in `job-n1.<job>` below the unit's
    delegated cgroup, opens its own GPU's node and nvidiactl, and is refused the other GPU's;
    the agent under the unit with the drop-in made that cgroup and loaded the program."""
    n1, job = pool.node("n1"), "devices-alice"
    constrain(n1)
    try:
        unit = n1.systemctl("show", "-p", "Delegate,ProtectControlGroups", "nodeagent").stdout
        assert "Delegate=yes" in unit and "ProtectControlGroups=no" in unit, unit
        wait_for(lambda: len(offered(pool, "n1") or ()) == 2, 120, "n1 to offer 2 GPUs")
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
        pool.ctl("cancel", job, check=False)
        unconstrain(n1)
    wait_for(lambda: offered(pool, "n1") == [], 120, "n1 back in the pool without GPUs")
