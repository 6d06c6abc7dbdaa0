"""`training_ended()`: what a rank does once its training returned, for the framework
integrations (nodeagent.integrations) as `elastic.run` does it for itself.

Two things, both about the process's exit. The agent is told (progress.finished()): a death
by a signal after it is not the job's failure, and neither charges a restart nor re-forms the
job (an exit status still is). And the default process group is destroyed at exit (atexit;
`destroy_group_at_exit` alone for a rank that stopped at SIGTERM rather than ended),
before the interpreter's finalization destroys it in no chosen order: a backend's threads torn
down there can abort the process ("terminate called without an active exception", SIGABRT),
as a transformers Trainer rank did after logging its last step (issue 62) and elastic.run's
survivors did (issue 52). A script that ends with os._exit skips both, as it skips the abort.
torch is never imported here: the group is looked for only where the script imported
torch.distributed.
"""

from __future__ import annotations

import atexit
import logging
import sys

from nodeagent.worker import progress

log = logging.getLogger(__name__)


def training_ended() -> None:
    """Say this rank's training reached its end, and destroy the process group at exit (once,
    however many times it is called)."""
    progress.finished()
    destroy_group_at_exit()


def training_returned(stopped: bool) -> None:
    """What an integration calls once its framework's training returned: `training_ended()`
    when it ran to its end, `destroy_group_at_exit()` alone when it stopped at SIGTERM."""
    if stopped:
        destroy_group_at_exit()
    else:
        training_ended()


def destroy_group_at_exit() -> None:
    """Destroy the process group at exit (once, however many times it is called), and say
    nothing to the agent: what a rank that stopped at SIGTERM does, its step saved (its exit is
    its stop, not the end of its training). Without it a stopped transformers rank aborted at
    exit as issue 62's had (CI, once)."""
    atexit.unregister(destroy_default_group)
    atexit.register(destroy_default_group)


def destroy_default_group() -> None:
    """Destroy torch.distributed's default group if one is up (peers that ended first may
    leave it unable to: said, not raised)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    try:
        dist.destroy_process_group()
    except Exception as exc:
        log.warning("destroying the process group at exit: %s", exc)
