"""A child that dies with the agent: what runs in every child the agent starts for a job (its
workers, spares, the job's /dev/shm holder) between fork and exec."""

from __future__ import annotations

import ctypes
import os
import signal

_PR_SET_PDEATHSIG = 1
_prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before any fork


def bind_to(parent: int) -> None:
    """The kernel SIGKILLs this process when `parent` dies, even by SIGKILL (PR_SET_PDEATHSIG
    survives exec); if it died already, before the call could take effect, this process dies
    now. Called again after a change of credentials (entering a user namespace), which clears
    the parent-death signal. Plain system calls only: it runs between fork and exec."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
