"""A private network for a chaos test: a hub namespace with a bridge, one namespace per node.

Every address lives only inside namespaces made here (10.213.0.0/24) and everything is deleted
on close. `cut(node)` takes the node's bridge port down: its packets are dropped silently, so
every call to Redis hangs until it times out (the hard case; taking the node's own interface
down would make calls fail at once).
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

SUBNET = "10.213.0"
_ids = itertools.count(1)


def unavailable() -> str | None:
    """Why this machine cannot run the chaos suite, or None if it can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    probe = f"nachk{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


class Network:
    def __init__(self) -> None:
        self.tag = f"na{os.getpid() % 100000}x{next(_ids)}"
        self.hub = f"{self.tag}-hub"
        self.hub_address = f"{SUBNET}.1"
        self.namespaces: list[str] = []
        self.nodes: dict[str, tuple[str, str]] = {}  # node -> (namespace, address)
        self._add_namespace(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "addr", "add", f"{self.hub_address}/24", "dev", "br0")
        _ip("-n", self.hub, "link", "set", "br0", "up")

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def add_node(self, node: str) -> str:
        """A namespace for `node`, linked to the bridge; its address."""
        namespace = f"{self.tag}-{node}"
        address = f"{SUBNET}.{10 + len(self.nodes)}"
        self._add_namespace(namespace)
        port = self._port(node)
        _ip(
            "link",
            "add",
            "eth0",
            "netns",
            namespace,
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            self.hub,
        )
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", self.hub, "link", "set", port, "master", "br0")
        _ip("-n", self.hub, "link", "set", port, "up")
        self.nodes[node] = (namespace, address)
        return address

    @staticmethod
    def _port(node: str) -> str:
        return f"p-{node}"[:15]

    def prefix(self, namespace: str) -> list[str]:
        """The command prefix that runs a program inside `namespace`. It mounts a /sys of its
        own, without the cgroup hierarchies: an agent started so keeps no job cgroups
        (tests/helpers/cluster.py NETNS_ISOLATION)."""
        return ["ip", "netns", "exec", namespace]

    def cut(self, node: str) -> None:
        _ip("-n", self.hub, "link", "set", self._port(node), "down")

    def heal(self, node: str) -> None:
        _ip("-n", self.hub, "link", "set", self._port(node), "up")

    def isolate(self, node: str) -> None:
        """Cut `node` off from the other nodes alone: their packets dropped both ways in its
        namespace (silently, no reset), while it still reaches the hub (Redis)."""
        self._peers(node, "-A")

    def rejoin(self, node: str) -> None:
        self._peers(node, "-D")

    def cut_from_redis(self, node: str) -> None:
        """Drop every packet between `node` and the hub (Redis, the sentinels), silently,
        while it still hears the other nodes."""
        self._hub(node, "-A")

    def reach_redis(self, node: str) -> None:
        self._hub(node, "-D")

    def _hub(self, node: str, how: str) -> None:
        self._drop(node, self.hub_address, how)

    def _peers(self, node: str, how: str) -> None:
        for other, (_, address) in self.nodes.items():
            if other != node:
                self._drop(node, address, how)

    def _drop(self, node: str, address: str, how: str) -> None:
        """Add (-A) or remove (-D) the rules dropping `node`'s packets to and from `address`."""
        namespace, _ = self.nodes[node]
        for chain, side in (("INPUT", "-s"), ("OUTPUT", "-d")):
            rule = [chain, side, address, "-j", "DROP"]
            subprocess.run(
                ["ip", "netns", "exec", namespace, "iptables", how, *rule],
                check=True,
                capture_output=True,
            )

    def close(self) -> None:
        for namespace in reversed(self.namespaces):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        self.namespaces.clear()
