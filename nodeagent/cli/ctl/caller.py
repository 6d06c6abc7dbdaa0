"""Who runs nodeagentctl: the Unix user (what a submitted job runs as by default, and whom a
signed request names) and `user@host`, what a change records as its author."""

from __future__ import annotations

import getpass
import socket


def user() -> str:
    return getpass.getuser()


def by() -> str:
    return f"{getpass.getuser()}@{socket.gethostname().split('.')[0]}"
