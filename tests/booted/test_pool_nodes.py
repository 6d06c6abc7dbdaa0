"""Issue 51: nodeagent as a node runs it. Three nodes booted with systemd as PID 1, Redis and
nodeagent installed by the Ansible role (tests/booted/conftest.py); the shipped unit runs the
agent (no CAP_DAC_OVERRIDE, UMask=0027, the sandbox), Debian's own Python runs it, munged from
Debian's package signs the requests. Each test acts as an operator or a user would, on the nodes.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
from typing import Any

import pytest

from tests.helpers.booted import ROOT, SHARED, BootedPool, Node
from tests.helpers.cluster import wait_for

pytestmark = [pytest.mark.booted, pytest.mark.timeout(600)]
PYTHON = ROOT / ".venv" / "bin" / "python"  # this checkout's venv (torch), seen by every node
EVERY = 6  # steps between saves of the FSDP2 job


def jobs(pool: BootedPool) -> dict[str, dict[str, Any]]:
    return {j["job"]: j for j in json.loads(pool.ctl("jobs", "--json"))["jobs"]}


def status(pool: BootedPool, job: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(pool.ctl("--job", job, "status", "--json"))
    return found


def rank_lines(pool: BootedPool, job: str, generation: int) -> list[dict[str, Any]]:
    """The JSON lines the ranks of `generation` printed, from every node's rank logs."""
    found = []
    for node in pool.nodes:
        text = node.sh(f"cat /var/log/nodeagent/{job}/{generation}/rank-*.log", check=False).stdout
        found += [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return found


def test_the_role_makes_a_pool_that_runs_each_job_as_its_submitter(pool: BootedPool) -> None:
    """Every node's agent runs under the shipped unit and joins the pool; alice's and bob's
    jobs run as alice and bob (MUNGE says who submitted), and the ranks' output is in the
    journal."""
    for node in pool.nodes:
        unit = node.systemctl("show", "-p", "ActiveState,User,ExecStart", "nodeagent").stdout
        assert "ActiveState=active" in unit and "/opt/nodeagent/venv/bin/nodeagent" in unit
        python = node.sh("readlink -f /opt/nodeagent/venv/bin/python").stdout.strip()
        assert python == "/usr/bin/python3.11", python  # Debian's own
    nodes = json.loads(pool.ctl("nodes", "--json"))["nodes"]
    assert sorted(n["name"] for n in nodes) == ["n1", "n2", "n3"], nodes
    for user in ("alice", "bob"):
        script = f"echo {user}-runs-as-uid=$(id -u) && sleep 30"
        pool.ctl(
            "submit",
            f"--name=who-{user}",
            "--nodes=1",
            "--",
            "/bin/sh",
            "-c",
            script,
            user=user,
        )
    for user, uid in (("alice", 2001), ("bob", 2002)):
        said = f"{user}-runs-as-uid={uid}"

        def in_journal(said: str = said) -> Node | None:
            return next((n for n in pool.nodes if said in n.journal()), None)

        wait_for(in_journal, 120, f"{said} in a node's journal")
        assert jobs(pool)[f"who-{user}"]["user"] == user
    for user in ("alice", "bob"):
        pool.ctl("cancel", f"who-{user}", user=user)


def test_a_job_runs_in_its_users_private_home_directory(pool: BootedPool) -> None:
    """Issue 62: alice's home directory is hers alone (0700, as Debian 12 makes homes; on the
    nodes' shared file system, as an NFS home), and her job runs in it: the agent, root without
    CAP_DAC_OVERRIDE under the shipped unit, enters it as alice. bob's submit naming it is
    refused, naming the directory, before anything is stored."""
    home = f"{SHARED}/alice"
    pool.node("n1").sh(
        f"install -d -o alice -g alice -m 0700 {home} {home}/work"
        f" && echo alice-note > {home}/work/note && chown alice: {home}/work/note"
        f" && chmod 0600 {home}/work/note"
    )
    script = "echo in=$(pwd) said=$(cat note) && sleep 30"
    submit = ("submit", "--nodes=1", f"--workdir={home}/work", "--", "/bin/sh", "-c", script)
    pool.ctl(submit[0], "--name=private-alice", *submit[1:], user="alice")
    said = f"in={home}/work said=alice-note"
    wait_for(lambda: any(said in n.journal() for n in pool.nodes), 120, f"{said!r} in a journal")
    pool.ctl("cancel", "private-alice", user="alice")

    quoted = " ".join(shlex.quote(a) for a in ("--name=private-bob", *submit[1:]))
    ctl = f"nodeagentctl --redis {pool.url('submitter')}"  # on PATH: the role links it
    refused = pool.node("n1").sh(f"{ctl} submit {quoted}", user="bob", check=False)
    assert refused.returncode == 2, refused
    assert f"working_dir {home}/work cannot be reached (Permission denied)" in refused.stderr
    assert "private-bob" not in jobs(pool)


def _fsdp_spec(job: str, nodes: int, steps: int) -> dict[str, Any]:
    return {
        "id": job,
        "entrypoint": [
            str(PYTHON),
            str(ROOT / "examples" / "train_fsdp.py"),
            *("--steps", str(steps), "--save-every", str(EVERY), "--step-time", "0.15"),
            "--digest",
        ],
        "min_nodes": nodes - 1,
        "max_nodes": nodes,
        "target_nodes": nodes,
        "max_restarts": 5,
        "env": {"OMP_NUM_THREADS": "1"},
        "checkpoint": {"memory_size": "64MiB", "replicas": 1},
    }


def _submit_spec(pool: BootedPool, user: str, spec: dict[str, Any]) -> None:
    path = f"/tmp/{spec['id']}.json"
    pool.node("n1").sh(f"echo {shlex.quote(json.dumps(spec))} > {path} && chmod 644 {path}")
    pool.ctl("submit", path, user=user)


def _restored(pool: BootedPool, job: str, generation: int, world: int) -> dict[str, Any]:
    """Rank 0's restore in `generation`, once every rank restored the same step."""

    def probe() -> dict[str, Any] | None:
        found = [x for x in rank_lines(pool, job, generation) if x["event"] == "restored"]
        if len(found) < world:
            return None
        assert len({x["step"] for x in found}) == 1, f"ranks restored different steps: {found}"
        return next(x for x in found if x["rank"] == 0)

    return wait_for(probe, 180, f"generation {generation} of {job} to restore")


def _first_restored(pool: BootedPool, job: str, after: int) -> tuple[int, dict[str, Any]]:
    """The first generation after `after` whose ranks all restored (one step), and rank 0's
    restore in it."""

    def probe() -> tuple[int, dict[str, Any]] | None:
        for generation in range(after + 1, status(pool, job)["generation"] + 1):
            found = [x for x in rank_lines(pool, job, generation) if x["event"] == "restored"]
            if found and len(found) >= found[0]["world"]:
                assert len({x["step"] for x in found}) == 1, f"ranks restored apart: {found}"
                return generation, next(x for x in found if x["rank"] == 0)
        return None

    return wait_for(probe, 180, f"a generation of {job} after {after} to restore")


def _tiers_said(pool: BootedPool, job: str, generation: int, nodes: int) -> set[str]:
    """The tiers every node's agent said its ranks restored `generation` from."""

    def probe() -> list[dict[str, Any]] | None:
        lines = pool.ctl("--job", job, "events", "--json").splitlines()
        said = [e for line in lines if (e := json.loads(line))["type"] == "checkpoint_restored"]
        said = [e for e in said if e["generation"] == generation]
        return said if len(said) >= nodes else None

    return {e["data"]["tier"] for e in wait_for(probe, 60, f"{nodes} restore events")}


def _saved(pool: BootedPool, job: str, upto: int, step: int) -> str:
    """The digest rank 0 printed when it saved `step`, in a generation up to `upto` (read
    again until found: a node's `podman exec` can fail for a moment)."""

    def probe() -> str | None:
        for generation in range(1, upto + 1):
            for x in rank_lines(pool, job, generation):
                if x["event"] == "saved" and x["rank"] == 0 and x["step"] == step:
                    return str(x["digest"])
        return None

    return wait_for(probe, 30, f"rank 0's save of step {step}")


def _committed(pool: BootedPool, job: str, at_least: int) -> int:
    def probe() -> int | None:
        step = (status(pool, job).get("checkpoints") or {}).get("committed")
        return step if step is not None and step >= at_least else None

    try:
        return wait_for(probe, 180, f"a committed step >= {at_least}")
    except AssertionError:
        said = {n.name: n.journal()[-3000:] for n in pool.nodes}
        raise AssertionError(f"{jobs(pool).get(job)}\n{status(pool, job)}\n{said}") from None


def _after_a_save(pool: BootedPool, job: str, generation: int) -> None:
    """Return once rank 0 printed a save newer than any printed before the call: a fault
    injected now lands between two saves (one every EVERY steps, about a second), not while
    a save's digest is being gathered from every rank (--digest): a rank killed then leaves a
    save whole on every rank and rank 0's digest of it unprinted."""

    def saves() -> list[int]:
        lines = rank_lines(pool, job, generation)
        return [x["step"] for x in lines if x["event"] == "saved" and x["rank"] == 0]

    before = max(saves(), default=-1)
    wait_for(lambda: max(saves(), default=-1) > before, 60, f"rank 0 of {job} to save again")


def _reformed(pool: BootedPool, job: str, after: int, world: int) -> int:
    def probe() -> int | None:
        found = status(pool, job)
        good = found["generation"] > after and found["world_size"] == world
        return found["generation"] if good and found["state"] == "running" else None

    return wait_for(probe, 180, f"{job} re-formed at world {world} after generation {after}")


def _node_of_rank(pool: BootedPool, job: str, rank: int) -> Node:
    for node in pool.nodes:
        if node.sh(f"ls /var/log/nodeagent/{job}/rank-{rank}.log", check=False).returncode == 0:
            return node
    raise AssertionError(f"no node has rank {rank}'s log")


def test_the_memory_tier_restores_a_lost_worker_and_a_lost_node_bitwise(pool: BootedPool) -> None:
    """alice's FSDP2 job with the memory tier and one copy of each save, on all three nodes,
    the default memory_dir and job user: a worker SIGKILLed, then a whole node's power cut.
    Each time the job re-forms and every rank restores from memory (its own, then its peers'
    copies), bit for bit the state saved, no older than the committed step."""
    job = "fsdp-alice"
    _submit_spec(pool, "alice", _fsdp_spec(job, nodes=3, steps=2000))
    committed = _committed(pool, job, 2 * EVERY)
    generation = status(pool, job)["generation"]

    victim = _node_of_rank(pool, job, 2)
    _after_a_save(pool, job, generation)
    victim.sh("pkill -KILL -u alice -f train_fsdp.py")
    generation = _reformed(pool, job, generation, world=3)
    back = _restored(pool, job, generation, world=3)
    assert back["step"] >= committed, back
    assert back["digest"] == _saved(pool, job, generation - 1, back["step"])
    assert _tiers_said(pool, job, generation, 3) == {"memory"}

    committed = _committed(pool, job, back["step"] + 2 * EVERY)
    lost = _node_of_rank(pool, job, 1)
    _after_a_save(pool, job, generation)
    lost.kill()
    try:
        generation = _reformed(pool, job, generation, world=2)
        back = _restored(pool, job, generation, world=2)
        assert back["step"] >= committed, back
        assert back["digest"] == _saved(pool, job, generation - 1, back["step"])
        assert _tiers_said(pool, job, generation, 2) == {"memory"}  # from peers' copies
    finally:
        lost.boot()
    # Rebooted, the node's agent starts with it (enabled by the role), rejoins its pool, and
    # the job grows back onto it.
    generation = _reformed(pool, job, generation, world=3)
    assert lost.name in status(pool, job)["members"]
    back = _restored(pool, job, generation, world=3)
    assert back["digest"] == _saved(pool, job, generation - 1, back["step"])
    pool.ctl("cancel", job, user="alice")


def test_a_persistent_tier_written_as_its_user_outlives_every_nodes_memory(
    pool: BootedPool,
) -> None:
    """alice's job keeps a persistent tier in her own directory of the nodes' shared file
    system (issue 51: a submitted job's persist_dir, copied as its user, never as root). Every
    node's agent and workers are killed at once and the memory tiers wiped: the unit restarts
    each agent, and the job resumes from the persistent tier, bit for bit, no older than the
    step it recorded as persisted. Then `systemctl stop nodeagent` on a member: its ranks take
    the emergency save and the job re-forms without it, losing no step; started again, it
    grows back."""
    job = "persist-alice"
    n1 = pool.node("n1")
    n1.sh(f"install -d -o alice -g alice -m 0700 {SHARED}/alice")
    spec = _fsdp_spec(job, nodes=3, steps=4000)
    spec["checkpoint"] |= {"persist_dir": f"{SHARED}/alice/ckpt", "persist_every": 2}
    _submit_spec(pool, "alice", spec)
    _persisted(pool, job, 2 * EVERY)
    # Each node's copies are alice's, none root's: made by a program run as alice.
    assert n1.sh(f"find {SHARED}/alice -not -user alice").stdout == ""
    assert n1.sh(f"ls {SHARED}/alice/ckpt").stdout.split()[0].startswith("step-")

    generation = status(pool, job)["generation"]
    persisted = status(pool, job)["checkpoints"]["persisted"]
    _on_every_node(pool, "systemctl kill -s KILL nodeagent; rm -rf /dev/shm/nodeagent/*")
    killed = generation
    generation = _reformed(pool, job, killed, world=3)  # Restart=on-failure, 5 s later
    # The agents come back one by one: two can form a generation (min_nodes 2) that restores
    # and saves to memory before the third joins. The first restore is the one to check.
    first, back = _first_restored(pool, job, killed)
    assert back["step"] >= persisted, back
    assert back["digest"] == _saved(pool, job, first - 1, back["step"])
    assert _tiers_said(pool, job, first, back["world"]) == {"persistent"}

    member = pool.node("n3")
    _committed(pool, job, back["step"] + EVERY)
    member.systemctl("stop", "nodeagent")
    try:
        stopped = generation
        generation = _reformed(pool, job, generation, world=2)
        back = _restored(pool, job, generation, world=2)
        # every rank saved the step it reached as it was told to stop: that step, none lost
        reached = {x["step"] for x in rank_lines(pool, job, stopped) if x["event"] == "stopped"}
        assert reached == {back["step"]}, reached
        assert back["digest"] == _saved(pool, job, stopped, back["step"])
    finally:
        member.systemctl("start", "nodeagent")
    _reformed(pool, job, generation, world=3)
    pool.ctl("cancel", job, user="alice")


def _persisted(pool: BootedPool, job: str, at_least: int) -> int:
    """The step the job's record names as persisted, once it is `at_least`."""

    def probe() -> int | None:
        step = (status(pool, job).get("checkpoints") or {}).get("persisted")
        return step if step is not None and step >= at_least else None

    return wait_for(probe, 240, f"a persisted step >= {at_least}")


def _on_every_node(pool: BootedPool, script: str) -> None:
    """`script` on every node at once (one `podman exec` each, side by side)."""
    with concurrent.futures.ThreadPoolExecutor(len(pool.nodes)) as run:
        for done in run.map(lambda n: n.sh(script, check=False), pool.nodes):
            assert done.returncode == 0, done
