"""Facts of this host a config is checked against: who the agent runs as, the user database,
the host name, the address peers reach it at. Injected (`Resolver`) so tests need not depend on
this machine."""

from __future__ import annotations

import grp
import os
import pwd
import socket
from urllib.parse import urlsplit

from nodeagent.config.identity import Account
from nodeagent.config.settings import EMBEDDED
from nodeagent.config.values import parse_duration as parse_duration  # nodeagentctl's --timeout


class Resolver:
    """Host facts used for defaults and checks (the user database:
    nodeagent.config.identity.Accounts); injected so tests need not depend on this machine."""

    def agent(self) -> Account:
        """Who this process runs as."""
        uid, gid = os.geteuid(), os.getegid()
        try:
            entry = pwd.getpwuid(uid)
        except KeyError:  # a uid without a passwd entry (a container, say)
            return Account(str(uid), uid, gid, "/")
        return Account(entry.pw_name, uid, gid, entry.pw_dir)

    def user(self, name: str) -> Account | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)

    def name_of(self, uid: int) -> str | None:
        """The user name of `uid` (None: no passwd entry)."""
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return None

    def group(self, name: str) -> int | None:
        try:
            return grp.getgrnam(name).gr_gid
        except KeyError:
            return None

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        """The user's supplementary groups with `gid`, as initgroups(3) would set them."""
        return tuple(os.getgrouplist(user, gid))

    def real_path(self, path: str) -> str | None:
        """`path` with its links followed, as a bind mount would reach it (None: no such path
        here)."""
        return os.path.realpath(path) if os.path.exists(path) else None

    def hostname(self) -> str:
        return socket.gethostname().split(".")[0] or "localhost"

    def address_towards(self, redis_url: str) -> str:
        """The local address of the route to Redis: what peers on that network can reach.

        A UDP connect() sends no packet; it only asks the kernel which source address it would use.
        """
        parts = urlsplit(redis_url.split(",")[0])
        if redis_url == EMBEDDED or parts.scheme == "unix" or not parts.hostname:
            return "127.0.0.1"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((parts.hostname, parts.port or 6379))
                return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"
