"""Container images the tests build from what this machine has (no registry is reachable).

An image is a small root filesystem assembled here and `podman import`ed: its own /etc (with a
marker file naming it), /tmp, and the merged-/usr links; the machine's /usr, Python and
checkout come in as the job's read-only mounts, as a site mounts its shared software. So a
test can tell which image a worker runs in (the marker) at no cost in build time.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from nodeagent.supervisor import cgroups
from nodeagent.supervisor.container import job_prefix

ROOT = Path(__file__).resolve().parents[2]
MARKER = "/etc/nodeagent-test-image"
RUNC = ["--runtime=runc"] if shutil.which("runc") else []


def podman_missing() -> str | None:
    """Why containers cannot run here (None: they can)."""
    if shutil.which("podman") is None:
        return "podman is not installed (.ci/setup installs it)"
    if os.geteuid() != 0:
        return "root's podman needs root"
    return None


def build_image(name: str, env: Mapping[str, str] | None = None) -> str:
    """`localhost/<name>:test`, built (again) from a root filesystem made here, with `env` as
    its `ENV` (a Containerfile's)."""
    image = f"localhost/{name}:test"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "root"
        for directory in ("etc", "tmp", "root", "usr", "proc", "sys", "dev", "run", "home"):
            (root / directory).mkdir(parents=True)
        (root / "tmp").chmod(0o1777)
        (root / "root").chmod(0o755)
        for link in ("bin", "lib", "lib64", "sbin"):
            (root / link).symlink_to(f"usr/{link}")
        (root / MARKER.lstrip("/")).write_text(image + "\n")
        (root / "etc" / "passwd").write_text("root:x:0:0::/root:/bin/sh\n")
        (root / "etc" / "group").write_text("root:x:0:\n")
        tarball = Path(tmp) / "root.tar"
        with tarfile.open(tarball, "w") as tar:
            tar.add(root, arcname=".")
        subprocess.run(
            [
                *("podman", *RUNC, "import", "--quiet"),
                *(f"--change=ENV {k}={v}" for k, v in (env or {}).items()),
                *(str(tarball), image),
            ],
            check=True,
            capture_output=True,
        )
    return image


def host_software_mounts(*writable: Path) -> str:
    """The mounts that bring this machine's Python, torch and checkout into a test image (read
    only), and `writable` directories (the test's own), as pyxis spells them."""
    paths = ["/usr", os.path.realpath(sys.base_prefix), str(ROOT)]
    if not str(Path(sys.prefix).resolve()).startswith(str(ROOT)):
        paths.append(str(Path(sys.prefix).resolve()))
    read_only = [f"{p}:{p}:ro" for p in dict.fromkeys(paths)]
    return ",".join([*read_only, *(f"{w}:{w}" for w in writable)])


def containers_section(*writable: Path, env: tuple[str, ...] = ()) -> dict[str, object]:
    """A node's `containers:` section that runs the test images with `host_software_mounts`
    (`env`: its variables of the agent's that every worker gets)."""
    return {
        "env": list(env),
        "allowed": True,
        "images": ["localhost/"],
        "mount_sources": [m.split(":")[0] for m in host_software_mounts(*writable).split(",")],
        "socket": service_socket(),
        "ulimits": ["nofile=4096:4096", "nproc=4096:4096"],
    }


def remove_image(image: str) -> None:
    subprocess.run(["podman", "rmi", "--force", image], capture_output=True, check=False)


def container_processes(job: str, node: str) -> list[int]:
    """The host pids in `node`'s worker containers of `job` (their inits and the workers)."""
    found: set[int] = set()
    for container in containers_named(f"{job_prefix(job)}{node}-g"):
        for name in cgroups.container_names(container):
            with contextlib.suppress(OSError):
                found |= cgroups.members(name)
    return sorted(found)


def clean_containers(job: str) -> None:
    """What a test or a killed node left of `job`'s containers: removed, their processes
    killed."""
    ids = containers_named(job_prefix(job))
    if ids:
        _remote("rm", "--force", "--time=0", *ids)


def containers_named(prefix: str) -> list[str]:
    """The ids of the service's containers whose name starts with `prefix`."""
    listed = _remote("ps", "--all", "--no-trunc", "--format={{.ID}} {{.Names}}").stdout
    pairs = [line.split() for line in listed.splitlines()]
    return [p[0] for p in pairs if len(p) == 2 and p[1].startswith(prefix)]


def container_states(prefix: str) -> list[str]:
    """Each of the service's containers whose name starts with `prefix`: its name, state and
    status (what a test that waited for them to go says of those left)."""
    listed = _remote("ps", "--all", "--format={{.Names}} {{.State}} {{.Status}}").stdout
    return [line for line in listed.splitlines() if line.startswith(prefix)]


def _remote(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", "--remote", f"--url=unix://{service_socket()}", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


_SERVICE: list[tuple[subprocess.Popen[bytes], str]] = []


def service_socket() -> str:
    """The socket of a podman service this process started (`podman system service`, as
    Debian's podman.socket runs it), started on first use and stopped at exit. runc and
    podman's cgroupfs manager: this machine has neither crun nor a running systemd."""
    if _SERVICE:
        return _SERVICE[0][1]
    directory = tempfile.mkdtemp(prefix="nodeagent-podman-")
    socket = f"{directory}/podman.sock"
    url = f"unix://{socket}"
    proc = subprocess.Popen(
        ["podman", *RUNC, "--cgroup-manager=cgroupfs", "system", "service", "--time=0", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _SERVICE.append((proc, socket))
    atexit.register(_stop_service, proc, directory)
    deadline = time.monotonic() + 60
    while not os.path.exists(socket):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"podman system service did not start (exit {proc.returncode})")
        time.sleep(0.05)
    return socket


def _stop_service(proc: subprocess.Popen[bytes], directory: str) -> None:
    proc.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(30)
    shutil.rmtree(directory, ignore_errors=True)
