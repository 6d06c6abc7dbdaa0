"""In-place recovery: a worker that keeps running while the job re-forms around it.

In the spirit of Horovod's `hvd.elastic`: the script keeps what must survive a re-form in a
`State`, commits it every step (a copy in host memory), and runs its training function through
`run(train_fn, state)`. When the agent tells this worker to leave its generation, or hands it
a newer assignment, over its control channel (nodeagent.channel.control, path in
NODEAGENT_CONTROL_FILE), or a collective fails because a peer died, `run` leaves the process
group, reports that to the agent, waits for the next
assignment, joins the new process group, rolls back to the last commit, takes the state of
the rank with the highest committed step (`sync`), runs the reset callbacks and calls
`train_fn(state)` again, in the same process.

Without a channel (plain torchrun, no launcher) the script runs as a normal one: `check()`
never raises and a failed collective raises as usual. torch is imported lazily.
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import logging
import os
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nodeagent.channel import control
from nodeagent.channel.control import Assignment, ControlFile
from nodeagent.worker import abort, ending, progress
from nodeagent.worker.follow import Follower, Reform, ReformTimedOut, Stopped
from nodeagent.worker.release import init_rolled_back, release_destroyed_groups

log = logging.getLogger(__name__)
ENV = control.PATH_ENV
TIMEOUT_ENV = control.TIMEOUT_ENV
DEFAULT_REFORM_TIMEOUT_S = 60.0
STORE_POLL_S = 0.002
DEFAULT_PG_TIMEOUT = timedelta(minutes=30)  # torch's own default for gloo
T = TypeVar("T")
__all__ = ["Reform", "ReformTimedOut", "Resumable", "State", "Stopped", "run"]


class Resumable(Protocol):
    """What `run` re-forms around: `State` (data-parallel replicas, synced by broadcast) or
    nodeagent.worker.checkpointer's `Checkpointer` (sharded models, restored from the tiers)."""

    @property
    def follower(self) -> Follower: ...

    def sync(self) -> None:
        """In the (new) process group, before `train_fn` is called (again)."""

    def leaving(self) -> None:
        """The old process group is gone: finish what must be done before the agent hears so."""


R = TypeVar("R", bound=Resumable)


def _copy_into(value: Any, previous: Any) -> Any:
    """A copy of `value` with every tensor on the CPU, reusing `previous`'s tensors where
    they have the same shape and dtype (no allocation in the steady state)."""
    import torch

    if isinstance(value, torch.Tensor):
        src = value.detach()
        if (
            isinstance(previous, torch.Tensor)
            and previous.shape == src.shape
            and previous.dtype == src.dtype
        ):
            return previous.copy_(src)
        return src.to("cpu", copy=True)
    if isinstance(value, dict):
        before = previous if isinstance(previous, dict) else {}
        return {k: _copy_into(v, before.get(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        old = previous if isinstance(previous, type(value)) and len(previous) == len(value) else ()
        items = [_copy_into(v, old[i] if old else None) for i, v in enumerate(value)]
        return items if isinstance(value, list) else type(value)(items)
    return copy.deepcopy(value)


def _stateful(value: object) -> bool:
    return callable(getattr(value, "state_dict", None)) and callable(
        getattr(value, "load_state_dict", None)
    )


class State:
    """What survives a re-form: models, optimizers, schedulers (anything with state_dict and
    load_state_dict) and plain values, e.g. `State(model=m, optimizer=opt, step=0, epoch=0)`;
    read and set them as attributes (`state.step += 1`). `step` is the step of the commit:
    `sync` takes the state of the rank whose committed step is highest.
    """

    def __init__(self, **objects: Any) -> None:
        values = {"step": 0}
        values.update({k: v for k, v in objects.items() if not _stateful(v)})
        attrs: dict[str, Any] = {
            "_objects": {k: v for k, v in objects.items() if _stateful(v)},
            "_values": values,
            "_snapshot": None,
            "_callbacks": [],
            "_follower": Follower(),
            "committed_step": -1,
        }
        for name, value in attrs.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            return values[name]
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._objects:
            raise AttributeError(f"{name} is a stateful object of this State: load into it")
        if name in self.__dict__:
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    @property
    def follower(self) -> Follower:
        return self._follower  # type: ignore[no-any-return]

    @property
    def generation(self) -> int:
        """The generation this process is in (NODEAGENT_GENERATION, then each assignment's)."""
        return self._follower.generation  # type: ignore[no-any-return]

    def attach(self, channel: ControlFile | None) -> None:
        """Talk to the agent over `channel` (Follower.attach)."""
        self._follower.attach(channel)

    def leaving(self) -> None:
        """Nothing to finish: the commit is in this process's memory."""

    def on_reset(self, callback: Callable[[], None]) -> None:
        """Call `callback()` after every sync: on the first start and after each re-form, on
        every rank (newcomers too). Set things from the current world (idempotently)."""
        self._callbacks.append(callback)

    def commit(self) -> None:
        """Snapshot the state in host memory, tell the agent the step, then check()."""
        previous = self._snapshot or {}
        snapshot = {
            "objects": {
                name: _copy_into(obj.state_dict(), previous.get("objects", {}).get(name))
                for name, obj in self._objects.items()
            },
            "values": copy.deepcopy(self._values),
        }
        object.__setattr__(self, "_snapshot", snapshot)
        object.__setattr__(self, "committed_step", int(self._values["step"]))
        if self._follower.channel is not None:
            self._follower.channel.report_step(self.committed_step)
        self.check()

    def restore(self) -> None:
        """Back to the last commit (nothing to do before the first one)."""
        if self._snapshot is None:
            return
        import torch

        for name, obj in self._objects.items():
            saved = self._snapshot["objects"][name]
            if not isinstance(obj, torch.nn.Module):  # an optimizer may keep what it loads
                saved = _copy_into(saved, None)  # and update it in place: give it a copy
            obj.load_state_dict(saved)  # a module copies into its own parameters
        object.__setattr__(self, "_values", copy.deepcopy(self._snapshot["values"]))

    def check(self) -> None:
        """Raise Reform if the agent has told this worker to leave its generation or published
        a newer assignment (one memory read when nothing is new)."""
        self._follower.check()

    def sync(self) -> None:
        """Every rank takes the committed state of the rank with the highest committed step
        (the lowest such rank), newcomers included, then runs the reset callbacks.

        One all_gather of the committed steps. Ranks whose commit is already the highest keep
        their own (data-parallel replicas that committed the same step hold the same state);
        only the ranks behind, newcomers first of all, receive the source's, each with one
        send_object_list: it carries any structure (a newcomer's optimizer has no state yet to
        receive tensors into), at the price of pickling on the sender and unpickling on the
        receiver. After a node loss nothing is sent at all; after a worker's crash, only its
        replacement receives. Before anything was committed anywhere (a first start), every
        rank takes rank 0's initial state (one broadcast), so all start alike.
        """
        import torch
        import torch.distributed as dist

        if self._snapshot is None:
            self._take_first_snapshot()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            device = _device()
            mine = torch.tensor([self.committed_step], dtype=torch.int64, device=device)
            steps = [torch.zeros_like(mine) for _ in range(dist.get_world_size())]
            dist.all_gather(steps, mine)
            values = [int(s.item()) for s in steps]
            top = max(values)
            source, rank = values.index(top), dist.get_rank()
            if top < 0:  # nothing committed anywhere yet
                box = [self._snapshot if rank == source else None]
                dist.broadcast_object_list(box, src=source, device=device)
                object.__setattr__(self, "_snapshot", box[0])
            elif rank == source:
                for behind in (r for r, step in enumerate(values) if step < top):
                    dist.send_object_list([self._snapshot], dst=behind, device=device)
            elif values[rank] < top:
                box = [None]
                dist.recv_object_list(box, src=source, device=device)
                object.__setattr__(self, "_snapshot", box[0])
            object.__setattr__(self, "committed_step", top)
        self.restore()
        for callback in self._callbacks:
            callback()

    def _take_first_snapshot(self) -> None:
        follower = self._follower
        channel = follower.channel
        follower.channel = None
        try:
            self.commit()
        finally:
            follower.channel = channel
        object.__setattr__(self, "committed_step", -1)  # nothing was trained into it


def _device() -> Any:
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _init_process_group(backend: str | None, timeout: timedelta | None) -> None:
    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    _await_store(timeout or DEFAULT_PG_TIMEOUT)
    with init_rolled_back():  # else a timed-out init would leave this rank apart from the rest
        dist.init_process_group(backend, timeout=timeout)


def _await_store(timeout: timedelta) -> None:
    """Until rank 0's TCPStore accepts connections (other ranks only).

    TCPStore's client waits about half a second after a refused connection before it tries
    again, and after a re-form every rank starts at once while rank 0 binds its fresh port a
    few milliseconds later: polling first saved 0.5 s of a re-form here (a rank 0 bound 50 ms
    late: 0.54 s to init without it, 0.07 s with it). Gives up silently at `timeout`:
    init_process_group then reports what is wrong."""
    if os.environ.get("RANK", "0") == "0":
        return
    address = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ.get("MASTER_PORT", "0")))
    deadline = time.monotonic() + timeout.total_seconds()
    while time.monotonic() < deadline:
        try:
            socket.create_connection(address, timeout=0.1).close()
            return
        except OSError:
            time.sleep(STORE_POLL_S)


def _collective_failed(exc: BaseException) -> bool:
    """A peer went away under a collective: torch's DistError family (DistBackendError,
    DistNetworkError, DistStoreError), or gloo's plain RuntimeError naming the transport."""
    import torch.distributed as dist

    if isinstance(exc, dist.DistError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(
        marker in text for marker in ("gloo", "Connection closed", "Connection reset", "NCCL")
    )


def _detached(exc: BaseException) -> Reform:
    """Why to re-form, without `exc`'s traceback: its frames hold train_fn's locals, the DDP
    wrapper among them, and through it the old process group, whose connections then stay
    open after destroy_process_group(). A peer blocked in a collective with this rank would
    wait on them until it is killed, instead of failing at once and re-forming too.

    The frames' locals are cleared too: a frame that holds the exception itself (`reform =
    ...; raise reform`, in a script or here) makes a cycle that only gc.collect() would free,
    and gc.collect() took ~0.2 s of every re-form with torch loaded
    (tests/integration/test_elastic_worker.py fails when the cycle is left)."""
    if exc.__traceback__ is not None:
        traceback.clear_frames(exc.__traceback__)  # the executing ones (run's) are skipped
    assignment = exc.assignment if isinstance(exc, Reform) else None
    return Reform(f"{type(exc).__name__}: {exc}", assignment)


def _reform(
    state: Resumable,
    channel: ControlFile,
    reason: Reform,
    reform_timeout: float,
    stop: Callable[[], bool] | None,
    connections: set[int],
) -> Assignment:
    """Leave the old group, report it, wait for the next assignment, take its environment.
    `connections`: the old group's sockets (abort.group_sockets), for its release."""
    import torch.distributed as dist

    started = time.monotonic()
    follower = state.follower
    log.warning("generation %d: re-forming (%s)", follower.generation, reason)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception as exc:  # a group whose peers are gone may fail to tear down
            log.warning("destroying the old process group: %s", exc)
    state.leaving()  # drops what it kept of the old group (Checkpointer: its staging copy)
    release_destroyed_groups(connections)  # so that the old group's connections close now
    channel.report_left(follower.generation)  # it issues no collective of that group any more
    assignment = reason.assignment
    if assignment is None:
        assignment = follower.wait(started + reform_timeout, stop)
    assignment = follower.take(assignment)
    log.warning(
        "generation %d: rank %d of %d at %s:%d",
        *(assignment.generation, assignment.rank, assignment.world_size),
        *(assignment.master_addr, assignment.master_port),
    )
    return assignment


NUMPY_MISSING = (
    "recovery: in_place needs numpy in the workers' environment (torch's object collectives, "
    "which sync() uses, read their bytes through it): pip install 'nodeagent[worker]'"
)


def require_numpy() -> None:
    """Raise, naming the fix, if numpy cannot be imported in this worker.

    Raises:
        RuntimeError: numpy is missing (without it, the first re-form's sync would fail with
            torch's "Numpy is not available", and the job with it).
    """
    try:
        import numpy  # noqa: F401
    except ImportError:
        raise RuntimeError(NUMPY_MISSING) from None


def channel_from_env() -> ControlFile | None:
    """The channel the agent made for this worker, or None (plain torchrun, restart mode)."""
    path = os.environ.get(ENV)
    return ControlFile(Path(path)) if path and Path(path).exists() else None


def run(
    train_fn: Callable[[R], T],
    state: R,
    *,
    reform_timeout: float | None = None,
    backend: str | None = None,
    pg_timeout: timedelta | None = None,
    stop: Callable[[], bool] | None = None,
) -> T:
    """Run `train_fn(state)` until it returns, re-forming in place whenever the job changes.

    Initializes the process group from the environment (gloo on CPU, nccl on GPUs) unless the
    script already did, syncs the state, runs `train_fn`. On Reform (from check()/commit()) or
    a failed collective, with a control channel: re-forms (see the module docstring) and calls
    `train_fn(state)` again. Create DDP wrappers, samplers and iterators inside `train_fn`.
    Once it returns, the rank is reported finished to the agent (a failing exit after that is
    not a failure of the job), and the process group is destroyed when the interpreter exits
    (atexit): after `run` returns, a script may still use the group (rank 0 saving, a
    barrier), then returns from its main or calls sys.exit.

    `reform_timeout`: default NODEAGENT_REFORM_TIMEOUT_S (the job's timing.reform_timeout, set
    by the agent), else DEFAULT_REFORM_TIMEOUT_S. `stop`: asked while waiting for an
    assignment, e.g. a GracefulExit's `should_stop` (the agent stops a waiting worker that has
    no place in the next generation, or when the job ends).

    Raises:
        ReformTimedOut: the old group was left but no assignment came within `reform_timeout`
            seconds; let it end the process (non-zero), the agent falls back to a restart.
        Stopped: `stop()` said so while waiting for an assignment; let it end the process.
        Reform, RuntimeError: as raised, when there is no control channel.
    """
    import torch.distributed as dist

    if reform_timeout is None:
        reform_timeout = float(os.environ.get(TIMEOUT_ENV, DEFAULT_REFORM_TIMEOUT_S))
    channel = channel_from_env()
    if channel is not None:
        require_numpy()  # now, not at the first re-form
    state.follower.attach(channel)
    group_sockets: set[int] = set()  # the inodes of the default group's connections
    aborter = _aborter(state.follower, channel, group_sockets)
    pending: Reform | None = None
    while True:
        try:
            if pending is not None and channel is not None:
                _reform(state, channel, pending, reform_timeout, stop, group_sockets)
                pending = None
            if not dist.is_initialized():
                state.follower.check()  # the job may have moved on while this process started
                group_sockets.clear()
                with abort.group_sockets(group_sockets):
                    _init_process_group(backend, pg_timeout)
            with aborter.armed() if aborter is not None else contextlib.nullcontext():
                state.sync()
                result = train_fn(state)
        except Reform as exc:
            if channel is None:
                raise
            pending = _detached(exc)
        except RuntimeError as exc:
            if channel is None or not _collective_failed(exc):
                raise
            pending = _detached(exc)
        else:
            _finish(state, channel, group_sockets)
            return result


def _aborter(
    follower: Follower, channel: ControlFile | None, sockets: set[int]
) -> abort.Aborter | None:
    """What ends a collective blocked on a frozen peer once the job re-forms (worker/abort.py);
    none without a channel (plain torchrun: nobody says to re-form)."""
    if channel is None:
        return None
    return abort.Aborter(
        follower.told, lambda: channel.report().committed_step, lambda: abort.abort_group(sockets)
    )


def _finish(state: Resumable, channel: ControlFile | None, connections: set[int]) -> None:
    """The training returned: say so, and tear the process group down before the
    interpreter's own teardown.

    Said first, so that the agent counts this rank as finished whatever its exit: a survivor
    of re-forms holds what its old groups left, and its interpreter's exit can abort there
    (issue 52: "terminate called without an active exception", SIGABRT, after every rank
    printed its last step; the job was started again from step 0). The group is destroyed at
    exit (atexit: the script may still use it once `run` returns, e.g. rank 0 saving after a
    barrier), before the interpreter's finalization destroys it in no chosen order; a script
    that ends with os._exit skips both, as it skips the abort."""
    if channel is not None:
        channel.report_finished(state.follower.generation)
    progress.finished()  # the same, for a worker without the in-place channel
    atexit.unregister(_teardown)  # once, however many times run() returned
    atexit.register(_teardown, connections)  # the group's at exit: this set is refilled at init


def _teardown(connections: set[int]) -> None:
    ending.destroy_default_group()
    release_destroyed_groups(connections)
