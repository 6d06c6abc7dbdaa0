"""A short program run as the job's user, for work the root agent must not do with its own
rights (checkpoint/persistcopy.py: the copy into a submitted job's persistent tier)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.spares import die_with

# What such a program is given: no variable of the agent's (its Redis password, say).
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C.UTF-8"}


def run_as(user: WorkerUser, argv: Sequence[str], payload: bytes, most: int) -> tuple[int, bytes]:
    """Run `argv` as `user` (as the agent itself where the agent does not switch users), with
    `payload` on its stdin, in `/`, its own session, killed by the kernel if the agent's thread
    that waits for it dies; its exit status and the first `most` bytes it wrote (stdout and
    stderr together). It runs as the job's user, who may stop or trace it: one that writes more
    is killed, and the caller trusts what it says no more than the user.

    Raises:
        OSError: it could not be started.
    """
    switch = user.switch
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd="/",
        env={**_ENV, "HOME": user.env.get("HOME", "/")},
        start_new_session=True,
        user=user.uid if switch else None,
        group=user.gid if switch else None,
        extra_groups=list(user.groups) if switch else None,
        preexec_fn=die_with(os.getpid()),
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        try:
            proc.stdin.write(payload)
            proc.stdin.close()
        except BrokenPipeError:
            pass  # it exited without reading all of it: its status says why
        said = proc.stdout.read(most + 1)
        if len(said) > most:
            proc.kill()
            said = said[:most]
        return proc.wait(), said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
