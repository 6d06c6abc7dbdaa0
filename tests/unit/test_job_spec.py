"""Job specs: validated like the config (the key named), round-tripped through Redis, and run
only as a user the node's pool section allows."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from nodeagent.config.identity import Account
from nodeagent.config.load import load_config, load_settings
from nodeagent.config.settings import CheckpointConfig
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.model.spec import JobSpec, load_spec, run_config, spec_of
from tests.helpers.runas import AS_TESTER

BASE: dict[str, Any] = {"id": "llama", "entrypoint": ["python", "train.py"], "user": "alice"}


@pytest.mark.parametrize(
    ("change", "key", "message"),
    [
        ({"colour": "red"}, "colour", "unknown key"),
        ({"min_nodes": 3, "max_nodes": 2}, "min_nodes", "min_nodes (3) > max_nodes (2)"),
        ({"nproc_per_node": 0}, "nproc_per_node", "must be >= 1"),
        ({"entrypoint": []}, "entrypoint", "non-empty list"),
        ({"id": "bad id!"}, "id", "must be 1-63 letters"),
        ({"user": ""}, "user", "required"),
        ({"allow_root": True}, "allow_root", "pool.allow_root"),
        ({"priority": 10**9}, "priority", "within"),
        ({"queue": "a b"}, "queue", "must be 1-63"),
        ({"timing": {"lease_ttl": "5s"}}, "timing.lease_ttl", "the node's"),
        ({"timing": {"peer_timeout": "1s"}}, "timing.peer_timeout", "the node's"),
        ({"timing": {"hang_timeout": "soon"}}, "timing.hang_timeout", "duration"),
        ({"submitted_by": "mallory"}, "submitted_by", "unknown key"),
        ({"selector": ["gpu"]}, "selector", "a mapping of labels"),
        ({"selector": {"gpu": True}}, "selector.gpu", "label value"),
        ({"selector": {"a b": "x"}}, "selector.a b", "must be 1-63"),
        ({"time_limit": "soon"}, "time_limit", "duration"),
        ({"time_limit": 0}, "time_limit", "more than 0"),
        ({"signal": "USR1@10"}, "signal", "give a time_limit"),
        ({"time_limit": "1m", "signal": "KILL@10"}, "signal", "a worker can catch"),
        ({"time_limit": "1m", "signal": "USR1@1m"}, "signal", "60s before the end"),
        ({"time_limit": "1m", "signal": "USR1@x"}, "signal", "duration"),
        ({"gpus_per_node": 0}, "gpus_per_node", "within 1..128"),
        ({"gpus_per_node": 129}, "gpus_per_node", "within 1..128"),
        ({"gpus_per_node": "2"}, "gpus_per_node", "expected int"),
        (
            {"gpus_per_node": 2, "nproc_per_node": 4},
            "gpus_per_node",
            "nproc_per_node 4 x gpus_per_worker 1 hand out 4 GPUs on each node: ask for 4",
        ),
        ({"exclusive": "yes"}, "exclusive", "expected bool"),
    ],
)
def test_bad_specs_name_the_key(change: dict[str, Any], key: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_spec({**BASE, **change})
    assert info.value.key == key and message in str(info.value)


def test_round_trip_through_json_keeps_everything() -> None:
    spec = load_spec(
        {
            **BASE,
            "min_nodes": 2,
            "max_nodes": 8,
            "env": {"A": 1},
            "timing": {"hang_timeout": "2m", "stop_grace_period": 0},
            "queue": "research",
            "priority": 5,
            "selector": {"gpu": "h100", "rack": 12},
            "gpus_per_node": 2,
            "exclusive": True,
        }
    )
    assert spec.timing == {"hang_timeout": 120.0, "stop_grace_period": 0.0}
    back = JobSpec.from_json(spec.to_json())
    assert back == spec and back.job.target_nodes == 8 and back.job.env == {"A": "1"}
    assert back.selector == {"gpu": "h100", "rack": "12"}
    assert (back.gpus_per_node, back.exclusive) == (2, True)
    whole = load_spec(BASE)  # what it always was: the whole node, and not a key more
    assert (whole.gpus_per_node, whole.exclusive) == (None, False)
    assert "gpus_per_node" not in whole.to_dict() and "exclusive" not in whole.to_dict()


def test_a_time_limit_and_its_signal_round_trip() -> None:
    spec = load_spec({**BASE, "time_limit": "1-12:00:00", "signal": "SIGUSR2@5m"})
    assert (spec.time_limit, spec.signal) == (129600.0, ("USR2", 300.0))
    assert spec.to_dict()["signal"] == "USR2@300"
    assert JobSpec.from_json(spec.to_json()) == spec
    default = load_spec({**BASE, "time_limit": "2h", "signal": "USR1"})
    assert default.signal == ("USR1", 60.0)  # Slurm's 60 s before


def test_defaults_user_and_id_from_the_command_line() -> None:
    spec = load_spec({"entrypoint": ["true"]}, default_user="bob", job_id="cli-job")
    assert (spec.user, spec.id) == ("bob", "cli-job")


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        "[]",
        '{"id": "x"}',
        "x" * 70_000,
        '{"id": "a", "entrypoint": ["x"], "user": "u", "nproc_per_node": 1e999}',
    ],
)
def test_garbage_from_redis_is_a_corrupt_state_error(raw: str) -> None:
    with pytest.raises(CorruptStateError):
        JobSpec.from_json(raw)


class Accounts:
    """A user database: alice (uid 1000, in group ml 2000), bob (1001), root."""

    users: ClassVar[dict[str, Account]] = {
        "alice": Account("alice", 1000, 1000, "/home/alice"),
        "bob": Account("bob", 1001, 1001, "/home/bob"),
        "root": Account("root", 0, 0, "/root"),
    }

    def agent(self) -> Account:
        return self.users["root"]

    def user(self, name: str) -> Account | None:
        return self.users.get(name)

    def group(self, name: str) -> int | None:
        return {"ml": 2000}.get(name)

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return (gid, 2000) if user == "alice" else (gid,)

    def hostname(self) -> str:
        return "n1"

    def address_towards(self, url: str) -> str:
        return "10.0.0.1"


def settings(pool: dict[str, Any]) -> Any:
    return load_settings(
        {"node": {"name": "n1"}, "redis": {"url": "redis://r:6379/0"}, "pool": pool},
        Accounts(),  # type: ignore[arg-type]
    )


@pytest.mark.parametrize(
    ("pool", "user", "allowed"),
    [
        ({"users": ["alice"]}, "alice", True),
        ({"groups": ["ml"]}, "alice", True),
        ({"groups": ["ml"]}, "bob", False),
        ({}, "alice", False),
        ({"users": ["root"]}, "root", False),
        ({"allow_root": True}, "root", True),
        ({"users": ["carol"]}, "carol", False),  # no such user here
    ],
)
def test_the_node_decides_who_a_job_runs_as(pool: dict[str, Any], user: str, allowed: bool) -> None:
    spec = load_spec({**BASE, "user": user, "timing": {"stop_grace_period": "5s"}})
    node = settings(pool)
    if not allowed:
        with pytest.raises(ConfigError) as info:
            run_config(spec, node, Accounts())  # type: ignore[arg-type]
        assert info.value.key == "user"
        return
    config = run_config(spec, node, Accounts())  # type: ignore[arg-type]
    assert config.job.user is not None and config.job.user.name == user
    assert config.timing.stop_grace_period == 5.0 and config.node.name == "n1"


def test_a_pinned_jobs_spec_names_none_of_its_nodes_paths_and_reads_back() -> None:
    """A node's job: section may keep its tiers anywhere; the spec it stores for the pool
    names no path (a submitted spec may not), so the pool leader can read it. Found running
    a pinned job with memory_dir set: the leader found its spec unreadable and flapped."""
    config = load_config(
        {
            "node": {"name": "a", "address": "10.0.0.1"},
            "redis": {"url": "redis://10.0.0.9:6379/0"},
            "job": {
                "id": "llama",
                "entrypoint": ["python", "train.py"],
                "checkpoint": {
                    "memory_size": "1GiB",
                    "memory_dir": "/dev/shm/elsewhere",
                    "persist_dir": "/shared/ckpt",
                },
                **AS_TESTER,
            },
        }
    )
    spec = spec_of(config.job, config.timing)
    back = JobSpec.from_json(spec.to_json())
    assert back.job.checkpoint is not None and back.job.checkpoint.memory_size == 1 << 30
    assert back.job.checkpoint.memory_dir == CheckpointConfig.memory_dir
    assert back.job.checkpoint.persist_dir is None
    assert config.job.checkpoint is not None and config.job.checkpoint.persist_dir == "/shared/ckpt"


def test_a_submitted_jobs_persistent_tier_is_copied_as_its_user_and_named_in_its_spec() -> None:
    """Its own directory, the submitter's choice: kept in the spec (every node copies there),
    and copied by each node as the job's user, never as root (checkpoint/persistcopy.py)."""
    checkpoint = {"memory_size": "1GiB", "persist_dir": "/shared/alice/ckpt"}
    doc = {"id": "j", "entrypoint": ["python", "t.py"], "user": "alice", "checkpoint": checkpoint}
    spec = JobSpec.from_json(load_spec(doc).to_json())
    assert spec.job.checkpoint is not None
    assert spec.job.checkpoint.persist_dir == "/shared/alice/ckpt"
    assert not spec.job.checkpoint.persist_as_user  # a node's decision, not the spec's
    assert "persist_as_user" not in spec.to_json()
    config = run_config(spec, settings({"users": ["alice"]}), Accounts())  # type: ignore[arg-type]
    assert config.job.checkpoint is not None and config.job.checkpoint.persist_as_user
    assert config.job.checkpoint.persist_dir == "/shared/alice/ckpt"
    pinned = load_config(
        {
            "node": {"name": "a", "address": "10.0.0.1"},
            "redis": {"url": "redis://10.0.0.9:6379/0"},
            "job": {"id": "j", "entrypoint": ["t"], "checkpoint": checkpoint, **AS_TESTER},
        }
    )
    assert pinned.job.checkpoint is not None and not pinned.job.checkpoint.persist_as_user
