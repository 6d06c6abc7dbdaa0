"""torchrun's flags -> a config document (cli/launchargs.py), checked by config.load_config."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nodeagent.cli.launchargs import LaunchError, Machine, build, redis_url
from nodeagent.config.load import load_config
from nodeagent.config.settings import EMBEDDED
from nodeagent.errors import ConfigError
from tests.helpers.hosts import ROOT, FakeAccounts, FakeResolver
from tests.helpers.runas import AS_TESTER

MACHINE = Machine(python="/opt/py/bin/python3", hostname="gpu7", cwd="/work", user="me", pid=42)


def job(*argv: str) -> dict[str, Any]:
    document = build(argv, MACHINE).document
    result: dict[str, Any] = document["job"]
    return result


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        ("10.0.0.2:6380", "redis://10.0.0.2:6380/0"),
        ("10.0.0.2", "redis://10.0.0.2:6379/0"),
        ("redis-host", "redis://redis-host:6379/0"),
        ("redis://:pw@h:1/2", "redis://:pw@h:1/2"),
        ("unix:///run/r.sock", "unix:///run/r.sock"),
    ],
)
def test_rdzv_endpoint_is_the_redis(endpoint: str, url: str) -> None:
    assert redis_url(endpoint) == url


@pytest.mark.parametrize(
    ("argv", "key", "value"),
    [
        (["t.py", "--lr", "1"], "entrypoint", ["/opt/py/bin/python3", "-u", "t.py", "--lr", "1"]),
        (
            ["-m", "pkg.train", "a"],
            "entrypoint",
            ["/opt/py/bin/python3", "-u", "-m", "pkg.train", "a"],
        ),
        (["--no-python", "./run.sh", "x"], "entrypoint", ["./run.sh", "x"]),
        (["--nproc_per_node", "8", "t.py"], "nproc_per_node", 8),
        (["--nnodes", "1", "t.py"], "max_nodes", 1),
        (["--max-restarts", "5", "t.py"], "max_restarts", 5),
        (["t.py"], "max_restarts", 0),  # torchrun's default, not nodeagent's 3
        (["t.py"], "working_dir", "/work"),
        (["t.py"], "id", "standalone-42"),
        (["t.py"], "user", "me"),  # like torchrun: the workers are the caller's
        (["t.py"], "allow_root", True),
        (["--rdzv-endpoint", "h:1", "t.py"], "id", "none"),  # torchrun's default
        (["--preload", "torch, torch._dynamo", "t.py"], "preload", ["torch", "torch._dynamo"]),
    ],
)
def test_flags(argv: list[str], key: str, value: object) -> None:
    assert job(*argv)[key] == value


def test_root_launching_runs_root_workers_on_a_node_without_the_nodeagent_user() -> None:
    """The strict rule (no job.user, no nodeagent user: exit 78) is for config files; launch,
    run by a person as torchrun is, names the caller, so root's launch keeps working."""
    as_root = build(["--standalone", "t.py"], replace(MACHINE, user="root")).document
    without = FakeResolver(FakeAccounts(users={"root": ROOT}))
    user = load_config(as_root, without).job.user
    assert user is not None and (user.name, user.uid, user.switch) == ("root", 0, False)


def test_a_multi_node_launch_becomes_a_valid_config() -> None:
    launch = build(
        ["--nnodes", "1:4", "--nproc-per-node", "2", "--rdzv-endpoint", "h:7",
         "--rdzv-id", "llama", "--node-rank", "3", "--master-addr", "x", "t.py"],
        MACHINE,
    )  # fmt: skip
    document = launch.document
    assert document["redis"] == {"url": "redis://h:7/0"}
    assert document["node"]["name"] == "gpu7"
    assert document["metrics"] == {"listen": "off"}  # two launches on one host do not collide
    assert document["log_dir"] == "/work/nodeagent-logs"
    assert [w.split()[0] for w in launch.warnings] == ["--node-rank", "--master-addr"]
    document["job"].update(AS_TESTER)  # MACHINE's user is not on this machine
    config = load_config(document)
    assert (config.job.min_nodes, config.job.max_nodes, config.job.nproc_per_node) == (1, 4, 2)
    assert config.job.id == "llama"


@pytest.mark.parametrize(
    ("argv", "level"),
    [(["t.py"], "WARNING"), (["--log-level", "info", "t.py"], "INFO")],
)
def test_a_launch_logs_warnings_unless_told(argv: list[str], level: str) -> None:
    """torchrun prints a warning or two; the daemon (a config file) keeps INFO."""
    document = build(argv, MACHINE).document
    document["job"].update(AS_TESTER)
    assert load_config(document).logging.level == level


def test_preload_is_checked_as_job_preload() -> None:
    document = build(["--preload", "torch,not a module", "t.py"], MACHINE).document
    document["job"].update(AS_TESTER)
    with pytest.raises(ConfigError, match=r"job\.preload"):
        load_config(document)


def test_a_missing_rdzv_id_is_torchruns_default_with_a_warning() -> None:
    launch = build(["--rdzv-endpoint", "h:1", "t.py"], MACHINE)
    assert [w.split()[0] for w in launch.warnings] == ["--rdzv-id"]
    assert "'none'" in launch.warnings[0]


def test_standalone_is_the_embedded_redis() -> None:
    document = build(["--standalone", "--node-name", "solo", "t.py"], MACHINE).document
    assert "redis" not in document and document["node"]["name"] == "solo"
    document["job"].update(AS_TESTER)
    assert load_config(document).redis.url == EMBEDDED


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--rdzv-backend", "etcd", "t.py"], "nodeagent's rendezvous is Redis"),
        (["--standalone", "--nnodes", "2", "t.py"], "--standalone: one node only"),
        (["--nnodes", "3:2", "t.py"], "1 <= MIN <= MAX"),
        (["--nnodes", "x", "t.py"], "expected N or MIN:MAX"),
        (["--nproc-per-node", "gpu", "t.py"], "give a number"),
        (["--no-python", "-m", "t"], "cannot go together"),
        (["--max-restarts", "-1", "t.py"], ">= 0"),
        (["--numa-binding", "exclusive", "t.py"], "exclusive is not supported: node or socket"),
    ],
)
def test_refused(argv: list[str], words: str) -> None:
    with pytest.raises(LaunchError, match=words):
        build(argv, MACHINE)


@pytest.mark.parametrize(
    ("argv", "binding"),
    [
        (["t.py"], "off"),
        (["--numa-binding", "node", "t.py"], "closest"),
        (["--numa_binding=socket", "t.py"], "closest"),
    ],
)
def test_numa_binding_is_the_cpus_near_each_workers_gpu(argv: list[str], binding: str) -> None:
    isolation = build(argv, MACHINE).document["isolation"]
    assert isolation == {"cgroups": "off", "shm": "shared", "cpu_binding": binding}
