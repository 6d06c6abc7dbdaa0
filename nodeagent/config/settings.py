"""A node's settings as frozen dataclasses, and the constants their values are checked against.

Built only by config/load.py; every other package reads them. `NodeSettings` is a node's file;
`Config` is what one job runs with on this node (the node's settings and the job).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from nodeagent.config import redisurl
from nodeagent.config.container import ContainerRule, ContainerSpec
from nodeagent.config.identity import WorkerUser
from nodeagent.config.isolation import IsolationConfig
from nodeagent.config.values import parse_duration as parse_duration  # nodeagentctl's --timeout

EX_CONFIG = 78


REDIS_SCHEMES = redisurl.SCHEMES


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
class CheckpointConfig:
    """job.checkpoint: the tiers the agent keeps the job's checkpoints in (docs/checkpoints.md).

    The memory tier is `<memory_dir>/<node>.<job>` on tmpfs, made by the agent before the
    workers start, at most `memory_size` bytes on this node (two slots per local rank); the
    persistent tier is `persist_dir`, shared by the job's nodes, where the agent copies the
    newest step every `persist_every` saves and whenever the job stops. Each node's last step is
    copied to `replicas` peers' replica areas (docs/checkpoints.md, "Surviving a node")."""

    memory_size: int
    memory_dir: str = "/dev/shm/nodeagent"
    persist_dir: str | None = None
    persist_every: int = 10
    replicas: int = 1  # peers that hold a copy of each rank's last step (issue 27; 0: none)
    max_rate: int = 0  # bytes a second this node sends to peers (0: unbounded)
    replica_port: int = 0  # the replica listener's port on node.address (0: any free one)
    # How peers on the checkpoint plane prove they are agents (checkpoint/peerauth.py): munge,
    # or none (anyone who reaches the listener; only where the config says so). Under
    # pool.auth: munge the plane is always munge's.
    replica_auth: str = "munge"
    # Copies into persist_dir run as the workers' user (checkpoint/persistcopy.py), never as
    # root: set for a submitted job, whose persist_dir its submitter chose (model/spec.py's
    # run_config). Never read from a config file or a spec.
    persist_as_user: bool = False

    def memory_tier(self, node: str, job: str) -> str:
        return f"{self.memory_dir.rstrip('/') or '/'}/{node}.{job}"

    def replica_area(self, node: str, job: str) -> str:
        """Where this node keeps the copies of peers' saves it holds: beside the memory tier,
        the agent's own (the workers read it, never write it)."""
        return beside_tier(self.memory_tier(node, job), "replicas")

    def rank_limit(self, nproc_per_node: int) -> int:
        """Bytes one rank's save may take: two slots per local rank share memory_size."""
        return self.memory_size // (2 * nproc_per_node)


def beside_tier(tier: str, kind: str) -> str:
    """A directory of a job's own beside its memory tier `tier` (its replica area, its
    containers' /dev/shm and run files): `<tier>+<kind>`. '+' is a character no job id or node
    name may hold (config/values.check_name), so no job's tier is another job's directory of
    this kind (job `train.replicas`'s tier was once job `train`'s replica area)."""
    return f"{tier}+{kind}"


SLOW_NODE_POLICIES = ("report", "replace", "exclude")


@dataclass(frozen=True)
class SlowNodeConfig:
    """job.slow_node: how the leader finds a slow member and what it does (docs/slow-nodes.md)."""

    policy: str = "report"  # SLOW_NODE_POLICIES
    threshold: float = 1.5  # a member's own work a step over its peers' median
    windows: int = 3  # windows in a row above it to name the node slow, below it to clear it
    window: float = 10.0  # seconds; 0: off (no node measures its speed)


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
    # Who the workers run as (job.user, job.group, job.allow_root), resolved on this node when
    # the config was loaded; None: as the agent itself (a JobConfig built in code).
    user: WorkerUser | None = None
    # The interpreter a bare `python`/`python3` entrypoint program means (job.python); None:
    # the one the agent runs under, as torchrun runs workers with its own sys.executable.
    python: str | None = None
    # What a re-form does to the workers that survive it (RECOVERY_MODES): restart them all, as
    # torchrun does, or keep them running (in_place: nodeagent.worker.elastic scripts only).
    recovery: str = "restart"
    checkpoint: CheckpointConfig | None = None  # None: no tiers (the script's own checkpoints)
    slow_node: SlowNodeConfig = field(default_factory=SlowNodeConfig)
    # The image its workers run in and what is mounted into it (docs/pool.md, "Your own
    # software"); None: they run on the node's own software.
    container: ContainerSpec | None = None
    # The memory its workers on a node may use together (config/isolation.py): `mem` a node's
    # whole, or `mem_per_gpu` times the GPUs it holds there; neither: the node's default share.
    mem: int | None = None
    mem_per_gpu: int | None = None
    # The CPUs of its own per GPU it holds on a node (model/cores.py); None: all its GPUs' cores.
    cpus_per_gpu: int | None = None

    @property
    def in_place(self) -> bool:
        return self.recovery == IN_PLACE

    @property
    def warm_ups(self) -> bool:
        """Whether a failed worker's replacement warms up while the job goes on without its
        node (supervisor/group.py): in place, but not in containers (a container's name and
        cidfile come from its generation and rank, which a warm-up shares with the worker it
        replaces) nor with checkpoint tiers (every re-form restores there: a smaller world and
        back would reshard twice, from the persistent tier, where the same world restores from
        memory)."""
        return self.in_place and self.container is None and self.checkpoint is None


IN_PLACE = "in_place"


RECOVERY_MODES = ("restart", IN_PLACE)


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
    # A rank that beats and whose process is stopped by a signal (SIGSTOP, SIGTSTP) this long
    # with no beat has hung: it alone, its peers wait for it (job/watch.py). 0: off.
    stopped_timeout: float = 0.5
    # A rank silent in its own work past its step times while every peer waits on it is named
    # hung by the job's leader (job/stalls.py): how unlikely its silence must be at its own step
    # intervals (phi, as peer_phi; 0: off, hang_timeout alone). Only ranks that mark compute.
    waited_phi: float = 8.0
    # Crash-loop backoff: a failed generation that ran less than restart_backoff_reset waits
    # restart_backoff, doubled per such failure in a row, at most restart_backoff_max.
    restart_backoff: float = 1.0  # 0: off
    restart_backoff_max: float = 60.0
    restart_backoff_reset: float = 60.0
    # An in_place job's survivor that has not left its process group this long after being
    # told to is killed (and restarted); a worker with no assignment this long after leaving
    # exits (nodeagent.worker.elastic).
    reform_timeout: float = 60.0
    # The job's members watch each other directly (job/peerwatch.py): a beat every
    # peer_interval (0: off, the leases alone find a lost node); a peer whose agent's
    # connection closes is suspected at once; one whose silence is unlikely at the intervals
    # its beats came at (phi >= peer_phi, job/accrual.py; 0: off) or lasts peer_timeout too. A
    # strict majority of the members suspecting a node re-forms without it (job/suspicion.py).
    peer_interval: float = 0.1
    peer_timeout: float = 2.0
    peer_phi: float = 8.0
    # A member that cannot reach Redis but hears every other member training its generation
    # goes on training past its fence point for up to ride_through after its last renewal
    # (job/ridethrough.py): a Redis failover or stall is not a restart. 0: off (it fences at
    # half the lease). Needs the peer watch (peer_interval).
    ride_through: float = 60.0

    @property
    def redis_timeout(self) -> float:
        """An agent's Redis calls' socket timeout: a quarter of the lease, 0.2 to 2 s."""
        return max(0.2, min(2.0, self.lease_ttl / 4))


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
    constrain_devices: bool = False  # a job's bare workers open only its GPUs' device nodes


LOG_FORMATS = ("text", "json")


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


@dataclass(frozen=True)
class LoggingConfig:
    format: str = "text"  # text: key=value; json: one object a line
    level: str = "INFO"


@dataclass(frozen=True)
class MetricsConfig:
    listen: str = "127.0.0.1:9410"


@dataclass(frozen=True)
class Operators:
    """pool.operators: who acts on every job and alone manages queues, cordons and drains
    (root always does)."""

    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()  # members of these groups


@dataclass(frozen=True)
class Tokens:
    """pool.tokens: API tokens (model/token.py, docs/api.md): the key the pool's agents make
    and check them with ("": this pool mints none and takes none), and the longest lifetime a
    user may ask for."""

    key_file: str = ""
    max_lifetime: float = 86400.0


@dataclass(frozen=True)
class Notify:
    """pool.notify: where the pool leader tells of a job's state changes its submitter asked
    for (`submit --notify`; docs/pool.md, "Notifications"): webhook URLs the operator names
    (a user never names one: root would reach any address for them), each body signed with
    HMAC-SHA256 under the key in `key_file`, each delivery given up after `timeout`."""

    endpoints: tuple[str, ...] = ()
    key_file: str = ""
    timeout: float = 2.0


@dataclass(frozen=True)
class Accounting:
    """pool.accounting: the database every ended job's record goes to (docs/accounting.md).
    `database`: a `postgresql://` URL (a cluster), a `sqlite:///PATH` file, "" for the default
    (the file accounting.sqlite in the agent's state directory: one host), or "none" (no
    records kept beyond pool.keep_ended). `password_file`: PostgreSQL's password, if any."""

    database: str = ""
    password_file: str = ""


@dataclass(frozen=True)
class DurabilityConfig:
    """pool.durability (coord/durable.py): a change the pool answers "done" to is on
    `replicas` replicas (Redis WAIT) within `timeout`, or answered "not acknowledged". 0: a
    single Redis (the write is as safe as its own persistence)."""

    replicas: int = 0
    timeout: float = 1.0


@dataclass(frozen=True)
class FairShareConfig:
    """pool.fair_share (docs/pool.md, "Fair share"): `weight` x each user's fair-share factor
    (in (0, 1]) is added to its jobs' priority; 0 turns it off. Usage decays with `half_life`;
    `shares`: a user's shares, `queues`: a queue's (default 1)."""

    weight: float = 0.0
    half_life: float = 7 * 86400.0
    shares: Mapping[str, float] = field(default_factory=dict)
    queues: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolConfig:
    """The pool this node serves (pool:): its name, free-form labels, and whom it runs jobs as.

    A submitted job runs as the Unix user its spec names only if that user is in `users`, or
    belongs to one of `groups`; root only with `allow_root`; never as the agent's own user.
    """

    name: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    users: tuple[str, ...] = ()
    groups: tuple[str, ...] = ()
    allow_root: bool = False
    reserve_after: float = 300.0  # a pending job that waited this long holds free nodes
    resize_cooldown: float = 60.0  # the scheduler shrinks or grows back a job at most this often
    preempt_after: float = 0.0  # a pending job preempts lower-priority ones after this long
    keep_ended: float = 7 * 86400.0  # an ended job (status, spec, own keys) is pruned after this
    # Who may change the pool (docs/pool.md, "Who is who"): munge (requests carry a MUNGE
    # credential; the default of a pool node) or none (whoever writes Redis: the default of a
    # node pinned by its job: section).
    auth: str = "munge"
    munge_socket: str = "/run/munge/munge.socket.2"
    operators: Operators = field(default_factory=lambda: Operators())
    tokens: Tokens = field(default_factory=lambda: Tokens())
    # The accounts of the API service (nodeagent api) whose MUNGE credential may vouch for the
    # uid of a caller on its Unix socket (SO_PEERCRED); never for root or an operator.
    api_users: tuple[str, ...] = ()
    notify: Notify = field(default_factory=lambda: Notify())
    accounting: Accounting = field(default_factory=lambda: Accounting())
    fair_share: FairShareConfig = field(default_factory=lambda: FairShareConfig())
    durability: DurabilityConfig = field(default_factory=lambda: DurabilityConfig())


@dataclass(frozen=True, kw_only=True)
class NodeSettings:
    """A node's config file: the node's own settings, and the one job it is pinned to, if the
    file has a `job:` section (a single-job deployment). Without one the node serves whatever
    job the pool places on it."""

    node: NodeConfig
    redis: RedisConfig
    timing: TimingConfig
    metrics: MetricsConfig
    health: HealthConfig = field(default_factory=HealthConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    log_dir: str = "/var/log/nodeagent"
    state_dir: str | None = None  # None: DEFAULT_STATE_DIR, used only if it can be written
    pool: PoolConfig = field(default_factory=PoolConfig)
    containers: ContainerRule = field(default_factory=ContainerRule)  # what jobs' images it runs
    isolation: IsolationConfig = field(default_factory=IsolationConfig)  # jobs on it kept apart
    job: JobConfig | None = None

    def running(self, job: JobConfig, timing: TimingConfig | None = None) -> Config:
        """This node's settings with `job` (and its timing) filled in: what a job runs with."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(NodeSettings)}
        fields.update(job=job, timing=timing or self.timing)
        return Config(**fields)


@dataclass(frozen=True, kw_only=True)
class Config(NodeSettings):
    """What one job runs with on this node: the node's settings and the job."""

    job: JobConfig


DEFAULT_STATE_DIR = "/var/lib/nodeagent"  # systemd's StateDirectory=nodeagent
