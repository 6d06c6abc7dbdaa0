"""Nodes booted with systemd as PID 1, as a site's nodes are: podman containers made from this
machine's own root filesystem (an overlay: nothing written reaches the host), each with its own
address on a podman network of the test's own, installed by the Ansible role over SSH.

A `Node` is what an operator has of a node: `systemctl`, `journal`, a shell, `kill` (a power
loss) and `boot` (the same container started again: its disk, the overlay, is kept; /run,
/tmp and /dev/shm are new), and its `address`. Every node mounts one directory of this
machine at /shared, as a site's nodes mount a shared file system (where a job's persistent
checkpoint tier goes).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import os
import random
import shlex
import shutil
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.helpers.packaging import build_wheel

# Units of this machine that would start in every node and that no test needs (the host's
# Prometheus for promtool, its exporter); named on systemd's command line, as a kernel's would.
MASKED = (
    "prometheus.service",
    "prometheus-node-exporter.service",
    "postgresql.service",
    "podman.service",
    "apt-daily.timer",
    "apt-daily-upgrade.timer",
)
RUNC = ["--runtime=runc"] if shutil.which("runc") else []
CHECKOUT = Path(__file__).resolve().parents[2]
SHM = "1g"  # the memory tier and the workers' /dev/shm (podman's default is 64 MiB)


def booted_missing() -> str | None:
    """Why nodes cannot be booted here (None: they can)."""
    if os.geteuid() != 0:
        return "booting nodes needs root's podman"
    for program, package in (("podman", "podman"), ("sshd", "openssh-server")):
        found = shutil.which(program) or Path(f"/usr/sbin/{program}").exists()
        if not found:
            return f"{program} is missing (Debian's {package}; .ci/setup installs it)"
    if not Path("/lib/systemd/systemd").exists():
        return "systemd is not installed"
    return None


@dataclass
class Node:
    name: str
    container: str
    address: str

    def sh(
        self, script: str, user: str = "root", check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """`script` run by /bin/sh on the node as `user`."""
        done = subprocess.run(
            ["podman", "exec", "--user", user, self.container, "/bin/sh", "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{self.name}: {script!r} exited {done.returncode}: {done.stdout}{done.stderr}"
            )
        return done

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.sh("systemctl " + " ".join(args), check=check)

    def journal(self, unit: str = "nodeagent", since: str | None = None) -> str:
        """What `journalctl -u UNIT` shows (since a `journalctl --since` time, if given)."""
        more = f" --since '{since}'" if since else ""
        return self.sh(f"journalctl --no-pager -o cat -u {unit}{more}", check=False).stdout

    def now(self) -> str:
        """The node's clock, as `journalctl --since` takes it."""
        return self.sh("date '+%Y-%m-%d %H:%M:%S'").stdout.strip()

    def main_pid(self, unit: str = "nodeagent") -> int:
        return int(self.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip())

    def kill(self) -> None:
        """The node loses its power: every process dies at once, nothing is told."""
        subprocess.run(["podman", "kill", self.container], capture_output=True, timeout=60)
        subprocess.run(["podman", "wait", self.container], capture_output=True, timeout=60)

    def boot(self) -> None:
        """The node starts again (its disk kept), until systemd says it is up."""
        subprocess.run(["podman", "start", self.container], check=True, capture_output=True)
        self.wait_booted()

    def wait_booted(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            done = subprocess.run(
                ["podman", "exec", self.container, "systemctl", "is-system-running"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            state = done.stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.5)
        raise AssertionError(f"{self.name} did not boot in {timeout:g}s (systemd says {state!r})")


@dataclass
class Network:
    name: str
    subnet: ipaddress.IPv4Network

    def address(self, index: int) -> str:
        return str(self.subnet.network_address + 10 + index)


@contextlib.contextmanager
def network(tag: str) -> Iterator[Network]:
    """A podman network of the test's own, on a subnet no other network here uses."""
    taken = subprocess.run(
        ["podman", "network", "ls", "--format", "{{range .Subnets}}{{.Subnet}} {{end}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    used = [ipaddress.ip_network(s) for s in taken if ":" not in s]
    for _ in range(100):
        subnet = ipaddress.ip_network(
            f"10.{random.randint(160, 250)}.{random.randint(0, 255)}.0/24"
        )
        if not any(subnet.overlaps(u) for u in used):
            break
    name = f"nodeagent-booted-{tag}"
    subprocess.run(
        ["podman", "network", "create", "--subnet", str(subnet), name],
        check=True,
        capture_output=True,
    )
    try:
        yield Network(name, ipaddress.IPv4Network(subnet))
    finally:
        if os.environ.get("NODEAGENT_BOOTED_KEEP") != "1":
            subprocess.run(["podman", "network", "rm", "-f", name], capture_output=True)


# Directories of the nodes' disks that start empty, as on a machine that boots: the host's own
# (its runtime state, sockets of its daemons) would be copied into each node's tmpfs by podman's
# systemd mode (tmpcopyup), which cannot copy a socket and refuses to start.
EMPTY = ("tmp", "run", "var/log/journal")
DISKS = Path("/var/lib/nodeagent-booted")


def _disk(name: str, tag: str) -> Path:
    """The node's root file system: an overlay of this machine's (never written) and an upper
    directory of the node's own, which outlives a power loss; its mount point."""
    base = DISKS / tag / name
    upper, work, merged = base / "upper", base / "work", base / "merged"
    for directory in (work, merged):
        directory.mkdir(parents=True)
    for empty in EMPTY:
        path = upper / empty
        path.mkdir(parents=True)
        os.setxattr(path, "trusted.overlay.opaque", b"y")  # nothing of the host's below it
    (upper / "tmp").chmod(0o1777)
    # What this machine has and a site's node does not: pyenv's Pythons before Debian's on
    # root's PATH (its .bashrc), which the role's `python3 -m venv` would find first.
    home = upper / "root"
    home.mkdir(mode=0o700)
    os.mknod(home / ".pyenv", stat.S_IFCHR, os.makedev(0, 0))  # an overlay's whiteout
    shutil.copyfile("/etc/skel/.bashrc", home / ".bashrc")
    subprocess.run(
        [
            "mount",
            "-t",
            "overlay",
            "overlay",
            "-o",
            f"lowerdir=/,upperdir={upper},workdir={work}",
            str(merged),
        ],
        check=True,
        capture_output=True,
    )
    return merged


SHARED = "/shared"  # where every node mounts the directory `boot_nodes` is given


UNIFIED = Path("/sys/fs/cgroup/unified")  # a cgroup v1/v2 hybrid's v2 hierarchy
SECCOMP = Path("/usr/share/containers/seccomp.json")  # podman's default profile
V1_LIMITS = [Path("/sys/fs/cgroup", name) for name in ("memory", "pids", "cpu", "cpuacct")]


def _device_control(tag: str) -> list[str]:
    """What a node needs for its agent to attach BPF device programs (health.constrain_devices,
    supervisor/devices.py), as a site's node has: cgroup v2 (here the host's unified hierarchy,
    where the node's systemd then runs hybrid and delegates), CAP_BPF and CAP_NET_ADMIN in the
    node's bounding set (the unit's drop-in asks for them), and bpf(2) allowed to CAP_BPF:
    podman's default seccomp profile allows it only with CAP_SYS_ADMIN, which nodes lack.
    And NVIDIA's device major, 195, made (CAP_MKNOD) and opened (the node's own v1 device
    cgroup) as on a node with GPUs: tests/booted/test_devices.py makes stand-ins for them."""
    options = ["--cap-add=BPF,NET_ADMIN,MKNOD", "--device-cgroup-rule=c 195:* rwm"]
    if UNIFIED.is_dir():
        options.append(f"--volume={UNIFIED}:{UNIFIED}:rw")
    # A hybrid's v1 hierarchies whose controllers the agent limits its jobs with
    # (isolation.cgroups, supervisor/jobcgroup.py), writable as on a site's node: podman
    # mounts them read-only, where the node's systemd cannot delegate them.
    for hierarchy in V1_LIMITS:
        if hierarchy.is_dir():
            options.append(f"--volume={hierarchy}:{hierarchy}:rw")
    if SECCOMP.is_file():
        profile = json.loads(SECCOMP.read_text())
        for rule in profile["syscalls"]:
            if "bpf" in rule["names"]:
                rule["names"] = [n for n in rule["names"] if n != "bpf"]
        bpf = {"names": ["bpf"], "action": "SCMP_ACT_ALLOW", "includes": {"caps": ["CAP_BPF"]}}
        profile["syscalls"].append(bpf)
        path = DISKS / tag / "seccomp.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(profile))
        options.append(f"--security-opt=seccomp={path}")
    return options


def boot_nodes(names: Sequence[str], net: Network, tag: str, shared: Path) -> list[Node]:
    """Containers with systemd as PID 1 from this machine's root file system, booted, each
    with `shared` mounted at SHARED."""
    nodes = []
    devices = _device_control(tag)
    for index, name in enumerate(names):
        container = f"nodeagent-booted-{tag}-{name}"
        node = Node(name, container, net.address(index + 1))
        nodes.append(node)
        subprocess.run(
            [
                "podman",
                *RUNC,
                "run",
                "-d",
                f"--name={container}",
                f"--hostname={name}",
                f"--network={net.name}",
                f"--ip={node.address}",
                "--systemd=always",
                f"--shm-size={SHM}",
                # This checkout (its venv, torch, the example scripts) at its own path, wherever
                # it is (under /tmp, which starts empty on a node, too).
                f"--volume={CHECKOUT}:{CHECKOUT}:ro",
                f"--volume={shared}:{SHARED}",
                "--ulimit=nofile=4096:4096",
                "--ulimit=nproc=4096:4096",
                *devices,
                "--rootfs",
                str(_disk(name, tag)),
                "/lib/systemd/systemd",
                *(f"systemd.mask={unit}" for unit in MASKED),
            ],
            check=True,
            capture_output=True,
            timeout=120,
        )
    for node in nodes:
        node.wait_booted()
    return nodes


def remove_nodes(tag: str) -> None:
    """Every node booted under `tag`, its container and its disk."""
    names = subprocess.run(
        [
            "podman",
            "ps",
            "-a",
            "--format",
            "{{.Names}}",
            "--filter",
            f"name=nodeagent-booted-{tag}-",
        ],
        capture_output=True,
        text=True,
    ).stdout.split()
    for container in names:
        subprocess.run(
            ["podman", "rm", "-f", "-t", "0", container], capture_output=True, timeout=120
        )
    for merged in (DISKS / tag).glob("*/merged"):
        subprocess.run(["umount", "-l", str(merged)], capture_output=True, timeout=60)
    shutil.rmtree(DISKS / tag, ignore_errors=True)


def new_tag() -> str:
    return uuid.uuid4().hex[:6]


# -- a pool of booted nodes, installed by the role ------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
NAMES = ("n1", "n2", "n3")
USERS = {"alice": 2001, "bob": 2002}  # the site's users (its LDAP), the same uid on each node
API_NODE = "n2"  # also the pool's API host, as a login host (nodeagent_api_install)
API_PORT = 8443
API_UID = 900  # nodeagent-api's on every node (nodeagent_api_uid): the agents name it by its uid
TIMING = {"heartbeat_interval": "500ms", "lease_ttl": "5s", "stop_grace_period": "20s"}


@dataclass
class BootedPool:
    """Three booted nodes serving one pool (pool.auth: munge), Redis on n1, the API service on
    API_NODE, all installed by the roles; `share` is a directory of this machine every node
    sees (its overlay's lower)."""

    nodes: list[Node]
    share: Path
    inventory: Path
    passwords: dict[str, str]
    api_cert: Path  # the API host's certificate (self-signed: its own CA)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    @property
    def api_url(self) -> str:
        """The API service's HTTPS address, on API_NODE."""
        return f"https://{self.node(API_NODE).address}:{API_PORT}"

    @property
    def redis_host(self) -> Node:
        return self.nodes[0]

    def url(self, who: str) -> str:
        """The Redis URL of `who` (agent, operator, submitter), as the role made its user."""
        user = {"agent": "nodeagent-agent", "operator": "nodeagent-operator"}.get(
            who, "nodeagent-submitter"
        )
        return f"redis://{user}:{self.passwords[who]}@{self.redis_host.address}:6379/0"

    def ctl(self, *args: str, user: str = "root", node: str = "n1", check: bool = True) -> str:
        """`nodeagentctl ARGS` on `node` as `user`: root as an operator, another user as a
        submitter (its MUNGE credential signs what it asks). By its name, found on PATH
        (the role's link in /usr/local/bin), as a user types it."""
        who = "operator" if user == "root" else "submitter"
        quoted = " ".join(shlex.quote(a) for a in args)
        script = f"nodeagentctl --redis {self.url(who)} {quoted}"
        return self.node(node).sh(script, user=user, check=check, timeout=300).stdout

    def playbook(
        self, *playbooks: str, extra: dict[str, str] | None = None, limit: str | None = None
    ) -> str:
        """`ansible-playbook` of `playbooks` against the nodes (`limit`: those its --limit
        names), from this machine (the controller) over SSH; its output. Fails the test on a
        failed play."""
        args = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(self.inventory)]
        if limit is not None:
            args += ["--limit", limit]
        for name, value in (extra or {}).items():
            args += ["-e", f"{name}={value}"]
        done = subprocess.run(
            [*args, *playbooks],
            cwd=ANSIBLE,
            capture_output=True,
            text=True,
            timeout=900,
            env={**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"},
        )
        if done.returncode != 0:
            said = "".join(f"\n--- {n.name}'s journal:\n{n.journal()[-4000:]}" for n in self.nodes)
            raise AssertionError(f"{playbooks} failed:\n{done.stdout[-6000:]}{done.stderr}{said}")
        return done.stdout


def _wheelhouse(share: Path) -> Path:
    """This checkout's wheel and its dependencies', the api extra's too (pip's cache: the
    nodes install offline)."""
    wheels = share / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), f"{ROOT}[api]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    return next(wheels.glob("nodeagent-*.whl"))


def upgrade_wheel(pool: BootedPool) -> tuple[Path, str]:
    """A wheel of this checkout with a version above its own, beside the pool's wheelhouse:
    what a site's next release is to the role. Its path and version."""
    source = pool.share / "upgrade-source"
    skip = shutil.ignore_patterns(
        ".*", "__pycache__", "build", "dist", "tests", "bench", "examples", "*.egg-info"
    )
    shutil.copytree(ROOT, source, ignore=skip)
    init = source / "nodeagent" / "__init__.py"
    text = init.read_text()
    current = text.split('__version__ = "', 1)[1].split('"', 1)[0]
    version = f"{current}.post1"
    init.write_text(text.replace(f'__version__ = "{current}"', f'__version__ = "{version}"'))
    return build_wheel(pool.share / "wheels", source, version), version


def _authorize(nodes: Sequence[Node], directory: Path) -> Path:
    """An SSH key of the controller's, authorized for root on every node."""
    key = directory / "id_ed25519"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)],
        check=True,
        capture_output=True,
    )
    public = key.with_suffix(".pub").read_text().strip()
    for node in nodes:
        node.sh(
            "mkdir -p /root/.ssh && chmod 700 /root/.ssh && "
            f"echo {shlex.quote(public)} > /root/.ssh/authorized_keys && "
            "chmod 600 /root/.ssh/authorized_keys && systemctl start ssh"
        )
    return key


def _munge_key(nodes: Sequence[Node], directory: Path) -> Path:
    """The site's MUNGE key, made on the controller for the role to install; each node left
    without one and without munged, as a node before its first install (the overlay would
    otherwise give every node this machine's key and running munged)."""
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for node in nodes:
        node.sh("systemctl disable --now munge && rm -f /etc/munge/munge.key")
    return key


def _token_key(directory: Path) -> Path:
    """The pool's token key, made on the controller for the role to put on every node."""
    key = directory / "token.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    return key


def _api_host(api: Node, redis: Node, passwords: dict[str, str], directory: Path) -> dict[str, Any]:
    """The API host's variables: the service on its socket and on HTTPS, with a certificate
    for its address (self-signed on the controller), reading the pool as the submitters'
    Redis user."""
    cert, key = directory / "api.crt", directory / "api.key"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", f"/CN={api.address}", "-addext", f"subjectAltName=IP:{api.address}"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    submitter = f"redis://nodeagent-submitter:{passwords['submitter']}@{redis.address}:6379/0"
    return {
        "nodeagent_api_install": True,
        "nodeagent_api_redis_url": submitter,
        "nodeagent_api_listen": f"0.0.0.0:{API_PORT}",
        "nodeagent_api_tls_cert": str(cert),
        "nodeagent_api_tls_key": str(key),
    }


def _check_the_roles_install(nodes: Sequence[Node], munge_key: Path) -> None:
    """What the role was to leave on every node besides the agent: the controller's MUNGE key,
    munge's alone, under a munged that runs (and starts at boot), and nodeagentctl on PATH."""
    digest = hashlib.sha256(munge_key.read_bytes()).hexdigest()
    for node in nodes:
        key = node.sh("stat -c '%U:%G %a' /etc/munge/munge.key && sha256sum /etc/munge/munge.key")
        assert key.stdout.split()[:3] == ["munge:munge", "400", digest], (node.name, key.stdout)
        munged = node.sh("systemctl is-enabled munge && systemctl is-active munge")
        assert munged.stdout.split() == ["enabled", "active"], (node.name, munged.stdout)
        found = node.sh("command -v nodeagentctl && readlink /usr/local/bin/nodeagentctl")
        link = ["/usr/local/bin/nodeagentctl", "/opt/nodeagent/venv/bin/nodeagentctl"]
        assert found.stdout.split() == link, (node.name, found.stdout)


def _inventory(
    nodes: Sequence[Node],
    key: Path,
    wheel: Path,
    passwords: dict[str, str],
    munge_key: Path,
    path: Path,
) -> Path:
    redis = nodes[0]
    agent_url = f"redis://nodeagent-agent:{passwords['agent']}@{redis.address}:6379/0"
    hosts = {
        n.name: {"ansible_host": n.address, "nodeagent_node_address": n.address} for n in nodes
    }
    api = next(n for n in nodes if n.name == API_NODE)
    hosts[API_NODE].update(_api_host(api, redis, passwords, path.parent))
    inventory = {
        "all": {
            "vars": {
                "ansible_user": "root",
                "ansible_become": False,
                "ansible_python_interpreter": "/usr/bin/python3",
                "ansible_ssh_private_key_file": str(key),
                "ansible_ssh_common_args": "-o StrictHostKeyChecking=no "
                "-o UserKnownHostsFile=/dev/null",
            },
            "children": {
                "redis": {
                    "hosts": {redis.name: {"ansible_host": redis.address}},
                    "vars": {
                        "redis_bind": redis.address,
                        "redis_agent_password": passwords["agent"],
                        "redis_operator_password": passwords["operator"],
                        "redis_submitter_password": passwords["submitter"],
                    },
                },
                "nodeagent_nodes": {
                    "hosts": hosts,
                    "vars": {
                        "nodeagent_package": str(wheel),
                        "nodeagent_pip_extra_args": f"--no-index --find-links {wheel.parent}",
                        "nodeagent_redis_url": agent_url,
                        "nodeagent_pool_users": sorted(USERS),
                        "nodeagent_pool_auth": "munge",
                        "nodeagent_munge_install": True,  # the role's MUNGE, this key
                        "nodeagent_munge_key_file": str(munge_key),
                        "nodeagent_timing": TIMING,
                        "nodeagent_token_key_file": str(_token_key(path.parent)),
                        "nodeagent_api_users": ["nodeagent-api"],
                        "nodeagent_api_uid": API_UID,
                    },
                },
            },
        }
    }
    path.write_text(json.dumps(inventory, indent=1))
    return path


@contextlib.contextmanager
def booted_pool(directory: Path) -> Iterator[BootedPool]:
    """Boot NAMES, install Redis (n1) and nodeagent (every node, with MUNGE and a key the
    controller made: nodeagent_munge_install; the pool's token key and API account; the API
    service on API_NODE) with the roles, the pool's users made as a site's
    directory service would; removed at the end (kept, to look at
    them, with NODEAGENT_BOOTED_KEEP=1: `podman exec -it nodeagent-booted-TAG-n1 bash`, then
    remove_nodes(TAG) and the network `nodeagent-booted-TAG`)."""
    tag = new_tag()
    share = Path(f"/var/tmp/nodeagent-booted-{tag}")  # made before the nodes boot: they see it
    share.mkdir(mode=0o755)
    try:
        wheel = _wheelhouse(share)
        with network(tag) as net:
            try:
                shared = share / "shared"
                shared.mkdir(mode=0o755)
                nodes = boot_nodes(NAMES, net, tag, shared)
                key = _authorize(nodes, directory)
                for node in nodes:
                    for user, uid in USERS.items():
                        node.sh(f"useradd -u {uid} -U -M -d /nonexistent -s /bin/sh {user}")
                munge_key = _munge_key(nodes, directory)
                passwords = {w: uuid.uuid4().hex for w in ("agent", "operator", "submitter")}
                inventory = _inventory(
                    nodes, key, wheel, passwords, munge_key, directory / "inventory.json"
                )
                made = BootedPool(nodes, share, inventory, passwords, directory / "api.crt")
                made.playbook("redis.yml", "site.yml")
                _check_the_roles_install(nodes, munge_key)
                yield made
            finally:
                if os.environ.get("NODEAGENT_BOOTED_KEEP") != "1":
                    remove_nodes(tag)
    finally:
        if os.environ.get("NODEAGENT_BOOTED_KEEP") != "1":
            shutil.rmtree(share, ignore_errors=True)
