"""`nodeagent-pam`: the PAM account check of `ssh node` (docs/interactive.md, "ssh to your
node"), as Slurm's pam_slurm_adopt: run by pam_exec, as root, in sshd's account stack,

    account required pam_exec.so stdout quiet /opt/nodeagent/venv/bin/nodeagent-pam

it asks the node's agent (telemetry/loginwire.py, runtime/logins.py) and lets the login in only
when the agent took it into a job of the user's on this node. Root is let in without asking (an
operator on a node whose agent is down). A refusal prints why: pam_exec's `stdout` hands it to
sshd, which shows it to the user before it closes the connection. An agent that does not answer
refuses the login: a session outside any job would escape every job's bound and end.

It imports nothing of the agent's: a login waits for it.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from collections.abc import Mapping, Sequence

from nodeagent.telemetry.loginwire import DEFAULT_SOCKET, ask

CHECKED = ("account", "open_session")  # PAM_TYPE: a session's close has nothing to check


def check(user: str, stage: str, path: str) -> str | None:
    """Why `user` may not log in (None: it may)."""
    if stage not in CHECKED:
        return None
    if not user:
        return "no PAM_USER: nodeagent-pam is run by pam_exec (docs/interactive.md)"
    try:
        if pwd.getpwnam(user).pw_uid == 0:
            return None
    except KeyError:
        pass  # the agent says so
    try:
        answer = ask(path, user)
    except OSError as exc:
        return (
            f"the node's agent does not answer at {path} ({exc.strerror or exc}): a login is let "
            "in only into a job of yours on this node"
        )
    except ValueError as exc:
        return f"the node's agent at {path} answered what is not an answer: {exc}"
    return None if answer.admitted else answer.said


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ) -> int:
    parser = argparse.ArgumentParser(
        prog="nodeagent-pam",
        description="PAM account check (pam_exec): let a user in only into a job of theirs "
        "on this node, taking the login into the job's cgroup",
    )
    parser.add_argument(
        "--socket", default=DEFAULT_SOCKET, help=f"the agent's login socket ({DEFAULT_SOCKET})"
    )
    args = parser.parse_args(argv)
    why = check(environ.get("PAM_USER", ""), environ.get("PAM_TYPE", "account"), args.socket)
    if why is None:
        return 0
    print(f"nodeagent: {why}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
