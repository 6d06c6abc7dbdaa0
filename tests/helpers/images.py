"""Container images the tests build from what this machine has (no registry is reachable).

An image is a small root filesystem assembled here and `podman import`ed: its own /etc (with a
marker file naming it), /tmp, and the merged-/usr links; the machine's /usr, Python and
checkout come in as the job's read-only mounts, as a site mounts its shared software. So a
test can tell which image a worker runs in (the marker) at no cost in build time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from nodeagent.supervisor import cgroups

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


def build_image(name: str) -> str:
    """`localhost/<name>:test`, built (again) from a root filesystem made here."""
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
            ["podman", *RUNC, "import", "--quiet", str(tarball), image],
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


def containers_section(*writable: Path) -> dict[str, object]:
    """A node's `containers:` section that runs the test images with `host_software_mounts`."""
    return {
        "allowed": True,
        "images": ["localhost/"],
        "mount_sources": [m.split(":")[0] for m in host_software_mounts(*writable).split(",")],
        "oci_runtime": RUNC[0].split("=")[1] if RUNC else None,
        "ulimits": ["nofile=4096:4096", "nproc=4096:4096"],
    }


def remove_image(image: str) -> None:
    subprocess.run(["podman", "rmi", "--force", image], capture_output=True, check=False)


def container_processes(job: str, node: str) -> list[int]:
    """The host pids in `node`'s worker containers of `job` (its runtime's and the workers')."""
    found = []
    for pid in sorted(cgroups.members(f"{cgroups.PREFIX}/{job}")):
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            continue
        if f"/{node}-g" in cgroup:
            found.append(pid)
    return found


def clean_cgroups(job: str) -> None:
    """What a test or a killed node left of `job`'s containers: killed, their cgroups removed."""
    name = f"{cgroups.PREFIX}/{job}"
    cgroups.kill(name)
    cgroups.remove(name)
