"""A job's container as a spec gives it, and the node's rule for it (config/container.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeagent.cli.ctl import parser
from nodeagent.cli.ctl.submit import spec_from_args
from nodeagent.config.container import (
    ContainerError,
    ContainerRule,
    ContainerSpec,
    Mount,
    parse_image,
    parse_mounts,
    pool_refusal,
    refusal,
)
from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import Account
from nodeagent.config.load import load_settings
from nodeagent.errors import ConfigError, UsageError
from nodeagent.model.spec import JobSpec, load_spec, run_config


class Accounts(Resolver):
    """alice (uid 1000) and root, and this machine's paths (a mount's links are the node's)."""

    def agent(self) -> Account:
        return Account("root", 0, 0, "/root")

    def user(self, name: str) -> Account | None:
        return {"alice": Account("alice", 1000, 1000, "/home/alice")}.get(name)

    def group(self, name: str) -> int | None:
        return None

    def groups_of(self, user: str, gid: int) -> tuple[int, ...]:
        return (gid,)


def test_mounts_read_as_pyxis_spells_them() -> None:
    mounts = parse_mounts("/data:/data:ro,/scratch/alice:/scratch,/models")
    assert mounts == (
        Mount("/data", "/data", True),
        Mount("/scratch/alice", "/scratch", False),
        Mount("/models", "/models", False),
    )
    assert parse_mounts(",".join(m.spelled() for m in mounts)) == mounts
    assert parse_mounts("") == ()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("data:/data", "must be an absolute path"),
        ("/data/../etc:/x", "must be an absolute path"),
        ("/data/./x:/x", "must be an absolute path"),
        ("/data//x:/x", "must be an absolute path"),
        ("/data:/x:rx", "expected SRC, SRC:DST or SRC:DST:ro"),
        ("/a:/b:ro:extra", "expected SRC, SRC:DST or SRC:DST:ro"),
        ("/data:/proc/self", "the runtime's or the agent's"),
        ("/data:/run/nodeagent", "the runtime's or the agent's"),
        ("/data:/dev", "the runtime's or the agent's"),
        ("/:/host", "must be an absolute path"),
        ("/data:/", "must be an absolute path"),
        ("/a:/x,/b:/x", "two mounts at /x"),
    ],
)
def test_a_mount_that_cannot_be_is_refused_naming_it(text: str, says: str) -> None:
    with pytest.raises(ContainerError, match=says):
        parse_mounts(text)


def test_only_plain_image_references() -> None:
    for good in ("localhost/torch:2.5", "registry.example.com/team/torch@sha256:abc123", "ubuntu"):
        assert parse_image(good) == good
    for bad in ("", "-rm", "a b", "img;rm -rf /", "../x", "a//b", "x" * 600):
        with pytest.raises(ContainerError, match="not an image reference"):
            parse_image(bad)


RULE = ContainerRule(
    allowed=True, images=("localhost/", "registry.example.com/team/"), mount_sources=("/data",)
)


def test_the_node_runs_only_what_its_rule_allows() -> None:
    ok = ContainerSpec("localhost/torch:2.5", parse_mounts("/data/imagenet:/in:ro"))
    assert refusal(RULE, ok) is None
    assert refusal(ContainerRule(), ok) == ("containers are off (containers.allowed)")
    other = ContainerSpec("docker.io/torch:2.5")
    assert "not from an allowed image prefix (localhost/, " in (refusal(RULE, other) or "")
    near = ContainerSpec("localhost/x", parse_mounts("/database:/db"))  # not under /data
    assert refusal(RULE, near) == "mount source /database is not under an allowed directory (/data)"
    # a link under /data that points elsewhere: the node says where it resolved to
    linked = ContainerSpec("localhost/x", parse_mounts("/data/etc:/etc2"))
    assert "/data/etc (-> /etc)" in (refusal(RULE, linked, ["/etc"]) or "")
    with pytest.raises(ValueError):
        refusal(RULE, linked, ["/data/etc", "/extra"])


def test_a_spec_container_reads_as_a_string_or_a_list_and_round_trips() -> None:
    base = {"id": "llama", "entrypoint": ["python", "train.py"], "user": "alice"}
    as_text = load_spec({**base, "container": {"image": "localhost/t:1", "mounts": "/data:/d:ro"}})
    as_list = load_spec(
        {**base, "container": {"image": "localhost/t:1", "mounts": ["/data:/d:ro"]}}
    )
    assert (
        as_text.job.container
        == as_list.job.container
        == ContainerSpec("localhost/t:1", (Mount("/data", "/d", True),))
    )
    assert JobSpec.from_json(as_text.to_json()) == as_text
    assert load_spec(base).job.container is None
    assert "container" not in load_spec(base).to_dict()


@pytest.mark.parametrize(
    ("container", "key", "says"),
    [
        ({"mounts": "/data"}, "container.image", "required"),
        ({"image": "a b"}, "container.image", "not an image reference"),
        ({"image": "localhost/x", "mounts": "/data:/proc"}, "container.mounts", "the runtime's"),
        ({"image": "localhost/x", "mounts": {"a": 1}}, "container.mounts", "as pyxis spells it"),
        ({"image": "localhost/x", "user": "root"}, "container.user", "unknown key"),
    ],
)
def test_a_bad_container_names_its_key(container: dict[str, Any], key: str, says: str) -> None:
    spec = {
        "id": "llama",
        "entrypoint": ["python", "t.py"],
        "user": "alice",
        "container": container,
    }
    with pytest.raises(ConfigError) as info:
        load_spec(spec)
    assert info.value.key == key and says in str(info.value)


def _node(containers: dict[str, Any], job: dict[str, Any] | None = None) -> Any:
    doc: dict[str, Any] = {
        "node": {"name": "n1", "address": "10.0.0.1"},
        "redis": {"url": "redis://r:6379/0"},
        "pool": {"users": ["alice"]},
        "containers": containers,
    }
    if job is not None:
        doc["job"] = job
    return load_settings(doc, Accounts())


def test_the_nodes_containers_section_reads_with_its_defaults() -> None:
    assert _node({}).containers == ContainerRule()
    rule = _node(
        {
            "allowed": True,
            "images": ["localhost/"],
            "mount_sources": ["/data"],
            "socket": "/run/podman-site/podman.sock",
            "ulimits": ["nofile=4096:4096"],
            "devices": ["/dev/infiniband/uverbs0"],
            "env": ["NCCL_SOCKET_IFNAME", "https_proxy"],
            "pull_timeout": "5m",
        }
    ).containers
    assert rule == ContainerRule(
        True,
        ("localhost/",),
        ("/data",),
        "podman",
        "/run/podman-site/podman.sock",
        ("nofile=4096:4096",),
        ("/dev/infiniband/uverbs0",),
        pull_timeout=300.0,
        env=("NCCL_SOCKET_IFNAME", "https_proxy"),
    )


@pytest.mark.parametrize(
    ("containers", "key"),
    [
        ({"runtime": "docker"}, "containers.runtime"),
        ({"images": "localhost/"}, "containers.images"),
        ({"mount_sources": ["data"]}, "containers.mount_sources[0]"),
        ({"mount_sources": ["/"]}, "containers.mount_sources[0]"),
        ({"ulimits": ["nofile 10"]}, "containers.ulimits[0]"),
        ({"devices": ["/etc/passwd"]}, "containers.devices[0]"),
        ({"devices": ["/dev/../etc/shadow"]}, "containers.devices[0]"),
        ({"env": ["PATH=/x"]}, "containers.env[0]"),
        ({"env": "NCCL_SOCKET_IFNAME"}, "containers.env"),
        ({"oci_runtime": "runc"}, "containers.oci_runtime"),  # the service's containers.conf
        ({"socket": "podman.sock"}, "containers.socket"),
        ({"pull_timeout": 0}, "containers.pull_timeout"),
        ({"allow": True}, "containers.allow"),
    ],
)
def test_a_bad_containers_section_names_its_key(containers: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        _node(containers)
    assert info.value.key == key


def test_the_node_refuses_at_placement_what_its_rule_does_not_allow(tmp_path: Path) -> None:
    """run_config (a placed node) resolves each mount's links on the node before it asks."""
    allowed = tmp_path / "data"
    (allowed / "set").mkdir(parents=True)
    (allowed / "escape").symlink_to("/etc")
    (allowed / "alias").symlink_to(allowed / "set")
    node = _node({"allowed": True, "images": ["localhost/"], "mount_sources": [str(allowed)]})
    base = {"id": "llama", "entrypoint": ["python", "t.py"], "user": "alice"}

    def placed(image: str, mounts: str) -> str | None:
        spec = load_spec({**base, "container": {"image": image, "mounts": mounts}})
        try:
            config = run_config(spec, node, Accounts())
        except ConfigError as exc:
            assert exc.key == "container"
            return str(exc)
        assert config.job.container is not None and spec.job.container is not None
        runs = [(m.target, m.read_only) for m in config.job.container.mounts]
        assert runs == [(m.target, m.read_only) for m in spec.job.container.mounts]
        assert [m.source for m in config.job.container.mounts] == [str(allowed / "set")] * len(runs)
        return None

    assert placed("localhost/t:1", f"{allowed}/set:/in:ro") is None
    # podman binds the path judged, not the link (its owner could point it elsewhere later)
    assert placed("localhost/t:1", f"{allowed}/alias:/in:ro") is None
    assert "image docker.io/t is not from an allowed image prefix" in (
        placed("docker.io/t", "") or ""
    )
    assert f"{allowed}/escape (-> /etc) is not under" in (
        placed("localhost/t", f"{allowed}/escape:/x") or ""
    )
    assert "/nowhere does not exist on this node" in (placed("localhost/t", "/nowhere:/x") or "")
    no_containers = _node({})
    spec = load_spec({**base, "container": {"image": "localhost/t"}})
    with pytest.raises(ConfigError, match="node n1: containers are off"):
        run_config(spec, no_containers, Accounts())


def test_a_pinned_job_asking_for_a_container_its_node_refuses_is_a_config_error() -> None:
    job = {
        "id": "llama",
        "entrypoint": ["python", "t.py"],
        "user": "alice",
        "container": {"image": "localhost/t"},
    }
    with pytest.raises(ConfigError) as info:
        _node({}, job)
    assert info.value.key == "job.container" and "containers are off (containers.allowed)" in str(
        info.value
    )
    assert _node({"allowed": True, "images": ["localhost/"]}, job).job.container is not None


def test_submit_takes_the_container_as_srun_spells_it() -> None:
    args = parser.parser().parse_args(
        ["submit", "--container-image", "localhost/t:1", "--container-mounts", "/data:/d:ro,/m"]
    )
    args.argv = ["python", "t.py"]
    spec = spec_from_args(args, "alice", "alice@h")
    assert spec.job.container == ContainerSpec(
        "localhost/t:1", (Mount("/data", "/d", True), Mount("/m", "/m"))
    )
    args.container_mounts = "/data:/dev/shm"
    with pytest.raises(UsageError, match=r"container\.mounts.*the runtime's or the agent's"):
        spec_from_args(args, "alice", "alice@h")


def test_the_pool_refuses_a_container_only_when_every_node_that_said_refuses_it() -> None:
    spec = ContainerSpec("localhost/t:1", parse_mounts("/data/x:/x"))
    off, other = ContainerRule(), ContainerRule(True, ("docker.io/",), ("/data",))
    assert pool_refusal(spec, []) is None  # no node said: placement decides
    assert pool_refusal(spec, [off, RULE]) is None  # one node takes it
    said = pool_refusal(spec, [off, other, off])
    assert said == (
        "no node that could run it takes its container: containers are off "
        "(containers.allowed); image localhost/t:1 is not from an allowed image prefix "
        "(docker.io/)"
    )  # each reason once
    many = [ContainerRule(True, (f"r{i}/",)) for i in range(5)]
    assert (pool_refusal(spec, many) or "").endswith("(r2/) (and 2 other reasons)")


def test_a_submitted_jobs_persistent_tier_is_bound_into_its_containers_as_a_mount(
    tmp_path: Path,
) -> None:
    """Bound in from a path the job chose, so judged like its mounts: under the node's
    mount_sources, its links resolved (a bind of /root/x would show the job's user what
    /root's mode hides)."""
    allowed = tmp_path / "data"
    (allowed / "ckpt").mkdir(parents=True)
    (allowed / "escape").symlink_to("/root")
    node = _node({"allowed": True, "images": ["localhost/"], "mount_sources": [str(allowed)]})

    def placed(persist_dir: str) -> Any:
        spec = load_spec(
            {
                "id": "llama",
                "entrypoint": ["python", "t.py"],
                "user": "alice",
                "container": {"image": "localhost/t:1"},
                "checkpoint": {"memory_size": "1GiB", "persist_dir": persist_dir},
            }
        )
        return run_config(spec, node, Accounts())

    config = placed(str(allowed / "ckpt"))
    assert config.job.container is not None
    [mount] = config.job.container.mounts
    assert (mount.source, mount.target, mount.read_only) == (str(allowed / "ckpt"),) * 2 + (False,)
    with pytest.raises(ConfigError, match="escape \\(-> /root\\) is not under"):
        placed(str(allowed / "escape"))
    with pytest.raises(ConfigError, match="/elsewhere does not exist on this node"):
        placed("/elsewhere")
