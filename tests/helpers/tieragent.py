"""The root agent's part of one job's checkpoint tiers, as a program, so a test can run it with
the shipped unit's privileges (tests/helpers/unitcaps.py):

    python -m tests.helpers.tieragent VERB MEMORY_DIR JOB UID GID [PERSIST_DIR]

prepare   make the memory tier (owned by UID) and the replica area (read by GID), as the
          agent does before its workers start
look      verify what the tier holds; print the steps verified and the problems, as JSON
copy      copy every verified save of the tier into the replica area, under `peer`: what a
          peer's copy sent here is; print the slots copied
persist   copy the newest verified step to the persistent tier PERSIST_DIR (the last argument),
          readable by GID; print the directory of its rank 0
settle    as a submitted job's keeper at its workers' stop: copy the newest verified step to
          PERSIST_DIR as the user UID (checkpoint/persistcopy.py) and prune older ones; print
          the step persisted and the problems said, as JSON
remove    remove the tier and the area, as at the job's end
"""

from __future__ import annotations

import dataclasses
import json
import pwd
import sys
import time
from pathlib import Path

from nodeagent.channel import manifests
from nodeagent.checkpoint import scan
from nodeagent.checkpoint.keeper import TierKeeper
from nodeagent.checkpoint.peerauth import Unauthenticated
from nodeagent.checkpoint.persistcopy import REPLY_MAX, AsJobUser
from nodeagent.checkpoint.replicas import Replicas
from nodeagent.checkpoint.transport import Listening
from nodeagent.config.identity import WorkerUser
from nodeagent.config.settings import CheckpointConfig
from nodeagent.supervisor.asuser import run_as

NODE = "n1"


def main(argv: list[str]) -> int:
    verb, memory_dir, job, uid, gid, *persist_dir = argv
    config = CheckpointConfig(memory_size=1 << 24, memory_dir=memory_dir, replicas=1)
    keeper = TierKeeper(config, NODE, job)
    listening = Listening(job, NODE, Unauthenticated(), "127.0.0.1", most=1 << 23)
    replicas = Replicas(config, NODE, job, listening)
    if verb == "prepare":
        keeper.prepare(int(uid))
        replicas.prepare(int(gid))
    elif verb == "look":
        verified = scan.Verified(keeper.memory)
        problems = verified.refresh()
        steps = sorted(save.manifest.step for save in verified.saves())
        print(json.dumps({"steps": steps, "problems": problems}))
    elif verb == "copy":
        verified = scan.Verified(keeper.memory)
        verified.refresh()
        copied = []
        for save in verified.saves():
            target = replicas.area / "peer" / save.slot.relative_to(keeper.memory)
            manifests.copy_verified(save.slot, target, beneath=keeper.memory.parent)
            copied.append(str(target))
        print(json.dumps(copied))
    elif verb == "persist":
        verified = scan.Verified(keeper.memory)
        verified.refresh()
        held = scan.persist(verified.saves(), Path(persist_dir[0]), int(gid))
        print(json.dumps(str(Path(persist_dir[0]) / f"step-{held.step}" / "rank-0")))
    elif verb == "settle":
        print(json.dumps(settle(config, job, int(uid), int(gid), Path(persist_dir[0]))))
    elif verb == "remove":
        keeper.remove()
        replicas.remove()
    else:
        print(f"unknown verb {verb!r}", file=sys.stderr)
        return 2
    return 0


def settle(config: CheckpointConfig, job: str, uid: int, gid: int, root: Path) -> dict[str, object]:
    """The keeper of a submitted job (persist_as_user) settling once its workers stopped."""
    user = WorkerUser(pwd.getpwuid(uid).pw_name, uid, gid, (gid,), switch=True)
    copier = AsJobUser(lambda argv, stdin: run_as(user, argv, stdin, REPLY_MAX))
    config = dataclasses.replace(config, persist_dir=str(root), persist_as_user=True)
    keeper = TierKeeper(config, NODE, job, copier=copier)
    keeper.started(1, (0,), {})
    keeper.settle(persist=True)
    deadline = time.monotonic() + 60
    while keeper.settling and time.monotonic() < deadline:
        time.sleep(0.05)
        keeper.poll()
    done = keeper.take_persisted()
    return {"persisted": done and done.held.step, "problems": keeper.problems}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
