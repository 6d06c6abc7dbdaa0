"""`nodeagent launch`: torchrun's command line, one job, in the foreground.

    nodeagent launch --nnodes 1:4 --nproc-per-node 8 --rdzv-endpoint HOST:PORT --rdzv-id JOB \\
        train.py args...

Runs this node's agent for that one job and exits with the job's result: 0 when it succeeded,
the failing rank's exit code (or 1) when it failed, 1 when stopped (SIGINT, SIGTERM) first, 78
for a command line or node that cannot run it, 2 for a usage error (argparse's, as torchrun's).
The config is built from the flags (nodeagent.cli.launchargs); config files stay the way to run
under systemd (`nodeagent run`).
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from nodeagent.cli.launchargs import LaunchError, Machine, build
from nodeagent.config.load import load_config
from nodeagent.config.settings import EX_CONFIG, Config
from nodeagent.errors import ConfigError
from nodeagent.runtime.preflight import check_node
from nodeagent.runtime.signalwatch import SignalWatch
from nodeagent.telemetry import logs
from nodeagent.telemetry.logs import LogContext

STOPPED = 1  # stopped (SIGINT, SIGTERM) before the job ended: not a success


def _machine() -> Machine:
    return Machine(
        python=sys.executable,
        hostname=socket.gethostname().split(".")[0],
        cwd=os.getcwd(),
        user=pwd.getpwuid(os.geteuid()).pw_name,
        pid=os.getpid(),
    )


def _config(argv: Sequence[str]) -> tuple[Config, tuple[str, ...]] | None:
    try:
        launch = build(argv, _machine())
        return load_config(launch.document), launch.warnings
    except (LaunchError, ConfigError) as exc:
        print(f"nodeagent launch: {exc}", file=sys.stderr)
        return None


def main(argv: Sequence[str]) -> int:
    from nodeagent.runtime.run import run_agent  # the daemon's CLI registers this one

    built = _config(argv)
    if built is None:
        return EX_CONFIG
    config, warnings = built
    context = LogContext(config.node.name, config.job.id)
    logs.configure(config.logging.format, config.logging.level, context)
    log = logging.getLogger("nodeagent.launch")
    try:
        node = check_node(config, os.environ, create=True)
    except ConfigError as exc:
        print(f"nodeagent launch: {exc}", file=sys.stderr)
        return EX_CONFIG
    for warning in (*warnings, *node.warnings):
        log.warning("%s", warning)
    where = Path(config.log_dir) / config.job.id
    log.info("job %s: each rank's log is %s/rank-R.log", config.job.id, where)
    watch = SignalWatch()
    watch.install()
    try:
        ended = run_agent(config, context, node, until_done=True)
    except ConfigError as exc:  # an embedded Redis that cannot start, refused credentials
        print(f"nodeagent launch: {exc}", file=sys.stderr)
        return EX_CONFIG
    finally:
        watch.close()
    code = STOPPED if ended is None else ended
    what = "stopped before it ended" if ended is None else f"exit code {code}"
    print(f"nodeagent launch: job {config.job.id} {what}; logs in {where}", file=sys.stderr)
    return code
