"""A rank's log files: one per generation (`<job>/<generation>/rank-R.log`) and one across
generations (`<job>/rank-R.log`, the one `nodeagentctl logs --rank R` follows), owned by the
agent with the job's group (0640: the job's user reads them, others cannot), with the worker's
own progress, control and error files beside them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from nodeagent.channel import beats, control, restore
from nodeagent.config.identity import WorkerUser
from nodeagent.model.job import CAUSE_MAX
from nodeagent.supervisor.spec import WorkerSpec


def last_lines(path: Path, count: int = 3) -> str | None:
    """The last `count` non-empty lines of a log, joined with ' | ', at most CAUSE_MAX chars."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [line.strip() for line in tail.splitlines() if line.strip()][-count:]
    return " | ".join(lines)[-CAUSE_MAX:] or None


LOG_MODE = 0o640  # the agent's, read by the job's group: the worker writes only through its pipe


DIR_MODE = 0o750  # a generation's directory: the agent's, searchable by the workers' group


def open_log(path: Path, gid: int | None = None) -> IO[bytes]:
    """A rank's log, for appending, 0640 whatever the umask (or an older file's mode), with
    the group `gid` when given (the job's user's: it reads its own logs on the node)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, LOG_MODE)
    if gid is not None:
        os.fchown(fd, -1, gid)
    os.fchmod(fd, LOG_MODE)
    return os.fdopen(fd, "ab")


def generation_log(spec: WorkerSpec, user: WorkerUser | None) -> IO[bytes]:
    """The generation's directory (made) and the rank's log in it (returned, open).

    A worker that runs as another user must reach its progress file to map it, and write its
    error file: the job's and the generation's directories get the worker's group (0750), so
    no other user enters them. Its logs stay the agent's, readable by that group (0640): the
    job's user reads its own output on the node, but cannot change it.
    """
    directory = spec.log_path.parent
    directory.mkdir(parents=True, exist_ok=True)
    switch = user is not None and user.switch
    if user is not None and switch:
        for path in (directory.parent, directory):
            os.chown(path, -1, user.gid)
            os.chmod(path, DIR_MODE)
    return open_log(spec.log_path, user.gid if user is not None and switch else None)


def worker_files(spec: WorkerSpec, user: WorkerUser | None) -> IO[bytes]:
    """A new worker's files: its log (returned, open), its progress file, its control channel
    (in_place) and its error file; the last three are the worker's when it runs as another
    user."""
    log_file = generation_log(spec, user)
    owner = user.uid if user is not None and user.switch else None
    beats.create(spec.progress_path, owner=owner)
    if spec.control_path is not None:
        control.create(spec.control_path, owner=owner)
    if owner is not None and spec.error_file is not None:  # @record writes it on failure;
        beats.worker_file(spec.error_file, owner)  # empty reads as no error file
    restore_report(spec, user)
    return log_file


def restore_report(spec: WorkerSpec, user: WorkerUser | None) -> None:
    """The file where the rank says what it restored (empty: not yet), made for it when it runs
    as another user (it cannot create files in the generation's directory)."""
    report = spec.env.get(restore.RESTORE_REPORT_ENV)
    if user is not None and user.switch and report:
        beats.worker_file(Path(report), user.uid)


class RankLog:
    """Where a rank's output goes: its generation's file (`<job>/<generation>/rank-R.log`) and
    the rank's one file across generations (`<job>/rank-R.log`, appended after a banner line
    naming the generation and node), the one to follow (`nodeagentctl logs --rank R`)."""

    def __init__(self, spec: WorkerSpec, generation_log: IO[bytes], banner: str) -> None:
        self._lock = threading.Lock()
        self._files = self._open(spec, generation_log, banner)

    @staticmethod
    def _open(
        spec: WorkerSpec, generation_log: IO[bytes], banner: str
    ) -> tuple[IO[bytes], IO[bytes]]:
        gid = os.fstat(generation_log.fileno()).st_gid  # the job's group, as its generation's
        stable = open_log(stable_log_path(spec.log_path), gid)
        stable.write(f"{banner}\n".encode())
        stable.flush()
        return generation_log, stable

    def switch(self, spec: WorkerSpec, generation_log: IO[bytes], banner: str) -> None:
        """From now on, write to `spec`'s files: an in_place survivor's new generation and rank."""
        files = self._open(spec, generation_log, banner)
        with self._lock:
            old, self._files = self._files, files
        for f in old:
            f.close()

    def write(self, data: bytes) -> None:
        with self._lock:
            for f in self._files:
                f.write(data)
                f.flush()

    def close(self) -> None:
        with self._lock:
            for f in self._files:
                f.close()


def stable_log_path(generation_log: Path) -> Path:
    """`<log_dir>/<job>/rank-R.log` for `<log_dir>/<job>/<generation>/rank-R.log`."""
    return generation_log.parent.parent / generation_log.name


def banner(generation: int, node: str, spec: WorkerSpec, now: float) -> str:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return (
        f"=== nodeagent: generation {generation}, rank {spec.rank} "
        f"(local {spec.local_rank}) on {node}, {when} ==="
    )


def pump_output(stream: IO[bytes], log: RankLog, rank: int, echo: Echo) -> None:
    """Copy a worker's output, line by line, to its logs and the agent's output."""
    try:
        with stream:
            for line in iter(stream.readline, b""):
                log.write(line)
                echo(rank, line.decode("utf-8", "replace").rstrip("\n"))
    finally:
        log.close()


Echo = Callable[[int, str], None]
