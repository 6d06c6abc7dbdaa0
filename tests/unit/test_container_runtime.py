"""The container runtime's commands (podman), pure: what a worker's `podman run` says, what
podman itself is given of the environment, the env file only root reads, and each worker's
name, cidfile and directories."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodeagent.checkpoint import space
from nodeagent.config.container import ContainerRule, ContainerSpec, parse_mounts
from nodeagent.config.identity import WorkerUser
from nodeagent.config.load import load_settings
from nodeagent.config.settings import CheckpointConfig, Config
from nodeagent.model.resources import Limits
from nodeagent.runtime.jobrun import _containers
from nodeagent.supervisor import cgroups
from nodeagent.supervisor.container import (
    RETRY_S,
    Containers,
    Launch,
    Podman,
    Share,
    agent_env,
    cdi_names,
    container_name,
    job_prefix,
    write_env_file,
)
from nodeagent.supervisor.spec import WorkerSpec
from tests.helpers.runas import AS_TESTER

ALICE = WorkerUser("alice", 1000, 1000, (1000, 2000), switch=True)


def _launch(**change: object) -> Launch:
    fields: dict[str, object] = {
        "name": "nodeagent-1-j-a-g3-rank1",
        "cidfile": Path("/dev/shm/nodeagent/a.j+run/nodeagent-1-j-a-g3-rank1.cid"),
        "cgroup_parent": "/nodeagent",
        "env_file": Path("/run/x/w.env"),
        "workdir": "/work",
        "user": ALICE,
        "binds": ("/var/log/nodeagent/j", "/dev/shm/nodeagent/a.j"),
        "shm_dir": "/dev/shm/nodeagent/a.j+shm",
        "gpus": ("GPU-1234",),
        "argv": ("python", "train.py", "--lr", "0.1"),
    }
    fields.update(change)
    return Launch(**fields)  # type: ignore[arg-type]


def test_each_container_of_a_job_has_its_part_of_the_jobs_limits() -> None:
    """A job of 4 workers on a node, limited to 64 GiB, 1 GiB of swap, 1,000 processes,
    weight 800 and cores 2-3: each container a quarter, every one on the job's cores."""
    limits = Limits(64 << 30, 1 << 30, 1000, 800, (2, 3))
    share = Share.of(limits, 4)
    argv = Podman(ContainerRule(True), ContainerSpec("localhost/t")).run_argv(_launch(share=share))
    assert {
        f"--memory={16 << 30}",
        f"--memory-swap={(16 << 30) + (256 << 20)}",
        "--pids-limit=250",
        "--cpu-shares=2048",  # 800 / 4 on cpu.weight's scale: two CPUs' worth
        "--cpuset-cpus=2,3",
    } <= set(argv)
    assert not any(
        a.startswith(("--memory", "--cpu"))
        for a in Podman(ContainerRule(True), ContainerSpec("localhost/t")).run_argv(_launch())
    )  # no limits where the node makes no job cgroups


def test_a_workers_podman_run_says_all_it_must() -> None:
    rule = ContainerRule(
        True,
        ("localhost/",),
        ("/data",),
        socket="/run/podman/podman.sock",
        ulimits=("nofile=4096:4096",),
        devices=("/dev/ib0",),
    )
    spec = ContainerSpec("localhost/torch:2.5", parse_mounts("/data/in:/in:ro"))
    argv = Podman(rule, spec).run_argv(_launch())
    # A client of the node's podman service: nothing of the runtime runs in the agent's unit.
    assert argv[:4] == ["podman", "--remote", "--url=unix:///run/podman/podman.sock", "run"]
    flags = set(argv)
    for flag in (
        "--rm",
        "--name=nodeagent-1-j-a-g3-rank1",
        "--cidfile=/dev/shm/nodeagent/a.j+run/nodeagent-1-j-a-g3-rank1.cid",
        "--init",
        "--pull=never",
        "--network=host",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--cgroup-parent=/nodeagent",
        "--env-file=/run/x/w.env",
        "--ulimit=nofile=4096:4096",
        "--user=1000:1000",
        "--group-add=2000",
        "--workdir=/work",
        "--volume=/dev/shm/nodeagent/a.j+shm:/dev/shm",
        "--volume=/var/log/nodeagent/j:/var/log/nodeagent/j",
        "--volume=/dev/shm/nodeagent/a.j:/dev/shm/nodeagent/a.j",
        "--volume=/data/in:/in:ro",
        "--device=nvidia.com/gpu=GPU-1234",
        "--device=/dev/ib0",  # the node's devices (RDMA), to every worker
    ):
        assert flag in flags, flag
    assert "--group-add=1000" not in flags  # the primary group is --user's
    # The image, then the entrypoint exactly as given: nothing after the image is podman's.
    assert argv[-5:] == ["localhost/torch:2.5", "python", "train.py", "--lr", "0.1"]


def test_a_directory_the_job_mounts_itself_is_bound_once_from_the_source_judged() -> None:
    """A submitted job's persist_dir: a mount of the job's (model/spec.run_config judged it and
    resolved its links), not bound again from the variable that names it."""
    spec = ContainerSpec("localhost/t", parse_mounts("/data/real-ckpt:/shared/ckpt"))
    launch = _launch(binds=("/var/log/nodeagent/j", "/shared/ckpt"))
    volumes = [a for a in Podman(ContainerRule(True), spec).run_argv(launch) if "/ckpt" in a]
    assert volumes == ["--volume=/data/real-ckpt:/shared/ckpt"]


def test_without_a_user_switch_or_settings_podman_uses_its_own() -> None:
    argv = Podman(ContainerRule(True), ContainerSpec("localhost/t")).run_argv(
        _launch(user=None, workdir=None, gpus=(), shm_dir=None)
    )
    assert not [a for a in argv if a.startswith(("--user", "--runtime", "--ulimit", "--work"))]
    assert not [a for a in argv if a.startswith("--device")]


def test_the_cgroup_parent_is_the_services_managers_kind() -> None:
    assert cgroups.parent_flag("systemd") == "nodeagent.slice"
    assert cgroups.parent_flag("cgroupfs") == "/nodeagent"


def test_podman_gets_nothing_of_the_jobs_environment() -> None:
    """Root's podman reads CONTAINERS_CONF and $HOME/.config/containers: a job that could set
    them would choose the runtime root starts."""
    job = {"PATH": "/usr/bin", "HOME": "/root", "CONTAINERS_CONF": "/home/alice/evil.conf"}
    assert agent_env(job) == {"PATH": "/usr/bin", "HOME": "/root"}
    assert agent_env({})["PATH"].startswith("/usr/local/sbin")


def test_an_env_file_is_roots_alone_never_through_a_link_and_refuses_a_line_break(
    tmp_path: Path,
) -> None:
    path = tmp_path / "w.env"
    target = tmp_path / "elsewhere"
    path.symlink_to(target)  # a link where the file goes is replaced, never written through
    write_env_file(path, {"A": "1", "NODEAGENT_JOB_ID": "j", "EMPTY": ""})
    assert path.read_text() == "A=1\nNODEAGENT_JOB_ID=j\nEMPTY=\n"
    assert not path.is_symlink() and not target.exists()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    with pytest.raises(ValueError, match="'B'"):
        write_env_file(tmp_path / "x.env", {"B": "one\nC=two"})  # would smuggle C in


def test_cdi_names_are_the_workers_visible_devices() -> None:
    assert cdi_names("GPU-a,GPU-b") == ("GPU-a", "GPU-b")
    assert cdi_names("0,1") == ("0", "1")
    assert cdi_names(None) == () == cdi_names("")


class _Runtime:
    """The runtime's side, recorded: what Containers hands it."""

    worker_depth = 1

    def __init__(self) -> None:
        self.launches: list[Launch] = []
        self.removed: list[str] = []

    def cgroup_parent(self) -> str:
        return "/nodeagent"

    def run_argv(self, launch: Launch) -> list[str]:
        self.launches.append(launch)
        return ["podman", "run", launch.name]

    def remove(self, *names: str) -> None:
        self.removed.append(" ".join(names))

    def present(self, image: str) -> bool:
        return True

    def pull(self, image: str, timeout_s: float) -> None:
        return None


def _spec(tmp_path: Path, rank: int, generation: int) -> WorkerSpec:
    env = {"NODEAGENT_GENERATION": str(generation), "CUDA_VISIBLE_DEVICES": "GPU-9"}
    log = tmp_path / "logs" / "j" / "g1" / f"rank{rank}.log"
    return WorkerSpec(rank, rank, ("python", "t.py"), env, "/work", log, tmp_path / "p", (0,))


def test_a_jobs_containers_have_their_own_directories_names_and_cidfiles(tmp_path: Path) -> None:
    made: list[tuple[Path, int, int, int]] = []
    runtime = _Runtime()
    shm, run = tmp_path / "a.j+shm", tmp_path / "a.j+run"

    def make_dir(path: Path, mode: int, uid: int, gid: int) -> None:
        made.append((path, mode, uid, gid))
        path.mkdir(mode=mode, exist_ok=True)

    containers = Containers(runtime, "a", "j", shm, run, ALICE, make_dir)
    stale = run / "nodeagent-1-j-a-g3-rank1.cid"
    run.mkdir()
    stale.write_text("0" * 64)  # what an earlier spawn left: podman refuses to write over it
    argv, env = containers.command(_spec(tmp_path, 1, 3))
    assert argv == ["podman", "run", "nodeagent-1-j-a-g3-rank1"]
    assert set(env) <= {"PATH", "HOME"}
    # The job's /dev/shm is its user's with the agent's group (which removes what the workers
    # left there without CAP_DAC_OVERRIDE); the env files and cidfiles the agent's alone (taken
    # back if a user had made the directory first).
    agent = (os.geteuid(), os.getegid())
    assert (shm, 0o770, 1000, os.getegid()) in made and (run, 0o700, *agent) in made
    (launch,) = runtime.launches
    assert launch.cidfile == stale and not stale.exists()
    assert containers.cidfile(_spec(tmp_path, 1, 3)) == stale
    assert launch.env_file.parent == run and launch.env_file.read_text().startswith("NODEAGENT_")
    assert launch.gpus == ("GPU-9",) and launch.shm_dir == str(shm)
    assert launch.binds[0] == str(tmp_path / "logs" / "j")
    # Each spawn its own container: another generation or rank is another name.
    assert containers.name(_spec(tmp_path, 1, 4)) != containers.name(_spec(tmp_path, 0, 3))
    containers.remove(_spec(tmp_path, 1, 3))
    assert runtime.removed == ["nodeagent-1-j-a-g3-rank1"]
    containers.close()  # every container it ran, once more: one podman call
    assert runtime.removed[1:] == ["nodeagent-1-j-a-g3-rank1"]
    assert not run.exists() and not shm.exists()


def test_container_names_of_two_jobs_on_two_nodes_never_meet() -> None:
    """Ids and node names may hold '-': job a-b on node c is not job a on node b-c."""
    assert container_name("a-b", "c", 1, 0) != container_name("a", "b-c", 1, 0)
    assert container_name("a-b", "c", 1, 0).startswith(job_prefix("a-b"))
    assert not container_name("a", "b-c", 1, 0).startswith(job_prefix("a-b"))


def test_a_service_that_cannot_be_asked_is_not_asked_again_at_each_ranks_start(
    tmp_path: Path,
) -> None:
    """Every rank's start fails at once with why, the agent's loop never waits on each; asked
    again after RETRY_S."""
    calls = tmp_path / "calls"
    program = tmp_path / "podman"
    program.write_text(f"#!/bin/sh\necho x >> {calls}\necho 'cannot connect' >&2\nexit 125\n")
    program.chmod(0o755)
    now = [0.0]
    podman = Podman(
        ContainerRule(True, socket="/run/none.sock"),
        ContainerSpec("x"),
        str(program),
        clock=lambda: now[0],
    )
    for _ in range(3):
        with pytest.raises(OSError, match=r"podman service at /run/none\.sock: cannot connect"):
            podman.cgroup_parent()
    assert calls.read_text().count("x") == 1
    now[0] = RETRY_S + 1
    with pytest.raises(OSError):
        podman.cgroup_parent()
    assert calls.read_text().count("x") == 2


def test_a_directory_another_jobs_tier_holds_is_refused_not_taken_over(tmp_path: Path) -> None:
    """Job `j.run`'s memory tier on node a was job j's env-file directory there, its user's.
    No job's tier has that name now (`<tier>+run`); a directory there marked as another job's
    all the same: a worker of j does not start (its log says why) rather than write its
    environment where that job's user can read and change it."""
    memory_dir = tmp_path / "shm"
    memory_dir.mkdir(mode=0o755)
    tier = CheckpointConfig(memory_size=1, memory_dir=str(memory_dir)).memory_tier("a", "j.run")
    assert Path(tier) != memory_dir / "a.j+run"
    space.make_marked(memory_dir / "a.j+run", "the tier", 0o700, "a", "j.run", uid=65534)
    job = {
        "id": "j",
        "entrypoint": ["true"],
        "container": {"image": "localhost/t:1"},
        "checkpoint": {"memory_dir": str(memory_dir), "memory_size": "1GiB"},
        **AS_TESTER,
    }
    containers = {"allowed": True, "images": ["localhost/"]}
    doc = {"redis": {"url": "redis://r:6379/0"}, "node": {"name": "a"}, "job": job}
    config = load_settings({**doc, "containers": containers})
    assert isinstance(config, Config)
    made = _containers(config, None)
    assert made is not None
    with pytest.raises(OSError, match=r"a\.j\+run is job j\.run's on node a, not j's"):
        made.command(_spec(tmp_path, 0, 1))
    assert (memory_dir / "a.j+run").stat().st_uid == 65534  # left as it was


def test_a_container_that_stops_as_it_is_removed_is_removed_when_asked_again(
    tmp_path: Path,
) -> None:
    """podman's `rm --force` fails when the container stops between its look and its kill
    ("could not be stopped ... container state improper: stopped", seen in CI): the container
    is left there, stopped. Asked again, it goes."""
    calls = tmp_path / "calls"
    fake = tmp_path / "podman"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'[ "$(grep -c " rm " {calls})" -ge 2 ] && exit 0\n'
        "echo 'Error: cannot remove container x as it could not be stopped: container state "
        "improper: stopped' >&2\nexit 2\n"
    )
    fake.chmod(0o755)
    Podman(ContainerRule(True), ContainerSpec("img"), program=str(fake)).remove("job-rank0")
    assert calls.read_text().count(" rm --force") == 2
