"""Who is who for a pool agent (pool/requests.Authority) against a fake munged and a fake user
database: operators, the agent's signature on specs, who may read a log. Pure: no process."""

from __future__ import annotations

import dataclasses

import pytest

from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import Account
from nodeagent.config.settings import JobConfig, Operators, PoolConfig
from nodeagent.model.credential import Decoded, bound
from nodeagent.model.request import Caller
from nodeagent.model.spec import JobSpec
from nodeagent.pool.authority import Authority
from tests.helpers.munge import FakeMunge

USERS = {0: "root", 900: "agent", 1001: "alice", 1002: "bob", 1003: "ops"}
GROUPS = {"hpc-admin": 500, "ml": 600}
MEMBERS = {"ops": (500,), "alice": (600,), "bob": (600,)}  # supplementary groups


class Users(Resolver):
    def agent(self) -> Account:
        return Account("agent", 900, 900, "/")

    def name_of(self, uid: int) -> str | None:
        return USERS.get(uid)

    def group(self, name: str) -> int | None:
        return GROUPS.get(name)

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return (gid, *MEMBERS.get(user, ()))


POOL = PoolConfig(operators=Operators(users=("bob",), groups=("hpc-admin",)))


def authority(munge: FakeMunge) -> Authority:
    return Authority(munge, POOL, Users())


def spec(user: str = "alice") -> JobSpec:
    return JobSpec(JobConfig(id="j", entrypoint=("true",)), user)


@pytest.mark.parametrize(
    ("uid", "gid", "name", "operator"),
    [
        (0, 0, "root", True),  # root always
        (1002, 1002, "bob", True),  # pool.operators.users
        (1003, 1003, "ops", True),  # a member of pool.operators.groups
        (1001, 1001, "alice", False),
        (4242, 4242, "uid 4242", False),  # no passwd entry here
    ],
)
def test_who_is_an_operator(uid: int, gid: int, name: str, operator: bool) -> None:
    site = FakeMunge(uid, gid)
    found = site.decode(site.encode("x"))
    assert isinstance(found, Decoded)
    caller = authority(site).caller(found)
    assert (caller.name, caller.operator) == (name, operator)


def test_a_spec_runs_only_as_an_agent_signed_it() -> None:
    agent = FakeMunge(900, 900)
    signed = authority(agent).sign(spec())
    assert signed.signature and authority(agent).vouch(signed) is None
    # the digest sign() carried over to the signed spec is the one a reader makes of it
    assert JobSpec.from_json(signed.to_json()).signed_digest == signed.signed_digest
    checker = authority(agent.share(900, 900))
    assert checker.vouch(signed) is None  # another node of the same site, replayed: still ok
    assert "not signed" in str(checker.vouch(spec()))
    altered = dataclasses.replace(signed, user="bob")
    assert "signed for another request" in str(checker.vouch(altered))
    alice = agent.share(1001, 1001)
    by_alice = dataclasses.replace(spec(), signature=alice.encode(bound(spec().signed_digest)))
    assert checker.vouch(by_alice) == "signed by uid 1001, not by an agent of the pool"
    foreign = authority(FakeMunge(900, 900, key="elsewhere")).sign(spec())
    assert "credential invalid" in str(checker.vouch(foreign))


@pytest.mark.parametrize(
    ("uid", "gid", "log_gid", "verdict"),
    [
        (1001, 1001, 1001, None),  # the job's user: the log's group is its own
        (1001, 1001, 600, None),  # a member of the job's group (the spec's group: ml)
        (1002, 1002, 1001, None),  # an operator
        (1003, 1003, 1001, None),  # an operator through hpc-admin
        (4242, 4242, 1001, "uid 4242 may not read this log: it is another user's job's"),
    ],
)
def test_who_may_read_a_log(uid: int, gid: int, log_gid: int, verdict: str | None) -> None:
    site = FakeMunge(uid, gid)
    credential = site.encode(bound("ab" * 32))
    assert authority(site).may_read("ab" * 32, credential, log_gid) == verdict


@pytest.mark.parametrize(
    ("uid", "operators", "verdict"),
    [
        (1001, False, None),  # the job's user
        (1002, True, None),  # an operator, where the request allows (stacks)
        (1002, False, "bob may not: the job is another user's (its user alone may)"),  # (run)
        # a member of the job's group is not its user: a log's group is not enough here
        (600, True, "uid 600 may not: the job is another user's (its user or an operator may)"),
    ],
)
def test_who_may_act_on_a_job(uid: int, operators: bool, verdict: str | None) -> None:
    site = FakeMunge(uid, uid)
    credential = site.encode(bound("ab" * 32))
    assert authority(site).may_act("ab" * 32, credential, 1001, operators) == verdict


def test_a_log_credential_is_good_once_and_for_its_request() -> None:
    site = FakeMunge(1001, 1001)
    credential = site.encode(bound("ab" * 32))
    checker = authority(site)
    assert "signed for another request" in str(checker.may_read("cd" * 32, credential, 1001))
    assert (
        checker.may_read("ab" * 32, credential, 1001) == "credential replayed: it was used before"
    )
    site.reachable = False
    assert "cannot check credentials" in str(checker.may_read("ab" * 32, credential, 1001))


def test_with_the_pool_s_key_a_spec_is_signed_by_hmac_and_checked_without_munged() -> None:
    """With pool.tokens.key_file the leader signs a spec with an HMAC (no munge process per
    submission); a node with the same key vouches for it, munged away or not; a node without
    the key, another key, or an altered spec refuses it."""
    key = b"k" * 32
    agent = FakeMunge(900, 900)
    signed = dataclasses.replace(authority(agent), token_key=key).sign(spec())
    assert signed.signature.startswith("hmac1:") and not agent.made  # no credential made
    agent.reachable = False
    checker = dataclasses.replace(authority(FakeMunge(900, 900)), token_key=key)
    assert checker.vouch(signed) is None
    altered = dataclasses.replace(signed, user="bob")
    assert "not made with this pool's key" in str(checker.vouch(altered))
    other = dataclasses.replace(authority(FakeMunge(900, 900)), token_key=b"x" * 32)
    assert "not made with this pool's key" in str(other.vouch(signed))
    assert "which this node lacks" in str(authority(FakeMunge(900, 900)).vouch(signed))


@pytest.mark.parametrize(
    ("as_uid", "api", "verdict"),
    [
        (1001, "apisvc", None),  # alice on the API service's socket
        (1002, "apisvc", "bob is an operator: the API service does not act for operators"),
        (0, "apisvc", "root is an operator"),
        (1001, "alice", "alice may not act for others: not in pool.api_users"),
    ],
)
def test_the_api_service_vouches_only_for_ordinary_users(
    as_uid: int, api: str, verdict: str | None
) -> None:
    class WithApi(Users):
        def user(self, name: str) -> Account | None:
            uid = {v: k for k, v in USERS.items()}.get(name)
            return Account(name, uid, uid, "/") if uid is not None else None

    pool = dataclasses.replace(POOL, api_users=("apisvc",))
    checker = Authority(FakeMunge(0, 0), pool, WithApi())
    found = checker.on_behalf(Caller(2000, 2000, api), as_uid)
    if verdict is None:
        assert isinstance(found, Caller) and (found.name, found.operator) == ("alice", False)
    else:
        assert isinstance(found, str) and verdict in found
