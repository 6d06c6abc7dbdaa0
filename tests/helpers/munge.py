"""A real munged of the tests' own (a key they generate, unprivileged, in a temp directory), and
a fake Munge for pure unit tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from nodeagent.model.credential import Decoded, MungeStatus, MungeUnavailable
from nodeagent.supervisor.munge import MungeProgram

SOCKET_MAX = 107  # sun_path holds 108 bytes with its NUL


class MungeDaemon:
    """munged -F with a fresh 1 KiB key from /dev/urandom (0600), its socket, pid, log and seed
    files in a short directory of /tmp (a socket path must stay under 108 bytes). The directory
    is 0755 so that other users (the tests' alice and bob) reach the socket, as on a real node."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="munge-", dir="/tmp"))
        self.directory.chmod(0o755)
        self.key = self.directory / "munge.key"
        self.socket = str(self.directory / "sock")
        assert len(self.socket.encode()) < SOCKET_MAX, self.socket
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> MungeDaemon:
        munged = shutil.which("munged") or "/usr/sbin/munged"
        fd = os.open(self.key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(os.urandom(1024))
        d = self.directory
        self.proc = subprocess.Popen(
            [
                munged,
                "-F",
                f"--key-file={self.key}",
                f"--socket={self.socket}",
                f"--pid-file={d / 'munged.pid'}",
                f"--log-file={d / 'munged.log'}",
                f"--seed-file={d / 'munged.seed'}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                _, err = self.proc.communicate()
                raise RuntimeError(f"munged exited {self.proc.returncode}: {err.decode()}")
            try:
                self.program().encode("probe")
                return self
            except MungeUnavailable:
                time.sleep(0.05)
        raise RuntimeError(f"munged did not answer on {self.socket} within {timeout:g} s")

    def program(self) -> MungeProgram:
        return MungeProgram(self.socket)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class FakeMunge:
    """Munge in memory: credentials are `MUNGE:fake:N`, expiry by an injected clock, replay per
    fake (as per munged). `key` tells fakes of different sites apart."""

    uid: int = 1000
    gid: int = 1000
    key: str = "site"
    clock: Callable[[], float] = time.time
    ttl_s: int = 300
    made: dict[str, Decoded] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    reachable: bool = True

    def encode(
        self, payload: str, ttl_s: int | None = None, restrict_uid: int | None = None
    ) -> str:
        if not self.reachable:
            raise MungeUnavailable("munged at /fake: not running")
        credential = f"MUNGE:fake-{self.key}:{len(self.made)}"
        self.made[credential] = Decoded(
            MungeStatus.SUCCESS, self.uid, self.gid, payload, int(self.clock()), ttl_s or self.ttl_s
        )
        return credential

    def decode(self, credential: str) -> Decoded | MungeStatus:
        if not self.reachable:
            raise MungeUnavailable("munged at /fake: not running")
        if not credential.startswith("MUNGE:"):
            return MungeStatus.MALFORMED
        found = self.made.get(credential)
        if found is None:
            return MungeStatus.INVALID
        if self.clock() > found.encoded_s + found.ttl_s:
            status = MungeStatus.EXPIRED
        elif credential in self.seen:
            status = MungeStatus.REPLAYED
        else:
            status = MungeStatus.SUCCESS
        self.seen.add(credential)
        return Decoded(status, found.uid, found.gid, found.payload, found.encoded_s, found.ttl_s)

    def share(self, uid: int, gid: int) -> FakeMunge:
        """The same site (key, made, seen) as seen by another user encoding."""
        return FakeMunge(uid, gid, self.key, self.clock, self.ttl_s, self.made, self.seen)
