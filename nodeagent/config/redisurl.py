"""What is wrong with a Redis URL, found before anything connects. Pure.

redis-py finds some mistakes only when it connects (a port `:abc` or `:99999` is a ValueError
traceback) and others never (`redis://host/abc` silently means database 0); a Sentinel URL
without a service name cannot work at all, nor a Redis Cluster URL with a database other than 0.
`problem(url)` names each of them.
"""

from __future__ import annotations

from urllib.parse import SplitResult, parse_qs, quote, urlsplit, urlunsplit

SCHEMES = (
    "redis",
    "rediss",
    "unix",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
)
SENTINEL_FORM = "redis+sentinel://host1:26379,host2:26379/<service>/<db>"
CLUSTER_FORM = "redis+cluster://host1:6379,host2:6379/"
CLUSTER_OPTIONS = ("db", "ssl_ca_certs")  # the query options a cluster URL takes


def split(url: str) -> SplitResult:
    """`urlsplit(url)`, with a host list (Sentinel's, a Cluster's seeds) taken as written.

    Python 3.11.0 to 3.11.3 (Debian 12's is 3.11.2) raise "Invalid IPv6 URL" for a netloc such
    as `h1:7000,[::1]:7001`, where later ones split it. Such a netloc is cut out by hand and
    put back; each of its addresses is checked by `problem`. Its `port` and `hostname` mean
    nothing: a caller of a list reads `netloc`.

    Raises: ValueError: not a URL (e.g. a single IPv6 address without its closing ])."""
    scheme, sep, rest = url.partition("://")
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    netloc = rest[: min(ends, default=len(rest))]
    if not sep or "," not in netloc:
        return urlsplit(url)
    return urlsplit(f"{scheme}://hosts{rest[len(netloc) :]}")._replace(netloc=netloc)


def redact(url: str) -> str:
    """`url` with its password, if any, replaced by ***: what messages may show."""
    parts = split(url)
    auth, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    query = "&".join(
        "password=***" if item.startswith("password=") else item for item in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=f"{auth}{at}{hosts}", query=query))


def problem(url: str) -> str | None:
    """What is wrong with `url` as a Redis URL, None if nothing is. Never shows the password."""
    try:
        parts = split(url)
    except ValueError as exc:  # e.g. an IPv6 address without its closing ]
        return f"not a URL ({exc}); e.g. redis://10.0.0.2:6379/0"
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        return f"{redact(url)!r} must start with one of " + ", ".join(f"{s}://" for s in SCHEMES)
    if parts.scheme == "unix":
        if not parts.path:
            return "a unix URL names its socket: unix:///run/redis/redis.sock"
        return _db_problem("", parts.query)
    if "+sentinel" in parts.scheme:
        return _sentinel_problem(parts.netloc.rpartition("@")[2], parts.path, parts.query)
    if "+cluster" in parts.scheme:
        return _cluster_problem(parts.netloc.rpartition("@")[2], parts.path, parts.query)
    host = parts.netloc.rpartition("@")[2]
    try:
        port = parts.port
    except ValueError:
        return f"the port in {host!r} must be a number from 1 to 65535"
    if not parts.hostname:
        return f"{redact(url)!r} names no host; e.g. redis://10.0.0.2:6379/0"
    if port == 0:
        return "the port must be a number from 1 to 65535, not 0"
    return _db_problem(parts.path.strip("/"), parts.query)


def _address_problem(hosts: str, what: str, form: str) -> str | None:
    """What is wrong with a comma-separated host:port list (a port may be left out)."""
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if colon and host.startswith("[") != host.endswith("]"):
            return f"bad {what} address {item!r}: expected host:port ({form})"
        if not colon or item.endswith("]"):  # no port: the default one
            host, port = item, "1"
        if not host.strip("[]") or not (port.isdigit() and 1 <= int(port) <= 65535):
            return f"bad {what} address {item!r}: expected host:port with a port 1-65535 ({form})"
    return None


def _sentinel_problem(hosts: str, path: str, query: str) -> str | None:
    bad = _address_problem(hosts, "sentinel", SENTINEL_FORM)
    if bad:
        return bad
    segments = [p for p in path.split("/") if p]
    if not segments:
        return f"a sentinel URL names its service: {SENTINEL_FORM}"
    if len(segments) > 2:
        return f"too many parts in {path!r}: {SENTINEL_FORM}"
    return _db_problem(segments[1] if len(segments) > 1 else "", query)


def _cluster_problem(hosts: str, path: str, query: str) -> str | None:
    if not hosts:
        return f"a cluster URL names one or more of its nodes: {CLUSTER_FORM}"
    bad = _address_problem(hosts, "cluster node", CLUSTER_FORM)
    if bad:
        return bad
    options = parse_qs(query, keep_blank_values=True)
    for name in options:
        if name not in CLUSTER_OPTIONS:
            return (
                f"a cluster URL takes no option {name!r}; it takes "
                + ", ".join(f"?{o}=" for o in CLUSTER_OPTIONS)
                + f" ({CLUSTER_FORM})"
            )
    for db in [path.strip("/"), *options.get("db", [])]:
        if db not in ("", "0"):
            return (
                f"a Redis Cluster has only database 0, got {db!r}: leave it out or write /0 "
                f"({CLUSTER_FORM})"
            )
    return None


def _db_problem(db: str, query: str) -> str | None:
    values = [db] if db else []
    values += parse_qs(query).get("db", [])
    for value in values:
        if not value.isdigit():
            return f"the database must be a number such as /0, got {value!r}"
    return None


def with_password(url: str, password: str) -> str:
    """`url` carrying `password` (percent-encoded), keeping its user name if it has one."""
    parts = split(url)
    auth, at, hosts = parts.netloc.rpartition("@")
    user = auth.split(":", 1)[0] if at else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{quote(password, safe='')}@{hosts}"))
