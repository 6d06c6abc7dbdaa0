"""A pre-started worker interpreter (`job.preload`): import the heavy modules now, run later.

The agent starts one per local rank while the job runs, as

    python [options] -m nodeagent.worker.preloaded MODULE...

It imports the modules, then blocks reading one JSON line from stdin: the new generation's
`{"argv", "env", "cwd"}`. It takes that environment and directory and runs the entrypoint's
script (or `-m` module) as `__main__`, so a restart skips Python's and torch's import time.
If stdin closes first (the agent went away or discarded it), it exits 0.

Runs in the job's interpreter, so it uses the standard library only.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from collections.abc import Sequence

PRELOADED_ENV = "NODEAGENT_PRELOADED"  # set for the worker: the modules it started with


def run_entrypoint(args: Sequence[str]) -> None:
    """Run `args` (what follows the interpreter and its options) as `python` would."""
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.abspath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


def main(modules: Sequence[str]) -> int:
    for name in modules:
        importlib.import_module(name)
    line = sys.stdin.readline()
    if not line:
        return 0
    order = json.loads(line)
    devnull = os.open(os.devnull, os.O_RDONLY)  # what a cold-started worker has as stdin
    os.dup2(devnull, 0)
    os.close(devnull)
    if order.get("cwd"):
        os.chdir(order["cwd"])
    os.environ.clear()
    os.environ.update(order["env"])
    os.environ[PRELOADED_ENV] = ",".join(modules)
    run_entrypoint(order["args"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
