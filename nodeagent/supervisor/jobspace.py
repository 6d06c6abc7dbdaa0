"""A job's own /dev/shm and temp directory on this node: what its workers leave there goes
with the job, and no other job's worker sees it (docs/isolation.md).

/dev/shm: each job's bare workers on a node share a mount namespace of the job's own, in which
a fresh tmpfs covers /dev/shm (what NCCL's shared-memory transport, a data loader's tensors
and `shm_open` write). The agent cannot make one itself: a mount namespace takes
CAP_SYS_ADMIN, which its unit does not give it. The job's user can, in a user namespace of its
own (an unprivileged one, as rootless podman's): a holder, `sleep infinity` as the user in the
job's cgroup, makes both namespaces, mounts the tmpfs, and binds back the directories under
/dev/shm the agent shares with the workers (the memory tier's). Each worker joins them between
fork and exec, as the user (the owner of the user namespace needs no privilege to join it).
The tmpfs lives as long as a process is in the namespace: when the job's cgroup is killed at
its end (or swept by the next agent), it goes, whatever was left in it, and it was charged to
the job's memory all along. Only the user and its group are mapped in the user namespace: a
file of another user shows as nobody's there, though the kernel checks access by the real
owner as outside.

A job whose workers run as root (`job.allow_root`), or as the agent itself, gets none: mapping
root into a user namespace takes CAP_SETFCAP, which the agent does not hold.

The temp directory: `TMPDIR` names a directory of the job's own (`nodeagent-<node>.<job>-*`
in the agent's temp directory, the unit's private /tmp), the user's alone, removed as the
user at the job's end on the node.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.deathsig import bind_to

log = logging.getLogger(__name__)
SHM = Path("/dev/shm")
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
_setns = ctypes.CDLL(None, use_errno=True).setns  # resolved before any fork
# The step of a holder's set-up that failed, told to the agent with its errno
_STEPS = {
    b"u": "a user namespace (unshare)",
    b"m": "its user and group mapped in it",
    b"s": "a tmpfs on /dev/shm",
    b"b": "the memory tier bound back into it",
}


class JobSpaceError(OSError):
    """A job's /dev/shm cannot be made, or a worker cannot enter it."""


def _check(result: int, step: bytes) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, step.decode())


def join(holder: int) -> None:
    """In a worker-to-be, after the switch to the job's user: enter the job's namespaces, those
    of its holder (`holder`'s pid), keeping the working directory. Plain system calls only.

    Raises:
        OSError: the holder is gone, or its namespaces are not the user's.
    """
    try:
        here = os.getcwd()
    except OSError:
        here = "/"
    for kind, flag in (("user", CLONE_NEWUSER), ("mnt", CLONE_NEWNS)):
        fd = os.open(f"/proc/{holder}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_setns(fd, flag), b"j")
        finally:
            os.close(fd)
    # Entering a mount namespace moves to its root: back where it was, where the user may be
    # (a worker given no working directory stays in the agent's, else in /).
    with contextlib.suppress(OSError):
        os.chdir(here)


# The holder's program, run as the job's user by the interpreter the agent runs on (-I -S:
# nothing of the user's or the site's is imported): it makes the namespaces, maps its user and
# group, covers /dev/shm, binds back the shared directories (argv: the tmpfs's size, then
# them), says "ok" (or the step that failed and its errno) and becomes `sleep infinity`.
# It does this after its exec, not in the agent's fork: a process that changed its user is
# not dumpable until it execs (its /proc/self/uid_map is root's), and must not become so while
# it holds a copy of the agent's memory.
HOLDER_PROGRAM = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
step = "u"
def check(result):
    if result != 0:
        raise OSError(ctypes.get_errno(), step)
try:
    uid, gid = os.getuid(), os.getgid()
    check(libc.unshare(0x10000000 | 0x00020000))
    step = "m"
    for name, text in (("uid_map", "%d %d 1" % (uid, uid)), ("setgroups", "deny"),
                       ("gid_map", "%d %d 1" % (gid, gid))):
        with open("/proc/self/" + name, "w") as file:
            file.write(text)
    step = "b"
    shared = [p.encode() for p in sys.argv[2:]]
    sources = [os.open(p, os.O_PATH | os.O_DIRECTORY) for p in shared]
    step = "s"
    options = b"mode=1777,size=" + sys.argv[1].encode()
    check(libc.mount(b"tmpfs", b"/dev/shm", b"tmpfs", 0x2 | 0x4, options))
    step = "b"
    for path, fd in zip(shared, sources):
        os.makedirs(path, exist_ok=True)
        check(libc.mount(b"/proc/self/fd/%d" % fd, path, None, 0x1000 | 0x4000, None))
        os.close(fd)
except OSError as exc:
    print(step, exc.errno or 0, flush=True)
    sys.exit(1)
print("ok", flush=True)
os.execvp("sleep", ["sleep", "infinity"])
"""
READY_WITHIN_S = 60.0  # an interpreter's start, on a node whose CPUs a job keeps busy


class JobSpace:
    """One job's /dev/shm and temp directory on this node, for its workers as `user`."""

    def __init__(
        self,
        node: str,
        job: str,
        user: WorkerUser,
        shared: Sequence[Path] = (),
        size: int | None = None,
        temp_root: Path | None = None,
        cgroups: Callable[[], tuple[int, ...]] = tuple,
        remove_as_user: Callable[[WorkerUser, Path], None] | None = None,
    ) -> None:
        """`shared`: directories under /dev/shm the agent and the workers both use (the memory
        tier), seen through; `size`: the tmpfs's (the job's memory limit; None: the kernel's
        default, half the machine); `cgroups`: the job's `cgroup.procs` descriptors the holder
        enters (made on demand); `remove_as_user`: how the temp directory is removed."""
        assert user.switch and user.uid != 0, "a job space is for a job's own user"
        self.node, self.job, self.user = node, job, user
        self._shared = tuple(
            str(p).encode() for p in shared if Path(p).is_relative_to(SHM) and Path(p) != SHM
        )
        self._size = size
        self._temp_root = temp_root or Path(tempfile.gettempdir())
        self._cgroups = cgroups
        self._remove_as_user = remove_as_user
        self._holder: subprocess.Popen[bytes] | None = None
        self.tmpdir: Path | None = None

    def make(self) -> int:
        """The holder's pid, started with its namespaces now if it is not running, and the
        temp directory made.

        Raises:
            JobSpaceError: either cannot be made.
        """
        if self.tmpdir is None:
            self.tmpdir = self._make_tmpdir()
        if self._holder is not None and self._holder.poll() is None:
            return self._holder.pid
        if self._holder is not None:
            log.warning(
                "job %s: the holder of its /dev/shm ended (%s); its workers' next start gets a "
                "new, empty one",
                self.job,
                self._holder.returncode,
            )
        self._holder = self._start_holder()
        return self._holder.pid

    def _make_tmpdir(self) -> Path:
        try:
            made = Path(
                tempfile.mkdtemp(prefix=f"nodeagent-{self.node}.{self.job}-", dir=self._temp_root)
            )
            os.chown(made, self.user.uid, self.user.gid)
        except OSError as exc:
            raise JobSpaceError(
                exc.errno or errno.EIO,
                f"cannot make its temp directory in {self._temp_root}: {exc.strerror}",
            ) from None
        return made

    def _start_holder(self) -> subprocess.Popen[bytes]:
        user, cgroups = self.user, self._cgroups()
        size = str(self._size or _default_size())
        try:
            holder = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", HOLDER_PROGRAM, size, *self._present()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"},
                start_new_session=True,
                user=user.uid,
                group=user.gid,
                extra_groups=list(user.groups),
                preexec_fn=_enter(os.getpid(), cgroups),
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise JobSpaceError(
                getattr(exc, "errno", None) or errno.EIO,
                f"cannot start the holder of its /dev/shm: {exc}",
            ) from None
        said = _first_line(holder, READY_WITHIN_S)
        if said == "ok":
            return holder
        holder.kill()
        holder.wait()
        step, _, number = said.partition(" ")
        code = int(number) if number.isdigit() else errno.EIO
        what = _STEPS.get(step.encode(), f"its holder ({said or 'no answer'})")
        raise JobSpaceError(
            code, f"cannot give it a /dev/shm of its own: {what}: {os.strerror(code)}"
        )

    def _present(self) -> list[bytes]:
        """The shared directories there are now (a tier not made yet has nothing to share)."""
        return [p for p in self._shared if os.path.lexists(p)]

    def close(self) -> None:
        """The job left the node: its holder ends (its /dev/shm with it, once its workers
        are gone too: the job's cgroup ends those) and its temp directory is removed."""
        if self._holder is not None:
            with contextlib.suppress(ProcessLookupError):
                self._holder.kill()
            self._holder.wait()
            self._holder = None
        if self.tmpdir is not None and self._remove_as_user is not None:
            try:
                self._remove_as_user(self.user, self.tmpdir)
            except OSError as exc:
                log.warning(
                    "job %s: cannot remove its temp directory %s: %s", self.job, self.tmpdir, exc
                )
        self.tmpdir = None


def _enter(parent: int, cgroups: tuple[int, ...]) -> Callable[[], None]:
    """The holder's preexec: die with the agent, and enter the job's cgroups (the descriptors
    the agent opened) as its workers do (supervisor/spares.py `die_with`)."""

    def preexec() -> None:
        bind_to(parent)
        for fd in cgroups:
            os.write(fd, b"0")

    return preexec


def _first_line(holder: subprocess.Popen[bytes], within: float) -> str:
    """What the holder said (its first line), or "" if it said nothing within `within` s."""
    assert holder.stdout is not None
    ready, _, _ = select.select([holder.stdout], [], [], within)
    line = holder.stdout.readline(256).decode("ascii", "replace").strip() if ready else ""
    holder.stdout.close()
    return line


def _default_size() -> int:
    """The kernel's own default for a tmpfs: half the machine's memory."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


def probe_space(space: JobSpace) -> None:
    """Make `space` and have a trial process enter it and find its own /dev/shm there, then
    end both: what a node checks at start.

    Raises:
        JobSpaceError: it cannot be made or entered.
    """
    try:
        holder = space.make()
        code = _probe_child(space.user, holder)
    finally:
        space.close()
    if code != 0:
        raise JobSpaceError(errno.EPERM, f"a trial process could not enter it (exit {code})")


def _probe_child(user: WorkerUser, holder: int) -> int:
    """A child as `user` that joins `holder`'s namespaces and runs `true`: its exit status."""
    try:
        done = subprocess.run(
            ["true"],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            user=user.uid,
            group=user.gid,
            extra_groups=[],
            preexec_fn=lambda: join(holder),
            timeout=READY_WITHIN_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise JobSpaceError(errno.EPERM, f"a trial process could not enter it: {exc}") from None
    return done.returncode
