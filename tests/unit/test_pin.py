"""Which slot a save or a copy goes to when the committed save is pinned (channel/pin.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nodeagent.channel import pin
from nodeagent.channel.manifests import BadCopy
from nodeagent.channel.pin import Pin, Slot

C, N, OLD = (12, 1, 4), (18, 1, 4), (18, 0, 5)  # committed, newer (generation 1), another
NOW = 1000.0


def held(
    first: tuple[int, int, int] | None, second: tuple[int, int, int] | None, age: float = 1
) -> tuple[Slot | None, Slot | None]:
    """Slot 0 holds `first`, written 10 s before slot 1's `second`, which is `age` s old."""
    return (
        Slot(first, NOW - age - 10) if first else None,
        Slot(second, NOW - age) if second else None,
    )


@pytest.mark.parametrize(
    ("slots", "pinned", "generation", "patience", "chosen"),
    [
        # nothing pinned: the slot not holding the newest save (an empty one first)
        (held(None, None), None, 1, 60, 0),
        (held(C, None), None, 1, 60, 1),
        (held(C, N), None, 1, 60, 0),
        (held(N, C), None, 1, 60, 1),
        # nothing committed yet: the newest save's copies are under way, and the next save
        # waits for them, then goes over the older one (copies, and the last save, at once)
        (held(C, N), Pin(None), 1, 60, None),
        (held(C, N, age=61), Pin(None), 1, 60, 0),
        (held(C, N), Pin(None), 1, 0, 0),
        (held(C, N), Pin(None), None, 60, 0),
        (held(C, N), Pin(None), 2, 60, 0),
        (held(C, None), Pin(None), 1, 60, 1),
        # the older slot holds another save than the pinned one: as without a pin
        (held(C, N), Pin(N), 1, 60, 0),
        # the older slot holds the committed save, the other a newer one of this generation,
        # written 1 s ago: skipped while the newer one is younger than the patience
        (held(C, N), Pin(C), 1, 60, None),
        (held(N, C), Pin(C), 1, 60, None),  # the same, slots the other way round
        (held(N, C), Pin(N), 1, 60, 1),  # the newest is committed: the older slot
        (held(C, N, age=61), Pin(C), 1, 60, 1),  # patience spent: over the newer save
        (held(C, N, age=-5), Pin(C), 1, 60, 1),  # a wall clock set back: not waited for
        # no patience (the last save skipped, written as the process ends): over the newer
        (held(C, N), Pin(C), 1, 0, 1),
        # the newer save is of an older generation (the job re-formed since): over it
        (held(C, N), Pin(C), 2, 60, 1),
        (held(C, OLD), Pin(C), 1, 60, 1),
        # a copy (no generation) is never skipped
        (held(C, N), Pin(C), None, 60, 1),
        # the committed save alone: the empty slot
        (held(C, None), Pin(C), 1, 60, 1),
    ],
)
def test_a_save_never_goes_over_the_pinned_one(
    slots: tuple[Slot | None, Slot | None],
    pinned: Pin | None,
    generation: int | None,
    patience: float,
    chosen: int | None,
) -> None:
    assert pin.choose(slots, pinned, generation, NOW, patience) == chosen


def test_a_pin_reads_back_what_was_written(tmp_path: Path) -> None:
    assert pin.read(tmp_path) is None
    pin.write(tmp_path, Pin((12, 1, 4)))
    assert pin.read(tmp_path) == Pin((12, 1, 4))
    pin.write(tmp_path, Pin(None))
    assert pin.read(tmp_path) == Pin(None)
    assert [p.name for p in tmp_path.iterdir()] == [pin.FILE]


@pytest.mark.parametrize(
    ("raw", "said"),
    [
        ("{", "not JSON"),
        ("[]", "not a pin"),
        ('{"step": 12}', "not a pin"),
        ('{"committed": [1, 2]}', "must be \\[step, generation, world\\]"),
        ('{"committed": [1, -2, 3]}', "must be"),
        ('{"committed": [1, true, 3]}', "must be"),
    ],
)
def test_a_pin_nodeagent_did_not_write_is_refused_naming_what_is_wrong(
    tmp_path: Path, raw: str, said: str
) -> None:
    (tmp_path / pin.FILE).write_text(raw)
    with pytest.raises(BadCopy, match=said):
        pin.read(tmp_path)


def test_the_agent_never_writes_through_a_link_a_worker_planted(tmp_path: Path) -> None:
    """The memory tier is the workers' directory; the agent writes and reads the pin as root."""
    outside = tmp_path / "passwd"
    outside.write_text("root:x:0:0\n")
    memory = tmp_path / "tier"
    memory.mkdir()
    (memory / f".tmp-{pin.FILE}.{os.getpid()}").symlink_to(outside)
    pin.write(memory, Pin((12, 1, 4)))
    assert outside.read_text() == "root:x:0:0\n"
    assert pin.read(memory) == Pin((12, 1, 4))
    (memory / pin.FILE).unlink()
    (memory / pin.FILE).symlink_to(outside)
    with pytest.raises(BadCopy, match="link"):
        pin.read(memory)
    (memory / pin.FILE).unlink()
    os.mkfifo(memory / pin.FILE)  # read as root by the listener: never blocks on it
    with pytest.raises(BadCopy, match="not a regular file"):
        pin.read(memory)
    (memory / pin.FILE).unlink()
    (memory / pin.FILE).write_text(" " * (pin.MAX_BYTES + 1))
    with pytest.raises(BadCopy, match="not a pin"):
        pin.read(memory)
