"""`submit --workdir`: relative to where submit runs (as sbatch --chdir), and refused, naming
it, when it is here but is no directory the submitter can enter (issue 62). One that is not
here may be on the nodes only: kept as given. The refusal for a directory of another user's is
tested on booted nodes as that user (tests/booted/test_pool_nodes.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeagent.cli.ctl.submit import enterable
from nodeagent.errors import UsageError


def test_a_relative_directory_is_taken_from_where_submit_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path)
    assert enterable("work", "submit") == str(tmp_path / "work")
    assert enterable("elsewhere/only", "submit") == str(tmp_path / "elsewhere" / "only")
    assert enterable("/on/the/nodes", "submit") == "/on/the/nodes"


def test_a_file_is_refused_naming_it(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match=f"job.yaml: working_dir {tmp_path}/f is not a directory"):
        enterable(str(tmp_path / "f"), "job.yaml")
