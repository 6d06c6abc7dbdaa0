"""Redis connections from a URL: redis://, rediss:// (TLS), unix://, Sentinel and Cluster.

Sentinel URLs follow the common form
``redis+sentinel://[[user]:password@]host1:26379,host2:26379/<service-name>[/<db>]``
(``rediss+sentinel://`` for TLS, with ``?ssl_ca_certs=/path/ca.pem`` for a private CA); the
password is used for the primary and the sentinels. Plain URLs take redis-py's query options
(e.g. ``rediss://host:6380/0?ssl_ca_certs=/etc/nodeagent/ca.pem``).

Redis Cluster URLs name seed nodes, any one of which is enough to find the others:
``redis+cluster://[[user]:password@]host1:6379,host2:6379[/0]`` (``rediss+cluster://`` for TLS,
with ``?ssl_ca_certs=``); a cluster has database 0 only. They give a redis-py RedisCluster
behind coord/cluster.py's LazyCluster, which takes the same commands as the plain client.

Timeouts are short and retries few on purpose: an agent must notice a Redis outage within a
fraction of its lease so it can fence itself (decision 5), not sit in a client's backoff loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast
from urllib.parse import parse_qs, unquote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from nodeagent.config import redisurl
from nodeagent.coord.cluster import ClusterTarget, LazyCluster
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


def _auth(netloc: str) -> tuple[str | None, str | None]:
    """The user name and password in a URL's netloc, percent-decoded; None where absent."""
    auth, _, _ = netloc.rpartition("@")
    username, _, password = auth.partition(":") if auth else ("", "", "")
    return unquote(username) or None, unquote(password) or None


def _addresses(netloc: str, default_port: int, what: str) -> tuple[tuple[str, int], ...]:
    """The host:port list after a URL's credentials; a port left out is `default_port`."""
    hosts = []
    for item in filter(None, netloc.rpartition("@")[2].split(",")):
        host, _, port = item.rpartition(":") if ":" in item else (item, "", str(default_port))
        if not port.isdigit():
            raise ConfigError("redis.url", f"bad {what} address {item!r}; expected host:port")
        hosts.append((host.strip("[]"), int(port)))
    return tuple(hosts)


def _ca_certs(query: str) -> str | None:
    return next(iter(parse_qs(query).get("ssl_ca_certs", [])), None)


def parse_sentinel_url(url: str) -> SentinelTarget:
    """Split a redis+sentinel:// URL into its parts.

    Raises:
        ConfigError: naming redis.url, when the URL has no hosts or no service name.
    """
    parts = redisurl.split(url)
    hosts = _addresses(parts.netloc, 26379, "sentinel")
    path = [p for p in parts.path.split("/") if p]
    if not hosts or not path:
        raise ConfigError(
            "redis.url",
            "a sentinel URL looks like redis+sentinel://host1:26379,host2:26379/mymaster/0",
        )
    username, password = _auth(parts.netloc)
    return SentinelTarget(
        hosts=hosts,
        service=path[0],
        db=int(path[1]) if len(path) > 1 and path[1].isdigit() else 0,
        username=username,
        password=password,
        tls=parts.scheme.startswith("rediss"),
        ca_certs=_ca_certs(parts.query),
    )


def parse_cluster_url(url: str) -> ClusterTarget:
    """Split a redis+cluster:// URL into its seed nodes and credentials.

    Raises:
        ConfigError: naming redis.url, when the URL names no node or another database than 0.
    """
    parts = redisurl.split(url)
    hosts = _addresses(parts.netloc, 6379, "cluster node")
    problem = redisurl.problem(url)
    if not hosts or problem:
        raise ConfigError("redis.url", problem or f"no cluster node: {redisurl.CLUSTER_FORM}")
    username, password = _auth(parts.netloc)
    return ClusterTarget(
        hosts=hosts,
        username=username,
        password=password,
        tls=parts.scheme.startswith("rediss"),
        ca_certs=_ca_certs(parts.query),
    )


def check_credentials(client: Redis) -> None:
    """One PING with the configured credentials, at start-up.

    A Redis that cannot be reached is no error here (the agent keeps retrying, as it does
    later); a Redis that refuses the user or password will refuse it for ever, so that is a
    configuration error rather than a retry loop that leaves systemd's unit "activating".
    A plain URL that leads to a Redis Cluster node is a configuration error too: such a client
    gets MOVED for every job whose slot another node serves.

    Raises:
        ConfigError: naming redis.url, when Redis refused the credentials, or it is a cluster
            node and the URL not a redis+cluster:// one, or (coord/cluster.py) a cluster URL
            names a Redis that is not one or a user whose ACL lacks CLUSTER SLOTS.
    """
    try:
        client.ping()
        if isinstance(client, redis.Redis) and _cluster_enabled(client):
            raise ConfigError(
                "redis.url",
                "this Redis is a Redis Cluster node: write the URL as "
                f"{redisurl.CLUSTER_FORM} (its nodes, or some of them)",
            )
    except redis.RedisError as exc:
        if classify(exc) is RedisFailure.CREDENTIALS:
            raise ConfigError("redis.url", f"Redis refused the credentials: {exc}") from None
        # unreachable (or busy) now: the agent retries


def _cluster_enabled(client: Redis) -> bool:
    """Whether Redis says it is a cluster node. HELLO without arguments changes nothing on the
    connection and is in every ACL nodeagent needs, where INFO is not (a refusal is logged)."""
    try:
        reply: Any = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except redis.ResponseError:  # before Redis 6: no HELLO, and no way to tell
        return False
    fields = reply if isinstance(reply, dict) else dict(zip(reply[::2], reply[1::2], strict=True))
    return str(fields.get("mode", "")) == "cluster"


def connect(url: str, timeout_s: float, client_name: str = "nodeagent") -> Redis:
    """A client whose commands fail within about `timeout_s` when Redis is unreachable.

    Nothing connects yet: each client does on its first command.
    """
    options: dict[str, Any] = {
        "decode_responses": True,
        "encoding_errors": "replace",  # a value that is not UTF-8 reads as garbage, not an error
        "socket_timeout": timeout_s,
        "socket_connect_timeout": timeout_s,
        "retry": Retry(NoBackoff(), 1),  # one immediate reconnect: a pooled socket may be stale
        "client_name": client_name,
    }
    scheme = url.split("://", 1)[0]
    if "+sentinel" in scheme:
        return _sentinel(parse_sentinel_url(url), timeout_s, options)
    if "+cluster" in scheme:  # takes the same commands (coord/cluster.py)
        return cast(Redis, LazyCluster(parse_cluster_url(url), options))
    return redis.Redis.from_url(url, **options)


def _tls(tls: bool, ca_certs: str | None) -> dict[str, Any]:
    return {"ssl": tls, **({"ssl_ca_certs": ca_certs} if ca_certs else {})}


def _sentinel(target: SentinelTarget, timeout_s: float, options: dict[str, Any]) -> Redis:
    auth = {"username": target.username, "password": target.password}
    tls = _tls(target.tls, target.ca_certs)
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
