"""What only this node can tell about a valid config, checked before anything starts.

`nodeagent config check` and `nodeagent run` both call `check_node`, so a config that passes
the check does not then fail at run time on this node: a log_dir that is a file (the agent
crashed at its first worker start and systemd restart-looped), a working_dir or a program that
is not there (every generation exited 127 until the job failed), a metrics address that does
not resolve or is not this node's. `run` creates the directories; `check` only makes sure they
could be created.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.config import DEFAULT_STATE_DIR, Config, JobConfig
from nodeagent.entrypoint import NotPython, split_python
from nodeagent.errors import ConfigError
from nodeagent.launch import resolve_argv


@dataclass(frozen=True)
class NodeCheck:
    """The outcome of a check that passed."""

    state_dir: Path | None  # where the worker record goes; None: nowhere (see warnings)
    warnings: tuple[str, ...] = ()


def check_node(
    config: Config, environ: Mapping[str, str], *, create: bool, cwd: Path | None = None
) -> NodeCheck:
    """Check the config against this node; with `create`, create the directories it names.

    Args:
        environ: the agent's environment (its PATH finds the entrypoint, as for the workers).
        cwd: the agent's working directory (default: the current one).

    Raises:
        ConfigError: naming the key that cannot work on this node.
    """
    writable_dir(Path(config.log_dir), "log_dir", create=create)
    state_dir, warnings = _state_dir(config, create)
    workdir = _working_dir(config.job, cwd or Path.cwd())
    _entrypoint(config.job, environ, workdir)
    _metrics_address(config.metrics.listen)
    return NodeCheck(state_dir, warnings)


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


def _state_dir(config: Config, create: bool) -> tuple[Path | None, tuple[str, ...]]:
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


def _entrypoint(job: JobConfig, environ: Mapping[str, str], workdir: Path) -> None:
    """The program exists and is executable, found as exec finds it for the workers: by the
    workers' PATH (job.env's, else the agent's) or, with a '/', relative to working_dir."""
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
    _python_script(argv, workdir)


def _python_script(entrypoint: tuple[str, ...], workdir: Path) -> None:
    """`python script.py ...`: the script is there too (`-m module` is not checked)."""
    try:
        _, rest = split_python(entrypoint)
    except NotPython:
        return
    if rest[0] != "-m" and not (workdir / rest[0]).is_file():
        raise ConfigError("job.entrypoint", f"script {rest[0]} not found on this node")


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
