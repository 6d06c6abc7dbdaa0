"""The Ansible role, linted and applied for real to localhost (into a prefix directory)."""

from __future__ import annotations

import getpass
import grp
import json
import os
import pwd
import re
import secrets
import shlex
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import jinja2
import jinja2.meta
import pytest
import tomllib
import yaml

from nodeagent import __version__
from nodeagent.config.load import load_settings
from nodeagent.config.settings import (
    Config,
    DurabilityConfig,
    NodeSettings,
    Operators,
    PoolConfig,
)
from tests.helpers.cluster import RedisServer, wait_for
from tests.helpers.runas import AS_TESTER

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent


def tool(name: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is missing: pip install -e '.[test]' (.ci/setup does)")
    return subprocess.run(
        [str(path), *args], cwd=ANSIBLE, capture_output=True, text=True, timeout=timeout
    )


def test_lint_production_profile() -> None:
    result = tool("ansible-lint", "--profile", "production", "--offline", "--nocolor", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("playbook", ["site.yml", "rolling-upgrade.yml", "redis.yml"])
def test_syntax(playbook: str) -> None:
    result = tool("ansible-playbook", "--syntax-check", playbook)
    assert result.returncode == 0, result.stdout + result.stderr


def localhost_inventory(tmp_path: Path, group: str = "nodeagent_nodes") -> Path:
    inventory = tmp_path / f"{group}.yml"
    inventory.write_text(
        json.dumps(
            {
                group: {
                    "hosts": {
                        "localhost": {
                            "ansible_connection": "local",
                            "ansible_python_interpreter": sys.executable,
                        }
                    }
                }
            }
        )
    )
    return inventory


def prefix_install(prefix: Path, redis_url: str, job_id: str) -> dict[str, Any]:
    """The role's variables for an install under `prefix` by whoever runs the tests."""
    return {
        "ansible_become": False,
        "nodeagent_prefix": str(prefix),
        "nodeagent_python": sys.executable,
        "nodeagent_node_name": "ansible-node",
        "nodeagent_node_address": "127.0.0.1",
        "nodeagent_redis_url": redis_url,
        "nodeagent_metrics_listen": "127.0.0.1:0",
        # the workers run as whoever runs the agent here (said in the job section, root needs
        # job.allow_root): the test's Python may be unreadable to a system user, and the test
        # creates no user on this machine
        "nodeagent_job_user": "",
        "nodeagent_config_owner": getpass.getuser(),
        "nodeagent_config_group": grp.getgrgid(os.getegid()).gr_name,
        "nodeagent_job": {
            "id": job_id,
            "entrypoint": [sys.executable, "-c", "print('trained')"],
            "nproc_per_node": 1,
            "max_nodes": 1,
            **AS_TESTER,
        },
        "nodeagent_timing": {"heartbeat_interval": "200ms", "lease_ttl": "1s"},
        "nodeagent_health": {"gpu": "auto"},
    }


@pytest.mark.parametrize("form", ["pinned", "pool", "munge"])
def test_check_mode_against_localhost(tmp_path: Path, job_id: str, form: str) -> None:
    """--check --diff: what the role would change, without changing anything (and, with
    nodeagent_munge_install, without showing the key)."""
    prefix = tmp_path / "root"
    extra = prefix_install(prefix, "redis://127.0.0.1:6379/0", job_id)
    if form != "pinned":
        del extra["nodeagent_job"]
    if form == "munge":
        extra.update(munge_install(munge_key(tmp_path / "munge.key")))
    result = tool(
        "ansible-playbook",
        *("-i", str(localhost_inventory(tmp_path)), "site.yml", "--check", "--diff"),
        *("-e", json.dumps(extra)),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "failed=0" in result.stdout and not prefix.exists()
    if form == "munge":
        assert "Install the site's MUNGE key" in result.stdout
        assert (tmp_path / "munge.key").read_text() not in result.stdout + result.stderr


def test_the_role_refuses_the_old_default_password(tmp_path: Path, job_id: str) -> None:
    extra = prefix_install(tmp_path / "root", "redis://nodeagent:change-me@10.0.0.2:6379/0", job_id)
    result = tool(
        "ansible-playbook",
        *("-i", str(localhost_inventory(tmp_path)), "site.yml", "--check"),
        *("-e", json.dumps(extra)),
    )
    assert result.returncode != 0 and "carries the password 'change-me'" in result.stdout


def munge_key(path: Path) -> Path:
    """A MUNGE key on the controller: text here, so that a --diff of it would show it."""
    path.write_text(secrets.token_hex(64))
    path.chmod(0o600)
    return path


def munge_owner() -> tuple[str, str]:
    """Who owns the installed key: munge, as on a node, when the tests run as root."""
    if os.geteuid() == 0:
        return "munge", "munge"  # Debian's munge (.ci/setup installs it)
    return getpass.getuser(), grp.getgrgid(os.getegid()).gr_name


def munge_install(key: Path) -> dict[str, Any]:
    user, group = munge_owner()
    return {
        "nodeagent_munge_install": True,
        "nodeagent_munge_key_file": str(key),
        "nodeagent_munge_user": user,
        "nodeagent_munge_group": group,
    }


MUNGE_PLAY = [
    {
        "name": "The role's MUNGE steps alone",
        "hosts": "nodeagent_nodes",
        "gather_facts": False,
        "tasks": [{"ansible.builtin.import_role": {"name": "nodeagent", "tasks_from": "munge"}}],
    }
]


def two_local_nodes(tmp_path: Path) -> Path:
    """node-a and node-b, both this machine, each installing under a prefix of its own."""
    hosts = {
        name: {
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
            "nodeagent_prefix": str(tmp_path / name),
        }
        for name in ("node-a", "node-b")
    }
    inventory = tmp_path / "two.yml"
    inventory.write_text(json.dumps({"nodeagent_nodes": {"hosts": hosts}}))
    return inventory


def test_the_role_puts_one_munge_key_on_every_node_and_never_shows_it(tmp_path: Path) -> None:
    """tasks/munge.yml on two nodes: the controller's key on each, munge's alone (0400 in a
    0700 directory), not in the output even with --diff -v; a second run changes nothing, a new
    key replaces it on both and restarts munged (the handler; skipped in a prefix)."""
    key = munge_key(tmp_path / "munge.key")
    playbook = tmp_path / "munge-play.yml"
    playbook.write_text(json.dumps(MUNGE_PLAY))
    inventory = two_local_nodes(tmp_path)
    variables = json.dumps(munge_install(key))

    def play() -> subprocess.CompletedProcess[str]:
        args = ("-i", str(inventory), str(playbook), "--diff", "-v", "-e", variables)
        done = tool("ansible-playbook", *args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert key.read_text() not in done.stdout + done.stderr  # no_log, no diff
        return done

    def installed() -> None:
        owner = pwd.getpwnam(munge_owner()[0]).pw_uid
        for node in ("node-a", "node-b"):
            directory = tmp_path / node / "etc/munge"
            installed = (directory / "munge.key").stat()
            assert (directory / "munge.key").read_bytes() == key.read_bytes()
            assert (stat.S_IMODE(installed.st_mode), installed.st_uid) == (0o400, owner)
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700

    first = play()
    installed()
    assert "RUNNING HANDLER [nodeagent : Restart munge]" in first.stdout
    again = play()
    assert re.findall(r"changed=(\d+)", again.stdout) == ["0", "0"]
    assert "Restart munge" not in again.stdout
    munge_key(key)  # the site's new key
    renewed = play()
    installed()
    assert "RUNNING HANDLER [nodeagent : Restart munge]" in renewed.stdout


@pytest.mark.parametrize("named", [False, True], ids=["unset", "missing"])
def test_the_role_refuses_munge_without_its_key(tmp_path: Path, job_id: str, named: bool) -> None:
    """nodeagent_munge_install without a key file on the controller: the play fails before it
    changes anything on the node, naming the variable."""
    prefix = tmp_path / "root"
    extra = {
        **prefix_install(prefix, "redis://127.0.0.1:6379/0", job_id),
        **munge_install(tmp_path / "missing.key"),
    }
    if not named:
        extra["nodeagent_munge_key_file"] = ""
    result = tool(
        "ansible-playbook",
        *("-i", str(localhost_inventory(tmp_path)), "site.yml", "-e", json.dumps(extra)),
    )
    assert result.returncode != 0, result.stdout[-3000:]
    assert "nodeagent_munge_key_file" in result.stdout
    assert "names no file on the controller" in result.stdout, result.stdout[-3000:]
    assert not prefix.exists()


# Conditions Ansible evaluates as Jinja without braces.
CONDITIONS = frozenset({"when", "that", "until", "changed_when", "failed_when"})
# What Ansible itself defines (facts, magic variables, lookup's function, a loop's item).
ANSIBLES_OWN = frozenset(
    {
        "ansible_check_mode",
        "ansible_facts",
        "ansible_managed",
        "inventory_hostname_short",
        "item",
        "lookup",
        "omit",
    }
)
# Variables whose role default is "" and that the example group_vars may leave unset, and why.
UNSET_IN_THE_EXAMPLE = {
    "nodeagent_prefix": "an install under a directory (tests, staging)",
    "nodeagent_pip_extra_args": "nodes that reach PyPI need no more pip options",
    "nodeagent_redis_ca": "only for a rediss:// URL",
    "nodeagent_pool_auth": "'' is the config's default (munge for a pool node)",
    "nodeagent_pool_munge_socket": "'' is Debian's munged socket",
    "nodeagent_pool_reserve_after": "'' is the config's default (5m)",
    "nodeagent_container_oci_runtime": "only on a cgroup v1/v2 hybrid (shown commented)",
    "nodeagent_munge_key_file": "only with nodeagent_munge_install (shown commented)",
    "nodeagent_token_key_file": "only for a pool that takes API tokens (shown commented)",
    "nodeagent_token_max_lifetime": "'' is the config's default (1d)",
    "nodeagent_api_uid": "'' lets each host pick, or a directory service has it (shown commented)",
    "nodeagent_api_listen": "'' serves the API host's Unix socket only",
    "nodeagent_api_tls_cert": "only with nodeagent_api_listen",
    "nodeagent_api_tls_key": "only with nodeagent_api_listen",
    "redis_admin_password": "no admin user unless a site wants one",
    "redis_tls_cert": "only with redis_tls",
    "redis_tls_key": "only with redis_tls",
    "redis_tls_ca": "only with redis_tls",
    "redis_replica_of": "only on a replica, as a host variable (shown commented)",
    "redis_sentinel_primary": "only with redis_sentinel (shown commented)",
}


class _AnyName(dict[str, Any]):
    """Every filter and test name, for parsing Ansible's Jinja with plain Jinja."""

    def get(self, key: str, default: Any = None) -> Any:
        return lambda *args, **kwargs: None

    def __contains__(self, key: object) -> bool:
        return True


def referenced_variables() -> tuple[set[str], set[str]]:
    """The variables the playbooks and roles (tasks, handlers, defaults, vars, templates) read,
    and those they bind themselves (register, a play's or task's vars)."""
    env = jinja2.Environment()
    env.filters = env.tests = _AnyName()

    def names(text: str) -> set[str]:
        return set(jinja2.meta.find_undeclared_variables(env.parse(text)))

    read: set[str] = set()
    bound: set[str] = set()

    def walk(node: Any, key: str | None = None) -> None:
        if isinstance(node, dict):
            for name, value in node.items():
                if name == "register":
                    bound.add(value)
                if name == "vars" and isinstance(value, dict):
                    bound.update(value)
                walk(value, name)
        elif isinstance(node, list):
            for value in node:
                walk(value, key)
        elif isinstance(node, str) and key in CONDITIONS:
            read.update(names("{{ (" + node + ") }}"))
        elif isinstance(node, str) and ("{{" in node or "{%" in node):
            read.update(names(node))

    for path in (*ANSIBLE.glob("*.yml"), *ANSIBLE.glob("roles/*/*/*.yml")):
        walk(yaml.safe_load(path.read_text()))
    for path in ANSIBLE.glob("roles/*/templates/*.j2"):
        read.update(names(path.read_text()))
    return read, bound


def test_the_example_group_vars_sets_what_the_roles_leave_empty() -> None:
    """Every variable the roles and playbooks read either has a default or is set in
    inventory/group_vars/all.yml; a default of "" (a password, a choice the role cannot make)
    is set there too unless UNSET_IN_THE_EXAMPLE says why not. And every variable the example
    sets is one the roles read (no misspelled name that silently does nothing)."""
    read, bound = referenced_variables()
    defaults: dict[str, Any] = {}
    for path in ANSIBLE.glob("roles/*/defaults/main.yml"):
        defaults.update(yaml.safe_load(path.read_text()))
    derived: set[str] = set()
    for path in ANSIBLE.glob("roles/*/vars/main.yml"):
        derived.update(yaml.safe_load(path.read_text()))
    example = set(yaml.safe_load((ANSIBLE / "inventory/group_vars/all.yml").read_text()))
    assert {"nodeagent_redis_url", "redis_submitter_password", "nodeagent_munge_key_file"} <= read
    assert set(UNSET_IN_THE_EXAMPLE) <= {name for name, value in defaults.items() if value == ""}
    no_default = read - set(defaults) - derived - bound - ANSIBLES_OWN
    empty = {name for name in read if defaults.get(name) == ""} - set(UNSET_IN_THE_EXAMPLE)
    assert no_default | empty <= example, sorted((no_default | empty) - example)
    assert example <= read | set(defaults), sorted(example - read - set(defaults))


def run_drain_step(config: Path, node: str) -> subprocess.CompletedProcess[str]:
    """rolling-upgrade.yml's drain pre_task, rendered for `node` with this venv's nodeagentctl."""
    play = yaml.safe_load((ANSIBLE / "rolling-upgrade.yml").read_text())[0]
    drain = next(t for t in play["pre_tasks"] if t["name"].startswith("Drain the node"))
    rendered = (
        drain["ansible.builtin.command"]["cmd"]
        .replace("{{ nodeagent_ctl }}", f"{BIN / 'nodeagentctl'} --config {config}")
        .replace("{{ nodeagent_node_name }}", node)
    )
    return subprocess.run(shlex.split(rendered), capture_output=True, text=True, timeout=120)


def test_rolling_upgrade_drain_step_against_running_agents(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """The playbook's own pre_task, rendered for one node, drains it from a live job."""
    from tests.helpers.cluster import local_cluster

    with local_cluster(
        redis_server.url,
        tmp_path,
        job=job_id,
        max_nodes=3,
        timing={"heartbeat_interval": "200ms", "lease_ttl": "1s"},
    ) as cluster:
        cluster.start("a", "b", "c")
        before = cluster.wait_running(3)
        drained = run_drain_step(cluster.config_path("c"), "c")
        assert drained.returncode == 0, drained.stderr
        after = cluster.wait_running(2, after_generation=before["generation"])
        # members are listed in rank order, which follows who joined first: any order
        assert sorted(after["members"]) == ["a", "b"] and after["restart_count"] == 0
        # c's worker got SIGTERM and exited within the grace period (it records "stop")
        assert any(r["event"] == "stop" and r["node"] == "c" for r in cluster.records())
        c = next(n for n in after["nodes"] if n["name"] == "c")
        assert c["cordon"]["reason"] == "rolling upgrade"


CONFIG_PLAY = [
    {
        "name": "Some of the role's steps alone",
        "hosts": "nodeagent_nodes",
        "gather_facts": False,
    }
]


def _part(name: str) -> dict[str, Any]:
    return {"ansible.builtin.import_role": {"name": "nodeagent", "tasks_from": name}}


POOL_VARS: dict[str, Any] = {
    "nodeagent_pool_name": "research",
    "nodeagent_pool_labels": {"gpu": "h100", "rack": "r12"},
    "nodeagent_pool_users": ["alice", "bob"],
    "nodeagent_pool_groups": ["ml"],
    "nodeagent_pool_reserve_after": "10m",
    "nodeagent_pool_auth": "munge",
    "nodeagent_pool_munge_socket": "/run/munge/other.socket",
    "nodeagent_pool_operators": {"users": ["ops"], "groups": ["hpc-admin"]},
    "nodeagent_pool_durability": {"replicas": 1, "timeout": "2s"},
}


def configure(
    tmp_path: Path, job_id: str, parts: tuple[str, ...] = ("pinning", "config"), **variables: Any
) -> subprocess.CompletedProcess[str]:
    """The role's `parts` (tasks/<part>.yml) into tmp_path/root with this venv's nodeagent: by
    default the unpin guard, the --syntax-only validation, then the full `config check` (the
    pinned job's program is this Python)."""
    extra = {
        **prefix_install(tmp_path / "root", "redis://127.0.0.1:6379/0", job_id),
        "nodeagent_venv": str(BIN.parent),
        **variables,
    }
    (tmp_path / "root/etc/nodeagent").mkdir(parents=True, exist_ok=True)
    playbook = tmp_path / "config-play.yml"
    play = [{**CONFIG_PLAY[0], "tasks": [_part(part) for part in parts]}]
    playbook.write_text(json.dumps(play))
    return tool(
        "ansible-playbook",
        *("-i", str(localhost_inventory(tmp_path)), str(playbook), "-e", json.dumps(extra)),
    )


def rendered(tmp_path: Path) -> tuple[dict[str, Any], NodeSettings]:
    data = yaml.safe_load((tmp_path / "root/etc/nodeagent/config.yaml").read_text())
    return data, load_settings(data)


def test_a_pool_node_gets_a_config_without_a_job(tmp_path: Path, job_id: str) -> None:
    """No nodeagent_job (the role's default): a pool node, its pool: section from the role's
    variables, validated and checked on this node by the role's own steps."""
    result = configure(tmp_path, job_id, nodeagent_job={}, **POOL_VARS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "Check this node's part of the configuration" in result.stdout
    assert "Not checked on this node yet" not in result.stdout
    data, settings = rendered(tmp_path)
    assert "job" not in data and not isinstance(settings, Config)
    assert settings.pool == PoolConfig(
        name="research",
        labels={"gpu": "h100", "rack": "r12"},
        users=("alice", "bob"),
        groups=("ml",),
        allow_root=False,
        reserve_after=600.0,
        auth="munge",
        munge_socket="/run/munge/other.socket",
        operators=Operators(users=("ops",), groups=("hpc-admin",)),
        durability=DurabilityConfig(replicas=1, timeout=2.0),
    )
    assert settings.node.name == "ansible-node" and settings.timing.lease_ttl == 1.0


def test_a_pinned_node_keeps_its_job_until_told_to_unpin(tmp_path: Path, job_id: str) -> None:
    """nodeagent_job set: the job: section as before (and the pool's defaults). Then the same
    node without nodeagent_job is refused, its config left pinned, until nodeagent_unpin."""
    pinned = configure(tmp_path, job_id)
    assert pinned.returncode == 0, pinned.stdout[-3000:] + pinned.stderr[-2000:]
    assert "Check this node's part of the configuration" in pinned.stdout
    data, settings = rendered(tmp_path)
    assert isinstance(settings, Config) and settings.job.id == job_id
    assert data["job"]["entrypoint"][0] == sys.executable
    assert settings.pool == PoolConfig(auth="none")  # a pinned node's default

    refused = configure(tmp_path, job_id, nodeagent_job={}, **POOL_VARS)
    assert refused.returncode != 0 and "has a job: section" in refused.stdout, refused.stdout
    assert isinstance(rendered(tmp_path)[1], Config)  # left as it was

    unpinned = configure(tmp_path, job_id, nodeagent_job={}, nodeagent_unpin=True, **POOL_VARS)
    assert unpinned.returncode == 0, unpinned.stdout[-3000:] + unpinned.stderr[-2000:]
    data, settings = rendered(tmp_path)
    assert "job" not in data and settings.pool.labels == {"gpu": "h100", "rack": "r12"}


def test_rolling_upgrade_steps_against_a_pool_node(
    redis_server: RedisServer, job_id: str, tmp_path: Path
) -> None:
    """The playbook's drain, uncordon and wait steps for a pool node (no nodeagent_job), run
    against live pool agents: the drained node leaves its job, which moves to the free node;
    uncordoned, the node is back in the pool, which the pool node's wait step sees (the pinned
    node's is skipped)."""
    from tests.helpers.pool import pool_cluster

    play = yaml.safe_load((ANSIBLE / "rolling-upgrade.yml").read_text())[0]
    after = [t for t in play["post_tasks"] if t["name"].startswith(("Let the node", "Wait until"))]
    with pool_cluster(redis_server.url, tmp_path, pool=job_id) as pool:
        pool.start("a", "b")
        pool.wait_nodes(2)
        pool.submit("mover", "1")
        pool.wait_job("mover", "running", world=1)
        node = next(n for n, job in pool.placements().items() if job == "mover")
        drained = run_drain_step(pool.directory / f"{node}.yaml", node)
        assert drained.returncode == 0, drained.stdout + drained.stderr
        moved = {"a", "b"} - {node}
        wait_for(
            lambda: {n for n, j in pool.placements().items() if j == "mover"} == moved,
            30,
            "the job to move to the other node",
        )
        ctl = f"{BIN / 'nodeagentctl'} --config {pool.directory / f'{node}.yaml'}"
        steps = tmp_path / "after.yml"
        steps.write_text(
            json.dumps([{"hosts": "nodeagent_nodes", "gather_facts": False, "tasks": after}])
        )
        extra = {"nodeagent_ctl": ctl, "nodeagent_node_name": node, "nodeagent_job": {}}
        result = tool(
            "ansible-playbook",
            *("-i", str(localhost_inventory(tmp_path)), str(steps), "-e", json.dumps(extra)),
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        assert "ok=2" in result.stdout and "skipped=1" in result.stdout  # the pinned wait
        nodes = json.loads(pool.ctl("nodes", "--json").stdout)["nodes"]
        row = next(r for r in nodes if r["name"] == node)
        assert row["alive"] and row["cordon"] is None
        assert row["version"] == __version__  # what a rolling upgrade looks at


PREFLIGHT_PLAY = [
    {
        "name": "The role's GPU preflight alone",
        "hosts": "nodeagent_nodes",
        "gather_facts": False,
        "tasks": [
            {"ansible.builtin.import_role": {"name": "nodeagent", "tasks_from": "preflight"}}
        ],
    }
]


@pytest.mark.parametrize(
    ("ecc_errors", "init_error", "allow_unavailable", "passes", "shown"),
    [
        (0, None, True, True, None),
        (2, None, True, False, "nodeagent health exited 1:"),
        (0, 12, True, True, "GPU monitoring unavailable"),  # 12: no NVIDIA driver library
        (0, 12, False, False, "nodeagent health exited 3:"),
    ],
    ids=["healthy", "ecc", "no-driver-allowed", "no-driver-refused"],
)
def test_the_gpu_preflight_step_keeps_a_bad_gpu_out(
    tmp_path: Path,
    ecc_errors: int,
    init_error: int | None,
    allow_unavailable: bool,
    passes: bool,
    shown: str | None,
) -> None:
    """tasks/preflight.yml with this venv's nodeagent and a FakeNvml file for the node's GPUs."""
    gpu = {"uuid": "GPU-fake-0", "temperature_c": 40, "ecc_uncorrected_volatile": ecc_errors}
    fake = tmp_path / "gpus.yaml"
    fake.write_text(yaml.safe_dump({"gpus": [gpu], "init_error": init_error}))
    job = {"id": "preflight", "entrypoint": ["true"], "user": getpass.getuser(), "allow_root": True}
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"job": job, "health": {"fake_gpus": str(fake)}})
    )
    playbook = tmp_path / "preflight.yml"
    playbook.write_text(json.dumps(PREFLIGHT_PLAY))
    extra = {
        "nodeagent_venv": str(BIN.parent),
        "nodeagent_config_dir": str(tmp_path),
        "nodeagent_health_allow_unavailable": allow_unavailable,
    }
    result = tool(
        "ansible-playbook",
        *("-i", str(localhost_inventory(tmp_path)), str(playbook), "-e", json.dumps(extra)),
    )
    assert (result.returncode == 0) is passes, result.stdout[-3000:] + result.stderr[-2000:]
    assert shown is None or shown in result.stdout
    if not passes:  # the command's own output, in the failure's message
        assert "GPU monitoring unavailable" in result.stdout or "GPU 0: unhealthy" in result.stdout


def test_the_roles_unit_validation_rejects_a_bad_unit(tmp_path: Path) -> None:
    """The template's validate command, run as Ansible runs it (on a temp file without the
    .service suffix systemd-analyze wants): a good unit passes, a misspelled key fails."""
    tasks = yaml.safe_load((ANSIBLE / "roles/nodeagent/tasks/main.yml").read_text())
    validate = next(
        t["ansible.builtin.template"]["validate"]
        for t in tasks
        if t.get("ansible.builtin.template", {}).get("dest", "").endswith(".service")
    )
    venv = Path(sys.executable).parent.parent
    good = (
        (ROOT / "systemd/nodeagent.service").read_text().replace("/opt/nodeagent/venv", str(venv))
    )
    for name, text, ok in (
        ("good", good, True),
        ("bad", good + "\n[Service]\nRestartt=always\n", False),
    ):
        source = tmp_path / f"tmp{name}"  # no .service suffix, like Ansible's temp file
        source.write_text(text)
        result = subprocess.run(
            shlex.split(validate.replace("%s", str(source))),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert (result.returncode == 0) is ok, (name, result.stdout, result.stderr)


def test_a_node_that_runs_images_and_confines_devices_gets_its_sections_and_drop_ins(
    tmp_path: Path, job_id: str
) -> None:
    """nodeagent_containers.allowed: the config's containers: section, the drop-in that orders
    the agent after podman's socket, and the OCI runtime the podman service is to use;
    nodeagent_constrain_devices: health.constrain_devices and the drop-in that lets the agent
    make each job's device cgroup. Without them, no drop-in."""
    parts = ("pinning", "config", "containers", "devices")
    containers = {"allowed": True, "images": ["localhost/"], "socket": "/run/podman/podman.sock"}
    drop_ins = tmp_path / "root/etc/systemd/system/nodeagent.service.d"
    engine = tmp_path / "root/etc/containers/containers.conf.d/50-nodeagent.conf"
    result = configure(
        tmp_path,
        job_id,
        parts,
        nodeagent_job={},
        nodeagent_containers=containers,
        nodeagent_container_oci_runtime="runc",
        nodeagent_constrain_devices=True,
        **POOL_VARS,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for name in ("containers.conf", "constrain-devices.conf"):
        shipped = ROOT / "systemd/nodeagent.service.d" / name
        assert (drop_ins / name).read_text() == shipped.read_text()
    assert tomllib.loads(engine.read_text()) == {"engine": {"runtime": "runc"}}
    data, settings = rendered(tmp_path)
    assert data["containers"] == containers
    assert settings.containers.allowed and settings.containers.socket == "/run/podman/podman.sock"
    assert settings.health.constrain_devices and data["health"]["gpu"] == "auto"

    result = configure(tmp_path, job_id, parts, nodeagent_job={}, **POOL_VARS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert list(drop_ins.iterdir()) == [] and "containers" not in rendered(tmp_path)[0]
    assert not rendered(tmp_path)[1].containers.allowed
    assert not rendered(tmp_path)[1].health.constrain_devices


def test_ssh_adopt_puts_the_check_in_sshds_account_stack_and_takes_it_out(
    tmp_path: Path, job_id: str
) -> None:
    """nodeagent_ssh_adopt: the check after Debian's common-account in sshd's stack, its
    sessions through common-session-noninteractive (no pam_systemd) and the check right after
    that (before pam_env), and the unit's drop-in;
    again: nothing changes; false: the stack as it was, no drop-in. A node without sshd's stack
    is refused, saying so."""
    pam = tmp_path / "root/etc/pam.d/sshd"
    pam.parent.mkdir(parents=True)
    debian = Path("/etc/pam.d/sshd").read_text() if Path("/etc/pam.d/sshd").exists() else DEBIAN
    pam.write_text(debian)
    for _ in range(2):
        result = configure(tmp_path, job_id, ("logins",), nodeagent_ssh_adopt=True)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        lines = [line.split() for line in pam.read_text().splitlines()]
        check = [f"{BIN.parent}/bin/python", "-I", "-m", "nodeagent.cli.pamadopt"]
        account = ["account", "required", "pam_exec.so", "stdout", "quiet", *check]
        session = ["session", "required", "pam_exec.so", "quiet", *check]
        assert lines[lines.index(["@include", "common-account"]) + 1] == account, pam.read_text()
        included = lines.index(["@include", "common-session-noninteractive"])
        assert lines[included + 1] == session, pam.read_text()
        assert ["@include", "common-session"] not in lines
        assert included < min(i for i, x in enumerate(lines) if "pam_env.so" in x), "pam_env first"
    assert "changed=0" in result.stdout, result.stdout[-2000:]
    drop_in = tmp_path / "root/etc/systemd/system/nodeagent.service.d/ssh-adopt.conf"
    assert drop_in.read_text() == (ROOT / "systemd/nodeagent.service.d/ssh-adopt.conf").read_text()

    result = configure(tmp_path, job_id, ("logins",), nodeagent_ssh_adopt=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert pam.read_text() == debian and not drop_in.exists()

    pam.unlink()
    result = configure(tmp_path, job_id, ("logins",), nodeagent_ssh_adopt=True)
    assert result.returncode != 0 and "install openssh-server" in result.stdout, result.stdout


# Debian 12's /etc/pam.d/sshd, less its comments, where this machine has none.
DEBIAN = """@include common-auth
account    required     pam_nologin.so
@include common-account
session [success=ok ignore=ignore module_unknown=ignore default=bad]        pam_selinux.so close
session    required     pam_loginuid.so
session    optional     pam_keyinit.so force revoke
@include common-session
session    optional     pam_motd.so  motd=/run/motd.dynamic
session    required     pam_limits.so
session    required     pam_env.so user_readenv=1 envfile=/etc/default/locale
@include common-password
"""
