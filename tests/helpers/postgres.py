"""A real PostgreSQL of the tests' own: Debian's server binaries, `initdb` in a temporary
directory, a free port on 127.0.0.1, password (SCRAM) authentication, as a cluster's accounting
database would be. PostgreSQL refuses to run as root: as root, the cluster is run as the
`postgres` user Debian's package makes, with the directory handed to it."""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.helpers.cluster import free_port

USER = "nodeagent"


def binaries() -> Path | None:
    """Debian's server binaries (postgresql-NN: /usr/lib/postgresql/NN/bin), the newest."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=_version)
    return Path(found[-1]).parent if found else None


def _version(path: str) -> int:
    number = Path(path).parts[-3]
    return int(number) if number.isdigit() else 0


def missing() -> str | None:
    """Why no PostgreSQL can be started here (None: one can)."""
    if binaries() is None:
        return "PostgreSQL's server is not installed (Debian: apt install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root without Debian's postgres user to run PostgreSQL as"
    return None


class Postgres:
    """One server; `url` names its database `postgres` as the user USER, whose password is
    `password` (also in `password_file`, 0600, as pool.accounting.password_file wants)."""

    def __init__(self) -> None:
        bin_dir = binaries()
        assert bin_dir is not None, missing()
        self.bin = bin_dir
        self.directory = Path(tempfile.mkdtemp(prefix="pg-", dir="/tmp"))
        self.data = self.directory / "data"
        self.port = free_port()
        self.password = secrets.token_hex(16)
        # Apart from the server's directory, which is the postgres user's alone as root.
        self.password_file = Path(tempfile.mkdtemp(prefix="pgpw-")) / "password"
        self.url = f"postgresql://{USER}@127.0.0.1:{self.port}/postgres"
        self._as: list[str] = []
        if os.geteuid() == 0:
            self._as = ["runuser", "-u", "postgres", "--"]

    def start(self) -> Postgres:
        pwfile = self.directory / "initpw"
        pwfile.write_text(self.password + "\n")
        if self._as:
            account = pwd.getpwnam("postgres")
            for path in (self.directory, pwfile):
                os.chown(path, account.pw_uid, account.pw_gid)
        self._run(
            "initdb", "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}",
            "--auth=scram-sha-256", "--no-sync", "-E", "UTF8",
        )  # fmt: skip
        pwfile.unlink()
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(self.password + "\n")
        self.resume()
        return self

    def resume(self) -> None:
        """Start the server (again, after `pause`) and wait until it takes connections."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.directory} -c fsync=off "
            "-c full_page_writes=off -c synchronous_commit=off"
        )
        self._run(
            "pg_ctl", "-D", str(self.data), "-o", options, "-l", str(self.directory / "log"),
            "-w", "-t", "60", "start",
        )  # fmt: skip

    def pause(self) -> None:
        """Stop the server (fast: its connections are cut), keeping its data."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.pause()
        shutil.rmtree(self.directory, ignore_errors=True)
        shutil.rmtree(self.password_file.parent, ignore_errors=True)

    def connect(self) -> object:
        import psycopg

        return psycopg.connect(self.url, password=self.password, autocommit=True)

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run(
            [*self._as, str(self.bin / program), *args],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.directory,
        )
        assert done.returncode == 0, f"{program}: {done.stdout}{done.stderr}"
