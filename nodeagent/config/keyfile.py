"""The pool's keys (pool.tokens.key_file, pool.notify.key_file) and the accounting database's
password (pool.accounting.password_file): read once at the agent's start,
refused unless a regular file of this agent's user (or root) that no one else can read, with
enough bytes to be a key. Its errors are configuration errors (exit 78), naming the key and the
fix."""

from __future__ import annotations

import os
import stat

from nodeagent.errors import ConfigError

KEY = "pool.tokens.key_file"
MAX_BYTES = 4096
KEY_MIN_BYTES = 32  # HMAC-SHA256's own size (model/token.py)


def read_token_key(path: str, name: str = KEY, min_bytes: int = KEY_MIN_BYTES) -> bytes:
    """The key's bytes (surrounding whitespace stripped, as `openssl rand -hex 32 > FILE`
    writes a newline); `min_bytes`: fewer is refused (a password may be shorter than a key).

    Raises:
        ConfigError: naming the config key (`name`) and what is wrong.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise ConfigError(name, f"cannot open {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(name, f"{path} is not a regular file")
        if info.st_uid not in (0, os.geteuid()):
            raise ConfigError(name, f"{path} belongs to uid {info.st_uid}: expected root's")
        if info.st_mode & 0o077:
            raise ConfigError(
                name, f"{path} is mode {stat.S_IMODE(info.st_mode):o}: expected 0600 or 0400"
            )
        key = os.read(fd, MAX_BYTES + 1).strip()
    finally:
        os.close(fd)
    if not min_bytes <= len(key) <= MAX_BYTES:
        raise ConfigError(
            name,
            f"{path} holds {len(key)} bytes: expected {min_bytes} or more "
            "(make one with `openssl rand -hex 32`)",
        )
    return key


def read_password(path: str, name: str) -> str:
    """A password kept as the keys are (its owner's or root's, mode 0600): its first bytes,
    whitespace stripped.

    Raises:
        ConfigError: naming the config key (`name`) and what is wrong.
    """
    return read_token_key(path, name, 1).decode(errors="replace")
