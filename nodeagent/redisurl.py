"""What is wrong with a Redis URL, found before anything connects. Pure.

redis-py finds some mistakes only when it connects (a port `:abc` or `:99999` is a ValueError
traceback) and others never (`redis://host/abc` silently means database 0); a Sentinel URL
without a service name cannot work at all. `problem(url)` names each of them.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit, urlunsplit

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
SENTINEL_FORM = "redis+sentinel://host1:26379,host2:26379/<service>/<db>"


def redact(url: str) -> str:
    """`url` with its password, if any, replaced by ***: what messages may show."""
    parts = urlsplit(url)
    auth, at, hosts = parts.netloc.rpartition("@")
    if at and ":" in auth:
        auth = auth.split(":", 1)[0] + ":***"
    query = "&".join(
        "password=***" if item.startswith("password=") else item for item in parts.query.split("&")
    )
    return urlunsplit(parts._replace(netloc=f"{auth}{at}{hosts}", query=query))


def problem(url: str) -> str | None:
    """What is wrong with `url` as a Redis URL, None if nothing is. Never shows the password."""
    parts = urlsplit(url)
    if parts.scheme not in SCHEMES or not url.startswith(f"{parts.scheme}://"):
        return f"{redact(url)!r} must start with one of " + ", ".join(f"{s}://" for s in SCHEMES)
    if parts.scheme == "unix":
        if not parts.path:
            return "a unix URL names its socket: unix:///run/redis/redis.sock"
        return _db_problem("", parts.query)
    if "+sentinel" in parts.scheme:
        return _sentinel_problem(parts.netloc.rpartition("@")[2], parts.path, parts.query)
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


def _sentinel_problem(hosts: str, path: str, query: str) -> str | None:
    for item in hosts.split(","):
        host, colon, port = item.rpartition(":")
        if colon and host.startswith("[") != host.endswith("]"):
            return f"bad sentinel address {item!r}: expected host:port ({SENTINEL_FORM})"
        if not colon or item.endswith("]"):  # no port: Sentinel's default 26379
            host, port = item, "26379"
        if not host.strip("[]") or not (port.isdigit() and 1 <= int(port) <= 65535):
            return (
                f"bad sentinel address {item!r}: expected host:port with a port 1-65535 "
                f"({SENTINEL_FORM})"
            )
    segments = [p for p in path.split("/") if p]
    if not segments:
        return f"a sentinel URL names its service: {SENTINEL_FORM}"
    if len(segments) > 2:
        return f"too many parts in {path!r}: {SENTINEL_FORM}"
    return _db_problem(segments[1] if len(segments) > 1 else "", query)


def _db_problem(db: str, query: str) -> str | None:
    values = [db] if db else []
    values += parse_qs(query).get("db", [])
    for value in values:
        if not value.isdigit():
            return f"the database must be a number such as /0, got {value!r}"
    return None
