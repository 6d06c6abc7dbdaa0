"""The note by which the agent tells its workers that it is bringing their generation's saves
from peers (nodeagent/channel/fetching.py): a restore waits while it names its generation,
until the agent removes it or its time is up; nothing else makes it wait."""

from __future__ import annotations

import json
from pathlib import Path

from nodeagent.channel import fetching


class Clock:
    """A clock that moves only when slept on; `then` runs at the `at`-th sleep."""

    def __init__(self, at: int = -1, then: object = None) -> None:
        self.now = 1000.0
        self.sleeps = 0
        self._at, self._then = at, then

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        self.now += seconds
        if self.sleeps == self._at and callable(self._then):
            self._then()


def note(area: Path, generation: int, until: float) -> None:
    (area / fetching.NOTE).write_text(json.dumps({"generation": generation, "until": until}))


def test_a_restore_waits_until_the_agent_says_the_fetches_ended(tmp_path: Path) -> None:
    clock = Clock(at=10, then=lambda: fetching.end(tmp_path))
    note(tmp_path, 4, clock.now + 60)
    waited = fetching.wait(tmp_path, 4, poll=0.05, clock=clock, sleep=clock.sleep)
    assert clock.sleeps == 10 and abs(waited - 0.5) < 1e-9
    assert not (tmp_path / fetching.NOTE).exists()


def test_a_note_left_behind_stops_counting_at_its_time(tmp_path: Path) -> None:
    clock = Clock()
    note(tmp_path, 4, clock.now + 2)  # the agent died: nobody removes it
    assert abs(fetching.wait(tmp_path, 4, poll=0.5, clock=clock, sleep=clock.sleep) - 2) < 1e-9
    note(tmp_path, 4, clock.now + 1e9)
    waited = fetching.wait(tmp_path, 4, poll=60, clock=clock, sleep=clock.sleep)
    assert waited == fetching.MOST_S


def test_another_generations_note_no_note_or_garbage_are_not_waited_for(tmp_path: Path) -> None:
    clock = Clock()
    assert fetching.wait(tmp_path, 4, clock=clock, sleep=clock.sleep) == 0
    note(tmp_path, 3, clock.now + 60)
    assert fetching.wait(tmp_path, 4, clock=clock, sleep=clock.sleep) == 0
    for garbage in ("{", '{"generation": 4}', '{"generation": 4, "until": "soon"}', "[]"):
        (tmp_path / fetching.NOTE).write_text(garbage)
        assert fetching.wait(tmp_path, 4, clock=clock, sleep=clock.sleep) == 0, garbage
    assert clock.sleeps == 0


def test_the_agent_writes_its_note_whole_and_removes_it(tmp_path: Path) -> None:
    fetching.begin(tmp_path, 7, 30)
    assert [p.name for p in tmp_path.iterdir()] == [fetching.NOTE]  # no temporary file left
    said = json.loads((tmp_path / fetching.NOTE).read_text())
    assert said["generation"] == 7 and said["until"] > 0
    fetching.end(tmp_path)
    fetching.end(tmp_path)  # twice: nothing to remove is no error
    assert list(tmp_path.iterdir()) == []
