"""A Redis Cluster client that fails as a plain Redis client does.

redis-py's RedisCluster takes the same commands as its Redis client, and every command nodeagent
sends names keys of one job (one hash tag, so one slot) or none: redis-py routes each to the
slot's primary, follows MOVED and ASK, and runs a Lua call or a MULTI/EXEC there. Three things
differ, and this module makes them not matter to a store or to the agent:

- RedisCluster asks its seed nodes for the cluster's layout (CLUSTER SLOTS) when it is made, and
  fails if none answers. A plain client connects on its first command, so an agent started
  while Redis is down keeps retrying. `LazyCluster` makes the RedisCluster on first use instead,
  and again on each use until it could be made.
- It raises RedisClusterException, which is no RedisError, when a later layout refresh reaches
  no node and SlotNotCoveredError when no node serves a slot, and an IndexError when the nodes
  answer but serve no slot yet. Stores turn RedisErrors into CoordinationErrors that the agent
  retries; these become ClusterUnreachableError, a ConnectionError.
- Refused credentials surface as the AuthenticationError a plain client raises, so `classify`
  says CREDENTIALS. An ACL without CLUSTER SLOTS, or a seed that is no cluster node, is a
  ConfigError: nothing but a configuration change makes it work.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis._parsers.encoders import Encoder
from redis.cluster import ClusterNode, NodesManager, RedisCluster
from redis.commands.core import Script
from redis.exceptions import RedisClusterException, SlotNotCoveredError

from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.errors import ConfigError

NOT_CLUSTER = "Cluster mode is not enabled"  # redis-py's words when CLUSTER SLOTS is refused
# What redis-py raises when it cannot learn the layout: RedisClusterException (no node
# answered, or none serves a slot), and IndexError when the nodes answer but serve no slot yet
# (a cluster still being created: CLUSTER SLOTS is empty).
LAYOUT_ERRORS = (RedisClusterException, IndexError)


@dataclass(frozen=True)
class ClusterTarget:
    hosts: tuple[tuple[str, int], ...]  # seed nodes: any one that answers finds the others
    username: str | None
    password: str | None
    tls: bool
    ca_certs: str | None = None  # ?ssl_ca_certs=/path, for rediss+cluster://


class ClusterUnreachableError(redis.ConnectionError):
    """No node of the cluster answered, or none serves a key's slot."""


class LazyCluster:
    """Stands for a RedisCluster made from `target` on first use (see the module doc).

    Attributes not defined here are the RedisCluster's; using one before a seed node answers
    raises ClusterUnreachableError.
    """

    connection_pool = None  # a plain client's; a cluster client has one per node

    def __init__(self, target: ClusterTarget, options: dict[str, Any]) -> None:
        self._target = target
        self._options = options
        self._client: RedisCluster | None = None
        self._lock = threading.Lock()

    def get_encoder(self) -> Encoder:
        """What redis-py's Script asks to hash its text; the client's own, made or not."""
        options = self._options
        return Encoder(  # type: ignore[no-untyped-call]
            options.get("encoding", "utf-8"),
            options.get("encoding_errors", "strict"),
            options.get("decode_responses", False),
        )

    def register_script(self, script: str) -> Script:
        return Script(self, script)  # type: ignore[arg-type]  # calls evalsha on this object

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._connected(), name)

    def _connected(self) -> RedisCluster:
        """The RedisCluster, made now if it was not yet.

        Raises:
            ClusterUnreachableError: no seed node answered.
            redis.AuthenticationError: the seed nodes refused the credentials.
            ConfigError: naming redis.url, an ACL without CLUSTER SLOTS or a seed that is no
                cluster node.
        """
        with self._lock:
            if self._client is None:
                self._client = _make(self._target, self._options)
            return self._client


def _make(target: ClusterTarget, options: dict[str, Any]) -> RedisCluster:
    seeds = [ClusterNode(h, p) for h, p in target.hosts]  # type: ignore[no-untyped-call]
    tls: dict[str, Any] = {"ssl": target.tls}
    if target.ca_certs:
        tls["ssl_ca_certs"] = target.ca_certs
    try:
        client = RedisCluster(
            startup_nodes=seeds,
            # A slot without a primary fails its own job's commands, not every job's.
            require_full_coverage=False,
            username=target.username,
            password=target.password,
            **tls,
            **options,
        )
    except LAYOUT_ERRORS as exc:
        raise _failure(exc) from exc
    refresh = client.nodes_manager.initialize  # before it is wrapped
    for name in ("initialize", "get_node_from_slot"):
        _reraise_unreachable(client.nodes_manager, name)
    _refresh_on_uncovered_slot(client.nodes_manager, refresh)
    return client


def _refresh_on_uncovered_slot(nodes: NodesManager, refresh: Callable[[], None]) -> None:
    """Re-read the layout when a slot is not covered, then raise as before.

    redis-py does this itself when it sees SlotNotCoveredError, but the wrapper above turns it
    into ClusterUnreachableError first, so a client that read the layout of a cluster still
    being created (some slots not yet assigned) kept it: an agent started before its cluster
    stayed cut off from the slots it had missed (seen once in CI).
    """
    lookup: Callable[..., Any] = nodes.get_node_from_slot

    @functools.wraps(lookup)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return lookup(*args, **kwargs)
        except ClusterUnreachableError as exc:
            if isinstance(exc.__cause__, SlotNotCoveredError):
                with contextlib.suppress(*LAYOUT_ERRORS, redis.RedisError):
                    refresh()  # the next call sees the slots assigned since
            raise

    nodes.get_node_from_slot = call  # type: ignore[method-assign]


def _failure(exc: Exception) -> Exception:
    """What to raise when the seed nodes did not give the cluster's layout."""
    kind = classify(exc)
    if kind is RedisFailure.CREDENTIALS:
        return redis.AuthenticationError(f"Redis refused the credentials: {exc}")
    if kind is RedisFailure.PERMISSION:
        return ConfigError(
            "redis.url",
            "the Redis user may not run CLUSTER SLOTS, which a cluster client needs to find the "
            f"nodes: add +cluster|slots to its ACL ({exc})",
        )
    if NOT_CLUSTER in str(exc):
        return ConfigError(
            "redis.url",
            "a redis+cluster:// URL names a Redis that is not a cluster node (cluster-enabled "
            "no); write redis://host:6379/0 for it",
        )
    return ClusterUnreachableError(f"cannot reach a node of the Redis Cluster: {exc}")


def _reraise_unreachable(nodes: NodesManager, name: str) -> None:
    """Make `nodes.<name>` raise ClusterUnreachableError where it raises a LAYOUT_ERROR.

    The client and its pipelines share this one NodesManager, so each of their commands does.
    """
    method: Callable[..., Any] = getattr(nodes, name)

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except LAYOUT_ERRORS as exc:
            raise ClusterUnreachableError(str(exc) or repr(exc)) from exc

    setattr(nodes, name, call)
