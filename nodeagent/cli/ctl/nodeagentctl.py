"""`nodeagentctl`: submit and follow a pool's jobs (Slurm's verbs), and act inside one job.

Pool: submit, alloc, jobs, show, history, cancel, hold, release, requeue, scale, nodes, queue;
a job: status, events, restart, stop, scale, cordon, drain, uncordon, health; `logs JOB` a
rank's log from its node's agent, `logs` without JOB this node's rank logs (no Redis).

Every argument is checked before anything is written to Redis: a node that holds no lease and
is not a member of the job record, a job with neither a record nor a lease, a bad duration,
count, name or Redis URL all exit 2 and change nothing.

Exit codes:
  0   done (also `uncordon` of a node that was not cordoned: nothing to do)
  1   a --wait timed out, or the job ended before what it waited for (submit --wait: the
      job's own exit code once it has ended)
  2   a request that can never succeed as given: bad arguments, a job in a state that does
      not take the verb, a target outside [min_nodes, max_nodes], an unreadable
      --redis-password-file
  3   the job or node named does not exist (in this pool, job or key prefix)
  69  (EX_UNAVAILABLE) unknown: Redis unreachable, or it answered with an error (e.g.
      WRONGTYPE: a key of the job holds something nodeagent did not write), or no pool leader
      answered, or the change is not acknowledged on the replicas pool.durability asks for.
      The change may have been made: run the same command again with the --request-id it
      printed (a submission, a cancel, a hold... with that id is that change, never twice)
  78  (EX_CONFIG) the --config file is invalid, or Redis refused the credentials or (ACL) the
      command: a fix in configuration, not a retry, helps
  130 interrupted (Ctrl-C), as shells report SIGINT

Redis: --redis URL, else --config's redis.url, else the environment variable NODEAGENT_REDIS_URL,
else `redis` in nodeagentctl's own file (cli/rc.py: ~/.config/nodeagent/nodeagentctl.yaml,
which may also give redis_password_file, pool, key_prefix, munge_socket).

The password: `--redis-password-file PATH` (its first line), else the one in the URL, else the
environment variable NODEAGENT_REDIS_PASSWORD (a file and a URL password together are an
error). The file and the variable keep it out of `ps`; an ACL user name goes in the URL.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

from nodeagent.cli.ctl import argtypes, caller, checks, logs, parser, rc, signing, targets, verbs
from nodeagent.cli.ctl.targets import Target
from nodeagent.cli.ctl.verbs import VERBS, signed_form
from nodeagent.config.load import read_config
from nodeagent.config.settings import EX_CONFIG
from nodeagent.coord.durable import NotAcknowledged
from nodeagent.coord.failure import RedisFailure, classify
from nodeagent.coord.requests import RequestStore
from nodeagent.errors import (
    AccountingError,
    ConfigError,
    CoordinationError,
    NotFoundError,
    UsageError,
)
from nodeagent.supervisor.libmunge import munge_at

EX_UNAVAILABLE = 69
EX_USAGE = 2
EX_NOT_FOUND = 3  # the job or node named does not exist
EX_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it


def dispatch(target: Target, args: argparse.Namespace) -> int:
    """The verb's signed form when the pool takes only those (pool.auth: munge), else the verb.
    Fails closed: under munge a verb that neither only reads nor has a signed form is refused
    (verbs.unsigned); a command line with no signed form is one that reads (verbs.py)."""
    found = signed_form(args.command, args, caller.user(), target.job)
    refusal = verbs.unsigned(args.command)
    changes = found is not None or refusal is not None
    args.request_id = target.request_id  # the same for every try of this change
    args.changes = changes
    if changes and RequestStore(target.client, target.pool_store.keys).auth() == "munge":
        if found is None:
            raise UsageError(str(refusal))
        munge = munge_at(targets.munge_socket(target, args))
        return signing.run(target.pool_store, args, munge, *found)
    return VERBS[args.command].run(target, args)


def _redis_failure(exc: CoordinationError, target: Target | None) -> int:
    """Say what kind of Redis failure `exc` is; its exit code."""
    if isinstance(exc, AccountingError):
        print(
            f"nodeagentctl: cannot read the accounting database: {exc}; --accounting none "
            "reads the pool's own window only",
            file=sys.stderr,
        )
        return EX_UNAVAILABLE
    kind = classify(exc)
    if kind is RedisFailure.CREDENTIALS:
        given = "" if target is None or target.password_given else "; no password was given"
        print(
            f"nodeagentctl: Redis refused the credentials ({exc}{given}); give the password "
            f"with --redis-password-file PATH or {argtypes.PASSWORD_ENV}, and an ACL user in "
            "the URL (redis://USER@host:6379/0)",
            file=sys.stderr,
        )
        return EX_CONFIG
    if kind is RedisFailure.PERMISSION:
        print(
            f"nodeagentctl: Redis refused the command for this user (ACL): {exc}; use an "
            "operator user allowed the job's keys and these commands",
            file=sys.stderr,
        )
        return EX_CONFIG
    if kind is RedisFailure.UNREACHABLE:
        print(f"nodeagentctl: cannot reach Redis: {exc}", file=sys.stderr)
    else:
        print(f"nodeagentctl: Redis answered with an error: {exc}", file=sys.stderr)
    return EX_UNAVAILABLE


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    entrypoint: list[str] = []
    if "--" in argv:  # submit's command: argparse would take its first word for the spec file
        cut = argv.index("--")
        argv, entrypoint = argv[:cut], argv[cut + 1 :]
    args = parser.parser(__doc__.splitlines()[0]).parse_args(argv)
    if entrypoint:
        args.argv = entrypoint
    target: Target | None = None
    try:
        if args.command == "logs" and args.logs_job is None:  # this node's files: no Redis
            return logs.run_here(read_config(args.config) if args.config else None, args)
        checks.one_job(args)
        environ = os.environ if environ is None else environ
        defaults = rc.load(environ)
        rc.apply(args, defaults, str(rc.path(environ)), environ.get(targets.URL_ENV))
        target = targets.target(args, environ)
        return dispatch(target, args)
    except ConfigError as exc:
        print(f"nodeagentctl: invalid configuration: {exc}", file=sys.stderr)
        return EX_CONFIG
    except NotFoundError as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_NOT_FOUND
    except UsageError as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_USAGE
    except NotAcknowledged as exc:
        print(f"nodeagentctl: {exc}", file=sys.stderr)
        return EX_UNAVAILABLE
    except CoordinationError as exc:
        code = _redis_failure(exc, target)
        if code == EX_UNAVAILABLE and target is not None and getattr(args, "changes", False):
            print(
                "nodeagentctl: the change may or may not be made: run it again with "
                f"--request-id {target.request_id} (with that id it is done once)",
                file=sys.stderr,
            )
        return code
    except KeyboardInterrupt:
        return EX_INTERRUPTED


if __name__ == "__main__":
    raise SystemExit(main())
