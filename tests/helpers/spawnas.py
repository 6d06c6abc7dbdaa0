"""The agent's worker start (supervisor/spares.py's Spawner) as a program of its own, so a test
can run it with the shipped unit's privileges (tests/helpers/unitcaps.py):

    python -m tests.helpers.spawnas UID GID WORKDIR [preload]

starts `/bin/sh -c 'pwd; cat note'` in WORKDIR as UID:GID (with `preload`, `python say.py`, the
script in WORKDIR, in a preloaded spare: the spare's own start enters WORKDIR too) and prints
one JSON line: what the worker printed and its exit status, or the OSError the spawner raised.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from nodeagent.config.identity import WorkerUser
from nodeagent.supervisor.spares import Spawner
from nodeagent.supervisor.spec import WorkerSpec

SCRIPT = "pwd; cat note"


def main(uid: int, gid: int, workdir: str, preload: bool) -> dict[str, object]:
    user = WorkerUser("worker", uid, gid, switch=True, env={"HOME": workdir})
    spec = WorkerSpec(
        rank=0,
        local_rank=0,
        argv=(sys.executable, "say.py") if preload else ("/bin/sh", "-c", SCRIPT),
        env={"PATH": "/usr/bin:/bin"},
        cwd=workdir,
        log_path=Path("/nonexistent/rank-0.log"),
        progress_path=Path("/nonexistent/rank-0.progress"),
    )
    spawner = Spawner(modules=("json",) if preload else (), user=user)
    try:
        if preload:
            spawner.plan([spec], 0.0)
            spawner.tick(time.monotonic())
        popen, preloaded = spawner.spawn(spec)
    except OSError as exc:
        return {"error": str(exc.strerror), "errno": exc.errno}
    finally:
        spawner.close()
    assert popen.stdout is not None
    said = popen.stdout.read().decode()
    return {"said": said, "status": popen.wait(timeout=60), "preloaded": preloaded}


if __name__ == "__main__":
    print(json.dumps(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], "preload" in sys.argv)))
