"""Checks of nodeagentctl's arguments, made before it connects or writes anything.

Each check either returns the value or raises `argparse.ArgumentTypeError` / `UsageError` with
a message that names what would be right, so a typo exits 2 and leaves Redis untouched.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import parse_qs

from nodeagent.config import redisurl
from nodeagent.config.values import check_name, parse_duration
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.request import REQUEST_ID

PASSWORD_ENV = "NODEAGENT_REDIS_PASSWORD"


def name(value: str) -> str:
    """argparse type of node names, job ids and key prefixes: what the config accepts."""
    try:
        return check_name(value, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def request_id(value: str) -> str:
    """argparse type of --request-id: up to 128 letters, digits and . _ : -."""
    if not value or not REQUEST_ID.match(value):
        raise argparse.ArgumentTypeError(
            f"expected up to 128 letters, digits and . _ : - (as an earlier run printed), "
            f"got {value[:80]!r}"
        )
    return value


def checked_name(value: str, what: str) -> str:
    """A job or node name given where argparse could not type it.

    Raises:
        UsageError: naming `what`.
    """
    try:
        return check_name(value, "")
    except ConfigError as exc:
        raise UsageError(f"{what}: {exc.problem}") from None


def duration(value: str) -> float:
    """argparse type of --timeout: seconds from "30s", "500ms", "10m", "1h"."""
    try:
        return parse_duration(value, "")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(exc.problem) from None


def time_limit(value: str) -> float:
    """argparse type of submit --time: a duration; a bare number is refused (Slurm reads it as
    minutes, nodeagent's durations as seconds: neither is guessed)."""
    if value.strip().isdigit():
        raise argparse.ArgumentTypeError(
            f"{value!r} has no unit: give one, such as {value.strip()}m or {value.strip()}s, or "
            "Slurm's [D-]HH:MM:SS (a bare number is minutes to Slurm, seconds elsewhere here)"
        )
    return duration(value)


def count(value: str) -> int:
    """argparse type of --last: a whole number >= 0."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value!r}")
    return number


def url_password(url: str) -> str | None:
    """The password a URL carries (in its user part or as ?password=), if any."""
    parts = redisurl.split(url)
    auth, at, _ = parts.netloc.rpartition("@")
    if at and ":" in auth:
        return auth.split(":", 1)[1]
    found = parse_qs(parts.query).get("password")
    return found[0] if found else None


def read_password_file(path: str) -> str:
    """The password in `path`: its first line, without the line end.

    Raises:
        UsageError: the file cannot be read, or holds no password.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(
            f"--redis-password-file: cannot read {path}: {reason}; give a file that holds the "
            "password on its first line"
        ) from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise UsageError(f"--redis-password-file: {path} is empty; write the password in it")
    return password


def job_argument(command: argparse.ArgumentParser) -> None:
    """A job's verb takes its job as JOB or --job JOB (checks.one_job)."""
    command.add_argument(
        "job_pos", nargs="?", metavar="JOB", type=name, help="the job (or --job JOB)"
    )


def timeout(command: argparse.ArgumentParser) -> None:
    """How long a verb's --wait waits."""
    command.add_argument(
        "--timeout",
        type=duration,
        default="10m",
        help="how long --wait waits, e.g. 30s or 10m (default 10m)",
    )
