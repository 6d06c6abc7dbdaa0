"""The API service's config file (`nodeagent api --config /etc/nodeagent/api.yaml`,
docs/api.md): the pool it fronts, where it listens, and its limits. Validated once, frozen; an
invalid key is named (exit 78).

The service holds no power of its own (docs/api.md, "Who is who"): it reads the pool with the
submitters' Redis account and appends requests that the pool judges. So it needs no key, and
nothing here is a secret but the Redis password (`redis.password_file`, or in the URL).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nodeagent.config import redisurl, strictyaml
from nodeagent.config.database import Database, database_of
from nodeagent.config.values import Section, check_name, duration, positive_int
from nodeagent.errors import ConfigError

DEFAULT_SOCKET = "/run/nodeagent-api/api.sock"


@dataclass(frozen=True)
class ApiLimits:
    """What one client, and all of them, may take (docs/api.md, "Limits")."""

    requests_per_second: float = 20.0  # per user, sustained (a token bucket)
    burst: int = 100  # per user, at once
    body_bytes: int = 256 * 1024  # a request's body (a job spec is 64 KiB at most)
    header_bytes: int = 16 * 1024  # a request's header block
    connections: int = 1024  # open at once; past it, 503
    idle: float = 5.0  # an idle keep-alive connection is closed after this
    answer_timeout: float = 30.0  # how long a change waits for the pool leader's answer
    read_cache: float = 0.5  # a read is served to every caller this long (0: read each time)


@dataclass(frozen=True)
class ApiSettings:
    redis_url: str
    pool: str = "default"
    key_prefix: str = "nodeagent"
    munge_socket: str = "/run/munge/munge.socket.2"
    socket: str = DEFAULT_SOCKET  # "" listens on no Unix socket
    socket_mode: int = 0o666  # who may connect: the kernel names each caller (SO_PEERCRED)
    listen: str = ""  # host:port for HTTPS; "" listens on no network address
    tls_cert: str = ""
    tls_key: str = ""
    limits: ApiLimits = field(default_factory=ApiLimits)
    # The accounting database `history` and `report` read (docs/accounting.md; None: the
    # pool's window only, and no report), and PostgreSQL's password in its file.
    accounting: Database | None = None
    accounting_password_file: str = ""


def load_api(data: object) -> ApiSettings:
    """Raises: ConfigError naming the first invalid key."""
    root = Section(data, "")
    redis = root.section("redis")
    url = redis.get("url", str, "")
    problem = redisurl.problem(url) if url else "required: a URL such as redis://host:6379/0"
    if problem:
        raise ConfigError("redis.url", problem)
    password_file = redis.get("password_file", str, "")
    if password_file:
        url = redisurl.with_password(url, _password(password_file))
    prefix = check_name(redis.get("key_prefix", str, "nodeagent"), "redis.key_prefix")
    redis.reject_unknown()
    tls = root.section("tls")
    settings = ApiSettings(
        redis_url=url,
        pool=check_name(root.get("pool", str, "default"), "pool"),
        key_prefix=prefix,
        munge_socket=_absolute(root, "munge_socket", "/run/munge/munge.socket.2"),
        socket=_absolute(root, "socket", DEFAULT_SOCKET, empty=True),
        socket_mode=_mode(root),
        listen=root.get("listen", str, ""),
        tls_cert=_absolute(tls, "cert", "", empty=True),
        tls_key=_absolute(tls, "key", "", empty=True),
        limits=_limits(root.section("limits")),
        **_accounting(root.section("accounting")),
    )
    tls.reject_unknown()
    root.reject_unknown()
    _check_listening(settings)
    return settings


def _accounting(section: Section) -> dict[str, Any]:
    """accounting: {database: URL, password_file: PATH}, as the pool's (docs/accounting.md)."""
    database = database_of(section.get("database", str, ""), section.key("database"))
    password_file = _absolute(section, "password_file", "", empty=True)
    section.reject_unknown()
    return {"accounting": database, "accounting_password_file": password_file}


def read_api(path: str | Path) -> ApiSettings:
    """Raises: ConfigError (unreadable, not YAML, invalid)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("", f"cannot read the API config {path}: {exc}") from None
    try:
        data = strictyaml.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{path} is not valid YAML: {exc}") from None
    return load_api(data)


def _check_listening(settings: ApiSettings) -> None:
    if not settings.socket and not settings.listen:
        raise ConfigError("listen", "the service listens nowhere: give socket, listen, or both")
    if settings.listen:
        host, colon, port = settings.listen.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                "listen", f"expected host:port such as 0.0.0.0:8443, got {settings.listen!r}"
            )
        if not (settings.tls_cert and settings.tls_key):
            raise ConfigError(
                "tls",
                "listen names a network address, so tls.cert and tls.key are required: the "
                "service never serves tokens over plain HTTP",
            )


def _absolute(section: Section, name: str, default: str, empty: bool = False) -> str:
    value = section.get(name, str, default)
    if (value or not empty) and (not value.startswith("/") or "\0" in value):
        raise ConfigError(section.key(name), f"expected an absolute path, got {value!r}")
    return value


def _mode(root: Section) -> int:
    """socket_mode: "0660", or YAML 1.1's octal 0660 (an int already)."""
    text = root.raw("socket_mode")
    text = "0666" if text is None else text
    try:
        mode = text if isinstance(text, int) and not isinstance(text, bool) else int(str(text), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ConfigError("socket_mode", f"expected an octal mode such as 0660, got {text!r}")
    return mode


def _password(path: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError("redis.password_file", f"cannot read {path}: {exc}") from None
    password = text.splitlines()[0] if text else ""
    if not password:
        raise ConfigError("redis.password_file", f"{path} is empty: write the password in it")
    return password


def _limits(section: Section) -> ApiLimits:
    rate = section.get("requests_per_second", float, 20.0)
    if not 0 < rate <= 100_000:
        raise ConfigError(section.key("requests_per_second"), f"expected (0, 100000], got {rate}")
    limits = ApiLimits(
        requests_per_second=rate,
        burst=positive_int(section, "burst", 100),
        body_bytes=positive_int(section, "body_bytes", 256 * 1024, minimum=1024),
        header_bytes=positive_int(section, "header_bytes", 16 * 1024, minimum=1024),
        connections=positive_int(section, "connections", 1024),
        idle=duration(section.raw("idle"), section.key("idle"), 5.0, positive=True),
        answer_timeout=duration(
            section.raw("answer_timeout"), section.key("answer_timeout"), 30.0, positive=True
        ),
        read_cache=duration(section.raw("read_cache"), section.key("read_cache"), 0.5, off=True),
    )
    section.reject_unknown()
    return limits
