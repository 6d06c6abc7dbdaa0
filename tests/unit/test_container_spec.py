"""A job's container as a spec gives it, and the node's rule for it (model/container.py)."""

from __future__ import annotations

import pytest

from nodeagent.model.container import (
    ContainerError,
    ContainerRule,
    ContainerSpec,
    Mount,
    parse_image,
    parse_mounts,
    refusal,
)


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
    assert refusal(ContainerRule(), ok) == (
        "this node runs no containers (its containers.allowed is off)"
    )
    other = ContainerSpec("docker.io/torch:2.5")
    assert "not from an image prefix this node allows (localhost/, " in (refusal(RULE, other) or "")
    near = ContainerSpec("localhost/x", parse_mounts("/database:/db"))  # not under /data
    assert (
        refusal(RULE, near)
        == "mount source /database is not under a directory this node allows (/data)"
    )
    # a link under /data that points elsewhere: the node says where it resolved to
    linked = ContainerSpec("localhost/x", parse_mounts("/data/etc:/etc2"))
    assert "/data/etc (-> /etc)" in (refusal(RULE, linked, ["/etc"]) or "")
    with pytest.raises(ValueError):
        refusal(RULE, linked, ["/data/etc", "/extra"])
