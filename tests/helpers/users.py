"""Unix users the tests create (alice, bob), and commands run as them.

The users are real (useradd --system, removed afterwards), so munged sees their uid and gid. A
command run as one keeps CAP_DAC_READ_SEARCH as an ambient capability only when asked
(`reach=True`): this machine's Python lives under /root (0700), which another user cannot
otherwise search; the capability changes nothing of who the kernel says the process is. A
command that tests what the user may read (their logs) runs without it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from nodeagent.config.hosts import Resolver


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(
        self,
        argv: Sequence[str],
        reach: bool = False,
        timeout: float = 60,
        stdin: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """`argv` as this user; its stdin `stdin`'s text (None: empty, not this process's)."""
        return subprocess.run(
            [*self.argv_as(reach), *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.environ(),
            cwd="/",
            input=stdin or "",
        )

    def nodeagentctl(
        self, *args: str, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "nodeagent.cli.ctl", *args], True, stdin=stdin)

    def start_nodeagentctl(
        self, *args: str, stdin: int = subprocess.DEVNULL
    ) -> subprocess.Popen[str]:
        """nodeagentctl as this user, in the background: its output on one pipe, its stdin
        `stdin` (subprocess.PIPE: the caller's to write)."""
        return subprocess.Popen(
            [*self.argv_as(True), sys.executable, "-m", "nodeagent.cli.ctl", *args],
            stdin=stdin,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.environ(),
            cwd="/",
        )

    def argv_as(self, reach: bool = False) -> list[str]:
        """What runs a command as this user (`reach`: reading every file, as a test needs)."""
        caps = ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"] if reach else []
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", *caps]

    def environ(self) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if k != "NODEAGENT_REDIS_PASSWORD"}
        environ.update(USER=self.name, LOGNAME=self.name, HOME="/nonexistent")
        return environ


@contextmanager
def unix_users(*names: str) -> Iterator[dict[str, User]]:
    """Fresh users named `<name>-<8 hex>` (system users, no home), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("creating users needs root")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if not (useradd and userdel and shutil.which("setpriv")):
        pytest.skip("useradd, userdel and setpriv are needed")
    made: dict[str, User] = {}
    try:
        for name in names:
            full = f"{name}-{uuid.uuid4().hex[:8]}"
            subprocess.run(
                [
                    useradd,
                    "--system",
                    "--user-group",
                    "--no-create-home",
                    "--home-dir",
                    "/nonexistent",
                    full,
                ],
                check=True,
                timeout=60,
            )
            account = Resolver().user(full)
            assert account is not None
            made[name] = User(full, account.uid, account.gid)
        yield made
    finally:
        for user in made.values():
            subprocess.run([userdel, user.name], check=False, timeout=60)


@contextmanager
def reachable_dir(prefix: str) -> Iterator[Path]:
    """A directory of /tmp other users can reach (pytest's tmp_path is under a 0700 one)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
