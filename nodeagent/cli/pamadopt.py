"""The PAM check of `ssh node` (docs/interactive.md, "ssh to your node"), as Slurm's
pam_slurm_adopt: run by pam_exec, as root, in sshd's account and session stacks (PYTHON: the
venv's, /opt/nodeagent/venv/bin/python),

    account required pam_exec.so stdout quiet PYTHON -I -m nodeagent.cli.pamadopt
    session required pam_exec.so quiet PYTHON -I -m nodeagent.cli.pamadopt

it asks the node's agent (telemetry/loginwire.py, runtime/logins.py): in the account stack
whether the user holds a job here, at the session's opening to take the login's sshd process
into that job (the account stack may run in a helper process of sshd's, the session's opening
runs in the process the session is forked from). Root is let in without asking (an operator on
a node whose agent is down). A refusal prints why: pam_exec's `stdout` hands it to sshd, which
shows it to the user before it closes the connection. An agent that does not answer refuses the
login: a session outside any job would escape every job's bound and end.

`-I`: the environment pam_exec gives it is PAM's, which a later module may fill from the user's
own files (pam_env's user_readenv): no PYTHON* variable of it reaches this root interpreter. It
imports nothing of the agent's: a login waits for it.
"""

from __future__ import annotations

import argparse
import os
import pwd
import sys
from collections.abc import Mapping, Sequence

from nodeagent.telemetry.loginwire import DEFAULT_SOCKET, ask

ADOPTS = {"account": False, "open_session": True}  # PAM_TYPE; a session's close: nothing


def check(user: str, stage: str, path: str) -> str | None:
    """Why `user` may not log in (None: it may)."""
    if stage not in ADOPTS:
        return None
    if not user:
        return "no PAM_USER: the check is run by pam_exec (docs/interactive.md)"
    try:
        if pwd.getpwnam(user).pw_uid == 0:
            return None
    except KeyError:
        pass  # the agent says so
    try:
        answer = ask(path, user, ADOPTS[stage])
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
        prog="python -I -m nodeagent.cli.pamadopt",
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
