"""CheckpointManager: a save commits by one manifest rename, and nothing bad is ever loaded."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from nodeagent.worker.checkpoint import CheckpointManager

torch = pytest.importorskip("torch")

HEX = "0123456789abcdef"  # a data file's random part, as a save would make it
Manifest = dict[str, Any]


def state(value: float) -> dict[str, object]:
    return {"w": torch.full((4,), value), "step": int(value)}


def loaded_value(manager: CheckpointManager) -> float | None:
    """What `load_latest` returns, as the value `state()` was given (None: nothing)."""
    loaded = manager.load_latest()
    return None if loaded is None else float(loaded.state["w"][0])


def data_of(manifest_path: Path) -> Path:
    return manifest_path.with_name(json.loads(manifest_path.read_text())["file"])


def orphans(directory: Path) -> set[str]:
    """Data files that no manifest in `directory` names."""
    named = {json.loads(m.read_text())["file"] for m in directory.glob("*.json")}
    return {p.name for p in directory.glob("*.pt")} - named


def temps(directory: Path) -> list[str]:
    return [p.name for p in directory.glob(".*.tmp")]


def test_round_trip_and_manifest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3, rank=0)
    manifest_path = manager.save(state(7), step=7, generation=3, world_size=4)
    assert manifest_path is not None and manifest_path.name == "step-0000000007.json"
    manifest = json.loads(manifest_path.read_text())
    assert (manifest["step"], manifest["generation"], manifest["world_size"]) == (7, 3, 4)
    assert len(manifest["sha256"]) == 64
    assert re.fullmatch(r"step-0000000007\.[0-9a-f]{16}\.pt", manifest["file"])
    loaded = manager.load_latest()
    assert loaded is not None and loaded.step == 7 and loaded.generation == 3
    assert loaded.path == tmp_path / manifest["file"]
    assert torch.equal(loaded.state["w"], torch.full((4,), 7.0))
    assert not temps(tmp_path)


def test_keeps_the_newest_n(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2, rank=0)
    for step in (1, 2, 3, 4):
        manager.save(state(step), step=step)
    assert sorted(p.name for p in tmp_path.glob("*.json")) == [
        "step-0000000003.json",
        "step-0000000004.json",
    ]
    assert len(list(tmp_path.glob("*.pt"))) == 2 and not orphans(tmp_path)


def test_saving_a_step_again_replaces_it(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3, rank=0)
    manager.save(state(30), step=30)
    manager.save(state(30.5), step=30)
    assert loaded_value(manager) == 30.5
    assert len(list(tmp_path.glob("step-0000000030.*.pt"))) == 1  # the old data is gone


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: data_of(p).write_bytes(data_of(p).read_bytes()[:-10]), id="cut"),
        pytest.param(
            lambda p: data_of(p).write_bytes(b"X" + data_of(p).read_bytes()[1:]), id="flipped"
        ),
        pytest.param(lambda p: data_of(p).unlink(), id="data lost"),
        pytest.param(lambda p: p.write_text("{half a manif"), id="manifest torn"),
    ],
)
def test_corrupt_latest_falls_back_to_the_previous(
    tmp_path: Path, damage: Callable[[Path], object], caplog: pytest.LogCaptureFixture
) -> None:
    manager = CheckpointManager(tmp_path, keep=3, rank=0)
    manager.save(state(1), step=1)
    latest = manager.save(state(2), step=2)
    assert latest is not None
    damage(latest)
    loaded = manager.load_latest()
    assert loaded is not None and loaded.step == 1
    assert "skipping checkpoint step-0000000002.json" in caplog.text


def _outside(directory: Path, manifest: Manifest) -> Manifest:
    (directory.parent / "outside.pt").write_bytes((directory / manifest["file"]).read_bytes())
    return {**manifest, "file": "../outside.pt"}


def _absolute(directory: Path, manifest: Manifest) -> Manifest:
    outside = directory.parent / "outside.pt"
    outside.write_bytes((directory / manifest["file"]).read_bytes())
    return {**manifest, "file": str(outside)}


def _subdirectory(directory: Path, manifest: Manifest) -> Manifest:
    (directory / "sub").mkdir()
    (directory / "sub" / manifest["file"]).write_bytes((directory / manifest["file"]).read_bytes())
    return {**manifest, "file": f"sub/{manifest['file']}"}


def _step_one_data(directory: Path, manifest: Manifest) -> Manifest:
    one = json.loads((directory / "step-0000000001.json").read_text())
    return {**manifest, "file": one["file"], "bytes": one["bytes"], "sha256": one["sha256"]}


def _other_step(directory: Path, manifest: Manifest) -> Manifest:
    return {**manifest, "step": 3}


# Each rewrites step 2's manifest so that its checksum still matches the file it names: only
# the name checks can reject it.
BAD_MANIFESTS = [
    pytest.param(_outside, id="../outside.pt"),
    pytest.param(_absolute, id="absolute path"),
    pytest.param(_subdirectory, id="subdirectory"),
    pytest.param(_step_one_data, id="step 1's data"),
    pytest.param(_other_step, id="step field disagrees"),
]


def _with_bad_step_two(directory: Path, bad: Callable[[Path, Manifest], Manifest]) -> None:
    manager = CheckpointManager(directory, keep=3, rank=0)
    manager.save(state(1), step=1)
    manifest_path = manager.save(state(2), step=2)
    assert manifest_path is not None
    manifest_path.write_text(json.dumps(bad(directory, json.loads(manifest_path.read_text()))))


@pytest.mark.parametrize("bad", BAD_MANIFESTS)
def test_a_manifest_naming_the_wrong_file_is_rejected(
    tmp_path: Path, bad: Callable[[Path, Manifest], Manifest], caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "ckpt"
    _with_bad_step_two(directory, bad)
    loaded = CheckpointManager(directory, rank=0).load_latest()
    assert loaded is not None and loaded.step == 1 and float(loaded.state["w"][0]) == 1.0
    assert "skipping checkpoint step-0000000002.json: manifest" in caplog.text


@pytest.mark.parametrize("bad", BAD_MANIFESTS)
def test_pruning_deletes_nothing_a_bad_manifest_names(
    tmp_path: Path, bad: Callable[[Path, Manifest], Manifest]
) -> None:
    directory = tmp_path / "ckpt"
    _with_bad_step_two(directory, bad)
    before = {p.relative_to(tmp_path) for p in tmp_path.rglob("*.pt")}
    manager = CheckpointManager(directory, keep=3, rank=0)
    manager.save(state(3), step=3)  # prunes the bad step 2 and, now orphaned, its own data
    step_two_data = {p.relative_to(tmp_path) for p in directory.glob("step-0000000002.*.pt")}
    assert not (directory / "step-0000000002.json").exists() and not step_two_data
    after = {p.relative_to(tmp_path) for p in tmp_path.rglob("*.pt")}
    assert {p for p in before if "step-0000000002" not in p.name} <= after
    assert loaded_value(manager) == 3.0 and not orphans(directory)


def test_a_checkpoint_in_the_previous_layout_loads_and_is_replaced(tmp_path: Path) -> None:
    """Before unique data names a save wrote `step-<N>.pt`; such a directory still loads."""
    manager = CheckpointManager(tmp_path, rank=0)
    manifest_path = manager.save(state(5), step=5)
    assert manifest_path is not None
    data_of(manifest_path).rename(tmp_path / "step-0000000005.pt")
    manifest = json.loads(manifest_path.read_text())
    manifest_path.write_text(json.dumps({**manifest, "file": "step-0000000005.pt"}))
    assert loaded_value(manager) == 5.0
    manager.save(state(5.5), step=5)
    assert loaded_value(manager) == 5.5 and not (tmp_path / "step-0000000005.pt").exists()


# Steps saved before, the step saved next, keep. The new save is of value step + 0.5.
SAVES = [
    pytest.param([20], 30, 3, id="new step"),
    pytest.param([20, 30], 30, 3, id="same step again"),
    pytest.param([10, 20], 30, 1, id="new step, keep=1"),
    pytest.param([20, 30], 30, 1, id="same step again, keep=1"),
]


@contextmanager
def snapshots_at_every_fs_call(
    directory: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[dict[str, bytes]]]:
    """The directory's files as a kill would leave them before each replace, fsync or unlink."""
    taken: list[dict[str, bytes]] = []

    def take() -> None:
        taken.append({p.name: p.read_bytes() for p in directory.iterdir() if p.is_file()})

    def taking(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            take()
            return real(*args)

        return call

    with monkeypatch.context() as patch:
        for name in ("replace", "fsync", "unlink"):
            patch.setattr(os, name, taking(getattr(os, name)))
        yield taken
    take()  # and after the save returned


@pytest.mark.parametrize(("before", "step", "keep"), SAVES)
def test_a_kill_at_any_point_of_a_save_keeps_the_last_good_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: list[int], step: int, keep: int
) -> None:
    directory = tmp_path / "ckpt"
    manager = CheckpointManager(directory, keep=keep, rank=0)
    for earlier in before:
        manager.save(state(earlier), step=earlier)
    with snapshots_at_every_fs_call(directory, monkeypatch) as snapshots:
        manager.save(state(step + 0.5), step=step)
    assert len(snapshots) >= 6  # data fsync and rename, manifest fsync and rename, dir fsyncs
    seen: list[float] = []
    for i, snapshot in enumerate(snapshots):
        restarted = tmp_path / f"restart-{i}"
        restarted.mkdir()
        for name, data in snapshot.items():
            (restarted / name).write_bytes(data)
        after_kill = CheckpointManager(restarted, keep=keep, rank=0)
        assert not temps(restarted), f"kill point {i}"
        value = loaded_value(after_kill)
        assert value is not None, f"kill point {i}"
        seen.append(value)
        after_kill.save(state(99), step=99)
        assert not orphans(restarted), f"kill point {i}"
    old, new = float(before[-1]), step + 0.5
    # The old checkpoint until the manifest's rename, the new one from then on, nothing else.
    assert seen[0] == old and seen[-1] == new and set(seen) == {old, new}
    assert seen == sorted(seen), seen


@pytest.mark.parametrize(("before", "step", "keep"), SAVES)
def test_a_failed_save_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: list[int], step: int, keep: int
) -> None:
    """A full disk at every fsync or rename in turn: no temporary or new data file stays."""
    calls = 0
    fail_at = -1

    def failing(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(*args)

        return call

    outcomes = []
    for fail_at in range(1, 100):
        directory = tmp_path / f"fail-at-{fail_at}"
        manager = CheckpointManager(directory, keep=keep, rank=0)
        for earlier in before:
            manager.save(state(earlier), step=earlier)
        listing = sorted(p.name for p in directory.iterdir())
        calls = 0
        with monkeypatch.context() as patch:
            patch.setattr(os, "fsync", failing(os.fsync))
            patch.setattr(os, "replace", failing(os.replace))
            try:
                manager.save(state(step + 0.5), step=step)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
            else:
                break  # past the last fsync or rename: every failure point was tried
        assert not temps(directory), f"failure at call {fail_at}"
        outcome = loaded_value(manager)
        outcomes.append(outcome)
        if outcome == before[-1]:  # not committed: the directory is as it was
            assert sorted(p.name for p in directory.iterdir()) == listing
        else:  # committed (a later fsync failed): only the replaced data is left unnamed
            assert outcome == step + 0.5 and orphans(directory) <= set(listing)
    assert outcomes[0] == before[-1] and outcomes[-1] == step + 0.5, outcomes


@pytest.mark.parametrize(
    ("manager", "name", "removed"),
    [
        ({"rank": 0}, f".step-0000000003.{HEX}.pt.123.tmp", True),
        ({"rank": 0}, ".step-0000000003.json.123.tmp", True),
        ({"rank": 0}, ".step-0000000003.pt.123.tmp", True),  # the previous layout's
        ({"rank": 1, "per_rank": True}, f".step-0000000003-rank-1.{HEX}.pt.7.tmp", True),
        ({"rank": 1, "per_rank": True}, f".step-0000000003-rank-2.{HEX}.pt.7.tmp", False),
        ({"rank": 1, "per_rank": True}, ".step-0000000003-rank-10.json.7.tmp", False),
        ({"rank": 0}, ".step-0000000003-rank-0.json.7.tmp", False),  # a per-rank one
        ({"rank": 1}, ".step-0000000003.pt.123.tmp", False),  # rank 1 writes no shared one
        ({"rank": 0}, ".notes.tmp", False),
        ({"rank": 0}, "step-0000000003.pt.123.tmp", False),
        ({"rank": 0}, "sub/.step-0000000003.pt.123.tmp", False),  # not in its directory
    ],
)
def test_a_new_manager_removes_its_own_stale_temporary_files(
    tmp_path: Path, manager: dict[str, Any], name: str, removed: bool
) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"left by a killed save")
    CheckpointManager(tmp_path, **manager)
    assert path.exists() is not removed


@pytest.mark.parametrize(
    ("manager", "name", "pruned"),
    [
        ({"rank": 0}, f"step-0000000015.{HEX}.pt", True),
        ({"rank": 0}, f"step-0000000005.{HEX}.pt", True),
        ({"rank": 0}, "step-0000000015.pt", True),  # the previous layout's
        ({"rank": 0}, f"step-0000000025.{HEX}.pt", False),  # may be a save in progress
        ({"rank": 0}, f"step-0000000020.{HEX}.pt", False),  # so may this
        ({"rank": 0}, f"step-0000000015-rank-0.{HEX}.pt", False),  # a per-rank one
        ({"rank": 0}, f"step-15.{HEX}.pt", False),  # not a name a save writes
        ({"rank": 1}, f"step-0000000015.{HEX}.pt", False),  # rank 1 writes no shared one
    ],
)
def test_orphaned_data_of_older_steps_is_pruned_with_a_warning(
    tmp_path: Path,
    manager: dict[str, Any],
    name: str,
    pruned: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = CheckpointManager(tmp_path, keep=3, rank=0)
    for step in (10, 20):
        writer.save(state(step), step=step)
    named = {p.name for p in tmp_path.glob("*.pt")}
    (tmp_path / name).write_bytes(b"its manifest never came")
    CheckpointManager(tmp_path, **manager)
    assert (tmp_path / name).exists() is not pruned
    assert (f"removing {name}: no manifest names it" in caplog.text) is pruned
    assert named <= {p.name for p in tmp_path.glob("*.pt")}  # never what a manifest names
    assert loaded_value(writer) == 20.0


def test_a_write_that_died_before_its_manifest_is_invisible(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, rank=0)
    manager.save(state(1), step=1)
    (tmp_path / f"step-0000000002.{HEX}.pt").write_bytes(b"partial")  # died before its manifest
    (tmp_path / f".step-0000000003.{HEX}.pt.123.tmp").write_bytes(b"partial")  # died mid-write
    loaded = manager.load_latest()
    assert loaded is not None and loaded.step == 1


def test_only_rank_zero_writes_a_shared_checkpoint(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path, rank=1).save(state(1), step=1) is None
    assert not list(tmp_path.iterdir())
    per_rank = CheckpointManager(tmp_path, rank=1, per_rank=True)
    per_rank.save(state(5), step=5)
    assert [p.name for p in tmp_path.glob("*.json")] == ["step-0000000005-rank-1.json"]
    assert CheckpointManager(tmp_path, rank=0).load_latest() is None  # shared view ignores it
    assert CheckpointManager(tmp_path, rank=2, per_rank=True).load_latest() is None
    loaded = per_rank.load_latest()
    assert loaded is not None and loaded.step == 5


def test_no_checkpoint_yet(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path / "new", rank=0).load_latest() is None
