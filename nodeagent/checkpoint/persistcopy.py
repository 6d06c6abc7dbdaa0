"""The persistent tier of a submitted job, written as the job's user.

A submitted job's `persist_dir` is its submitter's choice: the root agent writing there would
write wherever the submitter points it (a link to /etc, a directory of another user's). So the
agent does not: it runs this program as the job's user (supervisor/asuser.py), and the kernel
checks every file made, copied and removed against the submitter's own rights.

    python -I -m nodeagent.checkpoint.persistcopy < request

The request is one JSON object on stdin (`AsJobUser` writes it):

    {"op": "persist", "root": R, "most": B, "saves": [{"slot": S, "digest": D}, ...]}
    {"op": "prune", "root": R, "keep": K, "protected": P or null, "ranks": [...],
     "mine": [[step, [ranks]], ...]}

A persist copies each slot's save to `<R>/step-<S>/rank-<R>/`, each byte checked against the
manifest the agent verified (its digest, D), and replies `{"copied": true}`; a prune removes this
node's older steps (checkpoint/scan.py) and replies `{"kept": [steps]}`. A failure exits with
its reason: 2 for a save that is not what the agent verified (its worker saved over it), 1 for
anything else (no room, no right to write there). The program runs as the job's user, whom the
agent trusts no more than any input of theirs: `AsJobUser` reads its reply bounded and strictly
typed, and takes from it only what concerns the job itself.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from nodeagent.channel import manifests
from nodeagent.checkpoint import scan
from nodeagent.model.tiers import Held

MODULE = "nodeagent.checkpoint.persistcopy"
REQUEST_MAX = 1 << 20  # bytes of a request: a node's ranks' slots, a few kept steps
REPLY_MAX = 1 << 16  # bytes of what the program writes, reason or reply
BAD_COPY = 2  # its exit status when a save is not the one verified
SUPERSEDED = 3  # its exit status when the tier holds a newer generation's save (scan.Superseded)
REASON_MAX = 300  # characters of its reason the agent logs and says in an event


class Copier(Protocol):
    """Where the keeper's copies to the persistent tier run: in the agent (`IN_AGENT`, a node's
    own job: its operator chose `persist_dir`), or as the job's user (`AsJobUser`)."""

    def persist(self, saves: list[scan.Save], root: Path, group: int, most: int | None) -> Held:
        """Copy one step's `saves` to `root` (scan.persist). Raises: BadCopy, OSError."""
        ...

    def prune(
        self,
        root: Path,
        mine: list[Held],
        keep: int,
        protected: int | None,
        ranks: Sequence[int],
        generation: int | None = None,
    ) -> list[Held]:
        """What is left of `mine` once older steps are gone (scan.prune). Raises: OSError."""
        ...


class _InAgent:
    def persist(self, saves: list[scan.Save], root: Path, group: int, most: int | None) -> Held:
        return scan.persist(saves, root, group)

    def prune(
        self,
        root: Path,
        mine: list[Held],
        keep: int,
        protected: int | None,
        ranks: Sequence[int],
        generation: int | None = None,
    ) -> list[Held]:
        return scan.prune(root, mine, keep, protected, ranks, generation)


IN_AGENT: Copier = _InAgent()

# Runs the program as the job's user: its argv and stdin -> (exit status, what it wrote, at
# most REPLY_MAX bytes). supervisor/asuser.run_as, bound to the job's user.
Run = Callable[[Sequence[str], bytes], tuple[int, bytes]]


class AsJobUser:
    """The copies made by this program, run as the job's user through `run`. What it makes is
    the job's user's and group's (`group` is not needed: the workers are that user)."""

    def __init__(self, run: Run, python: str = sys.executable) -> None:
        self._run = run
        self._argv = (python, "-I", "-m", MODULE)  # -I: no user site, no PYTHON* variables

    def persist(self, saves: list[scan.Save], root: Path, group: int, most: int | None) -> Held:
        listed = [{"slot": str(s.slot), "digest": s.digest} for s in saves]
        reply = self._call({"op": "persist", "root": str(root), "most": most, "saves": listed})
        if reply.get("copied") is not True:  # (1 == True: not `!= {"copied": True}`)
            raise OSError(f"the copy as the job's user replied {_shown(reply)}, not a copy")
        first, ranks = saves[0].manifest, tuple(s.manifest.rank for s in saves)
        return Held(first.step, first.world_size, ranks, first.generation)

    def prune(
        self,
        root: Path,
        mine: list[Held],
        keep: int,
        protected: int | None,
        ranks: Sequence[int],
        generation: int | None = None,
    ) -> list[Held]:
        request = {
            "op": "prune",
            "root": str(root),
            "keep": keep,
            "protected": protected,
            "generation": generation,
            "ranks": list(ranks),
            "mine": [[h.step, list(h.ranks)] for h in mine],
        }
        reply = self._call(request)
        kept = reply.get("kept")
        if not isinstance(kept, list) or not all(_integer(s) for s in kept):
            raise OSError(f"the prune as the job's user replied {_shown(reply)}")
        return [h for h in mine if h.step in set(kept)]

    def _call(self, request: Mapping[str, Any]) -> dict[str, Any]:
        status, said = self._run(self._argv, json.dumps(request).encode())
        text = said.decode("utf-8", "replace").strip()
        if status != 0:  # its last line is its reason (the user's to write: kept short)
            last = text.splitlines()[-1][:REASON_MAX] if text else f"exit status {status}"
            if status == SUPERSEDED:
                raise scan.Superseded(last)
            if status == BAD_COPY:
                raise manifests.BadCopy(last)
            raise OSError(f"as the job's user: {last}")
        try:
            reply = json.loads(text.splitlines()[-1] if text else "")
        except ValueError:
            reply = None
        if not isinstance(reply, dict):
            raise OSError(f"the copy as the job's user replied {_shown(text)}, not JSON")
        return reply


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _shown(value: object) -> str:
    return repr(value)[:200]


# -- the program ---------------------------------------------------------------------------


def _persist(request: Mapping[str, Any]) -> dict[str, Any]:
    most = request.get("most")
    saves = []
    for item in request["saves"]:
        slot = Path(item["slot"])
        found = manifests.read_manifest(slot, most=most if isinstance(most, int) else None)
        if manifests.digest(found) != item["digest"]:
            raise manifests.BadCopy(f"{slot}: not the save the agent verified (saved over since)")
        saves.append(scan.Save(slot, found))
    if not saves:
        raise ValueError("no saves to copy")
    scan.persist(saves, Path(request["root"]))
    return {"copied": True}


def _prune(request: Mapping[str, Any]) -> dict[str, Any]:
    mine = [Held(int(step), 0, tuple(int(r) for r in ranks)) for step, ranks in request["mine"]]
    protected, generation = request["protected"], request.get("generation")
    kept = scan.prune(
        Path(request["root"]),
        mine,
        int(request["keep"]),
        None if protected is None else int(protected),
        [int(r) for r in request["ranks"]],
        None if generation is None else int(generation),
    )
    return {"kept": sorted({h.step for h in kept})}


def main() -> int:
    raw = sys.stdin.buffer.read(REQUEST_MAX + 1)
    try:
        if len(raw) > REQUEST_MAX:
            raise ValueError(f"a request of more than {REQUEST_MAX} bytes")
        request = json.loads(raw)
        op = request.get("op") if isinstance(request, dict) else None
        if op == "persist":
            reply = _persist(request)
        elif op == "prune":
            reply = _prune(request)
        else:
            raise ValueError(f"unknown request {op!r}")
    except scan.Superseded as exc:
        print(exc, flush=True)
        return SUPERSEDED
    except manifests.BadCopy as exc:
        print(exc, flush=True)
        return BAD_COPY
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    print(json.dumps(reply), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
