"""Job specs: what `nodeagentctl submit` sends to a pool, validated like a node's config.

A spec holds the keys of a `job:` section (config.job_fields: entrypoint, nproc_per_node,
min/max/target nodes, max_restarts, env, working_dir, gpus_per_worker, preload, python), whom
it runs as (`user`, `group`), the job's own `timing:` (config.JOB_TIMING: hang_timeout, stop
grace periods, rendezvous timeout, join settle, restart backoff), and where it queues (`queue`,
`priority`: stored now, ordered by the scheduler). Every error names the key and what would be
right, as the config's do.

In Redis a spec is stored as the normalised document `to_dict()` gives, and every node that is
placed on the job validates it again (`from_json`): a spec is input from whoever could write to
Redis, never trusted. Whom it runs as is decided on the node (`run_config`): the node's
`pool.users`/`pool.groups` must allow the user, and root needs `pool.allow_root`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nodeagent.config.container import Mount, on_node
from nodeagent.config.hosts import Resolver
from nodeagent.config.identity import resolve as resolve_user
from nodeagent.config.load import JOB_TIMING, job_fields, job_timing
from nodeagent.config.settings import (
    CheckpointConfig,
    Config,
    JobConfig,
    NodeSettings,
    SlowNodeConfig,
    TimingConfig,
)
from nodeagent.config.values import Section, check_name, parse_duration, parse_signal
from nodeagent.errors import ConfigError, CorruptStateError
from nodeagent.model import array, depend, notify
from nodeagent.model.array import Array, ArrayError, ArrayTask, task_id, task_of
from nodeagent.model.credential import digest_of
from nodeagent.model.depend import Dependency, DependencyError
from nodeagent.model.gpus import MAX_GPUS_PER_NODE
from nodeagent.model.notify import NotifyError
from nodeagent.model.request import REQUEST_ID

MAX_PRIORITY = 1_000_000
BATCH, ALLOCATION = "batch", "allocation"  # a job's kinds: its own program, or nodes held
KINDS = (BATCH, ALLOCATION)
SPEC_MAX_BYTES = 64 * 1024  # a spec is a page of YAML; anything bigger is not one
_SLOW_FIELDS = dataclasses.fields(SlowNodeConfig)  # flat: no asdict deep copy per spec
_FIELDS = (
    "id",
    "entrypoint",
    "nproc_per_node",
    "min_nodes",
    "max_nodes",
    "target_nodes",
    "max_restarts",
    "env",
    "working_dir",
    "gpus_per_worker",
    "preload",
    "python",
    "recovery",
    "checkpoint",
    "slow_node",
    "container",
    "mem",
    "mem_per_gpu",
    "cpus_per_gpu",
)


@dataclass(frozen=True)
class JobSpec:
    """One submitted job. `job.user` is None: who runs it is the node's decision."""

    job: JobConfig
    user: str
    group: str | None = None
    timing: Mapping[str, float] = field(default_factory=dict)  # JOB_TIMING keys given, seconds
    queue: str = "default"
    priority: int = 0
    submitted_by: str = ""
    selector: Mapping[str, str] = field(default_factory=dict)  # labels a node must have
    preemptible: bool = False  # may be evicted whole for a job of higher priority
    # pool.auth munge: an agent's signature over the rest (signed_digest): a MUNGE credential,
    # or an HMAC with the pool's key (pool/authority.py)
    signature: str = ""
    time_limit: float | None = None  # seconds it may run once admitted (sbatch --time)
    signal: tuple[str, float] | None = None  # (USR1, 300): sent 300 s before the time limit
    dependency: tuple[Dependency, ...] = ()  # what must hold first (sbatch --dependency)
    # the run of each job named there, by its pool seq, bound at submission: a parent's id
    # taken over later by another job (its own user's, or anyone's) changes nothing
    dependency_runs: Mapping[str, int] = field(default_factory=dict)
    name: str | None = None  # its name for `singleton` (sbatch --job-name; default: its id)
    array: Array | None = None  # a submission of one job per task (sbatch --array)
    array_task: ArrayTask | None = None  # the task of an array this job is
    notify: tuple[str, ...] = ()  # what its user is told of (model/notify.py; --mail-type)
    gpus_per_node: int | None = None  # GPU units it holds on each node (None: the whole node)
    exclusive: bool = False  # the whole node whatever it asks for (sbatch --exclusive)
    # batch: its entrypoint is the job; allocation: nodes held for a user's commands and
    # shells (nodeagentctl alloc, as salloc), a holder on each node in place of a program.
    kind: str = BATCH
    # An allocation held from a terminal (nodeagentctl alloc): its holder renews a lease of it
    # (PoolStore.keep_holder); the pool leader cancels it once the lease runs out.
    attended: bool = False
    # The request that submitted it (nodeagentctl's, the API's Idempotency-Key): the same
    # request arriving again is this submission, never a second job (coord/poolscripts.py).
    request: str = ""

    @property
    def id(self) -> str:
        return self.job.id

    @functools.cached_property
    def signed_digest(self) -> str:
        """What the spec's signature binds: the digest of the spec without it (made once per
        spec object: the pool leader checks every queued spec every round)."""
        unsigned = dataclasses.replace(self, signature="") if self.signature else self
        return digest_of(unsigned.to_json().encode())

    def signed_with(self, signature: str) -> JobSpec:
        """This spec carrying `signature`, its digest (which leaves the signature out) kept
        rather than made again: the pool leader signs every submission it takes."""
        signed = dataclasses.replace(self, signature=signature)
        vars(signed)["signed_digest"] = self.signed_digest
        return signed

    def to_dict(self) -> dict[str, Any]:
        """The normalised document: load_spec(to_dict()) gives this spec back."""
        job = self.job
        doc: dict[str, Any] = {
            "id": job.id,
            "entrypoint": list(job.entrypoint),
            "nproc_per_node": job.nproc_per_node,
            "min_nodes": job.min_nodes,
            "max_nodes": job.max_nodes,
            "target_nodes": job.target_nodes,
            "max_restarts": job.max_restarts,
            "env": dict(job.env),
            "gpus_per_worker": job.gpus_per_worker,
            "preload": list(job.preload),
            "recovery": job.recovery,
            "slow_node": {f.name: getattr(job.slow_node, f.name) for f in _SLOW_FIELDS},
            "user": self.user,
            "queue": self.queue,
            "priority": self.priority,
            "timing": dict(self.timing),
            "selector": dict(self.selector),
            "preemptible": self.preemptible,
        }
        optional = {
            "working_dir": job.working_dir,
            "python": job.python,
            "checkpoint": _checkpoint_doc(job.checkpoint),
            "container": job.container.to_doc() if job.container is not None else None,
            "group": self.group,
            "submitted_by": self.submitted_by or None,
            "signature": self.signature or None,
            "time_limit": self.time_limit,
            "signal": f"{self.signal[0]}@{self.signal[1]:g}" if self.signal else None,
            "dependency": depend.text(self.dependency) or None,
            "dependency_runs": dict(self.dependency_runs) or None,
            "name": self.name,
            "array": str(self.array) if self.array is not None else None,
            "array_task": self.array_task.to_doc() if self.array_task is not None else None,
            "notify": ",".join(self.notify) or None,
            "gpus_per_node": self.gpus_per_node,
            "mem": job.mem,
            "mem_per_gpu": job.mem_per_gpu,
            "cpus_per_gpu": job.cpus_per_gpu,
            "exclusive": self.exclusive or None,
            "kind": self.kind if self.kind != BATCH else None,
            "attended": self.attended or None,
            "request": self.request or None,
        }
        doc.update({k: v for k, v in optional.items() if v is not None})
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> JobSpec:
        """A spec read back from Redis.

        Raises:
            CorruptStateError: not JSON, or not a valid spec (naming the key); nothing else.
        """
        if len(raw) > SPEC_MAX_BYTES:
            raise CorruptStateError(f"job spec: {len(raw)} bytes, more than {SPEC_MAX_BYTES}")
        try:
            data = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise CorruptStateError(f"job spec: not JSON: {exc}") from None
        try:
            return load_spec(data, submitted=True)
        except ConfigError as exc:
            raise CorruptStateError(f"job spec: {exc}") from None


def new_job_id() -> str:
    """A job id for a submission that names none: job- and 8 random hex digits."""
    return f"job-{secrets.token_hex(4)}"


def load_spec(
    data: object,
    *,
    default_user: str | None = None,
    job_id: str | None = None,
    submitted: bool = False,
) -> JobSpec:
    """A validated spec from a parsed YAML (or JSON) document.

    Args:
        default_user: the user when the document names none (nodeagentctl: the submitter's).
        job_id: overrides the document's `id` (`submit --name`).
        submitted: the document came from Redis, so `submitted_by` may be in it.

    Raises:
        ConfigError: the first invalid key, by its name in the spec.
    """
    if isinstance(data, Mapping) and job_id is not None:
        data = {**data, "id": job_id}
    root = Section(data, "")
    job = job_fields(root)
    if root.raw("allow_root") is not None:
        raise ConfigError(
            "allow_root", "root is allowed by each node (its pool.allow_root), not by a job"
        )
    _nodes_own_paths(job.checkpoint)
    user = root.get("user", str, default_user or "")
    if not user or "\0" in user:
        raise ConfigError("user", "required: the Unix user the job runs as, such as alice")
    group = root.get("group", str, "") or None
    timing = _timing(root.section("timing"))
    queue = check_name(root.get("queue", str, "default"), "queue")
    priority = root.get("priority", int, 0)
    if not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        raise ConfigError("priority", f"must be within +-{MAX_PRIORITY}, got {priority}")
    submitted_by = root.get("submitted_by", str, "") if submitted else ""
    signature = root.get("signature", str, "") if submitted else ""
    selector = _selector(root)
    preemptible = root.get("preemptible", bool, False)
    time_limit, signal = _time_limit(root)
    dependency = _dependency(root)
    name = root.get("name", str, "") or None
    if name is not None:
        check_name(name, "name")
    array = _array(root, job.id)
    told = _notify(root)
    runs = _runs(root.raw("dependency_runs")) if submitted else {}
    gpus_per_node = _gpus_per_node(root, job)
    exclusive = root.get("exclusive", bool, False)
    kind = root.get("kind", str, BATCH)
    if kind not in KINDS:
        raise ConfigError("kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    attended = root.get("attended", bool, False)
    if attended and kind != ALLOCATION:
        raise ConfigError("attended", f"only an allocation is attended (kind: {ALLOCATION})")
    task = _array_task(root.section("array_task")) if submitted and root.raw("array_task") else None
    request = root.get("request", str, "") if submitted else ""
    if not REQUEST_ID.match(request):
        raise ConfigError("request", f"not a request id: {request[:80]!r}")
    root.reject_unknown()
    return JobSpec(
        job,
        user,
        group,
        timing,
        queue,
        priority,
        submitted_by[:256],
        selector,
        preemptible,
        signature[:4096],
        time_limit=time_limit,
        signal=signal,
        dependency=dependency,
        name=name,
        array=array,
        array_task=task,
        notify=told,
        dependency_runs=runs,
        gpus_per_node=gpus_per_node,
        exclusive=exclusive,
        kind=kind,
        attended=attended,
        request=request,
    )


def _gpus_per_node(root: Section, job: JobConfig) -> int | None:
    """gpus_per_node: the GPU units the job holds on each of its nodes, at least what its
    workers are handed (nproc_per_node x gpus_per_worker). Raises: ConfigError."""
    given = root.get("gpus_per_node", int, 0)
    if root.raw("gpus_per_node") is None:
        return None
    if not 1 <= given <= MAX_GPUS_PER_NODE:
        raise ConfigError(
            "gpus_per_node",
            f"must be within 1..{MAX_GPUS_PER_NODE}, got {given} (omit it: the whole node)",
        )
    used = job.nproc_per_node * job.gpus_per_worker
    if used > given:
        raise ConfigError(
            "gpus_per_node",
            f"{given}, but nproc_per_node {job.nproc_per_node} x gpus_per_worker "
            f"{job.gpus_per_worker} hand out {used} GPUs on each node: ask for {used}, or "
            "fewer workers",
        )
    return given


def _runs(raw: object) -> dict[str, int]:
    """dependency_runs, as the pool stored it: job id -> the seq of the run named."""
    section = Section(raw, "dependency_runs")
    found: dict[str, int] = {}
    for name in list(raw) if isinstance(raw, Mapping) else []:
        found[check_name(str(name), section.key(str(name)))] = section.get(str(name), int, 0)
    return found


def _notify(root: Section) -> tuple[str, ...]:
    given = root.get("notify", str, "")
    try:
        return notify.parse(given) if given else ()
    except NotifyError as exc:
        raise ConfigError("notify", str(exc)) from None


def array_tasks(spec: JobSpec) -> list[JobSpec]:
    """The jobs an array submission makes, one per task: `JOB_T`, each with its task's
    variables in its environment (model/array.py)."""
    if spec.array is None:
        return [spec]
    found = []
    for index in spec.array.indices:
        task = task_of(spec.id, spec.array, index)
        job = dataclasses.replace(
            spec.job, id=task_id(spec.id, index), env={**spec.job.env, **task.env()}
        )
        found.append(dataclasses.replace(spec, job=job, array=None, array_task=task))
    return found


def _array(root: Section, job_id: str) -> Array | None:
    given = root.get("array", str, "")
    if not given:
        return None
    try:
        found = array.parse(given)
    except ArrayError as exc:
        raise ConfigError("array", str(exc)) from None
    longest = task_id(job_id, found.indices[-1])
    if len(longest) > 63:
        raise ConfigError("array", f"task id {longest!r} is over 63 characters: a shorter id")
    return found


def _array_task(section: Section) -> ArrayTask:
    limit = section.get("limit", int, 0)
    return ArrayTask(
        check_name(section.get("job", str, ""), "array_task.job"),
        section.get("index", int, 0),
        section.get("count", int, 0),
        section.get("first", int, 0),
        section.get("last", int, 0),
        limit or None,
    )


def _dependency(root: Section) -> tuple[Dependency, ...]:
    given = root.get("dependency", str, "")
    if not given:
        return ()
    try:
        return depend.parse(given)
    except DependencyError as exc:
        raise ConfigError("dependency", str(exc)) from None


def _time_limit(root: Section) -> tuple[float | None, tuple[str, float] | None]:
    """time_limit (a duration, more than 0) and signal (SIGNAL[@TIME], needs a time_limit, its
    TIME below it).

    Raises: ConfigError naming the key."""
    raw_limit, raw_signal = root.raw("time_limit"), root.raw("signal")
    limit = None if raw_limit is None else parse_duration(raw_limit, "time_limit")
    if limit is not None and limit <= 0:
        raise ConfigError("time_limit", f"must be more than 0, got {raw_limit!r}")
    if raw_signal is None:
        return limit, None
    signal = parse_signal(raw_signal, "signal")
    if limit is None:
        raise ConfigError("signal", "is sent before the time limit: give a time_limit (--time)")
    if signal[1] >= limit:
        raise ConfigError(
            "signal",
            f"{signal[1]:g}s before the end of a time limit of {limit:g}s: it would be sent "
            "at once; give a time below the limit",
        )
    return limit, signal


def _nodes_own_paths(checkpoint: CheckpointConfig | None) -> None:
    """A submitted job names no path the agent writes as root: its memory tier is where each
    node keeps them (the default memory_dir). Its persistent tier, a directory the submitter
    chose, the agent writes as the job's user (run_config).

    Raises: ConfigError naming the key."""
    if checkpoint is None:
        return
    if checkpoint.memory_dir != CheckpointConfig.memory_dir:
        raise ConfigError(
            "checkpoint.memory_dir",
            "where the memory tier lives is each node's decision, not a submitted job's "
            f"(they keep it under {CheckpointConfig.memory_dir}): remove the key",
        )


def _checkpoint_doc(checkpoint: CheckpointConfig | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    doc = dataclasses.asdict(checkpoint)
    del doc["persist_as_user"]  # each node's decision (run_config), not the spec's
    doc["replication"] = {
        "max_rate": doc.pop("max_rate"),
        "port": doc.pop("replica_port"),
        "auth": doc.pop("replica_auth"),
    }
    return {k: v for k, v in doc.items() if v is not None}


def _selector(root: Section) -> dict[str, str]:
    """selector: the labels (a node's pool.labels) a node must carry to be placed on the job."""
    raw = root.raw("selector") or {}
    if not isinstance(raw, Mapping):
        raise ConfigError("selector", "expected a mapping of labels, such as {gpu: h100}")
    selector = {}
    for name, value in raw.items():
        key = f"selector.{name}"
        check_name(str(name), key)
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise ConfigError(key, f"expected a label value such as h100, got {value!r}")
        selector[str(name)] = str(value)
    return selector


def _timing(section: Section) -> dict[str, float]:
    """The durations the spec gives (validated by config.job_timing's rules), in seconds."""
    defaults = TimingConfig()
    merged = job_timing(section, defaults)
    given = {name for name in JOB_TIMING if section.raw(name) is not None}
    return {name: getattr(merged, name) for name in JOB_TIMING if name in given}


def spec_of(job: JobConfig, timing: TimingConfig) -> JobSpec:
    """The spec a node pinned by its `job:` section submits for it (shown by `jobs`). Without
    the checkpoint tiers' paths: each node keeps its own, and a spec in Redis names none (the
    pool leader would find it unreadable, and the job's placement would flap)."""
    user = job.user.name if job.user is not None else "unknown"
    times = {key: getattr(timing, key) for key in JOB_TIMING}
    checkpoint = job.checkpoint
    if checkpoint is not None:
        checkpoint = dataclasses.replace(
            checkpoint, memory_dir=CheckpointConfig.memory_dir, persist_dir=None
        )
    return JobSpec(dataclasses.replace(job, user=None, checkpoint=checkpoint), user, timing=times)


def run_config(spec: JobSpec, settings: NodeSettings, resolve: Resolver | None = None) -> Config:
    """What this node runs the job with: its settings, the spec's job and timing, and the
    workers' user, if this node allows it. Its persistent tier is copied as that user (in a
    container, bound in as one of the job's mounts, judged like them).

    Raises:
        ConfigError: naming `user` (or `group`): not allowed on this node, unknown here, or
            root without pool.allow_root; naming `container`: an image or a mount this node's
            `containers:` section does not allow.
    """
    resolve = resolve or Resolver()
    pool = settings.pool
    account = resolve.user(spec.user)
    if account is None:
        raise ConfigError("user", f"no such user on node {settings.node.name}: {spec.user!r}")
    if account.uid == 0 and not pool.allow_root:
        raise ConfigError(
            "user", f"root is not allowed on node {settings.node.name} (its pool.allow_root)"
        )
    if account.uid != 0 and not _allowed(spec.user, account.gid, pool.users, pool.groups, resolve):
        raise ConfigError(
            "user",
            f"{spec.user!r} may not run jobs on node {settings.node.name}: not in its "
            f"pool.users ({', '.join(pool.users) or 'none'}) nor a member of its pool.groups "
            f"({', '.join(pool.groups) or 'none'})",
        )
    checkpoint = spec.job.checkpoint
    persist = checkpoint.persist_dir if checkpoint is not None else None
    if checkpoint is not None and persist is not None:
        checkpoint = dataclasses.replace(checkpoint, persist_as_user=True)
    container = spec.job.container
    if container is not None:
        if persist is not None:  # bound into the containers: judged as any mount the job asks for
            mounts = (*container.mounts, Mount(persist, persist))
            container = dataclasses.replace(container, mounts=mounts)
        placed = on_node(settings.containers, container, resolve.real_path)
        if isinstance(placed, str):
            raise ConfigError("container", f"node {settings.node.name}: {placed}")
        container = placed  # mounts from the paths resolved and judged here
    worker = resolve_user(spec.user, spec.group, pool.allow_root, spec.job.env, resolve)
    timing = dataclasses.replace(settings.timing, **spec.timing)
    job = dataclasses.replace(spec.job, user=worker, container=container, checkpoint=checkpoint)
    return settings.running(job, timing)


def _allowed(
    user: str, gid: int, users: tuple[str, ...], groups: tuple[str, ...], resolve: Resolver
) -> bool:
    if user in users:
        return True
    member_of = set(resolve.groups_of(user, gid))
    return any(resolve.group(name) in member_of for name in groups)
