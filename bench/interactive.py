"""How long interactive work takes on an idle pool: `alloc` to its shell, `run -- hostname`
across 8 nodes, `stacks` of an 8-rank job, the PAM check of an ssh login.

    sudo .venv/bin/python bench/interactive.py [--nodes 8] [--repeat 5] [--out FILE]

A real redis-server and munged, --nodes agents on this machine (a pool under pool.auth: munge),
and a Unix user the bench creates, who runs every command as a user would (its own
`nodeagentctl` process, interpreter start-up included: what a person at a terminal waits for):

- alloc: `nodeagentctl alloc --nodes 1 -- sh -c 'date +%s.%N'`, from the command's start to its
  shell's first word (the allocation admitted, its holder started, the nodes' reports read);
- run: `nodeagentctl run -- hostname` in an allocation of every node, start to exit;
- stacks: `nodeagentctl stacks JOB` of a job of one Python rank on each node, start to exit;
- ssh login check: sshd's PAM check as pam_exec runs it, twice (the account stack, then the
  session's opening), of a user holding the allocation, the login's process taken into its
  cgroup, start to exit.

Each is run --repeat times; the median and the spread are printed and written to
bench/results/interactive.json (with the machine's load at the start: the agents share its
cores with the commands).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.helpers.cluster import RedisServer, wait_for  # noqa: E402
from tests.helpers.munge import MungeDaemon  # noqa: E402
from tests.helpers.pool import PoolCluster, munge_pool  # noqa: E402
from tests.helpers.users import User, reachable_dir, unix_users  # noqa: E402

LOOP = """
import time
def train_step():
    time.sleep(0.05)
while True:
    train_step()
"""


def timed(what: Callable[[], subprocess.CompletedProcess[str]]) -> tuple[float, str]:
    began = time.time()
    done = what()
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {done.stdout}{done.stderr}")
    return time.time() - began, done.stdout


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
    }


def login_checks(pool: PoolCluster, user: User, repeat: int) -> list[float]:
    """What sshd's PAM check adds to a login of `user`, who holds a job here: a shell runs it
    as pam_exec does (its child, as root) in the account stack, then at the session's opening,
    where the agent takes the shell into the job's cgroup."""
    socket = pool.directory / "state" / "login.sock"
    check = [sys.executable, "-I", "-m", "nodeagent.cli.pamadopt", "--socket", str(socket)]
    env = {**os.environ, "PAM_USER": user.name}
    script = 'PAM_TYPE=account "$@" && PAM_TYPE=open_session "$@"; echo "check $?"'
    argv = ["/bin/sh", "-c", script, "login", *check]

    def login() -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    samples = []
    for _ in range(repeat):
        took, out = timed(login)
        assert out == "check 0\n", out
        samples.append(took)
    return samples


def bench(pool: PoolCluster, munged: MungeDaemon, user: User, nodes: int, repeat: int) -> Any:
    where = ["--redis", pool.redis_url, "--pool", pool.pool, "--munge-socket", munged.socket]
    results: dict[str, Any] = {}

    shell: list[float] = []
    for i in range(repeat):
        began = time.time()
        done = user.nodeagentctl(
            *where, "alloc", "--name", f"shell-{i}", "--nodes", "1", "--",
            "/bin/sh", "-c", "date +%s.%N",
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"alloc failed: {done.stdout}{done.stderr}")
        shell.append(float(done.stdout.split()[-1]) - began)
        wait_for(lambda: pool.placements() and not any(pool.placements().values()), 60, "free")
    results["alloc_to_shell"] = summary(shell)

    held = user.start_nodeagentctl(
        *where, "alloc", "--name", "held", "--nodes", str(nodes), "--", "sleep", "3600"
    )
    try:
        pool.wait_job("held", "running", world=nodes, timeout=120)
        runs = []
        for _ in range(repeat):
            took, out = timed(
                lambda: user.nodeagentctl(*where, "--job", "held", "run", "--", "hostname")
            )
            assert len(out.splitlines()) == nodes, out
            runs.append(took)
        results[f"run_hostname_{nodes}_nodes"] = summary(runs)
        results["ssh_login_check"] = summary(login_checks(pool, user, repeat))
    finally:
        held.terminate()
        held.wait(60)
        if held.stdout is not None:
            held.stdout.close()
    wait_for(lambda: not any(pool.placements().values()), 60, "the nodes free")

    script = pool.directory / "loop.py"
    script.write_text(LOOP)
    submitted = user.nodeagentctl(
        *where, "submit", "--name", "looping", "--nodes", str(nodes), "--workdir",
        str(pool.directory), "--", sys.executable, str(script),
    )  # fmt: skip
    if submitted.returncode != 0:
        raise SystemExit(f"submit failed: {submitted.stderr}")
    pool.wait_job("looping", "running", world=nodes, timeout=120)
    stacks = []
    for _ in range(repeat):
        took, out = timed(lambda: user.nodeagentctl(*where, "stacks", "looping"))
        assert out.count("train_step") == nodes, out
        stacks.append(took)
    results[f"stacks_{nodes}_ranks"] = summary(stacks)
    user.nodeagentctl(*where, "cancel", "looping")
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "interactive.json"))
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: the bench makes a Unix user, and the agents switch to it")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="na-bench-redis-") as redis_dir:
        redis = RedisServer(Path(redis_dir))
        redis.start()
        munged = MungeDaemon().start()
        try:
            with (
                unix_users("alice") as users,
                reachable_dir("na-bench-interactive-") as shared,
                munge_pool(
                    redis.url, shared, "interactive", munged.socket, [users["alice"].name]
                ) as pool,
            ):
                names = [f"n{i}" for i in range(args.nodes)]
                for name in names:  # what the role's nodeagent_ssh_adopt adds to the unit
                    pool.caps[name] = ["CAP_SYS_NICE"]
                pool.start(*names)
                pool.wait_nodes(args.nodes, timeout=120)
                results = bench(pool, munged, users["alice"], args.nodes, args.repeat)
        finally:
            munged.stop()
            redis.stop()
    doc = {
        "bench": "interactive",
        "nodes": args.nodes,
        "repeat": args.repeat,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_at_start": round(load, 2),
        "command": "sudo .venv/bin/python bench/interactive.py "
        f"--nodes {args.nodes} --repeat {args.repeat}",
        "results": results,
    }
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    for name, figures in results.items():
        print(f"{name:28} median {figures['median_s']:.3f} s  (min {figures['min_s']:.3f}, "
              f"max {figures['max_s']:.3f})")  # fmt: skip
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
