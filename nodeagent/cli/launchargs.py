"""`nodeagent launch`'s command line: torchrun's flags, with torchrun's meaning, turned into the
document a config file would hold (so config.load_config validates it like any other). Pure:
the caller passes what it knows about this machine (Machine) and gets the document and the
warnings for flags that have no meaning here.

Flags nodeagent has no use for are accepted with a warning saying why, so that a torchrun command
line runs unchanged; flags whose meaning it cannot keep (another rendezvous backend) are refused.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

REDIS_PORT = 6379
DEFAULT_LOG_DIR = "nodeagent-logs"  # under the current directory: where the user looks first
URL_SCHEMES = ("redis://", "rediss://", "unix://")
RDZV_BACKENDS = ("c10d", "static")
DEFAULT_RDZV_ID = "none"  # torchrun's
LOG_LEVEL = "WARNING"  # like torchrun, a launch prints warnings only; the daemon logs INFO

# torchrun flags accepted and ignored: (flag names, whether it takes a value, why)
IGNORED: tuple[tuple[tuple[str, ...], bool, str], ...] = (
    (("--node-rank", "--node_rank"), True, "ranks are assigned by the job's leader"),
    (
        ("--master-addr", "--master_addr"),
        True,
        "MASTER_ADDR is the rank-0 node's address, published through Redis",
    ),
    (
        ("--master-port", "--master_port"),
        True,
        "MASTER_PORT is picked free on the rank-0 node, published through Redis",
    ),
    (("--rdzv-conf", "--rdzv_conf"), True, "the rendezvous is nodeagent's own (timing.* keys)"),
    (
        ("--monitor-interval", "--monitor_interval"),
        True,
        "the agent wakes on every worker exit, no polling",
    ),
    (
        ("--start-method", "--start_method"),
        True,
        "workers are always separate processes (exec'd)",
    ),
    (("--role",), True, "all workers have one role"),
    (
        ("-r", "--redirects", "-t", "--tee"),
        True,
        "every rank's output always goes to its log file and the agent's output",
    ),
    (
        ("--local-ranks-filter", "--local_ranks_filter"),
        True,
        "every rank's output is echoed; `nodeagentctl logs --rank R` reads one",
    ),
)


# torchrun 2.13's --numa-binding; node and socket are NVML's affinity of the GPU (its NUMA
# node's CPUs, on a node of one NUMA node a socket), isolation.cpu_binding: closest.
NUMA_BINDINGS = ("node", "socket", "exclusive", "core-complex")
NUMA_BOUND = ("node", "socket")


class LaunchError(ValueError):
    """A flag that cannot be honoured; the message says which and why."""


@dataclass(frozen=True)
class Machine:
    """What the caller knows about where it runs."""

    python: str  # the interpreter workers run under (torchrun: its own sys.executable)
    hostname: str
    cwd: str
    user: str
    pid: int


@dataclass(frozen=True)
class Launch:
    document: dict[str, Any]  # a config document for config.load_config
    warnings: tuple[str, ...] = field(default=())


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="nodeagent launch",
        description="Run one job in the foreground with torchrun's command line; exit with its "
        "result (0, the failing rank's exit code, or 1).",
    )
    p.add_argument("--nnodes", default="1:1", help="N or MIN:MAX (default 1:1)")
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1", help="workers per node")
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default="", help="the Redis: HOST:PORT")
    p.add_argument(
        "--rdzv-id", "--rdzv_id", default="", help=f"the job id (default {DEFAULT_RDZV_ID!r})"
    )
    p.add_argument("--rdzv-backend", "--rdzv_backend", default="", help="c10d or static: Redis")
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
    p.add_argument("--standalone", action="store_true", help="one node, embedded Redis")
    p.add_argument("-m", "--module", action="store_true", help="the script is a module")
    p.add_argument("--no-python", "--no_python", action="store_true", help="exec the script")
    p.add_argument("--log-dir", "--log_dir", default="", help=f"default ./{DEFAULT_LOG_DIR}")
    p.add_argument("--local-addr", "--local_addr", default="", help="this node's address")
    p.add_argument("--node-name", default="", help="nodeagent: this node's name (hostname)")
    p.add_argument("--metrics-listen", default="off", help="nodeagent: HOST:PORT (default off)")
    p.add_argument("--log-format", choices=("text", "json"), default="text")
    p.add_argument(
        "--log-level",
        type=str.upper,
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        default=LOG_LEVEL,
        help=f"nodeagent: the agent's own log (default {LOG_LEVEL}; ranks' output always shows)",
    )
    p.add_argument(
        "--preload",
        default="",
        help="nodeagent: modules spare worker interpreters import ahead of time, comma "
        "separated (job.preload), e.g. torch,torch._dynamo: a restart skips their imports",
    )
    p.add_argument(
        "--numa-binding",
        "--numa_binding",
        choices=NUMA_BINDINGS,
        default=None,
        help="each worker on the CPUs near its GPU (NVML's affinity), as torchrun's: node and "
        "socket (exclusive and core-complex are refused)",
    )
    for names, _, why in IGNORED:
        p.add_argument(*names, dest=names[0].lstrip("-").replace("-", "_"), help=f"ignored: {why}")
    p.add_argument("training_script")
    p.add_argument("training_script_args", nargs=argparse.REMAINDER)
    return p


def _nnodes(value: str) -> tuple[int, int]:
    low, _, high = value.partition(":")
    try:
        bounds = int(low), int(high or low)
    except ValueError:
        raise LaunchError(f"--nnodes {value!r}: expected N or MIN:MAX") from None
    if not 1 <= bounds[0] <= bounds[1]:
        raise LaunchError(f"--nnodes {value!r}: expected 1 <= MIN <= MAX")
    return bounds


def _nproc(value: str) -> int:
    if value.isdigit() and int(value) > 0:
        return int(value)
    raise LaunchError(
        f"--nproc-per-node {value!r}: give a number (gpu/cpu/auto need torch to count devices)"
    )


def redis_url(endpoint: str) -> str:
    """torchrun's HOST[:PORT] as a Redis URL (default port 6379); a URL is taken as it is."""
    if endpoint.startswith(URL_SCHEMES):
        return endpoint
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        host, port = endpoint, str(REDIS_PORT)
    return f"redis://{host}:{port}/0"


def _entrypoint(args: argparse.Namespace, machine: Machine) -> list[str]:
    rest = [args.training_script, *args.training_script_args]
    if args.no_python:
        if args.module:
            raise LaunchError("-m and --no-python cannot go together")
        return rest
    # -u: unbuffered, as torchrun runs a Python entrypoint, so output shows as it is printed
    return [machine.python, "-u", *(["-m"] if args.module else []), *rest]


def _warnings(args: argparse.Namespace) -> list[str]:
    found = []
    for names, _, why in IGNORED:
        if getattr(args, names[0].lstrip("-").replace("-", "_")) is not None:
            found.append(f"{names[0]} ignored: {why}")
    if args.rdzv_backend:
        if args.rdzv_backend not in RDZV_BACKENDS:
            raise LaunchError(
                f"--rdzv-backend {args.rdzv_backend}: nodeagent's rendezvous is Redis "
                f"(--rdzv-endpoint); only {' or '.join(RDZV_BACKENDS)} are accepted, as Redis"
            )
        found.append(f"--rdzv-backend {args.rdzv_backend}: the rendezvous is Redis")
    return found


def _redis(args: argparse.Namespace, max_nodes: int, machine: Machine) -> tuple[str, str]:
    """(redis.url, job.id)."""
    if args.standalone or not args.rdzv_endpoint:
        if max_nodes > 1:
            why = "--standalone" if args.standalone else "no --rdzv-endpoint"
            raise LaunchError(
                f"{why}: one node only, but --nnodes allows {max_nodes}; give --rdzv-endpoint "
                "HOST:PORT (the Redis every node reaches)"
            )
        return "embedded", args.rdzv_id or f"standalone-{machine.pid}"
    return redis_url(args.rdzv_endpoint), args.rdzv_id or DEFAULT_RDZV_ID


def build(argv: Sequence[str], machine: Machine) -> Launch:
    """The config document for a torchrun command line.

    Raises:
        LaunchError: a flag nodeagent cannot honour.
        SystemExit: argparse's usage error (exit 2), as torchrun's.
    """
    args = parser().parse_args(list(argv))
    warnings = _warnings(args)
    if args.rdzv_endpoint and not args.standalone and not args.rdzv_id:
        warnings.append(
            f"--rdzv-id not given: the job id is {DEFAULT_RDZV_ID!r} (torchrun's default); a "
            "later launch in the same Redis needs another id once this job has ended"
        )
    min_nodes, max_nodes = _nnodes(args.nnodes)
    url, job_id = _redis(args, max_nodes, machine)
    if args.max_restarts < 0:
        raise LaunchError("--max-restarts must be >= 0")
    if args.numa_binding is not None and args.numa_binding not in NUMA_BOUND:
        raise LaunchError(
            f"--numa-binding {args.numa_binding} is not supported: node or socket binds each "
            "worker to the CPUs near its GPU (NVML's affinity); leave it out for no binding"
        )
    node: dict[str, Any] = {"name": args.node_name or machine.hostname}
    if args.local_addr:
        node["address"] = args.local_addr
    document: dict[str, Any] = {
        "node": node,
        "job": {
            "id": job_id,
            "entrypoint": _entrypoint(args, machine),
            "nproc_per_node": _nproc(args.nproc_per_node),
            "min_nodes": min_nodes,
            "max_nodes": max_nodes,
            "max_restarts": args.max_restarts,
            "working_dir": machine.cwd,  # like torchrun: the workers start where you are
            "user": machine.user,  # like torchrun: the workers are yours
            "allow_root": True,  # the caller is root and chose to launch as root
        },
        "metrics": {"listen": args.metrics_listen},
        "logging": {"format": args.log_format, "level": args.log_level},
        "log_dir": args.log_dir or f"{machine.cwd}/{DEFAULT_LOG_DIR}",
        # like torchrun: the workers share what the caller has (a node's daemon limits its
        # jobs), and run anywhere unless --numa-binding says near their GPUs
        "isolation": {
            "cgroups": "off",
            "shm": "shared",
            "cpu_binding": "closest" if args.numa_binding else "off",
        },
    }
    if args.preload:
        document["job"]["preload"] = [m.strip() for m in args.preload.split(",") if m.strip()]
    if url != "embedded":
        document["redis"] = {"url": url}
    return Launch(document, tuple(warnings))
