"""Issue 80, pure: a job's limits on a node (model/resources.py), the node's isolation: section
and a job's memory ask (config/isolation.py), where the agent's cgroups are (jobcgroup.locate)
and the leaf it moves into on cgroup v2 (jobcgroup.settle, on a stand-in tree)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.config.isolation import IsolationConfig, load_isolation
from nodeagent.config.load import job_fields
from nodeagent.config.settings import JobConfig
from nodeagent.config.values import Section
from nodeagent.errors import ConfigError
from nodeagent.model.history import restarts_by_cause
from nodeagent.model.job import Event
from nodeagent.model.resources import Capacity, LimitError, Limits, limits_for
from nodeagent.supervisor.jobcgroup import AGENT_PIDS_MAX, UNIFIED, Layout, locate, settle

GIB = 1 << 30
NODE = Capacity(memory=1000 * GIB, cpus=96, units=8)  # 900 GiB for jobs: 112.5 GiB a GPU
DEFAULTS = IsolationConfig()


def job(**keys: object) -> JobConfig:
    return job_fields(Section({"id": "j", "entrypoint": ["python", "t.py"], **keys}, "job"))


@pytest.mark.parametrize(
    ("keys", "units", "memory", "weight"),
    [
        ({}, 1, 900 * GIB // 8, 1200),  # the node's share of one GPU, its share of the CPUs
        ({}, 4, 900 * GIB // 8 * 4, 4800),
        ({}, None, 900 * GIB, 9600),  # the whole node: all that is left after the reserve
        ({"mem": "64GiB"}, 2, 64 * GIB, 2400),  # its own ask, whatever it holds
        ({"mem_per_gpu": "80GiB"}, 2, 160 * GIB, 2400),
        ({"mem_per_gpu": "80GiB"}, None, 640 * GIB, 9600),  # times every GPU of the node
        ({"mem_per_gpu": "80GiB"}, 0, 80 * GIB, 1),  # holding none: one GPU's worth
    ],
)
def test_a_jobs_limits_follow_its_ask_else_the_nodes_share(
    keys: dict[str, object], units: int | None, memory: int, weight: int
) -> None:
    limits = limits_for(NODE, DEFAULTS, job(**keys), units)
    assert limits == Limits(memory, 0, DEFAULTS.pids_max, min(weight, 10_000) or 1)


def test_the_operators_reserve_default_and_swap_are_taken() -> None:
    isolation = IsolationConfig(reserved_memory=100 * GIB, mem_per_gpu=50 * GIB, swap=GIB)
    limits = limits_for(NODE, isolation, job(), 2)
    assert (limits.memory, limits.swap) == (100 * GIB, GIB)
    whole = limits_for(NODE, isolation, job(), None)
    assert whole.memory == 900 * GIB
    bare = limits_for(Capacity(64 * GIB, 8, 0), DEFAULTS, job(), 0)
    assert bare.memory == 64 * GIB - 64 * GIB // 10  # no GPUs known: the node's whole


def test_more_than_the_node_can_give_or_less_than_its_workers_need_is_refused() -> None:
    with pytest.raises(LimitError) as more:
        limits_for(NODE, DEFAULTS, job(mem="2TiB"), 1)
    assert str(more.value) == (
        "asks for 2 TiB of memory (mem 2 TiB), but this node's jobs share 900 GiB (1000 GiB "
        "less 100 GiB reserved): ask for less"
    )
    tiny = Capacity(memory=2 * GIB, cpus=8, units=8)  # 1.8 GiB: 230 MiB a GPU
    with pytest.raises(LimitError, match=r"less than its 4 workers need to start \(512 MiB\)"):
        limits_for(tiny, DEFAULTS, job(nproc_per_node=4), 1)


@pytest.mark.parametrize(
    ("keys", "said"),
    [
        ({"mem": "64GiB", "mem_per_gpu": "8GiB"}, "job.mem: give mem (a node's whole) or"),
        ({"mem": "200MiB", "nproc_per_node": 2}, "job.mem: 200 MiB is below what 2 workers"),
        ({"mem_per_gpu": "64MiB"}, "job.mem_per_gpu: 64 MiB is below the 128 MiB a worker"),
        ({"mem": "lots"}, "job.mem: expected a size such as 8GiB or 512MiB, got 'lots'"),
    ],
)
def test_a_bad_memory_ask_names_its_key(keys: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as error:
        job(**keys)
    assert str(error.value).startswith(said), str(error.value)


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ({"cgroups": "maybe"}, "isolation.cgroups: must be one of required, available, off"),
        ({"pids_max": 10}, "isolation.pids_max"),
        ({"mem_per_gpu": "1MiB"}, "isolation.mem_per_gpu: 1 MiB is below the 128 MiB"),
        ({"swap": "-1"}, "isolation.swap: expected a size"),
        ({"cpus": 4}, "isolation.cpus"),
        ({"shm": "own"}, "isolation.shm: must be one of private, shared"),
    ],
)
def test_a_bad_isolation_section_names_its_key(raw: dict[str, object], said: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_isolation(Section(raw, "isolation"))
    assert str(error.value).startswith(said), str(error.value)


def test_the_isolation_section_reads_sizes_and_a_bare_off() -> None:
    read = load_isolation(
        Section({"reserved_memory": "16GiB", "swap": "1GiB", "mem_per_gpu": "auto"}, "isolation")
    )
    assert read == IsolationConfig(reserved_memory=16 * GIB, swap=GIB)
    assert read.shm == "private"
    assert not load_isolation(Section({"cgroups": False}, "isolation")).on
    assert load_isolation(Section({"shm": "shared"}, "isolation")).shm == "shared"


HYBRID_CGROUP = (
    "9:name=systemd:/system.slice/nodeagent.service\n"
    "8:pids:/system.slice/nodeagent.service\n"
    "5:cpuset:/\n"
    "4:memory:/system.slice/nodeagent.service\n"
    "2:cpu,cpuacct:/system.slice/nodeagent.service\n"
    "0::/system.slice/nodeagent.service\n"
)
HYBRID_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd\n"
    "31 25 0:27 / /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
    "32 25 0:28 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    "33 25 0:29 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
    "34 25 0:30 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    "35 25 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset\n"
)
UNIT = "system.slice/nodeagent.service"


def test_on_a_hybrid_each_controller_is_its_v1_hierarchys() -> None:
    layout = locate(HYBRID_CGROUP, HYBRID_MOUNTS, lambda _: ["hugetlb"])
    base = Path("/sys/fs/cgroup")
    assert layout == Layout(
        base / "unified" / UNIT,
        {
            base / "unified" / UNIT: frozenset(),
            base / "memory" / UNIT: frozenset({"memory"}),
            base / "pids" / UNIT: frozenset({"pids"}),
            base / "cpu,cpuacct" / UNIT: frozenset({"cpu"}),
            base / "cpuset": frozenset({"cpuset"}),  # systemd leaves v1 cpusets at the root
        },
    )
    assert layout.missing() == [] and layout.v2() == frozenset()
    without = layout.without(["pids", UNIFIED])
    assert without.unified is None and set(without.parents) == {
        base / "memory" / UNIT,
        base / "cpu,cpuacct" / UNIT,
        base / "cpuset",
    }


def test_on_cgroup_v2_every_controller_is_the_unified_hierarchys() -> None:
    mounts = "29 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
    layout = locate(f"0::/{UNIT}\n", mounts, lambda _: ["cpuset", "cpu", "io", "memory"])
    here = Path("/sys/fs/cgroup") / UNIT
    assert layout == Layout(here, {here: frozenset({"cpuset", "cpu", "memory"})})
    assert layout.missing() == ["pids"]  # not delegated to it: the agent says so


def test_a_mount_of_part_of_a_hierarchy_is_followed() -> None:
    """A container's cgroup namespace: the mount's root is where the process is below."""
    mounts = "40 30 0:28 /libpod/x /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    layout = locate("4:memory:/libpod/x/sub\n", mounts, lambda _: [], ["memory"])
    assert layout.parents == {Path("/sys/fs/cgroup/memory/sub"): frozenset({"memory"})}


def test_settle_moves_the_agents_processes_to_its_leaf_before_handing_controllers_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cgroup.procs").write_text("101\n102\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    moved: list[str] = []
    leaf = tmp_path / "agent"
    leaf.mkdir()
    procs = leaf / "cgroup.procs"
    procs.mkdir()  # stands for the kernel's file: every write is kept, in order
    original = Path.write_text

    def write(path: Path, text: str, *args: object, **kwargs: object) -> int:
        if path == procs:
            moved.append(text)
            return len(text)
        return original(path, text)

    monkeypatch.setattr(Path, "write_text", write)
    settle(Layout(tmp_path, {tmp_path: frozenset({"memory", "pids"})}))
    assert moved == ["101", "102"]
    assert (tmp_path / "cgroup.subtree_control").read_text() == "+memory +pids"
    # the agent's own bound on processes, where the unit's TasksMax= is off
    assert (leaf / "pids.max").read_text() == str(AGENT_PIDS_MAX)


def test_a_restart_the_job_failed_in_instead_is_not_counted() -> None:
    events = [
        Event("generation_announced", generation=g, data={"reason": r})
        for g, r in ((1, "node_joined"), (2, "worker_oom"), (3, "worker_oom"))
    ]
    events.append(Event("job_failed", generation=3))
    assert restarts_by_cause(events) == {"worker_oom": 1}
    assert restarts_by_cause(events[:3]) == {"worker_oom": 2}
