"""Workers die before their node's lease can expire, even when the agent cannot act.

The agent fences itself: when it cannot renew its lease for half of `lease_ttl` it stops its
workers, and SIGKILLs what is left before 90 % of the lease. A frozen agent (SIGSTOP, swap, a
debugger, a stalled kernel call) or a dead one cannot do that, so three more layers hold:

- The **fence keeper**, a tiny process the agent starts in a session of its own
  (`python -m nodeagent.supervisor.fence`). After every lease renewal the agent writes it one line
  on a pipe: the local monotonic times at which the lease is lapsing and the worker process groups
  to fence. The keeper SIGTERMs each group's main process (and SIGCONTs the group) at `term_at`
  and SIGKILLs the groups at `kill_at` unless a newer line moved those times. When the pipe
  closes without a goodbye (the agent died) it SIGKILLs them at once. A containerised worker's
  container is killed by its cgroup, and watched for LINGER_S after (a start under way). A
  pipe rather than shared memory: no torn reads, and its end-of-file tells the keeper at once
  that the agent is gone.
- `PR_SET_PDEATHSIG`: each worker's main process is SIGKILLed by the kernel when the agent dies.
- **The leftovers record**: the agent keeps the groups it runs in `state_dir`, with each leader's
  start time, so a restarted agent kills what its predecessor left before it joins (when the
  keeper died too), and never a process that merely reuses a pid.

CLOCK_MONOTONIC is one clock for every process of the machine, so the agent's deadlines mean
the same to the keeper. Nothing here needs a change to training scripts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from nodeagent.supervisor import cgroups

log = logging.getLogger(__name__)
KEEPER_MODULE = "nodeagent.supervisor.fence"
LINGER_S = 10.0  # how long fenced containers are watched for a start that was under way
LINGER_POLL_S = 0.1


class Group(NamedTuple):
    """A worker's process group: its id and its leader's start time (clock ticks since boot),
    so that a pid reused by another process is never signalled; and, for a containerised
    worker, the file its container's id is written to (cgroups.py: the container is not in the
    group, and is fenced by its cgroup)."""

    pgid: int
    started: int
    cidfile: str = ""

    @classmethod
    def read(cls, item: object) -> Group:
        """A group as `to_list` wrote it. Raises ValueError, TypeError or CgroupNameError."""
        if not isinstance(item, list) or len(item) not in (2, 3):
            raise ValueError(f"not a worker group: {item!r}")
        cidfile = str(item[2]) if len(item) == 3 else ""
        return cls(int(item[0]), int(item[1]), cgroups.check_cidfile(cidfile) if cidfile else "")

    def to_list(self) -> list[int | str]:
        head: list[int | str] = [self.pgid, self.started]
        return [*head, self.cidfile] if self.cidfile else head


def start_ticks(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When `pid` started (field 22 of /proc/<pid>/stat), or None if there is no such process."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name may contain spaces
    return int(fields[19])


def leftover_alive(group: Group, proc: Path = Path("/proc")) -> bool:
    """Whether anything of `group` still runs: its process group, or its container's cgroup."""
    return group_alive(group.pgid, proc) or (
        bool(group.cidfile) and cgroups.container_alive(group.cidfile)
    )


def group_alive(pgid: int, proc: Path = Path("/proc")) -> bool:
    """Whether any process of group `pgid` still runs (zombies run nothing)."""
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def signal_group(group: Group, sig: signal.Signals, proc: Path = Path("/proc")) -> bool:
    """Send `sig` to `group` unless its pgid now belongs to someone else; True if sent.

    While any process of a group lives, Linux does not hand its id to a new process, so a group
    whose leader has exited but whose children live on is still ours. A leader with another
    start time means the old group is gone and the id was reused: leave it alone. SIGKILL also
    kills a containerised worker's container (by its cgroup, whatever its pgid).
    """
    killed = sig is signal.SIGKILL and bool(group.cidfile) and cgroups.kill_container(group.cidfile)
    started = start_ticks(group.pgid, proc)
    if started is not None and started != group.started:
        return killed
    try:
        os.killpg(group.pgid, sig)
    except (ProcessLookupError, PermissionError):
        return killed
    return True


def signal_leader(group: Group, sig: signal.Signals, proc: Path = Path("/proc")) -> bool:
    """Send `sig` to `group`'s leader (a worker's main process) while it runs, else to what is
    left of the group (`signal_group`); True if sent. A stop tells the main process first: its
    DataLoader's worker processes must live on while it saves its emergency checkpoint."""
    if start_ticks(group.pgid, proc) != group.started:
        return signal_group(group, sig, proc)
    try:
        os.kill(group.pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


# -- the keeper's side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Orders:
    """What the agent last told the keeper of one job's workers (`key`: the job; a node serves
    several jobs, each fenced on its own lease). `term_at`/`kill_at` are time.monotonic()
    values; None while that job's agent holds no lease worth fencing (no workers, or never
    renewed). A line's orders replace the orders of its key only."""

    term_at: float | None = None
    kill_at: float | None = None
    groups: tuple[Group, ...] = ()
    goodbye: bool = False  # the agent is exiting on purpose: its workers are already gone
    key: str = ""

    def to_line(self) -> bytes:
        doc = {
            "term_at": self.term_at,
            "kill_at": self.kill_at,
            "groups": [g.to_list() for g in self.groups],
            "goodbye": self.goodbye,
            "key": self.key,
        }
        return json.dumps(doc).encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> Orders:
        doc = json.loads(line)
        return cls(
            term_at=_optional_float(doc.get("term_at")),
            kill_at=_optional_float(doc.get("kill_at")),
            groups=tuple(Group.read(g) for g in doc.get("groups", [])),
            goodbye=bool(doc.get("goodbye", False)),
            key=str(doc.get("key", "")),
        )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Due:
    """What the keeper must do now (`signal`, or None) and when to look again (None: only
    when the agent writes)."""

    signal: signal.Signals | None
    next_at: float | None


def due(orders: Orders, now: float, sent: signal.Signals | None) -> Due:
    """The keeper's decision, pure: SIGTERM once `term_at` passed, SIGKILL once `kill_at` did.

    `sent` is the strongest signal already sent for these orders.
    """
    if not orders.groups:
        return Due(None, None)
    if orders.kill_at is not None and now >= orders.kill_at:
        return Due(None if sent is signal.SIGKILL else signal.SIGKILL, None)
    if orders.term_at is not None and now >= orders.term_at and sent is None:
        return Due(signal.SIGTERM, orders.kill_at)
    pending = [t for t in (orders.term_at, orders.kill_at) if t is not None and t > now]
    return Due(None, min(pending) if pending else None)


def _say(message: str) -> None:
    print(f"nodeagent fence keeper (pid {os.getpid()}): {message}", file=sys.stderr, flush=True)


def _fence(groups: Sequence[Group], sig: signal.Signals, why: str) -> None:
    """SIGTERM goes to each group's main process (the rest of the group dies at SIGKILL),
    SIGKILL to the whole group."""
    send = signal_leader if sig is signal.SIGTERM else signal_group
    hit = [g.pgid for g in groups if send(g, sig)]
    if sig is signal.SIGTERM:  # a stopped process must see its TERM
        for group in groups:
            signal_group(group, signal.SIGCONT)
    if hit:
        _say(f"{why}: {sig.name} to process groups {', '.join(map(str, hit))}")


def keep(fd: int, clock: Callable[[], float] = time.monotonic) -> int:
    """The keeper's loop: read orders from `fd`, fence each job's workers when its orders say
    so. Returns on EOF.

    After a SIGKILL it watches the fenced containers for LINGER_S (`_kill_late`): a container
    whose start its `podman run` asked for just before it was killed can still come up."""
    fences: dict[str, tuple[Orders, signal.Signals | None]] = {}  # key -> orders, sent
    goodbye, buffer = False, b""
    lingering: tuple[tuple[str, ...], float] | None = None  # cidfiles, until when
    while True:
        now = clock()
        acted, waits = False, []
        for key, (orders, sent) in list(fences.items()):
            action = due(orders, now, sent)
            if action.signal is not None:
                _fence(orders.groups, action.signal, "the agent did not renew its lease in time")
                fences[key] = (orders, action.signal)
                if action.signal is signal.SIGKILL:
                    lingering = _lingering(orders.groups, now) or lingering
                acted = True
            elif action.next_at is not None:
                waits.append(action.next_at)
        if acted:
            continue
        timeout = None if not waits else max(0.0, min(waits) - now)
        if lingering is not None:
            if now >= lingering[1]:
                lingering = None
            else:
                _kill_late(lingering[0])
                timeout = LINGER_POLL_S if timeout is None else min(timeout, LINGER_POLL_S)
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:  # the agent is gone
            groups = tuple(g for orders, _ in fences.values() for g in orders.groups)
            if groups and not goodbye:
                _fence(groups, signal.SIGKILL, "the agent died")
                lingering = _lingering(groups, clock())
            while lingering is not None and clock() < lingering[1]:
                _kill_late(lingering[0])
                time.sleep(LINGER_POLL_S)
            return 0
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in filter(None, lines):
            try:
                new = Orders.from_line(line)
            except (ValueError, TypeError, KeyError) as exc:
                _say(f"ignoring unreadable orders {line[:200]!r}: {exc}")
                continue
            goodbye = new.goodbye
            old, sent = fences.get(new.key, (Orders(), None))
            if new.groups != old.groups or _later(new.term_at, old.term_at):
                sent = None  # a renewal or a new group: start over
            fences[new.key] = (new, sent)


def _lingering(groups: Sequence[Group], now: float) -> tuple[tuple[str, ...], float] | None:
    """The fenced groups' cidfiles to watch after a SIGKILL, and until when (None: none)."""
    cidfiles = tuple(g.cidfile for g in groups if g.cidfile)
    return (cidfiles, now + LINGER_S) if cidfiles else None


def _kill_late(cidfiles: Sequence[str]) -> None:
    """Kill a fenced container that came up after the fence (its start was under way)."""
    hit = [c for c in cidfiles if cgroups.container_alive(c) and cgroups.kill_container(c)]
    if hit:
        _say(f"killed containers that started after they were fenced: {', '.join(hit)}")


def _later(new: float | None, old: float | None) -> bool:
    return new is not None and (old is None or new > old)


# -- the agent's side -------------------------------------------------------------------------


class Keeper:
    """The agent's handle on its fence keeper process and on the leftovers record.

    `update()` is cheap when nothing changed; it writes a line only when the orders do.
    """

    def __init__(self, record: Path | None, python: str = sys.executable) -> None:
        self._record = record
        self._python = python
        self._proc: subprocess.Popen[bytes] | None = None
        self._orders: dict[str, Orders] = {}  # by key: each job the node serves
        self._recorded: tuple[Group, ...] | None = None

    def start(self) -> None:
        """Start (or restart) the keeper process and hand it the current orders.

        Raises:
            OSError: the keeper could not be started.
        """
        self._proc = subprocess.Popen(
            [self._python, "-m", KEEPER_MODULE],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # signals meant for the agent's group do not reach it
        )
        for orders in self._orders.values():
            self._send(orders)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_status(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def update(
        self,
        term_at: float | None,
        kill_at: float | None,
        groups: Sequence[Group],
        key: str = "",
    ) -> None:
        """The orders of one job's workers (`key`), the others' unchanged."""
        orders = Orders(term_at, kill_at, tuple(groups), key=key)
        if orders != self._orders.get(key, Orders(key=key)):
            self._orders[key] = orders
            self._send(orders)
        every = tuple(g for o in self._orders.values() for g in o.groups)
        if self._recorded != every:
            self._save(every)

    @property
    def term_at(self) -> float | None:
        """When the keeper, as last told, SIGTERMs the workers (None: it will not)."""
        return self.term_of("")

    def term_of(self, key: str) -> float | None:
        orders = self._orders.get(key)
        return orders.term_at if orders is not None and orders.groups else None

    def fence(self, key: str) -> JobFence:
        """The keeper as one job's agent sees it: its own orders, the process shared."""
        return JobFence(self, key)

    def _send(self, orders: Orders) -> None:
        if self._proc is None or self._proc.stdin is None:
            return
        with contextlib.suppress(OSError):  # it died: alive() says so and the agent restarts it
            os.write(self._proc.stdin.fileno(), orders.to_line())  # one writer: lines whole

    def _save(self, groups: tuple[Group, ...]) -> None:
        self._recorded = groups
        if self._record is None:
            return
        tmp = self._record.with_name(f".{self._record.name}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8", opener=_private) as f:
                f.write(json.dumps({"groups": [g.to_list() for g in groups]}))
            os.replace(tmp, self._record)
        except OSError as exc:
            log.warning("cannot record the worker process groups in %s: %s", self._record, exc)

    def close(self) -> None:
        """Let the keeper exit. With no groups left it says goodbye; with groups still running
        (the agent is failing) it just closes the pipe, and the keeper kills them."""
        if self._proc is None:
            return
        running = any(o.groups for o in self._orders.values())
        if not running:
            self._send(Orders(goodbye=True))
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if not running:
            self._save(())


class JobFence:
    """One job's handle on the node's fence keeper (job/lease.py's LeaseClock): its orders
    are its own, so a job whose lease lapses has only its own workers fenced."""

    def __init__(self, keeper: Keeper, key: str) -> None:
        self._keeper = keeper
        self._key = key

    def alive(self) -> bool:
        return self._keeper.alive()

    def exit_status(self) -> int | None:
        return self._keeper.exit_status()

    def start(self) -> None:
        self._keeper.start()

    def update(self, term_at: float | None, kill_at: float | None, groups: Sequence[Group]) -> None:
        self._keeper.update(term_at, kill_at, groups, self._key)

    @property
    def term_at(self) -> float | None:
        return self._keeper.term_of(self._key)


def _private(path: str, flags: int) -> int:
    """Open for the agent alone (0600), whatever the umask or an earlier file's mode."""
    fd = os.open(path, flags | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return fd


def kill_leftovers(record: Path, proc: Path = Path("/proc")) -> list[Group]:
    """SIGKILL the process groups (and containers' cgroups) a previous agent recorded and left
    running; those it killed.

    A record that cannot be read is reported and removed: it can only name processes that a
    previous agent started, and guessing would risk killing someone else's.
    """
    try:
        doc = json.loads(record.read_text())
        groups = [Group.read(g) for g in doc["groups"]]
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError) as exc:  # CgroupNameError is a ValueError
        log.warning("ignoring unreadable worker record %s: %s", record, exc)
        groups = []
    killed = [g for g in groups if signal_group(g, signal.SIGKILL, proc)]
    with contextlib.suppress(OSError):
        record.unlink()
    return killed


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C meant for the agent's terminal
    raise SystemExit(keep(sys.stdin.fileno()))
