"""The agent's side of `ssh node` for a user who holds a job here (the wire and the PAM check:
telemetry/loginwire.py, cli/pamadopt.py; docs/interactive.md, "ssh to your node").

sshd's account stack runs the check as root; it asks this node's agent on a Unix socket whether
the user may log in. The agent answers root alone (SO_PEERCRED). A user with a job or an
allocation running here is let in; anyone else is refused, with why. At the session's opening
the check runs again, asking that the sshd process that runs the login (the check's parent,
root's) be taken into the job's cgroup in every hierarchy, so that the session, forked from it
afterwards, is bounded by the job's memory, processes, CPUs and GPUs (the device program), is
counted with it, and is killed with everything else of the job when the job leaves the node.
A user with several jobs here goes into the newest that can take it (pam_slurm_adopt's default:
the newest). Root is never asked about: the check lets it in without asking.

One connection is answered at a time, each within ANSWER_WITHIN_S: only root can connect.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import pwd
import socket
import stat
import struct
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import psutil

from nodeagent.telemetry.loginwire import (
    ANSWER_WITHIN_S,
    LoginAnswer,
    answer_line,
    parse_ask,
    read_line,
)

log = logging.getLogger(__name__)
NEEDS = " (the agent needs CAP_SYS_NICE: systemd/nodeagent.service.d/ssh-adopt.conf)"
_PEER = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Adoptive(Protocol):
    """A job this node serves, as a login taken into it needs it (runtime/jobrun.JobRun)."""

    @property
    def job_id(self) -> str: ...

    @property
    def uid(self) -> int: ...

    @property
    def left(self) -> bool: ...

    @property
    def adoptable(self) -> bool: ...

    def adopt(self, pid: int) -> None: ...


def choose(uid: int, jobs: Sequence[Adoptive]) -> Adoptive | None:
    """The job a login of `uid` goes into: the newest of its jobs still here that can take a
    login (one with a cgroup here), else the newest (whose refusal says why); None if it has
    none (`jobs` in the order they started). Pure."""
    mine = [job for job in reversed(jobs) if job.uid == uid and not job.left]
    return next((job for job in mine if job.adoptable), mine[0] if mine else None)


def uid_of(user: str) -> int | None:
    """The user's uid on this node (the site's directory service), None if it has none."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def parent_of(pid: int) -> int:
    """The process that runs `pid`'s PAM stack: its parent, root's, started before it (a pid
    the parent's death freed and another process took would be younger).

    Raises:
        OSError: either is gone, or the parent is init (the caller's parent died: the caller
            was reparented), not root's, or younger than the caller.
    """
    try:
        caller = psutil.Process(pid)
        ppid = caller.ppid()
        parent = psutil.Process(ppid) if ppid > 1 else None
        good = (
            parent is not None
            and parent.uids().effective == 0
            and parent.create_time() <= caller.create_time()
        )
    except psutil.Error as exc:
        raise OSError(f"cannot read process {pid} or its parent: {exc}") from None
    if not good:
        raise OSError(f"process {pid}'s parent is not the login's sshd (root's, older)")
    return ppid


class LoginServer:
    """The socket at `path`, answered in a thread of its own."""

    def __init__(
        self,
        path: Path,
        node: str,
        jobs: Callable[[], Sequence[Adoptive]],
        users: Callable[[str], int | None] = uid_of,
        parents: Callable[[int], int] = parent_of,
    ) -> None:
        """`jobs`: the jobs this node serves now, in the order they started."""
        self.path = path
        self._node = node
        self._jobs = jobs
        self._users = users
        self._parents = parents
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen (a socket an earlier agent left at `path` is replaced).

        Raises:
            OSError: it cannot (another kind of file is at `path`, naming it).
        """
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISSOCK(self.path.lstat().st_mode):
                raise OSError(f"{self.path} is there and is not a socket: not replaced")
            self.path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)  # root's alone; the peer's uid is checked all the same
            sock.listen(16)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="logins", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # wakes accept()
        sock.close()
        if self._thread is not None:
            self._thread.join(timeout=ANSWER_WITHIN_S + 1)
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _serve(self) -> None:
        while True:
            sock = self._sock
            if sock is None:
                return
            try:
                conn, _ = sock.accept()
            except OSError:
                if self._sock is None:
                    return
                time.sleep(0.1)  # EMFILE and the like: the next one may get through
                continue
            with conn:
                try:
                    self._answer(conn)
                except Exception:  # one caller's trouble must not end the socket
                    log.exception("logins: answering a login check failed")

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(ANSWER_WITHIN_S)
        pid, uid, _ = _PEER.unpack(
            conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEER.size)
        )
        try:
            user, adopt = parse_ask(read_line(conn))  # read first: an answer before it is lost
        except OSError as exc:
            conn.sendall(answer_line(LoginAnswer("", f"a login request did not come: {exc}")))
            return
        except ValueError as exc:
            conn.sendall(answer_line(LoginAnswer("", str(exc))))
            return
        if uid != 0:
            said = f"only root asks this socket, not uid {uid}: it is sshd's PAM check's"
            conn.sendall(answer_line(LoginAnswer("", said)))
            return
        answer = self.admit(user, pid, adopt)
        log.info("login of %s: %s", user, answer.said)
        conn.sendall(answer_line(answer))

    def admit(self, user: str, caller: int, adopt: bool = True) -> LoginAnswer:
        """Let `user` in (with `adopt`, taking `caller`'s parent into its job), or say why
        not."""
        uid = self._users(user)
        if uid is None:
            return LoginAnswer("", f"{user} is not a user of node {self._node}")
        job = choose(uid, self._jobs())
        if job is None:
            return LoginAnswer(
                "",
                f"{user} holds no job on node {self._node}: ssh reaches only a node where one "
                "of your jobs or allocations runs (nodeagentctl alloc)",
            )
        if not adopt:
            return LoginAnswer(job.job_id, f"may log in, into job {job.job_id}")
        try:
            session = self._parents(caller)
            job.adopt(session)
        except OSError as exc:
            hint = NEEDS if exc.errno == errno.EPERM else ""
            return LoginAnswer(
                "", f"cannot take this login into job {job.job_id} on {self._node}: {exc}{hint}"
            )
        return LoginAnswer(job.job_id, f"process {session} taken into job {job.job_id}")
