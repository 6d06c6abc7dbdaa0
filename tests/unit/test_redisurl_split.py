"""Issue 51: a URL that lists several hosts, one of them an IPv6 address, reads alike on every
supported Python. Debian 12's 3.11.2 `urlsplit` raises "Invalid IPv6 URL" for
`h1:7000,[::1]:7001`; `redisurl.split` takes the list as written."""

from __future__ import annotations

import pytest

from nodeagent.cli.ctl.argtypes import url_password
from nodeagent.config import redisurl
from nodeagent.config.redisurl import with_password
from nodeagent.coord.client import parse_sentinel_url

LISTS = [
    "rediss+cluster://u:p@h1:7000,[::1]:7001/0?ssl_ca_certs=/ca.pem",
    "redis+cluster://h1:7000,[fe80::2]:7001",
    "redis+sentinel://u:p@[::1]:26379,h2:26379/mymaster/1?ssl_ca_certs=/c#frag",
]


@pytest.mark.parametrize("url", LISTS)
def test_a_host_list_is_cut_out_as_written(url: str) -> None:
    parts = redisurl.split(url)
    netloc = url.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    assert parts.netloc == netloc
    assert parts.scheme == url.split("://", 1)[0]
    assert parts.geturl() == url
    assert redisurl.problem(url) is None


@pytest.mark.parametrize(
    "url", ["redis://[::1]:6379/0?db=0", "unix:///run/redis.sock?db=2", "redis://h:1/0#x"]
)
def test_a_single_host_splits_as_urlsplit_splits_it(url: str) -> None:
    from urllib.parse import urlsplit

    assert redisurl.split(url) == urlsplit(url)


def test_not_a_url_is_still_refused_by_name() -> None:
    found = redisurl.problem("redis://[::1/0")
    assert found is not None and "not a URL" in found
    found = redisurl.problem("redis+cluster://h1:7000,[::1:7001/")
    assert found is not None and "bad cluster node address '[::1:7001'" in found


def test_the_password_helpers_and_sentinel_read_an_ipv6_list() -> None:
    url = LISTS[2]
    assert url_password(url) == "p"
    assert redisurl.redact(url) == url.replace("u:p@", "u:***@")
    moved = with_password(url, "n@w")
    assert url_password(moved) == "n%40w" and moved.startswith("redis+sentinel://u:n%40w@[::1]")
    target = parse_sentinel_url(url)
    assert (target.hosts, target.service, target.db) == (
        (("::1", 26379), ("h2", 26379)),
        "mymaster",
        1,
    )
