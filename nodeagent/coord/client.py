"""Redis connections from a URL: redis://, rediss:// (TLS), unix:// and Redis Sentinel.

Sentinel URLs follow the common form
``redis+sentinel://[[user]:password@]host1:26379,host2:26379/<service-name>[/<db>]``
(``rediss+sentinel://`` for TLS, with ``?ssl_ca_certs=/path/ca.pem`` for a private CA); the
password is used for the primary and the sentinels. Plain URLs take redis-py's query options
(e.g. ``rediss://host:6380/0?ssl_ca_certs=/etc/nodeagent/ca.pem``).

Timeouts are short and retries few on purpose: an agent must notice a Redis outage within a
fraction of its lease so it can fence itself (decision 5), not sit in a client's backoff loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.errors import ConfigError

Redis = redis.Redis


@dataclass(frozen=True)
class SentinelTarget:
    hosts: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str | None
    password: str | None
    tls: bool
    ca_certs: str | None = None  # ?ssl_ca_certs=/path, for rediss+sentinel://


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split a redis+sentinel:// URL into its parts.

    Raises:
        ConfigError: naming redis.url, when the URL has no hosts or no service name.
    """
    parts = urlsplit(url)
    auth, _, hostlist = parts.netloc.rpartition("@")
    username, _, password = auth.partition(":") if auth else ("", "", "")
    hosts = []
    for item in filter(None, hostlist.split(",")):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", "26379")
        if not port.isdigit():
            raise ConfigError("redis.url", f"bad sentinel address {item!r}; expected host:port")
        hosts.append((host.strip("[]"), int(port)))
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path:
        raise ConfigError(
            "redis.url",
            "a sentinel URL looks like redis+sentinel://host1:26379,host2:26379/mymaster/0",
        )
    return SentinelTarget(
        hosts=tuple(hosts),
        service=path[0],
        db=int(path[1]) if len(path) > 1 and path[1].isdigit() else 0,
        username=unquote(username) or None,
        password=unquote(password) or None,
        tls=parts.scheme.startswith("rediss"),
        ca_certs=next(iter(parse_qs(parts.query).get("ssl_ca_certs", [])), None),
    )


def check_credentials(client: Redis) -> None:
    """One PING with the configured credentials, at start-up.

    A Redis that cannot be reached is no error here (the agent keeps retrying, as it does
    later); a Redis that refuses the user or password will refuse it for ever, so that is a
    configuration error rather than a retry loop that leaves systemd's unit "activating".

    Raises:
        ConfigError: naming redis.url, when Redis refused the credentials.
    """
    try:
        client.ping()
    except redis.RedisError as exc:
        if classify(exc) is RedisFailure.CREDENTIALS:
            raise ConfigError("redis.url", f"Redis refused the credentials: {exc}") from None
        # unreachable (or busy) now: the agent retries


def connect(url: str, timeout_s: float, client_name: str = "nodeagent") -> Redis:
    """A client whose commands fail within about `timeout_s` when Redis is unreachable."""
    options: dict[str, Any] = {
        "decode_responses": True,
        "encoding_errors": "replace",  # a value that is not UTF-8 reads as garbage, not an error
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1),  # one immediate reconnect: a pooled socket may be stale
        "client_name": client_name,
    }
    if "+sentinel" in url.split("://", 1)[0]:
        target = parse_sentinel_url(url)
        auth = {"username": target.username, "password": target.password}
        tls: dict[str, Any] = {"ssl": target.tls}
        if target.ca_certs:
            tls["ssl_ca_certs"] = target.ca_certs
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            list(target.hosts),
            sentinel_kwargs={**auth, "socket_timeout": timeout_s, **tls},
            **tls,
            **{k: v for k, v in options.items() if k != "client_name"},
        )
        client: Redis = sentinel.master_for(  # type: ignore[no-untyped-call]
            target.service, db=target.db, **auth
        )
        return client
    return redis.Redis.from_url(url, **options)
