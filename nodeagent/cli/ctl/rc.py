"""nodeagentctl's own defaults, so that --redis and --pool need not be typed every time: a
small YAML file, $NODEAGENT_CTL_CONFIG, else $XDG_CONFIG_HOME/nodeagent/nodeagentctl.yaml (by
default ~/.config/...), read only if it exists:

    redis: redis://nodeagent-operator@10.0.0.2:6379/0
    redis_password_file: /home/alice/.config/nodeagent/redis-password
    pool: gpu
    key_prefix: nodeagent
    munge_socket: /run/munge/munge.socket.2

A flag given wins, then --config's values, then (for the URL) NODEAGENT_REDIS_URL, then this
file. An unknown key or a value that is not a string exits 2 naming the file and the key.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import yaml

from nodeagent.config import strictyaml
from nodeagent.errors import UsageError

PATH_ENV = "NODEAGENT_CTL_CONFIG"
KEYS = ("redis", "redis_password_file", "pool", "key_prefix", "munge_socket")
FROM_CONFIG = frozenset({"redis", "pool", "key_prefix", "munge_socket"})  # --config gives these


def path(environ: Mapping[str, str]) -> Path | None:
    """Where the file is looked for (None: no home to look in)."""
    if environ.get(PATH_ENV):
        return Path(environ[PATH_ENV])
    base = environ.get("XDG_CONFIG_HOME") or (
        str(Path(environ["HOME"]) / ".config") if environ.get("HOME") else ""
    )
    return Path(base) / "nodeagent" / "nodeagentctl.yaml" if base else None


def load(environ: Mapping[str, str]) -> dict[str, str]:
    """The file's defaults ({} when there is no file).

    Raises:
        UsageError: unreadable, not a mapping, an unknown key, a value not a string.
    """
    found = path(environ)
    if found is None or not found.exists():
        return {}
    try:
        data = strictyaml.load(found.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read {found}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"{found}: expected a mapping of {', '.join(KEYS)}")
    for key, value in data.items():
        if key not in KEYS:
            raise UsageError(f"{found}: unknown key {key!r}; known keys: {', '.join(KEYS)}")
        if not isinstance(value, str) or not value:
            raise UsageError(f"{found}: {key}: expected a string, got {value!r}")
    return {str(k): str(v) for k, v in data.items()}


def apply(
    args: argparse.Namespace, defaults: Mapping[str, str], source: str, url_env: str | None
) -> None:
    """Fill the arguments not given from `defaults`, read from `source` (`url_env`:
    NODEAGENT_REDIS_URL, which wins over the file's `redis`); `args.redis_origin` names where
    the URL came from, for the messages about it."""
    args.redis_origin = "--redis"
    for key, value in defaults.items():
        if getattr(args, key, None) is not None or (key in FROM_CONFIG and args.config):
            continue
        if key == "redis" and url_env:
            continue
        if key == "redis":
            args.redis_origin = f"redis in {source}"
        setattr(args, key, value)
