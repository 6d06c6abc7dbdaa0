"""Redis with Sentinel on this machine's loopback: a primary, one replica and three
redis-sentinel processes watching it as service `pool`, as docs/operations.md ("Redis with
Sentinel") deploys them, with a quick `down-after-milliseconds` so that a test's failover
takes seconds. `url` is what agents and nodeagentctl are given."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis

from tests.helpers.cluster import RedisServer, free_port, wait_for

SERVICE = "pool"
# A primary silent this long is called down. 1 s was too short on a loaded machine: right after
# a switch, the sentinels' fresh links to the new primary (busy with its CONFIG REWRITE's fsync)
# went unanswered for a second, and they failed over again, to the old primary just restarted
# empty (the role's ACL test, under two CPU hogs). 3 s is the tests' pool lease: a 1.5 s stall
# passes. bench/failover.py, on an idle machine, asks for 1 s.
DOWN_AFTER_MS = 3000


def sentinel_conf(
    port: int,
    address: str,
    primary_port: int,
    directory: Path,
    service: str = SERVICE,
    down_after_ms: int = DOWN_AFTER_MS,
) -> str:
    """A sentinel on `address`:`port` watching the primary at `address`:`primary_port` as
    `service`, quorum 2 of 3 (the chaos suite's and this set's)."""
    return (
        f"port {port}\nbind {address}\nprotected-mode no\ndir {directory}\n"
        f"sentinel monitor {service} {address} {primary_port} 2\n"
        f"sentinel down-after-milliseconds {service} {down_after_ms}\n"
        f"sentinel failover-timeout {service} 5000\n"
        f"sentinel parallel-syncs {service} 1\n"
    )


class SentinelSet:
    def __init__(self, directory: Path, down_after_ms: int = DOWN_AFTER_MS) -> None:
        self.directory = directory
        self.down_after_ms = down_after_ms
        (directory / "primary").mkdir(parents=True, exist_ok=True)
        (directory / "replica").mkdir(parents=True, exist_ok=True)
        self.primary = RedisServer(directory / "primary", ("--repl-diskless-sync-delay", "0"))
        self.replica: RedisServer | None = None
        self.ports = [free_port() for _ in range(3)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> None:
        self.primary.start()
        extra = ("--replicaof", "127.0.0.1", str(self.primary.port), "--repl-diskless-sync-delay")
        self.replica = RedisServer(self.directory / "replica", (*extra, "0"))
        self.replica.start()
        replica = self.replica
        wait_for(lambda: _role(replica)["master_link_status"] == "up", 20, "the replica to sync")
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server")
        assert binary is not None
        primary, down_after = self.primary.port, self.down_after_ms
        for port in self.ports:
            conf = self.directory / f"sentinel-{port}.conf"
            conf.write_text(
                sentinel_conf(port, "127.0.0.1", primary, self.directory, SERVICE, down_after)
            )
            with (self.directory / f"sentinel-{port}.log").open("wb") as log:  # what it decided
                self.sentinels.append(
                    subprocess.Popen(
                        [binary, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT
                    )
                )
        wait_for(lambda: self.master() == self.primary.port, 20, "the sentinels to agree")

    def master(self) -> int | None:
        """The port of the primary the sentinels name now (None: none answers)."""
        for port in self.ports:
            try:
                with redis.Redis(port=port, socket_timeout=1) as client:
                    found: Any = client.execute_command(
                        "SENTINEL", "get-master-addr-by-name", SERVICE
                    )
                if found:
                    return int(found[1])
            except redis.RedisError:
                continue
        return None

    def promoted(self) -> RedisServer:
        """Wait until the sentinels name the replica; it."""
        assert self.replica is not None
        port = self.replica.port
        wait_for(lambda: self.master() == port, 30, "a sentinel to promote the replica")
        replica = self.replica
        wait_for(lambda: _role(replica)["role"] == "master", 30, "the replica to be primary")
        return replica

    def rejoined(self) -> None:
        """Wait until the old primary serves as the new one's replica, in sync (the sentinels
        convert it when it is back: a killed one once it is started again, as systemd does)."""
        old, new = self.primary, self.promoted()
        if old.proc is None or old.proc.poll() is not None:
            old.start()  # the same port and directory
        wait_for(
            lambda: _role(old)["role"] == "slave" and _role(old)["master_link_status"] == "up",
            60,
            "the old primary to serve as a replica",
        )
        wait_for(lambda: _role(new).get("connected_slaves") == 1, 30, "the new primary's replica")

    def signal_primary(self, sig: signal.Signals) -> None:
        assert self.primary.proc is not None
        self.primary.proc.send_signal(sig)

    def stop(self) -> None:
        for proc in self.sentinels:
            proc.kill()
            proc.wait(10)
        for server in (self.primary, self.replica):
            if server is not None:
                if server.proc is not None and server.proc.poll() is None:
                    server.proc.send_signal(signal.SIGCONT)
                server.stop()


def _role(server: RedisServer) -> dict[str, Any]:
    try:
        return dict(server.client().info("replication"))
    except redis.RedisError:
        return {"role": "", "master_link_status": ""}


@contextmanager
def sentinel_set(directory: Path) -> Iterator[SentinelSet]:
    found = SentinelSet(directory)
    try:
        found.start()
        yield found
    finally:
        found.stop()
