"""The pinned node's preflight (runtime/preflight.py check_node) as a program of its own, so a
test can run it with the shipped unit's privileges (tests/helpers/unitcaps.py):

    python -m tests.helpers.checkas USER BASE WORKDIR SCRIPT

checks a config whose job runs `python3 SCRIPT` in WORKDIR as USER (log_dir and state_dir
under BASE) and prints one JSON line: {"ok": true}, or the ConfigError's key and problem.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nodeagent.config.hosts import Resolver
from nodeagent.config.load import load_config
from nodeagent.errors import ConfigError
from nodeagent.runtime import preflight


def main(user: str, base: str, workdir: str, script: str) -> dict[str, object]:
    config = load_config(
        {
            "node": {"name": "n1", "address": "127.0.0.1"},
            "redis": {"url": "redis://127.0.0.1:6379/0"},
            "log_dir": f"{base}/logs",
            "state_dir": f"{base}/state",
            "metrics": {"listen": "off"},
            "job": {
                "id": "pf",
                "entrypoint": ["python3", script],
                "working_dir": workdir,
                "user": user,
            },
        },
        Resolver(),
    )
    try:
        preflight.check_node(config, {"PATH": "/usr/bin:/bin"}, create=False, cwd=Path("/"))
    except ConfigError as exc:
        return {"key": exc.key, "problem": exc.problem}
    return {"ok": True}


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
