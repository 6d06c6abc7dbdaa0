"""The agent's worker start into a job's device cgroup (supervisor/devices.py) as a program of
its own, so a test can run it with the unit's privileges (tests/helpers/unitcaps.py) from a
cgroup the test made for it, as systemd's `Delegate=yes` gives the unit one:

    python -m tests.helpers.devicesas NODE JOB UID GID DEVDIR MINORS GPUS [GPUS ...]

MINORS maps NVML indices to minor numbers ("0:10,1:11"), as NVML's nvmlDeviceGetMinorNumber
would. For each GPUS ("1" or "2,3"; "-" for none) in turn, the job holds those GPUs and a
worker started as UID:GID tries to open every device node in DEVDIR. Prints one JSON
line: each worker's findings ({node name: "ok" or the errno's name}, and its cgroup), or the
OSError the start raised, and whether the job's cgroup is gone after the spawner closed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.devices import JobDevices, own_cgroup, probe
from nodeagent.supervisor.jobcgroup import JobCgroup, Layout
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.spec import WorkerSpec

ROOT = Path(__file__).resolve().parents[2]


def main(args: list[str]) -> dict[str, object]:
    node, job, uid, gid, devdir, minors, *confines = args
    by_index = {int(i): int(m) for i, m in (pair.split(":") for pair in minors.split(","))}
    user = WorkerUser("worker", int(uid), int(gid), switch=True, env={"HOME": "/"})
    parent = own_cgroup()
    try:
        probe(parent, node)
    except OSError as exc:
        return {"probe": exc.strerror, "errno": exc.errno}
    holding: list[int] = []  # what the job holds on the node: the node's grant, say
    cgroup = JobCgroup(Layout(parent, {parent: frozenset()}), node, job, None)
    devices = JobDevices(cgroup, by_index.get, lambda: holding)
    spawner = Spawner(user=user, cgroup=cgroup, devices=devices)
    made = parent / cgroup.name
    spec = WorkerSpec(
        rank=0,
        local_rank=0,
        argv=(sys.executable, "-m", "tests.helpers.devicenodes", devdir),
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        cwd=str(ROOT),
        log_path=Path("/nonexistent/rank-0.log"),
        progress_path=Path("/nonexistent/rank-0.progress"),
    )
    runs: list[object] = []
    try:
        for gpus in confines:
            holding[:] = [int(g) for g in gpus.split(",") if g != "-"]
            try:
                popen, _ = spawner.spawn(spec)
            except OSError as exc:
                runs.append({"error": exc.strerror, "errno": exc.errno})
                continue
            assert popen.stdout is not None
            said = popen.stdout.read().decode()
            popen.wait(timeout=60)
            made = cgroup.unified or made
            lines = said.strip().splitlines()
            runs.append(json.loads(lines[-1]) if lines and lines[-1].startswith("{") else said)
    finally:
        spawner.close()
    return {"runs": runs, "parent": str(parent), "left": made.exists()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
