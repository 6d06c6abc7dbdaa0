"""nodeagentctl submit: a job spec from a file and/or torchrun-like flags, checked before
anything is written (an unknown key, a bad bound, an empty entrypoint, a bad id, duration or
signal: exit 2, Redis as it was), stored pending in the pool (pool.auth none; with munge,
cli/signing.py sends it as a signed request), and its id printed.
"""

from __future__ import annotations

import argparse
import os
import stat
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from nodeagent.cli.ctl import argtypes, caller, wait
from nodeagent.cli.ctl.targets import Target
from nodeagent.config import strictyaml
from nodeagent.config.settings import RECOVERY_MODES
from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.coord.pool import PoolStore
from nodeagent.errors import ConfigError, CoordinationError, UsageError
from nodeagent.model.request import Verb
from nodeagent.model.spec import JobSpec, load_spec, new_job_id
from nodeagent.pool import submission

WAIT_RUNNING_S = 600.0  # --wait-running's default --timeout
WRITE_TRIES = 3  # a submission Redis could not take is sent again, as the same request
WRITE_BACKOFF_S = 1.0
T = TypeVar("T")


HELP = "submit a job to the pool: a spec file, or torchrun-like flags and -- COMMAND"


def add_arguments(submit: argparse.ArgumentParser) -> None:
    submit.description = (
        "nodeagentctl submit job.yaml | nodeagentctl submit --name llama "
        "--nodes 2:8 --nproc-per-node 8 -- /shared/llama/venv/bin/python train.py"
    )
    submit.add_argument("spec", nargs="?", help="a job spec file (YAML)")
    submit.add_argument(
        "--name",
        type=argtypes.name,
        help="job id (overrides the spec's id; default: the spec's, else a new one such as "
        "job-3f9c2a1d); the id of a job that has ended may be used again",
    )
    shape_arguments(submit)
    submit.add_argument("--nproc-per-node", type=int, help="workers per node")
    submit.add_argument("--env", action="append", default=[], metavar="K=V")
    submit.add_argument(
        "--workdir",
        "--working-dir",
        dest="workdir",
        help="the workers' working directory (the spec's working_dir)",
    )
    submit.add_argument("--user", help="the Unix user it runs as (default: you)")
    submit.add_argument("--max-restarts", type=int, help="restart budget (default 3)")
    submit.add_argument(
        "--preemptible",
        action="store_true",
        default=None,
        help="may be evicted whole (back to pending) for a job of higher priority",
    )
    submit.add_argument(
        "--recovery",
        choices=RECOVERY_MODES,
        help="restart every worker on a re-form (default), or keep survivors (in_place)",
    )
    submit.add_argument(
        "--signal",
        metavar="SIG[@TIME]",
        help="send SIG to every worker TIME before the time limit (as sbatch --signal; "
        "default TIME 60s), such as USR1@300 or USR1@5m",
    )
    submit.add_argument(
        "--container-image",
        metavar="IMAGE",
        help="run the workers in this image, as yourself (as srun --container-image; the "
        "nodes' containers: section must allow it), such as localhost/torch:2.5",
    )
    submit.add_argument(
        "--container-mounts",
        metavar="SRC[:DST[:ro]],...",
        help="host paths mounted into the container (as srun --container-mounts; only under "
        "the nodes' containers.mount_sources)",
    )
    submit.add_argument(
        "--dependency",
        "-d",
        metavar="KIND:ID[:ID...],...",
        help="start only once this holds, as sbatch --dependency: afterok:ID (each succeeded), "
        "afterany:ID (each ended), afternotok:ID (each ended without success), singleton (no "
        "earlier job of yours with its --job-name runs)",
    )
    submit.add_argument(
        "--array",
        "-a",
        metavar="INDICES[%LIMIT]",
        help="one job per task, as sbatch --array: 0-999%%50 (at most 50 running at once), "
        "1,3,8-11, 0-20:5; task T is job ID_T, with NODEAGENT_ARRAY_TASK_ID (and "
        "SLURM_ARRAY_TASK_ID) set",
    )
    submit.add_argument(
        "--notify",
        metavar="KIND,...",
        help="tell of these to the endpoints the operator set up (pool.notify), as sbatch "
        "--mail-type: BEGIN, END, FAIL, REQUEUE, TIME_LIMIT or ALL",
    )
    submit.add_argument(
        "--hold",
        action="store_true",
        help="submit it held: it is not admitted until `nodeagentctl release JOB`",
    )
    submit.add_argument(
        "--parsable", action="store_true", help="print only the job id (as sbatch --parsable)"
    )
    waits = submit.add_mutually_exclusive_group()
    waits.add_argument(
        "--wait",
        action="store_true",
        help="return when the job ends, with its exit code: 0 succeeded, else the failing "
        "rank's code or 1 (as sbatch --wait)",
    )
    waits.add_argument(
        "--wait-running",
        action="store_true",
        help="return once every rank runs (0), or it ends first (0 if it succeeded, else 1)",
    )
    submit.add_argument(
        "--timeout",
        type=argtypes.duration,
        help="how long --wait (default: no limit) or --wait-running (default 10m) waits; "
        "then exit 1",
    )
    submit.set_defaults(argv=[])  # what follows `--` (nodeagentctl's main splits it off)


def shape_arguments(parser: argparse.ArgumentParser) -> None:
    """What a job holds and where it waits, as sbatch's flags: `submit`'s and `alloc`'s."""
    parser.add_argument(
        "--nodes",
        "--nnodes",
        dest="nodes",
        help="MIN:MAX (or MIN-MAX) or N nodes, as torchrun's --nnodes",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs it holds on each node (default: the whole node), as sbatch's",
    )
    parser.add_argument(
        "--exclusive",
        action="store_true",
        default=None,
        help="hold whole nodes whatever --gpus-per-node says, as sbatch's",
    )
    parser.add_argument(
        "--mem",
        metavar="SIZE",
        help="memory its workers on each node may use together, such as 64GiB, as sbatch's "
        "(default: the node's share per GPU it holds)",
    )
    parser.add_argument(
        "--mem-per-gpu",
        metavar="SIZE",
        help="memory per GPU it holds on each node, such as 80GiB, as sbatch's",
    )
    parser.add_argument(
        "--cpus-per-gpu",
        type=int,
        metavar="N",
        help="CPUs of its own per GPU it holds, from the cores near it, as sbatch's (default: "
        "all the cores the node holds for each GPU: its cores divided by its GPUs)",
    )
    parser.add_argument("--queue", help="queue (default: default)")
    parser.add_argument("--priority", type=int, help="priority (higher first; default 0)")
    parser.add_argument(
        "--selector",
        action="append",
        default=[],
        metavar="LABEL=VALUE",
        help="only nodes whose pool.labels have it (repeatable)",
    )
    parser.add_argument(
        "--time",
        type=argtypes.time_limit,
        metavar="LIMIT",
        help="how long it may run once admitted, such as 90m, 1h30m, 2d or Slurm's "
        "[D-]HH:MM:SS; then it is stopped (the stop grace) and ends as timeout",
    )
    parser.add_argument(
        "--job-name",
        metavar="NAME",
        help="its name, which `singleton` looks at (default: its id)",
    )


def submitted(job_id: str, args: argparse.Namespace) -> None:
    """What `submit` prints once the job is stored: its id (only that with --parsable)."""
    print(job_id if args.parsable else f"Submitted job {job_id}", flush=True)


def spec_from_args(
    args: argparse.Namespace, user: str, by: str, new_id: Callable[[], str] = new_job_id
) -> JobSpec:
    """The spec `submit` sends, from a file and/or flags (flags override the file); with no
    --name and no id in the file, its id is `new_id()`.

    Raises:
        UsageError: naming the file and key, or the flag, that is wrong.
    """
    doc: dict[str, Any] = {}
    where = "submit"
    if args.spec:
        where = args.spec
        try:
            loaded = strictyaml.load(Path(args.spec).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise UsageError(f"cannot read the job spec {args.spec}: {exc}") from None
        if not isinstance(loaded, dict):
            raise UsageError(f"{args.spec}: expected a mapping of spec keys")
        doc.update(loaded)
    command = list(args.argv)
    if command:
        doc["entrypoint"] = command
    doc = shape_doc(args, doc)
    flags = {
        "nproc_per_node": args.nproc_per_node,
        "working_dir": args.workdir,
        "user": args.user,
        "max_restarts": args.max_restarts,
        "recovery": args.recovery,
        "preemptible": args.preemptible,
        "signal": args.signal,
        "dependency": args.dependency,
        "array": args.array,
        "notify": args.notify,
    }
    doc.update({k: v for k, v in flags.items() if v is not None})
    if args.env:
        doc.setdefault("env", {}).update(pairs(args.env, "--env", "K=V"))
    if args.container_image is not None or args.container_mounts is not None:
        container = doc.setdefault("container", {})
        if not isinstance(container, dict):
            raise UsageError(f"{where}: container: expected a mapping of image and mounts")
        if args.container_image is not None:
            container["image"] = args.container_image
        if args.container_mounts is not None:
            container["mounts"] = args.container_mounts
    if not args.spec and not command:
        raise UsageError("give a job spec file, or the command after --")
    if doc.get("array") and (args.wait or args.wait_running):
        raise UsageError("--wait and --wait-running wait for one job, not an array's tasks")
    if isinstance(doc.get("working_dir"), str):
        doc["working_dir"] = enterable(doc["working_dir"], where)
    try:
        job_id = args.name or (None if doc.get("id") is not None else new_id())
        spec = load_spec(doc, default_user=user, job_id=job_id)
    except ConfigError as exc:
        raise UsageError(f"{where}: invalid job spec: {exc}") from None
    return replace(spec, submitted_by=by)


def shape_doc(args: argparse.Namespace, doc: dict[str, Any] | None = None) -> dict[str, Any]:
    """`doc` (a spec file's keys) with what shape_arguments' flags say over it.

    Raises:
        UsageError: a bad --nodes or --selector.
    """
    doc = dict(doc or {})
    if args.nodes:
        low, _, high = args.nodes.replace("-", ":", 1).partition(":")
        if not (low.isdigit() and (not high or high.isdigit())):
            raise UsageError(
                f"--nodes: expected MIN:MAX, MIN-MAX or N, such as 2:8, got {args.nodes!r}"
            )
        doc.update(min_nodes=int(low), max_nodes=int(high or low))
        doc.pop("target_nodes", None)
    flags = {
        "gpus_per_node": args.gpus_per_node,
        "exclusive": args.exclusive,
        "mem": args.mem,
        "mem_per_gpu": args.mem_per_gpu,
        "cpus_per_gpu": args.cpus_per_gpu,
        "queue": args.queue,
        "priority": args.priority,
        "time_limit": args.time,
        "name": args.job_name,
    }
    for given, other in (("mem", "mem_per_gpu"), ("mem_per_gpu", "mem")):
        if flags[given] is not None:  # a flag stands for the spec file's memory ask, as sbatch's
            doc.pop(other, None)
    doc.update({k: v for k, v in flags.items() if v is not None})
    if args.selector:
        doc.setdefault("selector", {}).update(pairs(args.selector, "--selector", "LABEL=VALUE"))
    return doc


def pairs(given: list[str], flag: str, form: str) -> dict[str, str]:
    """NAME=VALUE arguments of a repeated flag, in order.

    Raises:
        UsageError: one without a name or an '='.
    """
    found: dict[str, str] = {}
    for pair in given:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise UsageError(f"{flag}: expected {form}, got {pair!r}")
        found[name] = value
    return found


def enterable(directory: str, where: str) -> str:
    """The working directory as the workers will be given it: relative to the submitter's own
    (as sbatch --chdir). One that is here and that the submitter cannot enter is refused now,
    naming it, rather than at every worker's start; one that is not here may be on the nodes
    only, and the workers say so if it is not (their user enters it: it may be private to
    them, a 0700 home directory).

    Raises:
        UsageError: it is here and the submitter cannot enter it.
    """
    if not directory:
        return directory  # refused by load_spec, naming the key
    path = Path(directory).absolute()
    try:
        found = path.stat()
    except FileNotFoundError:
        return str(path)
    except OSError as exc:  # a directory above it that the submitter cannot enter, say
        problem = f"cannot be reached ({exc.strerror})"
    else:
        if not stat.S_ISDIR(found.st_mode):
            problem = "is not a directory"
        elif not os.access(path, os.X_OK):
            problem = "cannot be entered by you"
        else:
            return str(path)
    raise UsageError(
        f"{where}: working_dir {path} {problem}: the workers run there as the job's user; "
        "give a directory that user can enter (--workdir)"
    )


def request(args: argparse.Namespace, user: str, job: str | None) -> tuple[Verb, dict[str, Any]]:
    spec = spec_from_args(args, user, "")
    return Verb.SUBMIT, {"spec": spec.to_dict(), **({"hold": True} if args.hold else {})}


def run(target: Target, args: argparse.Namespace) -> int:
    """Under pool.auth none: the spec stored here, with this command's request id, so that a
    second arrival of it (redis-py's retry, a run again with --request-id) is this submission,
    never a second job or a refusal; sent again while Redis cannot take it."""
    store, by = target.pool_store, caller.by()
    spec = replace(spec_from_args(args, caller.user(), by), request=target.request_id)
    spec = checked(store, spec, "job")
    held_by = by if args.hold else ""
    if spec.array is not None:
        try:
            said = submission.store_array(store, spec, held_by, lambda s: s)
        except submission.Refused as exc:
            raise UsageError(str(exc)) from None
        target.confirm(f"array {spec.id}")
        print(spec.id if args.parsable else said, flush=True)
        return 0
    store_one(target, spec, held_by, "job")
    submitted(spec.id, args)
    return follow(store, spec.id, args)


def checked(store: PoolStore, spec: JobSpec, what: str) -> JobSpec:
    """`spec` as the pool would take it (submission.checked).

    Raises:
        UsageError: the pool would refuse it, saying why.
    """
    try:
        return submission.checked(store, spec)
    except submission.Refused as exc:
        raise UsageError(f"{what} {spec.id}: {exc}") from None


def store_one(target: Target, spec: JobSpec, held_by: str, what: str) -> None:
    """`spec` stored pending (held by `held_by`, "": not held), on the replicas the pool's
    durability asks for.

    Raises:
        UsageError: its id is another job's that has not ended.
        NotAcknowledged: not on those replicas (exit 69).
    """
    store = target.pool_store
    created, status = again(lambda: store.submit(spec, held_by=held_by))
    if not created:
        raise UsageError(submission.in_use(spec.id, store.keys.pool, status))
    target.confirm(f"{what} {spec.id}")


def again(write: Callable[[], T]) -> T:
    """`write`, tried again while Redis cannot be reached (it must be the same request each
    time: a second arrival is the first), WRITE_TRIES times at most."""
    for attempt in range(1, WRITE_TRIES + 1):
        try:
            return write()
        except CoordinationError as exc:
            if attempt == WRITE_TRIES or classify(exc) is not RedisFailure.UNREACHABLE:
                raise
            time.sleep(WRITE_BACKOFF_S * attempt)
    raise AssertionError("unreachable")


def follow(store: PoolStore, job_id: str, args: argparse.Namespace) -> int:
    """What `submit` returns once the job is stored: 0, or with --wait the job's end (its exit
    code), with --wait-running until every rank runs (argparse takes one of the two)."""
    if args.wait:
        return wait.wait_ended(store, job_id, args.timeout)
    if args.wait_running:
        timeout = args.timeout if args.timeout is not None else WAIT_RUNNING_S
        return wait.wait_running(store, job_id, timeout)
    return 0
