"""Stand-ins for /dev/nvidia* and a cgroup the agent may write, for the device cgroup's tests
(supervisor/devices.py, issue 66).

The kernel judges a device node by its major and minor wherever it lies, so `nvidia<minor>`
made with mknod in a directory of the test's stands for /dev/nvidia<minor>. With no NVIDIA
driver loaded, a node the cgroup allows fails to open with ENXIO (no such device), one it
refuses with EPERM, before any driver is asked.

    python -m tests.helpers.devicenodes DIRECTORY

prints, as one JSON line, what `opened` (tests/helpers/worker.py) finds there, this process's
cgroup (v2) and its CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from nodeagent.supervisor.devices import DeviceCgroupError, own_cgroup
from tests.helpers.worker import opened

ROOT = Path(__file__).resolve().parents[2]
DROP_IN = ROOT / "systemd" / "nodeagent.service.d" / "constrain-devices.conf"
CTL, MODESET = "nvidia255", "nvidia254"


@contextlib.contextmanager
def device_nodes(minors: Iterable[int]) -> Iterator[Path]:
    """`nvidia<minor>` for each of `minors`, 254 (modeset) and 255 (nvidiactl), open to all,
    in a directory anyone can reach (not below pytest's 0700 one)."""
    if os.geteuid() != 0:
        pytest.skip("making device nodes and cgroups needs root")
    with tempfile.TemporaryDirectory(prefix="nodeagent-dev-") as name:
        directory = Path(name)
        directory.chmod(0o755)
        for minor in [*minors, 254, 255]:
            path = directory / f"nvidia{minor}"
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
            path.chmod(0o666)
        yield directory


@contextlib.contextmanager
def delegated_cgroup() -> Iterator[Path]:
    """A cgroup of the test's own below this process's, as systemd's `Delegate=yes` gives the
    unit one; removed after, once what ran in it (and the job cgroups below it) is gone."""
    try:
        parent = own_cgroup()
    except DeviceCgroupError as exc:
        pytest.skip(f"no cgroup v2 here: {exc.strerror}")
    path = parent / f"nodeagent-test-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    try:
        yield path
    finally:
        deadline = time.monotonic() + 30
        for cgroup in [*(p for p in path.iterdir() if p.is_dir()), path]:
            while cgroup.exists():
                try:
                    cgroup.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def in_cgroup(cgroup: Path) -> list[str]:
    """A command prefix that moves the command into `cgroup` first (as root, before setpriv)."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup)]


def drop_in_caps() -> list[str]:
    """The capabilities the drop-in adds to the unit's."""
    line = next(x for x in DROP_IN.read_text().splitlines() if x.startswith("CapabilityBounding"))
    return line.split("=", 1)[1].split()


def allowed_only(minors: Iterable[int], *names: str) -> dict[str, str]:
    """What a worker allowed `names` (and nvidiactl, modeset) finds among `minors`' nodes."""
    allowed = {*names, CTL, MODESET}
    nodes = sorted(f"nvidia{m}" for m in [*minors, 254, 255])
    return {name: "ENXIO" if name in allowed else "EPERM" for name in nodes}


def main(directory: str) -> None:
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    cgroup = next(line[3:] for line in lines if line.startswith("0::"))
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
    print(json.dumps({"opened": opened(directory), "cgroup": cgroup, "cuda": cuda}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
