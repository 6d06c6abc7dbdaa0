"""`nodeagentctl run [--nodes K] [--export NAME[=VALUE]] [--input MODE] [--no-label] [--pty] --
CMD...`: a command across a job's nodes, as srun inside salloc (views/run.py): one task a node,
each started by its node's agent as the job's user, in the job's cgroup with its GPUs there and the
environment its worker has, plus the task's place (RANK, WORLD_SIZE, torchrun's PET_* options,
SLURM_PROCID...). The job: --job, else $NODEAGENT_JOB_ID (set in an `alloc` shell).

Each line comes labelled `node/rank: ` (--no-label: as written). Its stdin goes to every task
(--input all: srun's default), to one (--input N) or to none (--input none: the default where
stdin is a terminal, which --pty is for, /dev/null or an empty file); the others' is closed.
Ctrl-C and SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 sent to `run` are passed on to every task; a
second Ctrl-C within a second kills them (SIGKILL), as srun's. A lost node ends the others
(SIGTERM). The exit status is the worst of the tasks' (a signal's: 128 + N; a lost node's: 255),
as srun's. Needs pool.auth: munge: the agents run nothing for a caller they cannot tell.

`--pty` (srun --pty): one task, on the job's first node, on a terminal the agent makes there
(this terminal's size, kept as it changes); this terminal is put in raw mode and what is typed
is sent (Ctrl-C too: the far terminal makes it the task's SIGINT), its output written as it
comes, unlabelled.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import stat
import sys
import termios
import threading
import time
import tty
from types import FrameType

from nodeagent.cli.ctl.logs import agent_signer
from nodeagent.cli.ctl.targets import Target
from nodeagent.errors import UsageError
from nodeagent.telemetry.runwire import exports
from nodeagent.views.logs import RankLogs
from nodeagent.views.run import Ended, Output, Run, worst

HELP = "run a command on a job's nodes (an allocation's), as its user, as srun"
JOB_ENV = "NODEAGENT_JOB_ID"
KILL_WITHIN_S = 1.0  # a second Ctrl-C this soon after the first kills the tasks
PASSED_ON = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
STDIN = 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "nodeagentctl run -- hostname | nodeagentctl run -N 2 -- torchrun ..."
    parser.add_argument(
        "--nodes", "-N", type=int, help="on the job's first K nodes (default: every node)"
    )
    parser.add_argument(
        "--export",
        action="append",
        default=[],
        metavar="NAME[=VALUE]",
        help="set NAME for the command (its value here when no =VALUE); repeatable",
    )
    parser.add_argument(
        "--input",
        "-i",
        metavar="MODE",
        help="whose stdin is this one's: all, none, or a task's number (default: all, none "
        "when stdin is a terminal)",
    )
    parser.add_argument(
        "--no-label", action="store_true", help="print each line as written, without node/rank"
    )
    parser.add_argument(
        "--pty",
        action="store_true",
        help="one task, on the first node, on a terminal (a shell: run --pty -- bash)",
    )
    parser.set_defaults(argv=[])  # the command after `--` (nodeagentctl's main splits it off)


def run(target: Target, args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if not argv:
        raise UsageError("give the command after --: nodeagentctl run -- hostname")
    job = args.job or os.environ.get(JOB_ENV)
    if not job:
        raise UsageError(f"give --job ID, or run it in an allocation's shell (${JOB_ENV})")
    try:
        env = exports(args.export, os.environ)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    sign = agent_signer(target, args)
    if sign is None:
        raise UsageError(
            f"pool {target.pool} does not sign requests (pool.auth: none): its agents run no "
            "command for a caller they cannot tell (docs/interactive.md)"
        )
    logs = RankLogs(target.client, target.prefix, target.pool, job, sign)
    if not args.pty:
        fed = args.input or _default_input()
        started = Run(logs, argv, args.nodes, env, sign, fed=fed)
        threading.Thread(target=started.feed, args=(_stdin,), name="stdin", daemon=True).start()
        return _follow(started, not args.no_label)
    if args.input not in (None, "none"):
        raise UsageError("--pty: what is typed at this terminal is the task's input; no --input")
    if args.nodes not in (None, 1):
        raise UsageError(f"--pty runs one task, on the job's first node: not --nodes {args.nodes}")
    if not os.isatty(sys.stdin.fileno()):
        raise UsageError("--pty needs a terminal on stdin (run it from one, or leave --pty out)")
    size = os.get_terminal_size(sys.stdin.fileno())
    started = Run(logs, argv, 1, env, sign, (size.lines, size.columns))
    return _at_terminal(started)


def _at_terminal(started: Run) -> int:
    """This terminal's keys to the task's, its output here, until it ends (raw mode meanwhile,
    restored after)."""
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin)

    def resized(number: int, frame: FrameType | None) -> None:
        size = os.get_terminal_size(stdin)
        started.resize(size.lines, size.columns)

    def typing() -> None:
        while data := _read(stdin):
            started.type(data)

    window = signal.signal(signal.SIGWINCH, resized)
    tty.setraw(stdin, termios.TCSADRAIN)  # what was typed ahead is kept, not flushed
    try:
        threading.Thread(target=typing, name="typing", daemon=True).start()
        return _follow(started, label=False, raw=True)
    finally:
        termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        signal.signal(signal.SIGWINCH, window)


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except OSError:
        return b""


def _stdin(size: int) -> bytes:
    """Up to `size` bytes of this process's stdin (b"": its end); one it was handed
    non-blocking is waited on; an error is said, and ends it."""
    while True:
        try:
            return os.read(STDIN, size)
        except BlockingIOError:
            select.select([STDIN], [], [])
        except OSError as exc:
            _say(f"stdin: {exc.strerror or exc}: the tasks' input ends here")
            return b""


def _default_input() -> str:
    """srun's default, all, but none where there is nothing to feed (a terminal, whose keys
    `--pty` is for; /dev/null; an empty file; no stdin)."""
    try:
        found = os.fstat(STDIN)
        if os.isatty(STDIN) or (stat.S_ISREG(found.st_mode) and found.st_size == 0):
            return "none"
        null = os.stat(os.devnull)
        return "none" if (found.st_dev, found.st_ino) == (null.st_dev, null.st_ino) else "all"
    except OSError:
        return "none"


def _follow(started: Run, label: bool, raw: bool = False) -> int:
    """Print the tasks' lines and ends, passing signals on, until every task ended."""
    sent: list[signal.Signals] = []

    def caught(number: int, frame: FrameType | None) -> None:
        sent.append(signal.Signals(number))

    handlers = {sig: signal.signal(sig, caught) for sig in (signal.SIGINT, *PASSED_ON)}
    ends: list[Ended] = []
    interrupted_at = 0.0
    ending = False
    try:
        for event in started.events():
            while sent:
                sig = sent.pop(0)
                now = time.monotonic()
                if sig == signal.SIGINT and now - interrupted_at < KILL_WITHIN_S:
                    _say("killing the tasks (a second Ctrl-C)")
                    started.signal("SIGKILL")
                else:
                    started.signal(sig.name)
                interrupted_at = now if sig == signal.SIGINT else interrupted_at
            if isinstance(event, Output) and raw:
                sys.stdout.write(event.text)
                sys.stdout.flush()
            elif isinstance(event, Output):
                print(f"{event.node}/{event.rank}: {event.text}" if label else event.text)
                sys.stdout.flush()
            elif isinstance(event, Ended):
                ends.append(event)
                if event.status and not raw:
                    _say(f"node {event.node} (task {event.rank}): {event.said}")
                if event.lost and not ending:
                    ending = True
                    _say("a node is lost: ending the tasks on the others (SIGTERM)")
                    started.signal("SIGTERM")
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        started.close()
    return worst(ends)


def _say(text: str) -> None:
    print(f"nodeagentctl run: {text}", file=sys.stderr, flush=True)
