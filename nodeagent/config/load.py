"""A node's config file -> its frozen settings (settings.py), validated once.

values.py holds the rules every section shares, strictyaml.py the YAML loader, redisurl.py what a
Redis URL may be, hosts.py the facts of this host the defaults come from. Every invalid value is
rejected with the dotted name of its key and what would be right, so `nodeagent config check` and
`nodeagent run` can exit 78 (EX_CONFIG) and systemd does not restart-loop on a typo. What only this
node can tell (directories, the entrypoint's program, the metrics address) is checked by
nodeagent.runtime.preflight.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from nodeagent.config import redisurl, strictyaml
from nodeagent.config.checkpoint import load_checkpoint
from nodeagent.config.container import load_container, load_rule, node_refusal
from nodeagent.config.entrypoint import NotPython, split_python
from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import WorkerUser
from nodeagent.config.identity import resolve as resolve_user
from nodeagent.config.isolation import job_memory, load_isolation
from nodeagent.config.poolconfig import load_pool
from nodeagent.config.settings import (
    EMBEDDED,
    GPU_MODES,
    LOG_FORMATS,
    LOG_LEVELS,
    RECOVERY_MODES,
    SLOW_NODE_POLICIES,
    Config,
    HealthConfig,
    JobConfig,
    LoggingConfig,
    MetricsConfig,
    NodeConfig,
    NodeSettings,
    RedisConfig,
    SlowNodeConfig,
    TimingConfig,
)
from nodeagent.config.values import (
    Section,
    check_name,
    choice,
    duration,
    env_scalar,
    not_a_string,
    optional_limit,
    optional_path,
    path_value,
    positive_int,
)
from nodeagent.config.values import parse_duration as parse_duration  # nodeagentctl's --timeout
from nodeagent.errors import ConfigError


def _check_redis_url(url: str, key: str) -> str:
    if url == EMBEDDED:
        return url
    problem = redisurl.problem(url)
    if problem is not None:
        raise ConfigError(key, problem)
    return url


def _load_node(section: Section, redis_url: str, resolve: Resolver) -> NodeConfig:
    name = check_name(section.get("name", str, resolve.hostname()), section.key("name"))
    address = section.get("address", str, "") or resolve.address_towards(redis_url)
    section.reject_unknown()
    return NodeConfig(name=name, address=address)


def _load_job(section: Section, resolve: Resolver) -> JobConfig:
    job = job_fields(section)
    job = dataclasses.replace(job, user=_run_as(section, dict(job.env), resolve))
    section.reject_unknown()
    return job


def job_fields(section: Section) -> JobConfig:
    """The keys a `job:` section and a job spec share (nodeagent.model.spec), validated; who runs
    it (user, group) is left to the caller, and so are the keys it does not know.

    Raises:
        ConfigError: naming the first invalid key.
    """
    job_id = section.get("id", str, "")
    if not job_id:
        raise ConfigError(section.key("id"), "required: a job id such as llama-ft")
    check_name(job_id, section.key("id"))
    entrypoint = _entrypoint(section)
    min_nodes = positive_int(section, "min_nodes", 1)
    max_nodes = positive_int(section, "max_nodes", max(min_nodes, 1))
    if min_nodes > max_nodes:
        raise ConfigError(
            section.key("min_nodes"), f"min_nodes ({min_nodes}) > max_nodes ({max_nodes})"
        )
    target = positive_int(section, "target_nodes", max_nodes)
    if not min_nodes <= target <= max_nodes:
        raise ConfigError(
            section.key("target_nodes"),
            f"must be within [min_nodes, max_nodes] = [{min_nodes}, {max_nodes}], got {target}",
        )
    nproc_per_node = positive_int(section, "nproc_per_node", 1)
    mem, mem_per_gpu = job_memory(section, nproc_per_node)
    return JobConfig(
        id=job_id,
        entrypoint=entrypoint,
        nproc_per_node=nproc_per_node,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        target_nodes=target,
        max_restarts=positive_int(section, "max_restarts", 3, minimum=0),
        working_dir=optional_path(section, "working_dir"),
        env=_env(section),
        gpus_per_worker=positive_int(section, "gpus_per_worker", 1, minimum=0),
        preload=_preload(section, entrypoint),
        python=_python(section),
        recovery=_recovery(section),
        checkpoint=load_checkpoint(section.section("checkpoint")),
        slow_node=_slow_node(section.section("slow_node")),
        container=load_container(section.section("container")),
        mem=mem,
        mem_per_gpu=mem_per_gpu,
        cpus_per_gpu=_cpus_per_gpu(section),
    )


def _cpus_per_gpu(section: Section) -> int | None:
    """job.cpus_per_gpu: None (all its GPUs' cores) or at least 1."""
    return None if section.raw("cpus_per_gpu") is None else positive_int(section, "cpus_per_gpu", 1)


def _slow_node(section: Section) -> SlowNodeConfig:
    """job.slow_node (docs/slow-nodes.md); the defaults when absent."""
    policy = choice(
        section,
        "policy",
        SLOW_NODE_POLICIES,
        SlowNodeConfig.policy,
        "report names a slow node, replace swaps it for a spare, exclude re-forms without it",
    )
    threshold = section.get("threshold", float, SlowNodeConfig.threshold)
    if not 1.0 < threshold <= 100.0:
        raise ConfigError(
            section.key("threshold"),
            f"must be above 1 and at most 100 (a node's own work a step over its peers' "
            f"median, such as 1.5), got {threshold!r}",
        )
    config = SlowNodeConfig(
        policy=policy,
        threshold=threshold,
        windows=positive_int(section, "windows", SlowNodeConfig.windows),
        window=duration(
            section.raw("window"),
            section.key("window"),
            SlowNodeConfig.window,
            minimum=1.0,
            off=True,
        ),
    )
    section.reject_unknown()
    return config


def _recovery(section: Section) -> str:
    hint = "in_place needs a script written for nodeagent.worker.elastic"
    return choice(section, "recovery", RECOVERY_MODES, "restart", hint)


def _python(section: Section) -> str | None:
    """job.python: an absolute path, exec'd as is (no PATH lookup, which differs under systemd)."""
    python = optional_path(section, "python")
    if python is not None and not python.startswith("/"):
        raise ConfigError(section.key("python"), f"must be an absolute path, got {python!r}")
    return python


def _run_as(section: Section, env: dict[str, str], resolve: Resolver) -> WorkerUser:
    """job.user (default: the nodeagent system user), job.group (default: the user's own) and
    job.allow_root, checked against this node's user database (nodeagent.config.identity)."""
    names = {}
    for name in ("user", "group"):
        value = section.raw(name)
        if value is not None and (not isinstance(value, str) or not value or "\0" in value):
            raise ConfigError(section.key(name), f"expected a {name} name, got {value!r}")
        names[name] = value
    allow_root = section.get("allow_root", bool, False)
    return resolve_user(names["user"], names["group"], allow_root, env, resolve)


def _entrypoint(section: Section) -> tuple[str, ...]:
    entrypoint = section.raw("entrypoint")
    if isinstance(entrypoint, str) or not isinstance(entrypoint, list) or not entrypoint:
        raise ConfigError(
            section.key("entrypoint"),
            "required: a non-empty list such as [python, train.py] (it is exec'd, no shell)",
        )
    for i, arg in enumerate(entrypoint):
        if not env_scalar(arg) or "\0" in str(arg):
            raise ConfigError(f"{section.key('entrypoint')}[{i}]", not_a_string(arg))
    return tuple(str(arg) for arg in entrypoint)


def _env(section: Section) -> dict[str, str]:
    """job.env: variable names to strings; lists, maps, null and booleans are refused rather
    than passed on as "[1, 2]", "None" or "True"."""
    env = section.raw("env")
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ConfigError(section.key("env"), "expected a mapping of variable names to strings")
    result = {}
    for name, value in env.items():
        key = f"{section.key('env')}.{name}"
        if not isinstance(name, str) or not name or "=" in name or "\0" in name:
            raise ConfigError(key, "a variable name is a non-empty string without '='")
        if not env_scalar(value) or "\0" in str(value):
            raise ConfigError(key, not_a_string(value))
        result[name] = str(value)
    return result


def _preload(section: Section, entrypoint: tuple[str, ...]) -> tuple[str, ...]:
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


# 0 is zero where zero makes sense: a stop grace of 0 kills at once, a join_settle of 0 forms
# as soon as min_nodes are there, a hang_timeout of 0 (or off) watches nothing. A heartbeat, a
# lease or a rendezvous timeout of 0 cannot work and is an error.
_TIMING_RULES: Mapping[str, Mapping[str, Any]] = {
    "heartbeat_interval": {"minimum": 0.05},
    "lease_ttl": {"positive": True},
    "stop_grace_period": {},
    "failure_stop_grace_period": {},
    "join_settle": {},
    "rendezvous_timeout": {"positive": True},
    "hang_timeout": {"off": True},
    "stopped_timeout": {"off": True},
    "restart_backoff": {"off": True},
    "restart_backoff_max": {},
    "restart_backoff_reset": {},
    "reform_timeout": {"positive": True},
    "peer_interval": {"off": True},
    "peer_timeout": {"positive": True},
    "peer_phi": {},  # not a duration: _phi
    "waited_phi": {},  # not a duration: _phi
    "ride_through": {"off": True},
}
# What a job may set for itself (a job spec's timing:); the heartbeat, the lease and the peer
# watch are the node's: every job a node serves is fenced on the same lease.
PEER_INTERVAL_MIN = 0.01  # a beat more often than this is a busy loop, not a faster watch
NODE_TIMING = (
    "heartbeat_interval",
    "lease_ttl",
    "peer_interval",
    "peer_timeout",
    "peer_phi",
    "ride_through",
)
PHIS = ("peer_phi", "waited_phi")  # thresholds, not durations
PHI_MIN = 1.0  # one late beat in ten suspected: below, a threshold suspects healthy peers
JOB_TIMING = tuple(name for name in _TIMING_RULES if name not in NODE_TIMING)


def _timed(section: Section, base: TimingConfig, names: tuple[str, ...]) -> TimingConfig:
    values = {
        name: (
            _phi(section, name, getattr(base, name))
            if name in PHIS
            else duration(
                section.raw(name), section.key(name), getattr(base, name), **_TIMING_RULES[name]
            )
        )
        for name in names
    }
    section.reject_unknown()
    return dataclasses.replace(base, **values)


def _phi(section: Section, name: str, default: float) -> float:
    """timing.peer_phi, timing.waited_phi: an accrual detector's threshold (job/accrual.py), a
    number, or off."""
    raw = section.raw(name)
    if raw is None:
        return default
    if raw is False or raw == "off":
        return 0.0
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not PHI_MIN <= raw < 100:
        raise ConfigError(
            section.key(name),
            f"must be off or a number from {PHI_MIN:g} to 100 (phi: a silence suspected when a "
            f"beat that late has one chance in 10^phi; Cassandra and Akka use 8), got {raw!r}",
        )
    return float(raw)


def _load_timing(section: Section) -> TimingConfig:
    timing = _timed(section, TimingConfig(), tuple(_TIMING_RULES))
    if timing.lease_ttl < 2 * timing.heartbeat_interval:
        raise ConfigError(
            section.key("lease_ttl"),
            f"must be at least twice heartbeat_interval ({timing.heartbeat_interval}s) so one late "
            f"heartbeat does not expire the lease, got {timing.lease_ttl}s",
        )
    if 0 < timing.peer_interval < PEER_INTERVAL_MIN:
        raise ConfigError(
            section.key("peer_interval"),
            f"must be off or at least {PEER_INTERVAL_MIN * 1000:g}ms, got {timing.peer_interval}s",
        )
    if timing.peer_interval > 0 and timing.peer_timeout < 3 * timing.peer_interval:
        raise ConfigError(
            section.key("peer_timeout"),
            f"must be at least three times peer_interval ({timing.peer_interval}s) so one late "
            f"beat does not make a peer suspect, got {timing.peer_timeout}s",
        )
    return _ride_through(section, timing)


def _ride_through(section: Section, timing: TimingConfig) -> TimingConfig:
    """timing.ride_through: off, or at least the lease (a shorter ride ends before the lease
    lapses, which it is for); off by itself where the peer watch is (it rides on the beats)."""
    ride = timing.ride_through
    if timing.peer_interval <= 0 and ride > 0:
        if section.raw("ride_through") is None:
            return dataclasses.replace(timing, ride_through=0.0)
        raise ConfigError(
            section.key("ride_through"),
            "needs the peer watch (a member rides through only while it hears every other "
            f"member): set peer_interval, or ride_through: off; got {ride}s",
        )
    if 0 < ride < timing.lease_ttl:
        raise ConfigError(
            section.key("ride_through"),
            f"must be off or at least lease_ttl ({timing.lease_ttl}s), got {ride}s",
        )
    return timing


def job_timing(section: Section, base: TimingConfig) -> TimingConfig:
    """A job spec's timing: section over the node's `base` (only the keys in JOB_TIMING).

    Raises:
        ConfigError: naming the key; NODE_TIMING's keys are refused (the node's).
    """
    for name in NODE_TIMING:
        if section.raw(name) is not None:
            raise ConfigError(
                section.key(name), "is the node's (its config's timing:), not a job's to set"
            )
    return _timed(section, base, JOB_TIMING)


def _load_health(section: Section) -> HealthConfig:
    raw_gpu = section.raw("gpu")  # YAML makes a bare on/off a boolean
    gpu = (
        ("on" if raw_gpu else "off")
        if isinstance(raw_gpu, bool)
        else choice(section, "gpu", GPU_MODES, "auto")
    )
    interval = duration(section.raw("interval"), section.key("interval"), 5.0, minimum=0.05)
    fake = optional_path(section, "fake_gpus")
    if fake is not None and not Path(fake).is_file():
        raise ConfigError(section.key("fake_gpus"), f"no such file: {fake}")
    health = HealthConfig(
        gpu=gpu,
        interval=interval,
        max_temperature_c=optional_limit(section, "max_temperature_c", float),
        max_ecc_uncorrected=positive_int(section, "max_ecc_uncorrected", 0, minimum=0),
        max_pcie_replays=optional_limit(section, "max_pcie_replays", int),
        auto_uncordon=section.get("auto_uncordon", bool, False),
        fake_gpus=fake,
        constrain_devices=section.get("constrain_devices", bool, False),
    )
    if health.constrain_devices and gpu == "off":
        raise ConfigError(
            section.key("constrain_devices"),
            "needs GPU monitoring, which says which device nodes are a job's: health.gpu auto "
            "or on, not off",
        )
    section.reject_unknown()
    return health


def _load_logging(section: Section) -> LoggingConfig:
    fmt = section.get("format", str, "text")
    if fmt not in LOG_FORMATS:
        raise ConfigError(section.key("format"), f"must be text or json, got {fmt!r}")
    level = section.get("level", str, "INFO").upper()
    if level not in LOG_LEVELS:
        raise ConfigError(  # not choice(): any case is taken (info, INFO)
            section.key("level"), f"must be one of {', '.join(LOG_LEVELS)}, got {level!r}"
        )
    section.reject_unknown()
    return LoggingConfig(format=fmt, level=level)


def _load_metrics(section: Section) -> MetricsConfig:
    if section.raw("listen") is False:  # a bare `off` in YAML
        section.reject_unknown()
        return MetricsConfig(listen="off")
    listen = section.get("listen", str, MetricsConfig.listen)
    if listen == "off":
        section.reject_unknown()
        return MetricsConfig(listen="off")
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535 or "\0" in host:
        raise ConfigError(
            section.key("listen"), f"expected HOST:PORT such as 127.0.0.1:9410, got {listen!r}"
        )
    section.reject_unknown()
    return MetricsConfig(listen=f"{host}:{port}")


def load_settings(data: object, resolve: Resolver | None = None) -> NodeSettings:
    """Build a node's validated settings from a parsed YAML document; a Config when it has a
    `job:` section (a node pinned to that job), else job-less (a pool node).

    Raises:
        ConfigError: the first invalid key, by its dotted name.
    """
    resolve = resolve or Resolver()
    root = Section(data, "")
    redis_section = root.section("redis")
    url = redis_section.get("url", str, "")
    job_data = root.raw("job")
    one_node = isinstance(job_data, Mapping) and job_data.get("max_nodes", 1) == 1
    if not url and one_node:
        url = EMBEDDED  # standalone, as torchrun --standalone
    if not url:
        raise ConfigError(
            "redis.url",
            "required for a pool or a multi-node job: a URL such as redis://10.0.0.2:6379/0",
        )
    redis = RedisConfig(
        url=_check_redis_url(url, "redis.url"),
        key_prefix=check_name(
            redis_section.get("key_prefix", str, "nodeagent"), "redis.key_prefix"
        ),
    )
    redis_section.reject_unknown()
    settings = NodeSettings(
        node=_load_node(root.section("node"), url, resolve),
        redis=redis,
        timing=_load_timing(root.section("timing")),
        metrics=_load_metrics(root.section("metrics")),
        health=_load_health(root.section("health")),
        logging=_load_logging(root.section("logging")),
        log_dir=path_value(root, "log_dir", "/var/log/nodeagent"),
        state_dir=optional_path(root, "state_dir"),
        pool=load_pool(root.section("pool"), pinned=job_data is not None),
        containers=load_rule(root.section("containers")),
        isolation=load_isolation(root.section("isolation")),
    )
    job = None if job_data is None else _load_job(root.section("job"), resolve)
    root.reject_unknown()
    if job is not None and job.container is not None:
        why = node_refusal(settings.containers, job.container, resolve.real_path)
        if why is not None:
            raise ConfigError("job.container", f"{why} (its containers: section)")
    if settings.redis.url == EMBEDDED and (job is None or job.max_nodes > 1):
        raise ConfigError(
            "redis.url",
            "'embedded' Redis serves one node of one job, but "
            + ("there is no job: section" if job is None else f"job.max_nodes is {job.max_nodes}")
            + "; give a Redis URL all nodes reach",
        )
    return settings if job is None else settings.running(job)


def load_config(data: object, resolve: Resolver | None = None) -> Config:
    """A validated Config: a node's settings with its `job:` section.

    Raises:
        ConfigError: the first invalid key, by its dotted name; `job.id` when there is no job.
    """
    settings = load_settings(data, resolve)
    if not isinstance(settings, Config):
        raise ConfigError("job.id", "required: a job id such as llama-ft")
    return settings


def read_config(path: str | Path, resolve: Resolver | None = None) -> Config:
    """Read and validate a YAML config file with a `job:` section.

    Raises:
        ConfigError: as read_settings, and `job.id` when the file has no job.
    """
    settings = read_settings(path, resolve)
    if not isinstance(settings, Config):
        raise ConfigError("job.id", f"required: {path} has no job: section")
    return settings


def read_settings(path: str | Path, resolve: Resolver | None = None) -> NodeSettings:
    """Read and validate a node's YAML config file (a `job:` section is optional).

    Raises:
        ConfigError: the file is missing, unreadable, not UTF-8, not YAML (or has a key twice),
            or invalid.
    """
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError("", f"cannot read config file {path}: {exc.strerror}") from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            "", f"{path} is not UTF-8 text: byte {raw[exc.start]:#04x} on line {line}"
        ) from None
    try:
        data = strictyaml.load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("", f"{path} is not valid YAML: {exc}") from exc
    return load_settings(data, resolve)
