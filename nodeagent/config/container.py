"""A job's container: the image its workers run in and the host paths mounted into it, as a
job spec or a `job:` section gives them (`job.container`), and the node's `containers:` section:
what it runs and how. Pure.

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

The node's runtime settings (`runtime`, `socket`, `ulimits`, `devices`, `pull_timeout`) are
read here too; supervisor/container.py turns them into the runtime's commands.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nodeagent.config.values import Section, choice, duration
from nodeagent.errors import ConfigError

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
    """`job.container`: the image a job's workers run in, and what is mounted into it."""

    image: str
    mounts: tuple[Mount, ...] = ()

    def to_doc(self) -> dict[str, Any]:
        """As a spec stores it (`load_container` reads it back)."""
        return {"image": self.image, "mounts": ",".join(m.spelled() for m in self.mounts)}


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


RUNTIMES = ("podman",)
DEFAULT_PULL_TIMEOUT_S = 600.0
DEFAULT_SOCKET = "/run/podman/podman.sock"  # Debian's podman.socket, root's alone
_ULIMIT = re.compile(r"^[a-z]+=-?[0-9]+(:-?[0-9]+)?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")


@dataclass(frozen=True)
class ContainerRule:
    """The node's `containers:` section: what it runs, and how."""

    allowed: bool = False
    images: tuple[str, ...] = ()  # image prefixes: "registry.example.com/team/", "localhost/"
    mount_sources: tuple[str, ...] = ()  # directories a mount's source must be under
    runtime: str = "podman"  # RUNTIMES
    socket: str = DEFAULT_SOCKET  # the podman service the agent asks to run containers
    ulimits: tuple[str, ...] = ()  # podman --ulimit (name=soft:hard); none: the runtime's own
    devices: tuple[str, ...] = ()  # host devices every worker gets (RDMA: /dev/infiniband/...)
    pull_timeout: float = DEFAULT_PULL_TIMEOUT_S  # a pull that takes longer is a refusal
    # Variables of the agent's environment every worker's container gets (a site's proxy,
    # NCCL_SOCKET_IFNAME): nothing else of the agent's, so that the image's ENV stands.
    env: tuple[str, ...] = ()


def refusal(rule: ContainerRule, spec: ContainerSpec, sources: Sequence[str] = ()) -> str | None:
    """Why this node does not run `spec` (None: it does). `sources`: each mount's source as the
    node resolved it (its links followed), in order; the spec's own where not given."""
    if not rule.allowed:
        return "containers are off (containers.allowed)"
    if not any(spec.image.startswith(prefix) for prefix in rule.images):
        allowed = ", ".join(rule.images) or "none"
        return f"image {spec.image} is not from an allowed image prefix ({allowed})"
    resolved = list(sources) if sources else [m.source for m in spec.mounts]
    for mount, source in zip(spec.mounts, resolved, strict=True):
        if not any(_under(source, root) for root in rule.mount_sources):
            where = ", ".join(rule.mount_sources) or "none"
            shown = source if source == mount.source else f"{mount.source} (-> {source})"
            return f"mount source {shown} is not under an allowed directory ({where})"
    return None


def load_container(section: Section) -> ContainerSpec | None:
    """`job.container` (or a spec's `container`): `image`, and `mounts` as pyxis spells them
    (a string, or a list of mounts); None when the section is absent.

    Raises:
        ConfigError: naming the key.
    """
    if section.raw("image") is None and section.raw("mounts") is None:
        section.reject_unknown()
        return None
    image = section.get("image", str, "")
    if not image:
        raise ConfigError(section.key("image"), "required: an image such as localhost/torch:2.5")
    raw = section.raw("mounts") or ""
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        raw = ",".join(raw)
    if not isinstance(raw, str):
        raise ConfigError(
            section.key("mounts"), "expected SRC:DST[:ro],... as pyxis spells it, or a list"
        )
    try:
        spec = ContainerSpec(parse_image(image), parse_mounts(raw))
    except ContainerError as exc:
        key = "image" if str(exc).startswith("not an image") else "mounts"
        raise ConfigError(section.key(key), str(exc)) from None
    section.reject_unknown()
    return spec


def load_rule(section: Section) -> ContainerRule:
    """The node's `containers:` section (docs/pool.md, "Your own software").

    Raises:
        ConfigError: naming the key.
    """
    hint = "docs/pool.md says what another runtime would run"
    runtime = choice(section, "runtime", RUNTIMES, "podman", hint)
    if section.raw("oci_runtime") is not None:
        raise ConfigError(
            section.key("oci_runtime"),
            "not read any more: the podman service runs the containers, with the OCI runtime "
            'its containers.conf names ([engine] runtime = "runc"); remove the key',
        )
    socket = section.get("socket", str, DEFAULT_SOCKET)
    if not socket.startswith("/") or "\0" in socket:
        raise ConfigError(
            section.key("socket"), f"expected the absolute path of a unix socket, got {socket!r}"
        )
    rule = ContainerRule(
        allowed=section.get("allowed", bool, False),
        images=_strings(section, "images", _image_prefix),
        mount_sources=_strings(section, "mount_sources", _source_root),
        runtime=runtime,
        socket=socket,
        ulimits=_strings(section, "ulimits", _ulimit),
        devices=_strings(section, "devices", _device),
        env=_strings(section, "env", _env_name),
        pull_timeout=duration(
            section.raw("pull_timeout"),
            section.key("pull_timeout"),
            DEFAULT_PULL_TIMEOUT_S,
            positive=True,
        ),
    )
    section.reject_unknown()
    return rule


def _strings(section: Section, name: str, check: Any) -> tuple[str, ...]:
    raw = section.raw(name) or []
    if isinstance(raw, Mapping) or not isinstance(raw, list):
        raise ConfigError(section.key(name), f"expected a list, such as {check.__doc__}")
    found = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or check(item) is None:
            raise ConfigError(f"{section.key(name)}[{i}]", f"expected such as {check.__doc__}")
        found.append(item)
    return tuple(found)


def _image_prefix(item: str) -> str | None:
    """[localhost/, registry.example.com/team/]"""
    return item if item and _IMAGE.match(item) and ".." not in item else None


def _source_root(item: str) -> str | None:
    """[/data, /home] (absolute plain paths)"""
    try:
        return _path(item, item, "directory") if item != "/" else None
    except ContainerError:
        return None


def _device(item: str) -> str | None:
    """[/dev/infiniband/uverbs0, /dev/infiniband/rdma_cm] (paths under /dev)"""
    try:
        return item if _path(item, item, "device").startswith("/dev/") else None
    except ContainerError:
        return None


def _env_name(item: str) -> str | None:
    """[NCCL_SOCKET_IFNAME, https_proxy] (names of the agent's environment variables)"""
    return item if _ENV_NAME.match(item) else None


def _ulimit(item: str) -> str | None:
    """[nofile=4096:4096, nproc=4096:4096] (podman's --ulimit)"""
    return item if _ULIMIT.match(item) else None


MAX_OFFERED = 64  # image prefixes or mount sources a node's pool report carries


def offer(rule: ContainerRule) -> dict[str, Any]:
    """What a node tells the pool of its rule (its pool report): enough for `submit` to refuse
    a container no node would run; the runtime's own settings stay on the node."""
    return {
        "allowed": rule.allowed,
        "images": list(rule.images[:MAX_OFFERED]),
        "mount_sources": list(rule.mount_sources[:MAX_OFFERED]),
    }


def read_offer(doc: object) -> ContainerRule:
    """`offer`'s document read back, strictly (it comes from Redis).

    Raises:
        ValueError: naming what is wrong.
    """
    if not isinstance(doc, Mapping) or set(doc) != {"allowed", "images", "mount_sources"}:
        raise ValueError("containers: expected allowed, images and mount_sources")
    allowed, images, sources = doc["allowed"], doc["images"], doc["mount_sources"]
    lists = (images, sources)
    if not isinstance(allowed, bool) or not all(isinstance(x, list) for x in lists):
        raise ValueError("containers: allowed is true or false, images and mount_sources lists")
    if len(images) > MAX_OFFERED or len(sources) > MAX_OFFERED:
        raise ValueError(f"containers: at most {MAX_OFFERED} images and mount sources")
    if not all(isinstance(i, str) and _image_prefix(i) for i in images):
        raise ValueError("containers: images holds image prefixes")
    if not all(isinstance(s, str) and _source_root(s) for s in sources):
        raise ValueError("containers: mount_sources holds absolute plain paths")
    return ContainerRule(allowed, tuple(images), tuple(sources))


def pool_refusal(spec: ContainerSpec, rules: Sequence[ContainerRule]) -> str | None:
    """Why no node of a pool would run `spec`, from the rules its nodes offer (None: one
    would, or no node said: nodes that join later may). Paths are compared as written: the
    node that is placed on the job resolves their links and may still refuse."""
    if not rules:
        return None
    reasons: list[str] = []
    for rule in rules:
        reason = refusal(rule, spec)
        if reason is None:
            return None
        if reason not in reasons:
            reasons.append(reason)
    more = f" (and {len(reasons) - 3} other reasons)" if len(reasons) > 3 else ""
    return f"no node that could run it takes its container: {'; '.join(reasons[:3])}{more}"


def node_refusal(
    rule: ContainerRule, spec: ContainerSpec, real_path: Callable[[str], str | None]
) -> str | None:
    """`refusal`, with each mount's source as this node resolves it (`real_path`: its links
    followed; None where it does not exist here, which is a refusal too)."""
    placed = on_node(rule, spec, real_path)
    return placed if isinstance(placed, str) else None


def on_node(
    rule: ContainerRule, spec: ContainerSpec, real_path: Callable[[str], str | None]
) -> ContainerSpec | str:
    """`spec` as this node runs it, each mount's source the path it resolved and judged (so
    podman binds what was checked, not a link its owner may point elsewhere afterwards); or
    why this node refuses it."""
    sources = []
    for mount in spec.mounts:
        real = real_path(mount.source)
        if real is None:
            return f"mount source {mount.source} does not exist on this node"
        sources.append(real)
    why = refusal(rule, spec, sources)
    if why is not None:
        return why
    mounts = tuple(
        dataclasses.replace(m, source=s) for m, s in zip(spec.mounts, sources, strict=True)
    )
    return dataclasses.replace(spec, mounts=mounts)
