"""A login on this node for a user who holds a job here (`ssh node`, as Slurm's pam_slurm_adopt):
the wire between the PAM check (cli/pamadopt.py, run by pam_exec in sshd's account and session
stacks) and the node's agent (runtime/logins.py), pure but for `ask`'s socket
(docs/interactive.md, "ssh to your node").

The agent listens on a Unix socket, LOGIN_SOCKET in its runtime directory (/run/nodeagent,
root's alone), and answers root alone: the kernel names the caller (SO_PEERCRED), so the
request carries no credential. One line each way:

    {"user": "alice", "adopt": false}        may alice log in? (the account stack)
    {"user": "alice", "adopt": true}         take her login into her job (the session stack)
    {"job": "j1", "said": "..."}             yes: job j1 (taken into its cgroup, if asked)
    {"said": "alice holds no job on n3"}     refused, and why (shown to the user)

The process taken into the job is not named by the request: it is the caller's parent (pam_exec
is a child of the process that runs the PAM stack). At the session's opening that is the sshd
process every process of the session is forked from afterwards; at the account check it may be
a short-lived helper of sshd's (keyboard-interactive logins run the account stack in one), so
the account check moves nothing.
"""

from __future__ import annotations

import json
import re
import socket
from dataclasses import dataclass

LOGIN_SOCKET = "login.sock"
DEFAULT_SOCKET = "/run/nodeagent/" + LOGIN_SOCKET  # the shipped unit's RuntimeDirectory=
MAX_LINE = 4096
ANSWER_WITHIN_S = 10.0  # how long the check waits: ssh's LoginGraceTime is 120 s
# POSIX's portable user names, and what Debian's useradd and directory services also allow.
_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\$?")


@dataclass(frozen=True)
class LoginAnswer:
    """The agent's answer: the job the login was taken into ("" when refused), and what to
    tell the user."""

    job: str
    said: str

    @property
    def admitted(self) -> bool:
        return bool(self.job)


def ask_line(user: str, adopt: bool) -> bytes:
    return json.dumps({"user": user, "adopt": adopt}).encode() + b"\n"


def parse_ask(line: bytes) -> tuple[str, bool]:
    """The user a request names, and whether the login is to be taken into its job.

    Raises:
        ValueError: it is not one request line naming a user (says what is wrong).
    """
    doc = _object(line, "a login request")
    user, adopt = doc.get("user"), doc.get("adopt", False)
    if not isinstance(user, str) or not _USER.fullmatch(user):
        raise ValueError(f"a login request names a user ('user': a user name), not {user!r}")
    if not isinstance(adopt, bool):
        raise ValueError(f"a login request's 'adopt' is true or false, not {adopt!r}")
    return user, adopt


def answer_line(answer: LoginAnswer) -> bytes:
    doc = {"job": answer.job, "said": answer.said} if answer.job else {"said": answer.said}
    return json.dumps(doc).encode() + b"\n"


def parse_answer(line: bytes) -> LoginAnswer:
    """The agent's answer.

    Raises:
        ValueError: it is not one (says what is wrong).
    """
    doc = _object(line, "the agent's answer")
    job, said = doc.get("job", ""), doc.get("said")
    if not isinstance(job, str) or not isinstance(said, str):
        raise ValueError(f"the agent's answer has a 'said' text and a 'job' name, not {doc!r}")
    return LoginAnswer(job, said)


def ask(path: str, user: str, adopt: bool, timeout: float = ANSWER_WITHIN_S) -> LoginAnswer:
    """The answer of the agent at `path` about a login of `user` (`adopt`: taken into its job).

    Raises:
        OSError: no agent answers there (none runs, or it is not root's socket to ask).
        ValueError: what came back is not an answer.
    """
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(ask_line(user, adopt))
        return parse_answer(read_line(sock))


def read_line(sock: socket.socket) -> bytes:
    """One line (with its newline) from `sock`, within its timeout: a request or an answer.

    Raises:
        OSError: the socket failed or timed out.
        ValueError: the line is longer than MAX_LINE, or the connection ended first.
    """
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(MAX_LINE + 1 - len(data))
        if not chunk or len(data) + len(chunk) > MAX_LINE:
            raise ValueError(f"a login request or answer is one line of at most {MAX_LINE} bytes")
        data += chunk
    return data


def _object(line: bytes, what: str) -> dict[str, object]:
    if len(line) > MAX_LINE or not line.endswith(b"\n"):
        raise ValueError(f"{what} is one line of at most {MAX_LINE} bytes")
    try:
        doc = json.loads(line)
    except ValueError:
        raise ValueError(f"{what} is a JSON object, not {line[:80]!r}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what} is a JSON object, not {line[:80]!r}")
    return doc
