"""What only this node can tell about a valid config, checked before anything starts.

`nodeagent config check` and `nodeagent run` both call `check_node`, so a config that passes
the check does not then fail at run time on this node: a log_dir that is a file (the agent
crashed at its first worker start and systemd restart-looped), a working_dir or a program that
is not there (every generation exited 127 until the job failed), a metrics address that does
not resolve or is not this node's. `run` creates the directories; `check` only makes sure they
could be created.

Workers of another user (job.user) must also reach what they use: log_dir (their progress
files are under it), the working directory, the entrypoint's program and script. That is told
from the mode bits (nodeagent.runtime.access), as that user, without switching to it. The
directories
`run` creates for log_dir get that user's group (0750), as the supervisor's per-job ones do.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.checkpoint.space import check_room
from nodeagent.config.entrypoint import NotPython, split_python
from nodeagent.config.identity import WorkerUser
from nodeagent.config.settings import DEFAULT_STATE_DIR, JobConfig, NodeSettings
from nodeagent.errors import ConfigError
from nodeagent.runtime import access
from nodeagent.supervisor.asuser import run_as
from nodeagent.supervisor.ranklogs import DIR_MODE
from nodeagent.supervisor.spec import resolve_argv


@dataclass(frozen=True)
class NodeCheck:
    """The outcome of a check that passed."""

    state_dir: Path | None  # where the worker record goes; None: nowhere (see warnings)
    warnings: tuple[str, ...] = ()


def check_node(
    config: NodeSettings, environ: Mapping[str, str], *, create: bool, cwd: Path | None = None
) -> NodeCheck:
    """Check the config against this node; with `create`, create the directories it names.

    Args:
        environ: the agent's environment (its PATH finds the entrypoint, as for the workers).
        cwd: the agent's working directory (default: the current one).

    Raises:
        ConfigError: naming the key that cannot work on this node.
    """
    job = config.job
    user = job.user if job is not None and job.user is not None and job.user.switch else None
    contained = job is not None and job.container is not None
    # A containerised worker reaches the job's log directory through a bind mount, and its
    # program and working directory are the image's: the host's paths to them do not matter.
    _log_dir(Path(config.log_dir), None if contained else user, create)
    state_dir, warnings = _state_dir(config, create)
    if job is None:  # a pool node: each job's spec is checked when the node is placed on it
        _metrics_address(config.metrics.listen)
        return NodeCheck(state_dir, warnings)
    if job.checkpoint is not None:
        check_room(job.checkpoint, config.node.name, job.id)
    if contained:
        _metrics_address(config.metrics.listen)
        return NodeCheck(state_dir, warnings)
    try:
        workdir = _working_dir(job, cwd or Path.cwd())
        program, script = _entrypoint(job, environ, workdir)
    except PermissionError as exc:
        # Behind a directory private to the job's user (a 0700 home): the agent, root without
        # CAP_DAC_READ_SEARCH under its unit (or squashed on NFS), cannot look; its user can.
        if user is None:
            problem = f"cannot look at {exc.filename}: {_reason(exc)}"
            raise ConfigError("job.working_dir", problem) from None
        _check_as_user(job, user, cwd or Path.cwd())
        _metrics_address(config.metrics.listen)
        return NodeCheck(state_dir, warnings)
    if user is not None:
        where = "their working directory"
        if job.working_dir is None:
            where += " (the agent's: job.working_dir is not set)"
        _reachable(workdir, access.SEARCH, user, "job.working_dir", where)
        _reachable(program, access.SEARCH, user, "job.entrypoint", "its program")
        if script is not None:
            _reachable(script, access.READ, user, "job.entrypoint", "its script")
    _metrics_address(config.metrics.listen)
    return NodeCheck(state_dir, warnings)


def _log_dir(directory: Path, user: WorkerUser | None, create: bool) -> None:
    """log_dir as writable_dir wants it and, for workers of another user, searchable by them
    all the way down (their progress files are below it): what `create` makes is theirs to
    enter (their group, 0750); what was there already must let them. A pool node's (`user`
    None: each job's user is known only when it is placed) is made 0755 whatever the agent's
    umask, as the unit's LogsDirectoryMode makes /var/log/nodeagent: every job's directory
    below it is that job's group's (supervisor/ranklogs.py)."""
    missing = [d for d in (*reversed(directory.parents), directory) if not d.exists()]
    writable_dir(directory, "log_dir", create=create)
    if user is None:
        for made in missing if create else ():
            os.chmod(made, 0o755)
        return
    if create:
        for made in missing:
            os.chown(made, -1, user.gid)
            os.chmod(made, DIR_MODE)
    reached = next(d for d in (directory, *directory.parents) if d.exists())
    _reachable(reached, access.SEARCH, user, "log_dir", "their progress files")


def _reachable(path: Path, want: int, user: WorkerUser, key: str, what: str) -> None:
    """Raises ConfigError naming `key` when `user` cannot reach `path` with `want`."""
    who = access.Who(user.uid, frozenset((user.gid, *user.groups)))
    try:
        refused = access.blocked(path, want, who)
    except OSError as exc:  # vanished since it was found
        raise ConfigError(key, f"cannot check {path}: {_reason(exc)}") from None
    if refused is not None:
        raise ConfigError(
            key,
            f"the workers' user cannot reach {what}: {access.explain(refused, repr(user.name))}",
        )


def writable_dir(directory: Path, key: str, *, create: bool) -> None:
    """`directory` is (or, without `create`, could be made) a directory this process can write.

    Raises:
        ConfigError: naming `key`.
    """
    if not directory.exists():
        _could_create(directory, key)  # so that check and run say the same
        if not create:
            return
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(key, f"cannot create {directory}: {_reason(exc)}") from None
    if not directory.is_dir():
        raise ConfigError(key, f"{directory} is not a directory")
    try:  # the only sure test (root passes os.access on a read-only file system's checks too)
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as exc:
        raise ConfigError(key, f"cannot write in {directory}: {_reason(exc)}") from None


def _could_create(directory: Path, key: str) -> None:
    ancestor = directory.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ConfigError(key, f"cannot create {directory}: {ancestor} is not a directory")
    try:
        writable_dir(ancestor, key, create=False)
    except ConfigError as exc:
        raise ConfigError(key, f"cannot create {directory}: {exc.problem}") from None


def _state_dir(config: NodeSettings, create: bool) -> tuple[Path | None, tuple[str, ...]]:
    """An explicit state_dir must work; the default may fail, with a warning."""
    directory = Path(config.state_dir or DEFAULT_STATE_DIR)
    try:
        writable_dir(directory, "state_dir", create=create)
    except ConfigError as exc:
        if config.state_dir is not None:
            raise
        return None, (
            f"no state directory ({exc.problem}): a restarted agent cannot find workers a "
            "crashed one left; set state_dir to a writable directory",
        )
    return directory, ()


def _working_dir(job: JobConfig, cwd: Path) -> Path:
    if job.working_dir is None:
        return cwd
    directory = cwd / job.working_dir
    if not directory.is_dir():
        problem = "is not a directory" if directory.exists() else "does not exist"
        raise ConfigError("job.working_dir", f"{job.working_dir} {problem} on this node")
    if not os.access(directory, os.X_OK):
        raise ConfigError("job.working_dir", f"cannot enter {job.working_dir}")
    return directory


def _entrypoint(
    job: JobConfig, environ: Mapping[str, str], workdir: Path
) -> tuple[Path, Path | None]:
    """The program exists and is executable, found as exec finds it for the workers: by the
    workers' PATH (job.env's, else the agent's) or, with a '/', relative to working_dir.

    Returns:
        The program and, for `python script.py`, the script.
    """
    argv = resolve_argv(job.entrypoint, job.python)  # a bare python is the agent's interpreter
    program = argv[0]
    if "/" in program:
        found = workdir / program
        if not found.is_file():
            raise ConfigError("job.entrypoint", f"program {program} not found on this node")
    else:
        path = job.env.get("PATH", environ.get("PATH", os.defpath))
        which = shutil.which(program, path=path)
        if which is None:
            raise ConfigError(
                "job.entrypoint", f"program {program!r} not found on this node (PATH={path})"
            )
        found = Path(which)
    if not os.access(found, os.X_OK):
        raise ConfigError("job.entrypoint", f"{found} is not executable")
    return found, _python_script(argv, workdir)


def _python_script(entrypoint: tuple[str, ...], workdir: Path) -> Path | None:
    """`python script.py ...`: the script is there too (`-m module` is not checked)."""
    name = _script_name(entrypoint)
    if name is None:
        return None
    script = workdir / name
    if not script.is_file():
        raise ConfigError("job.entrypoint", f"script {name} not found on this node")
    return script


def _script_name(entrypoint: tuple[str, ...]) -> str | None:
    """The script of `python script.py ...` as given (None: not Python, or `-m module`)."""
    try:
        _, rest = split_python(entrypoint)
    except NotPython:
        return None
    return None if rest[0] == "-m" else rest[0]


# Run as the job's user: enter the working directory ($1), find a program given with a '/'
# ($2, "" for one found on PATH) and a script ($3, "" for none) there. Its exit status names
# what failed (the keys below); what it prints is the reason.
_AS_USER = """
cd -- "$1" 2>/dev/null || { echo "cannot enter $1"; exit 3; }
case "$2" in */*) [ -f "$2" ] && [ -x "$2" ] || { echo "no program $2 in $1"; exit 4; };; esac
[ -z "$3" ] || [ -r "$3" ] || { echo "cannot read the script $3 in $1"; exit 5; }
"""
_AS_USER_KEYS = {3: "job.working_dir", 4: "job.entrypoint", 5: "job.entrypoint"}


def _check_as_user(job: JobConfig, user: WorkerUser, cwd: Path) -> None:
    """What `_working_dir` and `_entrypoint` check, made by the job's user itself (a short
    shell run as that user): for a working directory the agent cannot look into.

    Raises:
        ConfigError: naming job.working_dir or job.entrypoint, as the user found it.
    """
    workdir = cwd / job.working_dir if job.working_dir is not None else cwd
    argv = resolve_argv(job.entrypoint, job.python)
    program = argv[0] if "/" in argv[0] else ""
    script = _script_name(argv) or ""
    command = ["/bin/sh", "-c", _AS_USER, "sh", str(workdir), program, script]
    try:
        status, said = run_as(user, command, b"", 400)
    except OSError as exc:
        raise ConfigError("job.working_dir", f"cannot check it as {user.name!r}: {exc}") from None
    if status != 0:
        reason = said.decode("utf-8", "replace").strip() or f"exit status {status}"
        key = _AS_USER_KEYS.get(status, "job.working_dir")
        raise ConfigError(key, f"the workers' user {user.name!r}: {reason}")


def _metrics_address(listen: str) -> None:
    """The host resolves to an IPv4 address of this node (the server is IPv4)."""
    if listen == "off":
        return
    host = listen.rpartition(":")[0] or "0.0.0.0"
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise ConfigError("metrics.listen", f"cannot resolve {host!r}: {_reason(exc)}") from None
    address = str(infos[0][4][0])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))  # any port: the real one may be the running agent's
        except OSError as exc:
            raise ConfigError(
                "metrics.listen", f"cannot listen on {host} ({address}): {_reason(exc)}"
            ) from None


def _reason(exc: Exception) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
