"""A private redis-server for one node (`redis.url: embedded`), like `torchrun --standalone`.

Bound to a unix socket only (no TCP port, nothing to firewall), no persistence, stopped with the
agent. The socket lives in a directory the agent makes for itself, `nodeagent-<uid>`, under the
service's runtime directory (systemd's $RUNTIME_DIRECTORY, /run/nodeagent with
RuntimeDirectory=nodeagent) or else the temporary directory. That directory must be the
agent's own and closed to everyone else (0700): one that another user created first (say a
0777 /tmp/nodeagent-0) is refused, or that user could put a socket of theirs in it and receive
root's connections. `nodeagentctl --config` looks in the same places and refuses the same.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from nodeagent.errors import ConfigError

EMBEDDED = "embedded"
RUNTIME_DIR = Path("/run/nodeagent")  # systemd's RuntimeDirectory=nodeagent


MAX_SOCKET_PATH = 107  # bytes: sun_path holds 108, with the terminating NUL


def socket_dir(base: Path | None = None) -> Path:
    """The agent's own directory under `base` (default: the temporary directory)."""
    return (base or Path(tempfile.gettempdir())) / f"nodeagent-{os.geteuid()}"


def socket_path(job: str, base: Path | None = None) -> Path:
    return socket_dir(base) / f"{job}.redis.sock"


def embedded_url(job: str, bases: tuple[Path, ...] | None = None) -> str:
    """Where a client on this node finds `job`'s embedded Redis: the first socket that exists
    under `bases` (default: RUNTIME_DIR, then the temporary directory).

    Raises:
        ConfigError: naming redis.url, when that socket's directory is not ours alone.
    """
    for base in bases or (RUNTIME_DIR, Path(tempfile.gettempdir())):
        path = socket_path(job, base)
        if path.exists():
            check_private(path.parent)
            return f"unix://{path}"
    return f"unix://{socket_path(job)}"  # none runs: connecting says Redis is unreachable


def private_dir(directory: Path) -> Path:
    """Create `directory` (mode 0700), or make sure the one that exists is ours and private.

    Raises:
        ConfigError: naming redis.url, when it cannot be made or is not ours alone.
    """
    _check_parent(directory.parent)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ConfigError(
            "redis.url", f"embedded: cannot create {directory}: {exc.strerror}"
        ) from None
    check_private(directory)
    return directory


def check_private(directory: Path) -> None:
    """`directory` is a real directory (not a link), owned by us, with no group/other access.

    Raises:
        ConfigError: naming redis.url and what is wrong.
    """
    try:
        info = os.lstat(directory)
    except OSError as exc:
        raise ConfigError(
            "redis.url", f"embedded: cannot use {directory}: {exc.strerror}"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        problem = "is a symbolic link" if stat.S_ISLNK(info.st_mode) else "is not a directory"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to uid {info.st_uid}, not to this agent's uid {os.geteuid()}"
    elif info.st_mode & 0o077:
        problem = f"has mode {stat.S_IMODE(info.st_mode):04o}; it must be 0700"
    else:
        return
    raise ConfigError(
        "redis.url",
        f"embedded: refusing the socket directory {directory}: it {problem}. Someone else may "
        "have created it to intercept the agent's Redis; remove it (the agent creates its own)",
    )


def _check_parent(base: Path) -> None:
    """A world-writable parent needs the sticky bit, or anyone could swap our directory."""
    try:
        info = os.stat(base)
    except OSError as exc:
        raise ConfigError("redis.url", f"embedded: cannot use {base}: {exc.strerror}") from None
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise ConfigError(
            "redis.url",
            f"embedded: {base} is writable by everyone without the sticky bit; anyone could "
            "replace the agent's socket directory in it",
        )


class EmbeddedRedis:
    """Start with `start()`, stop with `stop()`; `url` is what clients connect to."""

    def __init__(self, job: str, binary: str | None = None, base: Path | None = None) -> None:
        """`base`: the directory to make the socket directory in (default: temporary dir)."""
        self.socket = socket_path(job, base)
        self.binary = binary or shutil.which("redis-server")
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.socket.with_suffix(".log")

    def start(self, timeout_s: float = 10.0) -> None:
        """Raises ConfigError if redis-server is missing or does not come up."""
        if not self.binary:
            raise ConfigError(
                "redis.url",
                "'embedded' needs the redis-server binary (Debian: apt-get install "
                "redis-server), or set redis.url to a Redis server",
            )
        size = len(os.fsencode(self.socket))
        if size > MAX_SOCKET_PATH:
            raise ConfigError(
                "redis.url",
                f"embedded: the socket path {self.socket} is {size} bytes, more than the "
                f"{MAX_SOCKET_PATH} a unix socket's address holds; give the service a shorter "
                "RUNTIME_DIRECTORY (or TMPDIR), or the job a shorter id",
            )
        private_dir(self.socket.parent)
        self.socket.unlink(missing_ok=True)
        self.log.unlink(missing_ok=True)
        self._proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                "0",
                "--unixsocket",
                str(self.socket),
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.socket.parent),
                "--logfile",  # (its own: why it exited, when it does)
                str(self.log),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        client = redis.Redis(unix_socket_path=str(self.socket), socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
                if self.log.exists():
                    err += self.log.read_text(errors="replace")
                self.stop()
                raise ConfigError(
                    "redis.url", f"embedded redis-server exited: {err.strip()[-300:]}"
                )
            try:
                if client.ping():
                    client.close()
                    return
            except redis.RedisError:
                time.sleep(0.02)
        self.stop()
        raise ConfigError("redis.url", f"embedded redis-server did not answer in {timeout_s:.0f}s")

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc is not None and self._proc.stderr is not None:
            self._proc.stderr.close()
        self._proc = None
        self.socket.unlink(missing_ok=True)
