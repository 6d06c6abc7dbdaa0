"""The container runtime's commands (podman), pure: what a worker's `podman run` says, what
podman itself is given of the environment, and the env file only root reads."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nodeagent.config.container import ContainerRule, ContainerSpec, parse_mounts
from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.container import EnvFiles, Launch, Podman, agent_env, cdi_names

ALICE = WorkerUser("alice", 1000, 1000, (1000, 2000), switch=True)


def _launch(**change: object) -> Launch:
    fields: dict[str, object] = {
        "name": "nodeagent-j-a-g3-rank1",
        "cgroup": "nodeagent/j/a-g3-rank1",
        "env_file": Path("/run/x/w.env"),
        "workdir": "/work",
        "user": ALICE,
        "binds": ("/var/log/nodeagent/j", "/dev/shm/nodeagent/a.j"),
        "shm_dir": "/dev/shm/nodeagent/a.j.shm",
        "gpus": ("GPU-1234",),
        "argv": ("python", "train.py", "--lr", "0.1"),
    }
    fields.update(change)
    return Launch(**fields)  # type: ignore[arg-type]


def test_a_workers_podman_run_says_all_it_must() -> None:
    rule = ContainerRule(
        True, ("localhost/",), ("/data",), "podman", "runc", ("nofile=4096:4096",), ("/dev/ib0",)
    )
    spec = ContainerSpec("localhost/torch:2.5", parse_mounts("/data/in:/in:ro"))
    argv = Podman(rule, spec).run_argv(_launch())
    assert argv[:3] == ["podman", "--runtime=runc", "--cgroup-manager=cgroupfs"]
    flags = set(argv)
    for flag in (
        "run",
        "--rm",
        "--init",
        "--pull=never",
        "--network=host",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        "--cgroup-parent=/nodeagent/j/a-g3-rank1",
        "--env-file=/run/x/w.env",
        "--ulimit=nofile=4096:4096",
        "--user=1000:1000",
        "--group-add=2000",
        "--workdir=/work",
        "--volume=/dev/shm/nodeagent/a.j.shm:/dev/shm",
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
    assert all(a.startswith("--") or a in ("podman", "run") for a in argv[: argv.index("run")])


def test_without_a_user_switch_or_settings_podman_uses_its_own() -> None:
    argv = Podman(ContainerRule(True), ContainerSpec("localhost/t")).run_argv(
        _launch(user=None, workdir=None, gpus=(), shm_dir=None)
    )
    assert not [a for a in argv if a.startswith(("--user", "--runtime", "--ulimit", "--work"))]
    assert not [a for a in argv if a.startswith("--device")]


def test_podman_gets_nothing_of_the_jobs_environment() -> None:
    """Root's podman reads CONTAINERS_CONF and $HOME/.config/containers: a job that could set
    them would choose the runtime root starts."""
    job = {"PATH": "/usr/bin", "HOME": "/root", "CONTAINERS_CONF": "/home/alice/evil.conf"}
    assert agent_env(job) == {"PATH": "/usr/bin", "HOME": "/root"}
    assert agent_env({})["PATH"].startswith("/usr/local/sbin")


def test_env_files_are_roots_alone_and_refuse_a_line_break(tmp_path: Path) -> None:
    files = EnvFiles()
    try:
        path = files.write("w", {"A": "1", "NODEAGENT_JOB_ID": "j", "EMPTY": ""})
        assert path.read_text() == "A=1\nNODEAGENT_JOB_ID=j\nEMPTY=\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        with pytest.raises(ValueError, match="'B'"):
            files.write("x", {"B": "one\nC=two"})  # would smuggle C in
    finally:
        files.close()
    assert not path.exists() and not path.parent.exists()


def test_cdi_names_are_the_workers_visible_devices() -> None:
    assert cdi_names("GPU-a,GPU-b") == ("GPU-a", "GPU-b")
    assert cdi_names("0,1") == ("0", "1")
    assert cdi_names(None) == () == cdi_names("")


def test_env_file_directory_is_not_shared_between_jobs() -> None:
    one, two = EnvFiles(), EnvFiles()
    try:
        assert one.write("w", {}).parent != two.write("w", {}).parent
        assert os.stat(one.write("w", {}).parent).st_uid == os.geteuid()
    finally:
        one.close()
        two.close()
