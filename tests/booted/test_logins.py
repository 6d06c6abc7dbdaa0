"""Issue 82: `ssh node` only into a job of the user's there, with Debian's sshd and PAM under a
real systemd (tests/booted/conftest.py): n3 set up by the role with `nodeagent_ssh_adopt: true`
(nodeagent's PAM check in sshd's account and session stacks, the unit's drop-in), alice's and
bob's keys authorized there. A login with no job is refused with the reason; alice's, while her
job runs on n3, on a pseudo-terminal, is taken into the job's cgroup and ends with it; root
always gets in.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.booted import BootedPool, Node
from tests.helpers.bootedjobs import status
from tests.helpers.cluster import wait_for

pytestmark = [pytest.mark.booted, pytest.mark.timeout(900)]
KEYS = "/etc/ssh/keys"  # the users have no home: their keys where sshd is told to look
SSHD_KEYS = "/etc/ssh/sshd_config.d/nodeagent-test-keys.conf"


@pytest.fixture(scope="module")
def n3(pool: BootedPool, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Path]]:
    """n3 with the role's nodeagent_ssh_adopt, and a key of alice's and bob's; its key file."""
    node = pool.node("n3")
    key = tmp_path_factory.mktemp("ssh") / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=60
    )
    public = shlex.quote(key.with_suffix(".pub").read_text().strip())
    node.sh(
        f"mkdir -p {KEYS} && echo {public} > {KEYS}/alice && echo {public} > {KEYS}/bob"
        f" && echo 'AuthorizedKeysFile .ssh/authorized_keys {KEYS}/%u' > {SSHD_KEYS}"
        " && systemctl reload ssh"
    )
    pool.playbook("site.yml", extra={"nodeagent_ssh_adopt": "true"}, limit="n3")
    try:
        yield node, key
    finally:
        pool.playbook("site.yml", extra={"nodeagent_ssh_adopt": "false"}, limit="n3")
        node.sh(f"rm -rf {KEYS} {SSHD_KEYS} && systemctl reload ssh")


def ssh(node: Node, key: Path, user: str, command: str, *options: str) -> list[str]:
    return [
        *("ssh", *options, "-i", str(key), "-o", "BatchMode=yes"),
        *("-o", "StrictHostKeyChecking=no"),
        *("-o", "UserKnownHostsFile=/dev/null"),  # LogLevel INFO, the default: banners shown
        f"{user}@{node.address}",
        command,
    ]


def logged_in(node: Node, key: Path, user: str, command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(ssh(node, key, user, command), capture_output=True, text=True, timeout=60)


def test_ssh_reaches_a_node_only_into_a_job_there_and_ends_with_it(
    pool: BootedPool, n3: tuple[Node, Path]
) -> None:
    node, key = n3
    pam = node.sh("cat /etc/pam.d/sshd").stdout
    assert pam.count("/opt/nodeagent/venv/bin/python -I -m nodeagent.cli.pamadopt") == 2, pam
    caps = node.systemctl("show", "-p", "CapabilityBoundingSet", "nodeagent").stdout
    assert "cap_sys_nice" in caps, caps

    refused = logged_in(node, key, "alice", "true")
    assert refused.returncode == 255, refused
    assert "nodeagent: alice holds no job on node n3" in refused.stderr, refused.stderr
    inventory = json.loads(pool.inventory.read_text())  # root's key: the controller's
    root_key = Path(inventory["all"]["vars"]["ansible_ssh_private_key_file"])
    root = logged_in(node, root_key, "root", "id -un")
    assert (root.returncode, root.stdout) == (0, "root\n"), root  # never asked about

    job = "login-alice"
    pool.ctl("submit", f"--name={job}", "--nodes=3", "--", "/bin/sleep", "900", user="alice")
    wait_for(lambda: status(pool, job)["state"] == "running" or None, 180, f"{job} to run")
    session = subprocess.Popen(  # on a terminal sshd makes (/dev/ptmx: the unit allows it)
        ssh(node, key, "alice", "tty; cat /proc/self/cgroup; echo ready; exec sleep 900", "-tt"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert session.stdout is not None
        lines = []
        while (line := session.stdout.readline().strip()) not in ("ready", ""):
            lines.append(line)
        assert any(x.startswith("/dev/pts/") for x in lines), lines  # `tty` said one
        inside = [x for x in lines if x.endswith(f"/system.slice/nodeagent.service/job-n3.{job}")]
        assert any(x.startswith("0::") for x in inside), lines  # the device program's
        assert any("memory" in x.split(":")[1] for x in inside), lines  # the job's limits
        assert node.sh("pgrep -u alice -x sleep", check=False).stdout.split()

        bob = logged_in(node, key, "bob", "true")
        assert bob.returncode == 255 and "bob holds no job on node n3" in bob.stderr, bob

        pool.ctl("cancel", job, user="alice")
        session.wait(timeout=180)  # the job's end ends the login: its sshd is killed
        said = session.stderr.read() if session.stderr else ""
        assert session.returncode == 255, (session.returncode, said)
        gone = node.sh("pgrep -u alice", check=False)
        assert gone.returncode == 1, gone.stdout
    finally:
        if session.poll() is None:
            session.kill()
        session.communicate(timeout=60)
