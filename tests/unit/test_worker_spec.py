"""The environment workers get: torchrun's, so scripts run unchanged."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nodeagent.channel import restore
from nodeagent.config.container import ContainerRule, ContainerSpec
from nodeagent.config.entrypoint import NotPython, split_python
from nodeagent.config.load import load_config
from nodeagent.model.tiers import CheckpointRecord
from nodeagent.state import JobState
from nodeagent.supervisor.container import TIER_DIRS, binds_of
from nodeagent.supervisor.spares import static_env
from nodeagent.supervisor.spec import (
    CHANNEL_ENV,
    TORCHRUN_VARIABLES,
    omp_warning,
    resolve_argv,
    visible_devices_of,
    worker_specs,
)
from tests.helpers.factories import make_record
from tests.helpers.runas import AS_TESTER

CONFIG = load_config(
    {
        "node": {"name": "b", "address": "10.0.0.2"},
        "redis": {"url": "redis://10.0.0.9:6379/0"},
        "job": {
            "id": "llama",
            "entrypoint": ["python", "train.py"],
            "nproc_per_node": 4,
            "min_nodes": 1,
            "max_nodes": 4,
            "env": {"NCCL_DEBUG": "WARN"},
            "working_dir": "/opt/t",
            **AS_TESTER,
        },
        "timing": {"stop_grace_period": "45s"},
        "log_dir": "/var/log/na",
    }
)
RECORD = make_record(
    JobState.RUNNING,
    7,
    ("a", "b", "c"),
    nproc_per_node=4,
    max_restarts=5,
    restart_count=2,
    master_addr="10.0.0.1",
    master_port=29411,
)


def test_torchrun_environment_for_every_local_rank() -> None:
    base = {
        "PATH": "/usr/bin",
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "1",
        "WATCHDOG_PID": "1",
        "NODEAGENT_REDIS_PASSWORD": "secret",
        "NCCL_DEBUG": "INFO",
    }
    specs = worker_specs(base, CONFIG, RECORD, group_rank=1)
    assert [s.rank for s in specs] == [4, 5, 6, 7]
    env = specs[2].env
    # The expected mapping spells out decision 8; the launcher must set exactly these.
    assert {k: env[k] for k in TORCHRUN_VARIABLES} == {
        "RANK": "6",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "12",
        "LOCAL_WORLD_SIZE": "4",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "3",
        "ROLE_RANK": "6",
        "ROLE_WORLD_SIZE": "12",
        "ROLE_NAME": "default",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29411",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "5",
        "TORCHELASTIC_RUN_ID": "llama",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": "/var/log/na/llama/7/rank-6.error.json",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    }
    assert env["OMP_NUM_THREADS"] == "1" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["NODEAGENT_JOB_ID"] == "llama" and env["NODEAGENT_GENERATION"] == "7"
    assert env["NODEAGENT_NODE"] == "b" and env["NODEAGENT_STOP_GRACE_S"] == "45"
    assert env["NCCL_DEBUG"] == "WARN"  # job.env wins over the inherited environment
    assert env["PATH"] == "/usr/bin"
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "NODEAGENT_REDIS_PASSWORD"):
        assert name not in env
    assert specs[2].log_path == Path("/var/log/na/llama/7/rank-6.log")
    assert specs[2].cwd == "/opt/t" and specs[2].argv == (sys.executable, "train.py")


@pytest.mark.parametrize("recorded", [1, 4, 16])
def test_the_local_config_decides_how_many_workers_run(recorded: int) -> None:
    """A record (forged, or from a leader with another config) cannot change the number of
    workers, their entrypoint, env or directories: those come from this node's config."""
    record = replace(RECORD, nproc_per_node=recorded)
    specs = worker_specs({}, CONFIG, record, group_rank=2)
    assert [s.local_rank for s in specs] == [0, 1, 2, 3]
    assert [s.rank for s in specs] == [8, 9, 10, 11]
    assert {s.env["WORLD_SIZE"] for s in specs} == {"12"}  # 3 members x 4
    assert {s.env["LOCAL_WORLD_SIZE"] for s in specs} == {"4"}
    assert {s.argv for s in specs} == {(sys.executable, "train.py")}
    assert {s.cwd for s in specs} == {"/opt/t"}
    assert {s.env["NCCL_DEBUG"] for s in specs} == {"WARN"}
    assert all(s.log_path.parent == Path("/var/log/na/llama/7") for s in specs)


@pytest.mark.parametrize(
    ("argv", "interpreter", "target"),
    [
        (["python", "train.py", "--lr", "1"], ["python"], ["train.py", "--lr", "1"]),
        (["/venv/bin/python3.11", "-u", "t.py"], ["/venv/bin/python3.11", "-u"], ["t.py"]),
        (
            ["python", "-X", "importtime", "-m", "pkg.train"],
            ["python", "-X", "importtime"],
            ["-m", "pkg.train"],
        ),
        (["python", "-W", "ignore", "t.py", "-m"], ["python", "-W", "ignore"], ["t.py", "-m"]),
    ],
)
def test_split_python(argv: list[str], interpreter: list[str], target: list[str]) -> None:
    assert split_python(argv) == (tuple(interpreter), tuple(target))


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["bash", "run.sh"], "not a python interpreter"),
        (["python", "-c", "print()"], "runs no script"),
        (["python", "-m"], "without a module"),
        (["python", "-u"], "no script"),
        ([], "nothing"),
    ],
)
def test_split_python_rejects(argv: list[str], words: str) -> None:
    with pytest.raises(NotPython, match=words):
        split_python(argv)


def test_static_env_drops_what_changes_every_generation() -> None:
    env = {
        "PATH": "/bin",
        "CUDA_VISIBLE_DEVICES": "0",
        "RANK": "3",
        "MASTER_PORT": "1",
        "NODEAGENT_GENERATION": "7",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }
    assert static_env(env) == {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0"}


@pytest.mark.parametrize(
    ("entrypoint", "python", "expected"),
    [
        (("python", "t.py"), None, (sys.executable, "t.py")),
        (("python3", "-m", "pkg"), None, (sys.executable, "-m", "pkg")),
        (
            ("python", "-X", "dev", "t.py"),
            "/opt/py/bin/python3",
            ("/opt/py/bin/python3", "-X", "dev", "t.py"),
        ),
        (("python3.11", "t.py"), "/opt/py/bin/python3", ("python3.11", "t.py")),
        (("/usr/bin/python3", "t.py"), "/opt/py/bin/python3", ("/usr/bin/python3", "t.py")),
        (("./run.sh", "python"), None, ("./run.sh", "python")),
    ],
)
def test_bare_python_means_the_configured_interpreter(
    entrypoint: tuple[str, ...], python: str | None, expected: tuple[str, ...]
) -> None:
    resolved = resolve_argv(entrypoint, python)
    assert resolved == expected
    if resolved[0].rsplit("/", 1)[-1].startswith("python"):  # preload matches spares by it
        assert split_python(resolved)[0][0] == resolved[0]


def test_job_python_is_the_workers_interpreter() -> None:
    config = load_config(
        {
            "node": {"name": "b", "address": "10.0.0.2"},
            "redis": {"url": "redis://10.0.0.9:6379/0"},
            "job": {
                "id": "j",
                "entrypoint": ["python3", "t.py"],
                "python": "/opt/py/bin/python",
                **AS_TESTER,
            },
        }
    )
    (spec,) = worker_specs({}, config, replace(RECORD, members=("b",)), group_rank=0)
    assert spec.argv == ("/opt/py/bin/python", "t.py")


@pytest.mark.parametrize(
    ("nproc", "job_env", "base", "omp", "nccl", "unbuffered"),
    [
        (4, {}, {}, "1", "1", "1"),
        (1, {}, {}, None, "1", "1"),
        (4, {"OMP_NUM_THREADS": "8"}, {}, "8", "1", "1"),
        (4, {}, {"OMP_NUM_THREADS": "6", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3"}, "6", "3", "1"),
        (2, {"PYTHONUNBUFFERED": "", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}, {}, "1", "0", ""),
    ],
    ids=["defaults", "one-worker", "job-omp", "agent-env", "job-overrides"],
)
def test_torchrun_defaults_yield_to_the_job(
    nproc: int,
    job_env: dict[str, str],
    base: dict[str, str],
    omp: str | None,
    nccl: str,
    unbuffered: str,
) -> None:
    job = replace(CONFIG.job, nproc_per_node=nproc, env=job_env)
    config = replace(CONFIG, job=job)
    env = worker_specs(base, config, RECORD, group_rank=0)[0].env
    assert env.get("OMP_NUM_THREADS") == omp
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == nccl
    assert env["PYTHONUNBUFFERED"] == unbuffered
    assert (omp_warning(config, base) is not None) == (nproc > 1 and omp == "1")


def test_error_file_is_per_rank_and_generation() -> None:
    files = {
        spec.env["TORCHELASTIC_ERROR_FILE"]
        for generation in (7, 8)
        for spec in worker_specs({}, CONFIG, replace(RECORD, generation=generation), group_rank=1)
    }
    assert len(files) == 8
    assert "/var/log/na/llama/8/rank-5.error.json" in files


def test_a_spec_names_its_error_file() -> None:
    spec = worker_specs({}, CONFIG, RECORD, group_rank=0)[1]
    assert spec.error_file == Path("/var/log/na/llama/7/rank-1.error.json")
    assert replace(spec, env={}).error_file is None


def test_workers_get_their_gpus_by_uuid_and_by_index_only_in_pci_order() -> None:
    assert visible_devices_of(((0, "GPU-aaaa"), (2, "GPU-cccc"))) == {
        "CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-cccc",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": "GPU-aaaa,GPU-cccc",
    }
    assert visible_devices_of(((3, "MIG-dddd"),))["CUDA_VISIBLE_DEVICES"] == "MIG-dddd"
    # One GPU without a UUID: all by index, counted in NVML's (PCI) order.
    assert visible_devices_of(((1, ""), (2, "GPU-cccc"))) == {
        "CUDA_VISIBLE_DEVICES": "1,2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "NVIDIA_VISIBLE_DEVICES": "1,2",
    }
    usable = ((2, "GPU-cccc"), (0, "GPU-aaaa"), (3, "MIG-dddd"), (1, ""))
    specs = worker_specs({}, CONFIG, RECORD, group_rank=0, usable_gpus=usable)
    cuda = [s.env["CUDA_VISIBLE_DEVICES"] for s in specs]
    assert cuda == ["GPU-cccc", "GPU-aaaa", "MIG-dddd", "1"]  # GPU 1 has no UUID here
    assert [s.gpus for s in specs] == [(2,), (0,), (3,), (1,)]  # health follows NVML's indices


def test_an_in_place_survivor_is_told_the_restore_order_a_new_worker_starts_with() -> None:
    config = load_config(
        {
            "node": {"name": "b", "address": "10.0.0.2"},
            "redis": {"url": "redis://10.0.0.9:6379/0"},
            "job": {
                "id": "llama",
                "entrypoint": ["python", "train.py"],
                "nproc_per_node": 2,
                "recovery": "in_place",
                "checkpoint": {"memory_size": "1GiB"},
                **AS_TESTER,
            },
        }
    )
    order = ("memory:20@7", "persistent:10@6", "script", "start")
    record = replace(RECORD, checkpoint=CheckpointRecord(restore=order))
    specs = worker_specs({}, config, record, group_rank=1)
    assert specs[1].assignment is not None
    told = specs[1].assignment.environment()
    assert told[restore.RESTORE_ENV] == specs[1].env[restore.RESTORE_ENV] == " ".join(order)
    assert told["RANK"] == specs[1].env["RANK"] == "3"
    plain = worker_specs({}, config, replace(RECORD, checkpoint=None), group_rank=1)
    assert plain[0].assignment is not None and plain[0].assignment.restore == ""


def test_the_agents_channel_is_set_by_the_agent_alone(tmp_path: Path) -> None:
    """A job that names its own tier or control file (job.env, or the agent's environment) has
    them dropped: its container would get that host path bound in (binds_of), past the node's
    containers.mount_sources."""
    elsewhere = str(tmp_path)  # a directory that exists, as /etc would
    forged = dict.fromkeys(CHANNEL_ENV, elsewhere)
    config = replace(CONFIG, job=replace(CONFIG.job, env={**forged, "NCCL_DEBUG": "INFO"}))
    env = worker_specs(forged, config, RECORD, group_rank=0)[0].env
    assert not set(CHANNEL_ENV) & set(env)  # no job.checkpoint: no tier, no channel at all
    assert env["NCCL_DEBUG"] == "INFO" and binds_of(env, TIER_DIRS) == ()


def test_a_worker_in_an_image_gets_none_of_the_agents_environment_but_what_the_node_names() -> None:
    """Issue 52: a worker in an image with `ENV PATH=/opt/teamb/bin:...` saw the agent's PATH
    and HOME: its environment was the agent's whole environment. Now its env file holds only
    torchrun's and nodeagent's variables, the job's env and what containers.env names."""
    base = {"PATH": "/root/.pyenv/shims:/usr/bin", "HOME": "/root", "https_proxy": "http://p:3128"}
    job = replace(CONFIG.job, container=ContainerSpec("localhost/team:1"))
    config = replace(CONFIG, job=job, containers=ContainerRule(env=("https_proxy", "ABSENT")))
    env = worker_specs(base, config, RECORD, group_rank=0)[0].env
    assert "PATH" not in env and "HOME" not in env
    assert env["https_proxy"] == "http://p:3128" and "ABSENT" not in env
    assert env["NCCL_DEBUG"] == "WARN" and env["RANK"] == "0"  # the job's and torchrun's
    bare = worker_specs(base, CONFIG, RECORD, group_rank=0)[0].env
    assert bare["PATH"] == base["PATH"]  # a bare worker keeps the agent's, as torchrun's do
