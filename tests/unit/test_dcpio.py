"""nodeagent.worker.dcpio's edges, with torch on CPU and no process group."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from nodeagent.worker import dcpio  # noqa: E402  # noqa: E402


def test_a_failed_save_or_load_is_a_plain_runtime_error_naming_its_cause(tmp_path: Path) -> None:
    """DCP raises a CheckpointException, a BaseException, which `except Exception` misses."""
    taken = tmp_path / "a-file"
    taken.write_text("not a directory")
    with pytest.raises(RuntimeError, match=r"DCP could not save: .*Error"):
        dcpio.save_rank({"x": torch.ones(2)}, taken / "rank-0")
    dcpio.save_rank({"x": torch.ones(2)}, tmp_path / "saved")
    (tmp_path / "saved" / "__0_0.distcp").write_bytes(b"")  # cut short (past any manifest)
    with pytest.raises(RuntimeError, match="DCP could not load"):
        dcpio.load({"x": torch.zeros(2)}, [tmp_path / "saved"])


def test_a_tensor_no_save_holds_is_refused_before_anything_is_loaded(tmp_path: Path) -> None:
    """(Part of a tensor missing: tests/integration/test_tiered.py, with FSDP2's shards.)"""
    dcpio.save_rank({"x": torch.arange(4.0)}, tmp_path / "saved")
    target = {"x": torch.zeros(4), "y": torch.zeros(1)}
    with pytest.raises(RuntimeError, match="y"):
        dcpio.load(target, [tmp_path / "saved"])
    assert target["x"].tolist() == [0.0] * 4
    loaded = {"x": torch.zeros(4)}
    dcpio.load(loaded, [tmp_path / "saved"])
    assert loaded["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
