"""One wrapper per Lua script: its KEYS, its ARGV and its reply named in one place.

A `Script` names its keys and its fixed arguments in the order they are passed; the Lua body
reads them by those names (`K.leases`, `A.ttl`): a prologue made from the same names binds
them, so the order a caller passes and the order the script reads cannot drift apart. Arguments
past the named ones (events to append, names to reap) are the script's `rest`, read from
ARGV[REST] on. Shared fragments (fragments.py: LEADER, CHANGES, READ_VIEW...) take the keys
they touch as parameters, so one fragment serves scripts whose keys differ.

Every key of one call is passed in KEYS (never built in Lua, except a node's key from the node
key prefix, which shares the job's or pool's hash tag), so each script runs on a Redis Cluster.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import redis

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class Call(NamedTuple):
    """One call of a script: its keys and fixed arguments by name, then the rest in order."""

    keys: Mapping[str, str]
    args: Mapping[str, Any]
    rest: Sequence[Any] = ()


@dataclass(frozen=True)
class Script:
    """A Lua script: `keys` and `args` in call order, what it returns, and its body."""

    name: str
    keys: tuple[str, ...]
    args: tuple[str, ...]
    returns: str
    body: str

    def __post_init__(self) -> None:
        for name in (*self.keys, *self.args):
            if not _NAME.match(name):
                raise ValueError(f"{self.name}: {name!r} is not a Lua identifier")

    @property
    def source(self) -> str:
        keys = ", ".join(f"{k} = KEYS[{i}]" for i, k in enumerate(self.keys, 1))
        args = ", ".join(f"{a} = ARGV[{i}]" for i, a in enumerate(self.args, 1))
        rest = len(self.args) + 1
        return (
            f"-- {self.name}\n-- returns {self.returns}\n"
            f"local K = {{{keys}}}\nlocal A = {{{args}}}\n"
            f"local REST = {rest}  -- the first argument past the named ones\n{self.body}"
        )

    def call_args(self, call: Call) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV in the script's order (for a pipeline of packed calls, bench/fleet.py).

        Raises:
            ValueError: a key or argument missing or unknown (a caller's mistake).
        """
        keys, args, rest = call
        if set(keys) != set(self.keys):
            raise ValueError(f"{self.name}: keys {sorted(keys)} are not {list(self.keys)}")
        if set(args) != set(self.args):
            raise ValueError(f"{self.name}: arguments {sorted(args)} are not {list(self.args)}")
        return [keys[k] for k in self.keys], [*(args[a] for a in self.args), *rest]

    def bind(self, client: redis.Redis) -> Bound:
        return Bound(self, client)


class Bound:
    """A script registered with a client (EVALSHA, loaded again if the server lost it)."""

    def __init__(self, script: Script, client: redis.Redis) -> None:
        self.script = script
        self._run = client.register_script(script.source)

    def __call__(self, call: Call, client: Any = None) -> Any:
        """The script's reply (`client`: a pipeline to queue the call on instead)."""
        keys, args = self.script.call_args(call)
        return self._run(keys=keys, args=args, client=client)
