"""The pool: section of a node's config (docs/pool.md, docs/configuration.md): the pool's name
and labels, whom it runs jobs as, its scheduling times, who may change it (pool.auth,
operators, tokens, api_users), where it tells of job state changes (pool.notify), where it
keeps the records of ended jobs (pool.accounting), its fair share (pool.fair_share) and what
its "done" is worth (pool.durability)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from nodeagent.config.database import database_of
from nodeagent.config.settings import (
    Accounting,
    DurabilityConfig,
    FairShareConfig,
    Notify,
    Operators,
    PoolConfig,
    Tokens,
)
from nodeagent.config.values import Section, check_name, duration, env_scalar, not_a_string
from nodeagent.errors import ConfigError

AUTH_MODES = ("munge", "none")


def load_pool(section: Section, pinned: bool = False) -> PoolConfig:
    labels = section.raw("labels") or {}
    if not isinstance(labels, Mapping):
        raise ConfigError(
            section.key("labels"), "expected a mapping such as {gpu: h100, rack: r12}"
        )
    for name, value in labels.items():
        key = f"{section.key('labels')}.{name}"
        check_name(str(name), key)
        if not env_scalar(value) or "\0" in str(value) or len(str(value)) > 256:
            raise ConfigError(key, not_a_string(value))
    pool = PoolConfig(
        name=check_name(section.get("name", str, "default"), section.key("name")),
        labels={str(k): str(v) for k, v in labels.items()},
        users=_names(section, "users"),
        groups=_names(section, "groups"),
        allow_root=section.get("allow_root", bool, False),
        reserve_after=duration(section.raw("reserve_after"), section.key("reserve_after"), 300.0),
        resize_cooldown=duration(
            section.raw("resize_cooldown"), section.key("resize_cooldown"), 60.0
        ),
        preempt_after=duration(section.raw("preempt_after"), section.key("preempt_after"), 0.0),
        keep_ended=duration(
            section.raw("keep_ended"), section.key("keep_ended"), 7 * 86400.0, positive=True
        ),
        **_load_auth(section, pinned),
        notify=_notify(section.section("notify")),
        accounting=_accounting(section.section("accounting")),
        fair_share=_fair_share(section.section("fair_share")),
        durability=_durability(section.section("durability")),
    )
    section.reject_unknown()
    return pool


MAX_REPLICAS = 16


def _durability(section: Section) -> DurabilityConfig:
    """pool.durability: {replicas: 1, timeout: 1s}."""
    replicas = section.raw("replicas")
    replicas = 0 if replicas is None else replicas
    if isinstance(replicas, bool) or not isinstance(replicas, int):
        replicas = -1
    if not 0 <= replicas <= MAX_REPLICAS:
        raise ConfigError(
            section.key("replicas"),
            f"expected how many replicas must have a change before the pool says it is done, "
            f"0 (a single Redis) to {MAX_REPLICAS}, such as 1 with one replica; got "
            f"{section.raw('replicas')!r}",
        )
    timeout = duration(section.raw("timeout"), section.key("timeout"), 1.0, positive=True)
    if timeout > 60:
        raise ConfigError(
            section.key("timeout"), f"at most 60s (a caller waits it), got {timeout}s"
        )
    section.reject_unknown()
    return DurabilityConfig(replicas, timeout)


def _notify(section: Section) -> Notify:
    """pool.notify: {endpoints: [URL, ...], key_file: PATH, timeout: 2s}."""
    endpoints = section.raw("endpoints") or []
    if not isinstance(endpoints, list) or not all(isinstance(u, str) for u in endpoints):
        raise ConfigError(
            section.key("endpoints"), "expected a list of URLs, such as [https://hooks/nodeagent]"
        )
    for url in endpoints:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or "\0" in url:
            raise ConfigError(
                section.key("endpoints"), f"expected an http(s) URL with a host, got {url!r}"
            )
    key_file = section.get("key_file", str, "")
    if endpoints and not key_file.startswith("/"):
        raise ConfigError(
            section.key("key_file"),
            "required with endpoints: the absolute path of the key each body is signed with "
            "(make one with `openssl rand -hex 32`, mode 0600)",
        )
    timeout = duration(section.raw("timeout"), section.key("timeout"), 2.0, positive=True)
    section.reject_unknown()
    return Notify(tuple(endpoints), key_file, timeout)


def _accounting(section: Section) -> Accounting:
    """pool.accounting: {database: URL, password_file: PATH}."""
    database = section.get("database", str, "")
    database_of(database, section.key("database"))
    password_file = section.get("password_file", str, "")
    if password_file and (not password_file.startswith("/") or "\0" in password_file):
        raise ConfigError(
            section.key("password_file"), f"expected an absolute path, got {password_file!r}"
        )
    section.reject_unknown()
    return Accounting(database, password_file)


def _fair_share(section: Section) -> FairShareConfig:
    """pool.fair_share: {weight: 1000, half_life: 7d, shares: {alice: 2}, queues: {prod: 3}}."""
    weight = section.raw("weight")
    weight = 0 if weight is None else weight
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 <= weight <= 1e9:
        raise ConfigError(
            section.key("weight"),
            f"expected a number from 0 (off) to 1e9, such as 1000, got {weight!r}",
        )
    half_life = duration(
        section.raw("half_life"), section.key("half_life"), 7 * 86400.0, positive=True
    )
    found = FairShareConfig(
        float(weight), half_life, _shares(section, "shares"), _shares(section, "queues")
    )
    section.reject_unknown()
    return found


def _shares(section: Section, name: str) -> dict[str, float]:
    shares = section.raw(name) or {}
    if not isinstance(shares, Mapping):
        raise ConfigError(section.key(name), "expected a mapping such as {alice: 2, bob: 1}")
    for who, value in shares.items():
        check_name(str(who), f"{section.key(name)}.{who}")
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigError(f"{section.key(name)}.{who}", f"expected a number > 0, got {value!r}")
    return {str(who): float(value) for who, value in shares.items()}


def _load_auth(section: Section, pinned: bool) -> dict[str, Any]:
    """pool.auth (munge, the default of a pool node; none, of a node pinned by its job:
    section), pool.munge_socket, pool.operators: {users: [...], groups: [...]}, pool.tokens:
    {key_file, max_lifetime}, pool.api_users: [...]."""
    auth = section.get("auth", str, "none" if pinned else "munge")
    if auth not in AUTH_MODES:
        raise ConfigError(
            section.key("auth"),
            f"expected munge (requests signed by MUNGE) or none (whoever can write Redis), "
            f"got {auth!r}",
        )
    socket = section.get("munge_socket", str, "/run/munge/munge.socket.2")
    if not socket.startswith("/") or "\0" in socket:
        raise ConfigError(section.key("munge_socket"), f"expected an absolute path, got {socket!r}")
    operators = section.section("operators")
    tokens = section.section("tokens")
    key_file = tokens.get("key_file", str, "")
    if key_file and (not key_file.startswith("/") or "\0" in key_file):
        raise ConfigError(tokens.key("key_file"), f"expected an absolute path, got {key_file!r}")
    found = {
        "auth": auth,
        "munge_socket": socket,
        "operators": Operators(_names(operators, "users"), _names(operators, "groups")),
        "tokens": Tokens(
            key_file,
            duration(tokens.raw("max_lifetime"), tokens.key("max_lifetime"), 86400.0, minimum=60.0),
        ),
        "api_users": _names(section, "api_users"),
    }
    operators.reject_unknown()
    tokens.reject_unknown()
    return found


def _names(section: Section, name: str) -> tuple[str, ...]:
    value = section.raw(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(section.key(name), f"expected a list of {name} names, such as [alice]")
    return tuple(value)
