"""Who the workers run as (`job.user`, `job.group`, `job.allow_root`). Pure rules.

Training code is the least trusted thing on a node: it must not read the agent's config (the
Redis password in it would let it rewrite any job) nor act as root. So an agent running as
root starts its workers as `job.user`, by default the `nodeagent` system user the Ansible role
creates, with that user's group and supplementary groups, as sudo or systemd's `User=` would;
root only when `job.user: root` and `job.allow_root: true` say so. A root agent on a node
without that user and without `job.user` is a configuration error, not a silent fallback to
root. An agent that is not root cannot change users: its workers run as itself, and a
`job.user` naming someone else is an error (`nodeagent launch` names its caller and allows
root: like torchrun, its workers are whoever ran it).

The user database is read through the `Accounts` seam (config.Resolver on a real node), when
the config is loaded, so an unknown user is a configuration error (exit 78) naming its key,
and tests need no real user.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from nodeagent.errors import ConfigError

DEFAULT_USER = "nodeagent"  # a system user the Ansible role creates
SESSION_ENV = ("HOME", "USER", "LOGNAME")  # what sudo -i and systemd's User= set


@dataclass(frozen=True)
class Account:
    """One entry of the user database."""

    name: str
    uid: int
    gid: int  # the primary group
    home: str


class Accounts(Protocol):
    """The user and group database of this node, and who the agent runs as."""

    def agent(self) -> Account: ...

    def user(self, name: str) -> Account | None: ...

    def group(self, name: str) -> int | None: ...

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class WorkerUser:
    """The credentials and session variables of the job's workers on this node.

    `switch`: the agent (root) changes to uid/gid/groups when it starts a worker; False when the
    workers run as the agent itself. `env`: HOME, USER and LOGNAME for that user, except those
    job.env sets.
    """

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...] = ()
    switch: bool = False
    env: Mapping[str, str] = field(default_factory=dict)


def resolve(
    user: str | None,
    group: str | None,
    allow_root: bool,
    job_env: Mapping[str, str],
    accounts: Accounts,
) -> WorkerUser:
    """The workers' user from the job's keys and this node's user database.

    Raises:
        ConfigError: naming job.user or job.group: an unknown user or group (the default
            nodeagent user included), root without job.allow_root, or another user while the
            agent is not root.
    """
    agent = accounts.agent()
    if agent.uid != 0:
        return _as_agent(agent, user, group, accounts)
    account = accounts.user(user or DEFAULT_USER)
    if account is None and user is not None:
        raise ConfigError("job.user", f"no such user on this node: {user!r}")
    if account is None:  # the agent was installed without the Ansible role
        raise ConfigError(
            "job.user",
            f"not set, and this node has no {DEFAULT_USER!r} user to run the workers as; "
            f"create it (useradd --system {DEFAULT_USER}; the Ansible role does), or set "
            "job.user to an unprivileged user, or to root with job.allow_root: true",
        )
    if account.uid == 0 and not allow_root:
        raise ConfigError(
            "job.user",
            f"{account.name!r} is root: workers could read the agent's config and Redis "
            "password; name an unprivileged user, or set job.allow_root: true",
        )
    gid = account.gid if group is None else _group_id(group, accounts)
    env = {
        name: value
        for name, value in zip(SESSION_ENV, (account.home, account.name, account.name), strict=True)
        if name not in job_env
    }
    return WorkerUser(
        name=account.name,
        uid=account.uid,
        gid=gid,
        groups=accounts.groups_of(account.name, gid),
        switch=(account.uid, gid) != (agent.uid, agent.gid),
        env=env,
    )


def _as_agent(
    agent: Account, user: str | None, group: str | None, accounts: Accounts
) -> WorkerUser:
    """An agent that is not root starts its workers as itself (it cannot do otherwise)."""
    if user is not None:
        account = accounts.user(user)
        if account is None:
            raise ConfigError("job.user", f"no such user on this node: {user!r}")
        if account.uid != agent.uid:
            raise ConfigError(
                "job.user",
                f"the agent runs as {agent.name!r} (uid {agent.uid}) and can start workers only "
                f"as itself, not as {user!r}; run it as root (the systemd unit does)",
            )
    if group is not None and _group_id(group, accounts) != agent.gid:
        raise ConfigError(
            "job.group",
            f"the agent runs as {agent.name!r} (gid {agent.gid}) and cannot start workers in "
            f"group {group!r}; run it as root (the systemd unit does)",
        )
    return WorkerUser(name=agent.name, uid=agent.uid, gid=agent.gid)


def _group_id(name: str, accounts: Accounts) -> int:
    gid = accounts.group(name)
    if gid is None:
        raise ConfigError("job.group", f"no such group on this node: {name!r}")
    return gid
