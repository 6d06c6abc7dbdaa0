"""Who the workers run as: job.user, job.group, job.allow_root against a fake user database."""

from __future__ import annotations

from typing import Any

import pytest

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import Account, WorkerUser, resolve
from nodeagent.config.load import load_config
from nodeagent.errors import ConfigError
from tests.helpers.hosts import ALICE, ROOT, FakeAccounts, FakeResolver

SESSION = {"HOME": "/var/lib/nodeagent-worker", "USER": "nodeagent", "LOGNAME": "nodeagent"}


@pytest.mark.parametrize(
    ("user", "group", "allow_root", "env", "expected"),
    [
        # default: the nodeagent system user, its group and supplementary groups, its session
        (None, None, False, {}, WorkerUser("nodeagent", 990, 990, (990, 44, 105), True, SESSION)),
        # job.allow_root only allows; it does not make the default root
        (None, None, True, {}, WorkerUser("nodeagent", 990, 990, (990, 44, 105), True, SESSION)),
        (
            "alice",
            "video",
            False,
            {},
            WorkerUser(
                "alice",
                1000,
                44,
                (44, 44),
                True,
                {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice"},
            ),
        ),
        # job.env wins over the user's session variables
        (
            "alice",
            None,
            False,
            {"HOME": "/scratch/alice"},
            WorkerUser(
                "alice", 1000, 1000, (1000, 44), True, {"USER": "alice", "LOGNAME": "alice"}
            ),
        ),
        # root when explicitly allowed: nothing to switch
        (
            "root",
            None,
            True,
            {},
            WorkerUser(
                "root", 0, 0, (0,), False, {"HOME": "/root", "USER": "root", "LOGNAME": "root"}
            ),
        ),
    ],
)
def test_root_agent_resolves_the_workers_user(
    user: str | None,
    group: str | None,
    allow_root: bool,
    env: dict[str, str],
    expected: WorkerUser,
) -> None:
    assert resolve(user, group, allow_root, env, FakeAccounts()) == expected


@pytest.mark.parametrize(
    ("me", "user", "group", "allow_root", "key", "words"),
    [
        (ROOT, "ghost", None, False, "job.user", "no such user on this node: 'ghost'"),
        (ROOT, "root", None, False, "job.user", "job.allow_root: true"),
        (ROOT, "toor", None, False, "job.user", "'toor' is root"),  # by uid, not by name
        (ROOT, "alice", "ghosts", False, "job.group", "no such group on this node: 'ghosts'"),
        (ALICE, "nodeagent", None, False, "job.user", "can start workers only as itself"),
        (ALICE, "ghost", None, False, "job.user", "no such user"),
        (ALICE, None, "video", False, "job.group", "cannot start workers in group 'video'"),
        (ALICE, None, "ghosts", False, "job.group", "no such group"),
    ],
)
def test_refused_users_name_their_key(
    me: Account, user: str | None, group: str | None, allow_root: bool, key: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve(user, group, allow_root, {}, FakeAccounts(me=me))
    assert caught.value.key == key and words in str(caught.value)


def test_an_agent_that_is_not_root_runs_workers_as_itself() -> None:
    accounts = FakeAccounts(me=ALICE)
    for user, group in ((None, None), ("alice", None), ("alice", "alice"), (None, "alice")):
        assert resolve(user, group, False, {}, accounts) == WorkerUser("alice", 1000, 1000)


@pytest.mark.parametrize("allow_root", [False, True])
def test_no_nodeagent_user_is_an_error_not_root(allow_root: bool) -> None:
    """A root agent on a node installed without the Ansible role (no nodeagent user) does not
    fall back to root workers: job.allow_root alone does not make root the default either. The
    error says each way out."""
    accounts = FakeAccounts(users={"root": ROOT, "alice": ALICE})
    with pytest.raises(ConfigError) as caught:
        resolve(None, None, allow_root, {}, accounts)
    assert caught.value.key == "job.user"
    for words in ("useradd --system nodeagent", "unprivileged user", "job.allow_root: true"):
        assert words in str(caught.value)
    # each way out works
    assert resolve("alice", None, False, {}, accounts).uid == 1000
    assert resolve("root", None, True, {}, accounts).uid == 0


def test_an_agent_that_is_not_root_needs_no_nodeagent_user() -> None:
    accounts = FakeAccounts(me=ALICE, users={"alice": ALICE})
    assert resolve(None, None, False, {}, accounts) == WorkerUser("alice", 1000, 1000)


def job(**keys: Any) -> dict[str, Any]:
    return {"job": {"id": "llama-ft", "entrypoint": ["python", "train.py"], **keys}}


def test_config_keys_reach_the_job() -> None:
    config = load_config(
        job(user="alice", group="video", env={"HOME": "/x"}), FakeResolver(FakeAccounts())
    )
    assert config.job.user == WorkerUser(
        "alice", 1000, 44, (44, 44), True, {"USER": "alice", "LOGNAME": "alice"}
    )
    default = load_config(job(), FakeResolver(FakeAccounts()))
    assert default.job.user is not None and default.job.user.name == "nodeagent"


@pytest.mark.parametrize(
    ("keys", "key"),
    [
        ({"user": 1000}, "job.user"),  # a name, not a uid
        ({"user": ""}, "job.user"),
        ({"user": ["alice"]}, "job.user"),
        ({"group": 44}, "job.group"),
        ({"allow_root": "yes"}, "job.allow_root"),
        ({"user": "root"}, "job.user"),
        ({"user": "root", "allow_root": False}, "job.user"),
        ({"user": "ghost"}, "job.user"),
    ],
)
def test_config_rejects_bad_values_by_key(keys: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(job(**keys), FakeResolver(FakeAccounts()))
    assert caught.value.key == key


def test_config_without_the_nodeagent_user_names_job_user() -> None:
    without = FakeResolver(FakeAccounts(users={"root": ROOT}))
    with pytest.raises(ConfigError) as caught:
        load_config(job(), without)
    assert caught.value.key == "job.user"
    root = load_config(job(user="root", allow_root=True), without).job.user
    assert root is not None and (root.uid, root.switch) == (0, False)


def test_the_real_resolver_reads_this_node() -> None:
    """The seam's real side: root and its groups exist on every Linux machine."""
    resolver = Resolver()
    root = resolver.user("root")
    assert root is not None and (root.uid, root.gid) == (0, 0)
    assert resolver.group("root") == 0
    assert 0 in resolver.groups_of("root", 0)
    assert resolver.user("no-such-user-here") is None and resolver.group("no-such-group") is None
    me = resolver.agent()
    assert me.uid >= 0 and me.name
