"""Host facts for config tests: resolvers that do not depend on this machine, accounts, and a
valid config document."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import Account
from tests.helpers.runas import AS_TESTER


class FixedResolver(Resolver):
    def hostname(self) -> str:
        return "gpu-node-07"

    def address_towards(self, redis_url: str) -> str:
        return "10.9.8.7"


VALID: dict[str, Any] = {
    "redis": {"url": "redis://127.0.0.1:6379/0"},
    "job": {
        "id": "llama-ft",
        "entrypoint": ["python", "train.py"],
        "min_nodes": 2,
        "max_nodes": 4,
        "preload": ["torch"],
        **AS_TESTER,
    },
}


ROOT = Account("root", 0, 0, "/root")
ALICE = Account("alice", 1000, 1000, "/home/alice")


USERS = {
    "root": ROOT,
    "nodeagent": Account("nodeagent", 990, 990, "/var/lib/nodeagent-worker"),
    "alice": ALICE,
    "toor": Account("toor", 0, 0, "/root"),  # a second name for uid 0
}


GROUPS = {"root": 0, "nodeagent": 990, "alice": 1000, "video": 44, "render": 105}


MEMBERSHIP = {"nodeagent": (44, 105), "alice": (44,)}


@dataclass
class FakeAccounts:
    me: Account = ROOT
    users: dict[str, Account] = field(default_factory=lambda: dict(USERS))

    def agent(self) -> Account:
        return self.me

    def user(self, name: str) -> Account | None:
        return self.users.get(name)

    def group(self, name: str) -> int | None:
        return GROUPS.get(name)

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return (gid, *MEMBERSHIP.get(user, ()))


class FakeResolver(Resolver):
    def __init__(self, accounts: FakeAccounts) -> None:
        self.accounts = accounts

    def hostname(self) -> str:
        return "gpu-node-07"

    def address_towards(self, redis_url: str) -> str:
        return "10.9.8.7"

    def agent(self) -> Account:
        return self.accounts.agent()

    def user(self, name: str) -> Account | None:
        return self.accounts.user(name)

    def group(self, name: str) -> int | None:
        return self.accounts.group(name)

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return self.accounts.groups_of(user, gid)
