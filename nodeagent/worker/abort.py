"""Leave a collective blocked on a frozen peer as soon as the agent says the job re-forms.

A survivor blocked in a collective with a peer that froze (SIGSTOP, a hung host whose sockets
stay open) sees nothing fail: gloo waits for the process group's timeout (30 min by default),
and the agent kills the survivor at `timing.reform_timeout` and starts its rank anew. The
survivor's own checks (`State.check()`, between steps) cannot run while it is blocked.

So while `train_fn` runs, a thread of the worker's watches the control channel (one 8-byte
read every POLL_S). When the agent tells this worker to leave its generation, or hands it a
newer one, and the training has not left its step within a grace (Aborter), the thread ends
the blocked call:
- NCCL: torch's `_abort_process_group()`, which aborts the communicators;
- gloo, which cannot be aborted (pytorch #130345): it shuts down the group's own TCP
  connections, so the blocked read returns at once and gloo raises ("Connection closed by
  peer"), which `run` takes as a failed collective and re-forms. The group's connections are
  the sockets the process gained while the group formed (`init_process_group`: the store
  client and gloo's full mesh), told apart by their inodes; no other socket of the process
  (a data loader's, a logger's) is touched.
The old group is destroyed right after anyway (`run`'s re-form). A group the script formed
before `run` was called has no connections known here: with gloo it is left to the
reform_timeout, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)
POLL_S = 0.01
MIN_GRACE_S = 0.05
MAX_GRACE_S = 2.0
FDS = Path("/proc/self/fd")


def socket_inodes(fds: Path = FDS) -> dict[int, int]:
    """This process's sockets: inode -> one descriptor of it."""
    found: dict[int, int] = {}
    for entry in fds.iterdir() if fds.exists() else ():
        with contextlib.suppress(OSError, ValueError):
            target = os.readlink(entry)
            if target.startswith("socket:["):
                found[int(target[8:-1])] = int(entry.name)
    return found


@contextlib.contextmanager
def group_sockets(into: set[int]) -> Iterator[None]:
    """Around `init_process_group`: add the inodes of the sockets it opened to `into`."""
    before = set(socket_inodes())
    try:
        yield
    finally:
        into.update(set(socket_inodes()) - before)


def shut_down(inodes: set[int]) -> int:
    """Shut down every socket of this process among `inodes`; how many."""
    done = 0
    for inode, fd in socket_inodes().items():
        if inode not in inodes:
            continue
        with contextlib.suppress(OSError):
            sock = socket.socket(fileno=os.dup(fd))
            try:
                # Connections only: gloo's listener thread dies of a listening socket shut down
                # under it ("accept: Invalid argument", then std::terminate).
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    sock.shutdown(socket.SHUT_RDWR)
                    done += 1
            finally:
                sock.close()
    return done


def abort_group(inodes: set[int]) -> str:
    """End what this process's default group is blocked in; what was done, for the log."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_backend() == "nccl":
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        if abort is not None:
            abort()
            return "aborted its NCCL communicators"
    return f"shut down {shut_down(inodes)} of its connections"


class Aborter:
    """While armed (`train_fn` runs), ends the group's blocked call once the agent has said to
    re-form and the training has not left it within a grace: twice its last step's time (so a
    step of a healthy group under way finishes and commits), at least MIN_GRACE_S, at most
    MAX_GRACE_S (also before two commits were seen)."""

    def __init__(
        self,
        told: Callable[[], bool],
        committed: Callable[[], int],
        abort: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._told, self._committed, self._abort, self._clock = told, committed, abort, clock
        self._armed = threading.Event()
        self._fired = False
        self._steps: list[tuple[int, float]] = []  # the last two commits seen, and when
        threading.Thread(target=self._run, name="nodeagent-abort", daemon=True).start()

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        self._fired = False
        self._armed.set()
        try:
            yield
        finally:
            self._armed.clear()

    def grace(self) -> float:
        if len(self._steps) < 2:
            return MAX_GRACE_S
        (_, before), (_, last) = self._steps
        return min(MAX_GRACE_S, max(MIN_GRACE_S, 2 * (last - before)))

    def _run(self) -> None:
        told_at: float | None = None
        while True:
            self._armed.wait()
            time.sleep(POLL_S)
            now = self._clock()
            step = self._committed()
            if not self._steps or self._steps[-1][0] != step:
                self._steps = [*self._steps[-1:], (step, now)]
            if self._fired or not self._armed.is_set() or not self._told():
                told_at = None
                continue
            told_at = told_at if told_at is not None else now
            if now - told_at < self.grace():
                continue
            self._fired, told_at = True, None
            try:
                log.warning("re-forming: the training did not leave its step; %s", self._abort())
            except Exception as exc:  # the reform_timeout still ends the call
                log.warning("could not end the blocked collective: %s", exc)
