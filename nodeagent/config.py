"""Configuration: frozen dataclasses, loaded and validated once.

This is the only module that reads YAML or the environment. Every invalid value is rejected with
the dotted name of its key and what would be right, so `nodeagent config check` and
`nodeagent run` can exit 78 (EX_CONFIG) and systemd does not restart-loop on a typo.
"""

from __future__ import annotations

import math
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

import yaml

from nodeagent.entrypoint import NotPython, split_python
from nodeagent.errors import ConfigError

EX_CONFIG = 78
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+sentinel", "rediss+sentinel")
EMBEDDED = "embedded"  # a private redis-server for a one-node job (coord/embedded.py)


@dataclass(frozen=True)
class NodeConfig:
    name: str
    address: str


@dataclass(frozen=True)
class RedisConfig:
    url: str
    key_prefix: str = "nodeagent"


@dataclass(frozen=True)
class JobConfig:
    id: str
    entrypoint: tuple[str, ...]
    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1
    target_nodes: int = 1
    max_restarts: int = 3
    working_dir: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    gpus_per_worker: int = 1
    preload: tuple[str, ...] = ()  # modules spare worker interpreters import ahead of time


@dataclass(frozen=True)
class TimingConfig:
    """All durations in seconds."""

    heartbeat_interval: float = 1.0
    lease_ttl: float = 5.0
    stop_grace_period: float = 30.0
    failure_stop_grace_period: float = 1.0
    join_settle: float = 1.0
    rendezvous_timeout: float = 600.0
    hang_timeout: float = 0.0  # 0: off


GPU_MODES = ("auto", "on", "off")


@dataclass(frozen=True)
class HealthConfig:
    gpu: str = "auto"  # auto: use NVML if it works; on: required; off: never
    interval: float = 5.0
    max_temperature_c: float | None = None  # None: each GPU's own slowdown threshold
    max_ecc_uncorrected: int = 0
    max_pcie_replays: int | None = None
    auto_uncordon: bool = False
    fake_gpus: str | None = None  # a FakeNvml file instead of the real NVML


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "text"  # text: key=value; json: one object a line
    level: str = "INFO"


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = "127.0.0.1:9400"


@dataclass(frozen=True)
class Config:
    node: NodeConfig
    redis: RedisConfig
    job: JobConfig
    timing: TimingConfig
    metrics: MetricsConfig
    health: HealthConfig = field(default_factory=HealthConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    log_dir: str = "/var/log/nodeagent"
    state_dir: str | None = None  # None: DEFAULT_STATE_DIR, used only if it can be written


DEFAULT_STATE_DIR = "/var/lib/nodeagent"  # systemd's StateDirectory=nodeagent


def parse_duration(value: object, key: str) -> float:
    """Seconds from a number or a string such as "500ms", "5s", "2m", "1h".

    Raises:
        ConfigError: naming `key` when the value is not a non-negative duration.
    """
    if isinstance(value, bool):
        raise ConfigError(key, f"expected a duration such as 5s or 500ms, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (match := _DURATION_RE.match(value)):
        seconds = float(match.group(1)) * _DURATION_UNITS[match.group(2)]
    else:
        raise ConfigError(key, f"expected a duration such as 5s, 500ms or 2m, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(key, f"expected a non-negative duration, got {value!r}")
    return seconds


T = TypeVar("T")


class _Section:
    """Typed access to one mapping of the YAML document; remembers which keys were used."""

    def __init__(self, data: object, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(path, f"expected a mapping, got {type(data).__name__}")
        self._data: Mapping[str, Any] = data
        self._path = path
        self._known: set[str] = set()

    def key(self, name: str) -> str:
        return f"{self._path}.{name}" if self._path else name

    def get(self, name: str, kind: type[T], default: T) -> T:
        self._known.add(name)
        if name not in self._data or self._data[name] is None:
            return default
        value = self._data[name]
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)  # type: ignore[return-value]
        if not ok:
            raise ConfigError(
                self.key(name), f"expected {kind.__name__}, got {type(value).__name__} {value!r}"
            )
        return value  # type: ignore[no-any-return]

    def raw(self, name: str) -> object:
        self._known.add(name)
        return self._data.get(name)

    def section(self, name: str) -> _Section:
        self._known.add(name)
        return _Section(self._data.get(name), self.key(name))

    def reject_unknown(self) -> None:
        unknown = sorted(set(map(str, self._data)) - self._known)
        if unknown:
            raise ConfigError(
                self.key(unknown[0]),
                f"unknown key; known keys here are: {', '.join(sorted(self._known))}",
            )


def _check_name(value: str, key: str) -> str:
    if not _NAME_RE.match(value):
        raise ConfigError(
            key, f"{value!r} must be 1-63 letters, digits, '.', '_' or '-' (no spaces, braces)"
        )
    return value


def _positive_int(section: _Section, name: str, default: int, minimum: int = 1) -> int:
    value = section.get(name, int, default)
    if value < minimum:
        raise ConfigError(section.key(name), f"must be >= {minimum}, got {value}")
    return value


def _check_redis_url(url: str, key: str) -> str:
    if url == EMBEDDED:
        return url
    scheme = urlsplit(url).scheme
    if scheme not in REDIS_SCHEMES:
        raise ConfigError(
            key, f"{url!r} must start with one of {', '.join(s + '://' for s in REDIS_SCHEMES)}"
        )
    return url


def _load_node(section: _Section, redis_url: str, resolve: Resolver) -> NodeConfig:
    name = _check_name(section.get("name", str, resolve.hostname()), section.key("name"))
    address = section.get("address", str, "") or resolve.address_towards(redis_url)
    section.reject_unknown()
    return NodeConfig(name=name, address=address)


def _load_job(section: _Section) -> JobConfig:
    job_id = section.get("id", str, "")
    if not job_id:
        raise ConfigError(section.key("id"), "required: a job id such as llama-ft")
    _check_name(job_id, section.key("id"))
    entrypoint = section.raw("entrypoint")
    if isinstance(entrypoint, str) or not isinstance(entrypoint, list) or not entrypoint:
        raise ConfigError(
            section.key("entrypoint"),
            "required: a non-empty list such as [python, train.py] (it is exec'd, no shell)",
        )
    if not all(isinstance(arg, str | int | float) for arg in entrypoint):
        raise ConfigError(section.key("entrypoint"), "every element must be a string")
    env = section.raw("env") or {}
    if not isinstance(env, Mapping) or not all(isinstance(k, str) for k in env):
        raise ConfigError(section.key("env"), "expected a mapping of variable names to strings")
    min_nodes = _positive_int(section, "min_nodes", 1)
    max_nodes = _positive_int(section, "max_nodes", max(min_nodes, 1))
    if min_nodes > max_nodes:
        raise ConfigError(
            section.key("min_nodes"), f"min_nodes ({min_nodes}) > max_nodes ({max_nodes})"
        )
    target = _positive_int(section, "target_nodes", max_nodes)
    if not min_nodes <= target <= max_nodes:
        raise ConfigError(
            section.key("target_nodes"),
            f"must be within [min_nodes, max_nodes] = [{min_nodes}, {max_nodes}], got {target}",
        )
    job = JobConfig(
        id=job_id,
        entrypoint=tuple(str(arg) for arg in entrypoint),
        nproc_per_node=_positive_int(section, "nproc_per_node", 1),
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        target_nodes=target,
        max_restarts=_positive_int(section, "max_restarts", 3, minimum=0),
        working_dir=section.get("working_dir", str, "") or None,
        env={str(k): str(v) for k, v in env.items()},
        gpus_per_worker=_positive_int(section, "gpus_per_worker", 1, minimum=0),
        preload=_preload(section, tuple(str(arg) for arg in entrypoint)),
    )
    section.reject_unknown()
    return job


def _preload(section: _Section, entrypoint: tuple[str, ...]) -> tuple[str, ...]:
    modules = section.raw("preload") or []
    if not isinstance(modules, list) or not all(
        isinstance(m, str) and all(part.isidentifier() for part in m.split(".")) for m in modules
    ):
        raise ConfigError(
            section.key("preload"), "expected a list of module names such as [torch, torch._dynamo]"
        )
    if modules:
        try:
            split_python(entrypoint)
        except NotPython as exc:
            raise ConfigError(
                section.key("preload"),
                f"needs a Python entrypoint, [python, script.py, ...] or [python, -m, module, ...]:"
                f" {exc}",
            ) from None
    return tuple(modules)


def _load_timing(section: _Section) -> TimingConfig:
    defaults = TimingConfig()
    values = {
        name: parse_duration(section.raw(name), section.key(name))
        if section.raw(name) not in (None, "off", False)
        else getattr(defaults, name)
        for name in (
            "heartbeat_interval",
            "lease_ttl",
            "stop_grace_period",
            "failure_stop_grace_period",
            "join_settle",
            "rendezvous_timeout",
            "hang_timeout",
        )
    }
    section.reject_unknown()
    timing = TimingConfig(**values)
    if timing.heartbeat_interval < 0.05:
        raise ConfigError(
            section.key("heartbeat_interval"),
            f"must be at least 50ms, got {timing.heartbeat_interval}s",
        )
    if timing.lease_ttl < 2 * timing.heartbeat_interval:
        raise ConfigError(
            section.key("lease_ttl"),
            f"must be at least twice heartbeat_interval ({timing.heartbeat_interval}s) so one late "
            f"heartbeat does not expire the lease, got {timing.lease_ttl}s",
        )
    return timing


def _load_health(section: _Section) -> HealthConfig:
    gpu = section.get("gpu", str, "auto")
    if gpu not in GPU_MODES:
        raise ConfigError(section.key("gpu"), f"must be one of {', '.join(GPU_MODES)}, got {gpu!r}")
    interval = parse_duration(section.raw("interval") or "5s", section.key("interval"))
    if interval < 0.05:
        raise ConfigError(section.key("interval"), f"must be at least 50ms, got {interval}s")
    max_temp = section.get("max_temperature_c", float, -1.0)
    max_replays = section.get("max_pcie_replays", int, -1)
    fake = section.get("fake_gpus", str, "") or None
    if fake is not None and not Path(fake).is_file():
        raise ConfigError(section.key("fake_gpus"), f"no such file: {fake}")
    health = HealthConfig(
        gpu=gpu,
        interval=interval,
        max_temperature_c=max_temp if max_temp >= 0 else None,
        max_ecc_uncorrected=_positive_int(section, "max_ecc_uncorrected", 0, minimum=0),
        max_pcie_replays=max_replays if max_replays >= 0 else None,
        auto_uncordon=section.get("auto_uncordon", bool, False),
        fake_gpus=fake,
    )
    section.reject_unknown()
    return health


def _load_logging(section: _Section) -> LoggingConfig:
    fmt = section.get("format", str, "text")
    if fmt not in LOG_FORMATS:
        raise ConfigError(section.key("format"), f"must be text or json, got {fmt!r}")
    level = section.get("level", str, "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigError(
            section.key("level"), f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
        )
    section.reject_unknown()
    return LoggingConfig(format=fmt, level=level)


def _load_metrics(section: _Section) -> MetricsConfig:
    listen = section.get("listen", str, MetricsConfig.listen)
    if listen == "off":
        section.reject_unknown()
        return MetricsConfig(listen="off")
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(
            section.key("listen"), f"expected HOST:PORT such as 127.0.0.1:9400, got {listen!r}"
        )
    section.reject_unknown()
    return MetricsConfig(listen=f"{host}:{port}")


class Resolver:
    """Host facts used for defaults; injected so tests need not depend on this machine."""

    def hostname(self) -> str:
        return socket.gethostname().split(".")[0] or "localhost"

    def address_towards(self, redis_url: str) -> str:
        """The local address of the route to Redis: what peers on that network can reach.

        A UDP connect() sends no packet; it only asks the kernel which source address it would use.
        """
        parts = urlsplit(redis_url.split(",")[0])
        if redis_url == EMBEDDED or parts.scheme == "unix" or not parts.hostname:
            return "127.0.0.1"
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((parts.hostname, parts.port or 6379))
                return str(sock.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def load_config(data: object, resolve: Resolver | None = None) -> Config:
    """Build a validated Config from a parsed YAML document.

    Raises:
        ConfigError: the first invalid key, by its dotted name.
    """
    resolve = resolve or Resolver()
    root = _Section(data, "")
    redis_section = root.section("redis")
    url = redis_section.get("url", str, "")
    job_data = root.raw("job")
    one_node = isinstance(job_data, Mapping) and job_data.get("max_nodes", 1) == 1
    if not url and one_node:
        url = EMBEDDED  # standalone, as torchrun --standalone
    if not url:
        raise ConfigError(
            "redis.url", "required for a multi-node job: a URL such as redis://10.0.0.2:6379/0"
        )
    redis = RedisConfig(
        url=_check_redis_url(url, "redis.url"),
        key_prefix=_check_name(
            redis_section.get("key_prefix", str, "nodeagent"), "redis.key_prefix"
        ),
    )
    redis_section.reject_unknown()
    config = Config(
        node=_load_node(root.section("node"), url, resolve),
        redis=redis,
        job=_load_job(root.section("job")),
        timing=_load_timing(root.section("timing")),
        metrics=_load_metrics(root.section("metrics")),
        health=_load_health(root.section("health")),
        logging=_load_logging(root.section("logging")),
        log_dir=root.get("log_dir", str, "/var/log/nodeagent"),
        state_dir=root.get("state_dir", str, "") or None,
    )
    root.reject_unknown()
    if config.redis.url == EMBEDDED and config.job.max_nodes > 1:
        raise ConfigError(
            "redis.url",
            f"'embedded' Redis serves one node, but job.max_nodes is {config.job.max_nodes}; "
            "give a Redis URL all nodes reach",
        )
    return config


def read_config(path: str | Path, resolve: Resolver | None = None) -> Config:
    """Read and validate a YAML config file.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or invalid.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{path} is not valid YAML: {exc}") from exc
    return load_config(data, resolve)
