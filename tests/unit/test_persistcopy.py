"""AsJobUser (checkpoint/persistcopy.py) reads what its program, run as the job's user, says
as untrusted: only a reply of the expected shape counts, a save saved over is a BadCopy (the
keeper's race, not a problem), and a prune keeps only steps the agent itself copied."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from nodeagent.channel import manifests
from nodeagent.checkpoint.persistcopy import BAD_COPY, MODULE, SUPERSEDED, AsJobUser
from nodeagent.checkpoint.scan import Save, Superseded
from nodeagent.model.tiers import Held


def copier(status: int, said: bytes, asked: list[dict[str, object]] | None = None) -> AsJobUser:
    def run(argv: Sequence[str], stdin: bytes) -> tuple[int, bytes]:
        assert list(argv[1:]) == ["-I", "-m", MODULE]
        if asked is not None:
            asked.append(json.loads(stdin))
        return status, said

    return AsJobUser(run, python="/usr/bin/python3")


def saves(tmp_path: Path) -> list[Save]:
    files = {"__0_0.distcp": manifests.FileSum(3, "0" * 64)}
    return [
        Save(tmp_path / f"rank-{r}", manifests.Manifest(20, 4, 8, r, files, job="j"))
        for r in (2, 3)
    ]


def test_a_copy_asks_for_the_slots_verified_and_holds_what_the_agent_knows(tmp_path: Path) -> None:
    asked: list[dict[str, object]] = []
    held = copier(0, b'{"copied": true}\n', asked).persist(saves(tmp_path), tmp_path, 7, 1000)
    assert held == Held(20, 8, (2, 3), 4)
    [request] = asked
    assert request["op"] == "persist" and request["most"] == 1000
    assert request["saves"] == [
        {"slot": str(s.slot), "digest": manifests.digest(s.manifest)} for s in saves(tmp_path)
    ]


@pytest.mark.parametrize(
    ("status", "said", "error", "match"),
    [
        (0, b'{"copied": 1}', OSError, "replied {'copied': 1}, not a copy"),
        (0, b"\x00\xff garbage", OSError, "not JSON"),
        (0, b"", OSError, "not JSON"),
        (1, b"PermissionError: [Errno 13] Permission denied: '/x'", OSError, "Permission denied"),
        (-9, b"", OSError, "exit status -9"),
        (1, b"x" * 5000, OSError, "^as the job's user: x{300}$"),
        (BAD_COPY, b"/m/rank-2/slot-0: not the save the agent verified", manifests.BadCopy, "not"),
        (SUPERSEDED, b"step 20 of generation 4: holds generation 5's", Superseded, "generation 5"),
    ],
)
def test_a_reply_not_of_the_expected_shape_is_an_error(
    tmp_path: Path, status: int, said: bytes, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        copier(status, said).persist(saves(tmp_path), tmp_path, -1, None)


def test_a_prune_keeps_only_steps_the_agent_copied(tmp_path: Path) -> None:
    mine = [Held(10, 8, (2, 3)), Held(20, 8, (2, 3)), Held(30, 8, (2, 3))]
    asked: list[dict[str, object]] = []
    kept = copier(0, b'{"kept": [20, 30, 99]}', asked).prune(tmp_path, mine, 2, None, (2, 3), 4)
    assert [h.step for h in kept] == [20, 30]  # 99 was never this agent's copy
    assert asked[0]["generation"] == 4  # newer generations' directories are left (scan.prune)
    for bad in (b'{"kept": [true]}', b'{"kept": "all"}', b'{"kept": [-1]}', b"[]"):
        with pytest.raises(OSError):
            copier(0, bad).prune(tmp_path, mine, 2, None, (2, 3))
