"""A job's container (issue 43): the image its workers run in and the host paths mounted into
it, as a job spec or a `job:` section gives them, and the node's rule for what it runs. Pure.

Spelled as pyxis spells them (`srun --container-image=... --container-mounts=SRC:DST[:ro],...`):
a mount is `SRC` (mounted at the same path), `SRC:DST`, or `SRC:DST:ro`. Both paths absolute and
plain (no `..`, no `.`, no empty component), the target never over what the runtime or the
agent owns (/proc, /sys, /dev, /run/nodeagent: the agent binds the memory tier and the worker
channel there). An image is a reference a container runtime pulls (`registry/name:tag`,
`name@sha256:...`), letters, digits and `._-/:@+` only.

The node decides (`containers:` in its config, `ContainerRule`): containers allowed at all,
from which image prefixes, with mount sources under which directories. A spec that asks for
anything else is refused with the reason (`refusal`). Paths are compared a component at a time
(`/data` allows `/data/x`, never `/database`); the node resolves a source's links before it
asks (a link under an allowed directory may point anywhere).

Not wired into the agent yet: the runtime and the fencing of a containerised worker come next
(the closing note of issue 43 says why the fence keeper must kill by cgroup first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

MAX_MOUNTS = 64
MAX_PATH = 4096
# What the runtime mounts itself, and where the agent binds its own files into a container.
RESERVED_TARGETS = ("/proc", "/sys", "/dev", "/run/nodeagent")
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-/:@+]{0,510}$")


class ContainerError(ValueError):
    """A container spec that cannot be: the message names what is wrong and what would be right."""


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False

    def spelled(self) -> str:
        """As pyxis spells it (and `parse_mounts` reads it back)."""
        return f"{self.source}:{self.target}" + (":ro" if self.read_only else "")


@dataclass(frozen=True)
class ContainerSpec:
    image: str
    mounts: tuple[Mount, ...] = ()


def parse_image(image: str) -> str:
    """`image`, checked. Raises ContainerError."""
    if not _IMAGE.match(image) or ".." in image or "//" in image:
        raise ContainerError(
            f"not an image reference: {image!r} (such as registry.example.com/team/torch:2.5 or "
            "localhost/torch@sha256:<digest>: letters, digits and ._-/:@+)"
        )
    return image


def parse_mounts(text: str) -> tuple[Mount, ...]:
    """`SRC[:DST[:ro]],...` as pyxis spells it. Raises ContainerError naming the mount."""
    items = [item for item in text.split(",") if item]
    if len(items) > MAX_MOUNTS:
        raise ContainerError(f"{len(items)} mounts: at most {MAX_MOUNTS}")
    mounts = tuple(_mount(item) for item in items)
    targets = [m.target for m in mounts]
    twice = sorted({t for t in targets if targets.count(t) > 1})
    if twice:
        raise ContainerError(f"two mounts at {', '.join(twice)}: one target, one mount")
    return mounts


def _mount(item: str) -> Mount:
    parts = item.split(":")
    if len(parts) > 3 or (len(parts) == 3 and parts[2] not in ("ro", "rw")):
        raise ContainerError(
            f"mount {item!r}: expected SRC, SRC:DST or SRC:DST:ro (absolute paths, no ':')"
        )
    source = _path(parts[0], item, "source")
    target = _path(parts[1], item, "target") if len(parts) > 1 else source
    if any(_under(target, reserved) for reserved in RESERVED_TARGETS) or target == "/":
        raise ContainerError(
            f"mount {item!r}: {target} is the runtime's or the agent's inside the container "
            f"({', '.join(RESERVED_TARGETS)} and / are not for a job's mounts)"
        )
    return Mount(source, target, len(parts) == 3 and parts[2] == "ro")


def _path(path: str, item: str, what: str) -> str:
    components = path.split("/")[1:]
    plain = path.startswith("/") and all(c not in ("", ".", "..") for c in components)
    if not plain or len(path) > MAX_PATH or "\x00" in path or path == "/":
        raise ContainerError(
            f"mount {item!r}: its {what} {path!r} must be an absolute path with no '.', '..' "
            "or empty component, such as /data/imagenet"
        )
    return path


def _under(path: str, root: str) -> bool:
    """`path` is `root` or below it, a component at a time."""
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


@dataclass(frozen=True)
class ContainerRule:
    """The node's `containers:` section: what it runs."""

    allowed: bool = False
    images: tuple[str, ...] = ()  # image prefixes: "registry.example.com/team/", "localhost/"
    mount_sources: tuple[str, ...] = ()  # directories a mount's source must be under


def refusal(rule: ContainerRule, spec: ContainerSpec, sources: Sequence[str] = ()) -> str | None:
    """Why this node does not run `spec` (None: it does). `sources`: each mount's source as the
    node resolved it (its links followed), in order; the spec's own where not given."""
    if not rule.allowed:
        return "this node runs no containers (its containers.allowed is off)"
    if not any(spec.image.startswith(prefix) for prefix in rule.images):
        allowed = ", ".join(rule.images) or "none"
        return f"image {spec.image} is not from an image prefix this node allows ({allowed})"
    resolved = list(sources) if sources else [m.source for m in spec.mounts]
    for mount, source in zip(spec.mounts, resolved, strict=True):
        if not any(_under(source, root) for root in rule.mount_sources):
            where = ", ".join(rule.mount_sources) or "none"
            shown = source if source == mount.source else f"{mount.source} (-> {source})"
            return f"mount source {shown} is not under a directory this node allows ({where})"
    return None
